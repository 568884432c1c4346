"""The store's contract (tunesvc.store.BaseStore), run over each backend: a SQLite file and a
PostgreSQL database (where $TUNESVC_TEST_PG_URL names a server; CI sets it).

Every public method of the protocol is called here (a test checks that none is left out); each
returns records, never ORM rows; a row damaged in the database (JSON nested deep, a config that
is not one, a shape key with a digit that is not ASCII) is skipped with one warning naming its
kernel and key; tables dropped or renamed by hand are one sentence on both backends.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import socket
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from _backends import db_url  # noqa: F401  (fixture: a SQLite file, a PostgreSQL database)
from sqlalchemy import text
from typer.testing import CliRunner

from tunesvc import Runtime
from tunesvc import Status
from tunesvc import TunesvcError
from tunesvc import config_hash
from tunesvc.bench import Measurement
from tunesvc.bundle import import_sources
from tunesvc.cli import app
from tunesvc.records import DeviceRecord
from tunesvc.records import JobRecord
from tunesvc.records import MissRecord
from tunesvc.records import RejectedTrials
from tunesvc.records import TrialRecord
from tunesvc.records import WinnerRecord
from tunesvc.store import BaseStore
from tunesvc.store import JobSpec
from tunesvc.store import Store
from tunesvc.store import WinnerEntry
from tunesvc.store.models import Base
from tunesvc.template import ShapeKey
from tunesvc.text import natural_order

KEY = "M=64,N=45,K=29,dtype=float16"
PROBLEM = {"M": 37, "N": 45, "K": 29, "dtype": "float16"}
#: deeper than any recursion limit: json.loads raised RecursionError on it
DEEP = 100_000
#: deep enough to break json.loads under a default recursion limit, and within PostgreSQL's json input
PG_DEEP = 2_000


def cfg(bm: int) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2}


def ok(ms: float) -> Measurement:
    return Measurement(Status.OK, time_ms=ms, spread=0.1, reps=3, rel_error=1e-4)


@pytest.fixture
def store(db_url):
    s = Store(db_url)
    yield s
    s.close()


@pytest.fixture
def swept(store, template, device):
    """A key with three trials and its winner; returns (kv id, device id, sweep id)."""
    kv, dev = store.kernel_version_id(template), store.device_id(device)
    sweep = store.start_sweep(kv, dev, KEY, PROBLEM, "grid", 3, 0)
    store.add_trials(sweep, kv, dev, KEY, [(cfg(bm), config_hash(cfg(bm)), ok(bm / 32)) for bm in (32, 64, 128)])
    store.update_winner(kv, dev, KEY)
    store.finish_sweep(sweep, 1.5, peer_ms=0.5)
    return kv, dev, sweep


def raw(store: Store, statement: str, **params) -> None:
    """A statement the store would never run (a row damaged by hand, a table dropped)."""
    with store.session() as session:
        session.execute(text(statement), params)


def json_param(store: Store, name: str) -> str:
    return f":{name}" if store.is_sqlite else f"CAST(:{name} AS json)"


def deep_json(store: Store) -> str:
    depth = DEEP if store.is_sqlite else PG_DEEP
    return "[" * depth + "]" * depth


def skipped(call):
    """What ``call`` returns, and the one warning the store gave while it ran."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return result, messages


def assert_record(value, cls) -> None:
    assert type(value) is cls and dataclasses.is_dataclass(value), type(value)
    with pytest.raises(dataclasses.FrozenInstanceError):
        value.id = -1


# -- the protocol: every method, each backend ---------------------------------------------------
def test_store_implements_the_protocol_and_documents_its_rules():
    assert issubclass(Store, BaseStore) and not getattr(Store, "__abstractmethods__", set())
    rules = BaseStore.__doc__ or ""
    for rule in ("Records, not rows", "Transactions", "Threads and processes", "Idempotence", "Errors"):
        assert rule in rules, rule


def test_every_method_of_the_protocol_is_called_in_this_suite():
    source = Path(__file__).read_text()
    missing = sorted(m for m in BaseStore.__abstractmethods__ if m != "where" and f".{m}(" not in source)
    assert not missing, f"methods of BaseStore that no contract test calls: {missing}"


def test_identities_are_stable_and_shared(store, template, device):
    kv, dev = store.kernel_version_id(template), store.device_id(device)
    assert kv == store.kernel_version_id(template) and dev == store.device_id(device)
    [record] = store.devices()
    assert_record(record, DeviceRecord)
    assert (record.id, record.fingerprint, record.hardware_id) == (dev, device.fingerprint, device.hardware_id)
    assert store.find_device(device.hardware_id) == device and store.find_device(device.name) == device
    with pytest.raises(TunesvcError, match="No device 'nope'"):
        store.find_device("nope")
    assert store.where in (store.path, store.engine.url.render_as_string(hide_password=True))


def test_trials_are_stored_once_and_read_back_as_records(store, template, device):
    kv, dev = store.kernel_version_id(template), store.device_id(device)
    sweep = store.start_sweep(kv, dev, KEY, PROBLEM, "grid", 3, 0)
    first = store.add_trial(sweep, kv, dev, KEY, cfg(32), config_hash(cfg(32)), ok(2.0))
    assert_record(first, TrialRecord)
    assert store.add_trial(sweep, kv, dev, KEY, cfg(32), config_hash(cfg(32)), ok(1.0)) is None  # stored already
    ids = store.add_trials(
        sweep, kv, dev, KEY, [(cfg(64), config_hash(cfg(64)), ok(1.0)), (cfg(32), config_hash(cfg(32)), ok(9.0))]
    )
    assert ids[0] is not None and ids[1] is None
    trials = store.trials(kv, dev, KEY)
    assert [t.id for t in trials] == [first.id, ids[0]] and all(type(t) is TrialRecord for t in trials)
    assert trials[0].config == cfg(32) and trials[0].time_ms == 2.0 and trials[0].created_at is not None
    trials[0].config["BLOCK_M"] = 7  # a record's config is its own copy
    assert store.trials(kv, dev, KEY)[0].config == cfg(32)
    assert store.trial_count(kv, dev, KEY) == 2
    assert store.trials_per_key(template.name, template.version, device.hardware_id, [KEY, "M=1"]) == {KEY: 2, "M=1": 0}
    store.replace_measurements([(first.id, Measurement(Status.ERROR, message="gone")), (10**9, ok(1.0))])
    failed = store.trials(kv, dev, KEY)[0]
    assert (failed.status, failed.time_ms, failed.message) == ("error", None, "gone")
    # a budget holds however the batch is split
    assert store.add_trials(sweep, kv, dev, KEY, [(cfg(128), config_hash(cfg(128)), ok(3.0))], budget=2) == [None]
    assert store.trial_count(kv, dev, KEY) == 2


def test_winners_follow_the_fastest_correct_trial(store, template, device, swept):
    kv, dev, _ = swept
    winner = store.update_winner(kv, dev, KEY)
    assert_record(winner, WinnerRecord)
    assert (winner.config, winner.time_ms, winner.shape_key) == (cfg(32), 1.0, KEY)
    [entry] = store.winners(kernel=template.name)
    assert type(entry) is WinnerEntry and entry.config == cfg(32) and entry.hardware_id == device.hardware_id
    assert store.winners(kernel="nope") == [] and store.winners(shape="m=64") == [entry]
    [(with_device, stored)] = store.winners_with_devices(kernel=template.name)
    assert with_device == entry and stored == device
    trial = store.winner_trial(template.name, template.version, device, KEY)
    assert_record(trial, TrialRecord)
    assert (trial.id, trial.config, trial.time_ms, trial.spread) == (winner.trial_id, cfg(32), 1.0, 0.1)
    other_stack = dataclasses.replace(device, triton="0.0.1")  # the same GPU model, another software stack
    assert store.winner_trial(template.name, template.version, other_stack, KEY) is None
    assert store.winner_trial(template.name, "other-version", device, KEY) is None
    assert store.trial_counts(kernel=template.name) == {"ok": 3}
    assert store.swept_keys(kv, dev, "grid") == {KEY}
    history = store.history(template.name)
    assert len(history.trials) == 3 and list(history.winners) == [(kv, dev, KEY)]
    assert [s.problem for s in history.sweeps] == [PROBLEM] and history.sweeps[0].peer_ms == 0.5
    times = store.trial_times(template.name, template.version, device.hardware_id)
    assert times == {KEY: {config_hash(cfg(bm)): bm / 32 for bm in (32, 64, 128)}}
    # of some configs only, as the runtime reads a sibling's heuristic times: one query
    some = store.trial_times(template.name, template.version, device.hardware_id, hashes={config_hash(cfg(64)), "x"})
    assert some == {KEY: {config_hash(cfg(64)): 2.0}}
    assert store.trial_times(template.name, template.version, device.hardware_id, hashes=set()) == {}
    hashes = {config_hash(cfg(64)), "nope"}
    assert store.trial_configs(template.name, template.version, device.hardware_id, hashes) == {
        config_hash(cfg(64)): cfg(64)
    }
    store.replace_measurements([(winner.trial_id, Measurement(Status.WRONG_RESULT, message="wrong"))])
    assert store.update_winner(kv, dev, KEY).config == cfg(64)  # the winner follows its trial


def test_a_key_holds_a_graph_and_an_eager_winner_each_of_its_own_trials(store, template, device, swept):
    """Trials, budgets and winners are per timing: the same configs timed eagerly are trials of
    their own, and the key's eager winner stands beside its graph one."""
    kv, dev, _ = swept
    graph = store.update_winner(kv, dev, KEY)
    sweep = store.start_sweep(kv, dev, KEY, PROBLEM, "grid", 3, 0)
    measured = [(cfg(bm), config_hash(cfg(bm)), ok(ms)) for bm, ms in ((32, 3.0), (64, 2.5), (128, 4.0))]
    ids = store.add_trials(sweep, kv, dev, KEY, measured, budget=3, timing="eager")
    assert None not in ids  # not the graph trials' configs again: the timing is part of a trial's identity
    assert store.trial_count(kv, dev, KEY) == 3 and store.trial_count(kv, dev, KEY, timing="eager") == 3
    assert [t.timing for t in store.trials(kv, dev, KEY, timing="eager")] == ["eager"] * 3
    assert {t.timing for t in store.trials(kv, dev, KEY)} == {"graph"} and len(store.trials(kv, dev, KEY, None)) == 6
    eager = store.update_winner(kv, dev, KEY, timing="eager")
    assert (eager.config, eager.time_ms, eager.timing) == (cfg(64), 2.5, "eager")
    again = store.update_winner(kv, dev, KEY)
    assert (again.id, again.config, again.timing) == (graph.id, cfg(32), "graph") and again.id != eager.id
    assert [(w.config, w.timing) for w in store.winners(kernel=template.name)] == [(cfg(32), "graph")]
    both = store.winners(kernel=template.name, timing=None)
    assert sorted((w.timing, w.time_ms) for w in both) == [("eager", 2.5), ("graph", 1.0)]
    assert [w.timing for w, _ in store.winners_with_devices(template.name, timing="eager")] == ["eager"]
    assert store.winner_trial(template.name, template.version, device, KEY, timing="eager").time_ms == 2.5
    # an imported eager winner is compared with the eager one only
    merged = store.merge_winner(template.name, template.version, device, KEY, cfg(128), 2.0, "b.json", timing="eager")
    assert merged == ("replaced", 2.5)
    assert store.merge_winner(template.name, template.version, device, KEY, cfg(128), 2.0, "b.json") == ("kept", 1.0)
    history = store.history(template.name)  # `tune report` reads graph's
    assert len(history.trials) == 3 and list(history.winners) == [(kv, dev, KEY)]


def test_rejected_trials_count_the_wrong_results_of_each_kernel_version_and_device(store, template, device, swept):
    kv, dev, _ = swept
    trials = store.trials(kv, dev, KEY)
    said = "tensor argument 2 (c): relative error 0.5 > 0.0001 against the first valid config"
    store.replace_measurements(
        [(t.id, Measurement(Status.WRONG_RESULT, rel_error=0.5, message=said)) for t in trials[:2]]
    )
    [rejected] = store.rejected_trials(kernel=template.name, device=device.name.upper(), shape="m=64")
    assert type(rejected) is RejectedTrials
    where = (rejected.kernel, rejected.kernel_version, rejected.hardware_id, rejected.trials)
    assert where == (template.name, template.version, device.hardware_id, 3)
    assert rejected.wrong == {said: 2} and rejected.rejected == 2
    assert rejected.reasons() == [("tensor argument 2 (c)", 2, said)]
    assert store.rejected_trials(kernel="nope") == [] and store.rejected_trials(device="no such gpu") == []


def test_merge_winner_takes_only_a_faster_one(store, template, device, swept):
    assert store.merge_winner(template.name, template.version, device, KEY, cfg(64), 5.0, "b.json") == ("kept", 1.0)
    assert store.merge_winner(template.name, template.version, device, KEY, cfg(64), 0.5, "b.json") == (
        "replaced",
        1.0,
    )
    assert store.merge_winner(template.name, template.version, device, "M=1", cfg(64), 0.5, "b.json") == (
        "added",
        None,
    )
    assert {(w.shape_key, w.time_ms) for w in store.winners()} == {(KEY, 0.5), ("M=1", 0.5)}


def test_the_job_queue_gives_each_job_to_one_worker(store):
    assert store.add_job("b", "matmul", KEY, PROBLEM, "grid", 3, 0) is True
    assert store.add_job("b", "matmul", KEY, PROBLEM, "grid", 3, 0) is False  # idempotent
    assert store.add_job("b", "matmul", "M=1", {"M": 1}, "grid", 3, 0) is True
    peeked = store.peek_job("b", offset=5)
    assert type(peeked) is JobSpec and peeked.shape_key == "M=1"  # the last one when fewer are pending
    job = store.claim_job("b", "w1")
    assert type(job) is JobSpec and (job.shape_key, job.problem) == (KEY, PROBLEM)
    assert store.job_heartbeat(job.id, "w1") and not store.job_heartbeat(job.id, "w2")
    assert not store.finish_job(job.id, "w2") and store.finish_job(job.id, "w1", message="fine")
    second = store.claim_job("b", "w2")
    assert second.shape_key == "M=1" and store.claim_job("b", "w3") is None
    assert not store.release_job(second.id, "w1") and store.release_job(second.id, "w2")
    store.claim_job("b", "w4")
    raw(store, "UPDATE tunesvc_jobs SET heartbeat = 0 WHERE worker = 'w4'")
    assert store.release_stale_jobs("b", 60) == 1
    records = store.jobs("b")
    for record in records:
        assert_record(record, JobRecord)
    assert [(j.shape_key, j.status, j.attempts) for j in records] == [(KEY, "done", 1), ("M=1", "pending", 2)]


def test_misses_count_on_one_row(store, template, device):
    call = {"grids": [[1, 1, 1]], "args": []}
    store.record_miss(template, device, KEY, call)
    store.record_miss(template, device, KEY, {"other": 1})
    [miss] = store.misses()
    assert_record(miss, MissRecord)
    assert (miss.count, miss.call, miss.status) == (2, call, "open")
    store.set_miss_status(miss.id, "tuned")
    assert store.misses(status="open") == [] and store.misses(kernel=template.name)[0].status == "tuned"
    store.record_miss(template, device, KEY, call)  # met again: open again
    assert store.misses(hardware_id=device.hardware_id)[0].status == "open"


def test_recorded_calls_and_captured_kernels(store, device):
    kv, dev = store._kernel_version_id("mod:fn", "v1"), store.device_id(device)
    call = {"grids": [[4, 1, 1]], "args": [{"shape": [4]}]}
    sweep = store.start_sweep(kv, dev, "n=4", call, "capture", None, 0)
    store.finish_sweep(sweep, 0.1)
    assert store.captured_call("mod:fn", "n=4", device.hardware_id) == call
    assert store.captured_call("mod:fn", "n=5", device.hardware_id) is None
    assert store.captured_kernels() == ["mod:fn"] and store.captured_kernels("other:fn") == []


def test_selectors_are_kept_replaced_and_deleted(store, template, device):
    fitted = {"kernel": template.name, "tree": [[0, 1], [2]]}
    assert store.selector(template.name, template.version, device.hardware_id) is None
    store.save_selector(template, device.hardware_id, fitted, 3)
    assert store.merge_selector(template.name, template.version, device.hardware_id, {"x": 1}, 1) == "kept"
    assert store.merge_selector(template.name, template.version, "other|sm_00|1SM", {"x": 1}, 1) == "added"
    assert store.selector(template.name, template.version, device.hardware_id) == fitted
    assert store.delete_selector(template, device.hardware_id) is True
    assert store.delete_selector(template, device.hardware_id) is False
    assert store.selector(template.name, template.version, device.hardware_id) is None


def test_a_closed_store_leaves_its_records_usable(db_url, template, device):
    store = Store(db_url)
    kv, dev = store.kernel_version_id(template), store.device_id(device)
    sweep = store.start_sweep(kv, dev, KEY, PROBLEM, "grid", 3, 0)
    store.add_trials(sweep, kv, dev, KEY, [(cfg(32), config_hash(cfg(32)), ok(1.0))])
    trials, devices = store.trials(kv, dev, KEY), store.devices()
    store.close()
    assert trials[0].config == cfg(32) and devices[0].name == device.name


# -- rows damaged in the database: skipped, one warning each, never an exception ------------------
def test_a_winner_nested_deep_is_skipped_with_one_warning(store, template, device, swept):
    raw(store, f"UPDATE tunesvc_winners SET config = {json_param(store, 'c')}", c=deep_json(store))
    for read in (store.winners, store.winners_with_devices, lambda: store.history().winners):
        found, messages = skipped(read)
        assert len(found) == 0
        assert len(messages) <= 1  # one warning per row and store
    fresh = Store(store.url, readonly=True)
    try:
        found, messages = skipped(fresh.winners)
    finally:
        fresh.close()
    assert found == [] and len(messages) == 1, messages
    assert template.name in messages[0] and KEY in messages[0] and "nested over 64 deep" in messages[0]


def test_a_selector_or_recorded_call_nested_deep_reads_as_none(store, template, device):
    store.save_selector(template, device.hardware_id, {"tree": []}, 1)
    raw(store, f"UPDATE tunesvc_selectors SET selector = {json_param(store, 's')}", s=deep_json(store))
    found, messages = skipped(lambda: store.selector(template.name, template.version, device.hardware_id))
    assert found is None and len(messages) == 1 and "the selector of matmul" in messages[0]
    kv, dev = store._kernel_version_id("mod:fn", "v1"), store.device_id(device)
    store.finish_sweep(store.start_sweep(kv, dev, "n=4", {"grids": [[1]]}, "capture", None, 0), 0.1)
    store.record_miss(template, device, "n=4", {"grids": [[1]]})
    raw(store, f"UPDATE tunesvc_sweeps SET problem = {json_param(store, 'p')}", p=deep_json(store))
    raw(store, f"UPDATE tunesvc_misses SET call = {json_param(store, 'p')}", p=deep_json(store))
    found, messages = skipped(lambda: store.captured_call("mod:fn", "n=4", device.hardware_id))
    assert found is None and len(messages) == 1 and "n=4" in messages[0]
    found, messages = skipped(store.misses)
    assert found == [] and len(messages) == 1
    found, messages = skipped(store.history)
    assert found.sweeps == [] and len(messages) == 1


@pytest.mark.parametrize(
    ("column", "value", "why"),
    [
        ("shape_key", "M=²,N=45", "not ASCII"),
        ("shape_key", "M=١٢,N=45", "not ASCII"),
        ("shape_key", "M=64,N=45\x00", "NUL"),
        ("config", '{"BLOCK_M": [1, 2]}', "config is not one"),
        ("config", "{}", "config is not one"),
        ("config", "[1, 2]", "not a JSON object"),
        ("time_ms", "'NaN'", "not a finite positive number"),
        ("time_ms", "-1", "not a finite positive number"),
    ],
)
def test_a_winner_that_is_not_one_is_skipped(store, template, device, swept, column, value, why):
    if "\x00" in value and not store.is_sqlite:
        pytest.skip("PostgreSQL's text cannot hold NUL")
    if column == "config":
        raw(store, f"UPDATE tunesvc_winners SET config = {json_param(store, 'v')}", v=value)
    elif column == "shape_key":
        raw(store, "UPDATE tunesvc_winners SET shape_key = :v", v=value)
        raw(store, "UPDATE tunesvc_trials SET shape_key = :v", v=value)
    else:
        raw(store, f"UPDATE tunesvc_winners SET time_ms = {value}")
    found, messages = skipped(store.winners)
    assert found == [] and len(messages) == 1 and why in messages[0], messages
    if column == "shape_key":
        found, messages = skipped(lambda: store.trial_times(template.name, template.version, device.hardware_id))
        assert found == {} and len(messages) == 1


def test_a_damaged_trial_or_job_is_left_out(store, template, device, swept):
    kv, dev, _ = swept
    raw(store, f"UPDATE tunesvc_trials SET config = {json_param(store, 'v')} WHERE time_ms > 2", v=deep_json(store))
    found, messages = skipped(lambda: store.trials(kv, dev, KEY))
    assert [t.config for t in found] == [cfg(32), cfg(64)] and len(messages) == 1
    found, _ = skipped(lambda: store.trial_configs(template.name, template.version, device.hardware_id, {"x"}))
    assert found == {}
    store.add_job("b", "matmul", KEY, PROBLEM, "grid", 3, 0)
    store.add_job("b", "matmul", "M=1", {"M": 1}, "grid", 3, 0)
    raw(
        store,
        f"UPDATE tunesvc_jobs SET problem = {json_param(store, 'v')} WHERE shape_key = :k",
        v=deep_json(store),
        k=KEY,
    )
    claimed, messages = skipped(lambda: store.claim_job("b", "w"))
    assert claimed.shape_key == "M=1" and len(messages) == 1 and "nested over 64 deep" in messages[0]
    assert [(j.shape_key, j.status) for j in store.jobs("b")] == [("M=1", "running")]


# -- databases that are not what they should be: one sentence ------------------------------------
@pytest.mark.parametrize("table", ["tunesvc_winners", "tunesvc_misses"])
@pytest.mark.parametrize("how", ["dropped", "renamed"])
def test_tables_dropped_or_renamed_by_hand_are_one_sentence(store, swept, table, how):
    if how == "dropped":
        raw(store, f"DROP TABLE {table}{'' if store.is_sqlite else ' CASCADE'}")
    else:
        raw(store, f"ALTER TABLE {table} RENAME TO {table}_old")
    with pytest.raises(TunesvcError) as caught:
        store.winners()
        store.misses()
    message = str(caught.value)
    assert f"lacks table {table}" in message and "restore it from a copy" in message, message
    assert "\n" not in message and "ProgrammingError" not in message


def test_a_column_dropped_by_hand_is_one_sentence(store, swept):
    raw(store, "ALTER TABLE tunesvc_trials DROP COLUMN rel_error")
    with pytest.raises(TunesvcError, match=r"lacks column (tunesvc_trials\.)?rel_error"):
        store.trials(*swept[:2], KEY)


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
def test_a_path_that_is_not_a_regular_file_is_refused_before_it_is_opened(tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "fifo.db"
        os.mkfifo(path)
    elif kind == "socket":
        path = tmp_path / "s.db"
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    else:
        path = Path("/dev/null")
    for readonly in (True, False):
        with pytest.raises(TunesvcError, match="not a database file; name a database file instead"):
            Store(path, readonly=readonly)
    # the command line: one line, at once (opening the FIFO would wait for a writer forever)
    result = CliRunner().invoke(app, ["show", "--db", str(path)])
    assert result.exit_code != 0 and "not a database file" in result.output and "Traceback" not in result.output


def not_regular(tmp_path: Path, kind: str, suffix: str) -> Path:
    """A path of ``kind`` that is not a regular file (a FIFO, a link to one, a socket, a folder, a device)."""
    path = tmp_path / f"{kind}{suffix}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link-to-fifo":
        os.mkfifo(tmp_path / f"target{suffix}")
        path.symlink_to(tmp_path / f"target{suffix}")
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    elif kind == "folder":
        path.mkdir()
    else:
        path = Path("/dev/zero")
    return path


COMMANDS_WITH_DB = [
    ["show"],
    ["lookup", "matmul", "--shape", "64x45x29"],
    ["export", "--out", "{tmp}/out"],
    ["import", "{tmp}/nothing.json"],
    ["verify"],
    ["report", "--out", "{tmp}/report"],
    ["misses"],
    ["misses", "--tune", "--kernel", "mod:fn"],
    ["selector", "matmul"],
    ["evaluate", "matmul"],
    ["sweep", "matmul", "--shape", "8x8x8", "--budget", "1"],
    ["db", "init"],
    ["db", "upgrade"],
    ["db", "current"],
]


@pytest.mark.parametrize("kind", ["fifo", "link-to-fifo", "socket", "folder", "device"])
def test_every_command_and_the_runtime_refuse_a_db_that_is_not_a_regular_file(tmp_path, kind):
    path = not_regular(tmp_path, kind, ".db")
    for args in COMMANDS_WITH_DB:
        args = [a.format(tmp=tmp_path) for a in args]
        result = CliRunner().invoke(app, [*args, "--db", str(path)])
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 1 and len(lines) == 1, (args, result.output)
        assert "not a database file" in lines[0] or "is a directory" in lines[0], (args, result.output)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        answer = Runtime(db=path).lookup("matmul", M=64, N=45, K=29, dtype="float16")
    assert answer.source == "heuristic"
    assert any(str(path) in str(w.message) and "database file" in str(w.message) for w in caught), caught


@pytest.mark.parametrize("kind", ["fifo", "link-to-fifo", "socket", "device"])
def test_a_bundle_that_is_not_a_regular_file_is_refused_at_once(tmp_path, kind):
    """A FIFO named as a bundle waited forever for a writer, /dev/zero was read to 256 MiB:
    `tune import`, `tune lookup --bundle` and the runtime refuse either at once."""
    path = not_regular(tmp_path, kind, ".json")
    for args in (
        ["import", str(path), "--db", str(tmp_path / "target.db")],
        ["lookup", "matmul", "--shape", "64x45x29", "--bundle", str(path)],
    ):
        run = subprocess.run([sys.executable, "-m", "tunesvc", *args], capture_output=True, text=True, timeout=60)
        assert run.returncode == 1 and run.stderr.startswith("Error: "), (args, run.stderr)
        assert len(run.stderr.splitlines()) == 1 and str(path) in run.stderr, (args, run.stderr)
    assert not (tmp_path / "target.db").exists()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        answer = Runtime(bundle=path).lookup("matmul", M=64, N=45, K=29, dtype="float16")
    assert answer.source == "heuristic" and any(str(path) in str(w.message) for w in caught)


def test_a_selector_nested_deep_is_skipped_by_the_commands_and_a_users_lookup(tmp_path, template, device):
    db = tmp_path / "selector.db"
    store = Store(db)
    kv, dev = store.kernel_version_id(template), store.device_id(device)
    sweep = store.start_sweep(kv, dev, KEY, PROBLEM, "grid", 3, 0)
    store.add_trials(sweep, kv, dev, KEY, [(cfg(32), config_hash(cfg(32)), ok(1.0))])
    store.update_winner(kv, dev, KEY)
    store.save_selector(template, device.hardware_id, {"tree": []}, 1)
    raw(store, "UPDATE tunesvc_selectors SET selector = :s", s="[" * PG_DEEP + "]" * PG_DEEP)
    store.close()
    for args in (
        ["lookup", "matmul", "--shape", "128x45x29", "--db", str(db)],
        ["export", "--db", str(db), "--out", str(tmp_path / "b.json")],
        ["import", str(db), "--db", str(tmp_path / "target.db")],
    ):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
        assert "Traceback" not in result.output and "RecursionError" not in result.output
        assert "skipped the selector of matmul" in result.output and "nested over 64 deep" in result.output
    assert "selector" not in json.loads((tmp_path / "b.json").read_text())["kernels"]["matmul"]
    program = tmp_path / "user.py"
    program.write_text("import tunesvc\nprint(tunesvc.lookup('matmul', M=128, N=45, K=29, dtype='float16').source)\n")
    run = subprocess.run(
        [sys.executable, str(program)],
        capture_output=True,
        text=True,
        env={**os.environ, "TUNESVC_DB": str(db), "TRITON_INTERPRET": "1"},
        timeout=300,
    )
    assert run.returncode == 0 and run.stdout.strip() == "nearest", run.stderr
    assert "skipped the selector of matmul" in run.stderr and "Traceback" not in run.stderr


def test_a_stored_key_with_a_dim_of_zero_is_never_the_nearest(tmp_path, template, device):
    """log2(0) raised ValueError (math domain error) in `tune lookup` and in a user's lookup;
    `tune verify` stopped at that key."""
    db = tmp_path / "zero.db"
    store = Store(db)
    kv, dev = store.kernel_version_id(template), store.device_id(device)
    key = "M=0,N=45,K=29,dtype=float16"
    sweep = store.start_sweep(kv, dev, key, PROBLEM, "grid", 3, 0)
    store.add_trials(sweep, kv, dev, key, [(cfg(32), config_hash(cfg(32)), ok(1.0))])
    store.update_winner(kv, dev, key)
    store.close()
    result = CliRunner().invoke(app, ["lookup", "matmul", "--shape", "128x45x29", "--db", str(db)])
    assert result.exit_code == 0 and "heuristic" in result.output, result.output
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert Runtime(db=db).lookup("matmul", M=128, N=45, K=29, dtype="float16").source == "heuristic"
    assert ShapeKey.parse(key).distance(ShapeKey.parse("M=128,N=45,K=29,dtype=float16")) == math.inf
    # tune verify says why it cannot judge that winner, and goes on
    result = CliRunner().invoke(app, ["verify", "--db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    [verdict] = json.loads(result.output)
    assert verdict["flags"] == ["not-measured"] and "names no problem" in verdict["detail"], verdict


def test_a_digit_that_is_not_ascii_is_never_read_as_a_number():
    """str.isdigit accepts '²' and '١', which int() refuses or reads as another number."""
    for key_text in ("M=²,N=4", "M=١٢,N=4", "M=１２,N=4"):
        parsed = ShapeKey.parse(key_text)
        assert parsed.dims == (("N", 4),) and dict(parsed.fields)["M"] == key_text[2:].split(",")[0]
    assert natural_order("M=١٢") == ((0, "M=١٢"),)


# -- through the command line and the import, on real SQLite files -------------------------------
@pytest.fixture
def damaged(tmp_path, template, device):
    """A SQLite database whose one winner's config is nested DEEP, beside a good winner."""
    db = tmp_path / "damaged.db"
    store = Store(db)
    kv, dev = store.kernel_version_id(template), store.device_id(device)
    for key in (KEY, "M=128,N=45,K=29,dtype=float16"):
        sweep = store.start_sweep(kv, dev, key, PROBLEM, "grid", 3, 0)
        store.add_trials(sweep, kv, dev, key, [(cfg(32), config_hash(cfg(32)), ok(1.0))])
        store.update_winner(kv, dev, key)
    raw(store, "UPDATE tunesvc_winners SET config = :c WHERE shape_key = :k", c=deep_json(store), k=KEY)
    store.close()
    return db


@pytest.mark.parametrize(
    "args",
    [
        ["show"],
        ["show", "--json"],
        ["lookup", "matmul", "--shape", "64x45x29"],
        ["export", "--out", "{tmp}/out.json"],
        ["report", "--out", "{tmp}/r.html"],
        ["import", "{db}", "--db", "{tmp}/target.db"],
    ],
)
def test_commands_skip_a_damaged_winner_with_one_line(damaged, tmp_path, args):
    args = [a.format(tmp=tmp_path, db=damaged) for a in args]
    if "--db" not in args:
        args += ["--db", str(damaged)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "RecursionError" not in result.output
    if args[0] == "export":
        bundle = json.loads((tmp_path / "out.json").read_text())
        assert list(bundle["kernels"]["matmul"]["winners"]) == ["M=128,N=45,K=29,dtype=float16"]


def test_import_refuses_a_bundle_key_with_unicode_digits_and_skips_such_a_database_row(tmp_path, damaged):
    out = tmp_path / "b.json"
    assert CliRunner().invoke(app, ["export", "--db", str(damaged), "--out", str(out)]).exit_code == 0
    bundle = json.loads(out.read_text())
    winners = bundle["kernels"]["matmul"]["winners"]
    winners["M=²,N=45"] = next(iter(winners.values()))
    out.write_text(json.dumps(bundle))
    target = Store(tmp_path / "target.db")
    try:
        with pytest.raises(TunesvcError, match=re.escape("M=²,N=45: shape key holds a digit that is not ASCII")):
            import_sources(target, [out])
        del winners["M=²,N=45"]
        winners["M=64\x00,N=45"] = next(iter(winners.values()))
        nul = tmp_path / "nul.json"
        nul.write_text(json.dumps(bundle))
        with pytest.raises(TunesvcError, match="shape key holds a NUL character"):
            import_sources(target, [nul])
        assert target.winners() == []  # nothing written
        with Store(damaged).session() as session:
            session.execute(text("UPDATE tunesvc_winners SET shape_key = 'M=²' WHERE shape_key != :k"), {"k": KEY})
        imported, messages = skipped(lambda: import_sources(target, [damaged]))
        assert imported.winners == [] and len(messages) == 2, messages  # the deep one and the ² one
    finally:
        target.close()


def test_every_table_of_the_schema_is_read_by_the_suite():
    """A new table must get its contract tests (and its row checks) here."""
    source = Path(__file__).read_text()
    tables = {t for t in Base.metadata.tables if t != "tunesvc_meta"}
    assert tables == {
        "tunesvc_devices",
        "tunesvc_kernel_versions",
        "tunesvc_sweeps",
        "tunesvc_trials",
        "tunesvc_winners",
        "tunesvc_jobs",
        "tunesvc_misses",
        "tunesvc_selectors",
    }
    assert all(t in source for t in tables - {"tunesvc_devices", "tunesvc_kernel_versions"})


def test_sibling_winners_are_those_of_gpu_models_of_the_same_capability_and_sm_count(store, template):
    import dataclasses

    from _devices import H100 as h100
    from _devices import H200 as h200

    pcie = dataclasses.replace(h100, name="NVIDIA H100 PCIe", sm_count=114)
    for device, bm in ((h100, 32), (pcie, 64)):
        store.merge_winner(template.name, template.version, device, KEY, cfg(bm), 0.1, "test")
    [entry] = store.sibling_winners(template.name, template.version, h200)
    assert type(entry) is WinnerEntry and entry.hardware_id == h100.hardware_id and entry.config == cfg(32)
    assert store.sibling_winners(template.name, template.version, h100) == []  # its own are not siblings'
    assert store.sibling_winners(template.name, "other", h200) == []


@pytest.mark.parametrize(
    "args", [["show"], ["lookup", "matmul", "--shape", "128x45x29"], ["export", "--out", "{tmp}/o.json"]]
)
def test_text_that_is_not_utf8_skips_its_row_not_the_command(damaged, tmp_path, args):
    """Another program wrote bytes that are not UTF-8 into a winner's shape key: that row is
    skipped with one warning, the other winner is still shown, looked up and exported."""
    connection = sqlite3.connect(damaged)
    with connection:  # the deep winner made readable again, then its key made of bytes that are not UTF-8
        connection.execute(
            "UPDATE tunesvc_winners SET config = '{}', shape_key = CAST(X'4d3d3634ff2c4e3d3435' AS TEXT) WHERE shape_key = ?",
            (KEY,),
        )
    connection.close()
    args = [a.format(tmp=tmp_path) for a in args] + ["--db", str(damaged)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "decode" not in result.output
    assert "M=64\ufffd,N=45" in result.output  # the warning names the row it skipped
    if args[0] == "export":
        bundle = json.loads((tmp_path / "o.json").read_text())
        assert list(bundle["kernels"]["matmul"]["winners"]) == ["M=128,N=45,K=29,dtype=float16"]
    elif args[0] == "show":
        assert "128" in result.output
