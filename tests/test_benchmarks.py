"""The benchmark scripts import: a GPU call spent on a script that fails at its imports (a helper
moved out of benchmarks/_common.py, a module moved inside tunesvc) is a call lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py"))

#: each script imported in one process (torch and Triton load once), its failure kept by name
IMPORT_EACH = """
import importlib, json, sys, traceback
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException:
        failed[name] = traceback.format_exc(limit=-3)
print(json.dumps(failed))
"""


def test_each_benchmark_script_imports():
    assert {"_common", "matmul", "gemm_heldout", "attention", "decode", "norms", "launch_cost"} <= set(SCRIPTS)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH, *SCRIPTS],
        cwd=BENCHMARKS,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    failed = json.loads(done.stdout.splitlines()[-1])
    assert not failed, "\n".join(f"{name}:\n{trace}" for name, trace in failed.items())


#: the three ways benchmarks/runtime_overhead.py and benchmarks/matmul.py launch the grouped matmul
#: kernel themselves (fixed config, @tunesvc.autotune from a bundle, triton.autotune), run on a
#: GEMM whose sizes are no multiple of the blocks: each relative error printed, in that order
LAUNCHERS = """
import json, tempfile, torch, triton
from pathlib import Path
import matmul, runtime_overhead as ro
from tunesvc.device import current_device
a, b = torch.randn(50, 40, dtype=torch.float16), torch.randn(40, 70, dtype=torch.float16)
ref = a.float() @ b.float()
error = lambda c: float((c.float() - ref).norm() / ref.norm())
with tempfile.TemporaryDirectory() as folder:
    path = Path(folder) / "decorated.json"
    direct, decorated, tuner = ro.kernel_launchers(ro.GROUPED, path)
    ro.synthetic_bundle(path, current_device(), 0, kernel="matmul_decorated", version=tuner.template.version,
                        extra={"M=64,N=70,K=40,dtype=float16": ro.GROUPED})
    errors = [error(direct(a, b)), error(decorated(a, b))]
matmul.TUTORIAL[:] = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=2, num_warps=4)]
errors.append(error(matmul.autotuned_matmul()[0](a, b)))
print(json.dumps(errors))
"""


def test_the_benchmarks_own_launches_of_the_matmul_kernel_match_its_signature():
    """The host-cost benchmarks launch the kernel with its own arguments, not through tunesvc:
    a new argument of the kernel (B's width NB) must reach them, checked on the interpreter."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHERS], cwd=BENCHMARKS, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.splitlines()[-1])
    assert len(errors) == 3 and all(e < 1e-2 for e in errors), errors
