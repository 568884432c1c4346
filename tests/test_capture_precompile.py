"""A captured key's candidates compiled by worker processes while the first ones are measured:
the workers import the kernel by name and rebuild its call from the record."""

from __future__ import annotations

import time

import pytest
import torch
import triton
import triton.language as tl
from _capture import trials_by_kernel

import tunesvc
import tunesvc._capture.precompile as capture_precompile
from tunesvc._capture import STATS
from tunesvc._capture import RecordedKernel
from tunesvc._capture import compile_workers
from tunesvc._capture import config_dict
from tunesvc._capture import describe_call
from tunesvc._processes import start_forkserver
from tunesvc.device import current_device

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)]


@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def scale_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def grid(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


def _call(n: int) -> tuple[torch.Tensor, ...]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, y = torch.randn(2, n, device=device).unbind()
    out = torch.empty_like(x)
    scale_add[grid(n)](x, y, out, n, 0.5)
    return x, y, out


@pytest.fixture(autouse=True)
def _fresh_stats():
    STATS.clear()
    yield
    tunesvc.uncapture()


def test_candidates_compile_in_workers_and_every_one_is_still_measured_here(tmp_db, monkeypatch):
    monkeypatch.setenv("TUNESVC_COMPILE_WORKERS", "2")
    monkeypatch.setattr(capture_precompile, "PRECOMPILE_AFTER_S", 0.0)  # the interpreter's keys take seconds
    monkeypatch.setattr(capture_precompile, "PRECOMPILE_WORTH_S", 0.0)
    start_forkserver(wait=True)  # so the workers start within them
    with tunesvc.capture(db=tmp_db):
        x, y, out = _call(20_001)  # seconds in the interpreter, time for the workers to start
    torch.testing.assert_close(out, 0.5 * x + y)
    assert STATS["tuned"] == 1 and STATS["benchmarks"] == len(CONFIGS), dict(STATS)
    # a config a worker has not started is compiled here; the rest are the workers' (in the
    # interpreter their launches compile nothing: the path is the point)
    assert 1 <= STATS["precompiled"] <= len(CONFIGS), dict(STATS)
    [(kernel, statuses)] = trials_by_kernel(tmp_db).items()
    assert kernel.endswith(":scale_add") and statuses == {"ok": len(CONFIGS)}, statuses

    precompiled = STATS["precompiled"]
    monkeypatch.setenv("TUNESVC_COMPILE_WORKERS", "0")
    with tunesvc.capture(db=tmp_db):
        x, y, out = _call(3001)  # another key, measured without workers
    torch.testing.assert_close(out, 0.5 * x + y)
    assert STATS["tuned"] == 2 and STATS["precompiled"] == precompiled, dict(STATS)


@pytest.mark.parametrize("after_s, worth_s", [(60.0, 0.0), (0.0, 600.0)])
def test_a_key_done_soon_or_with_little_left_starts_no_workers(tmp_db, monkeypatch, after_s, worth_s):
    monkeypatch.setenv("TUNESVC_COMPILE_WORKERS", "2")
    monkeypatch.setattr(capture_precompile, "PRECOMPILE_AFTER_S", after_s)
    monkeypatch.setattr(capture_precompile, "PRECOMPILE_WORTH_S", worth_s)
    started = time.perf_counter()
    with tunesvc.capture(db=tmp_db):
        x, y, out = _call(1001)
    torch.testing.assert_close(out, 0.5 * x + y)
    assert STATS["tuned"] == 1 and STATS["precompiled"] == 0, dict(STATS)
    assert time.perf_counter() - started < 30  # nothing waited for a pool


def test_a_kernel_no_import_reaches_compiles_where_it_is_measured(tmp_db, monkeypatch):
    monkeypatch.setenv("TUNESVC_COMPILE_WORKERS", "2")
    monkeypatch.setattr(capture_precompile, "PRECOMPILE_AFTER_S", 0.0)
    monkeypatch.setattr(capture_precompile, "PRECOMPILE_WORTH_S", 0.0)

    def build():
        @triton.autotune(configs=CONFIGS, key=["n"])
        @triton.jit
        def local_copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

        return local_copy

    kernel = build()
    x = torch.randn(777)
    out = torch.empty_like(x)
    with tunesvc.capture(db=tmp_db):
        kernel[grid(777)](x, out, 777)
    assert torch.equal(out, x)
    assert STATS["tuned"] == 1 and STATS["precompiled"] == 0, dict(STATS)


def test_a_recorded_call_rebuilt_by_a_worker_launches_each_listed_config():
    device = current_device()
    x, y, out = (torch.randn(500) for _ in range(3))
    call = describe_call(scale_add, (x, y, out, 500, 0.5), {"grid": grid(500)})
    kernel = RecordedKernel(f"{__name__}:scale_add", call)
    inputs = kernel.make_inputs({}, device)
    _, (rx, ry, rout, n, alpha), _, _ = inputs
    assert rx.shape == x.shape and n == 500 and alpha == 0.5
    for config in CONFIGS:
        rout.zero_()
        kernel.launch(inputs, config_dict(config))
        torch.testing.assert_close(rout, 0.5 * rx + ry)


def test_how_many_workers(monkeypatch):
    device = current_device()
    monkeypatch.delenv("TUNESVC_COMPILE_WORKERS", raising=False)
    # the interpreter compiles nothing: no workers unless asked for
    assert (compile_workers(6, device, 1 << 20) >= 1) == device.is_gpu
    monkeypatch.setenv("TUNESVC_COMPILE_WORKERS", "8")
    assert compile_workers(3, device, 1 << 10) == 2  # never more than the candidates after the first
    assert compile_workers(1, device, 1 << 10) == 0
    monkeypatch.setenv("TUNESVC_COMPILE_WORKERS", "many")
    with pytest.warns(RuntimeWarning, match="TUNESVC_COMPILE_WORKERS='many' is not a whole number"):
        assert compile_workers(6, device, 1 << 10) == 0


@pytest.mark.gpu
def test_on_a_gpu_workers_of_the_default_count_compile_candidates(tmp_db, monkeypatch):
    monkeypatch.delenv("TUNESVC_COMPILE_WORKERS", raising=False)
    monkeypatch.setattr(capture_precompile, "PRECOMPILE_AFTER_S", 0.0)  # a key of milliseconds on a GPU
    monkeypatch.setattr(capture_precompile, "PRECOMPILE_WORTH_S", 0.0)
    start_forkserver(wait=True)
    with tunesvc.capture(db=tmp_db):
        x, y, out = _call(100_003)
    torch.testing.assert_close(out, 0.5 * x + y)
    assert STATS["tuned"] == 1 and STATS["precompiled"] >= 1, dict(STATS)
    [(_, statuses)] = trials_by_kernel(tmp_db).items()
    assert statuses == {"ok": len(CONFIGS)}, statuses
