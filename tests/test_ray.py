"""`tune sweep --ray`: Ray places the workers, the database stays the queue.

A local Ray cluster of two simulated nodes (ray.cluster_utils.Cluster: a head and one more
raylet, one CPU each), no GPU, so each node gets one interpreter worker, on the matmul 'tiny'
problems. Serial: the cluster's processes need the machine's cores to themselves.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import func
from sqlalchemy import select
from typer.testing import CliRunner

from tunesvc.cli import app
from tunesvc.fleet import cluster as ray_cluster
from tunesvc.fleet import jobs
from tunesvc.store import Store
from tunesvc.store.models import Job
from tunesvc.store.models import Trial

# ray comes with the test extra; a machine without it (the lent GPU image) skips this module
ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.serial


#: Ray's node health checks, made to bear a starved machine: with its defaults (a 10 s answer,
#: 5 misses) a 2-core host kept busy by other processes had the head's own raylet marked dead
#: mid-test, which ends the driver (SystemExit from ray.wait); a killed raylet refuses each check
#: at once, so it is still found dead after 10 checks, 3 s apart
HEALTH_CHECKS = {"health_check_timeout_ms": 30_000, "health_check_failure_threshold": 10}


@pytest.fixture(scope="module")
def two_nodes():
    nodes = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "_system_config": HEALTH_CHECKS},
    )
    nodes.add_node(num_cpus=1)
    nodes.wait_for_nodes()
    yield nodes
    ray.shutdown()
    nodes.shutdown()


def _trials_per_key(store: Store) -> dict[str, tuple[int, int]]:
    with store.session() as session:
        query = select(Trial.shape_key, func.count(), func.count(func.distinct(Trial.config_hash))).group_by(
            Trial.shape_key
        )
        return {key: (n, distinct) for key, n, distinct in session.execute(query)}


def _problems(template, n: int) -> list[dict]:
    """n problems with distinct shape keys (M is bucketed to powers of two, N is not)."""
    return [template.problem(M=17, N=20 + i, K=11, dtype="float16") for i in range(n)]


def test_tune_sweep_ray_splits_the_jobs_between_the_nodes(two_nodes, tmp_db):
    shapes = [f"17x{20 + i}x11" for i in range(4)]
    command = ["sweep", "matmul", "--budget", "3", "--ray", two_nodes.address, "--db", tmp_db, "--json"]
    for shape in shapes:
        command += ["--shape", shape]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    assert not ray.is_initialized()  # the command leaves the cluster it joined
    store = Store(tmp_db, readonly=True)
    try:
        with store.session() as session:
            rows = list(session.scalars(select(Job)))
        assert [j.status for j in rows] == ["done"] * 4
        assert {j.attempts for j in rows} == {1}  # none run twice
        nodes = {j.worker.split(":")[2] for j in rows}
        assert len(nodes) == 2, [j.worker for j in rows]  # both nodes' workers took jobs
        assert _trials_per_key(store) == {j.shape_key: (3, 3) for j in rows}  # none lost, none twice
        assert len(store.winners(kernel="matmul")) == 4
    finally:
        store.close()


def test_tune_sweep_ray_draws_a_progress_bar_per_job(two_nodes, tmp_db):
    command = ["sweep", "matmul", "--budget", "2", "--ray", two_nodes.address, "--db", tmp_db]
    result = CliRunner().invoke(app, [*command, "--shape", "17x30x11", "--shape", "17x31x11"])
    assert result.exit_code == 0, result.output
    bars = [line for line in result.stderr.splitlines() if "━" in line]
    for key in ("M=32,N=30,K=11,dtype=float16", "M=32,N=31,K=11,dtype=float16"):
        assert any(line.startswith(key + " ") and " done " in line and " 2/2 " in line for line in bars), bars


def test_a_node_killed_mid_job_has_its_job_resumed_on_another(two_nodes, tmp_db, template, device):
    # the victim is chosen with most of its budget left: its worker goes on measuring until it
    # notices its raylet is gone, and a job one trial from its end finished in that window
    budget = 12
    store = Store(tmp_db)
    problems = [template.problem(**p, dtype="float16") for p in template.presets["tiny"]] + _problems(template, 2)
    batch = jobs.batch_name("matmul", template, problems, "grid", budget, 0, device)
    jobs.enqueue(store, batch, "matmul", template, problems, "grid", budget, 0)
    [victim_node] = [n for n in two_nodes.list_all_nodes() if n is not two_nodes.head_node]
    ray_cluster.connect(two_nodes.address)
    lines: list[str] = []
    outcome: list = []
    runner = threading.Thread(
        target=lambda: outcome.append(
            ray_cluster.run_on_ray(tmp_db, batch, stale_s=3, heartbeat_s=0.3, log=lines.append)
        )
    )
    runner.start()
    victim = None
    try:
        deadline = time.monotonic() + 150
        while victim is None and time.monotonic() < deadline:
            counts = _trials_per_key(store)
            for job in jobs.jobs(store, batch):
                on_victim = job.worker and f"ray-{victim_node.node_id[:12]}" in job.worker
                if job.status == "running" and on_victim and 0 < counts.get(job.shape_key, (0, 0))[0] <= budget // 3:
                    victim = job
                    break
            time.sleep(0.05)
        assert victim is not None, "no job was ever seen mid-sweep on the second node"
        two_nodes.remove_node(victim_node, allow_graceful=False)
    finally:
        runner.join(timeout=240)
        ray.shutdown()
    assert not runner.is_alive()
    [done] = outcome
    assert sorted(d is None for d in done) == [False, True]  # the lost worker, and the head's
    assert any("lost" in line for line in lines)
    rows = {j.id: j for j in jobs.jobs(store, batch)}
    assert {j.status for j in rows.values()} == {"done"}
    assert rows[victim.id].attempts == 2 and rows[victim.id].worker != victim.worker
    assert _trials_per_key(store) == {str(template.key(p)): (budget, budget) for p in problems}
    store.close()


def test_tune_sweep_takes_gpus_or_ray_not_both(tmp_db):
    result = CliRunner().invoke(
        app, ["sweep", "matmul", "--preset", "tiny", "--gpus", "0", "--ray", "auto", "--db", tmp_db]
    )
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "Error: Use --gpus (this host's GPUs) or --ray (a Ray cluster's), not both."
    ]
