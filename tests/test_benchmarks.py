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
