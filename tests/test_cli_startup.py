"""`tune kernels`, `tune space` and `tune lookup` start in well under a second on a small machine:
they import neither torch (seconds) nor, where no database is read, SQLAlchemy.

Wall time of a start would be flaky on a shared machine; what a slow start is made of is not:
each command runs in a fresh interpreter, which then lists the heavy modules it imported. The
console script's start is also timed in CPU time, which another process's load hardly changes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[1] / "tune.db.example"
HEAVY = ("torch", "sqlalchemy", "optuna", "matplotlib", "sklearn")


def _imported_by(args: list[str], cwd: Path) -> tuple[list[str], str]:
    """The heavy modules that `tune ARGS` imports in a fresh interpreter, and what it printed."""
    code = (
        "import json, runpy, sys\n"
        f"sys.argv = ['tune', *{args!r}]\n"
        "try:\n    runpy.run_module('tunesvc', run_name='__main__')\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stderr.strip().splitlines()[-1]), result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["kernels"],
        ["kernels", "--json"],
        ["space", "matmul"],
        ["space", "attention", "--shape", "1x2x37x64"],
        ["lookup", "matmul", "--shape", "90x70x50"],
        ["lookup", "rms_norm", "--shape", "100x4096", "--json"],
    ],
)
def test_commands_without_a_database_import_neither_torch_nor_sqlalchemy(args, tmp_path):
    heavy, out = _imported_by(args, tmp_path)  # tmp_path: no ./tune.db to read
    assert heavy == []
    assert out.strip()


def test_a_lookup_in_a_database_imports_sqlalchemy_but_not_torch(tmp_path):
    args = ["lookup", "matmul", "--shape", "3000x3000x777", "--dtype", "bfloat16", "--db", str(EXAMPLE)]
    heavy, out = _imported_by([*args, "--device", "NVIDIA H200"], tmp_path)
    assert heavy == ["sqlalchemy"]
    assert "nearest for NVIDIA H200" in out


@pytest.mark.parametrize(
    "args", [["kernels"], ["space", "matmul", "--shape", "90x70x50"], ["lookup", "matmul", "--shape", "90x70x50"]]
)
def test_the_console_script_starts_in_well_under_a_second_of_cpu(args, tmp_path):
    """The `tune` script pip writes (``from tunesvc.cli import main``, not ``python -m``) runs these
    in under a second of CPU time, the best of three fresh interpreters, and imports nothing heavy.

    CPU time (user + system of the child), not wall time: another process on a loaded 2-core
    machine stretches the wall clock of a start, not the work the start does.
    """
    import resource

    code = (
        "import json, sys\n"
        f"sys.argv = ['tune', *{args!r}]\n"
        "from tunesvc.cli import main\n"
        "try:\n    main()\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)\n"
    )
    seconds = []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stderr.strip().splitlines()[-1]) == []
        seconds.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    assert min(seconds) < 1.0, f"`tune {' '.join(args)}` took {min(seconds):.2f} s of CPU at best"
