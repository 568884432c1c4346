"""Trial rows per second from concurrent writer processes, into SQLite and into PostgreSQL (CPU only).

    python benchmarks/write_throughput.py                       # SQLite in a temp folder
    python benchmarks/write_throughput.py --pg postgresql+psycopg://user:pw@127.0.0.1/db
    python benchmarks/write_throughput.py --batch 1 --batch 8   # one table row per batch size

A writer is what one sweep worker does to the database: a process with its own Store that, once
all writers are open, stores --rows trials through ``Store.add_trials``, --batch trials per
transaction, as ``tunesvc.tuning.sweep`` stores each batch of candidates it measured. A sweep's batch is
one candidate per compile worker (``--workers``; on a GPU up to 8, so 8 on a host of 8 or more
cores) and 1 without compile workers (the interpreter). The rate is all rows over the wall time
from the first writer's start to the last one's end. Target: >= 2,000 rows/s with 8
writers on each backend. PostgreSQL runs into a fresh database that the script creates and drops
(the URL's role needs CREATEDB), so nothing else is touched.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
import uuid

TARGET = 2000.0


def _writer(url: str, ids: tuple[int, int, int], writer: int, rows: int, batch: int, barrier, results) -> None:
    from tunesvc.bench import Measurement
    from tunesvc.bench import Status
    from tunesvc.store import Store

    kv, dev, sweep = ids
    store = Store(url)
    trials = [
        (
            {"writer": writer, "i": i},
            f"w{writer}-{i}",
            Measurement(Status.OK, time_ms=1.0 + i, spread=0.01, reps=10, rel_error=1e-4),
        )
        for i in range(rows)
    ]
    barrier.wait(timeout=300)
    start = time.time()
    stored = sum(
        row is not None
        for first in range(0, rows, batch)
        for row in store.add_trials(sweep, kv, dev, "bench", trials[first : first + batch])
    )
    results.put((start, time.time(), stored))
    store.close()


def measure(url: str, writers: int, rows: int, batch: int) -> tuple[float, int]:
    """(rows per second, rows stored) for ``writers`` processes writing ``rows`` trials each, ``batch`` per transaction."""
    import tunesvc
    from tunesvc.store import Store

    store = Store(url)
    template = tunesvc.get_template("matmul")
    kv, dev = store.kernel_version_id(template), store.device_id(tunesvc.current_device())
    sweep = store.start_sweep(kv, dev, "bench", {}, "grid", None, 0)
    store.close()
    context = multiprocessing.get_context(
        "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    )
    barrier, results = context.Barrier(writers), context.Queue()
    processes = [
        context.Process(target=_writer, args=(url, (kv, dev, sweep), w, rows, batch, barrier, results))
        for w in range(writers)
    ]
    for p in processes:
        p.start()
    out = [results.get(timeout=600) for _ in processes]
    for p in processes:
        p.join()
    if any(p.exitcode for p in processes):
        raise SystemExit(f"a writer failed on {url}")
    wall = max(end for _, end, _ in out) - min(start for start, _, _ in out)
    stored = sum(n for _, _, n in out)
    return stored / wall, stored


def _pg_database(admin_url: str):
    """A fresh database on the server of ``admin_url``: (its URL, a function that drops it)."""
    from sqlalchemy import create_engine
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    name = f"tunesvc_bench_{uuid.uuid4().hex[:8]}"

    def admin(statement: str) -> None:
        engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with engine.connect() as connection:
            connection.execute(text(statement))
        engine.dispose()

    admin(f'CREATE DATABASE "{name}"')
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False), lambda: admin(
        f'DROP DATABASE "{name}" WITH (FORCE)'
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--rows", type=int, default=1000, help="trials per writer")
    parser.add_argument(
        "--batch",
        type=int,
        action="append",
        help="trials per transaction, repeatable [default: 8, a GPU sweep's batch, and 1]",
    )
    parser.add_argument(
        "--pg",
        default=os.environ.get("TUNESVC_TEST_PG_URL"),
        help="PostgreSQL server URL [default: $TUNESVC_TEST_PG_URL; without one, SQLite only]",
    )
    parser.add_argument(
        "--check", action="store_true", help="a quick run (2 writers x 50 rows) that checks the script works"
    )
    args = parser.parse_args()
    writers, rows = (2, 50) if args.check else (args.writers, args.rows)
    batches = args.batch or [8, 1]
    if min(batches) < 1 or writers < 1 or rows < 1:
        parser.error("--writers, --rows and --batch must be at least 1")
    results = []
    for batch in batches:
        with tempfile.TemporaryDirectory() as folder:
            results.append(("SQLite (WAL)", batch, *measure(os.path.join(folder, "bench.db"), writers, rows, batch)))
        if args.pg:
            url, drop = _pg_database(args.pg)
            try:
                results.append(("PostgreSQL", batch, *measure(url, writers, rows, batch)))
            finally:
                drop()
    if not args.pg:
        print("no --pg URL: PostgreSQL not measured", file=sys.stderr)
    print(f"| backend | writers | trials per transaction | rows | rows/s | target {TARGET:,.0f} rows/s |")
    print("|---|---|---|---|---|---|")
    for name, batch, rate, stored in results:
        if stored != writers * rows:
            raise SystemExit(f"{name}: {stored} rows stored of {writers * rows}")
        print(f"| {name} | {writers} | {batch} | {stored} | {rate:,.0f} | {'met' if rate >= TARGET else 'missed'} |")


if __name__ == "__main__":
    main()
