"""Deployment-matched timing: a sweep times as the program will run (graph or eager), and the
timing is part of the trials' and winners' identity (tunesvc.bench, tunesvc.tuning.key)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tunesvc import Status
from tunesvc import config_hash
from tunesvc.bench import Bench
from tunesvc.bench import Measurement
from tunesvc.cli import app
from tunesvc.store import Store
from tunesvc.tuning.key import KeyTuning
from tunesvc.tuning.sweep import run_sweep

PROBLEM = {"M": 16, "N": 32, "K": 32}  # one program per launch: fast in the interpreter


def tune(*args: str):
    return CliRunner().invoke(app, list(args))


def ok(ms: float, spread: float = 0.05) -> Measurement:
    return Measurement(Status.OK, time_ms=ms, spread=spread, reps=3, rel_error=1e-4, message="timed: eager")


def test_eager_bench_times_loops_of_launches_and_interleaves_finalists(template, device):
    problem = template.problem(**PROBLEM)
    bench = Bench(template, problem, device, rep_ms=10.0, timing="eager")
    heuristic = template.heuristic(problem, device)
    m = bench.measure(heuristic)
    assert m.ok and m.time_ms > 0 and m.message.startswith("timed: eager")
    other = next(c for c in template.feasible(problem, device) if config_hash(c) != config_hash(heuristic))
    assert bench.measure(other).ok
    together = bench.time_together([heuristic, other])
    assert all(t.ok and "eager, timed together" in t.message for t in together)
    graph = Bench(template, problem, device, rep_ms=10.0).measure(heuristic)
    assert graph.ok and not graph.message.startswith("timed: eager")
    with pytest.raises(ValueError):
        Bench(template, problem, device, timing="cuda")


def test_an_eager_sweep_measures_the_graph_winner_first_and_stores_its_own_winner(tmp_db, template, device):
    problem = template.problem(**PROBLEM)
    store = Store(tmp_db)
    try:
        [graph] = run_sweep(template, [problem], store, budget=3, device=device)
        [eager] = run_sweep(template, [problem], store, budget=3, device=device, timing="eager")
        assert (graph.timing, eager.timing) == ("graph", "eager") and eager.trials_new == 3
        kv, dev = store.kernel_version_id(template), store.device_id(device)
        rows = store.trials(kv, dev, graph.shape_key, timing="eager")
        assert rows[0].config == graph.winner  # the graph winner, measured first, eagerly
        assert all(r.timing == "eager" and r.message.startswith("timed: eager") for r in rows)
        by_hash = {r.config_hash: r for r in rows}
        winners = {w.timing: w for w in store.winners(kernel=template.name, timing=None)}
        assert set(winners) == {"graph", "eager"} and winners["graph"].config == graph.winner
        # never slower than the graph winner timed eagerly beside it
        assert not eager.graph_kept
        assert winners["eager"].time_ms <= by_hash[config_hash(graph.winner)].time_ms
        assert [w.timing for w in store.winners(kernel=template.name)] == ["graph"]  # graph's, by default
    finally:
        store.close()


def test_an_eager_choice_slower_than_the_graph_winner_timed_eagerly_is_not_stored(tmp_db, template, device):
    """The rule through the one routine (KeyTuning.finish), on trials stored with known times: the
    tie rule picks the heuristic (within the noise of the fastest), which is slower than the
    graph winner timed eagerly, so no eager winner is stored; a faster choice is."""
    problem = template.problem(**PROBLEM)
    configs = template.feasible(problem, device)
    heuristic = template.heuristic(problem, device)
    graph_winner = next(c for c in configs if config_hash(c) != config_hash(heuristic))
    store = Store(tmp_db)
    try:
        kv, dev, key = store.kernel_version_id(template), store.device_id(device), str(template.key(problem))
        sweep = store.start_sweep(kv, dev, key, problem, "grid", None, 0)
        store.add_trials(sweep, kv, dev, key, [(graph_winner, config_hash(graph_winner), ok(0.5))])
        store.update_winner(kv, dev, key)

        def eager_tuning() -> KeyTuning:
            return KeyTuning(
                store, kv, dev, key, problem=problem, strategy="grid", heuristic=heuristic, timing="eager",
                baseline=graph_winner,
            )  # fmt: skip

        tuning = eager_tuning()
        tuning.record(
            [(graph_winner, config_hash(graph_winner), ok(1.00)), (heuristic, config_hash(heuristic), ok(1.02))]
        )
        outcome = tuning.finish()
        assert outcome.baseline_kept and outcome.winner is None
        assert [w.timing for w in store.winners(timing=None)] == ["graph"]

        third = next(c for c in configs if config_hash(c) not in {config_hash(graph_winner), config_hash(heuristic)})
        tuning = eager_tuning()
        tuning.record([(third, config_hash(third), ok(0.60, spread=0.0))])  # faster than both, beyond their noise
        outcome = tuning.finish()
        assert not outcome.baseline_kept and outcome.winner.config == third and outcome.winner.timing == "eager"
        assert {w.timing: w.config for w in store.winners(timing=None)} == {"graph": graph_winner, "eager": third}
    finally:
        store.close()


def test_a_bad_timing_is_one_sentence(tmp_path):
    db = tmp_path / "t.db"
    result = tune("sweep", "matmul", "--shape", "16x32x32", "--budget", "1", "--timing", "grap", "--db", str(db))
    assert result.exit_code != 0
    assert "Unknown timing 'grap' (did you mean 'graph'?); use one of graph, eager." in result.output
    assert "Traceback" not in result.output and not db.exists()


@pytest.mark.parametrize("where", [["--gpus", "0"], ["--ray", "auto"]])
def test_eager_timing_is_refused_for_sweeps_on_workers(tmp_path, where):
    db = tmp_path / "t.db"
    result = tune("sweep", "matmul", "--shape", "16x32x32", "--timing", "eager", *where, "--db", str(db))
    assert result.exit_code != 0
    assert "--timing eager sweeps in this process only" in result.output
    assert not db.exists()  # no data changed


def seeded(db: str, template, device) -> tuple[dict[str, dict], list]:
    """A database whose key 'both' has a graph and an eager winner (other configs), 'graph' a
    graph winner only and 'eager' an eager one only; returns the keys' problems and the configs."""
    configs = template.feasible(template.problem(**PROBLEM), device)[:3]
    problems = {"both": PROBLEM, "graph": {"M": 32, "N": 32, "K": 32}, "eager": {"M": 64, "N": 32, "K": 32}}
    store = Store(db)
    try:
        kv, dev = store.kernel_version_id(template), store.device_id(device)
        for name, problem in problems.items():
            key = str(template.key(template.problem(**problem)))
            sweep = store.start_sweep(kv, dev, key, problem, "grid", None, 0)
            for timing, config in (("graph", configs[0]), ("eager", configs[1])):
                if name in ("both", timing):
                    store.add_trials(sweep, kv, dev, key, [(config, config_hash(config), ok(1.0))], timing=timing)
                    store.update_winner(kv, dev, key, timing=timing)
    finally:
        store.close()
    return problems, configs


@pytest.mark.parametrize("timing", ["graph", "eager"])
def test_the_runtime_serves_its_timings_winner_else_the_keys_only_one(tmp_db, template, device, monkeypatch, timing):
    from tunesvc import Runtime

    problems, configs = seeded(tmp_db, template, device)
    monkeypatch.setenv("TUNESVC_TIMING", timing)
    runtime = Runtime(db=tmp_db, device=device)
    assert runtime.timing == timing
    answers = {name: runtime.lookup("matmul", **problem) for name, problem in problems.items()}
    assert {a.source for a in answers.values()} == {"exact"}
    assert answers["both"].config == (configs[0] if timing == "graph" else configs[1])
    assert answers["graph"].config == configs[0] and answers["eager"].config == configs[1]


def test_an_eager_runtime_serves_the_graph_winner_inside_cuda_graph_capture(tmp_db, template, device, monkeypatch):
    """No CUDA graph can be captured in the interpreter: capture is stood in for by the one
    function the runtime asks (tunesvc.serving.runtime.capturing)."""
    import tunesvc.serving.runtime as runtime_module
    from tunesvc import Runtime

    problems, configs = seeded(tmp_db, template, device)
    runtime = Runtime(db=tmp_db, device=device, timing="eager")
    assert runtime.lookup("matmul", **problems["both"]).config == configs[1]
    runtime.launch_configs[("k",)] = configs[1]
    monkeypatch.setattr(runtime_module, "capturing", lambda: True)
    assert runtime.lookup("matmul", **problems["both"]).config == configs[0]
    assert runtime.config_for(template, **problems["both"]) == configs[0]
    assert runtime.launch_configs.get(("k",)) is None  # the twin's memo, not the eager one's
    monkeypatch.setattr(runtime_module, "capturing", lambda: False)
    assert runtime.launch_configs.get(("k",)) == configs[1]


def test_a_bad_tunesvc_timing_is_one_warning_and_graph(monkeypatch):
    from tunesvc import settings

    monkeypatch.setenv("TUNESVC_TIMING", "cuda-graph")
    with pytest.warns(RuntimeWarning, match=r"TUNESVC_TIMING='cuda-graph' is not a timing \(use one of graph, eager\)"):
        assert settings.timing() == "graph"


def test_a_bundle_round_trip_keeps_eager_winners_and_show_has_a_timing_column(tmp_path, template, device):
    import json

    from tunesvc import Runtime

    db, bundle, back = str(tmp_path / "a.db"), tmp_path / "b.json", str(tmp_path / "back.db")
    problems, configs = seeded(db, template, device)
    result = tune("export", "--db", db, "--out", str(bundle))
    assert result.exit_code == 0, result.output
    data = json.loads(bundle.read_text())
    section = data["kernels"]["matmul"]
    assert data["format_version"] == 2 and len(section["winners"]) == 2 and len(section["eager_winners"]) == 2
    # a reader that knows no eager_winners serves the graph winners; this one serves by its timing
    graph = Runtime(bundle=bundle, device=device, timing="graph")
    eager = Runtime(bundle=bundle, device=device, timing="eager")
    assert graph.lookup("matmul", **problems["both"]).config == configs[0]
    assert eager.lookup("matmul", **problems["both"]).config == configs[1]
    assert graph.lookup("matmul", **problems["eager"]).config == configs[1]  # the key's only winner
    for source in (str(bundle), db):  # a bundle, and a database
        result = tune("import", source, "--db", back)
        assert result.exit_code == 0, result.output
    store = Store(back, readonly=True)
    try:
        found = sorted((w.shape_key, w.timing, config_hash(w.config)) for w in store.winners(timing=None))
    finally:
        store.close()
    source = Store(db, readonly=True)
    try:
        expected = sorted((w.shape_key, w.timing, config_hash(w.config)) for w in source.winners(timing=None))
    finally:
        source.close()
    assert found == expected and {t for _, t, _ in found} == {"graph", "eager"}
    shown = tune("show", "--db", back)
    assert shown.exit_code == 0, shown.output
    assert "timing" in shown.output and "eager" in shown.output and "graph" in shown.output


def test_verify_re_measures_each_winner_with_its_own_timing(tmp_db, template, device):
    from tunesvc.verify import verify

    seeded(tmp_db, template, device)
    store = Store(tmp_db)
    try:
        verdicts = verify(store, kernel="matmul", device=device)
    finally:
        store.close()
    assert sorted(v.timing for v in verdicts) == ["eager", "eager", "graph", "graph"]
    assert all(v.measured_ms is not None for v in verdicts)
