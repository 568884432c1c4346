"""Runtime modes (lookup / heuristic / tune on miss), one-time warnings and counters."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import warnings

import pytest
import torch
import triton
import triton.language as tl
from _capture import next_line
from _capture import said_at

import tunesvc
from tunesvc.kernels import softmax
from tunesvc.serving.runtime import Runtime
from tunesvc.store import Store
from tunesvc.tuning.sweep import run_sweep

SHAPE = {"M": 24, "N": 40, "K": 36, "dtype": "float16"}


@pytest.fixture
def tuned_db(tmp_db, template, device):
    run_sweep(template, [template.problem(**SHAPE)], Store(tmp_db), budget=2, device=device)
    return tmp_db


def _count(db, sql):
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


def test_heuristic_mode_ignores_winners_and_does_not_warn(tuned_db, template, device):
    runtime = Runtime(db=tuned_db, mode="heuristic")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = runtime.lookup("matmul", **SHAPE)
    assert [str(w.message) for w in said] == []
    assert result.source == "heuristic"
    assert result.config == template.heuristic(template.problem(**SHAPE), device)
    assert Runtime(db=tuned_db).lookup("matmul", **SHAPE).source == "exact"


def test_fallback_warns_once_per_kernel_and_counts_every_lookup(tuned_db):
    runtime = Runtime(db=tuned_db)
    with pytest.warns(RuntimeWarning, match="using the heuristic one") as caught:
        runtime.lookup("matmul", M=8, N=8, K=8, dtype="bfloat16")
        runtime.lookup("matmul", M=9, N=9, K=9, dtype="bfloat16")
    assert len([w for w in caught if "heuristic one" in str(w.message)]) == 1
    runtime.lookup("matmul", **SHAPE)
    assert runtime.stats() == {"matmul": {"exact": 1, "heuristic": 2}}


@triton.jit
def _double(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, 2 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def test_a_miss_is_said_at_the_line_that_called_in(tmp_db):
    """Each miss's warning names this file and the line of the call, past tunesvc's frames and
    Triton's (a tunesvc.autotune launch) or torch's autograd (a shipped kernel)."""
    Store(tmp_db).close()
    tunesvc.configure(db=tmp_db)
    kernel = tunesvc.autotune([{"BLOCK": 16}, {"BLOCK": 32}], key=["n"], name="double_miss", db=tmp_db)(_double)
    x = torch.ones(40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        launch = next_line()
        kernel[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, 40)
    assert said_at(caught) == {(__file__, launch)} and torch.equal(x, torch.full((40,), 2.0))
    a = torch.randn(5, 37, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call = next_line()
        softmax(a).sum().backward()
    assert said_at(caught) == {(__file__, call)} and a.grad is not None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call = next_line()
        assert tunesvc.lookup("matmul", M=8, N=8, K=8, dtype="bfloat16").source == "heuristic"
    assert said_at(caught) == {(__file__, call)}


def test_unknown_mode_is_one_clear_error():
    from tunesvc import TunesvcError

    with pytest.raises(TunesvcError, match="Unknown runtime mode 'fast'"):
        Runtime(mode="fast")


def test_tune_on_miss_tunes_persists_and_is_used_afterwards(tmp_db):
    runtime = Runtime(db=tmp_db, mode="tune", budget=2)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")  # tuning on a miss is the point of the mode: no warning
        first = runtime.lookup("matmul", **SHAPE)
    assert [str(w.message) for w in said] == []
    assert first.source == "tuned"
    assert _count(tmp_db, "select count(*) from tunesvc_trials") == 2
    assert _count(tmp_db, "select count(*) from tunesvc_winners") == 1
    # a fresh process-wide view of the same database now finds it tuned
    again = Runtime(db=tmp_db).lookup("matmul", **SHAPE)
    assert again.source == "exact" and again.config == first.config
    assert runtime.lookup("matmul", **SHAPE) == first  # this process keeps its answer
    assert runtime.stats() == {"matmul": {"tuned": 1}}


def test_concurrent_misses_from_several_processes_tune_the_key_once(tmp_path):
    db = str(tmp_path / "shared.db")
    code = (
        "import sys, tunesvc\n"
        "r = tunesvc.Runtime(db=sys.argv[1], mode='tune', budget=3)\n"
        "print(r.lookup('matmul', M=24, N=40, K=36).source)\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, db], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-1500:] for _, err in outputs]
    assert sorted(out.strip() for out, _ in outputs) == ["tuned"] * 3, [err[-1500:] for _, err in outputs]
    assert _count(db, "select count(*) from tunesvc_sweeps") == 1  # one process tuned, the others waited
    assert _count(db, "select count(*) from tunesvc_trials") == 3
    assert _count(db, "select count(*) from tunesvc_winners") == 1


def test_a_miss_in_mode_tune_goes_to_the_registered_policy(tmp_db, template, device):
    """The runtime hands a miss to the policy the tuning side registered (tunesvc.serving.on_miss)
    and serves what it returns; a key the policy could not tune gets the heuristic config."""
    from tunesvc.serving import on_miss

    tuned = template.heuristic(template.problem(**SHAPE), device)
    seen = []

    def policy(miss):
        seen.append(miss)
        return {miss.key: tuned} if miss.problem["M"] == SHAPE["M"] else {}

    previous = on_miss.register(policy)
    try:
        runtime = Runtime(db=tmp_db, mode="tune", budget=5, device=device)
        first = runtime.lookup("matmul", **SHAPE)
        other = runtime.lookup("matmul", **{**SHAPE, "M": 7})
    finally:
        on_miss.register(previous)
    assert (first.source, first.config) == ("tuned", tuned)
    assert other.source == "heuristic"
    assert [(m.db, m.template.name, m.budget, m.strategy) for m in seen] == [(tmp_db, "matmul", 5, "grid")] * 2
    assert previous is not None and on_miss.policy() is previous  # the tuning side's, back again
