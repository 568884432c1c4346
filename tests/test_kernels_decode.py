"""Correctness of split-KV decode attention (kernels/decode.py) in Triton's interpreter."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import tunesvc
import tunesvc.kernels
from tunesvc.bench import relative_error as rel_error
from tunesvc.errors import TunesvcError
from tunesvc.kernels.decode import TEMPLATE
from tunesvc.kernels.decode import launch_decode
from tunesvc.serving.runtime import Runtime
from tunesvc.store import Store
from tunesvc.tuning.sweep import run_sweep

TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 1e-2}

# (B, HQ, HKV, S, D, page size or 0): GQA ratios 4 and 1; S not a multiple of any BLOCK_N
CASES = [
    (3, 4, 1, 37, 64, 0),
    (3, 2, 2, 70, 64, 0),
    (3, 8, 2, 70, 32, 16),
]

CONFIGS = [
    {"BLOCK_N": 16, "NUM_SPLITS": 1, "num_warps": 4, "num_stages": 2},
    # 4 splits of 32-token chunks: a 37-token sequence leaves the last two splits empty
    {"BLOCK_N": 32, "NUM_SPLITS": 4, "num_warps": 4, "num_stages": 2},
]


def make_case(B, HQ, HKV, S, D, page, dtype, *, lengths=None):
    """Random q and cache; lengths S, 1 and one in between unless given; a shuffled block table."""
    q = torch.randn(B, HQ, D, dtype=dtype)
    seq_lens = torch.tensor(lengths or [S, 1, S // 2 + 3][:B], dtype=torch.int32)
    if page:
        pages = math.ceil(S / page)
        k = torch.randn(B * pages, page, HKV, D, dtype=dtype)
        v = torch.randn(B * pages, page, HKV, D, dtype=dtype)
        block_table = torch.randperm(B * pages).to(torch.int32).view(B, pages)
    else:
        k = torch.randn(B, S, HKV, D, dtype=dtype)
        v = torch.randn(B, S, HKV, D, dtype=dtype)
        block_table = None
    return q, k, v, seq_lens, block_table


def sdpa_reference(q, k, v, seq_lens, block_table=None, sm_scale=None):
    """Sequence by sequence through torch's SDPA in float64, KV heads repeated for GQA."""
    if block_table is not None:
        k = k[block_table.long()].flatten(1, 2)
        v = v[block_table.long()].flatten(1, 2)
    group = q.shape[1] // k.shape[2]
    outs = []
    for b, n in enumerate(seq_lens.tolist()):
        kb = k[b, :n].double().transpose(0, 1).repeat_interleave(group, 0)  # (HQ, n, D)
        vb = v[b, :n].double().transpose(0, 1).repeat_interleave(group, 0)
        outs.append(F.scaled_dot_product_attention(q[b, :, None].double(), kb, vb, scale=sm_scale)[:, 0])
    return torch.stack(outs)


def case_id(case):
    B, HQ, HKV, S, D, page = case
    return f"B{B}-HQ{HQ}-HKV{HKV}-S{S}-D{D}" + (f"-page{page}" if page else "")


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"N{c['BLOCK_N']}-splits{c['NUM_SPLITS']}")
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_launch_decode_matches_sdpa(case, dtype, config):
    inputs = make_case(*case, dtype)
    out = launch_decode(*inputs, config)
    assert out.shape == inputs[0].shape and out.dtype == dtype
    assert rel_error(out, sdpa_reference(*inputs)) < TOL[dtype]


def test_splits_agree_with_one_split_in_float32():
    # same answer however the sequence is cut, down to float32 rounding
    inputs = make_case(3, 4, 1, 70, 32, 0, torch.float32, lengths=[70, 5, 41])
    one = launch_decode(*inputs, CONFIGS[0])
    for splits in (2, 4):
        many = launch_decode(*inputs, {**CONFIGS[0], "NUM_SPLITS": splits})
        assert rel_error(many, one) < 1e-5
    assert rel_error(one, sdpa_reference(*inputs)) < 1e-2


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"splits{c['NUM_SPLITS']}")
def test_store_is_masked_to_the_output(config):
    # out is a window into a NaN buffer with more heads: no write may land outside it, every
    # element inside it must be written (both the direct and the combine store paths)
    q, k, v, seq_lens, _ = make_case(3, 4, 1, 37, 32, 0, torch.float32)
    buf = torch.full((3, 7, 32), float("nan"))
    out = buf[:, 2:6]
    returned = launch_decode(q, k, v, seq_lens, None, config, out=out)
    assert returned.data_ptr() == out.data_ptr()
    assert not torch.isnan(out).any()
    assert torch.isnan(buf[:, :2]).all() and torch.isnan(buf[:, 6:]).all()
    assert rel_error(out, sdpa_reference(q, k, v, seq_lens)) < TOL[torch.float32]


def test_strided_query_and_head_major_cache():
    B, HQ, HKV, S, D = 3, 4, 2, 37, 32
    q = torch.randn(HQ, B, D, dtype=torch.float16).transpose(0, 1)  # (B, HQ, D), batch stride D
    k = torch.randn(B, HKV, S, D, dtype=torch.float16).transpose(1, 2)  # (B, S, HKV, D), head-major storage
    v = torch.randn(B, HKV, S, D, dtype=torch.float16).transpose(1, 2)
    assert not (q.is_contiguous() or k.is_contiguous())
    seq_lens = torch.tensor([12, S, 30], dtype=torch.int32)
    out = launch_decode(q, k, v, seq_lens, None, CONFIGS[1])
    assert rel_error(out, sdpa_reference(q, k, v, seq_lens)) < TOL[torch.float16]


def test_template_reference_matches_sdpa_paged():
    problem = TEMPLATE.problem(B=3, HQ=4, HKV=2, S=37, D=32, paged=True, dtype="float32")
    inputs = TEMPLATE.make_inputs(problem, tunesvc.current_device())
    assert rel_error(TEMPLATE.reference(inputs), sdpa_reference(*inputs)) < 1e-6


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_decode_attention_without_tuning(paged):
    # no database anywhere: the runtime falls back to the heuristic config; a custom scale
    q, k, v, seq_lens, block_table = make_case(3, 8, 2, 70, 32, 16 if paged else 0, torch.bfloat16)
    with pytest.warns(RuntimeWarning, match="using the heuristic one"):
        out = tunesvc.kernels.decode_attention(q, k, v, seq_lens, block_table=block_table, sm_scale=1.0)
    ref = sdpa_reference(q, k, v, seq_lens, block_table, sm_scale=1.0)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert rel_error(out, ref) < TOL[torch.bfloat16]
    # a scale that was ignored (default 1/sqrt(32) = 0.18) gives a clearly different answer: the
    # smallest difference over 60 random draws was 0.71 (with scale 0.3 it came as low as 0.197)
    assert rel_error(out, sdpa_reference(q, k, v, seq_lens, block_table)) > 10 * TOL[torch.bfloat16]


def test_decode_attention_explicit_config_is_used():
    q, k, v, seq_lens, _ = make_case(3, 4, 1, 37, 32, 0, torch.float16)
    out = tunesvc.kernels.decode_attention(q, k, v, seq_lens, config=CONFIGS[1])
    assert rel_error(out, sdpa_reference(q, k, v, seq_lens)) < TOL[torch.float16]
    assert tunesvc.serving.runtime._default is None  # an explicit config never touches the runtime


def _bad_inputs():
    q = torch.randn(2, 4, 32, dtype=torch.float16)
    k = torch.randn(2, 10, 2, 32, dtype=torch.float16)
    lens = torch.tensor([10, 3], dtype=torch.int32)
    pages = torch.randn(6, 16, 2, 32, dtype=torch.float16)
    return [
        ("q 2-d", (q[0], k, k, lens), {}, "needs q"),
        ("caches differ", (q, k, k[:, :5], lens), {}, "needs q"),
        ("head dim", (q, k[..., :16], k[..., :16], lens), {}, "head dim"),
        ("groups", (torch.randn(2, 3, 32, dtype=torch.float16), k, k, lens), {}, "multiple"),
        ("dtype", (q, k.float(), k.float(), lens), {}, "one dtype"),
        ("float lens", (q, k, k, lens.float()), {}, "seq_lens"),
        ("lens shape", (q, k, k, lens[:1]), {}, "seq_lens"),
        ("batch", (q, k[:1], k[:1], lens), {}, "contiguous cache"),
        ("table dtype", (q, pages, pages, lens), {"block_table": torch.zeros(2, 3)}, "block_table"),
        ("table batch", (q, pages, pages, lens), {"block_table": torch.zeros(3, 2, dtype=torch.int32)}, "block_table"),
        ("device", (q, k, k, lens.to("meta")), {}, "one device"),
    ]


@pytest.mark.parametrize(("args", "kwargs", "match"), [c[1:] for c in _bad_inputs()], ids=[c[0] for c in _bad_inputs()])
def test_decode_attention_rejects_misuse(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        tunesvc.kernels.decode_attention(*args, **kwargs)


@pytest.mark.parametrize(
    ("dims", "match"),
    [({"HQ": 6, "HKV": 4}, "multiple of HKV"), ({"D": 48}, "power of two"), ({"D": 512}, "power of two")],
)
def test_problem_rejects_impossible_shapes(dims, match):
    with pytest.raises(TunesvcError, match=match):
        TEMPLATE.problem(**{"B": 2, "HQ": 8, "HKV": 2, "S": 100, "D": 64, **dims})


def test_key_buckets_batch_and_context_and_renders_paged_as_text():
    problem = TEMPLATE.problem(B=3, HQ=32, HKV=8, S=3000, D=128, paged=True, dtype="bfloat16")
    key = TEMPLATE.key(problem)
    assert str(key) == "B=4,HQ=32,HKV=8,S=4096,D=128,dtype=bfloat16,paged=True"
    assert tunesvc.ShapeKey.parse(str(key)) == key
    assert TEMPLATE.key(TEMPLATE.problem(B=4, HQ=32, HKV=8, S=4096, D=128, paged=True, dtype="bfloat16")) == key
    assert TEMPLATE.key({**problem, "paged": False}) != key


@pytest.mark.parametrize("paged", [False, True])
def test_make_inputs_draw_lengths_up_to_the_context(paged):
    problem = TEMPLATE.problem(B=6, HQ=4, HKV=2, S=37, D=32, paged=paged)
    q, k, v, seq_lens, block_table = TEMPLATE.make_inputs(problem, tunesvc.current_device())
    assert q.shape == (6, 4, 32) and seq_lens.shape == (6,)
    assert seq_lens.min() >= 1 and seq_lens.max() == 37
    assert (seq_lens == 37).sum() >= 5  # all full but one: tuned on the context the key names
    assert q.abs().sum() > 0 and k.abs().sum() > 0 and v.abs().sum() > 0
    if paged:
        assert k.shape == (6 * 3, 16, 2, 32) and block_table.shape == (6, 3)
        assert sorted(block_table.flatten().tolist()) == list(range(18))
    else:
        assert k.shape == (6, 37, 2, 32) and block_table is None


def test_cost_counts_flops_and_the_kv_bytes():
    problem = TEMPLATE.problem(B=1, HQ=32, HKV=8, S=2048, D=128, dtype="bfloat16")
    cost = TEMPLATE.cost(problem)
    assert cost.flops == 4 * 32 * 128 * 2048
    assert cost.bytes == (2 * 8 * 128 * 2048 + 2 * 32 * 128) * 2


H100 = dataclasses.replace(
    tunesvc.current_device(),
    kind="cuda",
    name="NVIDIA H100 80GB HBM3",
    capability="9.0",
    sm_count=132,
    max_shared_memory=232448,
    max_num_regs=65536,
)


@pytest.mark.parametrize("device", [pytest.param(None, id="interpreter"), pytest.param(H100, id="h100")])
def test_heuristic_is_feasible_everywhere(device):
    device = device or tunesvc.current_device()
    problems = [TEMPLATE.problem(**{"dtype": "bfloat16", **p}) for ps in TEMPLATE.presets.values() for p in ps]
    problems += [
        TEMPLATE.problem(B=b, HQ=hq, HKV=hkv, S=s, D=d, paged=paged, dtype=dtype)
        for b in (1, 3, 64)
        for hq, hkv in ((4, 1), (8, 8))
        for s in (1, 37, 4096)
        for d, dtype in ((16, "float16"), (128, "bfloat16"), (256, "float32"))
        for paged in (False, True)
    ]
    for problem in problems:
        config = TEMPLATE.heuristic(problem, device)
        assert not TEMPLATE.violations(config, problem, device), (problem, config)
        TEMPLATE.space.validate(config)


def test_heuristic_splits_small_batches_on_the_h100():
    def splits(b, s):
        return TEMPLATE.heuristic(TEMPLATE.problem(B=b, HQ=32, HKV=8, S=s, D=128, dtype="bfloat16"), H100)["NUM_SPLITS"]

    assert splits(1, 2048) >= 16  # 8 (sequence, kv head) pairs alone would leave 124 SMs idle
    assert splits(64, 4096) == 1  # 512 pairs fill the GPU already


@pytest.mark.parametrize("preset", TEMPLATE.presets["tiny"], ids=["contiguous", "paged"])
def test_sweep_stores_a_winner_that_the_runtime_returns(tmp_db, device, preset):
    problem = TEMPLATE.problem(**preset)
    store = Store(tmp_db)
    try:
        [result] = run_sweep(TEMPLATE, [problem], store, strategy="grid", budget=3, device=device)
    finally:
        store.close()
    assert result.trials_new == 3 and result.failures == 0
    found = Runtime(db=tmp_db, device=device).lookup(TEMPLATE, **preset)
    assert found.source == "exact" and found.key == result.shape_key
    assert found.config == result.winner
