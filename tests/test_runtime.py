"""Runtime lookup: exact -> nearest -> heuristic, from a database or an exported bundle."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sqlite3
import threading

import pytest
import torch
from _forks import exit_status_within

import tunesvc
import tunesvc.kernels
import tunesvc.serving.runtime
from tunesvc import Runtime
from tunesvc import TunesvcError
from tunesvc.bundle import build_bundles
from tunesvc.bundle import bundle_filename
from tunesvc.bundle import import_sources
from tunesvc.bundle import read_bundle
from tunesvc.bundle import write_bundles
from tunesvc.space import config_hash
from tunesvc.store import Store
from tunesvc.template import Template
from tunesvc.tuning.sweep import run_sweep

TUNED = {"M": 16, "N": 32, "K": 32, "dtype": "float16"}
TUNED_KEY = "M=16,N=32,K=32,dtype=float16"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A database with one tuned key (a 3-trial grid sweep) and its winner config."""
    db = str(tmp_path_factory.mktemp("tuned") / "tuned.db")
    template = tunesvc.get_template("matmul")
    store = Store(db)
    try:
        [result] = run_sweep(template, [template.problem(**TUNED)], store, budget=3)
        [winner] = store.winners()
    finally:
        store.close()
    assert result.shape_key == TUNED_KEY
    return db, winner.config


@pytest.fixture
def tuned_db(tuned, tmp_db):
    """A private copy of the tuned database at tmp_db."""
    shutil.copy(tuned[0], tmp_db)
    return tmp_db


@pytest.fixture
def winner(tuned):
    return tuned[1]


def test_the_nearest_rule_measures_keys_with_the_templates_distance(tuned_db, template, monkeypatch):
    monkeypatch.setattr(type(template), "key_distance", lambda self, a, b: math.inf)
    result = Runtime(db=tuned_db).lookup("matmul", M=100, N=32, K=32, dtype="float16")
    assert result.source == "heuristic"  # no tuned key is comparable, so none is nearest


def test_exact_for_the_same_m_bucket(tuned_db, winner, template):
    runtime = Runtime(db=tuned_db)
    for m in (9, 16):  # both bucket to M=16
        result = runtime.lookup("matmul", M=m, N=32, K=32, dtype="float16")
        assert result.source == "exact"
        assert result.config == winner
        assert result.key == TUNED_KEY and result.matched_key == TUNED_KEY
        assert result.distance == 0.0
    # a Template object works as well as a name; a torch dtype as well as a string
    assert runtime.lookup(template, M=16, N=32, K=32, dtype=torch.float16).source == "exact"
    assert runtime.counters[("matmul", "exact")] == 3


def test_nearest_for_another_m_bucket(tuned_db, winner, template, device):
    runtime = Runtime(db=tuned_db)
    result = runtime.lookup("matmul", M=100, N=32, K=32, dtype="float16")
    assert result.source == "nearest"
    assert result.key == "M=128,N=32,K=32,dtype=float16"
    assert result.matched_key == TUNED_KEY
    assert result.distance == pytest.approx(3.0)  # log2(128 / 16)
    assert result.config == winner
    assert template.violations(result.config, template.problem(M=100, N=32, K=32), device) == []
    assert runtime.counters[("matmul", "nearest")] == 1


def test_heuristic_for_another_dtype(tuned_db, template, device):
    runtime = Runtime(db=tuned_db)
    result = runtime.lookup("matmul", M=16, N=32, K=32, dtype="float32")
    assert result.source == "heuristic"
    assert result.matched_key is None and result.distance is None
    assert result.config == template.heuristic(template.problem(M=16, N=32, K=32, dtype="float32"), device)
    assert runtime.counters[("matmul", "heuristic")] == 1
    assert runtime.counters[("matmul", "exact")] == 0


def test_lookup_validates_the_problem(tuned_db):
    runtime = Runtime(db=tuned_db)
    with pytest.raises(TunesvcError, match="M=0 is impossible"):
        runtime.lookup("matmul", M=0, N=32, K=32)
    with pytest.raises(TunesvcError, match="Unknown kernel"):
        runtime.lookup("conv", M=1, N=32, K=32)


def test_config_for_memoises(tuned_db, winner, template):
    runtime = Runtime(db=tuned_db)
    first = runtime.config_for(template, M=16, N=32, K=32, dtype=torch.float16)
    second = runtime.config_for(template, M=16, N=32, K=32, dtype=torch.float16)
    assert first == winner
    assert second is first
    assert runtime.counters[("matmul", "exact")] == 1  # the second call never reached lookup()
    runtime.config_for(template, M=16, N=32, K=32, dtype=torch.float32)
    assert runtime.counters[("matmul", "heuristic")] == 1


def test_lookup_memo_serves_repeats_and_resolves_other_orders_alike(tuned_db, winner):
    runtime = Runtime(db=tuned_db)
    first = runtime.lookup("matmul", M=16, N=32, K=32, dtype="float16")
    assert runtime.lookup("matmul", M=16, N=32, K=32, dtype="float16") is first
    reordered = runtime.lookup("matmul", K=32, N=32, M=16, dtype="float16")
    assert reordered == first and reordered.config == winner
    # the repeat was a memo hit; the same problem in another order is its own entry
    assert runtime.counters[("matmul", "exact")] == 2


def test_kernel_launch_memo_checks_each_new_shape_once(tuned_db, winner):
    runtime = tunesvc.configure(db=tuned_db)
    a = torch.randn(16, 32, dtype=torch.float16)
    b = torch.randn(32, 32, dtype=torch.float16)
    for _ in range(3):
        tunesvc.kernels.matmul(a, b)
    assert list(runtime.launch_configs.values()) == [winner]
    assert runtime.counters[("matmul", "exact")] == 1
    # shapes or dtypes never seen miss the memo, so they are checked like on a first call
    with pytest.raises(ValueError, match="matmul needs A"):
        tunesvc.kernels.matmul(a, torch.randn(16, 32, dtype=torch.float16))
    with pytest.raises(ValueError, match="one dtype"):
        tunesvc.kernels.matmul(a, b.float())
    assert len(runtime.launch_configs) == 1
    assert tunesvc.configure(db=tuned_db).launch_configs == {}  # a new runtime remembers nothing


def test_winners_are_loaded_once(tuned_db, winner, tmp_path):
    runtime = Runtime(db=tuned_db)
    assert runtime.lookup("matmul", **TUNED).source == "exact"
    # the table is cached: the database may go away after the first lookup
    shutil.move(tuned_db, tmp_path / "moved.db")
    assert runtime.lookup("matmul", **TUNED).config == winner


def test_configure_then_kernel_call(tuned_db, winner):
    runtime = tunesvc.configure(db=tuned_db)
    assert tunesvc.serving.runtime.default_runtime() is runtime
    a = torch.randn(16, 32, dtype=torch.float16)
    b = torch.randn(32, 32, dtype=torch.float16)
    out = tunesvc.kernels.matmul(a, b)
    ref = a.double() @ b.double()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 5e-3
    assert runtime.counters[("matmul", "exact")] == 1
    assert tunesvc.lookup("matmul", **TUNED).config == winner


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_fork_while_another_thread_holds_the_runtimes_locks_leaves_the_child_launching(
    tuned_db, winner, template, monkeypatch
):
    """A thread inside a lookup at a fork (holding the runtime's lock, and on Python 3.11 the
    lock functools.cached_property computes a template's version under): the child's first
    launch of a kernel it has not looked up yet takes the same locks, and must not wait for
    ever on a thread the child does not have."""
    runtime = tunesvc.configure(db=tuned_db)
    monkeypatch.delitem(vars(template), "version", raising=False)  # the child computes it
    cached = [getattr(vars(Template)[name], "lock", None) for name in ("version", "space")]  # none from 3.12
    locks = [runtime._lock, *(lock for lock in cached if lock is not None)]
    held, forked = threading.Event(), threading.Event()

    def hold() -> None:
        with contextlib.ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            held.set()
            forked.wait(60)

    holder = threading.Thread(target=hold, name="lookup")
    holder.start()
    assert held.wait(60)
    a = torch.randn(16, 32, dtype=torch.float16)
    b = torch.randn(32, 32, dtype=torch.float16)
    # the reference before the fork: torch's own CPU matmul can hang in a forked child once the
    # parent has used its thread pool (with or without tunesvc), which is not what this tests
    ref = a.double() @ b.double()
    pid = os.fork()
    if pid == 0:  # the child: a launch of the tuned kernel, served its stored winner
        code = 3
        try:
            out = tunesvc.kernels.matmul(a, b)
            right = ((out.double() - ref).norm() / ref.norm()).item() < 5e-3
            code = 0 if right and runtime.lookup("matmul", **TUNED).config == winner else 1
        finally:
            os._exit(code)
    forked.set()
    holder.join(60)
    assert exit_status_within(pid, 60) == 0, "the child hung at its first launch, or computed a wrong answer"


def test_configure_rejects_db_and_bundle(tuned_db):
    with pytest.raises(TunesvcError, match="not both"):
        tunesvc.configure(db=tuned_db, bundle="b.json")


def test_no_db_and_no_tune_db_gives_heuristic(tmp_path, template, device):
    runtime = Runtime()
    result = runtime.lookup("matmul", **TUNED)
    assert result.source == "heuristic"
    assert result.config == template.heuristic(template.problem(**TUNED), device)
    assert list(tmp_path.iterdir()) == []  # nothing created
    assert tunesvc.lookup("matmul", **TUNED).source == "heuristic"


def test_tune_db_in_cwd_is_used(tuned, tmp_path, winner):
    shutil.copy(tuned[0], tmp_path / "tune.db")
    result = Runtime().lookup("matmul", **TUNED)
    assert result.source == "exact" and result.config == winner


def test_tunesvc_db_env(tuned_db, monkeypatch, winner):
    monkeypatch.setenv("TUNESVC_DB", tuned_db)
    assert Runtime().lookup("matmul", **TUNED).config == winner


def test_explicit_missing_db_is_an_error_when_strict(tmp_path):
    with pytest.raises(TunesvcError, match="No database at"):
        Runtime(db=str(tmp_path / "missing.db"), strict=True).lookup("matmul", **TUNED)
    assert not (tmp_path / "missing.db").exists()


def test_explicit_missing_db_falls_back_to_heuristics_and_says_so(tmp_path):
    # a serving process must keep running: one warning, then heuristic configs
    runtime = Runtime(db=str(tmp_path / "missing.db"))
    with pytest.warns(RuntimeWarning, match="No database at"):
        assert runtime.lookup("matmul", **TUNED).source == "heuristic"
    assert not (tmp_path / "missing.db").exists()


def test_other_kernel_version_is_not_used(tuned_db):
    # an edited kernel (another module source) must not reuse the old winners
    con = sqlite3.connect(tuned_db)
    con.execute("update tunesvc_kernel_versions set version = 'aaaaaaaaaaaa'")
    con.commit()
    con.close()
    assert Runtime(db=tuned_db).lookup("matmul", **TUNED).source == "heuristic"


# -- bundles ----------------------------------------------------------------------------------------
@pytest.fixture
def bundle_file(tuned_db, tmp_path):
    store = Store(tuned_db, readonly=True)
    try:
        bundles = build_bundles(store)
    finally:
        store.close()
    [path] = write_bundles(bundles, tmp_path / "bundle.json")
    return path


def test_bundle_gives_the_same_exact_config(bundle_file, tuned_db, winner, device):
    data = read_bundle(bundle_file)
    assert data["format"] == "tunesvc-bundle" and data["format_version"] == 2
    assert data["device"]["hardware_id"] == device.hardware_id
    section = data["kernels"]["matmul"]
    assert section["configs"][section["winners"][TUNED_KEY]["config"]] == winner
    from_bundle = Runtime(bundle=bundle_file).lookup("matmul", **TUNED)
    from_db = Runtime(db=tuned_db).lookup("matmul", **TUNED)
    assert from_bundle.source == from_db.source == "exact"
    assert from_bundle.config == from_db.config == winner
    near = Runtime(bundle=bundle_file).lookup("matmul", M=100, N=32, K=32)
    assert near.source == "nearest" and near.matched_key == TUNED_KEY


def test_bundle_file_is_deterministic_json(bundle_file, tuned_db, tmp_path):
    store = Store(tuned_db, readonly=True)
    try:
        [again] = write_bundles(build_bundles(store), tmp_path / "again.json")
    finally:
        store.close()
    assert again.read_text() == bundle_file.read_text()
    assert bundle_file.read_text().endswith("\n")


def test_bundle_folder_output(tuned_db, tmp_path, device):
    store = Store(tuned_db, readonly=True)
    try:
        [path] = write_bundles(build_bundles(store, kernel="matmul"), tmp_path / "out")
    finally:
        store.close()
    assert path == tmp_path / "out" / bundle_filename(device.hardware_id)
    assert path.suffix == ".json" and "|" not in path.name
    assert read_bundle(path)["kernels"]["matmul"]["winners"]


def test_bundle_env_var(bundle_file, monkeypatch, winner):
    monkeypatch.setenv("TUNESVC_BUNDLE", str(bundle_file))
    assert Runtime().lookup("matmul", **TUNED).config == winner


def test_bundle_of_another_device_or_version_is_ignored(bundle_file, tmp_path):
    data = json.loads(bundle_file.read_text())
    other_device = dict(data, device={**data["device"], "hardware_id": "NVIDIA H100|sm_90|132SM"})
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(other_device))
    assert Runtime(bundle=path).lookup("matmul", **TUNED).source == "heuristic"
    old = json.loads(bundle_file.read_text())
    old["kernels"]["matmul"]["version"] = "000000000000"
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert Runtime(bundle=path).lookup("matmul", **TUNED).source == "heuristic"


def test_export_with_no_winners(tmp_db, tmp_path):
    Store(tmp_db).close()
    store = Store(tmp_db, readonly=True)
    try:
        with pytest.raises(TunesvcError, match="Nothing to export"):
            write_bundles(build_bundles(store), tmp_path / "b.json")
    finally:
        store.close()
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        ('{"format": "tunesvc-bundle", "format_version": 1, ', "is not valid JSON"),
        ("\xff\xfe garbage", "is not valid JSON"),
        ("[1, 2, 3]", "is not a tunesvc bundle"),
        ('{"format": "something-else", "format_version": 1}', "is not a tunesvc bundle"),
        ('{"format": "tunesvc-bundle", "format_version": 3}', "has bundle format 3, this tunesvc reads 1 and 2"),
    ],
)
def test_read_bundle_rejects(tmp_path, content, pattern):
    path = tmp_path / "bad.json"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(TunesvcError, match=pattern) as info:
        read_bundle(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    _corrupt_bundle_is_an_error_or_a_warned_fallback(path)


def _corrupt_bundle_is_an_error_or_a_warned_fallback(path):
    # strict (the CLI): one clear error; a serving process: one warning, then heuristics
    with pytest.raises(TunesvcError):
        Runtime(bundle=path, strict=True).lookup("matmul", **TUNED)
    runtime = Runtime(bundle=path)
    with pytest.warns(RuntimeWarning, match=str(path)):
        assert runtime.lookup("matmul", **TUNED).source == "heuristic"


def test_read_bundle_missing_file(tmp_path):
    with pytest.raises(TunesvcError, match="No bundle at"):
        read_bundle(tmp_path / "nope.json")


@pytest.mark.parametrize(
    "content",
    [
        {"format": "tunesvc-bundle", "format_version": 1},
        {"format": "tunesvc-bundle", "format_version": 1, "device": {}, "kernels": {}},
        {"format": "tunesvc-bundle", "format_version": 1, "device": "x", "kernels": []},
    ],
    ids=["no-sections", "empty-device", "wrong-types"],
)
def test_structurally_broken_bundle_is_one_clear_error(tmp_path, content):
    # a truncated or hand-edited bundle must not escape as KeyError/TypeError
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(content))
    _corrupt_bundle_is_an_error_or_a_warned_fallback(path)


def test_bundle_writes_each_config_once_and_winners_name_it(tuned_db, winner, template, device, tmp_path):
    store = Store(tuned_db)
    try:
        store.merge_winner(
            "matmul", template.version, device, "M=32,N=32,K=32,dtype=float16", dict(winner), 1.0, "test"
        )
        [path] = write_bundles(build_bundles(store), tmp_path / "bundle.json")
    finally:
        store.close()
    section = read_bundle(path)["kernels"]["matmul"]
    assert section["configs"] == {config_hash(winner): winner}
    assert [w["config"] for w in section["winners"].values()] == [config_hash(winner)] * 2
    runtime = Runtime(bundle=path)
    assert runtime.lookup("matmul", M=32, N=32, K=32).config == winner
    assert runtime.lookup("matmul", **TUNED).config == winner


def _as_format_1(data):
    """A format-2 bundle as format 1 wrote it: each winner's config inline, no configs section."""
    for section in data["kernels"].values():
        configs = section.pop("configs")
        for winner in section["winners"].values():
            winner["config"] = configs[winner["config"]]
    return dict(data, format_version=1)


def test_format_1_bundle_is_still_read(bundle_file, tmp_path, winner):
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(_as_format_1(json.loads(bundle_file.read_text()))))
    assert Runtime(bundle=path).lookup("matmul", **TUNED).config == winner
    store = Store(str(tmp_path / "target.db"))
    try:
        [change] = import_sources(store, [path]).winners
    finally:
        store.close()
    assert (change.action, change.shape_key, change.config) == ("added", TUNED_KEY, winner)


@pytest.mark.parametrize(
    "damage",
    [
        lambda s: s["winners"][TUNED_KEY].update(config="0" * 16),  # names a config that is not there
        lambda s: s.pop("configs"),
        lambda s: s["configs"].update({k: {"BLOCK_M": [64]} for k in s["configs"]}),  # a value of a wrong type
        lambda s: s["winners"].update({TUNED_KEY: "M=16"}),
    ],
    ids=["unknown-config", "no-configs", "bad-value", "winner-not-an-object"],
)
def test_damaged_format_2_section_is_one_clear_error(bundle_file, tmp_path, damage):
    data = json.loads(bundle_file.read_text())
    damage(data["kernels"]["matmul"])
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(data))
    with pytest.raises(
        TunesvcError, match=r"is a damaged bundle \(a winner of kernels.matmul has no valid config: "
    ) as info:
        read_bundle(path)
    assert "\n" not in str(info.value)
    _corrupt_bundle_is_an_error_or_a_warned_fallback(path)


def test_runtime_checks_only_the_sections_it_loads(bundle_file, tmp_path, winner):
    # another kernel's damaged section does not keep the runtime from matmul's winners,
    # but `tune import` (which reads every section) refuses the file
    data = json.loads(bundle_file.read_text())
    data["kernels"]["softmax"] = {
        "version": "x",
        "configs": {},
        "winners": {"M=1,N=1,dtype=float16": {"config": "nope"}},
    }
    path = tmp_path / "partly-damaged.json"
    path.write_text(json.dumps(data))
    assert Runtime(bundle=path, strict=True).lookup("matmul", **TUNED).config == winner
    with pytest.raises(TunesvcError, match="kernels.softmax"):
        read_bundle(path)


def test_each_gpu_model_of_a_process_gets_its_own_winners(tuned_db, winner, template, device, monkeypatch):
    """A process driving two GPU models: lookups follow the CUDA device (index 0 here is the
    device the database was tuned on, index 1 another model with no winners of its own)."""
    import dataclasses

    other = dataclasses.replace(device, name=f"other {device.name}", sm_count=device.sm_count + 1)
    assert other.hardware_id != device.hardware_id
    monkeypatch.setattr(tunesvc.serving.runtime, "device_at", lambda index: (device, other)[index])
    current = [0]  # what torch.cuda.current_device() would say
    monkeypatch.setattr(tunesvc.serving.runtime, "_device_index_reader", lambda given: lambda: current[0])
    runtime = Runtime(db=tuned_db)

    assert runtime.lookup("matmul", **TUNED).source == "exact"
    assert runtime.config_for(template, **{**TUNED, "dtype": torch.float16}) == winner
    current[0] = 1
    result = runtime.lookup("matmul", **TUNED)
    assert result.source == "heuristic"
    assert result.config == template.heuristic(template.problem(**TUNED), other)
    assert runtime.lookup_on(0, "matmul", **TUNED).source == "exact"  # by a tensor's device index
    assert runtime.stats()["matmul"] == {"exact": 2, "heuristic": 1}  # a Template is its own memo entry
