"""Correctness of the GEMM kernels (kernels/matmul.py, every VARIANT) in Triton's interpreter."""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys

import pytest
import torch

import tunesvc
import tunesvc.kernels
from tunesvc import Space
from tunesvc import TunesvcError
from tunesvc import config_hash
from tunesvc.bench import relative_error
from tunesvc.kernels.matmul import TEMPLATE
from tunesvc.kernels.matmul import VARIANTS
from tunesvc.kernels.matmul import launch_matmul
from tunesvc.serving.runtime import Runtime
from tunesvc.store import Store
from tunesvc.tuning.sweep import run_sweep

# the module, not the function of the same name that tunesvc.kernels exports
matmul_module = importlib.import_module("tunesvc.kernels.matmul")

TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 1e-4}

# none of these is a multiple of any block size in CONFIGS
SHAPES = [(37, 45, 29), (1, 33, 17), (70, 19, 65)]

CONFIGS = [
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 8, "num_stages": 2},
]


def rel_error(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    ref = a.double() @ b.double()
    return relative_error(out, ref)


def config_id(c: dict) -> str:
    return f"BM{c['BLOCK_M']}-BN{c['BLOCK_N']}-BK{c['BLOCK_K']}-G{c['GROUP_M']}"


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_launch_matmul_matches_float64_reference(shape, dtype, config):
    M, N, K = shape
    a = torch.randn(M, K, dtype=dtype)
    b = torch.randn(K, N, dtype=dtype)
    out = launch_matmul(a, b, config)
    assert out.shape == (M, N)
    assert out.dtype == dtype
    assert rel_error(out, a, b) < TOL[dtype]


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_every_config_writes_every_output_element(config):
    # several tile-rows and tile-columns, ragged on every edge, so GROUP_M ordering matters
    M, N, K = 70, 75, 45
    a = torch.randn(M, K, dtype=torch.float32)
    b = torch.randn(K, N, dtype=torch.float32)
    out = torch.full((M, N), float("nan"), dtype=torch.float32)
    returned = launch_matmul(a, b, config, out=out)
    assert returned.data_ptr() == out.data_ptr()
    assert not torch.isnan(out).any(), f"{int(torch.isnan(out).sum())} output elements were never written"
    assert rel_error(out, a, b) < TOL[torch.float32]


def test_store_is_masked_to_the_output():
    # the output is a window into a larger NaN buffer: writes past M or N would land in it
    M, N, K = 37, 45, 29
    buf = torch.full((M + 16, N + 40), float("nan"), dtype=torch.float32)
    out = buf[:M, :N]
    a = torch.randn(M, K, dtype=torch.float32)
    b = torch.randn(K, N, dtype=torch.float32)
    launch_matmul(a, b, CONFIGS[1], out=out)
    assert not torch.isnan(out).any()
    assert torch.isnan(buf[M:, :]).all() and torch.isnan(buf[:, N:]).all()
    assert rel_error(out, a, b) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_non_contiguous_inputs(dtype):
    M, N, K = 37, 45, 29
    a = torch.randn(M, K, dtype=dtype)
    b = torch.randn(N, K, dtype=dtype).t()  # (K, N) with strides (1, K)
    assert not b.is_contiguous()
    out = launch_matmul(a, b, CONFIGS[0])
    assert rel_error(out, a, b) < TOL[dtype]
    a_t = torch.randn(K, M, dtype=dtype).t()  # transposed A as well
    out = tunesvc.kernels.matmul(a_t, b, config=CONFIGS[1])
    assert rel_error(out, a_t, b) < TOL[dtype]


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
def test_matmul_entry_point_without_tuning(dtype):
    # no database anywhere: the runtime falls back to the heuristic config
    a = torch.randn(37, 29, dtype=dtype)
    b = torch.randn(29, 45, dtype=dtype)
    out = tunesvc.kernels.matmul(a, b)
    assert out.shape == (37, 45) and out.dtype == dtype
    assert rel_error(out, a, b) < TOL[dtype]


def test_matmul_explicit_config_is_used():
    a = torch.randn(1, 17, dtype=torch.float16)
    b = torch.randn(17, 33, dtype=torch.float16)
    out = tunesvc.kernels.matmul(a, b, config=CONFIGS[2])
    assert rel_error(out, a, b) < TOL[torch.float16]
    # an explicit config never touches the runtime
    assert tunesvc.serving.runtime._default is None


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((4, 5), (6, 7)), ((4, 5), (5,)), ((2, 4, 5), (5, 3))],
)
def test_matmul_rejects_mismatched_shapes(a_shape, b_shape):
    a = torch.randn(*a_shape, dtype=torch.float16)
    b = torch.randn(*b_shape, dtype=torch.float16)
    with pytest.raises(ValueError, match="matmul needs A"):
        tunesvc.kernels.matmul(a, b)


def test_matmul_rejects_mixed_dtypes():
    a = torch.randn(4, 5, dtype=torch.float16)
    b = torch.randn(5, 3, dtype=torch.float32)
    with pytest.raises(ValueError, match="one dtype"):
        tunesvc.kernels.matmul(a, b)


def test_kernels_work_when_current_device_is_called_first(tmp_path):
    """Kernels run in the interpreter where tunesvc.current_device() imported triton before
    tunesvc.kernels (triton.language's own @jit helpers, tl.cdiv and the like, must be the
    interpreter's too, or every launch fails with "Cannot call @triton.jit'd outside of the
    scope of a kernel")."""
    code = (
        "import tunesvc\n"
        "device = tunesvc.current_device()\n"
        "t = tunesvc.get_template('matmul')\n"
        "p = t.problem(M=16, N=32, K=32)\n"
        "m = tunesvc.Bench(t, p, device).measure(t.heuristic(p, device))\n"
        "print(m.status.value, m.message)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[0] == "ok", proc.stdout


# -- variants: persistent, TMA (tensor descriptors), split-K, split tail -----------------------
def variant(name: str, block_m=16, block_n=32, block_k=32, group=8, split=1, warps=4, stages=3, loop=(0, 0)) -> dict:
    """A full config of the space; ``loop``: the TMA kernel's (FLATTEN, SUBTILE)."""
    return {
        "VARIANT": name,
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_K": block_k,
        "GROUP_M": group,
        "SPLIT_K": split,
        **dict(zip(("FLATTEN", "SUBTILE"), loop)),
        "num_warps": warps,
        "num_stages": stages,
    }


# split-K with 4 slices of K=77 in 32-steps: 3 K steps, so the last slice is empty; the split
# tail's slices need more K steps than these shapes have (its slices: tests further below)
VARIANT_CONFIGS = [
    variant("grouped"),
    variant("persistent"),
    variant("tma"),
    variant("splitk", group=1, split=4),
    variant("splittail"),
    # the TMA kernel's loop options (FLATTEN, SUBTILE)
    variant("tma", block_n=64, loop=(1, 1)),
    variant("tma", loop=(1, 0)),
    variant("tma", block_n=64, loop=(0, 1)),
]


def config_id(c: dict) -> str:
    loop = "".join(f"-{k.lower()}" for k in ("FLATTEN", "SUBTILE") if c.get(k))
    split = f"-{c['SPLIT_K']}" if c["SPLIT_K"] > 1 else ""
    return f"{c['VARIANT']}{split}{loop}"


# odd M and N; K=77 rows are not 16-byte aligned in any dtype, K=40 rows are in fp16/bf16;
# K=64 is whole BLOCK_K steps (the kernels' unmasked EVEN_K loop); M > 64 with K=77 and N=45:
# the pointer kernels load copies of A and B, B's with 3 padding columns
VARIANT_SHAPES = [(37, 45, 77), (50, 70, 40), (21, 37, 64), (70, 45, 77)]


def test_every_variant_is_tested():
    assert {c["VARIANT"] for c in VARIANT_CONFIGS} == set(VARIANTS)
    assert set(TEMPLATE.space.parameters["VARIANT"].choices) == set(VARIANTS)


@pytest.mark.parametrize("config", VARIANT_CONFIGS, ids=config_id)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("shape", VARIANT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_variant_matches_float64_reference(shape, dtype, config):
    M, N, K = shape
    a = torch.randn(M, K, dtype=dtype)
    b = torch.randn(K, N, dtype=dtype)
    out = launch_matmul(a, b, config)
    assert out.shape == (M, N) and out.dtype == dtype
    assert rel_error(out, a, b) < TOL[dtype]


@pytest.mark.parametrize("config", VARIANT_CONFIGS, ids=config_id)
def test_variant_writes_every_element_and_nothing_outside(config):
    # more tiles (3 x 3) than the interpreter's persistent programs, ragged on every edge,
    # into a window of a NaN buffer (not 16-byte aligned rows: the TMA kernel stores by pointer)
    M, N, K = 37, 75, 45
    buf = torch.full((M + 16, N + 3), float("nan"), dtype=torch.float32)
    out = buf[:M, :N]
    a = torch.randn(M, K, dtype=torch.float32)
    b = torch.randn(K, N, dtype=torch.float32)
    assert launch_matmul(a, b, config, out=out).data_ptr() == out.data_ptr()
    assert not torch.isnan(out).any(), f"{int(torch.isnan(out).sum())} output elements were never written"
    assert torch.isnan(buf[M:, :]).all() and torch.isnan(buf[:, N:]).all()
    assert rel_error(out, a, b) < TOL[torch.float32]


@pytest.mark.parametrize("config", VARIANT_CONFIGS, ids=config_id)
@pytest.mark.parametrize("shape", [(37, 45, 77), (37, 24, 40), (70, 45, 77)], ids=lambda s: "x".join(map(str, s)))
def test_variant_on_transposed_inputs(config, shape):
    # B is (K, N) with strides (1, K): no unit stride along rows, so TMA must stage a copy; the
    # pointer kernels load K=40 columns (80 bytes apart) as they are, and K=77 ones (154 bytes)
    # too below M = 512, masking K in every step (and A is used as it is)
    M, N, K = shape
    a = torch.randn(K, M, dtype=torch.float16).t()
    b = torch.randn(N, K, dtype=torch.float16).t()
    out = launch_matmul(a, b, config)
    assert rel_error(out, a, b) < TOL[torch.float16]


def test_pointer_kernels_get_operands_they_load_as_pipelined_vectors():
    bf16 = {"dtype": torch.bfloat16}
    ops = matmul_module._pointer_operands
    a = torch.randn(100, 48, **bf16)
    wt = torch.randn(40, 48, **bf16).t()  # a transposed weight (x @ w.t()): K contiguous, columns 48 apart
    a1, b1, nb, tail_only = ops(a, wt)
    assert a1 is a and b1 is wt and nb == 40 and tail_only
    # B (K, N) row-major with N=40: its columns wrap modulo 40, so it is copied into rows of 48,
    # which its columns then wrap modulo
    b = torch.randn(48, 40, **bf16)
    a2, b2, nb, tail_only = ops(a, b)
    assert a2 is a and b2.stride() == (48, 1) and nb == 48 and torch.equal(b2, b) and tail_only
    # ... except for M <= 64, where the GEMM streams B once: no copy at all (B's would triple
    # its traffic, A's would cost more in launches than its loads), and K is masked in every step
    top = a[:64]
    a3, b3, nb, tail_only = ops(top, b)
    assert a3 is top and b3 is b and nb == 40 and not tail_only
    # a transposed weight with K=77 (columns 154 bytes apart) is copied from M = 512 only; below,
    # K is masked in every step, and A (rows 77 apart) is not copied either: it would not help
    w77 = torch.randn(40, 77, **bf16).t()
    a77 = torch.randn(511, 77, **bf16)
    a5, b5, nb, tail_only = ops(a77, w77)
    assert a5 is a77 and b5 is w77 and nb == 40 and not tail_only
    _, b4, nb, tail_only = ops(torch.randn(512, 77, **bf16), w77)
    assert b4.stride() == (48, 1) and nb == 48 and torch.equal(b4, w77) and tail_only
    # A with rows 77 apart, 1032 apart (8 * 129: 16-byte aligned, yet not what Triton specialises on),
    # or starting one element in: a row-major copy whose rows are a multiple of 16 elements
    for t in (
        torch.randn(100, 77, **bf16),
        torch.randn(100, 1032, **bf16)[:, :1024],
        torch.randn(100, 64, **bf16)[:, 1:],
    ):
        assert not matmul_module._loadable(t, 0)
        copy, _, _, tail_only = ops(t, torch.randn(t.shape[1], 48, **bf16))
        assert copy.data_ptr() % 16 == 0 and copy.stride(1) == 1 and copy.stride(0) % 16 == 0
        assert torch.equal(copy, t) and tail_only
        assert ops(t[:64], torch.randn(t.shape[1], 48, **bf16))[0].data_ptr() == t.data_ptr()
    # A column-major is loaded along M, which wraps: M must be a multiple of 16 too
    assert matmul_module._loadable(torch.randn(48, 32, **bf16).t(), 0)
    assert not matmul_module._loadable(torch.randn(48, 37, **bf16).t(), 0)


@pytest.mark.parametrize("config", VARIANT_CONFIGS, ids=config_id)
def test_k_shorter_than_one_block(config):
    # the unmasked loop takes no step: the masked last step is all of K (split-K: three slices are empty)
    M, N, K = 21, 37, 20
    a = torch.randn(M, K, dtype=torch.float32)
    b = torch.randn(K, N, dtype=torch.float32)
    assert rel_error(launch_matmul(a, b, config), a, b) < TOL[torch.float32]


@pytest.mark.parametrize("split", [2, 3, 4, 8])
def test_split_k_is_deterministic_and_matches(split):
    M, N, K = 20, 33, 300
    a = torch.randn(M, K, dtype=torch.bfloat16)
    b = torch.randn(K, N, dtype=torch.bfloat16)
    config = variant("splitk", block_k=32, group=1, split=split)
    first = launch_matmul(a, b, config)
    assert rel_error(first, a, b) < TOL[torch.bfloat16]
    assert torch.equal(launch_matmul(a, b, config), first)


def test_split_k_leaves_its_counters_zeroed_for_the_next_call():
    # the counters are zeroed once and reused: a launch that did not reset them would leave
    # the next launch's tiles without a last arrival, and its C unwritten (NaN here)
    M, N, K = 37, 70, 200
    config = variant("splitk", block_k=32, group=1, split=3)
    for _ in range(3):
        a = torch.randn(M, K, dtype=torch.float32)
        b = torch.randn(K, N, dtype=torch.float32)
        out = torch.full((M, N), float("nan"))
        launch_matmul(a, b, config, out=out)
        assert rel_error(out, a, b) < TOL[torch.float32]
        counters = matmul_module._arrivals(a.device, 1)
        assert not counters.any(), f"{int(counters.count_nonzero())} counters left non-zero"
    # a config with another SPLIT_K reuses the same counters
    launch_matmul(a, b, variant("splitk", block_k=32, group=1, split=2), out=out)
    assert rel_error(out, a, b) < TOL[torch.float32]


# (whole tiles, slices) of 3 x 3 tiles and 5 K steps: all tiles sliced, in 2, 3 and 8 slices (the
# last three empty); 2 whole tiles and 4 slices of the other 7; 4 and 2
@pytest.mark.parametrize("split", [(0, 2), (0, 3), (0, 8), (2, 4), (4, 2)], ids=str)
def test_split_tail_matches_writes_every_element_and_is_deterministic(monkeypatch, split):
    monkeypatch.setattr(matmul_module, "tail_split", lambda tiles, k_steps, block_k, sms: split)
    M, N, K = 37, 75, 77
    config = variant("splittail", block_k=16)
    for _ in range(2):  # fresh inputs: the counters the first call used must be zeroed again
        a = torch.randn(M, K, dtype=torch.float32)
        b = torch.randn(K, N, dtype=torch.float32)
        buf = torch.full((M + 16, N + 3), float("nan"))
        out = buf[:M, :N]
        launch_matmul(a, b, config, out=out)
        assert not torch.isnan(out).any(), f"{int(torch.isnan(out).sum())} output elements were never written"
        assert torch.isnan(buf[M:, :]).all() and torch.isnan(buf[:, N:]).all()
        assert rel_error(out, a, b) < TOL[torch.float32]
        assert torch.equal(launch_matmul(a, b, config), out)
        counters = matmul_module._arrivals(a.device, 1)
        assert not counters.any(), f"{int(counters.count_nonzero())} counters left non-zero"


def test_split_tail_slices_only_a_partial_last_wave_worth_slicing():
    split = matmul_module.tail_split
    # 192 tiles on 132 SMs: the second wave's 60 tiles in two slices end with the first's half
    assert split(192, 64, 64, 132) == (132, 2)
    # whole waves: nothing to even out
    assert split(264, 64, 64, 132) == (264, 1)
    # a quarter of a wave saved is less than what four 14-step slices' float32 tiles cost
    assert split(1152, 56, 64, 132) == (1152, 1)
    # 16 K steps: slices too short to pay for their float32 tiles
    assert split(84, 16, 64, 132) == (84, 1)
    # fewer tiles than SMs (a skinny GEMM of long K): split-K on TMA loads
    whole, slices = split(32, 448, 64, 132)
    assert whole == 0 and slices > 1
    for tiles in range(1, 700, 7):
        for k_steps in (3, 40, 433):
            whole, slices = split(tiles, k_steps, 64, 132)
            assert 1 <= slices <= 8 and (tiles - whole) * slices <= max(3 * 132, tiles)
            assert whole == tiles if slices == 1 else whole % 132 == 0 and whole < tiles


def test_config_without_variant_launches_the_grouped_kernel(monkeypatch):
    # winners stored before VARIANT existed (tune.db.example) have no VARIANT or SPLIT_K
    old = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 5}
    launched = []
    real = matmul_module._matmul_kernel

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid)
            return real[grid]

    monkeypatch.setattr(matmul_module, "_matmul_kernel", Spy())
    a = torch.randn(16, 45, dtype=torch.float16)
    b = torch.randn(45, 37, dtype=torch.float16)
    out = launch_matmul(a, b, old)
    assert launched == [(1,)]
    assert rel_error(out, a, b) < TOL[torch.float16]
    # and the space checks it as grouped with SPLIT_K = 1
    assert TEMPLATE.space.with_defaults(old)["VARIANT"] == "grouped"
    problem = TEMPLATE.problem(M=16, N=37, K=45)
    assert TEMPLATE.violations(old, problem, tunesvc.current_device()) == []


def test_unknown_variant_is_one_clear_error():
    a = torch.randn(4, 5, dtype=torch.float16)
    b = torch.randn(5, 3, dtype=torch.float16)
    with pytest.raises(TunesvcError, match="VARIANT='stream'.*use one of grouped, persistent, tma, splitk, splittail"):
        launch_matmul(a, b, variant("stream"))


# -- the space: variants pruned per problem and device -------------------------------------------
def h100_like(device, **changes):
    hopper = {"kind": "cuda", "capability": "9.0", "sm_count": 132, "max_shared_memory": 232448, "max_num_regs": 65536}
    return dataclasses.replace(device, **{**hopper, **changes})


def test_device_has_tma_only_on_hopper(device):
    assert h100_like(device).limits()["has_tma"] == 1
    assert h100_like(device, capability="8.0").limits()["has_tma"] == 0
    ampere = h100_like(device, capability="8.0")
    problem = TEMPLATE.problem(M=4096, N=4096, K=4096, dtype="bfloat16")
    variants = {c["VARIANT"] for c in TEMPLATE.feasible(problem, ampere)}
    assert variants == {"grouped", "persistent"}
    assert {"tma", "splittail"} <= {c["VARIANT"] for c in TEMPLATE.feasible(problem, h100_like(device))}


def test_split_tail_only_where_the_tiles_leave_a_partial_wave(device):
    h100 = h100_like(device)
    problem = TEMPLATE.problem(M=1000, N=6144, K=4096, dtype="bfloat16")
    tails = [c for c in TEMPLATE.feasible(problem, h100) if c["VARIANT"] == "splittail"]
    assert tails
    for c in tails:
        tiles = -(-1000 // c["BLOCK_M"]) * -(-6144 // c["BLOCK_N"])
        assert tiles % 132
    # 128 x 256 tiles of 4224 x 4096: 33 x 16 = 528 tiles, four whole waves
    whole = TEMPLATE.problem(M=4224, N=4096, K=4096, dtype="bfloat16")
    assert variant("splittail", 128, 256, 64, warps=8) in [
        c for c in TEMPLATE.feasible(problem, h100) if c["VARIANT"] == "splittail"
    ]
    assert TEMPLATE.violations(variant("splittail", 128, 256, 64, warps=8), whole, h100) == ["splittail_use"]


def test_tma_kernels_count_the_staged_c_tile_in_shared_memory(device):
    h100 = h100_like(device)
    problem = TEMPLATE.problem(M=4096, N=4096, K=4096, dtype="bfloat16")
    # A and B: (128 + 256) * 64 * 2 bytes * 4 stages = 196,608 fit 232,448; with C's 65,536 they do not
    for name in ("tma", "splittail"):
        assert TEMPLATE.violations(variant(name, 128, 256, 64, warps=8, stages=4), problem, h100) == [
            "tma_shared_memory"
        ]
        assert TEMPLATE.violations(variant(name, 128, 256, 64, warps=8, stages=3), problem, h100) == []
    # the pointer kernels store C from registers: the same tiles stay in their space
    for name in ("grouped", "persistent"):
        assert TEMPLATE.violations(variant(name, 128, 256, 64, warps=8, stages=4), problem, h100) == []
    feasible = TEMPLATE.feasible(problem, h100)
    for c in feasible:
        if c["VARIANT"] in ("tma", "splittail"):
            # with SUBTILE the C tile is staged in two halves, one at a time
            c_tile = c["BLOCK_M"] * c["BLOCK_N"] // (1 + c["SUBTILE"])
            staged = (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * c["num_stages"] + c_tile
            assert staged * 2 <= 232448, c


def test_split_k_only_for_skinny_problems(device):
    h100 = h100_like(device)
    skinny = TEMPLATE.feasible(TEMPLATE.problem(M=16, N=4096, K=4096, dtype="bfloat16"), h100)
    split = [c for c in skinny if c["VARIANT"] == "splitk"]
    assert split and all(c["SPLIT_K"] > 1 and c["GROUP_M"] == 1 for c in split)
    assert all(c["SPLIT_K"] == 1 for c in skinny if c["VARIANT"] != "splitk")
    # 4096 x 4096 fills 132 SMs with tiles already; K=96 has too few K steps to split
    for m, n, k in ((4096, 4096, 4096), (16, 4096, 96)):
        feasible = TEMPLATE.feasible(TEMPLATE.problem(M=m, N=n, K=k, dtype="bfloat16"), h100)
        assert "splitk" not in {c["VARIANT"] for c in feasible}


def test_split_k_offers_three_slices_where_powers_of_two_miss_a_wave(device):
    # 36 tiles of 128x128 on 132 SMs: 2 or 4 slices run 72 or 144 programs (half a wave, or one
    # wave and 12 programs), 3 slices 108
    problem = TEMPLATE.problem(M=300, N=1536, K=7168, dtype="bfloat16")
    h100 = h100_like(device)
    feasible = TEMPLATE.feasible(problem, h100)
    three = [c for c in feasible if c["VARIANT"] == "splitk" and c["SPLIT_K"] == 3]
    assert any(c["BLOCK_M"] == 128 and c["BLOCK_N"] == 128 for c in three)
    assert max(TEMPLATE.wave_fill(c, problem, h100) for c in three if c["BLOCK_M"] * c["BLOCK_N"] == 128 * 128) > 0.8


@pytest.mark.parametrize("shape", [(37, 45, 777), (70, 130, 300), (5, 33, 100)], ids=lambda s: "x".join(map(str, s)))
def test_split_k_in_three_slices_matches_on_sizes_that_are_not_multiples_of_the_blocks(shape):
    # the slices are cdiv(cdiv(K, BLOCK_K), 3) steps: the last one short, or empty where K is small
    M, N, K = shape
    a = torch.randn(M, K, dtype=torch.bfloat16)
    b = torch.randn(K, N, dtype=torch.bfloat16)
    config = variant("splitk", block_k=32, group=1, split=3)
    first = launch_matmul(a, b, config)
    assert rel_error(first, a, b) < TOL[torch.bfloat16]
    assert torch.equal(launch_matmul(a, b, config), first)


def test_heuristic_splits_k_for_small_m(device):
    h100 = h100_like(device)
    for m in (1, 16, 64):
        problem = TEMPLATE.problem(M=m, N=4096, K=4096, dtype="bfloat16")
        config = TEMPLATE.heuristic(problem, h100)
        assert config["VARIANT"] == "splitk" and config["SPLIT_K"] > 1, config
        assert TEMPLATE.violations(config, problem, h100) == []
    big = TEMPLATE.problem(M=4096, N=4096, K=4096, dtype="bfloat16")
    assert TEMPLATE.heuristic(big, h100)["VARIANT"] == "grouped"


def test_heuristic_is_feasible_everywhere(device):
    # (1, 1, 1) falls back to the smallest feasible config; the others are the rules' own picks
    for dev in (device, h100_like(device)):
        for dtype in ("bfloat16", "float32"):
            for m, n, k in ((1, 1, 1), (37, 45, 29), (64, 4096, 4096), (1000, 3000, 777), (16, 14336, 4096)):
                problem = TEMPLATE.problem(M=m, N=n, K=k, dtype=dtype)
                config = TEMPLATE.heuristic(problem, dev)
                assert TEMPLATE.violations(config, problem, dev) == [], (dev.capability, m, n, k, config)
                TEMPLATE.space.validate(config)


def test_known_good_configs_are_in_the_space_and_cover_every_variant():
    for config in TEMPLATE.known_good:
        TEMPLATE.space.validate(config)
    assert {c["VARIANT"] for c in TEMPLATE.known_good} == set(VARIANTS)
    assert len({config_hash(c) for c in TEMPLATE.known_good}) == len(TEMPLATE.known_good)


def test_string_choices_and_constraints(tmp_path, device):
    path = tmp_path / "s.toml"
    path.write_text('[params]\nV = ["a", "b"]\nX = [1, 2]\n[constraints]\nonly_b_splits = "V == \'b\' or X == 1"\n')
    space = Space.from_toml(path)
    assert space.parameters["V"].choices == ("a", "b")
    assert space.feasible({}, {}) == [{"V": "a", "X": 1}, {"V": "b", "X": 1}, {"V": "b", "X": 2}]
    assert space.violations({"X": 2}, {}, {}) == ["only_b_splits"]  # V defaults to its first choice
    assert config_hash({"V": "a", "X": 1}) != config_hash({"V": "b", "X": 1})
    path.write_text('[params]\nV = ["a", "b"]\n[constraints]\ntypo = "V != \'B\'"\n')
    with pytest.raises(TunesvcError, match="compares V with 'B', which is not one of its choices"):
        Space.from_toml(path)
    path.write_text('[params]\nV = ["a", 1]\n')
    with pytest.raises(TunesvcError, match="integers only, or non-empty strings only"):
        Space.from_toml(path)


def test_sweep_over_variants_stores_a_winner_the_runtime_launches(tmp_db, device):
    # one candidate per variant that fits a one-tile problem, through the real pipeline
    # (persistent needs more tiles than the interpreter's "SMs", its CPU cores: tested above)
    problem = TEMPLATE.problem(M=9, N=30, K=150, dtype="bfloat16")
    candidates = [variant("grouped", group=1), variant("tma", block_k=64, group=1), variant("splitk", group=1, split=2)]
    candidates = [c for c in candidates if not TEMPLATE.violations(c, problem, device)]
    assert {c["VARIANT"] for c in candidates} >= {"grouped", "tma"}
    store = Store(tmp_db)
    try:
        [result] = run_sweep(
            TEMPLATE, [problem], store, strategy="grid", budget=len(candidates), device=device, candidates=candidates
        )
    finally:
        store.close()
    assert result.failures == 0 and result.trials_new == len(candidates)
    assert result.winner in candidates
    found = Runtime(db=tmp_db).lookup(TEMPLATE, **problem)
    assert found.source == "exact" and found.config == result.winner
    a = torch.randn(9, 150, dtype=torch.bfloat16)
    b = torch.randn(150, 30, dtype=torch.bfloat16)
    assert rel_error(tunesvc.kernels.matmul(a, b, config=found.config), a, b) < TOL[torch.bfloat16]
