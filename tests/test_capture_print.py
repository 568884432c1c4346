"""TRITON_PRINT_AUTOTUNING=1 under capture: the line Triton prints per key, tuned or served from the store."""

from __future__ import annotations

import io
import subprocess
import sys
import warnings

import pytest
import torch
import triton
from _capture import interpreter_env
from _capture import scale

import tunesvc

PROGRAM = """
import torch
import triton
import triton.language as tl


@triton.jit
def scale(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask), mask=mask)


kernel = triton.autotune([triton.Config({"BLOCK": b}) for b in (16, 32)], key=["n"])(scale)
x = torch.arange(100, dtype=torch.float32)
out = torch.empty(100)
for _ in range(2):  # the second launch is a hit: nothing printed again
    kernel[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, out, 100, 2.0)
assert torch.equal(out, 2 * x)
print("computed", kernel.best_config)
"""

HEAD = "Triton autotuning for function scale,\nwith key as (100, 'torch.float32', 'torch.float32'),\n"


def _run(tmp_path, db, **extra: str) -> str:
    env = interpreter_env(TUNESVC_CAPTURE="1", TUNESVC_DB=str(db), **extra)
    env.pop("TRITON_PRINT_AUTOTUNING", None)
    env.update(extra)
    done = subprocess.run(
        [sys.executable, "program.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "computed" in done.stdout
    return done.stdout


def test_a_captured_key_prints_tritons_line_when_tuned_and_a_store_line_when_served(tmp_path):
    (tmp_path / "program.py").write_text(PROGRAM)
    db = tmp_path / "tune.db"
    tuned = _run(tmp_path, db, TRITON_PRINT_AUTOTUNING="1")
    best = tuned.split("computed ", 1)[1].strip()  # the config the kernel launched
    assert tuned.count("Triton autotuning for function") == 1, tuned
    assert HEAD + "finished after " in tuned and f"s,\nbest config selected: {best};" in tuned, tuned
    served = _run(tmp_path, db, TRITON_PRINT_AUTOTUNING="1")
    assert served.count("Triton autotuning for function") == 1, served
    assert HEAD + "served from the tunesvc store" in served and f"best config selected: {best};" in served
    assert "finished after" not in served
    untuned = _run(tmp_path, tmp_path / "empty.db", TRITON_PRINT_AUTOTUNING="1", TUNESVC_MODE="lookup")
    assert HEAD + "served untuned (no stored winner; mode lookup)" in untuned, untuned
    for quiet in (_run(tmp_path, db), _run(tmp_path, tmp_path / "other.db", TRITON_PRINT_AUTOTUNING="0")):
        assert "Triton autotuning" not in quiet, quiet


class _Broken(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError("stdout is gone")


@pytest.mark.skipif(not hasattr(getattr(triton, "knobs", None), "autotuning"), reason="no triton.knobs")
def test_a_line_that_cannot_be_printed_never_reaches_the_launch(tmp_db, monkeypatch):
    monkeypatch.setattr(triton.knobs.autotuning, "print", True)
    kernel = tunesvc.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32)], key=["n"], db=tmp_db)(scale)
    x, out = torch.arange(100, dtype=torch.float32), torch.empty(100)
    monkeypatch.setattr(sys, "stdout", _Broken())
    with warnings.catch_warnings(record=True) as with_warnings:
        warnings.simplefilter("always")
        kernel[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, out, 100, 2.0)
    assert torch.equal(out, 2 * x)
    assert not [w for w in with_warnings if "tunesvc" in str(w.message)]  # capture stayed on
    assert tunesvc._capture.stats()["tuned"] >= 1
