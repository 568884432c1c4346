"""Capture in a process where a library has replaced torch's own ops with its kernels.

FlagGems' ``use_gems`` and ``enable`` put Triton kernels, some of them autotuned, under aten's
CUDA ops (norm, sub, copy and many more), and its norm refuses float64. tunesvc's own checks
and timing call such ops while it tunes a kernel. Here the same is done to aten's CPU ops for
the interpreter (``torch.library``): a norm that refuses float64, and a norm computed by an
autotuned kernel, which tunesvc then meets inside its own measuring.
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl
from _capture import scale as _scale
from _capture import trials_by_kernel
from triton.runtime.autotuner import Autotuner

import tunesvc
from tunesvc._capture import STATS
from tunesvc._capture import kernel_name
from tunesvc.bench import relative_error

CONFIGS = [triton.Config({"BLOCK": b}) for b in (16, 32, 64)]


@triton.jit
def _sum_squares(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[0] += sum(x * x) over this program's block (out starts at zero)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_add(out_ptr, tl.sum(x * x, axis=0))


class LibTuner(Autotuner):
    """An autotuner with a run of its own, as FlagGems' LibTuner: its key, its cache, and its
    search (here: the last config, counted)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.searches = 0

    def run(self, *args, **kwargs):
        nargs = {**dict(zip(self.arg_names, args)), **kwargs}
        key = (nargs["n"], str(nargs["x_ptr"].dtype))
        if key not in self.cache:
            self.searches += 1
            self.cache[key] = self.configs[-1]
        config = self.cache[key]
        return self.fn.run(*args, **kwargs, **config.all_kwargs())


scale = triton.autotune(configs=CONFIGS, key=["n"])(_scale)
sum_squares = triton.autotune(configs=CONFIGS, key=["n"])(_sum_squares)
lib_sum_squares = LibTuner(_sum_squares, _sum_squares.arg_names, CONFIGS, ["n"], None, None)


def gems_norm(x: torch.Tensor, *_: object, kernel: Autotuner = sum_squares, **__: object) -> torch.Tensor:
    """The 2-norm of all of ``x`` by an autotuned kernel, as an op library computes it."""
    flat = x.reshape(-1).contiguous()
    total = torch.zeros(1, dtype=x.dtype)
    kernel[lambda m: (triton.cdiv(flat.numel(), m["BLOCK"]),)](flat, total, flat.numel())
    return total[0].sqrt()


def refusing_norm(x: torch.Tensor, *_: object, **__: object) -> torch.Tensor:
    raise NotImplementedError(f"vector_norm not implemented for {x.dtype}")


@pytest.fixture
def replaced_norm():
    """Put a function under aten's CPU linalg_vector_norm for the test, torch's own after."""
    libraries = []

    def replace(fn):
        library = torch.library.Library("aten", "IMPL")
        library.impl("linalg_vector_norm", fn, "CPU")
        libraries.append(library)

    yield replace
    for library in libraries:
        library._destroy()


@pytest.fixture(autouse=True)
def _fresh():
    STATS.clear()
    yield
    tunesvc.uncapture()


def run_scale(n: int, alpha: float = 1.5) -> None:
    x, out = torch.randn(n), torch.empty(n)
    scale[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n, alpha)
    torch.testing.assert_close(out, alpha * x)


def test_relative_error_is_computed_on_the_host_where_the_device_op_is_refused(replaced_norm):
    out, ref = torch.randn(301, dtype=torch.bfloat16), torch.randn(301, dtype=torch.bfloat16)
    expected = relative_error(out, ref)
    replaced_norm(refusing_norm)
    with pytest.raises(NotImplementedError):
        torch.randn(3, dtype=torch.float64).norm()
    assert math.isclose(relative_error(out, ref), expected, rel_tol=1e-12)
    assert relative_error(out, out) == 0.0
    assert relative_error(torch.full((3,), float("nan")), torch.ones(3)) == math.inf
    rightly_infinite = torch.tensor([1.0, -math.inf, 2.0])
    assert relative_error(rightly_infinite, rightly_infinite.clone()) == 0.0
    assert relative_error(rightly_infinite, torch.tensor([1.0, 0.0, 2.0])) == math.inf
    assert relative_error(torch.ones(3), torch.ones(4)) == math.inf


def test_a_kernel_is_tuned_where_the_library_norm_refuses_float64(tmp_db, replaced_norm):
    replaced_norm(refusing_norm)
    with tunesvc.capture(db=tmp_db):
        run_scale(1001)
    assert STATS["tuned"] == 1
    [(name, statuses)] = trials_by_kernel(tmp_db).items()
    assert name == kernel_name(_scale) and statuses == {"ok": len(CONFIGS)}


def test_autotuned_kernels_under_torch_ops_tune_nothing_inside_the_measuring(tmp_db, replaced_norm):
    replaced_norm(gems_norm)
    with tunesvc.capture(db=tmp_db):
        run_scale(1001)
        # every check after the first config's called the library's norm, which launched the
        # autotuned sum_squares: inside the measuring, fallback configs, nothing tuned or kept
        assert STATS["tuned"] == 1 and STATS["nested"] >= 2 * (len(CONFIGS) - 1)
        assert set(trials_by_kernel(tmp_db)) == {kernel_name(_scale)}
        # the program's own launch of the same kernel and key is then tuned like any other
        assert math.isclose(gems_norm(torch.ones(1001, dtype=torch.float64)).item(), math.sqrt(1001), rel_tol=1e-12)
        assert STATS["tuned"] == 2
    counts = trials_by_kernel(tmp_db)
    assert counts[f"{__name__}:_sum_squares"] == {"ok": len(CONFIGS)}


def test_a_library_autotuner_with_its_own_run_searches_nothing_inside_the_measuring(tmp_db, replaced_norm):
    replaced_norm(lambda x, *a, **k: gems_norm(x, kernel=lib_sum_squares))
    with tunesvc.capture(db=tmp_db):
        run_scale(1001)
        assert STATS["tuned"] == 1 and STATS["nested"] >= 2 * (len(CONFIGS) - 1)
        assert lib_sum_squares.searches == 0 and not dict(lib_sum_squares.cache.inner)
        assert set(trials_by_kernel(tmp_db)) == {kernel_name(_scale)}
        assert math.isclose(
            gems_norm(torch.ones(999, dtype=torch.float64), kernel=lib_sum_squares).item(),
            math.sqrt(999),
            rel_tol=1e-12,
        )
        assert STATS["tuned"] == 2 and lib_sum_squares.searches == 0
    assert trials_by_kernel(tmp_db)[f"{__name__}:_sum_squares"] == {"ok": len(CONFIGS)}
