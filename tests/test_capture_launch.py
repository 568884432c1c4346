"""Capture wherever a program launches: inside CUDA-graph capture (the check injected, so that it
runs under the interpreter), under error filters for warnings, across a fork in the middle of a
tuning, with a kernel's helpers edited, and with a user's own error left in Triton's words."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
import warnings

import pytest
import torch
import triton
import triton.language as tl
from _capture import interpreter_env
from _forks import exit_status_within

import tunesvc
from tunesvc._capture import STATS
from tunesvc.store import Store

MISS = importlib.import_module("tunesvc._capture.miss")
CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)]


@triton.jit
def _scale_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, alpha * x + y, mask=mask)


@triton.jit
def _atomic_sum(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_add(total_ptr, tl.sum(x, axis=0))


def grid(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


def _count(db: str, table: str) -> int:
    import sqlite3

    con = sqlite3.connect(db)
    try:
        return con.execute(f"select count(*) from {table}").fetchone()[0]
    finally:
        con.close()


@pytest.fixture(autouse=True)
def _fresh_stats():
    STATS.clear()
    yield
    tunesvc.uncapture()


# -- 1. never tuning inside CUDA-graph capture ------------------------------------------------------
def test_a_key_met_inside_graph_capture_is_served_untuned_then_tuned_at_its_next_launch_outside(tmp_db, monkeypatch):
    n = 1000
    x, y = torch.randn(n), torch.randn(n)
    kernel = tunesvc.autotune(configs=CONFIGS, key=["n"], db=tmp_db)(_scale_add)
    monkeypatch.setattr(MISS, "_in_graph_capture", lambda: True)  # as under torch.cuda.graph
    out = torch.empty(n)
    kernel[grid(n)](x, y, out, n, 0.5)
    torch.testing.assert_close(out, 0.5 * x + y)
    # no stored winner and no nearer answer: the first config the pruning keeps, nothing measured
    assert kernel.best_config is CONFIGS[0]
    assert STATS["benchmarks"] == 0 and STATS["tuned"] == 0 and STATS["in_graph"] == 1
    assert not kernel.cache  # not remembered; recorded as a miss, for `tune misses --tune` too
    assert _count(tmp_db, "tunesvc_trials") == 0 and _count(tmp_db, "tunesvc_misses") == 1
    kernel[grid(n)](x, y, out, n, 0.5)  # a second capture of it: still nothing measured
    assert STATS["benchmarks"] == 0 and STATS["in_graph"] == 2

    monkeypatch.setattr(MISS, "_in_graph_capture", lambda: False)  # the next launch outside a graph
    kernel[grid(n)](x, y, out, n, 2.0)
    torch.testing.assert_close(out, 2.0 * x + y)
    assert STATS["tuned"] == 1 and STATS["benchmarks"] == len(CONFIGS)
    assert _count(tmp_db, "tunesvc_trials") == len(CONFIGS)
    winner = kernel.best_config

    # a fresh kernel meeting that key inside a capture launches the stored winner, measuring nothing
    STATS.clear()
    again = tunesvc.autotune(configs=CONFIGS, key=["n"], db=tmp_db)(_scale_add)
    monkeypatch.setattr(MISS, "_in_graph_capture", lambda: True)
    again[grid(n)](x, y, out, n, 1.0)
    torch.testing.assert_close(out, x + y)
    assert again.best_config is winner and STATS["benchmarks"] == 0 and STATS["in_graph"] == 1


def test_inside_graph_capture_a_nearer_key_answers_the_miss_is_recorded_and_nothing_is_zeroed(tmp_db, monkeypatch):
    x = torch.randn(800)
    tuned = tunesvc.autotune(configs=CONFIGS, key=["n"], db=tmp_db, reset_to_zero=["total_ptr"])(_atomic_sum)
    total = torch.zeros(1)
    tuned[grid(800)](x, total, 800)
    torch.testing.assert_close(total, x.sum().reshape(1), rtol=1e-4, atol=1e-4)
    winner = tuned.best_config
    STATS.clear()

    monkeypatch.setattr(MISS, "_in_graph_capture", lambda: True)
    kernel = tunesvc.autotune(configs=CONFIGS, key=["n"], db=tmp_db, reset_to_zero=["total_ptr"])(_atomic_sum)
    total = torch.full((1,), 5.0)  # what a captured launch adds to: a graph replays it, unzeroed
    kernel[grid(700)](x[:700], total, 700)
    torch.testing.assert_close(total, 5.0 + x[:700].sum().reshape(1), rtol=1e-4, atol=1e-4)
    assert kernel.best_config is winner  # the nearest stored key's winner, from the one chain
    assert STATS["benchmarks"] == 0 and STATS["in_graph"] == 1
    store = Store(tmp_db, readonly=True)
    try:
        misses = {m.shape_key for m in store.misses()}
    finally:
        store.close()
    assert misses == {"n=700,x_ptr.dtype=float32,total_ptr.dtype=float32"}


def test_inside_graph_capture_a_key_left_one_config_launches_it_and_records_no_miss(tmp_db, monkeypatch):
    """Nothing to choose between, so nothing for `tune misses --tune` to tune later."""
    Store(tmp_db).close()  # a database there: a miss would be recorded in it
    monkeypatch.setattr(MISS, "_in_graph_capture", lambda: True)
    kernel = tunesvc.autotune(
        configs=CONFIGS, key=["n"], db=tmp_db, prune_configs_by={"early_config_prune": lambda c, a, **k: c[-1:]}
    )(_scale_add)
    n = 300
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
    kernel[grid(n)](x, y, out, n, 2.0)
    torch.testing.assert_close(out, 2.0 * x + y)
    assert kernel.best_config is CONFIGS[-1]
    assert STATS["in_graph"] == 1 and STATS["benchmarks"] == 0
    assert _count(tmp_db, "tunesvc_misses") == 0 and _count(tmp_db, "tunesvc_trials") == 0


def test_the_graph_capture_check_is_torchs_own_and_false_without_a_capture():
    assert MISS._in_graph_capture() is False
    assert callable(torch.cuda.is_current_stream_capturing)


# -- 9. Triton's own messages stay Triton's --------------------------------------------------------
def _prune_nothing(configs, named_args, **kwargs):
    return []


def _prune_raises(configs, named_args, **kwargs):
    raise KeyError("the user's prune found no such option")


@pytest.mark.parametrize("prune", [_prune_nothing, _prune_raises])
def test_a_users_pruning_error_gets_tritons_own_exception_and_no_tunesvc_warning(tmp_db, prune):
    n = 100
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)

    def raised(tuner):
        with pytest.raises(Exception) as info:
            tuner[grid(n)](x, y, out, n, 1.0)
        return info.value

    theirs = triton.autotune(configs=CONFIGS, key=["n"], prune_configs_by={"early_config_prune": prune})(_scale_add)
    expected = raised(theirs)
    ours = tunesvc.autotune(configs=CONFIGS, key=["n"], db=tmp_db, prune_configs_by={"early_config_prune": prune})(
        _scale_add
    )
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got = raised(ours)
    assert type(got) is type(expected) and str(got) == str(expected)
    assert [str(w.message) for w in said if "tunesvc" in str(w.message)] == []
    # the kernel stays captured: a call its pruning accepts is tuned as usual
    assert not ours.__dict__["_tunesvc"].off


def cpu_bench(fn, quantiles):
    """triton.autotune's do_bench for the interpreter, which has no benchmarker of its own."""
    fn()
    return [1.0] * len(quantiles)


def test_calls_triton_refuses_get_tritons_own_exceptions_in_turn_and_no_tunesvc_warning(tmp_db):
    """A call missing an argument, one with an argument too many, then one passing a tuned
    meta-parameter: the same exceptions, in the same order, as from triton.autotune, where the
    first one's tuning (every candidate refused) leaves nothing behind."""
    n = 100
    x, out = torch.randn(n), torch.empty(n)

    def exceptions(kernel):
        calls = [
            lambda: kernel[(4,)](x, x, out, n),
            lambda: kernel[(4,)](x, x, out, n, 2.0, 7),
            lambda: kernel[(4,)](x, x, out, n, 2.0, BLOCK=16),
        ]
        raised = []
        for call in calls:
            with pytest.raises(Exception) as info:
                call()
            raised.append((type(info.value), str(info.value)))
        return raised

    expected = exceptions(triton.autotune(configs=CONFIGS, key=["n"], do_bench=cpu_bench)(_scale_add))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got = exceptions(tunesvc.autotune(configs=CONFIGS, key=["n"], db=tmp_db)(_scale_add))
    assert got == expected
    assert [str(w.message) for w in said if "tunesvc" in str(w.message)] == []


# -- 3. versions follow the code -------------------------------------------------------------------
HELPERS = """
import triton
import triton.language as tl

SCALE = tl.constexpr({scale})


@triton.jit
def twice(x):
    # a comment that changes nothing
    return x * {factor}
"""

KERNEL = """
import triton
import triton.language as tl

import {helpers} as helpers
from {helpers} import SCALE, twice


@triton.jit
def doubled(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, helpers.twice(x) + twice(x) * SCALE, mask=mask)
"""


def _version_of(tmp_path, monkeypatch, tag: str, factor: str, scale: int, comment: str = "") -> str:
    """The captured version of a kernel whose helper module (a real file) multiplies by ``factor``."""
    from tunesvc._capture.identity import kernel_version

    helpers, kernel = f"helpers_{tag}", f"kernel_{tag}"
    (tmp_path / f"{helpers}.py").write_text(comment + HELPERS.format(factor=factor, scale=scale))
    (tmp_path / f"{kernel}.py").write_text(KERNEL.format(helpers=helpers))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(kernel)
    x, out = torch.arange(8, dtype=torch.float32), torch.empty(8)
    module.doubled[(1,)](x, out, 8, BLOCK=8)  # the helpers are real: the kernel runs
    torch.testing.assert_close(out, x * float(factor) * (1 + scale))
    return kernel_version(module.doubled, CONFIGS)


def test_a_captured_kernels_version_follows_its_jit_helpers_and_constexpr_globals(tmp_path, monkeypatch):
    first = _version_of(tmp_path, monkeypatch, "a", "2", 1)
    # the same code in another file: the same version (module names are no part of the code)
    assert _version_of(tmp_path, monkeypatch, "b", "2", 1, comment="# reformatted, commented\n\n") == first
    edited = _version_of(tmp_path, monkeypatch, "c", "3", 1)  # the helper's code edited
    rescaled = _version_of(tmp_path, monkeypatch, "d", "2", 2)  # a constexpr global changed
    assert len({first, edited, rescaled}) == 3


# -- 5. forks and threads --------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_fork_in_the_middle_of_another_threads_tuning_leaves_both_processes_running(tmp_db):
    measuring, forked = threading.Event(), threading.Event()

    def hold(nargs):  # a per-config pre_hook: the tuning thread is inside a measurement here
        if threading.current_thread().name == "tuning":
            measuring.set()
            forked.wait(30)

    configs = [triton.Config({"BLOCK": b}, pre_hook=hold) for b in (16, 32, 64)]
    kernel = tunesvc.autotune(configs=configs, key=["n"], db=tmp_db)(_scale_add)
    n = 300
    x, y = torch.randn(n), torch.randn(n)
    out = torch.empty(n)
    tuning = threading.Thread(target=lambda: kernel[grid(n)](x, y, out, n, 1.0), name="tuning")
    tuning.start()
    assert measuring.wait(60)
    pid = os.fork()
    if pid == 0:  # the child: the key being tuned (its winner, once the parent stores it) and a new one
        code = 3
        try:
            mine = torch.empty(n)
            kernel[grid(n)](x, y, mine, n, 2.0)
            other = torch.empty(n // 2)
            kernel[grid(n // 2)](x[: n // 2], y[: n // 2], other, n // 2, 3.0)
            right = torch.allclose(mine, 2.0 * x + y) and torch.allclose(other, 3.0 * x[: n // 2] + y[: n // 2])
            code = 0 if right else 1
        finally:
            os._exit(code)
    forked.set()
    tuning.join(60)
    assert not tuning.is_alive(), "the parent's tuning did not finish"
    torch.testing.assert_close(out, x + y)
    assert exit_status_within(pid, 60) == 0, "the child did not finish, or computed a wrong answer"


# -- 4. warnings never end a program ---------------------------------------------------------------
PROGRAM = """
import torch
import triton
import triton.language as tl
import tunesvc


@triton.jit
def scale(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask), mask=mask)


def cpu_bench(fn, quantiles):  # the interpreter has no benchmarker of its own
    fn()
    return [1.0] * len(quantiles)


kernel = triton.autotune([triton.Config({"BLOCK": b}) for b in (16, 32)], key=["n"], do_bench=cpu_bench)(scale)


def test_program():
    tunesvc.capture()
    x = torch.arange(100, dtype=torch.float32)
    out = torch.empty(100)
    kernel[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, out, 100, 2.0)
    assert torch.equal(out, 2 * x)
    print("computed")


if __name__ == "__main__":
    test_program()
"""


@pytest.mark.parametrize(
    ("how", "database", "said"),
    [
        ("-W error", "damaged", "is not a SQLite database"),
        ("PYTHONWARNINGS=error", "empty", "no tuned config of"),
        ("pytest filterwarnings = error", "damaged", "is not a SQLite database"),
    ],
)
def test_a_captured_program_under_an_error_filter_for_warnings_runs_as_without_capture(tmp_path, how, database, said):
    """A fail-open warning (a damaged database) and a lookup miss's warning, each said in one line
    on stderr instead of raised inside the launch."""
    (tmp_path / "program.py").write_text(PROGRAM)
    db = tmp_path / "tune.db"
    if database == "damaged":
        db.write_text("not a database")
        env = interpreter_env(TUNESVC_DB=str(db))
    else:
        Store(str(db)).close()
        env = interpreter_env(TUNESVC_DB=str(db), TUNESVC_MODE="lookup")
    if how == "-W error":
        command = [sys.executable, "-W", "error", "program.py"]
    elif how == "PYTHONWARNINGS=error":
        command, env = [sys.executable, "program.py"], {**env, "PYTHONWARNINGS": "error"}
    else:
        (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings =\n    error\n")
        command = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:randomly"]
        command += ["program.py"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "computed" in done.stdout
    lines = [line for line in (done.stderr + done.stdout).splitlines() if "tunesvc:" in line]
    assert len(lines) == 1 and said in lines[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr


# -- 10. Triton's autotuning listener --------------------------------------------------------------
@pytest.mark.skipif(
    not hasattr(getattr(triton, "knobs", None), "autotuning") or not hasattr(triton.knobs.autotuning, "listener"),
    reason="this Triton has no knobs.autotuning.listener (it came in 3.8)",
)
def test_tritons_autotuning_listener_hears_each_key_chosen_once_tuned_or_served(tmp_db, monkeypatch):
    heard = []
    monkeypatch.setattr(triton.knobs.autotuning, "listener", lambda **kw: heard.append(kw))
    n = 500
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
    kernel = tunesvc.autotune(configs=CONFIGS, key=["n"], db=tmp_db)(_scale_add)
    kernel[grid(n)](x, y, out, n, 1.0)
    kernel[grid(n)](x, y, out, n, 1.0)  # a hit: not heard again
    assert len(heard) == 1
    tuned = heard[0]
    assert tuned["fn"] is _scale_add and tuned["key"] == (n, "torch.float32", "torch.float32", "torch.float32")
    assert tuned["best_config"] is kernel.best_config and set(tuned["configs_timings"]) == set(CONFIGS)
    assert tuned["cache_hit"] is False and tuned["duration"] > 0
    served = tunesvc.autotune(configs=CONFIGS, key=["n"], db=tmp_db)(_scale_add)
    served[grid(n)](x, y, out, n, 1.0)
    assert len(heard) == 2 and heard[1]["cache_hit"] is True and heard[1]["best_config"] is kernel.best_config
    single = tunesvc.autotune(
        configs=CONFIGS, key=["n"], db=tmp_db, prune_configs_by={"early_config_prune": lambda c, a, **k: c[:1]}
    )(_scale_add)
    single[grid(n)](x, y, out, n, 1.0)  # one config left by the pruning: nothing chosen, nothing heard
    assert len(heard) == 2


@pytest.mark.parametrize("option", ["key", "reset_to_zero", "restore_value"])
def test_tunesvc_autotune_refuses_at_decoration_what_tritons_own_refuses(tmp_db, option):
    """Triton 3.9 raises ValueError for names that are not the kernel's arguments; older ones take them."""
    options = {"key": ["n"], option: ["no_such_argument"]}

    def decorated(autotune):
        try:
            autotune(configs=CONFIGS, **options)(_scale_add)
        except Exception as exc:
            return type(exc), str(exc)
        return None

    assert decorated(lambda **kw: tunesvc.autotune(db=tmp_db, **kw)) == decorated(triton.autotune)
