"""Real libraries' triton.autotune kernels (fla-core, liger-kernel, FlagGems) under capture on a
GPU: outputs against float64 torch, every key tuned once with every trial ok, and a second
process that measures nothing and launches the same configs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from _capture import captured_name
from _capture import trial_total
from _capture import trials_by_kernel
from _library_kernels import CASES
from _library_kernels import CONFIGS
from _library_kernels import run

import tunesvc
from tunesvc._capture import STATS

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).with_name("_library_kernels.py")

#: the second process turns capture on itself: a --target install (as on the GPU machine) has
#: no site-packages, so the interpreter-start hook behind TUNESVC_CAPTURE=1 is not installed there
SECOND = (
    "import runpy, sys, tunesvc; tunesvc.capture(); sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def test_library_kernels_under_capture_on_the_gpu(tmp_db):
    cases = list(CASES)
    with tunesvc.capture(db=tmp_db):
        first = [run(case) for case in cases]
    for result in first:
        assert result["rel_error"] <= 1e-5, result
    listed: Counter[str] = Counter()
    for case, result in zip(cases, first):
        listed[result["kernel"]] += CONFIGS[case]
    stored = trials_by_kernel(tmp_db)
    # every listed config measured once per key; one that does not fit this GPU is stored as
    # invalid or compile_error, never as a wrong result
    assert {kernel: sum(statuses.values()) for kernel, statuses in stored.items()} == listed
    assert all(statuses["ok"] and not statuses["wrong_result"] for statuses in stored.values()), stored

    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNESVC_")} | {"TUNESVC_DB": tmp_db}
    child = subprocess.run(
        [sys.executable, "-c", SECOND, str(SCRIPT), *cases], env=env, capture_output=True, text=True, timeout=600
    )
    assert child.returncode == 0, child.stderr[-3000:]
    second = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    assert [r["case"] for r in second] == cases
    for result in second:
        assert result["rel_error"] <= 1e-5, result
    assert [r["config"] for r in second] == [r["config"] for r in first]
    assert trials_by_kernel(tmp_db) == stored  # nothing measured in the second process


FLAGGEMS = """
import json, sys
import torch
import tunesvc
tunesvc.capture()
from flag_gems.ops.mm import mm

torch.manual_seed(int(sys.argv[1]))
a = torch.randn(301, 203, device="cuda", dtype=torch.float16)
b = torch.randn(203, 171, device="cuda", dtype=torch.float16)
out = mm(a, b).double()
ref = a.double() @ b.double()
print(json.dumps({"rel_error": ((out - ref).norm() / ref.norm()).item(), "stats": tunesvc.capture_stats()}))
"""


def _flag_gems_twice(script: str, tmp_db: str, tmp_path: Path) -> tuple[dict, dict]:
    """What ``script`` prints last, run in two processes one after the other on ``tmp_db``."""
    pytest.importorskip("flag_gems")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNESVC_")} | {
        "TUNESVC_DB": tmp_db,
        "HOME": str(tmp_path),  # FlagGems' own config database goes under the home folder
    }
    results = []
    for seed in (1, 2):
        child = subprocess.run(
            [sys.executable, "-c", script, str(seed)], env=env, capture_output=True, text=True, timeout=600
        )
        assert child.returncode == 0, child.stderr[-3000:]
        results.append(json.loads(child.stdout.strip().splitlines()[-1]))
    return results[0], results[1]


def test_flag_gems_libtuner_kernels_are_captured(tmp_db, tmp_path):
    """FlagGems' kernels run under its LibTuner (an Autotuner subclass with its own run and its
    own database): captured, tuned once into tunesvc's store, read back by a second process."""
    first, second = _flag_gems_twice(FLAGGEMS, tmp_db, tmp_path)
    assert first["rel_error"] < 1e-2 and second["rel_error"] < 1e-2, (first, second)
    assert first["stats"].get("tuned", 0) >= 1, first
    assert second["stats"].get("stored", 0) >= 1 and "tuned" not in second["stats"], second
    assert any(k.startswith("flag_gems.") for k in trials_by_kernel(tmp_db)), trials_by_kernel(tmp_db)


GEMS_ENABLED = """
import json, sys
import torch
import tunesvc
tunesvc.capture()
import flag_gems

torch.manual_seed(int(sys.argv[1]))
x = torch.randn(301, 1027, device="cuda", dtype=torch.float16)
w = torch.randn(1027, 333, device="cuda", dtype=torch.float16)
bias = torch.randn(333, device="cuda", dtype=torch.float16)
g = torch.randn(1027, device="cuda", dtype=torch.float16)
# 16-byte aligned rows: FlagGems' host-TMA GEMM on Hopper (configs with pre-hooks, descriptors)
xa = torch.randn(231, 448, device="cuda", dtype=torch.bfloat16)
wa = torch.randn(448, 1344, device="cuda", dtype=torch.bfloat16)
f64 = lambda t: t.double()
refs = {
    "mm": f64(x) @ f64(w),
    "mm_aligned": f64(xa) @ f64(wa),
    "addmm": torch.addmm(f64(bias), f64(x), f64(w)),
    "softmax": torch.softmax(f64(x), -1),
    "layer_norm": torch.nn.functional.layer_norm(f64(x), (1027,), f64(g)),
    "sum": f64(x).sum(-1),
}
with flag_gems.use_gems():
    outs = {
        "mm": torch.mm(x, w),
        "mm_aligned": xa @ wa,
        "addmm": torch.addmm(bias, x, w),
        "softmax": torch.softmax(x, -1),
        "layer_norm": torch.nn.functional.layer_norm(x, (1027,), g),
        "sum": x.sum(-1),
    }
errors = {k: ((outs[k].double() - ref).norm() / ref.norm()).item() for k, ref in refs.items()}
print(json.dumps({"errors": errors, "stats": tunesvc.capture_stats()}))
"""


def test_flag_gems_replacing_torch_ops_under_capture(tmp_db, tmp_path):
    """With FlagGems' kernels under torch's own ops (use_gems), tunesvc's checks and timing call
    them too (its norm refuses float64), and its Hopper GEMM takes host-side tensor descriptors
    and reads its tuner's nargs after the cache lookup: the kernels are tuned, checked and read
    back by a second process."""
    first, second = _flag_gems_twice(GEMS_ENABLED, tmp_db, tmp_path)
    for result in (first, second):
        assert all(err < 1e-2 for err in result["errors"].values()), result
    assert first["stats"].get("tuned", 0) >= 1, first
    assert second["stats"].get("stored", 0) >= 1 and "tuned" not in second["stats"], second
    stored = trials_by_kernel(tmp_db)
    assert any(k.startswith("flag_gems.") for k in stored), stored
    assert not any(statuses["wrong_result"] for statuses in stored.values()), stored


@triton.jit
def _graph_scale(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask), mask=mask)


def test_a_first_launch_inside_cuda_graph_capture_measures_nothing_replays_and_is_tuned_outside(tmp_db):
    """triton.autotune benchmarks a new key inside the capture, which invalidates it
    (cudaErrorStreamCaptureInvalidated); captured, the graph holds the first config and the key
    is tuned at its next launch outside a graph."""
    configs = [triton.Config({"BLOCK": b}, num_warps=w) for b in (256, 1024) for w in (4, 8)]
    kernel = triton.autotune(configs=configs, key=["n"])(_graph_scale)
    n = 1 << 20
    x = torch.randn(n, device="cuda")
    out = torch.zeros_like(x)

    def launch():
        kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n, 3.0)

    with tunesvc.capture(db=tmp_db):
        STATS.clear()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch()
        assert STATS["in_graph"] == 1 and STATS["benchmarks"] == 0 and STATS["tuned"] == 0
        assert kernel.best_config is configs[0] and not kernel.cache
        x.copy_(torch.randn(n, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, 3.0 * x)
        assert trial_total(tmp_db) == 0

        out.zero_()
        launch()  # the next launch outside a graph tunes the key
        torch.cuda.synchronize()
        torch.testing.assert_close(out, 3.0 * x)
        assert STATS["tuned"] == 1 and STATS["benchmarks"] >= len(configs)
        assert trials_by_kernel(tmp_db)[captured_name(kernel)]["ok"] == len(configs)

        out.zero_()
        graph.replay()  # the graph keeps the config it was captured with, and still replays
        torch.cuda.synchronize()
        torch.testing.assert_close(out, 3.0 * x)
