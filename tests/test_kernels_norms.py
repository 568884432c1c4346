"""Correctness of LayerNorm and RMSNorm, forward and backward (kernels/layernorm.py,
kernels/rmsnorm.py), in Triton's interpreter, and one sweep per template through the pipeline."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

import tunesvc
import tunesvc.kernels
import tunesvc.serving.runtime
from tunesvc import TunesvcError
from tunesvc.bench import relative_error as rel_error
from tunesvc.kernels import layernorm
from tunesvc.kernels import rmsnorm
from tunesvc.kernels.layernorm import launch_layernorm
from tunesvc.kernels.layernorm import launch_layernorm_bwd
from tunesvc.kernels.rmsnorm import launch_rmsnorm
from tunesvc.kernels.rmsnorm import launch_rmsnorm_bwd
from tunesvc.store import Store
from tunesvc.tuning.sweep import run_sweep

TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5}

# odd on purpose: no block size divides M or N
SHAPES = [(37, 45), (5, 130)]

TEMPLATES = [layernorm.TEMPLATE, layernorm.BWD_TEMPLATE, rmsnorm.TEMPLATE, rmsnorm.BWD_TEMPLATE]


def make(M: int, N: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x with a non-zero mean, weight around 1, bias and upstream gradient: fresh and random."""
    x = (torch.randn(M, N) * 2 + 0.5).to(dtype)
    w = (torch.randn(N) + 1).to(dtype)
    b = torch.randn(N).to(dtype)
    dy = torch.randn(M, N).to(dtype)
    return x, w, b, dy


def fwd_config(block_m: int, N: int) -> dict[str, int]:
    return {"BLOCK_M": block_m, "BLOCK_N": max(16, 1 << (N - 1).bit_length()), "num_warps": 2}


def bwd_config(block_m: int, N: int, group: int = 64) -> dict[str, int]:
    return {**fwd_config(block_m, N), "GROUP_SIZE_M": group, "num_stages": 1}


def torch_grads(fn, x, params, dy):
    """Float64 torch autograd: (y, dx, *dparams) of fn(x, *params) against dy."""
    x64 = x.double().requires_grad_(True)
    p64 = [p.double().requires_grad_(True) for p in params]
    y = fn(x64, *p64)
    y.backward(dy.double())
    return (y.detach(), x64.grad, *(p.grad for p in p64))


def ln_ref(x, w, b, eps=1e-5):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def rms_ref(x, w, eps=1e-6):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)


# -- forward kernels with explicit configs ----------------------------------------------------
@pytest.mark.parametrize("block_m", [1, 4])
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_kernels_match_reference(shape, dtype, block_m):
    M, N = shape
    x, w, b, _ = make(M, N, dtype)
    y, mean, rstd = launch_layernorm(x, w, b, 1e-5, fwd_config(block_m, N))
    assert y.dtype == dtype and y.shape == (M, N)
    assert rel_error(y, ln_ref(x.double(), w.double(), b.double())) < TOL[dtype]
    var, mean_ref = torch.var_mean(x.double(), dim=1, correction=0)
    assert rel_error(mean, mean_ref) < 1e-5
    assert rel_error(rstd, torch.rsqrt(var + 1e-5)) < 1e-5

    y, rstd = launch_rmsnorm(x, w, 1e-6, fwd_config(block_m, N))
    assert y.dtype == dtype and y.shape == (M, N)
    assert rel_error(y, rms_ref(x.double(), w.double())) < TOL[dtype]
    assert rel_error(rstd, torch.rsqrt(x.double().square().mean(dim=1) + 1e-6)) < 1e-5


# -- backward kernels with explicit configs: several rows per program, ragged row blocks -------
def test_backward_kernels_reduce_every_row():
    # M=150 over 64 programs: 3 rows each (the last program 2), walked 2 at a time
    M, N = 150, 19
    x, w, b, dy = make(M, N, torch.float32)
    config = bwd_config(2, N)

    _, mean, rstd = launch_layernorm(x, w, b, 1e-5, fwd_config(1, N))
    dx, dw, db = launch_layernorm_bwd(x, w, dy, mean, rstd, config)
    _, dx_ref, dw_ref, db_ref = torch_grads(ln_ref, x, (w, b), dy)
    for got, ref in ((dx, dx_ref), (dw, dw_ref), (db, db_ref)):
        assert rel_error(got, ref) < 1e-5

    _, rstd = launch_rmsnorm(x, w, 1e-6, fwd_config(1, N))
    dx, dw = launch_rmsnorm_bwd(x, w, dy, rstd, config)
    _, dx_ref, dw_ref = torch_grads(rms_ref, x, (w,), dy)
    assert rel_error(dx, dx_ref) < 1e-5
    assert rel_error(dw, dw_ref) < 1e-5


@pytest.mark.gpu
def test_backward_is_bitwise_deterministic_on_the_gpu():
    # each program owns its partial row of dw/db: no atomics, so two runs agree to the bit
    x, w, b, dy = (t.cuda() for t in make(4099, 1000, torch.bfloat16))
    _, mean, rstd = launch_layernorm(x, w, b, 1e-5, fwd_config(2, 1000))
    first = launch_layernorm_bwd(x, w, dy, mean, rstd, bwd_config(2, 1000, group=256))
    second = launch_layernorm_bwd(x, w, dy, mean, rstd, bwd_config(2, 1000, group=256))
    for a, b_ in zip(first, second):
        assert torch.equal(a, b_)
    _, dx_ref, dw_ref, db_ref = torch_grads(ln_ref, x, (w, b), dy)
    for got, ref in zip(first, (dx_ref, dw_ref, db_ref)):
        assert rel_error(got, ref) < TOL[torch.bfloat16]


# -- the user-facing functions, autograd included ---------------------------------------------
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_layer_norm_forward_and_gradients(shape, dtype):
    M, N = shape
    x, w, b, dy = make(M, N, dtype)
    y_ref, dx_ref, dw_ref, db_ref = torch_grads(ln_ref, x, (w, b), dy)
    x.requires_grad_(True)
    w.requires_grad_(True)
    b.requires_grad_(True)
    y = tunesvc.kernels.layer_norm(x, w, b)
    y.backward(dy)
    assert y.dtype == dtype and x.grad.dtype == dtype and w.grad.dtype == dtype
    assert rel_error(y, y_ref) < TOL[dtype]
    for got, ref in ((x.grad, dx_ref), (w.grad, dw_ref), (b.grad, db_ref)):
        assert rel_error(got, ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_rms_norm_forward_and_gradients(shape, dtype):
    M, N = shape
    x, w, _, dy = make(M, N, dtype)
    y_ref, dx_ref, dw_ref = torch_grads(rms_ref, x, (w,), dy)
    x.requires_grad_(True)
    w.requires_grad_(True)
    y = tunesvc.kernels.rms_norm(x, w)
    y.backward(dy)
    assert y.dtype == dtype and x.grad.dtype == dtype and w.grad.dtype == dtype
    assert rel_error(y, y_ref) < TOL[dtype]
    assert rel_error(x.grad, dx_ref) < TOL[dtype]
    assert rel_error(w.grad, dw_ref) < TOL[dtype]


def test_leading_dims_strided_rows_and_float32_weights():
    # x (2, 3, 45) as a window of a wider tensor: rows strided by 64; bf16 x with fp32 params
    x = (torch.randn(2, 3, 64) * 2 + 0.5).to(torch.bfloat16)[..., :45]
    assert not x.is_contiguous()
    w = torch.randn(45) + 1
    b = torch.randn(45)
    dy = torch.randn(2, 3, 45).to(torch.bfloat16)
    y_ref, dx_ref, dw_ref, db_ref = torch_grads(ln_ref, x, (w, b), dy)
    x.requires_grad_(True)
    w.requires_grad_(True)
    b.requires_grad_(True)
    y = tunesvc.kernels.layer_norm(x, w, b)
    y.backward(dy)
    assert y.shape == x.shape and y.dtype == torch.bfloat16 and w.grad.dtype == torch.float32
    assert rel_error(y, y_ref) < TOL[torch.bfloat16]
    for got, ref in ((x.grad, dx_ref), (w.grad, dw_ref), (b.grad, db_ref)):
        assert rel_error(got, ref) < TOL[torch.bfloat16]

    x2 = x.detach().requires_grad_(True)  # the same strided view
    y_ref, dx_ref, dw_ref = torch_grads(rms_ref, x2.detach(), (w.detach(),), dy)
    w2 = w.detach().requires_grad_(True)
    y2 = tunesvc.kernels.rms_norm(x2, w2)
    y2.backward(dy)
    assert rel_error(y2, y_ref) < TOL[torch.bfloat16]
    assert rel_error(x2.grad, dx_ref) < TOL[torch.bfloat16]
    assert rel_error(w2.grad, dw_ref) < TOL[torch.bfloat16]


BAD = [
    # (x, weight, bias, message)
    (torch.randn(4, 8), torch.randn(7), torch.randn(8), "weight and bias of shape"),
    (torch.randn(4, 8), torch.randn(8), torch.randn(4, 8), "weight and bias of shape"),
    (torch.randint(0, 5, (4, 8)), torch.randn(8), torch.randn(8), "float16, bfloat16 or float32"),
    (torch.randn(0, 8), torch.randn(8), torch.randn(8), "non-empty x"),
]


@pytest.mark.parametrize(("x", "w", "b", "match"), BAD)
def test_layer_norm_rejects_bad_tensors(x, w, b, match):
    with pytest.raises(ValueError, match=match):
        tunesvc.kernels.layer_norm(x, w, b)


@pytest.mark.parametrize(("x", "w", "b", "match"), [case for case in BAD if case[2].ndim == 1])
def test_rms_norm_rejects_bad_tensors(x, w, b, match):
    with pytest.raises(ValueError, match=match):
        tunesvc.kernels.rms_norm(x, w)


def test_rows_wider_than_a_block_are_refused_in_one_sentence():
    x = torch.randn(1, 40000, dtype=torch.bfloat16)
    with pytest.raises(TunesvcError, match=r"N=40000 is too wide.*N <= 32768 for bfloat16"):
        tunesvc.kernels.rms_norm(x, torch.randn(40000, dtype=torch.bfloat16))
    with pytest.raises(TunesvcError, match="N <= 16384 for float32"):
        layernorm.TEMPLATE.problem(M=2, N=16385, dtype="float32")


# -- the template protocol ---------------------------------------------------------------------
@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: t.name)
def test_heuristic_is_feasible_everywhere(template, device):
    # the interpreter and an H100-like device: the heuristic never breaks the space
    h100 = dataclasses.replace(device, kind="cuda", sm_count=132, max_shared_memory=232448, max_num_regs=65536)
    rng = random.Random(0)
    problems = [*template.presets["tiny"], *template.presets["llm"], {"M": 1, "N": 1}, {"M": 1, "N": 32768}]
    problems += [{"M": rng.randint(1, 70000), "N": rng.randint(1, 16384)} for _ in range(40)]
    for dev in (device, h100):
        for shape in problems:
            problem = template.problem(**shape, dtype="bfloat16")
            config = template.heuristic(problem, dev)
            assert template.violations(config, problem, dev) == [], (shape, config)


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: t.name)
def test_key_cost_and_registry(template):
    assert tunesvc.get_template(template.name) is template
    problem = template.problem(M=37, N=45, dtype="bfloat16")
    key = template.key(problem)
    assert str(key) == "M=64,N=45,dtype=bfloat16"
    assert tunesvc.ShapeKey.parse(str(key)) == key
    cost = template.cost(problem)
    # at least x read and y (or dx) written, at most everything plus the row statistics
    assert 2 * 37 * 45 * 2 < cost.bytes <= 3 * 37 * 45 * 2 + 3 * 45 * 2 + 8 * 37
    assert cost.flops >= 4 * 37 * 45


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: t.name)
def test_sweep_stores_a_winner_that_the_runtime_returns(template, tmp_db, device):
    problem = template.problem(**template.presets["tiny"][1], dtype="float16")
    store = Store(tmp_db)
    try:
        [result] = run_sweep(template, [problem], store, strategy="grid", budget=3, device=device)
    finally:
        store.close()
    assert result.failures == 0 and result.trials_stored == 3 and result.winner is not None
    found = tunesvc.serving.runtime.Runtime(db=tmp_db).lookup(template, **problem)
    assert found.source == "exact" and found.config == result.winner


def test_user_functions_launch_the_tuned_configs(tmp_db, device):
    # sweep all four templates on one tiny problem; the autograd functions then hit exact keys
    M, N = 5, 130
    store = Store(tmp_db)
    try:
        for template in TEMPLATES:
            run_sweep(
                template, [template.problem(M=M, N=N, dtype="float32")], store, strategy="grid", budget=1, device=device
            )
    finally:
        store.close()
    runtime = tunesvc.serving.runtime.configure(db=tmp_db)
    x, w, b, dy = make(M, N, torch.float32)
    x.requires_grad_(True)
    tunesvc.kernels.layer_norm(x, w.requires_grad_(True), b.requires_grad_(True)).backward(dy)
    tunesvc.kernels.rms_norm(x, w).backward(dy)
    assert runtime.stats() == {t.name: {"exact": 1} for t in TEMPLATES}
