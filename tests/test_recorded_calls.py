"""Recorded calls replayed offline (`tune misses --tune`, `tune verify --kernel`): a record that
cannot be replayed safely is refused in one sentence and never launched, in a real SQLite file
and a real process (a launch past its buffers would kill it); real records still replay; a key
whose every candidate fails is not marked tuned; `tune verify` says why a captured winner is not
measured, and `--retune` never keeps a winner it measured slower than the heuristic."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from tunesvc._capture.recorded_check import RefusedCall
from tunesvc._capture.recorded_check import check_recorded_call
from tunesvc.bench import Measurement
from tunesvc.bench import Status
from tunesvc.cli import app
from tunesvc.store import Store

NAME = "recmod:scale_add"
KEY = "n=1500,x_ptr.dtype=float32,y_ptr.dtype=float32,out_ptr.dtype=float32"

KERNELS = """
import os
import triton
import triton.language as tl

def _maybe_fail(nargs):
    if os.environ.get("RECMOD_FAIL"):  # as a kernel that no longer runs here
        raise RuntimeError("this config cannot launch here")

@triton.autotune(configs=[triton.Config({"BLOCK": b}, pre_hook=_maybe_fail) for b in (16, 32, 64)], key=["n"],
                 do_bench=lambda fn, quantiles: (fn(), [1.0] * len(quantiles))[1])
@triton.jit
def scale_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32)], key=["n_cols"],
                 do_bench=lambda fn, quantiles: (fn(), [1.0] * len(quantiles))[1])
@triton.jit
def row_scale(x_ptr, out_ptr, stride_row, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        tl.store(out_ptr + row * stride_row + cols, 2 * tl.load(x_ptr + row * stride_row + cols, mask=mask), mask=mask)
"""

SCRIPT = """
import torch, triton
import recmod

n = 1500
x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
recmod.scale_add[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, out, n, 2.0)
torch.testing.assert_close(out, 2.0 * x + y)
"""

ROW_SCRIPT = """
import torch
import recmod

x = torch.randn(30, 50)
out = torch.empty_like(x)
recmod.row_scale[(30,)](x, out, x.stride(0), 50)
torch.testing.assert_close(out, 2 * x)
"""
ROW_NAME = "recmod:row_scale"
ROW_KEY = "n_cols=50,x_ptr.dtype=float32,out_ptr.dtype=float32"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNESVC_", "RECMOD_"))}
    return {**env, "TRITON_INTERPRET": "1", **extra}


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "recmod.py").write_text(textwrap.dedent(KERNELS))
    (tmp_path / "script.py").write_text(textwrap.dedent(SCRIPT))
    (tmp_path / "rows.py").write_text(textwrap.dedent(ROW_SCRIPT))
    return tmp_path


def _capture(folder, db: str, mode: str, script: str = "script.py") -> None:
    done = subprocess.run(
        [sys.executable, script],
        cwd=folder,
        env=_env(TUNESVC_CAPTURE="1", TUNESVC_MODE=mode, TUNESVC_DB=db),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


def _tune(folder, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`tune ARGS` in a process of its own (a launch past its buffers would kill that one)."""
    return subprocess.run(
        [sys.executable, "-m", "tunesvc", *args],
        cwd=folder,
        env=_env(PYTHONPATH=str(folder), COLUMNS="300", **env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _rows(db: str, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as connection:
        return connection.execute(sql).fetchall()


def _edit_call(db: str, table: str, column: str, edit) -> None:
    with sqlite3.connect(db) as connection:
        [(row_id, text)] = connection.execute(f"SELECT id, {column} FROM {table}").fetchall()
        call = json.loads(text)
        edit(call)
        connection.execute(f"UPDATE {table} SET {column} = ? WHERE id = ?", (json.dumps(call), row_id))


def _set_n(call, n):
    call["args"][3] = {"value": n}


def _set_tensor(call, i, **fields):
    call["args"][i]["tensor"].update(fields)


#: (what is edited in a recorded call of scale_add(x, y, out, n=1500, alpha) with three grids of
#: cdiv(1500, BLOCK), the shape key it is then stored under, what the refusal says)
TAMPERED = {
    "n far past the tensors": (lambda c: _set_n(c, 10**8), KEY.replace("1500", "100000000"), "argument n is 100000000"),
    "a negative size": (lambda c: _set_n(c, -5), KEY.replace("1500", "-5"), "key argument n is -5, a negative size"),
    "a grid of 10**9 programs": (
        lambda c: c.update(grids=[[10**9]] * 3),
        KEY,
        "its grid (1000000000,) launches 1,000,000,000 programs, more than the 4,096",
    ),
    "a negative shape": (lambda c: _set_tensor(c, 0, shape=[-1500]), KEY, "holds -1500, below 0"),
    "shape and stride of different lengths": (lambda c: _set_tensor(c, 1, stride=[1, 1]), KEY, "1 sizes but 2 strides"),
    "terabytes of tensor": (
        lambda c: [_set_tensor(c, i, shape=[10**12]) for i in (0, 1, 2)],
        KEY,
        "would take 12,000,000,000,000 bytes",
    ),
    "a call that disagrees with its key": (
        lambda c: _set_n(c, 1000),
        KEY,
        "its n is 1000, and the key it is stored under says 1500",
    ),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_miss_is_refused_in_one_sentence_and_never_launched(folder, tmp_db, case):
    edit, key, said = TAMPERED[case]
    _capture(folder, tmp_db, "lookup")
    _edit_call(tmp_db, "tunesvc_misses", "call", edit)
    with sqlite3.connect(tmp_db) as connection:
        connection.execute("UPDATE tunesvc_misses SET shape_key = ?", (key,))
    before = _rows(tmp_db, "SELECT * FROM tunesvc_misses")
    done = _tune(folder, "misses", "--tune", "--kernel", NAME, "--db", tmp_db)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)  # not killed by a launch: refused
    [line] = [x for x in done.stdout.splitlines() if "not tuned:" in x]
    assert "The recorded call is refused, never launched: " in line and said in line, line
    assert line.count(". ") == 0 and line.endswith(".") and "Traceback" not in done.stderr
    # nothing stored, nothing changed: the miss stays open with its call as it was
    assert _rows(tmp_db, "SELECT * FROM tunesvc_misses") == before
    assert _rows(tmp_db, "SELECT count(*) FROM tunesvc_trials") == [(0,)]


def _past_the_rows(call) -> None:
    """row_scale's call edited so that each integer stays within the largest tensor's extent
    (10**6 elements) while their product does not: program r reads and writes at r * stride_row,
    and 4,096 programs (as many as a persistent kernel launches) of a stride of 10**6 elements reach
    16 GB past the buffers."""
    for i in (0, 1):
        _set_tensor(call, i, shape=[1000, 1000], stride=[1000, 1])
    call["args"][2] = {"value": 10**6}
    call["grids"] = [[4096]] * len(call["grids"])


def test_a_call_past_its_buffers_that_the_check_cannot_see_ends_only_its_own_process(folder, tmp_db):
    _capture(folder, tmp_db, "lookup", "rows.py")
    _edit_call(tmp_db, "tunesvc_misses", "call", _past_the_rows)
    [(call,)] = _rows(tmp_db, "SELECT call FROM tunesvc_misses")
    names = {"arg_names": ["x_ptr", "out_ptr", "stride_row", "n_cols", "BLOCK"], "key_names": ["n_cols"]}
    check_recorded_call(json.loads(call), constexprs={"BLOCK"}, listed=2, memory_bytes=1 << 34, **names)
    before = _rows(tmp_db, "SELECT * FROM tunesvc_misses")
    done = _tune(folder, "misses", "--tune", "--kernel", ROW_NAME, "--db", tmp_db)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)  # this process lives on
    [line] = [x for x in done.stdout.splitlines() if "not tuned:" in x]
    said = f"Replaying the recorded call of {ROW_NAME} on {ROW_KEY} ended the process that launched it (SIG"
    assert said in line and "so nothing was measured." in line and line.count(". ") == 0, line
    assert _rows(tmp_db, "SELECT * FROM tunesvc_misses") == before
    assert _rows(tmp_db, "SELECT count(*) FROM tunesvc_trials") == [(0,)]
    assert _rows(tmp_db, "SELECT count(*) FROM tunesvc_winners") == [(0,)]


def test_verify_replays_the_call_of_a_finished_sweep_apart(folder, tmp_db):
    """A sweep that never finished (its process died on the call) vouches for no call: verify
    takes the newest finished sweep's; that one edited past its buffers ends only its own replay."""
    _capture(folder, tmp_db, "tune", "rows.py")
    with sqlite3.connect(tmp_db) as connection:
        [(problem,)] = connection.execute("SELECT problem FROM tunesvc_sweeps").fetchall()
        call = json.loads(problem)
        _past_the_rows(call)
        connection.execute(
            "INSERT INTO tunesvc_sweeps (kernel_version_id, device_id, shape_key, problem, strategy, budget, seed, "
            "status, started_at, host) SELECT kernel_version_id, device_id, shape_key, ?, strategy, budget, seed, "
            "'running', started_at, host FROM tunesvc_sweeps",
            (json.dumps(call),),
        )
    command = ["verify", "--kernel", ROW_NAME, "--db", tmp_db, "--margin", "100", "--json"]
    real = _tune(folder, *command)
    [verdict] = json.loads(real.stdout)
    assert real.returncode == 0 and verdict["flags"] == [] and verdict["measured_ms"] is not None, real.stdout
    with sqlite3.connect(tmp_db) as connection:
        connection.execute("DELETE FROM tunesvc_sweeps WHERE status = 'running'")
    _edit_call(tmp_db, "tunesvc_sweeps", "problem", _past_the_rows)
    before = _rows(tmp_db, "SELECT * FROM tunesvc_trials")
    tampered = _tune(folder, *command)
    assert tampered.returncode == 0, (tampered.returncode, tampered.stdout, tampered.stderr)
    [verdict] = json.loads(tampered.stdout)
    assert verdict["flags"] == ["not-measured"] and verdict["measured_ms"] is None
    assert "ended the process that launched it (SIG" in verdict["detail"], verdict["detail"]
    assert _rows(tmp_db, "SELECT * FROM tunesvc_trials") == before


def test_a_real_miss_replays_and_is_tuned(folder, tmp_db):
    _capture(folder, tmp_db, "lookup")
    done = _tune(folder, "misses", "--tune", "--kernel", NAME, "--db", tmp_db)
    assert done.returncode == 0 and "tuned: BLOCK=" in done.stdout, done.stdout + done.stderr
    assert _rows(tmp_db, "SELECT status FROM tunesvc_misses") == [("tuned",)]
    assert _rows(tmp_db, "SELECT status, count(*) FROM tunesvc_trials GROUP BY status") == [("ok", 3)]


def test_the_tune_script_finds_a_kernel_module_in_the_current_folder(folder, tmp_db):
    """`tune misses --tune` and `tune verify --kernel` run as the console script from the folder
    that holds the kernel's module (no PYTHONPATH) find it, as `python -m tunesvc` does; a module
    in neither place is one sentence naming the fix."""
    from pathlib import Path

    script = Path(sys.executable).with_name("tune")
    _capture(folder, tmp_db, "lookup")

    def tune(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(script), *args], cwd=folder, env=_env(COLUMNS="300"), capture_output=True, text=True, timeout=300
        )

    done = tune("misses", "--tune", "--kernel", NAME, "--db", tmp_db)
    assert done.returncode == 0 and "tuned: BLOCK=" in done.stdout, done.stdout + done.stderr
    verified = tune("verify", "--kernel", NAME, "--db", tmp_db, "--margin", "100", "--json")
    assert verified.returncode == 0 and "ModuleNotFoundError" not in verified.stdout + verified.stderr, verified.stdout
    missing = tune("space", "nosuchmod:Template")
    said = missing.stdout + missing.stderr
    assert missing.returncode == 1 and "Traceback" not in said, said
    assert "no module named 'nosuchmod' on the Python path or in the current folder" in said, said
    assert "run the command from the folder that holds nosuchmod.py" in " ".join(said.split()), said


def test_a_key_whose_every_candidate_fails_is_not_marked_tuned(folder, tmp_db):
    _capture(folder, tmp_db, "lookup")
    done = _tune(folder, "misses", "--tune", "--kernel", NAME, "--db", tmp_db, RECMOD_FAIL="1")
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = [x for x in done.stdout.splitlines() if "not tuned:" in x]
    assert f"Every candidate of {NAME} failed on {KEY} (3 error" in line and "cannot launch here" in line
    assert _rows(tmp_db, "SELECT status FROM tunesvc_misses") == [("open",)]
    assert _rows(tmp_db, "SELECT count(*) FROM tunesvc_winners") == [(0,)]
    # once the kernel runs again, the same miss is tuned: its failed trials take the new measurements
    again = _tune(folder, "misses", "--tune", "--kernel", NAME, "--db", tmp_db)
    assert again.returncode == 0 and "tuned: BLOCK=" in again.stdout, again.stdout + again.stderr
    assert _rows(tmp_db, "SELECT status, count(*) FROM tunesvc_trials GROUP BY status") == [("ok", 3)]


def test_verify_refuses_a_tampered_sweep_record_and_measures_a_real_one(folder, tmp_db):
    _capture(folder, tmp_db, "tune")
    command = ["verify", "--kernel", NAME, "--db", tmp_db, "--margin", "100", "--json"]
    real = _tune(folder, *command)
    [verdict] = json.loads(real.stdout)
    assert real.returncode == 0 and verdict["flags"] == [] and verdict["measured_ms"] is not None, real.stdout
    _edit_call(tmp_db, "tunesvc_sweeps", "problem", lambda c: _set_n(c, 10**8))
    before = _rows(tmp_db, "SELECT * FROM tunesvc_trials")
    tampered = _tune(folder, *command)
    assert tampered.returncode == 0, tampered.stdout + tampered.stderr  # refused, so nothing crashed
    [verdict] = json.loads(tampered.stdout)
    assert verdict["flags"] == ["not-measured"] and verdict["measured_ms"] is None
    assert "refused, never launched: argument n is 100000000" in verdict["detail"]
    retuned = _tune(folder, *command, "--retune")
    assert retuned.returncode == 0 and json.loads(retuned.stdout)[0]["retuned_ms"] is None
    assert _rows(tmp_db, "SELECT * FROM tunesvc_trials") == before


def test_verify_without_kernel_says_why_a_captured_winner_is_not_measured(folder, tmp_db):
    _capture(folder, tmp_db, "tune")
    done = _tune(folder, "verify", "--db", tmp_db)
    said = " ".join(done.stdout.split())
    assert done.returncode == 0, said
    assert f"not-measured (a captured kernel, re-measured on its recorded call when named: --kernel {NAME})" in said
    assert "1 winner checked, 0 flagged, 1 not measured" in said and "--retune" not in said


def test_retune_of_a_captured_key_never_keeps_the_winner_it_measured_slower(folder, tmp_db, monkeypatch):
    """The stored winner (BLOCK 64) had the fastest time when tuned; now the first listed config
    (BLOCK 16) measures faster. The retune measures every config again and the winner follows."""
    import tunesvc._capture.bench as capture_bench

    _capture(folder, tmp_db, "tune")
    with sqlite3.connect(tmp_db) as connection:
        connection.execute("UPDATE tunesvc_trials SET time_ms = 0.001 WHERE config LIKE '%\"BLOCK\": 64%'")
        connection.execute("UPDATE tunesvc_trials SET time_ms = 9.0 WHERE config NOT LIKE '%\"BLOCK\": 64%'")
        [(trial_id, config, digest)] = connection.execute(
            "SELECT id, config, config_hash FROM tunesvc_trials WHERE config LIKE '%\"BLOCK\": 64%'"
        ).fetchall()
        connection.execute(
            "UPDATE tunesvc_winners SET config = ?, config_hash = ?, time_ms = 0.001, trial_id = ?",
            (config, digest, trial_id),
        )

    # timings are the point here, not the interpreter's noise: BLOCK 16 measures 1 ms, the others 2 ms
    real = capture_bench.CaptureBench.measure

    def measure(self, config):
        m = real(self, config)
        return Measurement(Status.OK, time_ms=1.0 if config.kwargs["BLOCK"] == 16 else 2.0, reps=1) if m.ok else m

    monkeypatch.setattr(capture_bench.CaptureBench, "measure", measure)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "recmod", raising=False)
    command = ["verify", "--kernel", NAME, "--db", tmp_db, "--json"]
    flagged = CliRunner().invoke(app, command)
    [verdict] = json.loads(flagged.output)
    assert verdict["flags"] == ["slower", "slower-than-stored"], verdict  # stored at 0.001 ms, 2 ms now
    assert (verdict["measured_ms"], verdict["heuristic_ms"]) == (2.0, 1.0)
    retuned = CliRunner().invoke(app, [*command, "--retune"])
    assert retuned.exit_code == 0, retuned.output
    [verdict] = json.loads(retuned.output)
    assert verdict["retuned_config"]["BLOCK"] == 16 and verdict["retuned_ms"] == 1.0
    store = Store(tmp_db, readonly=True)
    try:
        [winner] = store.winners(kernel=NAME)
    finally:
        store.close()
    assert (winner.config["BLOCK"], winner.time_ms) == (16, 1.0)


# -- the rule on records alone: real libraries' calls pass; the same with one field edited does not
#: fla's softmax_fwd_kernel(x, p, D, B) on a 7x45 float32 tensor, as its capture recorded it
FLA_SOFTMAX = {
    "args": [
        {"tensor": {"shape": [7, 45], "stride": [45, 1], "dtype": "torch.float32"}},
        {"tensor": {"shape": [7, 45], "stride": [45, 1], "dtype": "torch.float32"}},
    ],
    "kwargs": {"D": {"value": 45}, "B": {"value": 64}},
    "grids": [[7]] * 6,
}
SOFTMAX = {"arg_names": ["x", "p", "D", "B"], "key_names": ["D"], "constexprs": {"D", "B"}, "listed": 6}
#: Liger's token gather: int32 indices recorded by value (the record, trimmed to its shape)
GATHER_INDICES = {"tensor": {"shape": [6], "stride": [1], "dtype": "torch.int32", "values": [0, 2, 4, 1, 3, 5]}}


def _check(call, kernel=SOFTMAX, memory=1 << 34):
    check_recorded_call(call, memory_bytes=memory, **kernel)


def test_the_rule_passes_real_records_and_refuses_each_edit():
    _check(FLA_SOFTMAX)  # B (a constexpr block) is 64 over tensors of 315 elements: passes
    with_indices = {**FLA_SOFTMAX, "args": [*FLA_SOFTMAX["args"], GATHER_INDICES]}
    _check(with_indices, {**SOFTMAX, "arg_names": ["x", "p", "idx", "D", "B"]})
    _check({"args": [], "kwargs": {"seed": {"value": 2**40}}, "grids": [[1]]}, {**SOFTMAX, "arg_names": ["seed"]})
    refusals = {
        "tensor argument idx holds the value 9999": {
            "args": [
                *FLA_SOFTMAX["args"],
                {"tensor": {**GATHER_INDICES["tensor"], "values": [0, 2, 4, 1, 3, 9999]}},
            ]
        },
        "has shape [6] (6 elements) but 2 recorded values": {
            "args": [*FLA_SOFTMAX["args"], {"tensor": {**GATHER_INDICES["tensor"], "values": [0, 1]}}]
        },
        "holds the value 2147483648, not an integer of torch.int32": {
            "args": [*FLA_SOFTMAX["args"], {"tensor": {**GATHER_INDICES["tensor"], "values": [2**31] * 6}}]
        },
        "unknown dtype 'torch.nonsense'": {
            "args": [{"tensor": {"shape": [7, 45], "stride": [45, 1], "dtype": "torch.nonsense"}}]
        },
        "argument B is 1024": {"kwargs": {"D": {"value": 45}, "B": {"value": 1024}}},
        "grid (1, 70000) has a dimension of 70000, outside 0 to 65535": {"grids": [[1, 70000]]},
        "grid [7, 1, 1, 1] is not 1 to 3 integers": {"grids": [[7, 1, 1, 1]]},
        "it has 7 grids, and the kernel lists 6 configs": {"grids": [[7]] * 7},
    }
    kernel = {**SOFTMAX, "arg_names": ["x", "p", "idx", "D", "B"]}
    for said, edit in refusals.items():
        with pytest.raises(RefusedCall, match="^The recorded call is refused, never launched: .*") as refused:
            _check({**FLA_SOFTMAX, **edit}, kernel)
        assert said in str(refused.value), (said, str(refused.value))
        assert ". " not in str(refused.value) and str(refused.value).endswith(".")
    with pytest.raises(RefusedCall, match="more than a 4th of this device's 1,000"):
        _check(FLA_SOFTMAX, memory=1000)


def test_real_library_calls_recorded_while_serving_pass_the_rule(tmp_db):
    """fla, Liger and torchao kernels served in mode lookup record their misses; each recorded
    call, checked against its kernel and the key it is stored under, is not refused."""
    from _capture import autotuner_of
    from _capture import captured_name
    from _library_kernels import CASES

    import tunesvc
    from tunesvc._capture import check_call
    from tunesvc.device import current_device

    with tunesvc.capture(mode="lookup", db=tmp_db):
        tuners = {captured_name(kernel): autotuner_of(kernel) for kernel, _, _ in (case() for case in CASES.values())}
    store = Store(tmp_db, readonly=True)
    try:
        misses = store.misses()
    finally:
        store.close()
    assert {m.kernel for m in misses} == set(tuners) and len(misses) >= len(tuners)
    for m in misses:
        check_call(tuners[m.kernel], m.call, current_device(), m.shape_key)


def test_a_tensor_whose_elements_share_a_location_is_restored_between_candidates():
    """An expanded input (stride 0: a broadcast bias) is legal in a call; torch's copy_ refuses
    to write it, so the bench restores it through the storage it spans."""
    import torch

    from tunesvc._capture.bench import _write

    bias = torch.zeros(3).as_strided((4, 3), (0, 1))
    _write(bias, torch.tensor([1.0, 2.0, 3.0]).expand(4, 3))
    assert bias.untyped_storage().nbytes() == 12 and bias[3].tolist() == [1.0, 2.0, 3.0]
    strided = torch.zeros(8)[::2]  # apart, not shared: copied as it is
    _write(strided, torch.ones(4))
    assert strided.tolist() == [1.0] * 4 and strided._base.tolist() == [1, 0, 1, 0, 1, 0, 1, 0]


def test_drifted_measures_a_captured_winner_tuned_under_another_triton(folder, tmp_db):
    """A captured winner tuned under another Triton and torch (its device row's) is measured on
    its recorded call with --drifted, and its drift said; the kernel's source edited, it is stale
    all the same; tuned under this stack, it is skipped."""
    import torch
    import triton

    _capture(folder, tmp_db, "tune")
    command = ["verify", "--kernel", NAME, "--db", tmp_db, "--margin", "100", "--drifted", "--json"]
    done = _tune(folder, *command)
    [here] = json.loads(done.stdout)
    assert here["skipped"] and here["measured_ms"] is None and here["drift"] == {}, done.stdout + done.stderr
    with sqlite3.connect(tmp_db) as connection:
        connection.execute("UPDATE tunesvc_devices SET triton = '3.4.0', torch = '2.8.0', fingerprint = 'older'")
    done = _tune(folder, *command)
    [drifted] = json.loads(done.stdout)
    assert not drifted["skipped"] and drifted["flags"] == [], done.stdout + done.stderr
    assert drifted["measured_ms"] is not None and drifted["heuristic_ms"] is not None
    assert drifted["drift"] == {"torch": ["2.8.0", torch.__version__], "triton": ["3.4.0", triton.__version__]}
    module = folder / "recmod.py"
    module.write_text(
        module.read_text().replace("alpha * tl.load", "tl.load(x_ptr + offs, mask=mask) * alpha + 0 * tl.load", 1)
    )
    done = _tune(folder, *command)
    [edited] = json.loads(done.stdout)
    assert edited["flags"] == ["stale-kernel"] and edited["measured_ms"] is None, done.stdout + done.stderr
