"""Correctness of the fused bias + activation + residual kernel and its backward
(kernels/pointwise.py) in Triton's interpreter, gradients against torch autograd, the
user-facing function, and one sweep per template through the pipeline."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tunesvc
import tunesvc.kernels
from tunesvc import TunesvcError
from tunesvc.bench import relative_error
from tunesvc.kernels.pointwise import BWD_TEMPLATE
from tunesvc.kernels.pointwise import TEMPLATE
from tunesvc.kernels.pointwise import launch_bias_act_residual
from tunesvc.serving.runtime import Runtime
from tunesvc.store import Store
from tunesvc.tuning.sweep import run_sweep

TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5}

# neither 37 rows nor 45 columns is a multiple of any tile side here
CONFIGS = [
    {"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 1},
    {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4},
]

TORCH_ACT = {
    "gelu": lambda z: torch.nn.functional.gelu(z),  # erf form, torch's default
    "silu": torch.nn.functional.silu,
    "relu": torch.relu,
}


def inputs(dtype: torch.dtype, m: int = 37, n: int = 45) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.randn(m, n, dtype=dtype), torch.randn(n, dtype=dtype), torch.randn(m, n, dtype=dtype)


def rel_error(out: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, act: str) -> float:
    ref = TORCH_ACT[act](x.double() + bias.double()) + residual.double()
    return relative_error(out, ref)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"BM{c['BLOCK_M']}-BN{c['BLOCK_N']}")
@pytest.mark.parametrize("act", list(TORCH_ACT))
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
def test_bias_act_residual_matches_float64_reference(dtype, act, config):
    x, bias, residual = inputs(dtype)
    out = launch_bias_act_residual(x, bias, residual, act, config)
    assert out.shape == x.shape and out.dtype == dtype
    assert rel_error(out, x, bias, residual, act) < TOL[dtype]


# 37 rows: three ragged groups of 16 rows, or one group; neither BLOCK_N divides 45
BWD_CONFIGS = [
    {"BLOCK_M": 4, "BLOCK_N": 16, "ROWS": 16, "num_warps": 1},
    {"BLOCK_M": 8, "BLOCK_N": 32, "ROWS": 64, "num_warps": 2},
]


@pytest.mark.parametrize("bwd_config", BWD_CONFIGS, ids=["3_groups", "1_group"])
@pytest.mark.parametrize("act", list(TORCH_ACT))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_gradients_match_torch_autograd(dtype, act, bwd_config):
    x, bias, residual = (t.requires_grad_() for t in inputs(dtype))
    dy = torch.randn(37, 45, dtype=dtype)
    out = tunesvc.kernels.bias_act_residual(x, bias, residual, act, config=CONFIGS[0], bwd_config=bwd_config)
    out.backward(dy)
    refs = [t.detach().double().requires_grad_() for t in (x, bias, residual)]
    (TORCH_ACT[act](refs[0] + refs[1]) + refs[2]).backward(dy.double())
    for name, ours, ref in zip(("dx", "dbias", "dresidual"), (x.grad, bias.grad, residual.grad), refs):
        assert ours.dtype == dtype, name
        err = ((ours.double() - ref.grad).norm() / ref.grad.norm()).item()
        assert err < TOL[dtype], (name, err)


def test_store_is_masked_to_the_output():
    x, bias, residual = inputs(torch.float32)
    buf = torch.full((40, 64), float("nan"))
    out = buf[:37, :45]
    launch_bias_act_residual(x, bias, residual, "silu", CONFIGS[0], out=out)
    assert not torch.isnan(out).any()
    assert torch.isnan(buf[37:]).all() and torch.isnan(buf[:, 45:]).all()
    assert rel_error(out, x, bias, residual, "silu") < TOL[torch.float32]


def test_entry_point_with_leading_dims_and_strided_rows():
    # x is a column slice of a wider tensor (row stride 60), residual is 3-D like its shape
    x = torch.randn(3, 11, 60)[..., 5:50]
    bias, residual = torch.randn(45), torch.randn(3, 11, 45)
    out = tunesvc.kernels.bias_act_residual(x, bias, residual, "gelu")
    assert out.shape == x.shape
    assert rel_error(out, x, bias, residual, "gelu") < TOL[torch.float32]


@pytest.mark.parametrize(
    ("x", "bias", "residual", "act", "match"),
    [
        (torch.randn(4, 5), torch.randn(5), torch.randn(4, 6), "gelu", "one shape"),
        (torch.randn(4, 5), torch.randn(4), torch.randn(4, 5), "gelu", "bias"),
        (torch.randn(4, 5), torch.randn(5, dtype=torch.float16), torch.randn(4, 5), "gelu", "one dtype"),
        (torch.randn(4, 5), torch.randn(5), torch.randn(4, 5), "tanh", "not one of"),
    ],
    ids=["residual_shape", "bias_shape", "dtype", "act"],
)
def test_entry_point_rejects_bad_tensors(x, bias, residual, act, match):
    with pytest.raises(ValueError, match=match):
        tunesvc.kernels.bias_act_residual(x, bias, residual, act)


def test_key_keeps_the_activation_as_a_field():
    problem = TEMPLATE.problem(M=37, N=45, act="silu", dtype="bfloat16")
    key = TEMPLATE.key(problem)
    assert str(key) == "M=64,N=45,act=silu,dtype=bfloat16"
    assert tunesvc.ShapeKey.parse(str(key)) == key
    with pytest.raises(TunesvcError, match="act='tanh' is not allowed"):
        TEMPLATE.problem(M=37, N=45, act="tanh")


@pytest.mark.parametrize("template", [TEMPLATE, BWD_TEMPLATE], ids=lambda t: t.name)
def test_heuristic_is_feasible_everywhere(device, template):
    h100 = dataclasses.replace(device, kind="cuda", sm_count=132, max_shared_memory=232448, max_num_regs=65536)
    for m in (1, 3, 37, 4096, 32768):
        for n in (1, 10, 45, 1000, 4096, 8192, 70000):
            for dev in (device, h100):
                problem = template.problem(M=m, N=n, dtype="bfloat16")
                assert template.violations(template.heuristic(problem, dev), problem, dev) == [], (m, n)


def test_sweeps_store_winners_the_runtime_and_entry_point_use(tmp_db, device, monkeypatch):
    problem = {"M": 37, "N": 45, "act": "relu", "dtype": "float32"}
    store = Store(tmp_db)
    try:
        results = [
            run_sweep(t, [t.problem(**problem)], store, strategy="grid", budget=3, device=device)[0]
            for t in (TEMPLATE, BWD_TEMPLATE)
        ]
    finally:
        store.close()
    runtime = Runtime(db=tmp_db)
    for template, result in zip((TEMPLATE, BWD_TEMPLATE), results):
        assert result.trials_stored == 3 and result.failures == 0 and result.winner is not None
        found = runtime.lookup(template, **problem)
        assert found.source == "exact" and found.config == result.winner

    monkeypatch.setenv("TUNESVC_DB", tmp_db)
    x, bias, residual = (t.requires_grad_() for t in inputs(torch.float32))
    out = tunesvc.kernels.bias_act_residual(x, bias, residual, "relu")
    out.sum().backward()
    assert rel_error(out.detach(), x.detach(), bias.detach(), residual.detach(), "relu") < TOL[torch.float32]
    assert x.grad is not None and bias.grad is not None
    stats = tunesvc.serving.runtime.default_runtime().stats()
    assert stats["bias_act_residual"] == {"exact": 1} and stats["bias_act_residual_bwd"] == {"exact": 1}
