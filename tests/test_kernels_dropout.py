"""Seeded dropout (kernels/dropout.py) in Triton's interpreter. Philox's stream cannot be drawn
in torch, so the kernel is checked by properties: kept elements are x / (1 - p), dropped ones
0, the keep fraction is within a binomial bound, a seed fixes the mask on any config, and the
backward applies the forward's mask; plus the reference that sweeps check against."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import triton

import tunesvc
import tunesvc.kernels
from tunesvc.bench import Bench
from tunesvc.bench import Status
from tunesvc.kernels.dropout import TEMPLATE
from tunesvc.kernels.dropout import DropoutTemplate
from tunesvc.kernels.dropout import _dropout_kernel
from tunesvc.kernels.dropout import _keep_mask_kernel
from tunesvc.kernels.dropout import keep_mask
from tunesvc.kernels.dropout import launch_dropout
from tunesvc.serving.runtime import Runtime
from tunesvc.store import Store
from tunesvc.tuning.sweep import run_sweep

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# none of the sizes below is a multiple of these blocks
CONFIGS = [
    {"BLOCK": 256, "LANES_2D": 0, "num_warps": 1},
    {"BLOCK": 1024, "LANES_2D": 1, "num_warps": 4},
    {"BLOCK": 4096, "LANES_2D": 0, "num_warps": 8},
    {"BLOCK": 256, "LANES_2D": 1, "num_warps": 2},
]


def within_binomial_bound(kept: torch.Tensor, p: float) -> bool:
    """Keep fraction within 5 standard deviations of 1 - p (a false alarm about once in 3.5 M)."""
    n = kept.numel()
    return abs(kept.double().mean().item() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("config", CONFIGS[:2], ids=["1d", "lanes_2d"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_kept_elements_are_scaled_and_dropped_ones_zero(dtype, p, config):
    x = torch.randn(37, 45, dtype=dtype)
    x[x == 0] = 1.0  # a draw that rounds to 0 in float16 would read as dropped
    out = tunesvc.kernels.dropout(x, p, seed=1234, config=config)
    assert out.shape == x.shape and out.dtype == dtype
    kept = out != 0  # x is never 0, so a kept element is never 0
    assert torch.equal(kept.flatten(), keep_mask(x.numel(), p, 1234, "cpu"))
    expected = (x.double() / (1 - p)).to(dtype)
    torch.testing.assert_close(out[kept], expected[kept], rtol={torch.float32: 1e-6}.get(dtype, 1e-2), atol=0)
    assert 0 < kept.sum() < x.numel()


def test_keep_fraction_is_binomial_on_every_philox_lane():
    p, n = 0.3, 20_011
    kept = launch_dropout(torch.randn(n), p, 7, CONFIGS[2]) != 0
    assert within_binomial_bound(kept, p)
    # each element takes one of Philox's four outputs (i % 4): every lane must be a fair draw,
    # and no lane may repeat another's numbers
    lanes = [kept[i : n - n % 4 : 4] for i in range(4)]
    assert all(within_binomial_bound(lane, p) for lane in lanes)
    assert all(not torch.equal(lanes[i], lanes[j]) for i in range(4) for j in range(i + 1, 4))


def test_same_seed_same_output_on_every_config_and_different_seed_different_mask():
    x = torch.randn(999)
    outs = [launch_dropout(x, 0.5, 42, c) for c in CONFIGS]
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    other = launch_dropout(x, 0.5, 43, CONFIGS[0])
    assert not torch.equal(outs[0] != 0, other != 0)
    # independent masks agree on about half of the elements, not on nearly all
    assert within_binomial_bound((outs[0] != 0) == (other != 0), 0.5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_regenerates_the_forward_mask(dtype):
    p, seed = 0.25, 99
    x = torch.randn(7, 11, 13, dtype=dtype, requires_grad=True)
    grad = torch.randn(7, 11, 13, dtype=dtype)
    out = tunesvc.kernels.dropout(x, p, seed)
    out.backward(grad)
    # torch autograd through the reference formula with the same mask
    keep = keep_mask(x.numel(), p, seed, "cpu").view(x.shape)
    x_ref = x.detach().double().requires_grad_()
    (torch.where(keep, x_ref / (1 - p), 0.0) * grad.double()).sum().backward()
    assert torch.equal(x.grad != 0, out.detach() != 0)
    tol = {torch.float32: 1e-6}.get(dtype, 1e-2)
    torch.testing.assert_close(x.grad.double(), x_ref.grad, rtol=tol, atol=0)


@pytest.mark.parametrize("lanes_2d", [0, 1])
def test_int64_offsets_path_matches_its_mask_kernel(lanes_2d):
    # tensors of 2^31 elements take this path; it is forced here on a small one
    n, p, seed = 3001, 0.4, 11
    x = torch.randn(n)
    y = torch.empty_like(x)
    grid = (triton.cdiv(n, 512),)
    _dropout_kernel[grid](x, y, n, seed, p, 1 / (1 - p), BLOCK=512, LANES_2D=lanes_2d, INT64_OFFSETS=True)
    keep = torch.empty(n, dtype=torch.int8)
    _keep_mask_kernel[(triton.cdiv(n, 1024),)](keep, n, seed, p, BLOCK=1024, INT64_OFFSETS=True)
    assert torch.equal(y != 0, keep.bool())
    assert within_binomial_bound(keep.bool(), p)
    torch.testing.assert_close(y[keep.bool()], x[keep.bool()] / (1 - p))


def test_mask_follows_logical_order_for_strided_tensors():
    x = torch.randn(45, 37).t()
    assert not x.is_contiguous()
    out = tunesvc.kernels.dropout(x, 0.5, 5, config=CONFIGS[1])
    assert torch.equal(out, tunesvc.kernels.dropout(x.contiguous(), 0.5, 5, config=CONFIGS[1]))


class _SkipsTail(DropoutTemplate):
    """A broken kernel: the last 7 elements are never written."""

    def launch(self, inputs, config):
        x, p, seed = inputs
        out = torch.zeros_like(x)
        launch_dropout(x[:-7], p, seed, config, out=out[:-7])
        return out


class _ShiftsMask(DropoutTemplate):
    """A broken kernel: a mask from the wrong offsets (here, the wrong seed)."""

    def launch(self, inputs, config):
        x, p, seed = inputs
        return launch_dropout(x, p, seed + 1, config)


def test_bench_reference_passes_the_kernel_and_catches_broken_ones(device):
    problem = TEMPLATE.problem(numel=999, dtype="float32")
    config = TEMPLATE.heuristic(problem, device)
    assert Bench(TEMPLATE, problem, device).measure(config).status is Status.OK
    for broken in (_SkipsTail(), _ShiftsMask()):
        assert Bench(broken, problem, device).measure(config).status is Status.WRONG_RESULT


@pytest.mark.parametrize(
    ("x", "p", "seed", "match"),
    [
        (torch.randn(4), 1.0, 0, "0 <= p < 1"),
        (torch.randn(4), -0.1, 0, "0 <= p < 1"),
        (torch.randn(4), 0.5, -1, "integer seed"),
        (torch.randn(4), 0.5, 1.5, "integer seed"),
        (torch.ones(4, dtype=torch.int32), 0.5, 0, "float16, bfloat16 or float32"),
        (torch.empty(0), 0.5, 0, "non-empty"),
    ],
    ids=["p1", "p_negative", "seed_negative", "seed_float", "int", "empty"],
)
def test_dropout_rejects_bad_arguments(x, p, seed, match):
    with pytest.raises(ValueError, match=match):
        tunesvc.kernels.dropout(x, p, seed)


def test_heuristic_is_feasible_everywhere(device):
    h100 = dataclasses.replace(device, kind="cuda", sm_count=132, max_shared_memory=232448, max_num_regs=65536)
    for numel in (1, 3, 999, 4096, 1 << 20, 1 << 27):
        for dev in (device, h100):
            problem = TEMPLATE.problem(numel=numel, dtype="bfloat16")
            assert TEMPLATE.violations(TEMPLATE.heuristic(problem, dev), problem, dev) == [], numel


def test_sweep_stores_a_winner_the_runtime_and_dropout_use(tmp_db, device, monkeypatch):
    problem = TEMPLATE.problem(numel=999, dtype="float32")
    store = Store(tmp_db)
    try:
        [result] = run_sweep(TEMPLATE, [problem], store, strategy="grid", budget=3, device=device)
    finally:
        store.close()
    assert result.trials_stored == 3 and result.failures == 0 and result.winner is not None
    found = Runtime(db=tmp_db).lookup(TEMPLATE, numel=999, dtype="float32")
    assert found.source == "exact" and found.config == result.winner

    monkeypatch.setenv("TUNESVC_DB", tmp_db)
    x = torch.randn(27, 37)
    out = tunesvc.kernels.dropout(x, 0.1, 3)
    assert torch.equal(out, launch_dropout(x, 0.1, 3, CONFIGS[0]))
    assert tunesvc.serving.runtime.default_runtime().stats()["dropout"] == {"exact": 1}
