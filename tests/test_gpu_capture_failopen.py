"""Capture's fail-open and no-trace rules where they differ on a GPU: the finalists' re-measure
(GPU only) of configs a pruner built, float8 outputs (CUDA has no ``abs`` for them), the
current stream and device and the CUDA RNG after tuning, autograd, and a fault in the GPU's
timing that leaves the launch to Triton's own autotuner."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch
import triton
from _capture import cast as _cast
from _capture import scale as _scale
from _capture import trials_by_kernel

import tunesvc
import tunesvc._capture.bench as capture_bench
from tunesvc._capture import STATS

pytestmark = pytest.mark.gpu

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (128, 256, 512) for w in (2, 4)]
N = 100_003  # no block size divides it


def grid(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


@pytest.fixture(autouse=True)
def _fresh():
    STATS.clear()
    yield
    tunesvc.uncapture()


def _said(caught):
    return [str(w.message) for w in caught if str(w.message).startswith("tunesvc:")]


def _built(configs, nargs, **kwargs):
    return [triton.Config({"BLOCK": 256}, num_warps=w, num_stages=s) for w in (4, 8) for s in (1, 2)]


def test_configs_a_pruner_builds_pass_the_finalists_remeasure_and_are_served(tmp_db):
    x, out = torch.randn(N, device="cuda"), torch.empty(N, device="cuda")
    with tunesvc.capture(db=tmp_db), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        triton.autotune(CONFIGS, key=["n"], prune_configs_by={"early_config_prune": _built})(_scale)[grid(N)](
            x, out, N, 2.0
        )
    assert not _said(caught), _said(caught)
    torch.testing.assert_close(out, 2.0 * x)
    assert STATS["tuned"] == 1
    STATS.clear()
    kernel = triton.autotune(CONFIGS, key=["n"], prune_configs_by={"early_config_prune": _built})(_scale)
    with tunesvc.capture(db=tmp_db):
        kernel[grid(N)](x, out, N, 3.0)
    torch.testing.assert_close(out, 3.0 * x)
    assert dict(STATS) == {"stored": 1} and kernel.best_config.kwargs == {"BLOCK": 256}


@pytest.mark.parametrize("dtype", [torch.float8_e5m2, torch.float8_e4m3fn, torch.int8, torch.bool])
def test_outputs_of_every_dtype_are_compared_by_value_on_the_gpu(dtype, tmp_db):
    x = torch.randn(N, device="cuda") * 4
    expected = torch.empty(N, dtype=dtype, device="cuda")
    triton.autotune(CONFIGS, key=["n"])(_cast)[grid(N)](x, expected, N)
    out = torch.empty(N, dtype=dtype, device="cuda")
    with tunesvc.capture(db=tmp_db), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        triton.autotune(CONFIGS, key=["n"])(_cast)[grid(N)](x, out, N)
    assert not _said(caught), _said(caught)
    assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8))
    assert sum(trials_by_kernel(tmp_db).values(), start=Counter()) == {"ok": len(CONFIGS)}


def _cuda_rng_hook(nargs, reset_only=False):
    if not reset_only:
        torch.rand(3, device="cuda")


def test_tuning_keeps_the_stream_the_device_and_the_cuda_rng(tmp_db):
    kernel = triton.autotune(CONFIGS, key=["n"], pre_hook=_cuda_rng_hook)(_scale)
    x, out = torch.randn(N, device="cuda"), torch.empty(N, device="cuda")
    stream = torch.cuda.Stream()
    device = torch.cuda.current_device()
    with tunesvc.capture(db=tmp_db), torch.cuda.stream(stream):
        rng = torch.cuda.get_rng_state()
        kernel[grid(N)](x, out, N, 2.0)
        assert torch.cuda.current_stream() == stream
        assert torch.equal(torch.cuda.get_rng_state(), rng)
    stream.synchronize()
    assert torch.cuda.current_device() == device and STATS["tuned"] == 1
    torch.testing.assert_close(out, 2.0 * x)


class _Double(torch.autograd.Function):
    kernels: list = []

    @staticmethod
    def forward(ctx, x):
        y = torch.empty_like(x)
        _Double.kernels[0][grid(x.numel())](x, y, x.numel(), 2.0)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        _x, _y = ctx.saved_tensors  # unpacking checks their versions
        gx = torch.empty_like(g)
        _Double.kernels[1][grid(g.numel())](g.contiguous(), gx, g.numel(), 2.0)
        return gx


def test_tuning_inside_an_autograd_function_keeps_the_backward_on_the_gpu(tmp_db):
    _Double.kernels = [
        triton.autotune(CONFIGS, key=["n"])(_scale),
        triton.autotune(CONFIGS, key=["n", "alpha"])(_scale),
    ]
    x = torch.randn(N, device="cuda", requires_grad=True)
    with tunesvc.capture(db=tmp_db):
        y = _Double.apply(x)
        y.sum().backward()
    assert x._version == 0 and STATS["tuned"] == 2
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))


def test_a_fault_in_the_gpu_timing_runs_the_launch_as_triton_autotune(tmp_db, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(capture_bench.CaptureBench, "_timed", boom)
    kernel = triton.autotune(CONFIGS, key=["n"])(_scale)
    x, out = torch.randn(N, device="cuda"), torch.empty(N, device="cuda")
    with tunesvc.capture(db=tmp_db), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel[grid(N)](x, out, N, 2.0)
    said = _said(caught)
    assert len(said) == 1 and "injected fault" in said[0], said
    torch.testing.assert_close(out, 2.0 * x)
    assert kernel.best_config in CONFIGS and not STATS["tuned"]
