"""Correctness of flash attention forward and backward (kernels/attention.py) in Triton's interpreter."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from _devices import H100

import tunesvc
from tunesvc.bench import relative_error as rel_error
from tunesvc.kernels.attention import BWD_TEMPLATE
from tunesvc.kernels.attention import TEMPLATE
from tunesvc.kernels.attention import attention
from tunesvc.kernels.attention import launch_attention
from tunesvc.kernels.attention import launch_attention_bwd
from tunesvc.serving.runtime import Runtime
from tunesvc.store import Store
from tunesvc.tuning.sweep import run_sweep

TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2}

FWD = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
# BLOCK_N1 > BLOCK_M1 and BLOCK_M2 > BLOCK_N2: the causal diagonal takes several inner steps
BWD = {"BLOCK_M1": 16, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 16, "num_warps": 4, "num_stages": 2}


def reference(q, k, v, causal, sm_scale=None, do=None):
    """Attention by definition in float64 (torch's own softmax), with autograd gradients when do is given."""
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    scores = qd @ kd.transpose(-1, -2) * sm_scale
    if causal:
        S = q.shape[2]
        scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ vd
    if do is None:
        return out.detach(), torch.logsumexp(scores, dim=-1).detach()
    return torch.autograd.grad(out, (qd, kd, vd), do.double())


def qkv(B, H, S, D, dtype):
    return tuple(torch.randn(B, H, S, D, dtype=dtype) for _ in range(3))


# S=37, 50 and 100 are not multiples of any block size (100 spans two query blocks and
# several key blocks, so the causal off-band loop runs); S=64 takes the unmasked (EVEN_S) path.
CASES = [
    (1, 2, 37, 64, torch.float16),
    (2, 2, 50, 64, torch.bfloat16),
    (1, 2, 100, 64, torch.float16),
    (1, 1, 37, 128, torch.bfloat16),
    (1, 2, 64, 64, torch.float16),
]


def case_id(case) -> str:
    B, H, S, D, dtype = case
    return f"B{B}H{H}S{S}D{D}-{str(dtype).removeprefix('torch.')}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_forward_matches_reference(case, causal):
    B, H, S, D, dtype = case
    q, k, v = qkv(B, H, S, D, dtype)
    o, lse = launch_attention(q, k, v, FWD, causal=causal)
    ref_o, ref_lse = reference(q, k, v, causal)
    assert o.shape == q.shape and o.dtype == dtype
    assert lse.shape == (B, H, S) and lse.dtype == torch.float32
    assert rel_error(o, ref_o) < TOL[dtype]
    assert rel_error(lse, ref_lse) < 1e-4


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", CASES[:4], ids=case_id)
def test_backward_matches_autograd(case, causal):
    B, H, S, D, dtype = case
    q, k, v = qkv(B, H, S, D, dtype)
    do = torch.randn_like(q)
    o, lse = launch_attention(q, k, v, FWD, causal=causal)
    grads = launch_attention_bwd(q, k, v, o, lse, do, BWD, causal=causal)
    assert grads.shape == (3, B, H, S, D) and grads.dtype == dtype
    for name, got, want in zip(("dq", "dk", "dv"), grads, reference(q, k, v, causal, do=do)):
        assert rel_error(got, want) < TOL[dtype], name


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_float32_reference_taken_a_few_heads_at_a_time_is_the_definition(causal, monkeypatch):
    """A long sequence's reference goes over heads in steps (its S x S scores held near a byte
    budget); set the budget to one head and a half, and each step, and so the whole, is still
    softmax(Q K^T) V and its gradients (computed in float32), checked against float64."""
    import importlib

    # the module: the package exports a function of the same name
    attention_module = importlib.import_module("tunesvc.kernels.attention")
    B, H, S, D = 2, 5, 37, 64
    monkeypatch.setattr(attention_module, "_REFERENCE_BYTES", 6 * S * S)
    q, k, v = (t.double() for t in qkv(B, H, S, D, torch.float32))
    do = torch.randn_like(q)
    o, lse = attention_module.reference_attention(q, k, v, causal=causal)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
    assert rel_error(o, want) < 1e-5
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    if causal:
        scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    assert rel_error(lse, torch.logsumexp(scores, -1)) < 1e-5
    got = attention_module.reference_attention(q, k, v, causal=causal, do=do)
    for name, g, w in zip(("dq", "dk", "dv"), got, torch.autograd.grad(want, leaves, do)):
        assert rel_error(g, w) < 1e-5, name


def test_attention_function_gradients_with_strided_inputs():
    # (B, S, H, D) storage viewed as (B, H, S, D), as attention layers produce it; custom scale
    B, H, S, D = 1, 2, 45, 64
    q, k, v = (torch.randn(B, S, H, D, dtype=torch.float16).transpose(1, 2).requires_grad_() for _ in range(3))
    assert not q.is_contiguous()
    out = attention(q, k, v, causal=True, sm_scale=0.3)
    do = torch.randn_like(out)
    out.backward(do)
    ref_out, _ = reference(q, k, v, True, sm_scale=0.3)
    assert rel_error(out, ref_out) < TOL[torch.float16]
    for name, t, want in zip(("dq", "dk", "dv"), (q, k, v), reference(q, k, v, True, sm_scale=0.3, do=do)):
        assert rel_error(t.grad, want) < TOL[torch.float16], name
    # no database: both directions fell back to their own heuristic configs
    assert tunesvc.serving.runtime.default_runtime().stats() == {
        "attention": {"heuristic": 1},
        "attention_bwd": {"heuristic": 1},
    }


@pytest.mark.parametrize(
    ("shapes", "dtypes", "match"),
    [
        (((1, 2, 8, 64), (1, 2, 9, 64), (1, 2, 8, 64)), (torch.float16,) * 3, "one shape"),
        (((2, 8, 64),) * 3, (torch.float16,) * 3, "one shape"),
        (((1, 2, 8, 64),) * 3, (torch.float16, torch.bfloat16, torch.float16), "one dtype"),
    ],
)
def test_attention_rejects_tensor_misuse(shapes, dtypes, match):
    q, k, v = (torch.randn(s, dtype=d) for s, d in zip(shapes, dtypes))
    with pytest.raises(ValueError, match=match):
        attention(q, k, v)


@pytest.mark.parametrize(
    ("D", "dtype", "match"), [(96, torch.float16, "use 64 or 128"), (64, torch.float32, "not supported")]
)
def test_attention_rejects_unsupported_problems(D, dtype, match):
    q, k, v = qkv(1, 1, 8, D, dtype)
    with pytest.raises(tunesvc.TunesvcError, match=match):
        attention(q, k, v)


@pytest.mark.parametrize("template", [TEMPLATE, BWD_TEMPLATE], ids=lambda t: t.name)
def test_heuristic_is_feasible_for_every_problem(template, device):
    for S in (1, 17, 37, 64, 100, 1000, 4096):
        for D in (64, 128):
            for causal in (False, True):
                problem = template.problem(B=2, H=4, S=S, D=D, causal=causal, dtype="bfloat16")
                for dev in (H100, device):
                    config = template.heuristic(problem, dev)
                    assert not template.violations(config, problem, dev), (S, D, causal, dev.name, config)


def test_keys_and_costs():
    problem = TEMPLATE.problem(B=3, H=32, S=1000, D=128, causal=True, dtype="bfloat16")
    # batch and sequence length share configs by power-of-two bucket; causal is a non-digit field
    assert str(TEMPLATE.key(problem)) == "B=4,H=32,S=1024,D=128,causal=True,dtype=bfloat16"
    assert tunesvc.ShapeKey.parse(str(TEMPLATE.key(problem))) == TEMPLATE.key(problem)
    full = TEMPLATE.problem(B=4, H=32, S=4096, D=128, dtype="bfloat16")
    causal = TEMPLATE.problem(B=4, H=32, S=4096, D=128, causal=True, dtype="bfloat16")
    assert TEMPLATE.cost(full).flops == 4 * 4 * 32 * 4096**2 * 128
    assert TEMPLATE.cost(causal).flops == TEMPLATE.cost(full).flops / 2
    assert BWD_TEMPLATE.cost(causal).flops == 2.5 * TEMPLATE.cost(causal).flops
    # Q, K, V read and O written, two bytes each, plus the float32 LSE
    assert TEMPLATE.cost(full).bytes == 4 * (4 * 32 * 4096 * 128) * 2 + 4 * 4 * 32 * 4096


@pytest.mark.parametrize("template", [TEMPLATE, BWD_TEMPLATE], ids=lambda t: t.name)
def test_sweep_then_lookup_through_the_pipeline(template, tmp_db, device):
    problem = template.problem(**template.presets["tiny"][1])
    store = Store(tmp_db)
    try:
        [result] = run_sweep(template, [problem], store, strategy="grid", budget=3, device=device)
    finally:
        store.close()
    assert result.winner is not None and result.failures == 0
    found = Runtime(db=tmp_db).lookup(template, **problem)
    assert found.source == "exact"
    assert found.config == result.winner


def test_bench_rejects_a_wrong_backward(device):
    # the check before timing compares all three gradients: a kernel that drops dK cannot win
    problem = BWD_TEMPLATE.problem(**BWD_TEMPLATE.presets["tiny"][0])
    bench = tunesvc.Bench(BWD_TEMPLATE, problem, device)
    good = bench.measure(BWD)
    assert good.ok, good.message
    broken = BWD_TEMPLATE.launch(bench.inputs, BWD)
    broken[1].zero_()
    assert tunesvc.bench.relative_error(broken, bench.ref) > bench.tolerance


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gpu_forward_and_backward_match_reference(dtype, D, causal):
    # the real compiler, with every config a sweep tries first; S=1000 is ragged for every block
    B, H, S = 2, 4, 1000
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dtype) for _ in range(3))
    do = torch.randn_like(q)
    ref_o, ref_lse = reference(q.cpu(), k.cpu(), v.cpu(), causal)
    ref_grads = reference(q.cpu(), k.cpu(), v.cpu(), causal, do=do.cpu())
    device = tunesvc.current_device()
    problem = TEMPLATE.problem(B=B, H=H, S=S, D=D, causal=causal, dtype=str(dtype))
    # the heuristic and the first feasible warm-start config of each variant (pointers, TMA, TMA + WS)
    configs = {}
    for config in TEMPLATE.warm_start(problem, device):
        if not TEMPLATE.violations(config, problem, device):
            configs.setdefault((config["TMA"], config["WS"]), []).append(config)
    wanted = {
        (0, 0),
        *([(1, 0)] if device.has_tma else []),
        *([(1, 1)] if device.has_tma and device.has_ws and not causal else []),
    }
    assert set(configs) == wanted
    for config in [TEMPLATE.heuristic(problem, device)] + [found[0] for found in configs.values()]:
        o, lse = launch_attention(q, k, v, config, causal=causal)
        assert rel_error(o.cpu(), ref_o) < TOL[dtype], config
        assert rel_error(lse.cpu(), ref_lse) < 1e-4, config
    for config in BWD_TEMPLATE.warm_start(problem, device):
        if BWD_TEMPLATE.violations(config, problem, device):
            continue
        grads = launch_attention_bwd(q, k, v, o, lse, do, config, causal=causal)
        for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
            assert rel_error(got.cpu(), want) < TOL[dtype], (name, config)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_forward_256_query_rows_match_reference(D, causal):
    # the first 256-row config the space admits here per warp count and variant (pointers, TMA,
    # TMA + WS); S=1000 is ragged for every block
    B, H, S, dtype = 2, 4, 1000, torch.bfloat16
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dtype) for _ in range(3))
    ref_o, ref_lse = reference(q.cpu(), k.cpu(), v.cpu(), causal)
    device = tunesvc.current_device()
    problem = TEMPLATE.problem(B=B, H=H, S=S, D=D, causal=causal, dtype=str(dtype))
    configs: dict[tuple[int, int, int], dict] = {}
    for config in TEMPLATE.feasible(problem, device):
        if config["BLOCK_M"] == 256:
            configs.setdefault((config["num_warps"], config["TMA"], config["WS"]), config)
    assert {warps for warps, _, _ in configs} == {8, 16}
    for config in configs.values():
        o, lse = launch_attention(q, k, v, config, causal=causal)
        assert rel_error(o.cpu(), ref_o) < TOL[dtype], config
        assert rel_error(lse.cpu(), ref_lse) < 1e-4, config


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_256_query_rows_matches_reference(causal):
    # 256 query rows over 64-key blocks: the causal diagonal takes four inner steps, and S=300
    # leaves the second query block 44 rows deep and the last key block ragged
    q, k, v = qkv(1, 2, 300, 64, torch.float16)
    o, lse = launch_attention(q, k, v, {"BLOCK_M": 256, "BLOCK_N": 64, "num_warps": 16, "num_stages": 3}, causal=causal)
    ref_o, ref_lse = reference(q, k, v, causal)
    assert rel_error(o, ref_o) < TOL[torch.float16]
    assert rel_error(lse, ref_lse) < 1e-4


def test_space_admits_256_query_rows_only_with_narrow_key_blocks():
    for D in (64, 128):
        problem = TEMPLATE.problem(B=2, H=64, S=3000, D=D, causal=False, dtype="bfloat16")
        tall = [c for c in TEMPLATE.feasible(problem, H100) if c["BLOCK_M"] == 256]
        assert tall and all(c["BLOCK_N"] <= 64 and c["num_warps"] in (8, 16) for c in tall)
        assert all(c["BLOCK_M"] == 256 for c in TEMPLATE.feasible(problem, H100) if c["num_warps"] == 16)
    # four 64-row warpgroups need 256 query rows; the tile may not outgrow a short sequence
    short = TEMPLATE.problem(B=2, H=64, S=100, D=128, causal=False, dtype="bfloat16")
    assert all(c["BLOCK_M"] < 256 for c in TEMPLATE.feasible(short, H100))


# -- the Hopper variants: tensor descriptors (TMA) and the warp-specialised key loop (WS) ------

# (causal, TMA, WS); TMA = WS = 0 is FWD above, and the space never pairs WS with causal
VARIANTS = [(False, 1, 0), (False, 1, 1), (True, 1, 0)]


@pytest.fixture
def descriptor_loads(monkeypatch):
    """Counts the loads the interpreter serves through tensor descriptors: proof the TMA path ran."""
    from triton.runtime.interpreter import InterpreterBuilder

    calls = []
    original = InterpreterBuilder.create_descriptor_load

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(InterpreterBuilder, "create_descriptor_load", counting)
    return calls


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{'causal' if v[0] else 'full'}-TMA{v[1]}-WS{v[2]}")
@pytest.mark.parametrize("case", CASES[:4], ids=case_id)
def test_forward_variants_match_reference(case, variant, descriptor_loads):
    causal, tma, ws = variant
    B, H, S, D, dtype = case
    q, k, v = qkv(B, H, S, D, dtype)
    # BLOCK_N < BLOCK_M: the causal diagonal takes two inner steps; S=100 has a ragged key tail
    o, lse = launch_attention(q, k, v, {**FWD, "TMA": tma, "WS": ws}, causal=causal)
    ref_o, ref_lse = reference(q, k, v, causal)
    assert rel_error(o, ref_o) < TOL[dtype]
    assert rel_error(lse, ref_lse) < 1e-4
    assert descriptor_loads, "the descriptor path did not run"


def test_tma_forward_reads_strided_heads_through_descriptors(descriptor_loads):
    # (B, S, H, D) storage viewed as (B, H, S, D): rows H * D apart, still 16-byte aligned
    B, H, S, D = 2, 3, 45, 64
    q, k, v = (torch.randn(B, S, H, D, dtype=torch.float16).transpose(1, 2) for _ in range(3))
    config = {"BLOCK_M": 64, "BLOCK_N": 64, "TMA": 1, "WS": 1, "num_warps": 4, "num_stages": 3}
    o, lse = launch_attention(q, k, v, config)
    ref_o, ref_lse = reference(q, k, v, False)
    assert o.stride() == q.stride()
    assert rel_error(o, ref_o) < TOL[torch.float16]
    assert rel_error(lse, ref_lse) < 1e-4
    assert descriptor_loads


def test_tma_config_falls_back_to_pointers_on_unaligned_rows(descriptor_loads):
    # rows 66 halves (132 bytes) apart: TMA cannot address them, the pointer kernel runs instead
    B, H, S, D = 1, 2, 37, 64
    q, k, v = (torch.randn(B, H, S, D + 2, dtype=torch.float16)[..., :D] for _ in range(3))
    o, lse = launch_attention(q, k, v, {**FWD, "TMA": 1, "WS": 1}, causal=True)
    ref_o, ref_lse = reference(q, k, v, True)
    assert rel_error(o, ref_o) < TOL[torch.float16]
    assert rel_error(lse, ref_lse) < 1e-4
    assert not descriptor_loads


def test_space_offers_tma_and_ws_only_where_they_run():
    full = TEMPLATE.problem(B=4, H=32, S=4096, D=128, causal=False, dtype="bfloat16")
    causal = TEMPLATE.problem(B=4, H=32, S=4096, D=128, causal=True, dtype="bfloat16")
    variants = {(c["TMA"], c["WS"]) for c in TEMPLATE.feasible(full, H100)}
    assert variants == {(0, 0), (1, 0), (1, 1)}
    assert {(c["TMA"], c["WS"]) for c in TEMPLATE.feasible(causal, H100)} == {(0, 0), (1, 0)}
    a100 = dataclasses.replace(H100, name="NVIDIA A100-SXM4-80GB", capability="8.0")
    assert a100.limits()["has_tma"] == a100.limits()["has_ws"] == 0
    assert {(c["TMA"], c["WS"]) for c in TEMPLATE.feasible(full, a100)} == {(0, 0)}
    # a short sweep measures each variant: the warm start holds a feasible config of each
    warm = [c for c in TEMPLATE.warm_start(full, H100) if not TEMPLATE.violations(c, full, H100)]
    assert {(c["TMA"], c["WS"]) for c in warm[:4]} == variants


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", [CASES[2], CASES[1], CASES[4]], ids=case_id)
def test_backward_tma_matches_autograd(case, causal, descriptor_loads):
    # the walked Q/dO (or K/V) blocks through descriptors; S=100 and 50 end in a partial block,
    # whose rows past S the descriptor reads as zeros
    B, H, S, D, dtype = case
    q, k, v = qkv(B, H, S, D, dtype)
    do = torch.randn_like(q)
    o, lse = launch_attention(q, k, v, FWD, causal=causal)
    assert not descriptor_loads
    grads = launch_attention_bwd(q, k, v, o, lse, do, {**BWD, "TMA": 1}, causal=causal)
    assert descriptor_loads, "the descriptor path did not run"
    for name, got, want in zip(("dq", "dk", "dv"), grads, reference(q, k, v, causal, do=do)):
        assert rel_error(got, want) < TOL[dtype], name


def test_backward_tma_config_falls_back_to_pointers_on_unaligned_rows(descriptor_loads):
    B, H, S, D = 1, 2, 37, 64
    q, k, v = (torch.randn(B, H, S, D + 2, dtype=torch.float16)[..., :D] for _ in range(3))
    do = torch.randn_like(q)
    o, lse = launch_attention(q, k, v, FWD, causal=True)
    grads = launch_attention_bwd(q, k, v, o, lse, do, {**BWD, "TMA": 1}, causal=True)
    for name, got, want in zip(("dq", "dk", "dv"), grads, reference(q, k, v, True, do=do)):
        assert rel_error(got, want) < TOL[torch.float16], name
    assert not descriptor_loads


def test_backward_space_offers_tma_only_where_it_runs():
    problem = BWD_TEMPLATE.problem(B=4, H=32, S=4096, D=128, causal=False, dtype="bfloat16")
    assert {c["TMA"] for c in BWD_TEMPLATE.feasible(problem, H100)} == {0, 1}
    a100 = dataclasses.replace(H100, name="NVIDIA A100-SXM4-80GB", capability="8.0")
    assert {c["TMA"] for c in BWD_TEMPLATE.feasible(problem, a100)} == {0}
