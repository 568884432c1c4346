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
    "FLATTEN": 0,
    "SUBTILE": 0,
    "num_warps": 4,
    "num_stages": 3,
}


def _add(
    db: str,
    device: Device,
    key: str,
    config: dict,
    template=None,
    heuristic_ms: float | None = 0.2,
    heuristic_of: Device = H200,
) -> None:
    """``config`` as ``device``'s winner of ``key`` at 0.1 ms, and (``heuristic_ms`` not None) a
    trial beside it of the heuristic's config of ``key`` on ``heuristic_of`` (the model served):
    the evidence a transfer needs."""
    template = template or tunesvc.get_template("matmul")
    store = Store(db)
    try:
        store.merge_winner(template.name, template.version, device, key, config, 0.1, "test")
        if heuristic_ms is not None:
            _time_heuristic(store, template, device, key, heuristic_ms, heuristic_of)
    finally:
        store.close()


def _time_heuristic(store: Store, template, device: Device, key: str, ms: float, heuristic_of: Device) -> None:
    """A trial on ``device`` at ``ms`` of the heuristic's config of ``key`` on ``heuristic_of``, as a sweep stores it."""
    from tunesvc.bench import Measurement
    from tunesvc.bench import Status
    from tunesvc.space import config_hash

    config = template.heuristic(template.problem_of_key(key), heuristic_of)
    kv, dev = store._kernel_version_id(template.name, template.version), store.device_id(device)
    sweep = store.start_sweep(kv, dev, key, {}, "grid", None, 0)
    store.add_trial(sweep, kv, dev, key, config, config_hash(config), Measurement(Status.OK, time_ms=ms, reps=1))


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
    assert result.reason == (
        f"transferred: the {H100.name} winner of {TUNED_KEY} (distance 0.00) ran 2.00x faster than the "
        "heuristic there (at least 1.20x)."
    )
    assert result.to_dict()["reason"] == result.reason
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
    _add(sibling_db, H100, "M=1024,N=512,K=512,dtype=bfloat16", fits, heuristic_of=small)
    result = Runtime(db=sibling_db, device=small).lookup("matmul", **TUNED)
    assert (result.source, result.matched_key, result.config) == (
        "transferred",
        "M=1024,N=512,K=512,dtype=bfloat16",
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
    assert f"why     transferred: the {H100.name} winner of {TUNED_KEY} (distance 0.00) ran 2.00x faster" in (
        result.stdout
    )
    data = json.loads(CliRunner().invoke(app, [*args, "--device", H200.name, "--json"]).stdout)
    assert (data["source"], data["transferred_from"], data["config"]) == ("transferred", H100.name, WINNER)
    assert data["reason"].startswith("transferred: ")
    # a sibling winner without the evidence: the heuristic, and why
    _add(sibling_db, H100, "M=512,N=512,K=1024,dtype=bfloat16", WINNER, heuristic_ms=0.105)
    slow = CliRunner().invoke(app, [*args[:3], "512x512x1024", *args[4:], "--device", H200.name])
    assert slow.exit_code == 0, slow.output
    assert f"answer  heuristic for {H200.name}" in slow.stdout
    assert (
        f"why     heuristic: the {H100.name} winner of M=512,N=512,K=1024,dtype=bfloat16 (distance 0.00) ran only "
        "1.05x the heuristic there (at least 1.20x is served)."
    ) in slow.stdout
    own = CliRunner().invoke(app, [*args, "--device", H100.name, "--json"])
    assert json.loads(own.stdout)["reason"] == "exact: tuned on this GPU model for this key."


@pytest.mark.parametrize(
    ("heuristic_ms", "why"),
    [
        (0.11, "ran only 1.10x the heuristic there (at least 1.20x is served)."),
        (0.1, "ran only 1.00x the heuristic there (at least 1.20x is served)."),
        (None, "has no timing of the heuristic beside it there, so no evidence it wins."),
    ],
    ids=["a small margin", "no faster", "the heuristic never timed there"],
)
def test_a_siblings_winner_without_a_clear_margin_falls_to_the_heuristic(tmp_db, template, heuristic_ms, why):
    _add(tmp_db, H100, TUNED_KEY, WINNER, heuristic_ms=heuristic_ms)
    result = Runtime(db=tmp_db, device=H200).lookup("matmul", **TUNED)
    assert (result.source, result.transferred_from) == ("heuristic", None)
    assert result.config == template.heuristic(template.problem(**TUNED), H200) != WINNER
    assert result.reason == f"heuristic: the {H100.name} winner of {TUNED_KEY} (distance 0.00) {why}"


def test_the_margin_asked_grows_with_the_distance_up_to_a_farthest_key(tmp_db):
    """1.22x at the same key is served; 1 doubling away it must be 1.25x; 3 doublings away, nothing is."""
    _add(tmp_db, H100, TUNED_KEY, WINNER, heuristic_ms=0.122)
    runtime = Runtime(db=tmp_db, device=H200)
    assert runtime.lookup("matmul", **TUNED).source == "transferred"
    near = runtime.lookup("matmul", **NEAR)
    assert (near.source, near.reason) == (
        "heuristic",
        f"heuristic: the {H100.name} winner of {TUNED_KEY} (distance 1.00) ran only 1.22x the heuristic there "
        "(at least 1.25x is served).",
    )
    far_key = "M=4096,N=512,K=512,dtype=bfloat16"
    _add(tmp_db, H100, far_key, WINNER, heuristic_ms=1.0)  # 10x there, but 3 doublings from M=512
    far = Runtime(db=tmp_db, device=H200).lookup("matmul", **{**TUNED, "M": 32768})
    assert (far.source, far.matched_key) == ("heuristic", None)
    assert (
        far.reason
        == f"heuristic: the {H100.name} winner of {far_key} (distance 3.00) is farther than 1.5 from this key."
    )
    assert Runtime(db=tmp_db, device=H200).lookup("matmul", **{**TUNED, "M": 4096}).source == "transferred"


def test_a_siblings_evidence_is_read_in_one_query_per_kernel(tmp_db, monkeypatch):
    """The heuristic's times on the sibling come with its winners, on the kernel's first miss: one
    trial query for every key the runtime then answers."""
    for m in (512, 1024, 2048):
        _add(tmp_db, H100, f"M={m},N=512,K=512,dtype=bfloat16", WINNER)
    calls = []
    read = Store.trial_times
    monkeypatch.setattr(
        Store, "trial_times", lambda self, *a, **k: calls.append(k.get("hashes")) or read(self, *a, **k)
    )
    runtime = Runtime(db=tmp_db, device=H200)
    answers = [runtime.lookup("matmul", **{**TUNED, "M": m}).source for m in (512, 1024, 2048, 700, 1500)]
    assert answers == ["transferred"] * 5
    assert len(calls) == 1 and len(calls[0]) <= 3  # the heuristics' configs only


def test_a_bundle_carries_the_evidence_for_a_sibling(sibling_db, tmp_path, template):
    """`tune export` writes the heuristic's time beside each winner where a trial measured it: a
    sibling is served the bundle's winner on it as on the database's; without it, the heuristic."""
    _add(sibling_db, H100, "M=512,N=512,K=1024,dtype=bfloat16", WINNER, heuristic_ms=0.105)
    _add(sibling_db, H100, "M=512,N=512,K=2048,dtype=bfloat16", WINNER, heuristic_ms=None)
    store = Store(sibling_db, readonly=True)
    try:
        [path] = write_bundles(build_bundles(store), tmp_path / "h100.json")
    finally:
        store.close()
    winners = json.loads(path.read_text())["kernels"]["matmul"]["winners"]
    assert (
        winners[TUNED_KEY]["heuristic_ms"] == 0.2 and "heuristic_ms" not in winners["M=512,N=512,K=2048,dtype=bfloat16"]
    )
    for k, source in ((512, "transferred"), (1024, "heuristic"), (2048, "heuristic")):
        from_bundle = Runtime(bundle=path, device=H200).lookup("matmul", **{**TUNED, "K": k})
        from_db = Runtime(db=sibling_db, device=H200).lookup("matmul", **{**TUNED, "K": k})
        assert from_bundle.source == from_db.source == source
        assert from_bundle.reason == from_db.reason
    data = json.loads(path.read_text())
    del data["kernels"]["matmul"]["winners"][TUNED_KEY]["heuristic_ms"]  # a bundle from before the evidence
    path.write_text(json.dumps(data))
    assert Runtime(bundle=path, device=H200).lookup("matmul", **TUNED).source == "heuristic"


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
    # the sibling's winner without a time of the first listed config beside it: no evidence
    _add(tmp_db, H100, "n=1000,x.dtype=bfloat16", second, captured, heuristic_ms=None)
    blind = answer("n=1000,x.dtype=bfloat16")
    assert (blind.source, blind.config) == ("heuristic", first)
    assert "has no timing of the heuristic beside it there" in blind.reason
    # the first listed config timed beside it on the H100, only 1.1x slower: not enough
    store = Store(tmp_db)
    try:
        _time_heuristic(store, captured, H100, "n=1000,x.dtype=bfloat16", 0.11, H200)
    finally:
        store.close()
    assert (answer("n=1000,x.dtype=bfloat16").source, answer("n=1000,x.dtype=bfloat16").config) == ("heuristic", first)
    # 2x slower, at another key of that dtype: served
    _add(tmp_db, H100, "n=2000,x.dtype=bfloat16", second, captured)
    moved = answer("n=2000,x.dtype=bfloat16")
    assert (moved.source, moved.config, moved.transferred_from) == ("transferred", second, H100.name)
    assert moved.reason.startswith(f"transferred: the {H100.name} winner of n=2000,x.dtype=bfloat16 (distance 0.00)")
    assert answer("n=2000,x.dtype=bfloat16", transfer=False).source == "heuristic"
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


def test_tune_lookup_of_a_captured_kernel_serves_a_siblings_winner_blind_only_with_evidence(tmp_db):
    """`tune lookup module:qualname` walks the one chain too, without importing the kernel: its
    first listed config (the heuristic) is its module's, so no trial on the H100 can be told to be
    it, and the H100's winner is not served blind; the reason says so. This model's own winners
    are served as they are."""
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
    assert f"answer  first listed config for {H200.name}" in result.stdout
    assert f"why     first listed config: the {H100.name} winner of n=1000,x.dtype=float16 (distance 0.00)" in (
        result.stdout
    )
    assert "not known without importing it" in result.stdout
    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert (data["source"], data["transferred_from"], data["config"]) == ("first listed config", None, None)
    assert data["reason"].startswith("first listed config: ")
    own = json.loads(CliRunner().invoke(app, [*args[:-2], "--device", H100.name, "--json"]).stdout)
    assert (own["source"], own["transferred_from"], own["config"]) == ("exact", None, winner)
    assert own["reason"] == "exact: tuned on this GPU model for this key."
    off = CliRunner().invoke(app, [*args, "--json"], env={"TUNESVC_TRANSFER": "0"})
    assert json.loads(off.stdout)["source"] == "first listed config"


def test_tune_lookup_of_a_captured_kernel_in_a_sibling_models_bundle(tmp_db, tmp_path, monkeypatch):
    """A bundle holds a captured kernel's winners but no time of its first listed config (export
    does not import it): on a sibling, `tune lookup` answers the first listed config and says why."""
    import tunesvc.device

    winner = {"BLOCK": 64, "num_warps": 4}
    _captured(tmp_db, H100, "n=1000,x.dtype=float16", winner)
    store = Store(tmp_db, readonly=True)
    try:
        [path] = write_bundles(build_bundles(store), tmp_path / "h100.json")
    finally:
        store.close()
    assert (
        "heuristic_ms"
        not in json.loads(path.read_text())["kernels"]["lib.ops:_scale"]["winners"]["n=1000,x.dtype=float16"]
    )
    monkeypatch.setattr(tunesvc.device, "current_device", lambda: H200)  # run on the H100's sibling
    args = ["lookup", "lib.ops:_scale", "--shape", "n=1000,x.dtype=float16", "--bundle", str(path), "--json"]
    data = json.loads(CliRunner().invoke(app, args).stdout)
    assert (data["source"], data["transferred_from"]) == ("first listed config", None)
    assert H100.name in data["reason"] and "not known without importing it" in data["reason"]
    monkeypatch.setattr(tunesvc.device, "current_device", lambda: H100_PCIE)  # another SM count: no sibling
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and "Traceback" not in result.output
