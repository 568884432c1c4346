"""Selectors: fitted from real trials of tiny sweeps in the interpreter, kept as JSON, walked at run time."""

from __future__ import annotations

import json
import math
import os
import random
import re
import sqlite3
import subprocess
import sys
import warnings
from dataclasses import replace

import pytest
import torch
from sklearn.tree import DecisionTreeClassifier

import tunesvc
from tunesvc import TunesvcError
from tunesvc.bench import Measurement
from tunesvc.bench import Measurer
from tunesvc.bench import Status
from tunesvc.bench import relative_error
from tunesvc.bundle import build_bundles
from tunesvc.bundle import import_sources
from tunesvc.bundle import read_bundle
from tunesvc.bundle import write_bundles
from tunesvc.serving import selector as selector_model
from tunesvc.serving.runtime import Runtime
from tunesvc.space import config_hash
from tunesvc.store import Store
from tunesvc.tuning import selector_fit
from tunesvc.tuning import selector_measure
from tunesvc.tuning.sweep import run_sweep

#: small and odd: M buckets 4, 16, 64 and 128 over two (N, K) pairs
SHAPES = [(3, 45, 29), (37, 45, 29), (9, 70, 50), (100, 70, 50)]
#: a key no sweep tuned (M=256 over N=70, K=50), one doubling past the tuned Ms, whose nearest tuned
#: key (M=128) has a winner that fits it
UNTUNED = {"M": 200, "N": 70, "K": 50}


@pytest.fixture(scope="module")
def fitted_db(tmp_path_factory):
    """A database with 4 tiny matmul keys swept (3 trials each), every winner cross-measured on
    every key, and the selector fitted: real interpreter timings.

    Which configs win depends on those timings; what the tests below read does not: cross_measure
    leaves no key without a trial of every candidate (it goes back over the keys where measuring
    gives one a new winner), so all 4 keys are fitted on, and M=128's winner, whichever of its
    trials it is, has a tile that fits UNTUNED: UNTUNED's lookup is ``predicted``."""
    path = str(tmp_path_factory.mktemp("selector") / "fitted.db")
    template, device = tunesvc.get_template("matmul"), tunesvc.current_device()
    store = Store(path)
    try:
        run_sweep(template, [template.problem(M=m, N=n, K=k) for m, n, k in SHAPES], store, budget=3)
        selector_measure.cross_measure(store, template, device)
        # fitted and kept whatever its leave-one-out score on these noisy interpreter timings
        # (refit's gate, tested on fixed times below, could keep none)
        selector = selector_fit.fit(selector_fit.training_set(store, template, device))
        assert selector is not None
        store.save_selector(template, device.hardware_id, selector.to_dict(), selector.keys)
    finally:
        store.close()
    return path


def _selector(path) -> selector_model.Selector:
    store = Store(path, readonly=True)
    try:
        found = selector_model.stored_selector(
            store, tunesvc.get_template("matmul"), tunesvc.current_device().hardware_id
        )
    finally:
        store.close()
    assert found is not None
    return found


def _stored(path, template, device) -> tuple[selector_fit.TrainingSet, dict]:
    """The training set of ``path`` and its stored trial times (key -> config hash -> ms)."""
    store = Store(path, readonly=True)
    try:
        data = selector_fit.training_set(store, template, device)
        return data, store.trial_times(template.name, template.version, device.hardware_id)
    finally:
        store.close()


def test_cross_measure_covers_every_candidate_on_every_key(fitted_db, template, device):
    data, times = _stored(fitted_db, template, device)
    assert len(data.keys) == len(SHAPES) and not data.skipped
    for key in data.keys:
        assert {config_hash(c) for c in data.candidates} <= set(times[key])


def _half_measured(store, template, device):
    """Two keys swept with one config each, a different one: neither key knows the other's
    winner. Returns the first key's problem and config."""
    first, second = (template.problem(M=m, N=n, K=k) for m, n, k in SHAPES[:2])
    one, other = template.feasible(first, device)[:2]
    run_sweep(template, [first], store, budget=1, candidates=[one])
    run_sweep(template, [second], store, budget=1, candidates=[other])
    return first, one


def test_training_set_skips_keys_where_candidates_were_not_measured(tmp_db, template, device):
    store = Store(tmp_db)
    try:
        _half_measured(store, template, device)
        data = selector_fit.training_set(store, template, device)
        assert len(data.candidates) == 2 and not data.keys
        assert [why for _, why in data.skipped] == [
            "50% of the candidates measured; run `tune selector --cross-measure`"
        ] * 2
        assert len(selector_fit.training_set(store, template, device, min_coverage=0.5).keys) == 2
        assert selector_measure.cross_measure(store, template, device) == 2  # the one missing config on each key
        assert len(selector_fit.training_set(store, template, device).keys) == 2
        assert selector_measure.cross_measure(store, template, device) == 0  # nothing left to measure
    finally:
        store.close()


def test_cross_measure_within_a_time_budget_measures_one_key_and_a_rerun_the_rest(tmp_db, template, device):
    store = Store(tmp_db)
    try:
        _half_measured(store, template, device)
        started: list[str] = []
        # a budget spent at once still measures the first key with gaps: calls in turn progress
        assert (
            selector_measure.cross_measure(
                store, template, device, on_key=lambda k, n: started.append(k), time_budget=1e-9
            )
            == 1
        )
        assert len(started) == 1
        selector_measure.cross_measure(store, template, device, on_key=lambda k, n: started.append(k), time_budget=1e-9)
        data = selector_fit.training_set(store, template, device)
        assert len(data.keys) == 2 and not data.skipped
        assert selector_measure.cross_measure(store, template, device, time_budget=1e-9) == 0
        assert len(set(started)) == len(started) <= 2  # no key measured twice
    finally:
        store.close()


def test_cross_measure_shards_split_the_keys_between_them(tmp_db, template, device):
    store = Store(tmp_db)
    try:
        _half_measured(store, template, device)
        keys = sorted(selector_fit.tuned_winners(store, template, device.hardware_id))
        second: list[str] = []
        # both keys have a gap: the second share measures the second key's alone
        assert (
            selector_measure.cross_measure(store, template, device, on_key=lambda k, n: second.append(k), shard=(1, 2))
            == 1
        )
        assert second == [keys[1]]
        # the first share takes no other key (its own may have no gap left: a config that won the
        # second key there leaves the candidates, the winners and runners-up, without the other)
        first: list[str] = []
        selector_measure.cross_measure(store, template, device, on_key=lambda k, n: first.append(k), shard=(0, 2))
        assert first in ([], [keys[0]])
        assert selector_measure.cross_measure(store, template, device) == 0
        assert len(selector_fit.training_set(store, template, device).keys) == 2
        with pytest.raises(TunesvcError, match=r"0 <= i < n, not \(2, 2\)"):
            selector_measure.cross_measure(store, template, device, shard=(2, 2))
    finally:
        store.close()


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--shard", "0/2"], "--shard splits --cross-measure; add --cross-measure, or drop --shard."),
        (["--cross-measure", "--shard", "2/2"], "--shard takes I/N with 0 <= I < N, such as 0/4, not '2/2'."),
        (["--cross-measure", "--shard", "1"], "--shard takes I/N with 0 <= I < N, such as 0/4, not '1'."),
        (["--time-budget", "60"], "--time-budget limits --cross-measure; add --cross-measure, or drop --time-budget."),
        (["--cross-measure", "--time-budget", "0"], "--time-budget must be a positive number of seconds, got 0.0."),
    ],
)
def test_selector_time_budget_and_shard_need_cross_measure_and_good_values(tmp_path, extra, said):
    from typer.testing import CliRunner

    from tunesvc.cli import app

    db = tmp_path / "none.db"
    result = CliRunner().invoke(app, ["selector", "matmul", "--db", str(db), *extra])
    assert result.exit_code != 0 and said in " ".join(result.output.split())
    assert "Traceback" not in result.output and not db.exists()  # refused before any database is made


def test_selector_json_round_trips_and_is_plain_json(fitted_db):
    selector = _selector(fitted_db)
    text = json.dumps(selector.to_dict())
    assert selector_model.Selector.from_dict(json.loads(text)) == selector
    con = sqlite3.connect(f"file:{fitted_db}?mode=ro", uri=True)
    try:
        [(stored,)] = con.execute("SELECT selector FROM tunesvc_selectors").fetchall()
    finally:
        con.close()
    assert isinstance(stored, str) and json.loads(stored) == selector.to_dict()  # text, not a pickle


def _synthetic(n_keys: int, n_candidates: int, seed: int) -> selector_fit.TrainingSet:
    rng = random.Random(seed)
    features = tuple({"a": rng.uniform(0, 14), "b": rng.uniform(0, 14), "c": rng.random()} for _ in range(n_keys))
    times = tuple(
        tuple(None if rng.random() < 0.1 else rng.uniform(1, 3) for _ in range(n_candidates - 1)) + (rng.uniform(1, 3),)
        for _ in range(n_keys)
    )
    return _training(tuple(f"k{i}" for i in range(n_keys)), features, times)


def _training(keys, features, times) -> selector_fit.TrainingSet:
    """A training set of these keys, features and per-candidate times (candidates BLOCK_M=16, 32, ...)."""
    candidates = tuple({"BLOCK_M": 16 << i} for i in range(len(times[0])))
    return selector_fit.TrainingSet(
        "matmul", "v", "hw", candidates, tuple(keys), tuple(features), tuple(map(tuple, times)), ()
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_walker_matches_sklearn_on_random_features(seed):
    data = _synthetic(120, 6, seed)
    selector = selector_fit.fit(data)
    assert selector is not None and len(selector.left) > 1
    names = list(selector.features)
    x = [[f[n] for n in names] for f in data.features]
    reference = DecisionTreeClassifier(max_depth=selector_fit.MAX_DEPTH, random_state=0).fit(
        x, selector_fit.targets(data)
    )
    rng = random.Random(100 + seed)
    probes = [[rng.uniform(-1, 15), rng.uniform(-1, 15), rng.uniform(-0.5, 1.5)] for _ in range(2000)]
    probes += x  # the training points themselves sit on thresholds' float32 neighbours
    expected = reference.predict(probes)
    for probe, want in zip(probes, expected):
        assert selector.predict(selector.vector(dict(zip(names, probe)))) == int(want)
    # and after a JSON round trip
    again = selector_model.Selector.from_dict(json.loads(json.dumps(selector.to_dict())))
    assert [again.predict(again.vector(dict(zip(names, p)))) for p in probes] == [int(w) for w in expected]


def test_fit_needs_two_keys():
    assert selector_fit.fit(_synthetic(1, 3, 0)) is None


@pytest.mark.parametrize(
    "damage, pattern",
    [
        (lambda d: d["tree"].update(left=[5]), "arrays differ|outside the tree"),
        (lambda d: d["tree"].update(threshold=["x"] * len(d["tree"]["threshold"])), "threshold"),
        (lambda d: d.update(candidates=[]), "leaf|candidate"),
        (lambda d: d.update(format=99), "format"),
        (lambda d: d["tree"]["left"].__setitem__(0, 0) if d["tree"]["left"][0] >= 0 else d.update(features=[]), "."),
    ],
)
def test_damaged_selector_is_one_clear_error(fitted_db, damage, pattern):
    data = _selector(fitted_db).to_dict()
    damage(data)
    with pytest.raises(TunesvcError, match=pattern):
        selector_model.Selector.from_dict(data)


def test_runtime_source_order_exact_predicted_nearest_heuristic(fitted_db, template, device, tmp_path):
    selector = _selector(fitted_db)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        runtime = Runtime(db=fitted_db)
        assert runtime.lookup("matmul", M=37, N=45, K=29).source == "exact"
        predicted = runtime.lookup("matmul", **UNTUNED)
        assert predicted.source == "predicted"
        assert predicted.config == selector.pick(template, template.problem(**UNTUNED), device)
        # a dtype the fit never saw: no prediction, and no nearest key of that dtype either
        assert runtime.lookup("matmul", **UNTUNED, dtype="bfloat16").source == "heuristic"
        assert runtime.stats()["matmul"] == {"exact": 1, "predicted": 1, "heuristic": 1}

        # the same database without its selector: nearest
        copy = tmp_path / "no-selector.db"
        source, con = sqlite3.connect(fitted_db), sqlite3.connect(copy)
        source.backup(con)  # with what the WAL file holds
        source.close()
        with con:
            con.execute("DELETE FROM tunesvc_selectors")
        con.close()
        assert Runtime(db=copy).lookup("matmul", **UNTUNED).source == "nearest"


def test_predicted_candidate_that_does_not_fit_falls_to_the_next_ranked(fitted_db, template, device):
    selector = _selector(fitted_db)
    problem = template.problem(M=1, N=45, K=29)
    ranked = selector.ranked(template, problem, device)
    fitting = [c for c in ranked if not template.violations(c, problem, device)]
    assert selector.pick(template, problem, device) == (fitting[0] if fitting else None)


def test_runtime_never_imports_sklearn(fitted_db):
    code = (
        "import sys, warnings; warnings.simplefilter('ignore');"
        "from tunesvc.serving.runtime import Runtime;"
        f"r = Runtime(db={fitted_db!r}).lookup('matmul', M=200, N=70, K=50);"
        "print(r.source, 'sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["predicted", "False"]


def _bundle_of(db, path):
    """The matmul bundle of ``db`` written to ``path``."""
    store = Store(db, readonly=True)
    try:
        [written] = write_bundles(build_bundles(store, kernel="matmul"), path)
    finally:
        store.close()
    return written


def test_bundle_with_and_without_selector(fitted_db, tmp_path, device):
    path = _bundle_of(fitted_db, tmp_path / "b.json")
    data = json.loads(path.read_text())
    assert data["kernels"]["matmul"]["selector"] == _selector(fitted_db).to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert Runtime(bundle=path).lookup("matmul", **UNTUNED).source == "predicted"
        del data["kernels"]["matmul"]["selector"]
        without = tmp_path / "without.json"
        without.write_text(json.dumps(data))
        read_bundle(without)  # a bundle without a selector still loads
        assert Runtime(bundle=without).lookup("matmul", **UNTUNED).source == "nearest"
    data["kernels"]["matmul"]["selector"] = {"format": 1, "tree": "no"}
    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps(data))
    with pytest.raises(TunesvcError, match=r"damaged.*tune selector"):
        read_bundle(damaged)
    with pytest.warns(RuntimeWarning, match="Not using the selector"):
        assert Runtime(bundle=damaged).lookup("matmul", **UNTUNED).source == "nearest"


def test_import_carries_selectors_from_databases_and_bundles(fitted_db, tmp_path, device):
    from typer.testing import CliRunner

    from tunesvc.cli import app

    fitted = _selector(fitted_db)
    bundle = _bundle_of(fitted_db, tmp_path / "b.json")
    for source in (fitted_db, str(bundle)):
        target = str(tmp_path / f"from-{'bundle' if source.endswith('.json') else 'db'}.db")
        result = CliRunner().invoke(app, ["import", source, "--db", target, "--json"])
        assert result.exit_code == 0, result.output
        [change] = json.loads(result.output)["selectors"]
        assert (change["kernel"], change["action"], change["keys"]) == ("matmul", "added", len(SHAPES))
        assert _selector(target) == fitted
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            assert Runtime(db=target).lookup("matmul", **UNTUNED).source == "predicted"
        # a stored selector stays: it was fitted on the target's own trials
        again = CliRunner().invoke(app, ["import", source, "--db", target])
        assert again.exit_code == 0, again.output
        assert f"Selectors: matmul {fitted.version} kept (a stored selector is kept" in again.output


def _renamed(selector):
    selector["kernel"] = "softmax"


def _outside(selector):
    selector["candidates"][0]["BLOCK_M"] = 3


@pytest.mark.parametrize(
    "damage, message",
    [
        (_renamed, r"kernels\.matmul\.selector is damaged \(it names softmax"),
        (_outside, r"selector is outside its space"),
    ],
)
def test_import_refuses_a_damaged_selector_and_writes_nothing(fitted_db, tmp_path, damage, message):
    bundle = _bundle_of(fitted_db, tmp_path / "b.json")
    data = json.loads(bundle.read_text())
    damage(data["kernels"]["matmul"]["selector"])
    bundle.write_text(json.dumps(data))
    target = str(tmp_path / "t.db")
    store = Store(target)
    try:
        with pytest.raises(TunesvcError, match=message):
            import_sources(store, [str(bundle)])
        assert store.winners() == []
    finally:
        store.close()


def _shared_config(template, device, problems):
    """A config that every one of ``problems`` can run."""
    return next(
        c
        for c in template.feasible(problems[0], device)
        if all(not template.violations(c, p, device) for p in problems)
    )


def test_sweep_refits_the_selector(tmp_db, template, device):
    """A sweep's end refits: two usable keys are too few to judge a selector, so none is kept;
    with a third key, all three won by one config (which the nearest rule picks too), one is."""
    problems = [template.problem(M=m, N=n, K=k) for m, n, k in SHAPES[:3]]
    shared = _shared_config(template, device, problems)
    store = Store(tmp_db)
    try:
        first, _ = _half_measured(store, template, device)
        assert store.selector(template.name, template.version, device.hardware_id) is None  # each key: 50% measured
        selector_measure.cross_measure(store, template, device)
        assert store.selector(template.name, template.version, device.hardware_id) is None  # measuring is not fitting
        run_sweep(template, [first], store, budget=1)  # nothing new to measure; its end refits: 2 keys, none kept
        assert store.selector(template.name, template.version, device.hardware_id) is None
    finally:
        store.close()
    store = Store(str(tmp_db) + ".three")
    try:
        run_sweep(template, problems, store, budget=1, candidates=[shared])
        stored = store.selector(template.name, template.version, device.hardware_id)
    finally:
        store.close()
    assert stored is not None and stored["keys"] == 3 and stored["candidates"] == [dict(shared)]


def _stored_keys(path, template, device):
    store = Store(path, readonly=True)
    try:
        found = store.selector(template.name, template.version, device.hardware_id)
    finally:
        store.close()
    return None if found is None else found["keys"]


def test_refit_keeps_a_selector_only_where_it_beats_the_nearest_rule_and_drops_a_stale_one(tmp_db, template, device):
    """On fixed times in a real store: where each key's best is its nearest neighbour's, a
    selector ties the nearest rule and is kept. Where the nearest key is right but the next two
    outvote it, and the tree's only feature orders the keys otherwise than their distance does,
    both models pick worse than the nearest rule: refused, and the selector stored before
    (fitted on fewer keys) is removed."""
    good = _keyed([(1.0, 2.0), (1.0, 2.0), (2.0, 1.0), (2.0, 1.0)], [4, 8, 256, 512])
    bad = _keyed([(1.0, 3.0), (1.0, 1.1), (3.0, 1.0), (3.0, 1.0)], [4, 8, 16, 32])
    bad = replace(bad, features=tuple({"f": f} for f in (0.0, 10.0, 1.0, 11.0)))
    store = Store(tmp_db)
    try:
        kept, scores = selector_fit.keep(store, template, device, good)
        assert kept is not None and _stored_keys(tmp_db, template, device) == 4
        assert scores == selector_fit.leave_one_out(good, kept.model) and scores[0] <= scores[1]
        with pytest.raises(selector_fit.SelectorWorse, match="nearest rule"):
            selector_fit.keep(store, template, device, bad)
        assert _stored_keys(tmp_db, template, device) is None
        assert selector_fit.keep(store, template, device, _keyed([(1.0, 2.0), (2.0, 1.0)], [4, 8])) == (
            None,
            None,
        )  # too few
        assert _stored_keys(tmp_db, template, device) is None
    finally:
        store.close()


def _counts(path) -> tuple:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return tuple(
            con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()
            for t in ("tunesvc_trials", "tunesvc_winners", "tunesvc_sweeps", "tunesvc_selectors")
        )
    finally:
        con.close()


def test_evaluate_measures_each_held_out_key_against_both_rules(fitted_db, template, device):
    store = Store(fitted_db, readonly=True)
    try:
        rows = selector_measure.evaluate(store, template, device)
    finally:
        store.close()
    assert [r.shape_key for r in rows] == sorted(
        str(template.key(template.problem(M=m, N=n, K=k))) for m, n, k in SHAPES
    )
    for r in rows:
        assert r.keys_fitted in (0, len(SHAPES) - 1)  # fitted without the held-out key
        assert r.tuned_ms is not None and r.tuned_ms > 0
        assert r.selector_source in ("predicted", "nearest", "heuristic")
        assert r.nearest_source in ("nearest", "heuristic") and r.nearest_key != r.shape_key
        for ms, ratio in ((r.selector_ms, r.selector_ratio), (r.nearest_ms, r.nearest_ratio)):
            assert ratio == (r.tuned_ms / ms if ms is not None else 0.0)
        if r.selector_source != "predicted":  # no prediction: the runtime falls to the nearest rule
            assert (r.selector_source, r.selector_config) == (r.nearest_source, r.nearest_config)
    assert any(r.selector_source == "predicted" for r in rows)
    [(name, totals)] = selector_measure.summary(rows).items()
    assert name == "matmul" and totals["held_out"] == len(SHAPES)
    ratios = [r.selector_ratio for r in rows]
    assert totals["selector_worst_ratio"] == min(ratios)
    assert totals["selector_within_5pct"] == sum(x >= 1 / 1.05 for x in ratios) / len(rows)


def test_tune_evaluate_prints_selector_and_nearest_side_by_side(fitted_db, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from tunesvc import cli
    from tunesvc.cli import app

    monkeypatch.setattr(cli.console, "width", 200)  # the table's headers on one line each

    before = _counts(fitted_db)
    out = tmp_path / "heldout.csv"
    result = CliRunner().invoke(app, ["evaluate", "matmul", "--db", fitted_db, "--csv", str(out)])
    assert result.exit_code == 0, result.output
    assert "selector within 5%" in result.output and "nearest within 5%" in result.output
    assert "selector worst" in result.output and "nearest worst" in result.output
    lines = out.read_text().splitlines()
    assert lines[0].startswith("kernel,device,shape_key") and len(lines) == 1 + len(SHAPES)
    result = CliRunner().invoke(app, ["evaluate", "matmul", "--db", fitted_db, "--json", "--csv", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert len(data["rows"]) == len(SHAPES) and set(data["summary"]["matmul"]) >= {
        "selector_within_5pct",
        "selector_worst_ratio",
        "nearest_within_5pct",
        "nearest_worst_ratio",
    }
    assert len(out.read_text().splitlines()) == 1 + 2 * len(SHAPES)  # appended, one header
    assert _counts(fitted_db) == before  # evaluating stores nothing


def test_tune_selector_cross_measures_fits_and_prints_the_tree(tmp_db, template, device):
    from typer.testing import CliRunner

    from tunesvc.cli import app

    first, second = (template.problem(M=m, N=n, K=k) for m, n, k in SHAPES[:2])
    one, other = template.feasible(first, device)[:2]
    store = Store(tmp_db)
    try:
        run_sweep(template, [first], store, budget=1, candidates=[one])
        run_sweep(template, [second], store, budget=1, candidates=[other])
    finally:
        store.close()
    result = CliRunner().invoke(app, ["selector", "matmul", "--db", tmp_db])
    assert result.exit_code == 1 and "too few to fit a selector" in result.output
    result = CliRunner().invoke(app, ["selector", "matmul", "--db", tmp_db, "--cross-measure"])
    # both configs measured on both keys: still two keys, too few to judge a selector
    assert result.exit_code == 1 and "measuring 1 candidates on" in result.output
    assert "too few to fit a selector and judge it (it needs 3)" in " ".join(result.output.split())
    third = template.problem(M=SHAPES[2][0], N=SHAPES[2][1], K=SHAPES[2][2])
    shared = _shared_config(template, device, [first, second, third])
    three = str(tmp_db) + ".three"
    store = Store(three)
    try:
        run_sweep(template, [first, second, third], store, budget=1, candidates=[shared])
    finally:
        store.close()
    result = CliRunner().invoke(app, ["selector", "matmul", "--db", three, "--cross-measure"])
    assert result.exit_code == 0, result.output
    assert "-> candidate 0" in result.output
    said = " ".join(result.output.split())
    assert re.search(r"Fitted on 3 tuned keys, 1 candidates \(0 trials measured first\); kept the tree model", said)
    # one candidate: the tree's and the nearest rule's picks are each key's fastest
    assert (
        "its picks run 1.000x as long as the key's fastest candidate (geometric mean), the nearest rule's 1.000x"
        in said
    )


def test_evaluate_within_a_time_budget_holds_out_the_first_key_and_hands_each_row_over(fitted_db, template, device):
    store = Store(fitted_db, readonly=True)
    handed = []
    try:
        rows = selector_measure.evaluate(store, template, device, on_row=handed.append, time_budget=1e-9)
        every = selector_measure.evaluate(store, template, device, on_row=handed.append)
    finally:
        store.close()
    assert [r.shape_key for r in rows] == [every[0].shape_key]  # the budget passed: no second key
    assert len(every) == len(SHAPES) and handed == [*rows, *every]


def test_tune_evaluate_time_budget_writes_the_keys_measured_and_says_how_many(fitted_db, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from tunesvc import cli
    from tunesvc.cli import app

    monkeypatch.setattr(cli.console, "width", 200)
    out = tmp_path / "heldout.csv"
    result = CliRunner().invoke(
        app, ["evaluate", "matmul", "--db", fitted_db, "--csv", str(out), "--time-budget", "0.000001"]
    )
    assert result.exit_code == 0, result.output
    assert f"The time budget held out 1 of the {len(SHAPES)} tuned keys" in result.output
    assert len(out.read_text().splitlines()) == 2  # the header and the one key measured
    # refused in one sentence before anything is measured or written: rows are appended only to a
    # CSV of these rows, never to another file, nor to a FIFO (whose opening waits for a reader)
    notes = tmp_path / "notes.csv"
    notes.write_text("name,phone\nada,1\n")
    os.mkfifo(tmp_path / "fifo.csv")
    for args, said in (
        (["--time-budget", "0"], "--time-budget must be a positive number of seconds, got 0.0."),
        (["--csv", str(tmp_path / "no" / "such.csv")], "folder"),
        (["--csv", str(notes)], "is not a CSV of `tune evaluate`"),
        (["--csv", str(tmp_path / "fifo.csv")], "is a FIFO (named pipe), not a CSV file"),
    ):
        result = CliRunner().invoke(app, ["evaluate", "matmul", "--db", str(tmp_path / "new.db"), *args])
        assert result.exit_code == 1 and said in result.output and "held out" not in result.output
        assert not (tmp_path / "new.db").exists()
    assert notes.read_text() == "name,phone\nada,1\n"


def test_evaluate_without_tuned_keys_is_one_clear_error(tmp_db):
    from typer.testing import CliRunner

    from tunesvc.cli import app

    Store(tmp_db).close()
    result = CliRunner().invoke(app, ["evaluate", "matmul", "--db", tmp_db])
    assert result.exit_code == 1 and "run `tune sweep` first" in result.output


def test_a_shape_far_outside_the_tuned_ones_gets_no_prediction(fitted_db, template, device):
    """The tree's outermost leaf says nothing of a shape 2 doublings past every tuned M: the
    runtime answers it with the nearest rule."""
    selector = _selector(fitted_db)
    far = template.problem(M=4000, N=70, K=50)
    assert selector.ranked(template, far, device) == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert Runtime(db=fitted_db).lookup("matmul", M=4000, N=70, K=50).source == "nearest"


def _keyed(times, ms):
    """A training set over matmul keys M=ms (N=45, K=29) with these per-candidate times."""
    keys = [f"M={m},N=45,K=29,dtype=float16" for m in ms]
    return _training(keys, [{"log2_M": float(m.bit_length() - 1)} for m in ms], times)


def test_leave_one_out_scores_the_selector_and_the_nearest_rule_on_stored_times():
    # neighbours share their best candidate: the nearest rule is always right
    data = _keyed([(1.0, 2.0), (1.0, 2.0), (2.0, 1.0), (2.0, 1.0)], [4, 8, 256, 512])
    ours, nearest = selector_fit.leave_one_out(data)
    assert nearest == 1.0 and ours >= 1.0
    # every key's best differs from its nearest neighbour's: the nearest rule is always wrong
    data = _keyed([(1.0, 3.0), (3.0, 1.0), (1.0, 3.0), (3.0, 1.0)], [4, 8, 16, 32])
    ours, nearest = selector_fit.leave_one_out(data)
    assert nearest == pytest.approx(3.0)
    assert selector_fit.leave_one_out(_keyed([(1.0, 2.0), (2.0, 1.0)], [4, 8])) is None  # too few keys
    # as at run time, a key left out is answered from the other keys' winners alone, skipping one
    # that did not run there: M=4's neighbour M=8 won with a config that failed on M=4 (2.0x
    # with the next), M=8 gets M=4's winner (3.0x), M=256 gets M=8's (2.0x)
    data = _keyed([(None, 2.0, 1.0), (1.0, 1.5, 3.0), (2.0, 1.0, 3.0)], [4, 8, 256])
    assert selector_fit.leave_one_out(data)[1] == pytest.approx((2.0 * 3.0 * 2.0) ** (1 / 3))


def test_runner_ups_are_configs_near_the_fastest_at_two_keys():
    times = {
        "k1": {"a": 1.0, "c": 1.019, "d": 1.03, "e": None},
        "k2": {"b": 2.0, "c": 2.03, "d": 2.01, "e": None},
        "k3": {"a": 1.0, "d": 1.5},
    }
    # c within 2% of the fastest at k1 and k2, a the fastest at k1 and k3; d and b at k2 alone
    assert selector_fit.runner_ups(times, ["k1", "k2", "k3"]) == {"a", "c"}
    assert selector_fit.runner_ups(times, ["k2", "k3"]) == set()  # judged on the keys given alone


def test_a_runner_up_is_a_candidate_once_measured_on_every_tuned_key(tmp_db, template, device):
    """Each key has its winner; a third config, near-best at two keys and never the fastest,
    joins the candidates once it has a trial on every tuned key (cross_measure gives it one)."""
    problems = [template.problem(M=m, N=45, K=29) for m in (4, 64, 1024)]
    a, b, c = template.feasible(problems[0], device)[:3]
    store = Store(tmp_db)
    try:
        kv_id, device_id = store.kernel_version_id(template), store.device_id(device)
        # microseconds: far below any interpreter timing that cross_measure adds
        for problem, trials in zip(problems, [[(a, 1e-3), (c, 1.01e-3)], [(b, 1e-3), (c, 1.015e-3)], [(a, 1e-3)]]):
            key = str(template.key(problem))
            sweep_id = store.start_sweep(kv_id, device_id, key, problem, "grid", None, 0)
            measured = [(cfg, config_hash(cfg), Measurement(Status.OK, time_ms=t)) for cfg, t in trials]
            store.add_trials(sweep_id, kv_id, device_id, key, measured)
            store.update_winner(kv_id, device_id, key)

        def candidates() -> set[str]:
            return {
                config_hash(x) for x in selector_fit.training_set(store, template, device, min_coverage=0.1).candidates
            }

        assert candidates() == {config_hash(a), config_hash(b)}  # c has no trial on the third key
        assert selector_measure.cross_measure(store, template, device) == 4  # b on keys 1 and 3, a on key 2, c on key 3
        assert candidates() == {config_hash(a), config_hash(b), config_hash(c)}
        # left out, a key's own near-best do not count: without the second key, c is near-best once
        excluded = selector_fit.training_set(store, template, device, exclude=(str(template.key(problems[1])),))
        assert config_hash(c) not in {config_hash(x) for x in excluded.candidates}
    finally:
        store.close()


class _FixedTimes(Measurer):
    """A measurer whose times are fixed: ``first[(key, hash)]`` for a first timing, ``again``
    for each re-timing (a config missing from either breaks no rule it is not asked about)."""

    def __init__(self, template, problem, device, first, again):
        self.template, self.problem, self.device, self.rep_ms = template, problem, device, 1.0
        self.key, self.first, self.again = str(template.key(problem)), first, again

    def _timed(self, times, config):
        return Measurement(
            Status.OK, time_ms=times[self.key, config_hash(config)], spread=0.0, reps=1, message="timed: fixed"
        )

    def measure(self, config):
        return self._timed(self.first, config)

    def time_only(self, config, rep_ms=None, graph_ms=None):
        return self._timed(self.again, config)

    def time_peer(self):
        return Measurement(Status.INVALID, message="no peer")


def test_cross_measure_measures_a_config_that_wins_a_later_key_on_the_keys_before_it(
    tmp_db, template, device, monkeypatch
):
    """On fixed times: key A's winner x, key B's y (z ran there too). Measuring x on B, x's
    first time beats y; re-timed side by side both read slower, and the chase re-times z, which
    now wins B. z never ran on A, measured before B: the same call goes back and measures it
    there, so that the training set keeps both keys."""
    problems = [template.problem(M=m, N=n, K=k) for m, n, k in SHAPES[:2]]
    a, b = (str(template.key(p)) for p in problems)
    assert sorted([b, a]) == [a, b]  # cross_measure goes over A first
    x, y, z = [c for c in template.feasible(problems[0], device) if not template.violations(c, problems[1], device)][:3]
    hx, hy, hz = (config_hash(c) for c in (x, y, z))
    first = {(a, hy): 2.0, (a, hz): 3.0, (b, hx): 0.5}
    again = {(b, hx): 1.5, (b, hy): 1.4, (b, hz): 1.3}
    monkeypatch.setattr("tunesvc.bench.measurer_for", lambda t, p, d, **_: _FixedTimes(t, p, d, first, again))
    store = Store(tmp_db)
    try:
        kv_id, device_id = store.kernel_version_id(template), store.device_id(device)
        for problem, trials in zip(problems, [[(x, 1.0)], [(y, 1.0), (z, 1.3)]]):
            key = str(template.key(problem))
            sweep_id = store.start_sweep(kv_id, device_id, key, problem, "grid", None, 0)
            measured = [(c, config_hash(c), Measurement(Status.OK, time_ms=t, spread=0.0, reps=1)) for c, t in trials]
            store.add_trials(sweep_id, kv_id, device_id, key, measured)
            store.update_winner(kv_id, device_id, key)
        visits: list[tuple[str, int]] = []
        assert selector_measure.cross_measure(store, template, device, on_key=lambda k, n: visits.append((k, n))) == 3
        assert visits == [(a, 1), (b, 1), (a, 1)]  # y on A, x on B; then z, B's new winner, on A
        assert selector_fit.tuned_winners(store, template, device.hardware_id) == {a: x, b: z}
        data = selector_fit.training_set(store, template, device)
        assert data.keys == (a, b) and not data.skipped
        assert selector_measure.cross_measure(store, template, device) == 0  # nothing left to measure
    finally:
        store.close()


def test_leave_one_out_knows_the_other_keys_runner_ups():
    # candidate 1 never wins, but is within 2% of the best at M=4 and M=8; at M=16 it is the best.
    # Left out, M=16 is answered from M=4's and M=8's winners and runner-ups: candidate 1 among them
    data = _keyed([(1.0, 1.01, 2.0), (2.0, 1.01, 1.0), (1.5, 1.0, 1.5)], [4, 8, 16])
    with_runner_ups = selector_fit.leave_one_out(data, "neighbours")
    winners_only = replace(data, candidates=data.candidates[::2], times=tuple(r[::2] for r in data.times))
    without = selector_fit.leave_one_out(winners_only, "neighbours")
    assert with_runner_ups is not None and without is not None
    assert with_runner_ups[0] < without[0]


def test_leave_one_out_measures_keys_with_the_training_sets_distance():
    # each key's best is its nearest log2 neighbour's: the nearest rule is always right ...
    data = _keyed([(1.0, 3.0), (1.0, 3.0), (3.0, 1.0), (3.0, 1.0)], [4, 8, 64, 128])
    assert selector_fit.leave_one_out(data)[1] == 1.0

    # ... unless the template's distance pairs them otherwise (M=4 with M=64, M=8 with M=128)
    def crossed(a, b):
        m, n = dict(a.dims)["M"], dict(b.dims)["M"]
        return 0.0 if {m, n} in ({4, 64}, {8, 128}) else 1.0 + abs(m - n)

    assert selector_fit.leave_one_out(replace(data, distance=crossed))[1] == pytest.approx(3.0)


def test_a_fit_where_each_key_has_its_own_winner_warns_nothing():
    """Each of 24 keys has its own best candidate: scikit-learn's "more classes than half the
    samples" is the normal case for a selector, not a warning for whoever ran a sweep."""
    times = [tuple(1.0 if j == i else 2.0 for j in range(24)) for i in range(24)]
    data = _keyed(times, [2 + i for i in range(24)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert selector_fit.fit(data) is not None


# -- the neighbours model -------------------------------------------------------------------
def test_neighbour_scores_judge_every_candidate_on_the_same_nearest_keys():
    inf = float("inf")
    distances = [1.0, 2.0, 3.0, 4.0, inf]
    slowdowns = [[0.0, 0.1, None], [0.2, None, None], [0.4, 0.3, None], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    fills = [[1.0, 1.0, 1.0]] * 5
    scores = selector_model.neighbour_scores(distances, slowdowns, fills, [1.0, 1.0, 1.0])
    w = [1 / (d + selector_model.SOFTENING) for d in distances]
    # the three nearest keys are 0, 1 and 2 for every candidate: candidate 1 did not run at key 1,
    # so keys 0 and 2 alone judge it (not key 3, farther away, where it did well)
    assert scores[0] == pytest.approx((w[0] * 0.0 + w[1] * 0.2 + w[2] * 0.4) / (w[0] + w[1] + w[2]))
    assert scores[1] == pytest.approx((w[0] * 0.1 + w[2] * 0.3) / (w[0] + w[2]))
    # candidate 2 ran only farther away: no score, however fast it was there
    assert scores[2] is None
    # an incomparable key (another dtype) never votes; a candidate that ran nowhere gets no score
    assert selector_model.neighbour_scores([inf], [[0.0, None]], [[1.0, 1.0]], [1.0, 1.0]) == [None, None]


def test_neighbour_scores_charge_a_candidate_the_waves_it_leaves_idle_here():
    # at the one tuned key both fill their waves and candidate 0 is 5% faster; here candidate 0's
    # grid leaves half its last wave idle (fill 0.75) and candidate 1's none: candidate 1 wins
    slowdowns, fills = [[0.0, math.log(1.05)]], [[1.0, 1.0]]
    assert selector_model.neighbour_scores([0.5], slowdowns, fills, [1.0, 1.0])[0] < math.log(1.05)
    here = selector_model.neighbour_scores([0.5], slowdowns, fills, [0.75, 1.0])
    assert here[0] == pytest.approx(-math.log(0.75)) and here[1] < here[0]


def test_decode_wave_fill_is_the_share_of_sms_with_a_split_program():
    from dataclasses import replace as with_

    from tunesvc.kernels import decode

    h100 = with_(tunesvc.current_device(), sm_count=132)
    problem = decode.TEMPLATE.problem(B=2, HQ=16, HKV=2, S=4096, D=128)
    config = {"BLOCK_N": 64, "NUM_SPLITS": 8, "num_warps": 4, "num_stages": 3}
    # 2 x 2 x 8 = 32 programs on 132 SMs; 2 x 2 x 64 = 256: every SM has one
    assert decode.TEMPLATE.wave_fill(config, problem, h100) == pytest.approx(32 / 132)
    assert decode.TEMPLATE.wave_fill({**config, "NUM_SPLITS": 64}, problem, h100) == 1.0


def test_matmul_wave_fill_counts_tiles_and_slices_over_the_sms(template):
    from dataclasses import replace as with_

    h100 = with_(tunesvc.current_device(), sm_count=132)
    config = {"VARIANT": "grouped", "BLOCK_M": 128, "BLOCK_N": 256, "SPLIT_K": 1}
    # 8 x 14 = 112 tiles: one wave, 112 of 132 SMs busy; 8 x 20 = 160: two waves, the last 28 busy
    assert template.wave_fill(config, template.problem(M=1000, N=3584, K=64), h100) == pytest.approx(112 / 132)
    assert template.wave_fill(config, template.problem(M=1000, N=5120, K=64), h100) == pytest.approx(160 / 264)
    split = {**config, "BLOCK_M": 16, "BLOCK_N": 64, "SPLIT_K": 4}
    assert template.wave_fill(split, template.problem(M=1, N=2112, K=4096), h100) == pytest.approx(1.0)  # 33 x 4


def test_matmul_wave_fill_of_splittail_is_what_its_cut_leaves_idle(template):
    """splittail fills the SMs no better than whole tiles where tail_split leaves them whole, and
    where it cuts the last wave into slices, better, but short of 1 by the slices' extra steps."""
    from dataclasses import replace as with_

    h100 = with_(tunesvc.current_device(), sm_count=132)
    config = {"VARIANT": "splittail", "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "SPLIT_K": 1}
    whole = template.problem(M=4096, N=4096, K=4096)  # 512 tiles: 3.9 waves, not cut
    assert template.wave_fill(config, whole, h100) == pytest.approx(512 / 528)
    assert template.wave_fill(config, whole, h100) == template.wave_fill({**config, "VARIANT": "tma"}, whole, h100)
    cut = template.problem(M=1000, N=6144, K=4096)  # 192 tiles: the second wave's 60 run as 2 slices of 32 steps
    from tunesvc.kernels.matmul import tail_split

    assert tail_split(192, 64, 64, 132) == (132, 2)
    fill = template.wave_fill(config, cut, h100)
    assert 192 / 264 < fill < 1.0
    assert fill == pytest.approx(192 * 64 / (132 * (64 + 32 + 1600 / 64)))


def _neighbours_set(template, device):
    """A neighbours training set over three real matmul keys (two candidates, with their fills)."""
    shapes = [(16, 45, 29), (64, 45, 29), (128, 70, 50)]
    candidates = tuple(template.feasible(template.problem(M=16, N=45, K=29), device)[:2])
    keys, features, fills = [], [], []
    for m, n, k in shapes:
        problem = template.problem(M=m, N=n, K=k)
        keys.append(str(template.key(problem)))
        features.append(template.selector_features(problem, device))
        fills.append(tuple(template.wave_fill(c, problem, device) for c in candidates))
    times = ((1.0, 2.0), (1.0, None), (2.0, 1.0))
    data = selector_fit.TrainingSet(
        "matmul", template.version, device.hardware_id, candidates, tuple(keys), tuple(features), times, ()
    )
    return replace(data, fills=tuple(fills))


def test_a_neighbours_selector_round_trips_as_json_and_picks_what_its_neighbours_ran_fastest(template, device):
    data = _neighbours_set(template, device)
    selector = selector_fit.fit_neighbours(data)
    assert selector is not None and selector.model == "neighbours" and selector.keys == 3
    again = selector_model.Selector.from_dict(json.loads(json.dumps(selector.to_dict())))
    assert again == selector
    # M=32 (N=45, K=29): nearest M=16 and M=64 ran candidate 0 fastest; M=128 (farther) candidate 1
    near = template.problem(M=32, N=45, K=29)
    assert again.ranked(template, near, device)[0] == data.candidates[0]
    assert "3 nearest of 3 tuned keys" in "\n".join(again.describe())


@pytest.mark.parametrize(
    "damage, pattern",
    [
        (lambda d: d["slowdowns"].pop(), "rows differ"),
        (lambda d: d["fills"][0].__setitem__(0, 0.0), "fills"),
        (lambda d: d["points"].__setitem__(0, "M=0,N=45,K=29,dtype=float16"), "positive dims"),
        (lambda d: d.update(model="forest"), "model"),
    ],
)
def test_a_damaged_neighbours_selector_is_one_clear_error(template, device, damage, pattern):
    data = selector_fit.fit_neighbours(_neighbours_set(template, device)).to_dict()
    damage(data)
    with pytest.raises(TunesvcError, match=pattern):
        selector_model.Selector.from_dict(data)


def test_choose_keeps_the_model_that_picks_faster_left_one_out():
    """Each key's best is its nearest neighbour's, but a feature the tree splits on orders the
    keys otherwise: the tree picks worse than the neighbours, which are kept."""
    data = _keyed([(1.0, 2.0), (1.0, 2.0), (2.0, 1.0), (2.0, 1.0)], [4, 8, 256, 512])
    data = replace(data, features=tuple({"f": f} for f in (0.0, 10.0, 1.0, 11.0)))
    tree, neighbours = selector_fit.leave_one_out(data, "tree"), selector_fit.leave_one_out(data, "neighbours")
    assert neighbours[0] < tree[0]
    chosen, scores = selector_fit.choose(data)
    assert chosen is not None and chosen.model == "neighbours" and scores == neighbours


def test_without_scikit_learn_the_neighbours_model_is_fitted_alone(monkeypatch):
    """A machine without scikit-learn (a fleet node that sweeps) still fits and judges a selector."""
    import importlib.util

    # both models pick equally well here, and a tie goes to the tree ...
    data = _keyed([(1.0, 2.0), (1.0, 2.0), (2.0, 1.0), (2.0, 1.0)], [4, 8, 256, 512])
    assert selector_fit.choose(data)[0].model == "tree"
    # ... which, without scikit-learn, is not fitted: the neighbours are kept
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else real(name, *a))
    assert selector_fit.fitted_models() == ("neighbours",)
    chosen, scores = selector_fit.choose(data)
    assert (
        chosen is not None and chosen.model == "neighbours" and scores == selector_fit.leave_one_out(data, "neighbours")
    )


def _projecting_set(template, device):
    """A neighbours training set over matmul keys M=16, 32, 64 (N=45, K=29) whose first
    candidate, 32 rows tall, ran fastest on every key, and a second one 16 rows tall."""
    base = {"VARIANT": "grouped", "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "SPLIT_K": 1, "FLATTEN": 0, "SUBTILE": 0}
    candidates = (
        {**base, "BLOCK_M": 32, "num_warps": 4, "num_stages": 3},
        {**base, "BLOCK_M": 16, "num_warps": 4, "num_stages": 2},
    )
    keys, features = [], []
    for m in (16, 32, 64):
        problem = template.problem(M=m, N=45, K=29)
        keys.append(str(template.key(problem)))
        features.append(template.selector_features(problem, device))
    times = ((1.0, 2.0), (1.0, 2.0), (1.0, 2.0))
    return selector_fit.TrainingSet(
        "matmul", template.version, device.hardware_id, candidates, tuple(keys), tuple(features), times, ()
    )


def test_a_projecting_selector_launches_the_feasible_config_nearest_its_first_pick(template, device):
    data = _projecting_set(template, device)
    walking = selector_fit.fit_neighbours(data)
    assert walking is not None and not walking.project
    projecting = replace(walking, project=True)
    problem = template.problem(M=9, N=45, K=29)  # no tile taller than 16 rows
    first, second = data.candidates
    assert projecting.ranked(template, problem, device)[0] == first
    assert template.violations(first, problem, device) and not template.violations(second, problem, device)
    assert walking.pick(template, problem, device) == second
    # the first pick at 16 rows, all else kept
    assert projecting.pick(template, problem, device) == {**first, "BLOCK_M": 16}
    # where the first pick fits, both launch it
    fits = template.problem(M=40, N=45, K=29)
    assert projecting.pick(template, fits, device) == walking.pick(template, fits, device) == first
    # kept in its JSON; one stored without the flag walks the ranking
    stored = json.loads(json.dumps(projecting.to_dict()))
    assert selector_model.Selector.from_dict(stored) == projecting
    assert selector_model.PROJECT_LINE in projecting.describe()
    del stored["project"]
    assert not selector_model.Selector.from_dict(stored).project


def test_the_runtime_launches_a_stored_projecting_selectors_repair(template, device, tmp_db):
    projecting = replace(selector_fit.fit_neighbours(_projecting_set(template, device)), project=True)
    store = Store(tmp_db)
    try:
        store.save_selector(template, device.hardware_id, projecting.to_dict(), projecting.keys)
    finally:
        store.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        found = Runtime(db=tmp_db).lookup("matmul", M=9, N=45, K=29)
    assert found.source == "predicted"
    assert found.config == {**projecting.candidates[0], "BLOCK_M": 16}


def test_choose_projects_unless_the_stored_times_say_it_picks_slower():
    # M=4 left out: the others' nearest winner (candidate 0) broke a constraint there, so
    # without projecting the pick is candidate 1, the only one that ran there (1.0x)
    data = _keyed([(None, 2.0), (1.0, 2.0), (1.0, 2.0), (2.0, 1.0)], [4, 8, 16, 32])
    assert selector_fit.choose(data)[0].project is True  # nothing known of a projection: the default
    faster = replace(data, projected=((1.0, None), (None, None), (None, None), (None, None)))
    selector, (ours, _) = selector_fit.choose(faster)
    assert selector.project is True
    # its projection ran M=4 in 1.0 ms, against 2.0 for candidate 1
    assert ours == pytest.approx(selector_fit.leave_one_out(faster, selector.model)[0] * 0.5 ** (1 / 4))
    # 1% slower on one of four keys: within NEAR_BEST, but it would put the selector, tied with
    # the nearest rule without projecting, behind it, and cost it its place
    close = replace(data, projected=((2.02, None), (None, None), (None, None), (None, None)))
    selector, (ours, nearest) = selector_fit.choose(close)
    assert selector.project is False and ours <= nearest
    slower = replace(data, projected=((4.0, None), (None, None), (None, None), (None, None)))
    selector, (ours, _) = selector_fit.choose(slower)
    assert selector.project is False
    assert ours == pytest.approx(selector_fit.leave_one_out(slower, selector.model)[0])


def test_a_model_projects_unless_that_picks_slower_or_puts_it_behind_the_nearest_rule():
    # (selector, nearest rule) leave-one-out scores without and with projecting
    assert selector_fit.projects((1.0, 1.2), (0.9, 1.2))
    assert selector_fit.projects((1.0, 1.2), (1.0 + selector_fit.NEAR_BEST, 1.2))  # slower within NEAR_BEST
    assert not selector_fit.projects((1.0, 1.2), (1.03, 1.2))  # slower beyond it
    assert not selector_fit.projects((1.0, 1.0), (1.01, 1.0))  # no slower than nearest before, behind it after
    assert selector_fit.projects((1.1, 1.0), (1.11, 1.0))  # behind the nearest rule either way


def test_training_set_knows_the_stored_time_of_each_projection(fitted_db, template, device):
    data, stored = _stored(fitted_db, template, device)
    assert len(data.projected) == len(data.keys)
    for key, times, projected in zip(data.keys, data.times, data.projected):
        problem = template.problem_of_key(key)
        for config, ms, projection in zip(data.candidates, times, projected):
            broken = ms is None and template.violations(config, problem, device)
            nearest = template.nearest_feasible(config, problem, device) if broken else None
            assert projection == (stored[key].get(config_hash(nearest)) if nearest is not None else None)


def _heldout():
    """benchmarks/heldout.py as a module (benchmarks/ is not a package)."""
    import importlib.util
    from pathlib import Path

    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(benchmarks))  # its lazy `from _common import ...`
    spec = importlib.util.spec_from_file_location("heldout", benchmarks / "heldout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_heldout_keeps_its_untuned_picks_across_calls_of_one_run(tmp_path, device):
    """--picks: a run split over calls reads each shape's untuned picks before its first call tunes
    it, and a later call reads them from the file, where --db now holds the shape's winner (which
    untuned_picks refuses as no longer held out)."""
    heldout = _heldout()
    import shutil
    from pathlib import Path

    from tunesvc.template import get_template

    db, picks = str(tmp_path / "heldout.db"), str(tmp_path / "picks.json")
    shutil.copyfile(Path(__file__).resolve().parents[1] / "tune.db.example", db)
    matmul = get_template("matmul")
    first, second = (matmul.problem(M=m, N=45, K=70, dtype="float32") for m in (37, 300))
    read = heldout.kept_picks(picks, db, {"matmul": [first]})
    key = str(matmul.key(first))
    assert set(read) == {("matmul", key)} and "heuristic" in read["matmul", key]
    store = Store(db)
    try:
        run_sweep(matmul, [first], store, strategy="grid", budget=2, device=device, refit_selector=False)
    finally:
        store.close()
    with pytest.raises(SystemExit, match="not held out"):
        heldout.untuned_picks(db, {"matmul": [first]})
    again = heldout.kept_picks(picks, db, {"matmul": [first, second]})
    assert again["matmul", key] == read["matmul", key]
    assert ("matmul", str(matmul.key(second))) in again and len(again) == 2


def test_heldout_times_the_selectors_candidates_as_launched_and_only_them(tmp_path, device):
    heldout = _heldout()
    from tunesvc.template import get_template

    matmul = get_template("matmul")
    problem = matmul.problem(M=37, N=45, K=70, dtype="float32")
    tall = {"VARIANT": "grouped", "BLOCK_M": 256, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "SPLIT_K": 1}
    tall |= {"num_warps": 8, "num_stages": 2}
    fits = {**tall, "BLOCK_M": 32, "num_warps": 4}
    # a 256-row tile is taller than 37 rows: it is launched as its nearest feasible config, and
    # a candidate listed twice is timed once
    launched = heldout.launchable(matmul, problem, [tall, fits, dict(fits)])
    assert all(not matmul.violations(c, problem, device) for c in launched)
    assert launched[0] == matmul.nearest_feasible(tall, problem, device) and launched[0]["BLOCK_M"] < 256
    assert len({config_hash(c) for c in launched}) == len(launched)
    best = heldout.best_candidate(matmul, problem, launched, str(tmp_path / "scratch.db"))
    assert config_hash(best) in {config_hash(c) for c in launched}
    # the shape's tiles compute whole BLOCK_M rows: 37 rows of 32-row tiles are 64
    assert heldout.padded(matmul, problem, fits)["M"] == 64
    assert heldout.padded(matmul, matmul.problem(M=64, N=45, K=70), fits) is None
    assert heldout.indices("0-2,9") == {0, 1, 2, 9}
    with pytest.raises(ValueError):
        heldout.indices("0-x")


def test_heldout_reasons_keep_the_tuned_winner_as_its_sweep_timed_it_where_the_peers_are_the_same(device):
    heldout = _heldout()
    from tunesvc.template import get_template

    config = {"VARIANT": "grouped", "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "SPLIT_K": 1}
    config |= {"num_warps": 4, "num_stages": 2}
    matmul, rmsnorm = get_template("matmul"), get_template("rmsnorm")
    problem = matmul.problem(M=64, N=45, K=70, dtype="float32")  # whole 32-row tiles: no padded timing
    [row] = heldout.reasons(matmul, problem, config, {"tuned": 0.5, "peer": 0.4}, swept=(0.3, 0.45))
    assert row["kernel"] == "matmul [tuned, as its sweep timed it]" and row["timing_method"] == "sweep"
    assert (float(row["ours_ms"]), float(row["peer_ms"]), row["peer"]) == (0.3, 0.45, matmul.peer_name)
    assert heldout.reasons(matmul, problem, config, {"tuned": 0.5, "peer": 0.4}) == []  # no sweep: no row
    # the norms' held-out peer is torch.compile, their sweeps' the eager op: not the same ratio
    norm = rmsnorm.problem(M=64, N=512, dtype="float32")
    assert heldout.reasons(rmsnorm, norm, {"BLOCK_N": 512}, {"tuned": 0.5, "peer": 0.4}, swept=(0.3, 0.45)) == []


def test_heldout_times_another_librarys_kernel_for_the_same_op_where_it_imports(monkeypatch, device):
    heldout = _heldout()
    from tunesvc.template import get_template

    matmul, attention = get_template("matmul"), get_template("attention")
    # torch's own ops stand in for a library's: the calls are built from (module, attribute)
    monkeypatch.setattr(
        heldout,
        "TRITON_PEERS",
        (
            ("matmul", "torch mm", "torch", "mm", heldout._operands_call),
            ("matmul", "absent", "no_such_library.ops", "mm", heldout._operands_call),
            ("attention", "torch SDPA", "torch.nn.functional", "scaled_dot_product_attention", heldout._sdpa_call),
        ),
    )
    peers = heldout.triton_peers(matmul)
    assert list(peers) == ["torch mm"]  # one that does not import gives no row
    a, b = matmul.make_inputs(matmul.problem(M=37, N=45, K=29, dtype="float32"), device)
    assert torch.equal(peers["torch mm"]((a, b))(), a @ b)
    problem = attention.problem(B=1, H=2, S=37, D=64, causal=True, dtype="float16")
    inputs = attention.make_inputs(problem, device)
    out = heldout.triton_peers(attention)["torch SDPA"](inputs)()
    reference = attention.reference(inputs)
    assert relative_error(out, reference) < 2e-3  # float16 rounding
    unmasked = heldout.triton_peers(attention)["torch SDPA"](inputs._replace(causal=False))()
    assert relative_error(unmasked, reference) > 0.1  # so causal reached the call
    assert heldout.triton_peers(get_template("rmsnorm")) == {}


def test_heldout_spreads_its_shapes_over_the_visible_gpus_round_robin(monkeypatch):
    heldout = _heldout()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5,7")
    assert heldout.visible_gpus("all", torch_count=3) == ["2", "5", "7"]
    assert heldout.visible_gpus("2", torch_count=3) == ["2", "5"]
    for wrong in ("4", "0", "two"):
        with pytest.raises(SystemExit, match="--gpus .* give 'all' or a number from 1 to 3"):
            heldout.visible_gpus(wrong, torch_count=3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert heldout.visible_gpus("all", torch_count=2) == ["0", "1"]
    args = heldout.argparse.Namespace(
        size="medium", kernels="matmul", budget=16, ceiling=0, candidates=True, no_sweep=False, fit=True
    )
    commands = heldout.child_commands(args, [0, 3, 4, 7, 9], ["2", "5"], "RUN1", ["a.db", "b.db"])
    assert [gpu for gpu, _ in commands] == ["2", "5"]
    (_, first), (_, second) = commands
    assert first[first.index("--shapes") + 1] == "0,4,9" and second[second.index("--shapes") + 1] == "3,7"
    assert first[first.index("--db") + 1] == "a.db" and first[first.index("--run") + 1] == "RUN1"
    assert "--candidates" in first and "--fit" not in first and "--gpus" not in first
    # more GPUs than shapes: the idle ones start nothing
    assert [gpu for gpu, _ in heldout.child_commands(args, [1], ["2", "5"], "RUN1", ["a.db", "b.db"])] == ["2"]


def test_a_spread_heldout_run_fails_when_a_process_fails_and_names_its_gpu(tmp_path, capfd):
    """Each process is heldout.py on one GPU and a copy of the database; here (no GPU) each
    stops at once, and the run says which failed and exits non-zero."""
    heldout = _heldout()
    db = tmp_path / "h.db"
    db.write_bytes(b"")
    args = heldout.argparse.Namespace(
        db=str(db), size="small", kernels="rmsnorm", budget=4, ceiling=0, candidates=False, no_sweep=True
    )
    assert heldout.spread(args, [0, 1, 2], ["0", "1"], "RUN1") == 1
    out, err = capfd.readouterr()
    assert "the processes on GPU 0, 1 failed" in out
    assert err.count("benchmarks/heldout.py needs a CUDA GPU.") == 2
    assert db.exists()  # the copies are the processes' own
    with pytest.raises(SystemExit, match="--db .*missing.db: no such file"):
        heldout.spread(
            heldout.argparse.Namespace(**{**vars(args), "db": str(tmp_path / "missing.db")}), [0], ["0"], "R"
        )


def test_heldout_labels_a_ceiling_sweep_by_its_trials_and_an_exhausted_one_as_all():
    from tunesvc.tuning.sweep import ProblemResult

    heldout = _heldout()
    result = ProblemResult({}, "k", {}, 1.0, {}, None, trials_new=57, trials_stored=89, failures=0, wall_seconds=1.0)
    assert heldout.ceiling_label(result) == "space best of 89"  # stopped by its budget: a sample
    assert heldout.ceiling_label(replace(result, stopped="exhausted")) == "space best of all 89"
