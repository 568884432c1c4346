"""`tune adopt`: another GPU model's winners measured here and stored as this device's, each with
where it came from; at most three measurements a key; a captured kernel adopted on its recorded
call. The other model is fabricated (tests/_devices.py: the interpreter has no GPU siblings);
every measurement is the interpreter's, in a real SQLite file."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import subprocess
import sys
import textwrap

import pytest
from _capture import interpreter_env
from _devices import H100
from typer.testing import CliRunner

import tunesvc
from tunesvc.adopt import CANDIDATES
from tunesvc.adopt import HEURISTIC
from tunesvc.adopt import OWN
from tunesvc.adopt import adopt
from tunesvc.adopt import candidates_for
from tunesvc.cli import app
from tunesvc.device import current_device
from tunesvc.space import config_hash
from tunesvc.store import Store

KEYS = {"M=64,N=100,dtype=float32": (37, 100), "M=128,N=100,dtype=float32": (100, 100)}
#: a softmax config that is not the heuristic's for these keys, and one more
THEIRS = {"BLOCK_M": 1, "BLOCK_N": 128, "num_warps": 2, "num_stages": 1}
OTHER = {"BLOCK_M": 4, "BLOCK_N": 128, "num_warps": 1, "num_stages": 1}


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "tune.db")
    template = tunesvc.get_template("softmax")
    store = Store(path)
    try:
        for key, config in zip(KEYS, (THEIRS, OTHER)):
            store.merge_winner(template.name, template.version, H100, key, config, 0.01, "test")
    finally:
        store.close()
    return path


def _rows(db: str, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as connection:
        return connection.execute(sql).fetchall()


def test_candidates_are_theirs_then_the_nearest_keys_then_the_heuristic_each_once():
    template = tunesvc.get_template("softmax")
    device = current_device()
    problem = template.problem(M=37, N=100, dtype="float32")
    key = str(template.key(problem))
    heuristic = template.heuristic(problem, device)
    far = "M=4096,N=100,dtype=float32"
    theirs = {key: THEIRS, "M=128,N=100,dtype=float32": OTHER, far: {**OTHER, "num_warps": 4}}
    picked = candidates_for(template, problem, key, theirs, device, heuristic)
    assert [what for what, _ in picked] == [OWN, "winner of M=128,N=100,dtype=float32", HEURISTIC]
    assert [c for _, c in picked] == [THEIRS, OTHER, heuristic]
    # the same config twice is measured once: the heuristic as their winner leaves room for two nearer keys
    same = candidates_for(
        template, problem, key, {key: heuristic, **{k: v for k, v in theirs.items() if k != key}}, device, heuristic
    )
    assert len(same) == CANDIDATES and len({config_hash(c) for _, c in same}) == CANDIDATES
    # a config that does not fit this problem is never a candidate
    wide = {**THEIRS, "BLOCK_N": 4096 * 8}
    assert template.violations(wide, problem, device)
    assert [c for _, c in candidates_for(template, problem, key, {key: wide}, device, heuristic)] == [heuristic]


def test_adopt_stores_what_it_measured_here_with_its_provenance(db):
    before = _rows(db, "SELECT * FROM tunesvc_winners")
    done = CliRunner().invoke(app, ["adopt", "--from-device", H100.name, "--db", db, "--json"])
    assert done.exit_code == 0, done.output
    adoptions = json.loads(done.output)
    assert {a["shape_key"] for a in adoptions} == set(KEYS) and all(a["winner"] for a in adoptions)
    here = current_device()
    store = Store(db, readonly=True)
    try:
        mine = {w.shape_key: w for w in store.winners(kernel="softmax", hardware_id=here.hardware_id)}
        theirs = {w.shape_key: w for w in store.winners(kernel="softmax", hardware_id=H100.hardware_id)}
    finally:
        store.close()
    assert set(mine) == set(KEYS)
    assert {k: (w.config, w.time_ms) for k, w in theirs.items()} == {
        k: (c, 0.01) for k, c in zip(KEYS, (THEIRS, OTHER))
    }
    assert [r for r in _rows(db, "SELECT * FROM tunesvc_winners") if r in before] == before  # theirs untouched
    # every trial is this device's, at most three a key, each saying where its config came from
    trials = _rows(
        db,
        "SELECT t.shape_key, t.message, s.strategy FROM tunesvc_trials t JOIN tunesvc_sweeps s ON s.id = t.sweep_id "
        "JOIN tunesvc_devices d ON d.id = t.device_id WHERE d.hardware_id = '" + here.hardware_id + "'",
    )
    for key in KEYS:
        messages = [m for k, m, _ in trials if k == key]
        assert 1 <= len(messages) <= CANDIDATES
        assert any(f"adopted: {H100.name}'s {OWN}" in m for m in messages), messages
        assert any("adopted: the heuristic" in m for m in messages), messages
    assert {s for _, _, s in trials} == {"adopt"}
    for a in adoptions:
        assert a["chosen"] is not None and a["winner_ms"] == mine[a["shape_key"]].time_ms
        assert a["theirs_ms"] is not None and a["heuristic_ms"] is not None
        assert a["phases"].get("checking and timing", 0) > 0 and "torch peer" not in a["phases"], a["phases"]


def test_a_compile_pool_is_done_and_closed_before_the_first_key_is_timed(db, monkeypatch):
    """Its workers make inputs and launch candidates on the GPU that times the keys: every
    candidate is compiled first, then the pool closes, then the keys are timed."""
    from tunesvc.bench import Compiler

    closed_with: list[int] = []  # trials stored when the pool closed
    close = Compiler.close
    before = _rows(db, "SELECT COUNT(*) FROM tunesvc_trials")[0][0]  # the other model's

    def counted(self):
        closed_with.append(_rows(db, "SELECT COUNT(*) FROM tunesvc_trials")[0][0])
        close(self)

    monkeypatch.setattr(Compiler, "close", counted)
    store = Store(db)
    try:
        adoptions = adopt(store, H100.name, workers=2)
    finally:
        store.close()
    assert closed_with == [before]
    assert all(a.winner for a in adoptions) and len(adoptions) == len(KEYS)
    assert _rows(db, "SELECT COUNT(*) FROM tunesvc_trials")[0][0] > before


def test_adopt_prints_a_table_and_what_it_adopted(db):
    done = CliRunner().invoke(app, ["adopt", "--from-device", H100.hardware_id, "--db", db], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    assert f"measured and adopted on {current_device().name}" in done.output
    assert "2 of 2 keys adopted" in done.output, done.output


@pytest.mark.parametrize(
    "device, said",
    [("NVIDIA B200", "No device 'NVIDIA B200'"), (current_device().name, "adopt takes another GPU model's winners")],
)
def test_adopt_refuses_a_device_it_cannot_adopt_from_in_one_line(db, device, said):
    if device == current_device().name:  # this device in the store, with winners of its own
        store = Store(db)
        try:
            adopt(store, H100.name)
        finally:
            store.close()
    stored = _rows(db, "SELECT * FROM tunesvc_winners"), _rows(db, "SELECT * FROM tunesvc_trials")
    done = CliRunner().invoke(app, ["adopt", "--from-device", device, "--db", db], env={"COLUMNS": "300"})
    assert done.exit_code == 1 and said in done.output and "Traceback" not in done.output, done.output
    assert len(done.output.strip().splitlines()) == 1, done.output
    assert (_rows(db, "SELECT * FROM tunesvc_winners"), _rows(db, "SELECT * FROM tunesvc_trials")) == stored


KERNELS = """
import triton
import triton.language as tl

@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32, 64)], key=["n"],
                 do_bench=lambda fn, quantiles: (fn(), [1.0] * len(quantiles))[1])
@triton.jit
def scale_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)
"""

SCRIPT = """
import torch, triton
import adoptmod

for n in (1500, 3000):
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
    adoptmod.scale_add[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, out, n, 2.0)
    torch.testing.assert_close(out, 2.0 * x + y)
"""
NAME = "adoptmod:scale_add"


def _env(folder, **extra: str) -> dict[str, str]:
    return interpreter_env(PYTHONPATH=str(folder), COLUMNS="300", **extra)


def test_a_captured_kernel_is_adopted_on_the_call_recorded_on_the_other_model(tmp_path):
    """Two device models in one store: the keys of a captured kernel tuned on one (the
    interpreter's rows, renamed as another GPU's) are adopted by the interpreter on the calls
    recorded there, named by --kernel; its recorded calls are kept for this device too."""
    (tmp_path / "adoptmod.py").write_text(textwrap.dedent(KERNELS))
    (tmp_path / "script.py").write_text(textwrap.dedent(SCRIPT))
    db = str(tmp_path / "tune.db")
    env = _env(tmp_path, TUNESVC_CAPTURE="1", TUNESVC_MODE="tune", TUNESVC_DB=db)
    ran = subprocess.run(
        [sys.executable, "script.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stderr
    other = dataclasses.replace(current_device(), name="Other GPU")
    with sqlite3.connect(db) as connection:
        connection.execute(
            "UPDATE tunesvc_devices SET fingerprint = ?, hardware_id = ?, name = ?",
            (other.fingerprint, other.hardware_id, other.name),
        )
    keys = {k for (k,) in _rows(db, "SELECT shape_key FROM tunesvc_winners")}
    assert len(keys) == 2

    def tune(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "tunesvc", *args],
            cwd=tmp_path,
            env=_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=300,
        )

    unnamed = tune("adopt", "--from-device", "Other GPU", "--db", db, "--json")
    assert unnamed.returncode == 0, unnamed.stderr
    assert all(not a["winner"] and "--kernel " + NAME in a["detail"] for a in json.loads(unnamed.stdout))
    done = tune("adopt", "--from-device", "Other GPU", "--kernel", NAME, "--db", db, "--json")
    assert done.returncode == 0, done.stderr
    adoptions = json.loads(done.stdout)
    assert {a["shape_key"] for a in adoptions} == keys and all(a["winner"] for a in adoptions), adoptions
    here = current_device().hardware_id
    mine = _rows(
        db,
        f"SELECT w.shape_key FROM tunesvc_winners w JOIN tunesvc_devices d ON d.id = w.device_id WHERE d.hardware_id = '{here}'",
    )
    assert {k for (k,) in mine} == keys
    messages = _rows(
        db,
        f"SELECT t.message FROM tunesvc_trials t JOIN tunesvc_devices d ON d.id = t.device_id WHERE d.hardware_id = '{here}'",
    )
    assert all("adopted:" in (m or "") for (m,) in messages) and 2 <= len(messages) <= 2 * CANDIDATES
    calls = _rows(
        db,
        "SELECT count(*) FROM tunesvc_sweeps s JOIN tunesvc_devices d ON d.id = s.device_id "
        f"WHERE s.strategy = 'capture' AND s.status = 'done' AND d.hardware_id = '{here}'",
    )
    assert calls == [(2,)]


def test_a_sweep_on_a_sibling_model_starts_from_its_winners_of_this_key_then_the_nearest(tmp_path):
    """Warm start on a new model: the sibling's winner of the key, then those of its nearest
    tuned keys (each config once, nearest first, NEIGHBOURS of them), before anything else."""
    from _devices import H200

    from tunesvc.tuning.sweep import NEIGHBOURS
    from tunesvc.tuning.sweep import sibling_warm_start

    template = tunesvc.get_template("matmul")
    db = str(tmp_path / "tune.db")
    base = {
        "VARIANT": "grouped",
        "BLOCK_K": 64,
        "GROUP_M": 8,
        "SPLIT_K": 1,
        "FLATTEN": 0,
        "SUBTILE": 0,
        "num_warps": 4,
        "num_stages": 3,
    }
    tiles = [(64, 64), (128, 64), (64, 128), (128, 128), (32, 64)]
    ms = [512, 1024, 2048, 4096, 8192]  # nearest to M=512 first, in this order
    configs = [{**base, "BLOCK_M": bm, "BLOCK_N": bn} for bm, bn in tiles]
    store = Store(db)
    try:
        for m, config in zip(ms, configs):
            store.merge_winner(
                template.name, template.version, H100, f"M={m},N=512,K=512,dtype=bfloat16", config, 0.1, "t"
            )
        store.merge_winner(
            template.name, template.version, H100, "M=8192,N=512,K=512,dtype=float16", configs[0], 0.1, "t"
        )
        warm = sibling_warm_start(store, template, H200, "M=512,N=512,K=512,dtype=bfloat16")
    finally:
        store.close()
    assert warm == configs[: 1 + NEIGHBOURS]


def test_a_key_tuned_under_two_versions_is_adopted_from_the_current_ones_winner(tmp_path):
    """The other model's winner of the kernel's current version is the candidate, even where a
    winner of another version was stored later; a key of another version only is said, not run."""
    from tunesvc.adopt import by_key

    template = tunesvc.get_template("softmax")
    db = str(tmp_path / "tune.db")
    old_only = "M=4096,N=100,dtype=float32"
    store = Store(db)
    try:
        key = next(iter(KEYS))
        store.merge_winner(template.name, template.version, H100, key, THEIRS, 0.01, "t")
        store.merge_winner(template.name, "0ld0ld0ld0ld", H100, key, OTHER, 0.01, "t")  # later, another version
        store.merge_winner(template.name, "0ld0ld0ld0ld", H100, old_only, OTHER, 0.01, "t")
        entries = [e for e, _ in store.winners_with_devices(kernel="softmax", hardware_id=H100.hardware_id)]
        assert by_key(entries, template.version)[key].config == THEIRS
        assert by_key(entries, None)[key].config == OTHER  # no version asked: the newest
        adoptions = {a.shape_key: a for a in adopt(store, H100.name, kernel="softmax")}
    finally:
        store.close()
    assert adoptions[key].candidates[0] == (OWN, THEIRS) and adoptions[key].adopted
    assert not adoptions[old_only].candidates and "tuned for kernel version 0ld0ld0ld0ld" in adoptions[old_only].detail
