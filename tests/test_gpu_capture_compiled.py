"""A triton.autotune kernel inside torch.compile (Inductor) under capture, on a GPU: with a stored
winner the generated code holds that one config and Inductor benchmarks nothing; with none,
Inductor tunes every listed config as it does without capture, and the miss is recorded."""

from __future__ import annotations

import ast
import re

import pytest
import torch
import triton
import triton.language as tl

import tunesvc
from tunesvc._capture import STATS
from tunesvc._capture import summary_line
from tunesvc._capture import summary_record
from tunesvc.store import Store

pytestmark = pytest.mark.gpu

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (256, 1024) for w in (4, 8)]


@triton.jit
def _scale(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask), mask=mask)


scale = triton.autotune(configs=CONFIGS, key=["n"])(_scale)


def program(x):
    out = torch.empty_like(x)
    n = x.numel()
    scale[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n, 3.0)
    return out + 1


@pytest.fixture
def inductor_benchmarks(monkeypatch):
    """The user kernels whose configs Inductor's autotuner benchmarks (its CachingAutotuner, counted
    as it runs; Inductor's own generated kernels, named triton_*, such as the fused ``+ 1``, are
    left out); every compile from scratch (no FX graph or autotuning cache of an earlier run)."""
    from torch._inductor.runtime import triton_heuristics

    benchmarked: list[str] = []
    original = triton_heuristics.CachingAutotuner.benchmark_all_configs

    def counted(self, *args, **kwargs):
        name = getattr(self.fn, "__name__", "?")
        if not name.startswith("triton_"):
            benchmarked.append(name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(triton_heuristics.CachingAutotuner, "benchmark_all_configs", counted)
    torch._dynamo.reset()
    STATS.clear()
    with torch._inductor.config.patch(force_disable_caches=True):
        yield benchmarked
    tunesvc.uncapture()
    torch._dynamo.reset()


def compiled_run(x):
    """The compiled program's output and the configs of each user kernel in Inductor's code."""
    from torch._inductor.utils import run_and_get_code

    out, codes = run_and_get_code(torch.compile(program, fullgraph=True), x)
    listed = [
        ast.literal_eval(found)
        for code in codes
        for found in re.findall(r"user_autotune\(\s*configs=(\[.*?\]),\s*inductor_meta=", code, re.S)
    ]
    return out, [[(c["BLOCK"], c["num_warps"]) for c in configs] for configs in listed]


def test_a_stored_winner_is_the_one_config_inductor_compiles_and_it_benchmarks_nothing(tmp_db, inductor_benchmarks):
    x = torch.randn(100_003, device="cuda")
    with tunesvc.capture(db=tmp_db):
        program(x)  # eager: tuned and stored
        assert STATS["tuned"] == 1
        winner = scale.best_config
        STATS.clear()
        out, generated = compiled_run(x)
    torch.testing.assert_close(out, 3.0 * x + 1)
    assert generated == [[(winner.kwargs["BLOCK"], winner.num_warps)]]
    assert inductor_benchmarks == []
    assert dict(STATS) == {"compiled_stored": 1}
    assert "keys inside torch.compile: 1 served from the store" in summary_line([summary_record()])


def test_a_miss_is_tuned_by_inductor_over_every_config_and_recorded(tmp_db, inductor_benchmarks):
    x = torch.randn(70_001, device="cuda")
    with tunesvc.capture(db=tmp_db):
        out, generated = compiled_run(x)
    torch.testing.assert_close(out, 3.0 * x + 1)
    assert generated == [[(c.kwargs["BLOCK"], c.num_warps) for c in CONFIGS]]
    assert len(inductor_benchmarks) == 1  # Inductor's own tuning, as without capture
    assert dict(STATS) == {"compiled_missed": 1}  # the compiled code never calls Autotuner.run
    store = Store(tmp_db, readonly=True)
    try:
        [miss] = store.misses()
    finally:
        store.close()
    assert miss.shape_key == "n=70001,x_ptr.dtype=float32,out_ptr.dtype=float32"
    assert miss.call["grids"] == [[triton.cdiv(70_001, c.kwargs["BLOCK"])] for c in CONFIGS]
    assert "1 tuned by Inductor (no stored winner" in summary_line([summary_record()])
