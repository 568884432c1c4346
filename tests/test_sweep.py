"""Sweeps: budgets, resume from the store, winners, and resume (Optuna study included) after a real SIGKILL."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time

import optuna
import pytest

from tunesvc import TunesvcError
from tunesvc import config_hash
from tunesvc.records import MIN_NOISE
from tunesvc.store import Store
from tunesvc.tuning.key import certified
from tunesvc.tuning.sweep import run_sweep


def trial_rows(store, template, device, key):
    return store.trials(store.kernel_version_id(template), store.device_id(device), key)


def test_grid_budget_resume_and_raise(tmp_db, template, device):
    problem = template.problem(M=16, N=32, K=32)  # one program per launch: fast
    store = Store(tmp_db)
    try:
        [first] = run_sweep(template, [problem], store, strategy="grid", budget=3, device=device)
        key = str(template.key(problem))
        assert first.shape_key == key == "M=16,N=32,K=32,dtype=float16"
        assert first.trials_new == 3 and first.trials_stored == 3 and first.failures == 0
        rows = trial_rows(store, template, device, key)
        assert len(rows) == 3
        assert len({r.config_hash for r in rows}) == 3
        assert all(r.status == "ok" and r.time_ms > 0 for r in rows)
        # the heuristic is measured first
        assert rows[0].config == template.heuristic(problem, device) == first.heuristic
        assert first.heuristic_ms == rows[0].time_ms
        # the fastest, or the tie rule's pick among those within its noise (served before: the heuristic)
        chosen = certified(rows, first.heuristic, first.heuristic)
        assert first.winner == chosen.config and first.winner_ms == chosen.time_ms
        [winner] = store.winners()
        assert winner.config == chosen.config and winner.shape_key == key

        # same budget again: everything is already stored
        [again] = run_sweep(template, [problem], store, strategy="grid", budget=3, device=device)
        assert again.trials_new == 0 and again.trials_stored == 3
        assert [r.id for r in trial_rows(store, template, device, key)] == [r.id for r in rows]
        assert again.winner == first.winner

        # a larger budget measures exactly the difference
        [more] = run_sweep(template, [problem], store, strategy="grid", budget=5, device=device)
        assert more.trials_new == 2 and more.trials_stored == 5
        rows5 = trial_rows(store, template, device, key)
        assert len({r.config_hash for r in rows5}) == 5
        assert [r.id for r in rows5[:3]] == [r.id for r in rows]
        # served before: the stored winner
        assert more.winner == certified(rows5, first.winner, first.heuristic).config
        assert store.winners()[0].config == more.winner
    finally:
        store.close()
    # a same-key problem (M=9 buckets to M=16) reuses the stored trials too
    store = Store(tmp_db)
    try:
        [same_key] = run_sweep(template, [template.problem(M=9, N=32, K=32)], store, budget=5, device=device)
        assert same_key.trials_new == 0 and same_key.trials_stored == 5
    finally:
        store.close()


def test_optuna_budget_and_seed(tmp_db, template, device):
    problem = template.problem(M=37, N=45, K=29)
    events = []
    store = Store(tmp_db)
    try:
        [result] = run_sweep(
            template, [problem], store, strategy="optuna", budget=3, seed=7, device=device, on_trial=events.append
        )
        key = str(template.key(problem))
        rows = trial_rows(store, template, device, key)
        assert result.trials_new == 3 and len(rows) == 3
        assert len({r.config_hash for r in rows}) == 3
        for row in rows:
            assert template.violations(dict(row.config), problem, device) == []
            assert row.config_hash == config_hash(dict(row.config))
        assert rows[0].config == template.heuristic(problem, device)  # warm start
        ok = [r for r in rows if r.status == "ok"]
        # the fastest, or the tie rule's pick among those within its noise (the heuristic served before)
        chosen = certified(rows, result.heuristic, result.heuristic)
        assert ok and chosen is not None and result.winner == chosen.config
        assert [e.index for e in events] == [1, 2, 3]
        assert all(e.budget == 3 for e in events)
        assert events[-1].best_ms == result.winner_ms
    finally:
        store.close()


def test_optuna_study_holds_measured_times_only_under_a_readable_name(tmp_path, template, device):
    """A grid sweep, a study under the older name, then an optuna sweep of the same key into a
    SQLite file; read back through Optuna's own API (as optuna-dashboard reads it): every value
    is a stored trial's measured time, every trial without one is pruned or failed and says why,
    the objective is named, and the study's name reads kernel | GPU | key | strategy."""
    db = tmp_path / "study.db"
    url = f"sqlite:///{db}"
    problem = template.problem(M=37, N=45, K=29)
    key = str(template.key(problem))
    old_name = f"tunesvc:{template.name}:{template.version}:{device.fingerprint}:{key}:optuna"
    store = Store(str(db))
    try:
        run_sweep(template, [problem], store, strategy="grid", budget=3, device=device)
        old = optuna.create_study(study_name=old_name, storage=url, direction="minimize")
        old.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=1e9))
        [result] = run_sweep(template, [problem], store, strategy="optuna", budget=8, seed=0, device=device)
        rows = trial_rows(store, template, device, key)
    finally:
        store.close()
    assert result.trials_new == 5 and len(rows) == 8
    summaries = {s.study_name: s for s in optuna.get_all_study_summaries(storage=url)}
    name = f"matmul | {device.name} | {key} | optuna | version {template.version}, device {device.fingerprint[:8]}"
    assert sorted(summaries) == sorted([name, old_name])
    study = optuna.load_study(study_name=name, storage=url)
    assert study.metric_names == ["time_ms"]
    times = {r.config_hash: r.time_ms for r in rows if r.status == "ok"}
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    # the grid's 3 stored trials taught to the new study first (the old one is not read), then the new ones
    assert {config_hash(t.params) for t in complete} == set(times)
    for t in complete:
        assert t.value == times[config_hash(t.params)] < 1e8, t
        assert t.user_attrs["status"] == "ok"
    for t in study.trials:
        if t.state != optuna.trial.TrialState.COMPLETE:
            assert t.state in (optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL), t
            assert t.value is None and (t.user_attrs.get("status") or t.user_attrs.get("unmeasured")), t
            assert t.user_attrs.get("status") != "ok", t
    assert all(t.value is None or t.value < 1e8 for t in study.trials)
    # the study under the older name is kept as it was
    assert [t.value for t in optuna.load_study(study_name=old_name, storage=url).trials] == [1e9]


def test_sweep_of_several_problems(tmp_db, template, device):
    problems = [template.problem(M=16, N=32, K=32), template.problem(M=16, N=32, K=32, dtype="float32")]
    store = Store(tmp_db)
    try:
        results = run_sweep(template, problems, store, budget=2, device=device)
        assert [r.problem for r in results] == problems
        assert len({r.shape_key for r in results}) == 2
        assert {w.shape_key for w in store.winners()} == {r.shape_key for r in results}
        assert store.trial_counts() == {"ok": 4}
    finally:
        store.close()


def test_budget_must_be_positive(tmp_db, template, device):
    store = Store(tmp_db)
    try:
        with pytest.raises(TunesvcError, match="--budget must be at least 1"):
            run_sweep(template, [template.problem(M=16, N=32, K=32)], store, budget=0, device=device)
        assert store.trial_counts() == {}
    finally:
        store.close()


def test_budget_larger_than_the_space_stops_when_exhausted(tmp_db, template, device):
    problem = template.problem(M=1, N=1, K=1)
    n = len(template.feasible(problem, device))
    assert 0 < n <= 24  # smallest tiles only (a few variants, warps and stages): a full sweep is quick
    store = Store(tmp_db)
    try:
        [result] = run_sweep(template, [problem], store, budget=n + 5, device=device)
        assert result.trials_new == n
    finally:
        store.close()


# -- a real kill -------------------------------------------------------------------------------
def count_trials(db: str) -> int:
    """Trials in the file, read-only; 0 while the file or its schema does not exist yet."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.5)
    except sqlite3.OperationalError:
        return 0
    try:
        return con.execute("select count(*) from tunesvc_trials").fetchone()[0]
    except sqlite3.OperationalError:  # no such table yet, database is locked
        return 0
    finally:
        con.close()


def study_params(db: str) -> list[dict]:
    """The params of every trial of the one Optuna study in the database, in order; for a trial
    enqueued but not yet sampled (a sweep killed between the two), the params it was enqueued with."""
    [name] = optuna.get_all_study_names(storage=f"sqlite:///{db}")
    return [
        t.params or t.system_attrs.get("fixed_params", {})
        for t in optuna.load_study(study_name=name, storage=f"sqlite:///{db}").trials
    ]


@pytest.mark.parametrize(
    ("strategy", "workers"),
    [("grid", []), ("optuna", []), ("grid", ["--workers", "2"])],
    ids=["a-trial-per-transaction", "optuna-study-resumed", "batches-of-2"],
)
def test_resume_after_sigkill(tmp_path, strategy, workers):
    db = str(tmp_path / "killed.db")
    cmd = [
        sys.executable,
        "-m",
        "tunesvc",
        "sweep",
        "matmul",
        "--shape",
        "40x40x40",
        "--budget",
        "12",
        "--strategy",
        strategy,
        "--db",
        db,
        *workers,
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        seen = 0
        while time.monotonic() < deadline and proc.poll() is None:
            seen = count_trials(db)
            if seen >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"sweep ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
        assert seen >= 2
        proc.kill()  # SIGKILL: no cleanup, no atexit, no commit of anything in flight
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert proc.returncode == -9
    after_kill = count_trials(db)
    assert 2 <= after_kill < 12
    killed_study = study_params(db) if strategy == "optuna" else []
    with contextlib.closing(sqlite3.connect(db)) as con:
        stored_at_kill = {config_hash(json.loads(c)) for (c,) in con.execute("select config from tunesvc_trials")}

    rerun = subprocess.run([*cmd, "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    [resumed] = json.loads(rerun.stdout)
    assert (resumed["trials_stored"], resumed["trials_new"]) == (12, 12 - after_kill)

    con = sqlite3.connect(db)
    try:
        assert con.execute("pragma integrity_check").fetchone() == ("ok",)
        assert con.execute("select count(*) from tunesvc_trials").fetchone() == (12,)
        assert con.execute("select count(distinct config_hash) from tunesvc_trials").fetchone() == (12,)
        [(winner_hash, winner_ms)] = con.execute("select config_hash, time_ms from tunesvc_winners").fetchall()
        best_ms, best_spread = con.execute(
            "select time_ms, spread from tunesvc_trials where status = 'ok' order by time_ms limit 1"
        ).fetchone()
        # the fastest, or one tied with it (within its noise interval: the tie rule's pick)
        assert winner_ms <= best_ms * (1 + max(best_spread, MIN_NOISE))
        assert con.execute("select time_ms from tunesvc_trials where config_hash = ?", (winner_hash,)).fetchone() == (
            winner_ms,
        )
        statuses = sorted(r[0] for r in con.execute("select status from tunesvc_sweeps"))
        assert statuses == ["done", "running"]  # the killed sweep never finished
        stored = {config_hash(json.loads(c)) for (c,) in con.execute("select config from tunesvc_trials")}
    finally:
        con.close()
    if strategy == "optuna":
        # the study records measured trials only, each after the store holds it: the killed one
        # holds stored configs alone (the last batch's may be missing, killed between the two
        # writes); the rerun resumed it in the same file, its trials first, then every stored
        # config told to it
        assert {config_hash(p) for p in killed_study} <= stored_at_kill
        study = study_params(db)
        assert study[: len(killed_study)] == killed_study
        assert stored <= {config_hash(p) for p in study}


def test_compiler_pool_launches_in_workers_and_reports_failures(template, device):
    from tunesvc.bench import Compiler

    problem = template.problem(M=24, N=40, K=36)
    good = template.heuristic(problem, device)
    bad = {**good, "BLOCK_M": 24}  # tl.arange needs a power of two: fails in the worker
    with Compiler(2) as compiler:
        outcome = compiler.compile(template, problem, [good, bad])
    assert outcome[0] is None
    assert outcome[1] is not None and "power of 2" in outcome[1].lower().replace("two", "2")


def test_sweep_with_compile_workers_measures_every_trial_once(tmp_db, template, device):
    """A batch (one candidate per compile worker) is stored in one transaction, before it is
    reported; the pool's first batch stores its first candidate alone, before the pool starts."""
    problem = template.problem(M=24, N=40, K=36)
    seen: list[tuple[str, int]] = []  # (config hash, trial rows committed when it was reported)
    store = Store(tmp_db)
    try:
        [result] = run_sweep(
            template,
            [problem],
            store,
            budget=4,
            device=device,
            workers=2,
            on_trial=lambda event: seen.append((config_hash(event.config), count_trials(tmp_db))),
        )
        rows = trial_rows(store, template, device, result.shape_key)
    finally:
        store.close()
    assert result.trials_new == 4 and result.trials_stored == 4
    assert result.winner is not None and result.failures == 0
    assert [n for _, n in seen] == [1, 2, 4, 4]
    assert [h for h, _ in seen] == [r.config_hash for r in rows]
    stamps = [r.created_at for r in rows]  # one transaction per batch: one timestamp per batch
    assert stamps[0] != stamps[1] != stamps[2] == stamps[3]


def test_the_first_trial_is_stored_before_the_compile_pool_starts(tmp_db, tmp_path, template, device, monkeypatch):
    """The pool is made unstarted; its workers start once the first candidate, compiled by the
    measuring process itself, is measured and stored on its own; the timeline says when."""
    from tunesvc.bench import Compiler
    from tunesvc.timeline import read

    log = tmp_path / "timeline.jsonl"
    monkeypatch.setenv("TUNESVC_TIMELINE", str(log))
    monkeypatch.setattr("tunesvc.timeline._seen", set())  # this process's marks of earlier tests
    stored_at_start: list[int] = []
    start = Compiler.start

    def counted(self):
        if not self.started:
            stored_at_start.append(count_trials(tmp_db))
        start(self)

    monkeypatch.setattr(Compiler, "start", counted)
    store = Store(tmp_db)
    try:
        [result] = run_sweep(template, [template.problem(M=24, N=40, K=36)], store, budget=3, device=device, workers=2)
    finally:
        store.close()
    assert result.trials_new == 3 and result.failures == 0
    assert stored_at_start == [1]  # one pool start, with the first trial in the database
    events = read(str(log))
    names = [e["event"] for e in events]
    assert (
        names.index("first trials stored") < names.index("compile pool started") < names.index("compile worker started")
    )
    assert next(e for e in events if e["event"] == "first trials stored")["trials"] == 1
    assert next(e for e in events if e["event"] == "compile pool started")["workers"] == 2


def test_a_sweep_of_one_trial_never_starts_its_compile_pool(tmp_db, template, device, monkeypatch):
    from tunesvc.bench import Compiler

    started: list[bool] = []
    monkeypatch.setattr(Compiler, "start", lambda self: started.append(True))
    store = Store(tmp_db)
    try:
        [result] = run_sweep(template, [template.problem(M=24, N=40, K=36)], store, budget=1, device=device, workers=2)
    finally:
        store.close()
    assert result.trials_new == 1 and result.winner is not None and not started


@pytest.mark.parametrize("strategy", ["grid", "optuna"])
def test_the_first_trial_stored_alone_changes_no_config_measured(tmp_path, template, device, strategy):
    """The same sweep with its pool's first batch stored at once (a pool started before the
    sweep, as before the first trial was stored on its own) measures and stores the same configs."""
    from tunesvc.bench import Compiler

    problem = template.problem(M=24, N=40, K=36)
    stored = {}
    for way in ("first alone", "batch at once"):
        db = str(tmp_path / f"{way}.db")
        store = Store(db)
        try:
            if way == "first alone":
                [result] = run_sweep(template, [problem], store, strategy=strategy, budget=5, device=device, workers=2)
            else:
                with Compiler(2, template=template, problem=problem) as compiler:
                    [result] = run_sweep(
                        template,
                        [problem],
                        store,
                        strategy=strategy,
                        budget=5,
                        device=device,
                        workers=2,
                        compiler=compiler,
                    )
            rows = trial_rows(store, template, device, result.shape_key)
        finally:
            store.close()
        assert result.trials_new == 5 and result.failures == 0
        # within a batch, trials are stored in the order their compiles finish
        stored[way] = (sorted(r.config_hash for r in rows[:2]), sorted(r.config_hash for r in rows[2:]))
    assert stored["first alone"] == stored["batch at once"]


def test_sweep_reports_what_it_is_doing(tmp_db, template, device):
    """The CLI's progress bar shows these phases: measuring, the torch peer, done (in order)."""
    problem = template.problem(M=16, N=32, K=32)
    phases: list[tuple[str, str]] = []
    store = Store(tmp_db)
    try:
        [result] = run_sweep(
            template, [problem], store, budget=2, device=device, on_phase=lambda key, what: phases.append((key, what))
        )
    finally:
        store.close()
    whats = [what for key, what in phases]
    assert {key for key, _ in phases} == {result.shape_key}
    assert whats[0] == "checking and timing" and whats[-1] == "done"
    assert "timing the torch peer" in whats and whats.index("timing the torch peer") < len(whats) - 1


def test_phases_say_where_the_wall_time_went(tmp_db, template, device):
    from tunesvc.tuning.sweep import PHASES

    problem = template.problem(M=24, N=40, K=36)
    store = Store(tmp_db)
    try:
        [result] = run_sweep(template, [problem], store, budget=3, device=device, workers=2, isolate=True, finalists=2)
    finally:
        store.close()
    phases = result.phases
    assert set(phases) <= set(PHASES)
    for phase in (
        "start",
        "set-up",
        "measurer start",
        "waiting for compiles",
        "checking and timing",
        "trial writes",
        "finalists",
        "torch peer",
        "measurer stop",
        "winner",
    ):
        assert phases[phase] >= 0, phase
    assert phases["checking and timing"] > 0 and phases["finalists"] > 0
    assert sum(phases.values()) == pytest.approx(result.wall_seconds)


def test_compile_pool_size(device):
    from dataclasses import replace

    from tunesvc.tuning.sweep import _pool_size

    gpu = replace(device, kind="cuda")
    cores = os.cpu_count() or 1
    assert _pool_size(None, device, "grid", None, None) == 0  # the interpreter has nothing to compile
    assert _pool_size(None, gpu, "grid", None, None) == min(16, cores)
    assert _pool_size(None, gpu, "optuna", None, None) == min(8, cores)
    assert _pool_size(None, gpu, "grid", None, 3) == min(3, cores)  # 3 of the candidates fit
    assert _pool_size(12, gpu, "optuna", 5, None) == 5
    assert _pool_size(2, device, "grid", None, 11) == 2


def test_clock_phases_nest_and_add_up_to_the_wall_time():
    from tunesvc.tuning.sweep import Clock

    clock = Clock()
    with clock.phase("search"):
        with clock.phase("trial writes"):
            time.sleep(0.02)
        assert list(clock.each(iter([1, 2]), "waiting for compiles")) == [1, 2]
    wall = clock.elapsed()
    assert set(clock.phases) == {"set-up", "search", "trial writes", "waiting for compiles"}
    assert clock.phases["trial writes"] >= 0.02 > clock.phases["search"]  # the inner phase's time is its own
    assert sum(clock.phases.values()) == pytest.approx(wall, abs=1e-3)


def test_patience_counts_new_trials_that_do_not_beat_the_best_by_the_margin():
    from tunesvc.bench import Measurement
    from tunesvc.bench import Status
    from tunesvc.tuning.sweep import Patience

    rule = Patience(2, min_improvement=0.01, best_ms=1.0)
    rule.tell(Measurement(Status.OK, time_ms=0.995))  # faster, but by less than 1%
    assert not rule.done() and rule.best_ms == 0.995
    rule.tell(Measurement(Status.WRONG_RESULT))
    assert rule.done()
    rule.tell(Measurement(Status.OK, time_ms=0.5))
    assert not rule.done() and rule.since_improved == 0
