"""Which of matmul's kernel forms win where: every held-out shape swept over one fixed list of
configs per family, against cuBLAS timed in the same sweep.

    python benchmarks/gemm_variants.py --check              # tiny shapes, every step, seconds
    python benchmarks/gemm_variants.py --shapes 0:13        # into gemm_variants.db (resumes)
    python benchmarks/gemm_variants.py --report             # the table again, from the CSV

(``TRITON_INTERPRET=1`` for --check on a machine without a GPU.) The shapes are
benchmarks/gemm_heldout.py's. Families (FAMILIES):

- ``heuristic``: the template's untuned answer for the shape;
- ``known good``: the template's known-good list (its first candidates in every sweep), the
  plain TMA loop among them;
- ``tma loop``: the TMA kernel at seven tile shapes, under each loop option that the plain
  loop lacks (FLATTEN, SUBTILE, both).

The CSV also holds the survey that decided the space: its rows with ``ws`` 1 or 2 (the TMA kernel's
tile or K loop warp-specialised) and its ``tma split-k`` rows (the split tail cutting every tile
into ``split_k`` slices) measured options that the space no longer offers (search_spaces/matmul.toml
says why).

Each shape is one grid sweep over those configs (those that the space allows on this device) in
--db, as ``tune sweep --strategy grid`` over an explicit list measures them: every config checked
against the float32 reference, timed from CUDA graphs over input copies, the finalists re-timed
side by side; cuBLAS is the sweep's torch peer (``sweeps.peer_ms``, timed once on the same inputs
after the finalists, not interleaved: a survey, not the held-out target, which
benchmarks/gemm_heldout.py measures). Every trial becomes a row of
benchmarks/data/gemm_variants.csv (family, loop options, time, cuBLAS's time, ratio), and the
report prints per shape each family's fastest against cuBLAS, and per loop option the geometric
mean of its fastest over the plain loop's at the same tile shape.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from conformance import append_rows
from gemm_heldout import CHECK_SHAPES
from gemm_heldout import SHAPES
from gemm_heldout import problems_of
from gemm_heldout import slice_of

CSV = Path(__file__).resolve().parent / "data" / "gemm_variants.csv"
FIELDS = (
    "date", "gpu", "triton", "shape", "family", "variant", "tile", "split_k", "flatten", "ws", "subtile",
    "num_warps", "num_stages", "status", "time_ms", "cublas_ms", "cublas_over_ours", "config_hash",
)  # fmt: skip
#: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of the TMA loop family
TMA_TILES = (
    (128, 256, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 128, 8, 3),
    (128, 128, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (128, 64, 64, 4, 4),
    (64, 256, 64, 4, 3),
)
#: (FLATTEN, SUBTILE) other than the plain loop's (0, 0)
LOOPS = ((1, 0), (0, 1), (1, 1))
FAMILIES = ("heuristic", "known good", "tma loop", "tma split-k")
#: the loop options of the CSV's rows, as (flatten, ws, subtile) (ws: the survey's own)
REPORTED_LOOPS = ((1, 0, 0), (0, 1, 0), (0, 2, 0), (0, 0, 1), (1, 0, 1), (0, 1, 1))


def family_configs(problem: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    from tunesvc.device import fork_safe_current_device
    from tunesvc.templates.matmul import TEMPLATE
    from tunesvc.templates.matmul import matmul_config

    return {
        "heuristic": [TEMPLATE.heuristic(problem, fork_safe_current_device())],
        "known good": [dict(c) for c in TEMPLATE.known_good],
        "tma loop": [matmul_config("tma", m, n, k, 8, 1, w, s, loop) for m, n, k, w, s in TMA_TILES for loop in LOOPS],
    }


def families_by_hash(problem: dict[str, Any]) -> dict[str, str]:
    """Config hash -> the first family that lists the config."""
    from tunesvc.space import config_hash

    found: dict[str, str] = {}
    for name, configs in family_configs(problem).items():
        for c in configs:
            found.setdefault(config_hash(c), name)
    return found


def candidates_for(problem: dict[str, Any]) -> list[dict[str, Any]]:
    from tunesvc.device import fork_safe_current_device
    from tunesvc.space import config_hash
    from tunesvc.templates.matmul import TEMPLATE

    device = fork_safe_current_device()
    seen: dict[str, dict[str, Any]] = {}
    for configs in family_configs(problem).values():
        for c in configs:
            if not TEMPLATE.violations(c, problem, device):
                seen.setdefault(config_hash(c), c)
    return list(seen.values())


def write_rows(db: str, problems: list[dict[str, Any]], peer: dict[str, float | None]) -> int:
    import triton

    from tunesvc.device import fork_safe_current_device
    from tunesvc.store import Store
    from tunesvc.templates.matmul import TEMPLATE

    device = fork_safe_current_device()
    store = Store(db)
    rows = []
    try:
        kv, dev = store.kernel_version_id(TEMPLATE), store.device_id(device)
        for problem in problems:
            key = str(TEMPLATE.key(problem))
            cublas = peer.get(key)
            families = families_by_hash(problem)
            for t in store.trials(kv, dev, key):
                c = t.config
                ok = t.status == "ok" and t.time_ms
                rows.append(
                    {
                        "date": datetime.date.today().isoformat(),
                        "gpu": device.name,
                        "triton": triton.__version__,
                        "shape": f"{problem['M']}x{problem['N']}x{problem['K']}",
                        "family": families.get(t.config_hash, "other"),
                        "variant": c.get("VARIANT", "grouped"),
                        "tile": f"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']}",
                        "split_k": c.get("SPLIT_K", 1),
                        "flatten": c.get("FLATTEN", 0),
                        "ws": 0,
                        "subtile": c.get("SUBTILE", 0),
                        "num_warps": c["num_warps"],
                        "num_stages": c["num_stages"],
                        "status": t.status,
                        "time_ms": f"{t.time_ms:.6f}" if ok else "",
                        "cublas_ms": f"{cublas:.6f}" if cublas else "",
                        "cublas_over_ours": f"{cublas / t.time_ms:.4f}" if ok and cublas else "",
                        "config_hash": t.config_hash,
                    }
                )
    finally:
        store.close()
    append_rows(CSV, rows, FIELDS)
    return len(rows)


def report(path: Path) -> None:
    """Per shape, each family's fastest over cuBLAS; per loop option, its fastest over the plain
    loop's at the same tile (geometric mean over the shapes where both ran)."""
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r["time_ms"]]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    print(f"{'shape':>20} {'cuBLAS us':>10} " + " ".join(f"{name:>22}" for name in FAMILIES))
    for shape in shapes:
        mine = [r for r in rows if r["shape"] == shape]
        cublas = next((float(r["cublas_ms"]) for r in mine if r["cublas_ms"]), None)
        cells = []
        for name in FAMILIES:
            fam = [r for r in mine if r["family"] == name]
            if not fam or cublas is None:
                cells.append(f"{'-':>22}")
                continue
            best = min(fam, key=lambda r: float(r["time_ms"]))
            what = f"{best['variant'][:5]} {best['tile']}"
            cells.append(f"{cublas / float(best['time_ms']):6.3f}x {what:>14}")
        print(f"{shape:>20} {cublas * 1e3 if cublas else float('nan'):10.1f} " + " ".join(cells))
    plain: dict[tuple[str, str, str, str], float] = {}
    for r in rows:
        if r["variant"] == "tma" and (r["flatten"], r["ws"], r["subtile"]) == ("0", "0", "0"):
            k = (r["shape"], r["tile"], r["num_warps"], r["num_stages"])
            plain[k] = min(plain.get(k, math.inf), float(r["time_ms"]))
    print("\nTMA loop options: their time over the plain loop's at the same tile, warps and stages")
    for loop in REPORTED_LOOPS:
        ratios = [
            plain[k] / float(r["time_ms"])
            for r in rows
            if r["variant"] == "tma"
            and (int(r["flatten"]), int(r["ws"]), int(r["subtile"])) == loop
            and (k := (r["shape"], r["tile"], r["num_warps"], r["num_stages"])) in plain
        ]
        if ratios:
            mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(
                f"  FLATTEN={loop[0]} WS={loop[1]} SUBTILE={loop[2]}: geomean {mean:.3f}x over "
                f"{len(ratios)} (lowest {min(ratios):.3f}x, highest {max(ratios):.3f}x)"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="gemm_variants.db", help="the sweeps' database (resumes what it holds)")
    parser.add_argument("--shapes", default=":", help="a slice of gemm_heldout.py's --list indices")
    parser.add_argument("--report", action="store_true", help="print the report from the CSV and exit")
    parser.add_argument("--check", action="store_true", help="tiny shapes, a scratch database and CSV")
    args = parser.parse_args()
    global CSV
    if args.check:
        scratch = tempfile.mkdtemp(prefix="gemm-variants-check-")
        args.db, CSV = os.path.join(scratch, "check.db"), Path(scratch) / "gemm_variants.csv"
    if args.report:
        report(CSV)
        return 0
    shapes = CHECK_SHAPES if args.check else SHAPES
    shapes = tuple(shapes[i] for i in slice_of(args.shapes, len(shapes)))
    problems = problems_of(shapes)

    from _common import sweep

    from tunesvc.templates.matmul import TEMPLATE

    peer: dict[str, float | None] = {}
    started = time.perf_counter()
    sweep(
        TEMPLATE,
        problems,
        args.db,
        strategy="grid",
        budget=None,  # every candidate
        refit_selector=False,
        candidates=candidates_for,
        on_result=lambda result: peer.__setitem__(result.shape_key, result.peer_ms),
    )
    print(f"swept {len(problems)} shapes in {time.perf_counter() - started:.0f} s", flush=True)
    print(f"{write_rows(args.db, problems, peer)} trials written to {CSV}", flush=True)
    report(CSV)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
