"""A shared sweep's workers placed on a Ray cluster: one per GPU, wherever the cluster has them.

Each worker is a Ray task holding one GPU (``num_gpus=1``; Ray sets its ``CUDA_VISIBLE_DEVICES``)
that runs :func:`tunesvc.fleet.jobs.work` against the sweep's database, exactly as a worker started by
``tune sweep --gpus`` does: the queue, the claims, the heartbeats and the release of a dead
worker's job all stay in the database, which every node must reach (PostgreSQL, or a SQLite file
on a folder every node shares). Ray only places the workers. A cluster without GPUs gets one
interpreter worker per node (``num_cpus=1``), which is how the CPU tests run it.

Tasks, not actors, and never retried: a worker lost with its node leaves its job running in the
database, and the surviving workers release it once its heartbeat is stale and resume it from
its stored trials; a retried task would only be one more worker joining the queue late.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from tunesvc import settings
from tunesvc.errors import TunesvcError
from tunesvc.fleet.jobs import HEARTBEAT_S
from tunesvc.fleet.jobs import STALE_S
from tunesvc.timeline import ENV as TIMELINE_ENV


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise TunesvcError("--ray needs Ray on this host and every node: pip install 'tunesvc[ray]'.") from None
    return ray


def connect(address: str) -> bool:
    """Join the Ray cluster at ``address`` ("auto": the one this host belongs to, or $RAY_ADDRESS);
    returns whether this call connected (so the caller disconnects), False if already connected."""
    ray = _ray()
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, log_to_driver=True, logging_level="ERROR", configure_logging=True)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TunesvcError(
            f"Cannot join the Ray cluster at '{address}' ({first}); start one with `ray start --head`, or give its address."
        ) from None
    return True


def placement() -> tuple[int, dict[str, float]]:
    """How many workers the connected cluster takes and the resources of each: one per GPU, or
    one interpreter worker per node where the cluster has no GPU."""
    ray = _ray()
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if gpus:
        return gpus, {"num_gpus": 1, "num_cpus": 1}
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    return max(1, nodes), {"num_cpus": 1}


def run_on_ray(
    db: str,
    batch: str,
    *,
    stale_s: float = STALE_S,
    heartbeat_s: float = HEARTBEAT_S,
    time_budget: float | None = None,
    patience: int | None = None,
    compile_workers: int | None = None,
    kernel: str | None = None,
    log: Callable[[str], None] | None = None,
    tick: Callable[[], None] | None = None,
) -> list[tuple[int, str] | None]:
    """Run the batch's jobs on the connected cluster's workers (see :func:`placement`) until they
    end; returns each worker's count of finished jobs and its device's hardware id, None for a
    worker that was lost (its node died). Whether every job finished is the database's to say
    (:func:`tunesvc.fleet.jobs.jobs`). ``kernel``, the name the sweep's command gave, is the one module
    path a worker may import for a job row (see tunesvc.template.template_named_by_data).
    ``tick()``, if given, is called at least every half second while the workers run (the CLI
    redraws its progress from the database there)."""
    ray = _ray()
    count, resources = placement()
    task = ray.remote(max_retries=0, scheduling_strategy="SPREAD", **resources)(_worker_task)
    timeline = settings.timeline_file()
    refs = [
        task.remote(db, batch, i, stale_s, heartbeat_s, time_budget, patience, compile_workers, timeline, kernel)
        for i in range(count)
    ]
    index = {ref: i for i, ref in enumerate(refs)}
    done: list[tuple[int, str] | None] = [None] * count
    pending = list(refs)
    while pending:
        if tick is not None:
            tick()
        ready, pending = ray.wait(pending, num_returns=1, timeout=None if tick is None else 0.5)
        for ref in ready:
            try:
                done[index[ref]] = ray.get(ref)
            except ray.exceptions.RayError as exc:  # its node or process died: its job goes back to the queue
                if log:
                    lines = str(exc).strip().splitlines()
                    log(f"worker {index[ref]} lost ({lines[0] if lines else type(exc).__name__})")
    return done


def _worker_task(
    db: str,
    batch: str,
    index: int,
    stale_s: float,
    heartbeat_s: float,
    time_budget: float | None,
    patience: int | None,
    compile_workers: int | None,
    timeline: str | None,
    kernel: str | None = None,
) -> tuple[int, str]:
    """One worker on a Ray node (see :func:`tunesvc.fleet.jobs.work`): its finished jobs and its device."""
    import ray

    if timeline:
        os.environ.setdefault(TIMELINE_ENV, timeline)
    from tunesvc.fleet import jobs

    if kernel is not None:
        os.environ[jobs.JOB_KERNEL_ENV] = kernel
    from tunesvc.timeline import mark
    from tunesvc.timeline import set_role

    set_role("worker")
    mark("worker started")
    context = ray.get_runtime_context()
    node = context.get_node_id()
    gpus_here = next((n["Resources"].get("GPU", 0) for n in ray.nodes() if n["NodeID"] == node), 0)
    gpu = settings.raw("CUDA_VISIBLE_DEVICES", "-") if gpus_here else "-"
    from tunesvc.device import fork_safe_current_device

    finished = jobs.work(
        db,
        batch,
        worker=f"{socket.gethostname()}:{os.getpid()}:ray-{node[:12]}:gpu{gpu}",
        stale_s=stale_s,
        heartbeat_s=heartbeat_s,
        time_budget=time_budget,
        patience=patience,
        compile_workers=compile_workers,
        cores=max(1, (os.cpu_count() or 1) // max(1, int(gpus_here))),
        warm_index=index,
    )
    return finished, fork_safe_current_device().hardware_id
