"""A sibling GPU model's winners on a new one: adopted (`tune adopt`), served blind, tuned here.

    python benchmarks/adopt.py all --work DIR          # every step below, in order, on one GPU
    python benchmarks/adopt.py adopt --work DIR        # 1. `tune adopt` of the whole --db, timed
    python benchmarks/adopt.py own --work DIR          # 2. this GPU's own tuning of the same keys
    python benchmarks/adopt.py warm --work DIR         # 3. 8-trial sweeps from the sibling's winners
    python benchmarks/adopt.py compare --work DIR      # 4. all of them timed side by side
    python benchmarks/adopt.py --list                  # the keys and how each is tuned here; no GPU
    bash benchmarks/adopt-gpu.sh                       # on the lent GPU machine: all four, within one call

Run on a GPU model that is a sibling of the one --db was tuned on (default: tune.db.example, an
H100 SXM's winners, on an H200). --db is copied into --work; nothing is written to it. Each step
resumes what --work holds, so the steps may run in separate calls on the same machine, or on
another once --work is carried there.

1. **adopt**: :func:`tunesvc.adopt.adopt` (what `tune adopt --from-device` runs) over every key of
   every kernel's current version in a copy of --db; its wall time (compiles included: a fresh
   host compiles every candidate) goes to benchmarks/data/adopt_runs.csv.
2. **own**: the same keys swept here in another copy, as a user tunes a new GPU: every feasible
   config where there are at most ``GRID_UPTO`` (then the grid is the exhaustive truth), else
   Optuna with ``--budget`` trials (32: the budget the GEMM targets are set at). Stops starting
   kernels after ``--deadline`` seconds; a later call goes on where it stopped.
3. **warm**: the keys whose own tuning was exhaustive, swept again in a fresh copy of --db with
   Optuna and 8 trials, warm-started as every sweep is (the untuned answer, the sibling's winners
   of the key and of its nearest keys, the template's warm start).
4. **compare**: per key, the adopted winner, the config tuned here, the sibling's winner as the
   runtime served it blind before adoption (transferred), the heuristic and, where step 3 ran, the
   8-trial winner, each checked against the reference and timed side by side in one measuring
   process (:meth:`tunesvc.bench.Measurer.time_together`: CUDA graphs over input copies beyond the
   L2, interleaved under the same clocks). Rows go to benchmarks/results/adopt.csv (ours: the
   config, peer: the config tuned here, ratio = tuned here / ours: 1 is as fast as tuned here);
   ``python benchmarks/results_page.py`` writes the targets into RESULTS.md: adopted within 3% of
   tuned here on 90% of the keys and never below 0.9x, the whole adoption in at most 180 s, the
   8-trial sweep within 2% of the exhaustive best on 80% of its keys.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent / "tune.db.example"
RUNS_CSV = HERE / "data" / "adopt_runs.csv"
#: a key's space is swept whole where it holds at most this many feasible configs
GRID_UPTO = 100
#: the warm-started sweep's budget in trials (issue: within 2% of the exhaustive best in 8)
WARM_TRIALS = 8
#: each config's share of the side-by-side timing, in ms, and its rounds
REP_MS, ROUNDS = 60.0, 3
#: the labels of the configs timed per key, as the CSV's kernel column names them
ADOPTED, TUNED, THEIRS, HEURISTIC, WARM = "adopted", "tuned here", "sibling's winner", "heuristic", "8 trials"


def _keys(db: Path, kernels: list[str] | None, most: int | None = None) -> dict[str, list[str]]:
    """Kernel -> the shape keys of its current version that --db holds winners of (any device),
    in sorted order, the first ``most`` of each kernel where given."""
    import tunesvc
    from tunesvc.store import Store

    store = Store(str(db), readonly=True)
    try:
        out: dict[str, list[str]] = {}
        for w in store.winners():
            if ":" in w.kernel or (kernels and w.kernel not in kernels):
                continue
            if w.kernel_version == tunesvc.get_template(w.kernel).version:
                out.setdefault(w.kernel, [])
                if w.shape_key not in out[w.kernel]:
                    out[w.kernel].append(w.shape_key)
        return {k: sorted(keys)[:most] for k, keys in out.items()}
    finally:
        store.close()


def _sibling(db: Path) -> str:
    """The GPU model --db's winners were tuned on: the device with the most winners."""
    from tunesvc.store import Store

    store = Store(str(db), readonly=True)
    try:
        counts: dict[str, int] = {}
        for w in store.winners():
            counts[w.device] = counts.get(w.device, 0) + 1
        return max(counts, key=lambda d: (counts[d], d))
    finally:
        store.close()


def _copy(db: Path, to: Path) -> Path:
    if not to.exists():
        shutil.copyfile(db, to)
    return to


def _how(template: Any, key: str, device: Any) -> str:
    return "grid" if len(template.feasible(template.problem_of_key(key), device)) <= GRID_UPTO else "optuna"


def step_adopt(args: argparse.Namespace) -> None:
    from tunesvc.device import current_device

    done = args.work / "adopt.json"
    if done.exists():
        print(f"adopt: done before ({done})", flush=True)
        return
    db = args.work / "adopted.db"
    db.unlink(missing_ok=True)
    shutil.copyfile(args.db, db)
    sibling = args.from_device or _sibling(args.db)
    command = [sys.executable, "-m", "tunesvc", "adopt", "--from-device", sibling, "--db", str(db.resolve()), "--json"]
    started = time.perf_counter()
    # from outside any source tree: `-m` puts the working folder first on the path
    done_run = subprocess.run(command, capture_output=True, text=True, cwd=args.work.resolve())
    seconds = time.perf_counter() - started
    if done_run.returncode != 0:
        raise SystemExit(f"tune adopt failed ({done_run.returncode}): {done_run.stderr[-2000:]}")
    adoptions = json.loads(done_run.stdout)
    adopted = sum(bool(a["winner"]) for a in adoptions)
    measured = sum(len(a["candidates"]) for a in adoptions)
    print(f"adopt: {adopted} of {len(adoptions)} keys adopted from {sibling}, {measured} candidates, {seconds:.1f} s")
    for a in adoptions:
        if not a["winner"] or a["detail"]:
            print(f"  {a['kernel']} {a['shape_key']}: {a['detail']}", flush=True)
    phases: dict[str, float] = {}
    for a in adoptions:
        for name, seconds_in in a.get("phases", {}).items():
            phases[name] = phases.get(name, 0.0) + seconds_in
    print(
        "adopt: seconds by phase over its keys: "
        + ", ".join(f"{k} {v:.1f}" for k, v in sorted(phases.items(), key=lambda kv: -kv[1]))
    )
    done.write_text(json.dumps({"seconds": seconds, "sibling": sibling, "adoptions": adoptions}))
    device = current_device()
    row = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "gpu": device.name,
        "driver": device.driver,
        "triton": device.triton,
        "from_device": sibling,
        "keys": len(adoptions),
        "adopted": adopted,
        "candidates": measured,
        "seconds": round(seconds, 2),
        "triton_cache": args.cache,
    }
    new = not RUNS_CSV.exists()
    with RUNS_CSV.open("a", newline="") as f:
        writer = csv.DictWriter(f, list(row))
        if new:
            writer.writeheader()
        writer.writerow(row)


def step_own(args: argparse.Namespace) -> None:
    import tunesvc
    from tunesvc.device import fork_safe_current_device
    from tunesvc.store import Store
    from tunesvc.tuning.sweep import compile_pool
    from tunesvc.tuning.sweep import measuring_process
    from tunesvc.tuning.sweep import run_sweep

    device = fork_safe_current_device()
    db = _copy(args.db, args.work / "own.db")
    started = time.perf_counter()
    store = Store(str(db))
    try:
        for kernel, keys in _keys(args.db, args.kernels, args.max_keys).items():
            template = tunesvc.get_template(kernel)
            problems = [template.problem_of_key(k) for k in keys]
            tuned = {
                w.shape_key
                for w in store.winners(kernel=kernel, hardware_id=device.hardware_id, version=template.version)
            }
            adoptable = _adopted_keys(args.work)
            todo = [
                p
                for p in problems
                if str(template.key(p)) not in tuned
                and (adoptable is None or (kernel, str(template.key(p))) in adoptable)
            ]
            if not todo:
                continue
            if time.perf_counter() - started > args.deadline:
                print(f"own: deadline reached at {kernel}; {len(todo)} of its keys left", flush=True)
                return
            compiler = compile_pool(template, todo[0], strategy="grid", device=device)
            if compiler is not None:
                compiler.timeout_s = args.compile_timeout
            measurer = measuring_process(template, todo[0], device=device)
            try:
                for problem in todo:
                    if time.perf_counter() - started > args.deadline:
                        print(f"own: deadline reached in {kernel}", flush=True)
                        return
                    how = _how(template, str(template.key(problem)), device)
                    failed: dict[str, int] = {}  # why -> how many candidates failed so
                    [result] = run_sweep(
                        template, [problem], store, strategy=how, budget=None if how == "grid" else args.budget,
                        device=device, workers=compiler.workers if compiler is not None else 0,
                        compiler=compiler, measurer=measurer, refit_selector=False, time_peer=False,
                        on_trial=lambda e, f=failed: _count_failure(e.measurement, f),
                    )  # fmt: skip
                    slowest = sorted(result.phases.items(), key=lambda kv: -kv[1])[:3]
                    print(
                        f"own: {kernel} {result.shape_key} ({how}): {result.trials_stored} trials "
                        f"({result.failures} failed) in {result.wall_seconds:.1f} s "
                        f"({', '.join(f'{k} {v:.1f}' for k, v in slowest)}), best {result.winner_ms} ms",
                        flush=True,
                    )
                    if failed:
                        print("  failed: " + "; ".join(f"{n} x {why}" for why, n in failed.items()), flush=True)
            finally:
                for part in (measurer, compiler):
                    if part is not None:
                        part.close()
    finally:
        store.close()


def _count_failure(measurement: Any, counts: dict[str, int]) -> None:
    if not measurement.ok:
        why = (measurement.message or str(measurement.status))[:100]
        counts[why] = counts.get(why, 0) + 1


def step_warm(args: argparse.Namespace) -> None:
    from _common import sweep

    import tunesvc
    from tunesvc.device import fork_safe_current_device

    device = fork_safe_current_device()
    db = _copy(args.db, args.work / "warm.db")
    own = _winners(args.work / "own.db", device.hardware_id)
    done = _winners(db, device.hardware_id)
    started = time.perf_counter()
    for kernel, keys in _keys(args.db, args.kernels, args.max_keys).items():
        if time.perf_counter() - started > args.deadline:
            print(f"warm: deadline reached at {kernel}", flush=True)
            return
        template = tunesvc.get_template(kernel)
        exhaustive = [
            k
            for k in keys
            if (kernel, k) in own
            and (kernel, k) not in done
            and _how(template, k, device) == "grid"
            and len(template.feasible(template.problem_of_key(k), device)) > WARM_TRIALS
        ]
        if exhaustive:
            problems = [dict(template.problem_of_key(k)) for k in exhaustive]
            sweep(template, problems, str(db), strategy="optuna", budget=WARM_TRIALS, refit_selector=False)


def _winners(db: Path, hardware_id: str) -> dict[tuple[str, str], dict]:
    from tunesvc.store import Store

    if not db.exists():
        return {}
    store = Store(str(db), readonly=True)
    try:
        return {(w.kernel, w.shape_key): dict(w.config) for w in store.winners(hardware_id=hardware_id)}
    finally:
        store.close()


def _adopted_keys(work: Path) -> set[tuple[str, str]] | None:
    """(kernel, shape key) of every key the adopt step adopted; None before that step ran. The
    keys it could not adopt (another kernel version there) have no adopted winner to compare."""
    done = work / "adopt.json"
    if not done.exists():
        return None
    return {(a["kernel"], a["shape_key"]) for a in json.loads(done.read_text())["adoptions"] if a["winner"]}


def step_compare(args: argparse.Namespace) -> None:
    from _common import record

    import tunesvc
    from tunesvc.bench import Bench
    from tunesvc.device import current_device
    from tunesvc.space import config_hash
    from tunesvc.store import Store

    device = current_device()
    sibling = Store(str(args.db), readonly=True)
    try:
        theirs_id = sibling.find_device(args.from_device or _sibling(args.db)).hardware_id
    finally:
        sibling.close()
    theirs = _winners(args.db, theirs_id)
    adopted = _winners(args.work / "adopted.db", device.hardware_id)
    own = _winners(args.work / "own.db", device.hardware_id)
    warm = _winners(args.work / "warm.db", device.hardware_id)
    adoptable = _adopted_keys(args.work)
    started = time.perf_counter()
    for kernel, keys in _keys(args.db, args.kernels, args.max_keys).items():
        template = tunesvc.get_template(kernel)
        rows: list[dict] = []
        for key in keys:
            if (kernel, key) not in own or (adoptable is not None and (kernel, key) not in adoptable):
                continue
            if time.perf_counter() - started > args.deadline:
                print(f"compare: deadline reached at {kernel} {key}", flush=True)
                break
            problem = template.problem_of_key(key)
            configs = {
                TUNED: own[kernel, key],
                ADOPTED: adopted.get((kernel, key)),
                THEIRS: theirs.get((kernel, key)),
                HEURISTIC: template.heuristic(problem, device),
                WARM: warm.get((kernel, key)),
            }
            present = {k: v for k, v in configs.items() if v is not None}
            rows += _timed(template, problem, key, present, device, Bench, config_hash)
        if rows:  # a kernel at a time: a run stopped later keeps what it timed
            record("adopt", rows)


def _timed(
    template: Any, problem: Any, key: str, configs: dict[str, dict], device: Any, bench_type: Any, config_hash: Any
) -> list[dict]:
    """The configs of one key checked, then timed side by side in one process; a CSV row per
    label other than the config tuned here, against it."""
    distinct = {config_hash(c): c for c in configs.values()}
    with bench_type(template, problem, device) as bench:
        checked = {h: bench.measure(c) for h, c in distinct.items()}
        ok = [h for h, m in checked.items() if m.ok]
        together = dict(zip(ok, bench.time_together([distinct[h] for h in ok], REP_MS, ROUNDS)))
    times = {
        label: together[config_hash(c)].time_ms if config_hash(c) in together else None for label, c in configs.items()
    }
    tuned_ms = times[TUNED]
    print(
        f"{template.name} {key}: "
        + ", ".join(f"{label} {ms if ms is None else round(ms, 5)}" for label, ms in times.items()),
        flush=True,
    )
    out = []
    for label, ms in times.items():
        if label == TUNED or ms is None or tuned_ms is None:
            continue
        out.append(
            {
                "kernel": f"{template.name} [{label}]",
                "shape": key,
                "ours_ms": ms,
                "peer": f"{template.name} [{TUNED}]",
                "peer_ms": tuned_ms,
                "ratio": tuned_ms / ms,
                "timing_method": "cuda_graph",
                "config": json.dumps(configs[label], sort_keys=True),
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", nargs="?", default="all", choices=["all", "adopt", "own", "warm", "compare"])
    parser.add_argument("--work", type=Path, default=Path("adopt-work"))
    parser.add_argument("--db", type=Path, default=EXAMPLE)
    parser.add_argument("--from-device", default=None, help="default: the device with the most winners in --db")
    parser.add_argument("--kernels", nargs="*", default=None, help="default: every kernel with winners in --db")
    parser.add_argument("--budget", type=int, default=32, help="Optuna trials of the own tuning where not exhaustive")
    parser.add_argument("--deadline", type=float, default=420.0, help="seconds after which a step starts no key")
    parser.add_argument("--compile-timeout", type=float, default=120.0, help="seconds a compile may take in own")
    parser.add_argument("--max-keys", type=int, default=None, help="the first N keys of each kernel (default: all)")
    parser.add_argument("--cache", default="as found", help="what the Triton cache held at the start, for the CSV")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    if args.kernels:
        # "a,b c" as well as "a b c"; a name --db holds no winners of would leave every step empty
        args.kernels = [k for part in args.kernels for k in part.split(",") if k]
        held = _keys(args.db, None)
        if unknown := sorted(set(args.kernels) - set(held)):
            parser.error(
                f"--kernels: {args.db} holds no current winners of {', '.join(unknown)}; use some of {', '.join(sorted(held))}"
            )
    if args.list:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from _devices import H200

        import tunesvc

        for kernel, keys in _keys(args.db, args.kernels, args.max_keys).items():
            template = tunesvc.get_template(kernel)
            hows = [_how(template, k, H200) for k in keys]
            print(f"{kernel}: {len(keys)} keys, {hows.count('grid')} swept whole, {hows.count('optuna')} by Optuna")
        return
    args.work.mkdir(parents=True, exist_ok=True)
    steps = ["adopt", "own", "warm", "compare"] if args.step == "all" else [args.step]
    for step in steps:
        started = time.perf_counter()
        globals()[f"step_{step}"](args)
        print(f"{step}: {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
