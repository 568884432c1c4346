"""Shared sweeps (tunesvc.fleet.jobs): atomic claims, stale jobs released, done jobs never run again.

Claims race in threads with a store each, on both backends; the worker processes are real
(`python -m tunesvc.fleet.jobs`, the interpreter standing in for GPUs), on the matmul 'tiny' problems.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest
from _backends import db_url  # noqa: F401  (fixture: a SQLite file, a PostgreSQL database)
from sqlalchemy import func
from sqlalchemy import select
from typer.testing import CliRunner

from tunesvc import Status
from tunesvc import TunesvcError
from tunesvc import config_hash
from tunesvc.bench import Measurement
from tunesvc.cli import app
from tunesvc.fleet import jobs
from tunesvc.store import Store
from tunesvc.store.models import Job
from tunesvc.store.models import Trial

BUDGET = 3


def _queue(store: Store, template, device, problems, budget: int = BUDGET) -> str:
    batch = jobs.batch_name("matmul", template, problems, "grid", budget, 0, device)
    jobs.enqueue(store, batch, "matmul", template, problems, "grid", budget, 0)
    return batch


def _problems(template, n: int) -> list[dict]:
    """n problems with distinct shape keys (M is bucketed to powers of two, N is not)."""
    return [template.problem(M=17, N=20 + i, K=11, dtype="float16") for i in range(n)]


def test_worker_slots():
    assert jobs.worker_slots("all", 2) == ["0", "1"]
    assert jobs.worker_slots("1", 2) == ["1"]
    assert jobs.worker_slots(" 0, 1 ", 4) == ["0", "1"]
    assert jobs.worker_slots("all", 0) == [None]
    assert jobs.worker_slots("0,1", 0) == [None, None]  # no GPU: interpreter workers
    # never more workers than jobs, nor interpreter workers than cores: each imports torch first
    assert jobs.worker_slots("0,1,2,3", 4, jobs=2) == ["0", "1"]
    assert jobs.worker_slots("all", 8, jobs=0) == ["0"]
    many = ",".join(str(i) for i in range(64))
    assert jobs.worker_slots(many, 0) == [None] * min(64, os.cpu_count() or 1)
    for bad in ("", "x", "0,0", "-1", "1.5"):
        with pytest.raises(TunesvcError, match="--gpus takes 'all' or distinct GPU indices"):
            jobs.worker_slots(bad, 2)
    with pytest.raises(TunesvcError, match="names a GPU this host lacks; it has 2"):
        jobs.worker_slots("0,2", 2)


def test_enqueue_is_idempotent_and_the_batch_depends_on_the_arguments(db_url, template, device):
    store = Store(db_url)
    try:
        problems = _problems(template, 3)
        batch = _queue(store, template, device, problems)
        assert jobs.enqueue(store, batch, "matmul", template, problems, "grid", BUDGET, 0) == 0  # a second host
        assert [j.status for j in jobs.jobs(store, batch)] == ["pending"] * 3
        assert jobs.batch_name("matmul", template, problems[::-1], "grid", BUDGET, 0, device) == batch
        assert jobs.batch_name("matmul", template, problems, "grid", BUDGET + 1, 0, device) != batch
    finally:
        store.close()


def test_the_costliest_jobs_are_claimed_first(tmp_path, template, device):
    """Longest job first: a slow shape is not left as the last job while other workers idle."""
    store = Store(str(tmp_path / "jobs.db"))
    try:
        problems = [
            template.problem(M=m, N=n, K=k, dtype="float16")
            for m, n, k in [(16, 40, 16), (300, 200, 100), (17, 20, 11), (64, 64, 600), (40, 16, 16)]
        ]
        batch = _queue(store, template, device, problems)
        claimed = [jobs.claim(store, batch, f"w{i}").problem for i in range(len(problems))]  # a worker holds one
        flops = [template.cost(p).flops for p in claimed]
        assert flops == sorted((template.cost(p).flops for p in problems), reverse=True)
        assert claimed == [
            problems[1],
            problems[3],
            problems[0],
            problems[4],
            problems[2],
        ]  # a tie (same cost): as given
        assert jobs.claim(store, batch, "w5") is None
    finally:
        store.close()


def test_each_job_is_claimed_by_exactly_one_of_many_racing_workers(db_url, template, device):
    store = Store(db_url)
    batch = _queue(store, template, device, _problems(template, 12))
    claimed: dict[str, list[int]] = {}
    errors: list[str] = []
    start = threading.Barrier(6)

    def worker(name: str) -> None:
        mine = claimed.setdefault(name, [])
        own = Store(db_url)
        try:
            start.wait()
            while (job := jobs.claim(own, batch, name)) is not None:
                mine.append(job.id)
                assert jobs.finish(own, job.id, name)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            own.close()

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    try:
        assert errors == []
        ids = sorted(i for mine in claimed.values() for i in mine)
        assert ids == sorted(j.id for j in jobs.jobs(store, batch))  # each once, none left
        assert {j.status for j in jobs.jobs(store, batch)} == {"done"}
        assert {j.attempts for j in jobs.jobs(store, batch)} == {1}
    finally:
        store.close()


def test_a_stale_job_is_released_and_a_done_one_never_runs_again(db_url, template, device):
    store = Store(db_url)
    try:
        batch = _queue(store, template, device, _problems(template, 2))
        first = jobs.claim(store, batch, "a")
        assert jobs.finish(store, first.id, "a")
        second = jobs.claim(store, batch, "b")
        assert jobs.claim(store, batch, "c") is None  # nothing pending
        assert jobs.release_stale(store, batch, stale_s=60) == 0  # b heartbeats recently
        time.sleep(0.05)
        assert jobs.release_stale(store, batch, stale_s=0.01) == 1  # b stopped: died
        again = jobs.claim(store, batch, "c")
        assert again.id == second.id
        assert not jobs.heartbeat(store, second.id, "b")  # b lost it: its late finish changes nothing
        assert not jobs.finish(store, second.id, "b")
        assert jobs.finish(store, again.id, "c")
        time.sleep(0.05)
        assert jobs.release_stale(store, batch, stale_s=0.01) == 0  # done jobs stay done
        assert jobs.claim(store, batch, "d") is None
        rows = {j.id: j for j in jobs.jobs(store, batch)}
        assert (rows[first.id].status, rows[first.id].attempts) == ("done", 1)
        assert (rows[second.id].status, rows[second.id].attempts, rows[second.id].worker) == ("done", 2, "c")
    finally:
        store.close()


def _trials_per_key(store: Store) -> dict[str, tuple[int, int]]:
    """shape key -> (trial rows, distinct configs)."""
    with store.session() as session:
        query = select(Trial.shape_key, func.count(), func.count(func.distinct(Trial.config_hash))).group_by(
            Trial.shape_key
        )
        return {key: (n, distinct) for key, n, distinct in session.execute(query)}


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "python -m tunesvc.fleet.jobs"])
def test_a_worker_killed_mid_job_has_its_job_finished_by_another(tmp_db, template, device, forked, monkeypatch):
    """Workers are forked from a process without CUDA, else started anew (one that has used CUDA)."""
    import tunesvc.device

    if not forked:
        monkeypatch.setattr(tunesvc.device, "can_fork_gpu_children", lambda: False)
    store = Store(tmp_db)
    problems = [template.problem(**p, dtype="float16") for p in template.presets["tiny"]]
    batch = _queue(store, template, device, problems, budget=4)
    processes = jobs.spawn_workers(tmp_db, batch, [None, None], stale_s=3, heartbeat_s=0.3)
    assert all(p.forked == forked for p in processes)
    victim = None
    try:
        deadline = time.monotonic() + 120
        while victim is None and time.monotonic() < deadline:
            counts = _trials_per_key(store)
            for job in jobs.jobs(store, batch):
                if job.status == "running" and 0 < counts.get(job.shape_key, (0, 0))[0] < 4:
                    victim = job
                    break
            time.sleep(0.05)
        assert victim is not None, "no job was ever seen mid-sweep"
        pid = int(victim.worker.split(":")[1])
        os.kill(pid, signal.SIGKILL)
        killed = next(p for p in processes if p.pid == pid)
        survivor = next(p for p in processes if p.pid != pid)
        assert killed.wait(timeout=30) == -signal.SIGKILL
        assert survivor.wait(timeout=180) == 0
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    rows = {j.id: j for j in jobs.jobs(store, batch)}
    assert {j.status for j in rows.values()} == {"done"}
    assert rows[victim.id].attempts == 2 and rows[victim.id].worker != victim.worker
    assert _trials_per_key(store) == {str(template.key(p)): (4, 4) for p in problems}  # none lost, none twice
    assert len(store.winners(kernel="matmul")) == 2
    store.close()


def test_tune_sweep_gpus_runs_one_worker_per_index(tmp_db, template):
    result = CliRunner().invoke(
        app, ["sweep", "matmul", "--preset", "tiny", "--budget", "2", "--gpus", "0,1", "--db", tmp_db, "--json"]
    )
    assert result.exit_code == 0, result.output
    store = Store(tmp_db, readonly=True)
    try:
        [batch] = {j.batch for j in _all_jobs(store)}
        rows = jobs.jobs(store, batch)
        assert [j.status for j in rows] == ["done", "done"]
        winners = {w.shape_key: w for w in store.winners(kernel="matmul")}
        assert set(winners) == {j.shape_key for j in rows}
        assert _trials_per_key(store) == {j.shape_key: (2, 2) for j in rows}
    finally:
        store.close()
    # the same sweep again (another host joining late): every job is done, nothing runs again
    store = Store(tmp_db)
    try:
        problems = [template.problem(**p, dtype="float16") for p in template.presets["tiny"]]
        assert jobs.enqueue(store, batch, "matmul", template, problems, "grid", 2, 0) == 0
        assert jobs.work(tmp_db, batch, log=lambda line: None) == 0
        assert {j.attempts for j in jobs.jobs(store, batch)} == {1}
        assert sum(n for n, _ in _trials_per_key(store).values()) == 4
    finally:
        store.close()


def test_tune_sweep_gpus_passes_time_budget_patience_and_workers_to_every_job(tmp_path, template, device):
    """Each key starts from a stored trial that nothing beats: with --patience 1 a job measures
    one more batch and stops; with a time budget already spent it measures none."""
    problems = [template.problem(**p, dtype="float16") for p in template.presets["tiny"]]
    keys = {str(template.key(p)) for p in problems}
    patient, hurried = str(tmp_path / "patience.db"), str(tmp_path / "time.db")
    for db in (patient, hurried):
        store = Store(db)
        try:
            kv, dev = store.kernel_version_id(template), store.device_id(device)
            for p in problems:
                key, first = str(template.key(p)), template.feasible(p, device)[0]
                sweep = store.start_sweep(kv, dev, key, dict(p), "grid", None, 0)
                store.add_trial(
                    sweep, kv, dev, key, first, config_hash(first), Measurement(Status.OK, time_ms=1e-9, reps=1)
                )
        finally:
            store.close()
    sweep = ["sweep", "matmul", "--preset", "tiny", "--budget", "6", "--gpus", "0,1", "--json"]

    result = CliRunner().invoke(app, [*sweep, "--patience", "1", "--workers", "2", "--db", patient])
    assert result.exit_code == 0, result.output
    store = Store(patient, readonly=True)
    try:
        assert [j.status for j in _all_jobs(store)] == ["done", "done"]
        # the stored one and one batch of new ones (--workers 2: two compiled and measured at a time),
        # after which patience stops the job: not the 6 of --budget
        assert _trials_per_key(store) == {key: (3, 3) for key in keys}
    finally:
        store.close()

    result = CliRunner().invoke(app, [*sweep, "--time-budget", "1e-6", "--db", hurried])
    assert result.exit_code == 0, result.output
    store = Store(hurried, readonly=True)
    try:
        assert [j.status for j in _all_jobs(store)] == ["done", "done"]
        assert _trials_per_key(store) == {key: (1, 1) for key in keys}  # nothing new
    finally:
        store.close()
    # a limit names another batch, so a host running the sweep without it does not join this one
    plain = jobs.batch_name("matmul", template, problems, "grid", 6, 0, device)
    assert (
        len(
            {
                plain,
                jobs.batch_name("matmul", template, problems, "grid", 6, 0, device, patience=1),
                jobs.batch_name("matmul", template, problems, "grid", 6, 0, device, time_budget=1e-6),
            }
        )
        == 3
    )


def test_a_worker_keeps_one_compile_pool_for_all_its_jobs(tmp_db, template, device, monkeypatch):
    """Its processes (and on a GPU their CUDA contexts) are made once, not per job."""
    from tunesvc import bench

    pools = []
    original = bench.Compiler.__init__

    def counted(self, *args, **kwargs):
        pools.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(bench.Compiler, "__init__", counted)
    problems = [template.problem(**p, dtype="float16") for p in template.presets["tiny"]]
    store = Store(tmp_db)
    try:
        batch = _queue(store, template, device, problems, budget=2)
        assert jobs.work(tmp_db, batch, log=lambda line: None, compile_workers=2) == len(problems) == 2
        assert [j.status for j in jobs.jobs(store, batch)] == ["done", "done"]
        assert _trials_per_key(store) == {str(template.key(p)): (2, 2) for p in problems}
    finally:
        store.close()
    assert len(pools) == 1 and pools[0]._pool._shutdown_thread  # one pool, closed when the worker ends


def test_a_worker_keeps_one_measuring_process_for_all_its_jobs(tmp_db, template, device, monkeypatch):
    """Each job loads its problem into the same child (isolate on: as on a GPU)."""
    from tunesvc.bench import _worker

    children = []
    original = _worker.start_child

    def counted(*args, **kwargs):
        children.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(_worker, "start_child", counted)
    problems = [template.problem(**p, dtype="float16") for p in template.presets["tiny"]]
    store = Store(tmp_db)
    try:
        batch = _queue(store, template, device, problems, budget=2)
        assert jobs.work(tmp_db, batch, log=lambda line: None, isolate=True) == 2
        assert [j.status for j in jobs.jobs(store, batch)] == ["done", "done"]
        assert _trials_per_key(store) == {str(template.key(p)): (2, 2) for p in problems}
        with store.session() as session:  # each job measured its own problem: no wrong results
            assert set(session.scalars(select(Trial.status))) == {"ok"}
    finally:
        store.close()
    assert len(children) == 1


@pytest.mark.gpu
def test_a_gpu_worker_keeps_one_measuring_process_and_one_compile_pool_for_all_its_jobs(
    tmp_db, template, device, monkeypatch
):
    """On a GPU (measuring isolated by default), three jobs: one child and one pool of two, made once."""
    from tunesvc.bench import _compile
    from tunesvc.bench import _worker

    children, pools = [], []
    start_child, pool_init = _worker.start_child, _compile.Compiler.__init__

    def counted_child(*args, **kwargs):
        children.append(args)
        return start_child(*args, **kwargs)

    def counted_pool(self, *args, **kwargs):
        pools.append(self)
        pool_init(self, *args, **kwargs)

    monkeypatch.setattr(_worker, "start_child", counted_child)
    monkeypatch.setattr(_compile.Compiler, "__init__", counted_pool)
    problems = [
        template.problem(M=m, N=n, K=k, dtype="float16")
        for m, n, k in [(300, 200, 100), (77, 513, 129), (1000, 37, 65)]
    ]
    store = Store(tmp_db)
    try:
        batch = _queue(store, template, device, problems, budget=3)
        assert jobs.work(tmp_db, batch, log=lambda line: None, compile_workers=2) == 3
        assert _trials_per_key(store) == {str(template.key(p)): (3, 3) for p in problems}
        assert all(w.time_ms > 0 for w in store.winners(kernel="matmul"))
        assert len(store.winners(kernel="matmul")) == 3
    finally:
        store.close()
    assert (len(children), len(pools)) == (1, 1)


def test_a_sweep_that_fails_before_queuing_stops_its_workers(tmp_path):
    """The workers start before the database is opened; a bad --db ends them, with one line."""
    missing = tmp_path / "missing" / "x.db"
    result = CliRunner().invoke(
        app, ["sweep", "matmul", "--preset", "tiny", "--gpus", "0,1", "--db", str(missing)], catch_exceptions=False
    )
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Error: Cannot create {missing}: folder {tmp_path / 'missing'} does not exist."
    ]
    assert not any(p.name == "tunesvc-sweep-worker" for p in multiprocessing.active_children())


def test_tune_sweep_gpus_rejects_a_bad_value_in_one_line(tmp_db):
    result = CliRunner().invoke(app, ["sweep", "matmul", "--preset", "tiny", "--gpus", "zero", "--db", tmp_db])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "Error: --gpus takes 'all' or distinct GPU indices such as 0,1; got 'zero'."
    ]


def _all_jobs(store: Store) -> list[Job]:
    with store.session() as session:
        return list(session.scalars(select(Job)))


def test_worker_process_reports_a_bad_database_in_one_line(tmp_path, capsys):
    missing = tmp_path / "missing" / "x.db"
    assert jobs._main(["--db", str(missing), "--batch", "b"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"Error: Cannot create {missing}: folder {tmp_path / 'missing'} does not exist."
    ]


def test_a_peeked_job_row_never_imports_the_module_it_names(tmp_path, monkeypatch):
    """A worker warms its processes up for the queue's next job before claiming it: a row naming
    a module that is neither shipped nor the command's kernel is refused, not imported."""
    (tmp_path / "plant_warm.py").write_text(
        "from pathlib import Path\nPath(__file__).with_name('imported').write_text('ran')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(jobs.JOB_KERNEL_ENV, raising=False)
    warm = jobs._Warm(compile_workers=0, cores=1, isolate=False)
    row = jobs.JobSpec(1, "plant_warm:TEMPLATE", "M=33,N=17,K=29,dtype=float32", {}, "grid", 2, 0)
    with pytest.raises(TunesvcError, match="neither shipped"):
        warm.start(row)
    assert not (tmp_path / "imported").exists()
    assert not warm.started
