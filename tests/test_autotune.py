"""tunesvc.autotune: a @triton.jit kernel launched with its tuned config; and torch.compile."""

from __future__ import annotations

import sqlite3
import threading
import warnings

import pytest
import torch
import triton
import triton.language as tl

import tunesvc
from tunesvc import Runtime
from tunesvc import TunesvcError
from tunesvc.bench import relative_error as _rel
from tunesvc.kernels import matmul
from tunesvc.store import Store

CONFIGS = [
    {"BLOCK": 16, "SHIFT": 0, "num_warps": 4},
    {"BLOCK": 32, "SHIFT": 0, "num_warps": 4},
    {"BLOCK": 64, "SHIFT": 1, "num_warps": 4},
]


@triton.jit
def _axpy(x_ptr, y_ptr, z_ptr, n, alpha, BLOCK: tl.constexpr, SHIFT: tl.constexpr):
    """z = alpha * x + y (+ SHIFT: a deliberately wrong candidate when SHIFT is 1)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(z_ptr + offs, alpha * x + y + SHIFT, mask=mask)


def _grid(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


def _inputs(n, dtype=torch.float32):
    return torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype), torch.full((n,), float("nan"), dtype=dtype)


def _reference(x, y, z, n, alpha):
    return alpha * x.double() + y.double()


def test_lookup_mode_falls_back_to_the_heuristic_and_memoises(monkeypatch):
    runtime = Runtime()
    kernel = tunesvc.autotune(
        CONFIGS, key=["n"], name="axpy_lookup", runtime=runtime, heuristic=lambda n, dtype: CONFIGS[1]
    )(_axpy)
    x, y, z = _inputs(77)
    with pytest.warns(RuntimeWarning, match="no tuned config of axpy_lookup"):
        kernel[_grid(77)](x, y, z, 77, 0.5)
    assert _rel(z, _reference(x, y, z, 77, 0.5)) < 1e-6
    assert kernel.last.source == "heuristic" and kernel.last.config == CONFIGS[1]
    assert kernel.last.key == "n=77,dtype=float32"
    assert runtime.stats() == {"axpy_lookup": {"heuristic": 1}}
    # a hit never reaches the runtime again: one dict lookup in the kernel's own memo
    monkeypatch.setattr(runtime, "lookup", lambda *a, **k: pytest.fail("the hit path called the runtime"))
    x, y, z = _inputs(77)
    kernel[_grid(77)](x, y, z, n=77, alpha=2.0)  # keywords take the slow path to the same memo
    assert _rel(z, _reference(x, y, z, 77, 2.0)) < 1e-6
    kernel.run(x, y, z, 77, -1.0, grid=_grid(77))  # triton's JITFunction.run spelling
    assert _rel(z, _reference(x, y, z, 77, -1.0)) < 1e-6


def test_space_file_constraints_prune_the_default_heuristic(tmp_path):
    space = tmp_path / "axpy.toml"
    space.write_text(
        "[params]\nBLOCK = [16, 32, 64]\nSHIFT = [0]\n[launch]\nnum_warps = [4]\n"
        '[constraints]\nfits = "BLOCK >= next_pow2(n) or BLOCK == 64"\n'
    )
    kernel = tunesvc.autotune(space, key=["n"], name="axpy_file", runtime=Runtime(mode="heuristic"))(_axpy)
    x, y, z = _inputs(23)
    kernel[_grid(23)](x, y, z, 23, -1.5)
    assert kernel.last.config == {"BLOCK": 32, "SHIFT": 0, "num_warps": 4}  # 16 < next_pow2(23)
    assert _rel(z, _reference(x, y, z, 23, -1.5)) < 1e-6


def test_tune_on_miss_checks_outputs_persists_and_is_found_later(tmp_db):
    kernel = tunesvc.autotune(
        CONFIGS, key=["n"], name="axpy_tune", output="z_ptr", reference=_reference, db=tmp_db, mode="tune"
    )(_axpy)
    x, y, z = _inputs(45)
    kernel[_grid(45)](x, y, z, 45, 3.0)
    assert kernel.last.source == "tuned"
    assert kernel.last.config["SHIFT"] == 0  # the wrong candidate can never win
    assert _rel(z, _reference(x, y, z, 45, 3.0)) < 1e-6
    store = Store(tmp_db, readonly=True)
    try:
        [winner] = store.winners(kernel="axpy_tune")
        statuses = sorted(store.trial_counts(kernel="axpy_tune").items())
    finally:
        store.close()
    assert winner.kernel_version == kernel.template.version  # the hash of the kernel's source
    assert winner.shape_key == "n=45,dtype=float32" and winner.config == kernel.last.config
    assert statuses == [("ok", 2), ("wrong_result", 1)]
    # another process (a fresh runtime in lookup mode) launches with the stored winner
    again = tunesvc.autotune(CONFIGS, key=["n"], name="axpy_tune", db=tmp_db)(_axpy)
    x, y, z = _inputs(45)
    again[_grid(45)](x, y, z, 45, 3.0)
    assert again.last.source == "exact" and again.last.config == winner.config


class _OneLaunchAtATime:
    """The kernel with its launches serialised: Triton's CPU interpreter patches triton.language
    globally while it runs a kernel, so two launches at once collide (a GPU has no such limit)."""

    def __init__(self, kernel):
        self.fn, self.arg_names, self._kernel, self._lock = kernel.fn, kernel.arg_names, kernel, threading.Lock()

    def run(self, *args, **kwargs):
        with self._lock:
            return self._kernel.run(*args, **kwargs)


def test_threads_missing_one_key_tune_it_once(tmp_db):
    kernel = tunesvc.autotune(CONFIGS[:2], key=["n"], name="axpy_threads", output="z_ptr", db=tmp_db, mode="tune")(
        _OneLaunchAtATime(_axpy)
    )
    results, errors = [], []

    def launch():
        try:
            x, y, z = _inputs(50)
            kernel[_grid(50)](x, y, z, 50, 1.0)
            results.append(_rel(z, _reference(x, y, z, 50, 1.0)))
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=launch) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 3 and max(results) < 1e-6
    with sqlite3.connect(tmp_db) as db:
        assert db.execute("SELECT count(*) FROM tunesvc_sweeps").fetchone() == (1,)  # one thread tuned it
        assert db.execute("SELECT count(*) FROM tunesvc_trials").fetchone() == (2,)
        assert db.execute("SELECT count(*) FROM tunesvc_winners").fetchone() == (1,)


def test_configure_makes_kernels_look_up_again(tmp_path):
    kernel = tunesvc.autotune(CONFIGS, key=["n"], name="axpy_configure")(_axpy)
    x, y, z = _inputs(20)
    tunesvc.configure(mode="heuristic")
    kernel[_grid(20)](x, y, z, 20, 1.0)
    assert len(kernel._configs) == 1
    tunesvc.configure(mode="heuristic")
    assert kernel._configs == {}


def test_misuse_is_one_clear_error(tmp_db):
    with pytest.raises(TunesvcError, match="has no argument m"):
        tunesvc.autotune(CONFIGS, key=["m"])(_axpy)
    with pytest.raises(TunesvcError, match="above @triton.jit"):
        tunesvc.autotune(CONFIGS, key=["n"])(lambda x: x)
    with pytest.raises(TunesvcError, match="config list is empty"):
        tunesvc.autotune([], key=["n"])(_axpy)
    kernel = tunesvc.tuned(_axpy, CONFIGS, ["n"], name="axpy_misuse", runtime=Runtime(mode="heuristic"))
    x, y, z = _inputs(10)
    with pytest.raises(TunesvcError, match="BLOCK is tuned by tunesvc"):
        kernel[_grid(10)](x, y, z, 10, 1.0, BLOCK=16)
    with pytest.raises(TunesvcError, match="positive integers"):
        kernel[_grid(10)](x, y, z, 10.0, 1.0)
    untuned = tunesvc.autotune(CONFIGS, key=["n"], name="axpy_no_output", db=tmp_db, mode="tune")(_axpy)
    with pytest.raises(TunesvcError, match="output="):
        untuned[_grid(10)](x, y, z, 10, 1.0)


def test_matmul_under_torch_compile_fullgraph():
    """fullgraph=True fails on any graph break: the custom op tunesvc::matmul is traced as one node."""

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(a, b):
        return torch.relu(matmul(a, b)) * 2.0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no tuned config here: heuristic
        for m, n, k in ((37, 45, 29), (19, 33, 21)):
            a, b = torch.randn(m, k), torch.randn(k, n)
            out = f(a, b)
            ref = torch.relu(a.double() @ b.double()) * 2.0
            assert out.shape == (m, n)
            assert _rel(out, ref) < 1e-5
    assert tunesvc.serving.runtime.default_runtime().stats()["matmul"]["heuristic"] >= 1
    assert hasattr(torch.ops.tunesvc, "matmul")
