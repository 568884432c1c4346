"""The winner sources' contract: a database and the bundle exported from it (``tune export``)
give the same winners, selector and sibling's winners, directly (:class:`DatabaseSource`,
:class:`BundleSource`) and through the runtime (``Runtime(db=...)``, ``Runtime(bundle=...)``).

Run over both sources from one database: the same config and source (exact, nearest, heuristic)
for tuned keys, keys between them and keys only another device or another kernel version tuned;
winners of other devices and other kernel versions are never served; a damaged entry is skipped
with one warning (an unreadable source: every key falls back), never raised in lookup mode.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from _devices import H100
from _devices import H200
from sqlalchemy import text
from typer.testing import CliRunner

from tunesvc import Runtime
from tunesvc import Status
from tunesvc import config_hash
from tunesvc.bench import Measurement
from tunesvc.bundle import bundle_filename
from tunesvc.cli import app
from tunesvc.errors import TunesvcError
from tunesvc.serving.selector import Selector
from tunesvc.serving.source import BundleSource
from tunesvc.serving.source import DatabaseSource
from tunesvc.serving.source import WinnerSource
from tunesvc.store import Store

BASE = {
    "VARIANT": "grouped",
    "BLOCK_M": 16,
    "BLOCK_N": 32,
    "BLOCK_K": 32,
    "GROUP_M": 1,
    "SPLIT_K": 1,
    "FLATTEN": 0,
    "SUBTILE": 0,
    "num_warps": 4,
    "num_stages": 2,
}
#: this device's winners, problem -> config
TUNED = [
    ({"M": 16, "N": 32, "K": 32, "dtype": "float16"}, {**BASE}),
    ({"M": 64, "N": 64, "K": 64, "dtype": "float16"}, {**BASE, "BLOCK_M": 32, "num_warps": 8}),
    ({"M": 256, "N": 128, "K": 64, "dtype": "float16"}, {**BASE, "BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 3}),
    ({"M": 16, "N": 32, "K": 32, "dtype": "float32"}, {**BASE, "BLOCK_K": 64}),
]
#: tuned only on another device (an H100), or only by another version of the kernel
OTHER_DEVICE = ({"M": 1024, "N": 1024, "K": 1024, "dtype": "float16"}, {**BASE, "BLOCK_M": 128})
OTHER_VERSION = ({"M": 512, "N": 512, "K": 512, "dtype": "float16"}, {**BASE, "BLOCK_M": 256})
OLD_VERSION = "000000000000"
#: problems looked up: the tuned ones, others in their buckets, between them, and the ones only others tuned
LOOKUPS = [
    *(problem for problem, _ in TUNED),
    {"M": 9, "N": 32, "K": 32, "dtype": "float16"},
    {"M": 100, "N": 64, "K": 64, "dtype": "float16"},
    {"M": 3000, "N": 128, "K": 64, "dtype": "float16"},
    {"M": 16, "N": 32, "K": 32, "dtype": "bfloat16"},
    OTHER_DEVICE[0],
    OTHER_VERSION[0],
]
SOURCES = ("db", "bundle")


def store_winner(store: Store, kv: int, dev: int, key: str, problem: dict, config: dict, ms: float = 1.0) -> None:
    sweep = store.start_sweep(kv, dev, key, problem, "grid", 1, 0)
    ok = Measurement(Status.OK, time_ms=ms, spread=0.01, reps=3, rel_error=0.0)
    store.add_trials(sweep, kv, dev, key, [(config, config_hash(config), ok)])
    store.update_winner(kv, dev, key)
    store.finish_sweep(sweep, 0.1)


def key_of(template, problem: dict) -> str:
    return str(template.key(template.problem(**problem)))


def build(db: str, template, device, extra: list[tuple[dict, dict]] = ()) -> None:  # type: ignore[assignment]
    """This device's winners (and ``extra``), an H100's, and an older kernel version's, stored first."""
    store = Store(db)
    try:
        old = store._kernel_version_id(template.name, OLD_VERSION)
        kv, dev, h100 = store.kernel_version_id(template), store.device_id(device), store.device_id(H100)
        problem, config = OTHER_VERSION
        store_winner(store, old, dev, key_of(template, problem), problem, config)
        for problem, config in [*TUNED, *extra]:
            store_winner(store, kv, dev, key_of(template, problem), problem, config)
        problem, config = OTHER_DEVICE
        store_winner(store, kv, h100, key_of(template, problem), problem, config)
    finally:
        store.close()


def export(db: str, out: Path, device) -> Path:
    """The bundle of ``device``, written by the CLI's export into folder ``out``."""
    result = CliRunner().invoke(app, ["export", "--out", str(out), "--db", db])
    assert result.exit_code == 0, result.output
    return out / bundle_filename(device.hardware_id)


def runtimes(db: str, bundle: Path) -> dict[str, Runtime]:
    return {"db": Runtime(db=db), "bundle": Runtime(bundle=bundle)}


def answers(runtime: Runtime) -> list[dict]:
    return [runtime.lookup("matmul", **problem).to_dict() for problem in LOOKUPS]


def quiet_answers(runtime: Runtime) -> tuple[list[dict], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = answers(runtime)
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return result, [m for m in said if "no tuned config" not in m]  # a miss's own note is not about the source


@pytest.fixture
def sources(tmp_path, template, device) -> dict[str, Runtime]:
    db = str(tmp_path / "tuned.db")
    build(db, template, device)
    return runtimes(db, export(db, tmp_path / "bundles", device))


# -- the sources themselves ------------------------------------------------------------------
def one_leaf_selector(template, device, candidate: dict) -> dict:
    """A selector's JSON that ranks ``candidate`` first for every problem (a tree of one leaf)."""
    selector = Selector(
        kernel=template.name,
        version=template.version,
        hardware_id=device.hardware_id,
        features=("M",),
        candidates=(candidate,),
        feature=(-2,),
        threshold=(-2.0,),
        left=(-1,),
        right=(-1,),
        leaves=((0,),),
        keys=len(TUNED),
        lo=(-1e30,),
        hi=(1e30,),
    )
    return selector.to_dict()


def direct_sources(tmp_path, template, device, extra=(), selector: dict | None = None) -> dict[str, WinnerSource]:
    """A database source and one of the bundle exported from it, for ``device``."""
    db = str(tmp_path / "tuned.db")
    build(db, template, device, extra=list(extra))
    if selector is not None:
        store = Store(db)
        try:
            store.save_selector(template, device.hardware_id, selector, len(TUNED))
        finally:
            store.close()
    return {"db": DatabaseSource(db, device), "bundle": BundleSource(export(db, tmp_path / "bundles", device), device)}


def test_both_sources_give_this_models_winners_of_the_current_version_in_its_space(tmp_path, template, device):
    tuned = {key_of(template, problem): template.space.with_defaults(config) for problem, config in TUNED}
    for name, source in direct_sources(tmp_path, template, device).items():
        winners = source.winners(template)
        assert winners.table == tuned, name  # not the H100's, nor the older version's
        assert winners.outside == () and (winners.model, winners.hardware_id) == (device.name, device.hardware_id)
        assert not set(source.stored(template.name, OLD_VERSION)) & set(tuned), name
        assert source.selector(template) is None, name  # none fitted
        assert source.sibling(template) is None, name  # the interpreter has no siblings
        assert source.where() == f"{name.replace('db', 'database')} {Path(source.location).resolve()}"


def test_both_sources_name_the_winners_outside_the_space_and_leave_them_out(tmp_path, template, device):
    problem = {"M": 32, "N": 32, "K": 32, "dtype": "float16"}
    outside = {**BASE, "BLOCK_M": 24}  # not one of BLOCK_M's choices
    found = {}
    for name, source in direct_sources(tmp_path, template, device, extra=[(problem, outside)]).items():
        found[name] = winners = source.winners(template)
        assert [key for key, _ in winners.outside] == [key_of(template, problem)], name
        assert "BLOCK_M=24 is not one of its choices" in winners.outside[0][1]
        assert key_of(template, problem) not in winners.table and len(winners.table) == len(TUNED)
    assert found["db"] == found["bundle"]


def test_both_sources_give_the_same_selector(tmp_path, template, device):
    candidate = template.space.with_defaults(TUNED[1][1])
    selectors = {
        name: source.selector(template)
        for name, source in direct_sources(
            tmp_path, template, device, selector=one_leaf_selector(template, device, candidate)
        ).items()
    }
    assert selectors["db"] is not None and selectors["db"].candidates == (candidate,)
    assert selectors["db"] == selectors["bundle"]


def test_a_selector_with_a_candidate_outside_the_space_is_an_error_of_both(tmp_path, template, device):
    fitted = one_leaf_selector(template, device, {**BASE, "BLOCK_M": 24})
    for name, source in direct_sources(tmp_path, template, device, selector=fitted).items():
        with pytest.raises(TunesvcError, match="has a candidate outside the space"):
            source.selector(template)
        assert source.winners(template).table, name  # the winners are still given


def test_both_sources_give_a_sibling_models_winners_only_to_a_sibling(tmp_path, template, device):
    db = str(tmp_path / "tuned.db")
    build(db, template, device)  # holds an H100's winner of OTHER_DEVICE's key
    problem, config = OTHER_DEVICE
    key = key_of(template, problem)
    heuristic = template.heuristic(template.problem(**problem), H200)
    assert heuristic != config
    store = Store(db)
    try:  # the heuristic's config timed beside the winner on the H100: the evidence for a blind transfer
        kv, h100_id = store.kernel_version_id(template), store.device_id(H100)
        sweep = store.start_sweep(kv, h100_id, key, problem, "grid", 1, 0)
        ok = Measurement(Status.OK, time_ms=1.5, spread=0.01, reps=3, rel_error=0.0)
        store.add_trials(sweep, kv, h100_id, key, [(heuristic, config_hash(heuristic), ok)])
    finally:
        store.close()
    h100 = export(db, tmp_path / "bundles", H100)
    on_h200 = {"db": DatabaseSource(db, H200), "bundle": BundleSource(h100, H100).on(H200)}
    for name, source in on_h200.items():
        assert source.winners(template).table == {}, name  # never the H100's as the H200's own
        sibling = source.sibling(template)
        assert sibling is not None, name
        assert sibling.table == {key_of(template, problem): template.space.with_defaults(config)}
        assert (sibling.model, sibling.hardware_id) == (H100.name, H100.hardware_id)
        assert sibling.sibling() is not None and sibling.sibling().name == H100.name
        assert (sibling.winner_ms, sibling.heuristic_ms) == ({key: 1.0}, {key: 1.5}), name
        assert source.on(device).sibling(template) is None, name  # the interpreter has none
    assert BundleSource(h100, H100).winners(template).table == {key_of(template, problem): config}


def test_an_unreadable_source_raises_and_a_missing_database_holds_nothing(tmp_path, template, device, monkeypatch):
    path = tmp_path / "garbage"
    path.write_bytes(b"\x00not a database nor a bundle\xff" * 10)
    for source in (DatabaseSource(str(path), device), BundleSource(path, device)):
        with pytest.raises(TunesvcError, match=str(path)):
            source.winners(template)
    unread = BundleSource(path, device)
    with pytest.raises(TunesvcError):
        unread.winners(template)
    assert unread.selector(template) is None and unread.sibling(template) is None  # said once, with the winners
    missing = tmp_path / "missing.db"
    with pytest.raises(TunesvcError, match="No database at"):
        DatabaseSource(str(missing), device).winners(template)
    created_later = DatabaseSource(str(missing), device, absent_is_empty=True)  # mode 'tune'
    assert created_later.winners(template).table == {} and created_later.selector(template) is None
    monkeypatch.chdir(tmp_path)  # no ./tune.db here
    default = DatabaseSource(None, device)
    assert default.winners(template).table == {} and default.sibling(template) is None
    assert default.where().startswith(f"no database: {tmp_path / 'tune.db'} does not exist")
    assert not missing.exists()


def test_an_open_store_is_read_and_left_open(tmp_path, template, device):
    db = str(tmp_path / "tuned.db")
    build(db, template, device)
    store = Store(db, readonly=True)
    try:
        source = DatabaseSource(store, device)
        assert source.winners(template).table == DatabaseSource(db, device).winners(template).table
        assert source.where() == f"database {Path(db).resolve()}"
        assert len(store.winners(kernel=template.name)) == len(TUNED) + 2  # still open
    finally:
        store.close()


def test_a_bundle_is_served_without_sqlalchemy(tmp_path, template, device):
    """A deployment that ships a bundle: its winners, selector and sibling read with json only."""
    db = str(tmp_path / "tuned.db")
    build(db, template, device)
    bundle = export(db, tmp_path / "bundles", device)
    problem = TUNED[0][0]
    code = (
        "import sys, tunesvc\n"
        f"runtime = tunesvc.Runtime(bundle={str(bundle)!r})\n"
        f"assert runtime.lookup('matmul', **{problem!r}).source == 'exact'\n"
        "assert runtime.lookup('matmul', M=3000, N=3000, K=3000, dtype='float16').source != 'exact'\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy'))\n"
    )
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- the same answers -------------------------------------------------------------------------
def test_database_and_its_bundle_give_the_same_answers(sources, template):
    by_source = {name: answers(runtime) for name, runtime in sources.items()}
    assert by_source["db"] == by_source["bundle"]
    for (problem, config), answer in zip(TUNED, by_source["db"]):
        assert answer["source"] == "exact" and answer["config"] == template.space.with_defaults(config), problem
    assert {a["source"] for a in by_source["db"]} >= {"exact", "nearest"}
    assert sorted(sources["db"].tuned_keys("matmul")) == sorted(sources["bundle"].tuned_keys("matmul"))


@pytest.mark.parametrize("source", SOURCES)
def test_other_devices_and_kernel_versions_are_never_served(sources, source, template):
    runtime = sources[source]
    tuned = {key_of(template, problem) for problem, _ in TUNED}
    assert set(runtime.tuned_keys("matmul")) == tuned
    for problem, config in (OTHER_DEVICE, OTHER_VERSION):
        result = runtime.lookup("matmul", **problem)
        assert result.source != "exact" and result.matched_key != key_of(template, problem)
        assert result.config != template.space.with_defaults(config)


def test_a_source_of_another_device_only_serves_heuristics(tmp_path, template, device):
    """The H100's bundle and the database read on this device: neither holds a winner for it."""
    db = str(tmp_path / "h100.db")
    store = Store(db)
    try:
        kv, h100 = store.kernel_version_id(template), store.device_id(H100)
        for problem, config in TUNED:
            store_winner(store, kv, h100, key_of(template, problem), problem, config)
    finally:
        store.close()
    bundle = export(db, tmp_path / "bundles", H100)
    for name, runtime in runtimes(db, bundle).items():
        assert runtime.tuned_keys("matmul") == [], name
        assert {a["source"] for a in answers(runtime)} == {"heuristic"}, name


# -- damaged entries --------------------------------------------------------------------------
def test_a_winner_outside_the_space_is_skipped_alike_with_one_warning(tmp_path, template, device):
    problem = {"M": 32, "N": 32, "K": 32, "dtype": "float16"}
    outside = {**BASE, "BLOCK_M": 24}  # not one of BLOCK_M's choices
    db = str(tmp_path / "damaged.db")
    build(db, template, device, extra=[(problem, outside)])
    by_source = {}
    for name, runtime in runtimes(db, export(db, tmp_path / "bundles", device)).items():
        by_source[name], messages = quiet_answers(runtime)
        assert len(messages) == 1 and "outside its space" in messages[0], (name, messages)
        assert key_of(template, problem) not in runtime.tuned_keys("matmul")
        assert runtime.lookup("matmul", **problem).config != template.space.with_defaults(outside)
    assert by_source["db"] == by_source["bundle"]
    assert [a["source"] for a in by_source["db"][: len(TUNED)]] == ["exact"] * len(TUNED)  # the rest still served


def test_a_damaged_database_row_is_skipped_with_a_warning(tmp_path, template, device):
    db = str(tmp_path / "damaged.db")
    build(db, template, device)
    bundle = export(db, tmp_path / "bundles", device)  # exported before the damage
    store = Store(db)
    try:
        with store.session() as session:
            session.execute(
                text("UPDATE tunesvc_winners SET config = '[1, 2' WHERE shape_key = :key"),
                {"key": key_of(template, TUNED[0][0])},
            )
    finally:
        store.close()
    got, messages = quiet_answers(Runtime(db=db))
    assert messages, "a damaged row is said"
    assert got[0]["source"] != "exact"  # the damaged key falls back
    assert [a["source"] for a in got[1 : len(TUNED)]] == ["exact"] * (len(TUNED) - 1)  # the rest still served
    assert answers(Runtime(bundle=bundle))[0]["source"] == "exact"


def test_a_damaged_bundle_serves_heuristics_with_one_warning(tmp_path, template, device):
    db = str(tmp_path / "tuned.db")
    build(db, template, device)
    bundle = export(db, tmp_path / "bundles", device)
    data = json.loads(bundle.read_text())
    first = next(iter(data["kernels"]["matmul"]["winners"].values()))
    first["config"] = "0" * 32  # names a config the bundle lacks
    bundle.write_text(json.dumps(data))
    got, messages = quiet_answers(Runtime(bundle=bundle))
    assert len(messages) == 1 and "damaged bundle" in messages[0], messages
    assert {a["source"] for a in got} == {"heuristic"}


@pytest.mark.parametrize("source", SOURCES)
def test_an_unreadable_source_is_a_warning_in_lookup_mode(tmp_path, source):
    path = tmp_path / ("garbage.db" if source == "db" else "garbage.json")
    path.write_bytes(b"\x00not a database nor a bundle\xff" * 10)
    runtime = Runtime(**{source: str(path)})
    got, messages = quiet_answers(runtime)
    assert messages and all(str(path) in m for m in messages), messages  # the winners' and the selector's
    assert {a["source"] for a in got} == {"heuristic"}
