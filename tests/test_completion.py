"""Shell completion of `tune` (kernel names, strategies, presets), and a light `import tunesvc`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import tunesvc
from tunesvc import completion
from tunesvc.cli import app
from tunesvc.search import STRATEGIES
from tunesvc.template import SHIPPED

HEAVY = ("torch", "triton", "sqlalchemy", "optuna", "matplotlib")


def complete(line: str) -> list[str]:
    """What bash completion offers for ``line`` (a trailing space: a new word starts)."""
    words = line.split()
    env = {
        "_TUNE_COMPLETE": "complete_bash",
        "COMP_WORDS": line,
        "COMP_CWORD": str(len(words) - (not line.endswith(" "))),
    }
    result = CliRunner().invoke(app, [], env=env, prog_name="tune")
    assert result.exit_code == 0, result.output
    return result.output.split()


def test_kernel_argument_offers_every_shipped_kernel():
    assert complete("tune sweep ") == list(SHIPPED)
    assert complete("tune space soft") == ["softmax", "softmax_bwd"]
    assert complete("tune lookup rms") == ["rmsnorm", "rmsnorm_bwd"]


def test_kernel_option_offers_kernel_names():
    assert complete("tune show --kernel layer") == ["layernorm", "layernorm_bwd"]


def test_strategy_offers_every_strategy():
    assert complete("tune sweep matmul --strategy ") == list(STRATEGIES)
    assert complete("tune sweep matmul --strategy c") == ["cmaes"]


@pytest.mark.parametrize("name", list(SHIPPED))
def test_preset_names_are_the_templates_presets(name):
    assert completion.preset_names(name) == list(tunesvc.get_template(name).presets)


def test_preset_offers_the_kernels_presets():
    assert complete("tune sweep matmul --preset ") == ["llm", "skinny", "models", "tiny"]
    assert complete("tune sweep decode --shape 1x32x8x2048x128 --preset ") == ["llama3-8b", "models", "tiny"]
    assert complete("tune sweep rmsnorm_bwd --preset t") == ["tiny"]


def test_preset_of_an_unknown_or_unloaded_kernel_offers_nothing():
    assert complete("tune sweep nosuchkernel --preset ") == []
    assert complete("tune sweep my_pkg.module:TEMPLATE --preset ") == []
    assert complete("tune sweep --preset ") == []


def run_python(code: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env or dict(os.environ), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_importing_the_cli_imports_no_heavy_library():
    """`tune --help` and every TAB press import tunesvc.cli: none of these may load with it."""
    code = f"import sys, tunesvc.cli; print([m for m in {HEAVY!r} if m in sys.modules])"
    assert run_python(code).strip() == "[]"


def test_completion_imports_no_heavy_library():
    code = (
        "import sys\n"
        "from tunesvc import completion\n"
        "names = completion.kernel_names(), completion.strategy_names(), completion.preset_names('rmsnorm_bwd')\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    assert run_python(code).strip() == "[]"


def test_public_names_load_on_first_use():
    code = (
        "import json, sys, tunesvc\n"
        "before = [m for m in ('torch', 'tunesvc.bench') if m in sys.modules]\n"
        "from tunesvc import Bench, Template, autotune\n"
        "missing = [n for n in tunesvc.__all__ if getattr(tunesvc, n, None) is None]\n"
        "print(json.dumps([before, missing, sorted(set(tunesvc.__all__) - set(dir(tunesvc))), 'torch' in sys.modules]))\n"
    )
    before, missing, undir, torch_now = json.loads(run_python(code))
    assert before == [] and missing == [] and undir == [] and torch_now


def test_a_bare_import_reaches_subpackages_and_rejects_unknown_names():
    assert callable(tunesvc.kernels.softmax)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tunesvc.nope  # noqa: B018


def test_interpreter_is_chosen_before_triton_without_importing_torch_early():
    """Where a GPU might be present, torch decides, and only when triton is first imported."""
    code = (
        "import os, sys\n"
        "import tunesvc._processes as device\n"
        "os.environ.pop('TRITON_INTERPRET', None)\n"
        "device._may_have_gpu = lambda: True\n"
        "device.use_interpreter_without_gpu()\n"
        "deferred = ['TRITON_INTERPRET' in os.environ, 'torch' in sys.modules]\n"
        "import triton\n"
        "import torch\n"
        "print(deferred, os.environ.get('TRITON_INTERPRET'), torch.cuda.device_count())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    deferred, flag, gpus = run_python(code, env).rsplit(" ", 2)
    assert deferred == "[False, False]"
    assert flag == ("1" if int(gpus) == 0 else "None")
