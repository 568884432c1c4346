"""With the project's source folder on sys.path (``PYTHONPATH=$PWD``), its top-level ``kernels/``
folder is importable as ``kernels``, the name of an unrelated package that transformers probes
for: transformers' model imports still work, and under that name the folder imports nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: what a program using transformers does first: import a model class, build a small model, run it
MODEL = """
import sys
from transformers import PreTrainedModel, LlamaConfig, LlamaForCausalLM
from transformers.utils import import_utils
import torch

config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=2, vocab_size=101)
model = LlamaForCausalLM(config)
assert isinstance(model, PreTrainedModel)
logits = model(torch.tensor([[1, 2, 3]])).logits
assert logits.shape == (1, 3, 101), logits.shape
assert not import_utils.is_kernels_available()
shadow = sys.modules.get("kernels")
print("shadow", None if shadow is None else sorted(n for n in vars(shadow) if not n.startswith("__")))
print("ok")
"""


def _on_the_source_path(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_transformers_model_imports_work_with_the_source_tree_on_the_path():
    pytest.importorskip("transformers")
    done = _on_the_source_path(MODEL)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "ok"
    # transformers imported the source folder as `kernels` to probe it: it found it empty
    assert lines[-2] in ("shadow None", "shadow ['annotations']"), lines


def test_the_source_folder_imported_as_kernels_imports_nothing_and_tunesvc_kernels_is_whole():
    code = (
        "import sys, kernels\n"
        "assert kernels.__file__.endswith('kernels/__init__.py'), kernels.__file__\n"
        "assert not hasattr(kernels, 'matmul') and 'torch' not in sys.modules and 'triton' not in sys.modules\n"
        "import tunesvc.kernels as shipped\n"
        "assert shipped is not kernels and callable(shipped.matmul) and 'softmax' in shipped.__all__\n"
        "print('ok')\n"
    )
    done = _on_the_source_path(code)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-4000:]
