"""Where attention's backward sums dQ: its held-out shapes swept over one fixed list of configs per
form (search_spaces/attention_bwd.toml's DQ), against SDPA's backward timed in the same sweep.

    python benchmarks/attention_variants.py --check         # tiny shapes, every step, seconds
    python benchmarks/attention_variants.py --shapes 0:4    # into attention_variants.db (resumes)
    python benchmarks/attention_variants.py --report        # the table again, from the CSV

(``TRITON_INTERPRET=1`` for --check on a machine without a GPU.) The shapes are
benchmarks/heldout.py's medium attention set. Forms (FORMS): ``DQ=0``, programs of their own sum
dQ walking the keys (seven matmuls a block); ``DQ=1``, each dK/dV program adds its share of dQ into
a float32 sum by atomic adds (five); ``DQ=2``, the same adds as TMA reductions. Each form's tiles
are the ones the held-out sweeps chose, and their neighbours (TILES), with and without TMA loads,
at the warps and stages of FORM_LAUNCH.

Each shape is one grid sweep over those configs (those that the space allows on this device) in
--db, as ``tune sweep --strategy grid`` over an explicit list measures them: every config checked
against the float32 reference, timed from CUDA graphs over input copies, the finalists re-timed
side by side; SDPA's backward is the sweep's torch peer (``sweeps.peer_ms``, timed once after the
finalists: a survey, not the held-out target, which benchmarks/heldout.py measures). Every trial
becomes a row of benchmarks/data/attention_variants.csv, and the report prints per shape each
form's fastest against SDPA.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from conformance import append_rows
from gemm_heldout import slice_of
from heldout import MEDIUM_ATTENTION

CSV = Path(__file__).resolve().parent / "data" / "attention_variants.csv"
FIELDS = (
    "date", "gpu", "triton", "shape", "dq", "tma", "block_m1", "block_n1", "block_m2", "block_n2",
    "num_warps", "num_stages", "status", "time_ms", "peer_ms", "peer_over_ours", "config_hash",
)  # fmt: skip
FORMS = (0, 1, 2)
#: (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2) per form: the dQ programs' tiles only where DQ=0
TILES = {
    0: ((64, 128, 128, 64), (32, 128, 128, 32), (32, 64, 64, 64)),
    1: ((64, 128, 64, 16), (32, 128, 64, 16), (64, 64, 64, 16), (32, 64, 64, 16)),
    2: ((64, 128, 64, 16), (32, 128, 64, 16), (64, 64, 64, 16), (32, 64, 64, 16)),
}
#: (num_warps, num_stages) per form
FORM_LAUNCH = {0: ((8, 2), (8, 3), (4, 3)), 1: ((8, 2), (8, 3)), 2: ((8, 2), (8, 3), (4, 2), (4, 3))}
#: --check's shapes: ragged S, causal and not, both head dims
CHECK_SHAPES = ((1, 2, 70, 64, True), (1, 1, 45, 128, False))


def problems_of(shapes: tuple[tuple[int, int, int, int, bool], ...], dtype: str) -> list[dict[str, Any]]:
    from tunesvc.templates.attention import BWD_TEMPLATE

    return [BWD_TEMPLATE.problem(B=b, H=h, S=s, D=d, causal=c, dtype=dtype) for b, h, s, d, c in shapes]


def configs_for(problem: dict[str, Any]) -> list[dict[str, Any]]:
    """Every form's configs that the space allows for ``problem`` on this device."""
    from tunesvc.device import fork_safe_current_device
    from tunesvc.templates.attention import BWD_TEMPLATE

    device = fork_safe_current_device()
    out = []
    for dq in FORMS:
        for m1, n1, m2, n2 in TILES[dq]:
            for tma in (0, 1):
                for warps, stages in FORM_LAUNCH[dq]:
                    config = {"BLOCK_M1": m1, "BLOCK_N1": n1, "BLOCK_M2": m2, "BLOCK_N2": n2, "TMA": tma, "DQ": dq}
                    config |= {"num_warps": warps, "num_stages": stages}
                    if not BWD_TEMPLATE.violations(config, problem, device):
                        out.append(config)
    return out


def write_rows(db: str, problems: list[dict[str, Any]], peer: dict[str, float | None]) -> int:
    import triton

    from tunesvc.device import fork_safe_current_device
    from tunesvc.store import Store
    from tunesvc.templates.attention import BWD_TEMPLATE

    device = fork_safe_current_device()
    store = Store(db)
    rows = []
    try:
        kv, dev = store.kernel_version_id(BWD_TEMPLATE), store.device_id(device)
        for problem in problems:
            key = str(BWD_TEMPLATE.key(problem))
            sdpa = peer.get(key)
            for t in store.trials(kv, dev, key):
                c, ok = t.config, t.status == "ok" and t.time_ms
                rows.append(
                    {
                        "date": datetime.date.today().isoformat(),
                        "gpu": device.name,
                        "triton": triton.__version__,
                        "shape": key,
                        "dq": c.get("DQ", 0),
                        "tma": c.get("TMA", 0),
                        **{f"block_{p.lower()}": c[f"BLOCK_{p}"] for p in ("M1", "N1", "M2", "N2")},
                        "num_warps": c["num_warps"],
                        "num_stages": c["num_stages"],
                        "status": t.status,
                        "time_ms": f"{t.time_ms:.6f}" if ok else "",
                        "peer_ms": f"{sdpa:.6f}" if sdpa else "",
                        "peer_over_ours": f"{sdpa / t.time_ms:.4f}" if ok and sdpa else "",
                        "config_hash": t.config_hash,
                    }
                )
    finally:
        store.close()
    append_rows(CSV, rows, FIELDS)
    return len(rows)


def report(path: Path) -> None:
    """Per shape (its latest rows), each form's fastest over SDPA's backward, with its tiles."""
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r["time_ms"]]
    latest = {r["shape"]: (r["date"], r["gpu"]) for r in rows}
    print(f"{'shape':>52} {'SDPA ms':>8} " + " ".join(f"{f'DQ={dq}':>30}" for dq in FORMS))
    for shape, (date, gpu) in latest.items():
        mine = [r for r in rows if r["shape"] == shape and (r["date"], r["gpu"]) == (date, gpu)]
        sdpa = next((float(r["peer_ms"]) for r in mine if r["peer_ms"]), None)
        cells = []
        for dq in FORMS:
            form = [r for r in mine if int(r["dq"]) == dq]
            if not form or sdpa is None:
                cells.append(f"{'-':>30}")
                continue
            best = min(form, key=lambda r: float(r["time_ms"]))
            tiles = f"{best['block_m1']}/{best['block_n1']} tma{best['tma']} w{best['num_warps']}s{best['num_stages']}"
            cells.append(f"{sdpa / float(best['time_ms']):6.3f}x {tiles:>22}")
        print(f"{shape:>52} {sdpa or float('nan'):8.3f} " + " ".join(cells), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="attention_variants.db", help="the sweeps' database (resumes what it holds)")
    parser.add_argument("--shapes", default=":", help="a slice of the shapes (heldout.py's medium attention set)")
    parser.add_argument("--report", action="store_true", help="print the report from the CSV and exit")
    parser.add_argument("--check", action="store_true", help="tiny shapes, a scratch database and CSV")
    args = parser.parse_args()
    global CSV
    if args.check:
        scratch = tempfile.mkdtemp(prefix="attention-variants-check-")
        args.db, CSV = os.path.join(scratch, "check.db"), Path(scratch) / "attention_variants.csv"
    if args.report:
        report(CSV)
        return 0
    shapes = CHECK_SHAPES if args.check else tuple(MEDIUM_ATTENTION)
    shapes = tuple(shapes[i] for i in slice_of(args.shapes, len(shapes)))
    problems = problems_of(shapes, "float16" if args.check else "bfloat16")

    from _common import sweep

    from tunesvc.templates.attention import BWD_TEMPLATE

    peer: dict[str, float | None] = {}
    started = time.perf_counter()
    sweep(
        BWD_TEMPLATE,
        problems,
        args.db,
        strategy="grid",
        budget=None,  # every candidate
        refit_selector=False,
        candidates=configs_for,
        on_result=lambda result: peer.__setitem__(result.shape_key, result.peer_ms),
    )
    print(f"swept {len(problems)} shapes in {time.perf_counter() - started:.0f} s", flush=True)
    print(f"{write_rows(args.db, problems, peer)} trials written to {CSV}", flush=True)
    report(CSV)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
