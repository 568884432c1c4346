"""Transferred answers: a sibling GPU model's winners (same capability and SM count) serve a model
with no answer of its own, reported as such, never stored as its own, switchable off.

The devices are fabricated GPU fingerprints (the interpreter has no siblings): lookups only read
winners and check configs against a device's limits, so nothing here launches on them.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3

import pytest
from _devices import H100
from _devices import H200
from typer.testing import CliRunner

import tunesvc
import tunesvc.store._store
from tunesvc import Runtime
from tunesvc.bundle import build_bundles
from tunesvc.bundle import write_bundles
from tunesvc.cli import app
from tunesvc.device import Device
from tunesvc.store import Store
from tunesvc.tuning.selector_fit import untuned_answer
from tunesvc.tuning.sweep import run_sweep
from tunesvc.tuning.sweep import sibling_warm_start

pytestmark = pytest.mark.filterwarnings("ignore:tunesvc. no tuned config:RuntimeWarning")

#: the same name's sibling rule cuts both ways: another SM count or architecture is no sibling
H100_PCIE = dataclasses.replace(H100, name="NVIDIA H100 PCIe", sm_count=114)
OTHER_ARCH = dataclasses.replace(H100, name="NVIDIA L40S", capability="8.9")

TUNED = {"M": 512, "N": 512, "K": 512, "dtype": "bfloat16"}
TUNED_KEY = "M=512,N=512,K=512,dtype=bfloat16"
#: one doubling of M away from the tuned key
NEAR = {**TUNED, "M": 1024}
#: a config of the space that is not the heuristic's for TUNED on the H200
WINNER = {
    "VARIANT": "grouped",
    "BLOCK_M": 64,
    "BLOCK_N": 64,
    "BLOCK_K": 64,
    "GROUP_M": 8,
    "SPLIT_K": 1,
    "num_warps": 4,
    "num_stages": 3,
}


def _add(db: str, device: Device, key: str, config: dict, template=None) -> None:
    template = template or tunesvc.get_template("matmul")
    store = Store(db)
    try:
        store.merge_winner(template.name, template.version, device, key, config, 0.1, "test")
    finally:
        store.close()


def _rows(db: str) -> dict[str, list]:
    with sqlite3.connect(db) as con:
        return {
            table: sorted(con.execute(f"select * from {table}").fetchall())
            for table in ("tunesvc_devices", "tunesvc_winners", "tunesvc_trials", "tunesvc_sweeps")
        }


@pytest.fixture
def sibling_db(tmp_db, template):
    """A database whose only winner is the H100's of TUNED_KEY."""
    assert template.heuristic(template.problem(**TUNED), H200) != WINNER
    assert template.violations(WINNER, template.problem(**TUNED), H200) == []
    _add(tmp_db, H100, TUNED_KEY, WINNER)
    return tmp_db


def test_a_sibling_models_winner_is_served_as_transferred(sibling_db):
    runtime = Runtime(db=sibling_db, device=H200)
    with pytest.warns(RuntimeWarning, match="using the transferred one, from NVIDIA H100 80GB HBM3"):
        result = runtime.lookup("matmul", **TUNED)
    assert result.source == "transferred"
    assert result.config == WINNER
    assert result.transferred_from == H100.name
    assert result.key == result.matched_key == TUNED_KEY and result.distance == 0.0
    assert result.to_dict()["transferred_from"] == H100.name
    near = runtime.lookup("matmul", **NEAR)  # the sibling's nearest tuned key, as the nearest rule measures it
    assert (near.source, near.matched_key, near.distance) == ("transferred", TUNED_KEY, 1.0)
    assert runtime.stats() == {"matmul": {"transferred": 2}}


@pytest.mark.parametrize("device", [H100_PCIE, OTHER_ARCH], ids=["another SM count", "another architecture"])
def test_no_transfer_between_models_of_another_sm_count_or_architecture(sibling_db, template, device):
    result = Runtime(db=sibling_db, device=device).lookup("matmul", **TUNED)
    assert result.source == "heuristic" and result.transferred_from is None
    assert result.config == template.heuristic(template.problem(**TUNED), device)


def test_the_interpreter_has_no_siblings(tmp_db, device):
    """A fabricated GPU of the interpreter's capability and core count is still not its sibling."""
    twin = dataclasses.replace(device, kind="cuda", name="a GPU like the interpreter")
    _add(tmp_db, twin, TUNED_KEY, WINNER)
    assert Runtime(db=tmp_db).lookup("matmul", **TUNED).source == "heuristic"


def test_transfer_is_switchable_off(sibling_db, monkeypatch):
    assert Runtime(db=sibling_db, device=H200, transfer=False).lookup("matmul", **TUNED).source == "heuristic"
    monkeypatch.setenv("TUNESVC_TRANSFER", "0")
    assert Runtime(db=sibling_db, device=H200).lookup("matmul", **TUNED).source == "heuristic"
    # the argument wins over the environment
    assert Runtime(db=sibling_db, device=H200, transfer=True).lookup("matmul", **TUNED).source == "transferred"
    assert Runtime(db=sibling_db, device=H200, mode="heuristic").lookup("matmul", **TUNED).source == "heuristic"


def test_nothing_is_written_for_the_device_served(sibling_db):
    before = _rows(sibling_db)
    runtime = Runtime(db=sibling_db, device=H200)
    assert runtime.lookup("matmul", **TUNED).source == "transferred"
    assert runtime.lookup("matmul", **NEAR).source == "transferred"
    assert _rows(sibling_db) == before
    store = Store(sibling_db, readonly=True)
    try:
        assert [d.name for d in store.devices()] == [H100.name]
        assert store.winners(hardware_id=H200.hardware_id) == []
    finally:
        store.close()


def test_the_models_own_answers_come_first(sibling_db, template):
    """exact -> predicted -> nearest -> transferred -> heuristic: a measurement on this model, even
    of a neighbouring key, before the same key's on another model."""
    own = {**WINNER, "num_stages": 2}
    _add(sibling_db, H200, "M=2048,N=512,K=512,dtype=bfloat16", own)
    runtime = Runtime(db=sibling_db, device=H200)
    nearest = runtime.lookup("matmul", **TUNED)
    assert (nearest.source, nearest.config, nearest.transferred_from) == ("nearest", own, None)
    _add(sibling_db, H200, TUNED_KEY, own)
    assert Runtime(db=sibling_db, device=H200).lookup("matmul", **TUNED).source == "exact"
    # another dtype: no key of the H200's is comparable, the H100's float16 winner is
    _add(sibling_db, H100, "M=512,N=512,K=512,dtype=float16", WINNER)
    half = Runtime(db=sibling_db, device=H200).lookup("matmul", **{**TUNED, "dtype": "float16"})
    assert (half.source, half.distance) == ("transferred", 0.0)


def test_a_sibling_config_that_does_not_fit_is_skipped(sibling_db, template):
    # 64x64x64 tiles in 3 stages of bf16 ask for 49,152 bytes of shared memory
    small = dataclasses.replace(H200, max_shared_memory=40_000)
    assert template.violations(WINNER, template.problem(**TUNED), small)
    assert Runtime(db=sibling_db, device=small).lookup("matmul", **TUNED).source == "heuristic"
    # a farther key whose winner fits answers instead of the exact key's that does not
    fits = {**WINNER, "num_stages": 2}
    _add(sibling_db, H100, "M=4096,N=512,K=512,dtype=bfloat16", fits)
    result = Runtime(db=sibling_db, device=small).lookup("matmul", **TUNED)
    assert (result.source, result.matched_key, result.config) == (
        "transferred",
        "M=4096,N=512,K=512,dtype=bfloat16",
        fits,
    )
    # a tile taller than the problem (tile_m): the same key's stored 128-row tile does not fit M=9
    # (a key of M=16, where the stored config is damaged), the next key's 16-row tile does
    _add(
        sibling_db, H100, "M=16,N=512,K=512,dtype=bfloat16", {**WINNER, "BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8}
    )
    _add(sibling_db, H100, "M=32,N=512,K=512,dtype=bfloat16", {**WINNER, "BLOCK_M": 16, "GROUP_M": 1})
    problem = {**TUNED, "M": 9}
    assert template.violations(WINNER, template.problem(**problem), H200)  # nor the 64-row tiles farther off
    skinny = Runtime(db=sibling_db, device=H200).lookup("matmul", **problem)
    assert (skinny.source, skinny.matched_key, skinny.distance) == (
        "transferred",
        "M=32,N=512,K=512,dtype=bfloat16",
        1.0,
    )
    assert skinny.config == {**WINNER, "BLOCK_M": 16, "GROUP_M": 1}


def test_a_stored_config_outside_the_space_is_never_transferred(sibling_db):
    _add(sibling_db, H100, "M=1024,N=512,K=512,dtype=bfloat16", {**WINNER, "BLOCK_M": 10**6})
    runtime = Runtime(db=sibling_db, device=H200)
    with pytest.warns(RuntimeWarning, match="outside its space"):
        result = runtime.lookup("matmul", **NEAR)
    assert (result.source, result.matched_key, result.config) == ("transferred", TUNED_KEY, WINNER)


def test_of_several_siblings_the_one_with_most_keys_answers_then_by_name(sibling_db):
    other = dataclasses.replace(H100, name="NVIDIA GH200 480GB")  # sm_90, 132 SMs
    another = {**WINNER, "num_stages": 4}
    _add(sibling_db, other, TUNED_KEY, another)
    # one key each: the names decide, in sorted order
    tie = Runtime(db=sibling_db, device=H200).lookup("matmul", **TUNED)
    assert (tie.transferred_from, tie.config) == (other.name, another)
    # the H100 now has two keys of matmul: it answers every key, the one the GH200 has too
    _add(sibling_db, H100, "M=64,N=512,K=512,dtype=bfloat16", WINNER)
    most = Runtime(db=sibling_db, device=H200).lookup("matmul", **TUNED)
    assert (most.transferred_from, most.config) == (H100.name, WINNER)


def test_a_bundle_of_a_sibling_model_serves_transferred(sibling_db, tmp_path):
    store = Store(sibling_db, readonly=True)
    try:
        [path] = write_bundles(build_bundles(store), tmp_path / "h100.json")
    finally:
        store.close()
    result = Runtime(bundle=path, device=H200).lookup("matmul", **TUNED)
    assert (result.source, result.config, result.transferred_from) == ("transferred", WINNER, H100.name)
    assert Runtime(bundle=path, device=H100).lookup("matmul", **TUNED).source == "exact"
    assert Runtime(bundle=path, device=H100_PCIE).lookup("matmul", **TUNED).source == "heuristic"
    assert Runtime(bundle=path, device=H200, transfer=False).lookup("matmul", **TUNED).source == "heuristic"
    data = json.loads(path.read_text())
    data["kernels"]["matmul"]["version"] = "000000000000"  # an edited kernel's: not its winners
    path.write_text(json.dumps(data))
    assert Runtime(bundle=path, device=H200).lookup("matmul", **TUNED).source == "heuristic"


def test_tune_lookup_says_transferred_and_from_which_device(sibling_db):
    store = Store(sibling_db)
    try:
        store.device_id(H200)  # `tune lookup --device` answers for a device the database knows
    finally:
        store.close()
    args = ["lookup", "matmul", "--shape", "512x512x512", "--dtype", "bfloat16", "--db", sibling_db]
    result = CliRunner().invoke(app, [*args, "--device", H200.name])
    assert result.exit_code == 0, result.output
    assert f"answer  transferred for {H200.name}: {H100.name}'s winner of the same key" in result.stdout
    data = json.loads(CliRunner().invoke(app, [*args, "--device", H200.name, "--json"]).stdout)
    assert (data["source"], data["transferred_from"], data["config"]) == ("transferred", H100.name, WINNER)


def test_a_sweep_on_the_new_model_measures_the_siblings_winner_first(sibling_db, template, device, monkeypatch):
    problem = template.problem(**TUNED)
    store = Store(sibling_db)
    try:
        assert sibling_warm_start(store, template, H200, TUNED_KEY) == [WINNER]
        assert sibling_warm_start(store, template, H100_PCIE, TUNED_KEY) == []
        assert untuned_answer(store, template, problem, H200) == ("transferred", WINNER)
        assert untuned_answer(store, template, problem, H200, transfer=False)[0] == "heuristic"
    finally:
        store.close()
    # a one-trial sweep in the interpreter, whose store answers as it would for the H200: the one
    # config measured is the sibling's winner, stored as this device's trial and winner only
    read = tunesvc.store._store.Store.sibling_winners
    monkeypatch.setattr(
        tunesvc.store._store.Store,
        "sibling_winners",
        lambda self, kernel, version, _: read(self, kernel, version, H200),
    )
    small = template.problem(**{**TUNED, "M": 16, "N": 32, "K": 32})
    key = str(template.key(small))
    fits = {**WINNER, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1}
    assert fits != template.heuristic(small, device) and template.violations(fits, small, device) == []
    _add(sibling_db, H100, key, fits)
    store = Store(sibling_db)
    try:
        [result] = run_sweep(template, [small], store, budget=1, refit_selector=False)
        trials = store.trials(store.kernel_version_id(template), store.device_id(device), key)
    finally:
        store.close()
    assert [t.config for t in trials] == [fits]
    assert result.winner == fits


def test_a_captured_kernel_walks_the_same_chain(tmp_db):
    """A captured kernel (its problem a key's text, its space its config list) is answered by the
    one chain as a shipped kernel is: exact, nearest, then a sibling model's winner, then its
    first listed config; the sibling's winner is never this model's own."""
    import triton

    from tunesvc._capture import CapturedTemplate
    from tunesvc._capture import config_dict

    configs = [triton.Config({"BLOCK": 32}, num_warps=4), triton.Config({"BLOCK": 128}, num_warps=8)]
    captured = CapturedTemplate("lib.ops:_scale", "v1", configs)
    first, second = (config_dict(c) for c in configs)
    h100_key, h200_key = "n=1000,x.dtype=float16", "n=64,x.dtype=float16"
    _add(tmp_db, H100, h100_key, second, captured)
    _add(tmp_db, H200, h200_key, first, captured)

    def answer(key: str, device=H200, **kwargs):
        return Runtime(db=tmp_db, device=device, mode="lookup", **kwargs).answer(captured, {"key": key}, said=False)

    assert (answer(h200_key).source, answer(h200_key).config) == ("exact", first)
    near = answer("n=100,x.dtype=float16")  # this model's own neighbour first
    assert (near.source, near.matched_key, near.config) == ("nearest", h200_key, first)
    moved = answer("n=1000,x.dtype=bfloat16")  # no key of this dtype here: the sibling has none either
    assert (moved.source, moved.config) == ("heuristic", first)
    _add(tmp_db, H100, "n=1000,x.dtype=bfloat16", second, captured)
    moved = answer("n=1000,x.dtype=bfloat16")
    assert (moved.source, moved.config, moved.transferred_from) == ("transferred", second, H100.name)
    assert answer("n=1000,x.dtype=bfloat16", transfer=False).source == "heuristic"
    # the H100's winner was read, never stored as the H200's
    assert Runtime(db=tmp_db, device=H200).tuned_keys(captured) == [h200_key]
    # a key whose fields are not the stored keys' is no neighbour of them
    assert answer("n=1000,flag=True,x.dtype=float16").source == "heuristic"


def _captured(db: str, device: Device, key: str, config: dict, kernel: str = "lib.ops:_scale") -> None:
    """A winner of a captured kernel on ``device``, stored as capture stores it (a sweep of strategy 'capture')."""
    from tunesvc.bench import Measurement
    from tunesvc.bench import Status
    from tunesvc.space import config_hash

    store = Store(db)
    try:
        kv, dev = store._kernel_version_id(kernel, "v1"), store.device_id(device)
        sweep = store.start_sweep(kv, dev, key, {}, "capture", None, 0)
        store.add_trial(sweep, kv, dev, key, config, config_hash(config), Measurement(Status.OK, time_ms=0.5, reps=1))
        store.update_winner(kv, dev, key)
    finally:
        store.close()


def test_tune_lookup_of_a_captured_kernel_says_transferred_as_the_runtime_serves_it(tmp_db):
    """`tune lookup module:qualname` walks the one chain too: a key the H200 has no winner for (nor
    a neighbour of) is answered with the H100's winner, named as such; never with it as its own."""
    winner = {"BLOCK": 128, "num_warps": 8}
    _captured(tmp_db, H100, "n=1000,x.dtype=float16", winner)
    store = Store(tmp_db)
    try:
        store.device_id(H200)  # `tune lookup --device` answers for a device the database knows
    finally:
        store.close()
    args = ["lookup", "lib.ops:_scale", "--shape", "n=1000,x.dtype=float16", "--db", tmp_db, "--device", H200.name]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"answer  transferred for {H200.name}: {H100.name}'s winner of the same key" in result.stdout
    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert (data["source"], data["transferred_from"], data["config"]) == ("transferred", H100.name, winner)
    near = json.loads(CliRunner().invoke(app, [*args[:3], "n=2000,x.dtype=float16", *args[4:], "--json"]).stdout)
    assert (near["source"], near["matched_key"], near["config"]) == ("transferred", "n=1000,x.dtype=float16", winner)
    own = json.loads(CliRunner().invoke(app, [*args[:-2], "--device", H100.name, "--json"]).stdout)
    assert (own["source"], own["transferred_from"]) == ("exact", None)
    off = CliRunner().invoke(app, [*args, "--json"], env={"TUNESVC_TRANSFER": "0"})
    assert json.loads(off.stdout)["source"] == "first listed config"


def test_tune_lookup_of_a_captured_kernel_in_a_sibling_models_bundle_is_transferred(tmp_db, tmp_path, monkeypatch):
    import tunesvc.device

    winner = {"BLOCK": 64, "num_warps": 4}
    _captured(tmp_db, H100, "n=1000,x.dtype=float16", winner)
    store = Store(tmp_db, readonly=True)
    try:
        [path] = write_bundles(build_bundles(store), tmp_path / "h100.json")
    finally:
        store.close()
    monkeypatch.setattr(tunesvc.device, "current_device", lambda: H200)  # run on the H100's sibling
    args = ["lookup", "lib.ops:_scale", "--shape", "n=1000,x.dtype=float16", "--bundle", str(path), "--json"]
    data = json.loads(CliRunner().invoke(app, args).stdout)
    assert (data["source"], data["transferred_from"], data["config"]) == ("transferred", H100.name, winner)
    monkeypatch.setattr(tunesvc.device, "current_device", lambda: H100_PCIE)  # another SM count: no sibling
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and "Traceback" not in result.output
