"""Correctness of the row softmax and its backward (kernels/softmax.py) in Triton's interpreter:
the one-pass and multi-block paths, gradients against torch autograd, the user-facing function,
and one sweep per template through the pipeline."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tunesvc
import tunesvc.kernels
from tunesvc.bench import relative_error
from tunesvc.kernels.softmax import BWD_TEMPLATE
from tunesvc.kernels.softmax import TEMPLATE
from tunesvc.kernels.softmax import launch_softmax
from tunesvc.kernels.softmax import launch_softmax_bwd
from tunesvc.serving.runtime import Runtime
from tunesvc.store import Store
from tunesvc.tuning.sweep import run_sweep

TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5}

ONE_PASS = {"BLOCK_M": 4, "BLOCK_N": 64, "num_warps": 2, "num_stages": 1}  # 45 columns in one block
MULTI_BLOCK = {"BLOCK_M": 4, "BLOCK_N": 16, "num_warps": 1, "num_stages": 2}  # 45 = 16 + 16 + 13


def rel_error(out: torch.Tensor, x: torch.Tensor) -> float:
    ref = torch.softmax(x.double(), dim=-1)
    return relative_error(out, ref)


@pytest.mark.parametrize("config", [ONE_PASS, MULTI_BLOCK], ids=["one_pass", "multi_block"])
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
def test_softmax_matches_float64_reference(dtype, config):
    x = 3.0 * torch.randn(37, 45, dtype=dtype)
    out = launch_softmax(x, config)
    assert out.shape == x.shape and out.dtype == dtype
    assert rel_error(out, x) < TOL[dtype]


def test_multi_block_rescales_when_the_max_grows():
    # rows of 300 (five 64-wide blocks, the last ragged) whose max sits in a late block, with
    # values large enough that a sum not rescaled by exp(m_old - m_new) overflows or is wrong
    x = torch.randn(5, 300) + torch.linspace(0.0, 80.0, 300)
    x[1] = x[1].flip(0)  # and one row whose max comes first
    out = launch_softmax(x, {"BLOCK_M": 1, "BLOCK_N": 64, "num_warps": 2, "num_stages": 2})
    assert rel_error(out, x) < TOL[torch.float32]
    assert torch.allclose(out.sum(-1), torch.ones(5), atol=1e-5)


@pytest.mark.parametrize("config", [ONE_PASS, MULTI_BLOCK], ids=["one_pass", "multi_block"])
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
def test_gradient_matches_torch_autograd(dtype, config):
    x = (3.0 * torch.randn(37, 45, dtype=dtype)).requires_grad_()
    dy = torch.randn(37, 45, dtype=dtype)
    out = tunesvc.kernels.softmax(x, config=config, bwd_config=config)
    out.backward(dy)
    x64 = x.detach().double().requires_grad_()
    torch.softmax(x64, dim=-1).backward(dy.double())
    assert rel_error(out.detach(), x) < TOL[dtype]
    assert x.grad.dtype == dtype
    err = ((x.grad.double() - x64.grad).norm() / x64.grad.norm()).item()
    # the backward reads the forward's rounded y, so half-precision errors add up once more
    assert err < 2 * TOL[dtype]


def test_backward_two_pass_over_long_rows():
    y = torch.softmax(torch.randn(3, 300, dtype=torch.float64), dim=-1).float()
    dy = torch.randn(3, 300)
    dx = launch_softmax_bwd(y, dy, {"BLOCK_M": 1, "BLOCK_N": 64, "num_warps": 2, "num_stages": 2})
    ref = BWD_TEMPLATE.reference((y, dy))
    assert ((dx.double() - ref).norm() / ref.norm()).item() < TOL[torch.float32]


def test_rows_past_the_end_are_not_written():
    # the output is a window into a NaN buffer; BLOCK_M=16 over 37 rows leaves 11 spare rows
    x = torch.randn(37, 45)
    buf = torch.full((48, 80), float("nan"))
    out = buf[:37, :45]
    launch_softmax(x, {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}, out=out)
    assert not torch.isnan(out).any()
    assert torch.isnan(buf[37:]).all() and torch.isnan(buf[:, 45:]).all()
    assert rel_error(out, x) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
def test_softmax_entry_point_without_tuning(dtype):
    # 3-D input, last dim softmaxed; no database anywhere: the heuristic config
    x = torch.randn(3, 7, 45, dtype=dtype)
    out = tunesvc.kernels.softmax(x)
    assert out.shape == x.shape and out.dtype == dtype
    assert rel_error(out, x) < TOL[dtype]


def test_softmax_of_a_transposed_tensor():
    x = torch.randn(45, 37).t()
    assert x.stride(1) != 1
    assert rel_error(tunesvc.kernels.softmax(x, config=MULTI_BLOCK), x) < TOL[torch.float32]


@pytest.mark.parametrize(
    ("x", "match"),
    [(torch.ones(3, 4, dtype=torch.int32), "float16, bfloat16 or float32"), (torch.empty(0, 4), "non-empty")],
    ids=["int", "empty"],
)
def test_softmax_rejects_bad_tensors(x, match):
    with pytest.raises(ValueError, match=match):
        tunesvc.kernels.softmax(x)


@pytest.mark.parametrize("template", [TEMPLATE, BWD_TEMPLATE], ids=lambda t: t.name)
def test_heuristic_is_feasible_everywhere(device, template):
    h100 = dataclasses.replace(device, kind="cuda", sm_count=132, max_shared_memory=232448, max_num_regs=65536)
    for m in (1, 3, 37, 4096, 32768):
        for n in (1, 10, 45, 1000, 4096, 8192, 70000):
            for dev in (device, h100):
                problem = template.problem(M=m, N=n, dtype="bfloat16")
                assert template.violations(template.heuristic(problem, dev), problem, dev) == [], (m, n)


def test_sweeps_store_winners_the_runtime_and_softmax_use(tmp_db, device, monkeypatch):
    store = Store(tmp_db)
    try:
        results = [
            run_sweep(t, [t.problem(M=37, N=45, dtype="float32")], store, strategy="grid", budget=3, device=device)[0]
            for t in (TEMPLATE, BWD_TEMPLATE)
        ]
    finally:
        store.close()
    runtime = Runtime(db=tmp_db)
    for template, result in zip((TEMPLATE, BWD_TEMPLATE), results):
        assert result.trials_stored == 3 and result.failures == 0 and result.winner is not None
        found = runtime.lookup(template, M=37, N=45, dtype="float32")
        assert found.source == "exact" and found.config == result.winner

    monkeypatch.setenv("TUNESVC_DB", tmp_db)
    x = torch.randn(37, 45, requires_grad=True)
    out = tunesvc.kernels.softmax(x)
    out.backward(torch.randn(37, 45))
    assert rel_error(out.detach(), x) < TOL[torch.float32]
    assert x.grad is not None
    stats = tunesvc.serving.runtime.default_runtime().stats()
    assert stats["softmax"] == {"exact": 1} and stats["softmax_bwd"] == {"exact": 1}
