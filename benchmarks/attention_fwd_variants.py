"""Whether attention's forward gains from packed half-precision exponentials (FAST_EXP) and a
software-pipelined key loop (PIPE): its held-out shapes swept over one fixed list of configs per
form, against SDPA timed in the same sweep.

    python benchmarks/attention_fwd_variants.py --check         # tiny shapes, every step, seconds
    python benchmarks/attention_fwd_variants.py --shapes 0:4    # into attention_fwd_variants.db (resumes)
    python benchmarks/attention_fwd_variants.py --report        # the table again, from the CSV

(``TRITON_INTERPRET=1`` for --check on a machine without a GPU.) The shapes are
benchmarks/heldout.py's medium attention set, D=128 first. Forms (FORMS), as the kernel's
constexprs (kernels/attention.py): ``baseline``, FAST_EXP=PIPE=0, the shipped kernel; ``fast exp``,
p = exp2(s - m) by ``ex2.approx.f16x2`` (FAST_EXP=1, or ``ex2.approx.ftz.bf16x2`` with
``--fast-exp 2``); ``pipelined``, the unmasked key loop issuing the next block's scores before this
block's exponentials (PIPE=1); ``both``. Each form runs the same tiles (TILES, per head dim: the
tiles and launches the held-out sweeps chose and their neighbours), with and without TMA loads,
where VARIANT_SPACE (the space file's constraints plus those of FAST_EXP and PIPE, which the space
file does not offer) allows them on this device.

Each shape is one grid sweep over those configs in --db, as ``tune sweep --strategy grid`` over an
explicit list measures them: every config checked against the float32 reference, timed from CUDA
graphs over input copies, the finalists re-timed side by side; SDPA is the sweep's torch peer
(``sweeps.peer_ms``, timed once after the finalists: a survey, not the held-out target, which
benchmarks/heldout.py measures). Each swept shape's trials become rows of
benchmarks/data/attention_fwd_variants.csv as it ends, and the report prints per shape each form's
fastest against SDPA, and each form's geometric mean over the shapes. ``--time-limit`` starts a
shape only while the time left exceeds the longest shape so far.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from conformance import append_rows
from gemm_heldout import slice_of
from heldout import MEDIUM_ATTENTION

CSV = Path(__file__).resolve().parent / "data" / "attention_fwd_variants.csv"
FIELDS = (
    "date", "gpu", "triton", "shape", "form", "fast_exp", "pipe", "tma", "block_m", "block_n",
    "num_warps", "num_stages", "status", "time_ms", "peer_ms", "peer_over_ours", "config_hash",
)  # fmt: skip
#: form -> (FAST_EXP, PIPE); FAST_EXP 1 is --fast-exp's value
FORMS = {"baseline": (0, 0), "fast exp": (1, 0), "pipelined": (0, 1), "both": (1, 1)}
#: (BLOCK_M, BLOCK_N, num_warps, num_stages) per head dim, each with TMA 0 and 1
TILES = {
    128: ((128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (256, 64, 16, 3)),
    64: ((128, 64, 4, 3), (128, 64, 4, 4), (128, 64, 8, 3), (256, 64, 8, 3), (256, 64, 16, 3)),
}
#: --check's tiles: two or more key blocks of 32, so that the pipelined loop runs
CHECK_TILES = ((64, 32, 4, 2),)
#: --check's shapes: ragged S, causal and not, both head dims
CHECK_SHAPES = ((1, 2, 130, 64, True), (1, 1, 70, 128, False))
#: What search_spaces/attention.toml would add to offer FAST_EXP and PIPE (it does not yet): merged
#: into the space file's own [params] and [constraints] to check the survey's configs
VARIANT_SPACE = """
[params]
# p = exp2(s - m) two elements per MUFU instruction (kernels/attention.py's _exp2): 1 by
# ex2.approx.f16x2 on float16 inputs, 2 by ex2.approx.ftz.bf16x2 on bfloat16 ones
FAST_EXP = [0, 1, 2]
# 1: the unmasked key loop software-pipelined (_attn_fwd_pipelined)
PIPE = [0, 1]

[constraints]
# inline PTX (sm_90 for the bfloat16 form); the interpreter runs exp2 in float32 instead
fast_exp = "FAST_EXP == 0 or has_packed_ex2 == 1"
# the pipelined loop replaces the warp-specialised one
pipe = "PIPE == 0 or WS == 0"
# it keeps one K and one V tile more in shared memory (the peeled first block's, the scores in flight)
pipe_shared_memory = "PIPE == 0 or (BLOCK_M + 2 * BLOCK_N * (num_stages + 1)) * D * elem_bytes <= max_shared_memory"
"""


def variant_space() -> Any:
    """The template's space file with VARIANT_SPACE's parameters and constraints added."""
    from tunesvc.space import Space
    from tunesvc.templates.attention import TEMPLATE

    data = tomllib.loads(TEMPLATE.space_path.read_text())
    extra = tomllib.loads(VARIANT_SPACE)
    for section in ("params", "constraints"):
        data[section] = {**data.get(section, {}), **extra[section]}
    return Space.from_dict(
        data, source="attention.toml + VARIANT_SPACE", problem_vars=tuple(TEMPLATE.problem_vars_names())
    )


def problems_of(shapes: tuple[tuple[int, int, int, int, bool], ...], dtype: str) -> list[dict[str, Any]]:
    from tunesvc.templates.attention import TEMPLATE

    return [TEMPLATE.problem(B=b, H=h, S=s, D=d, causal=c, dtype=dtype) for b, h, s, d, c in shapes]


def form_of(config: dict[str, Any]) -> str:
    fast, pipe = bool(config.get("FAST_EXP", 0)), int(config.get("PIPE", 0))
    return next(name for name, (f, p) in FORMS.items() if (bool(f), p) == (fast, pipe))


def form_configs(
    problem: dict[str, Any], tiles: tuple[tuple[int, int, int, int], ...], fast_exp: int, limits: dict[str, int]
) -> list[dict[str, Any]]:
    """Every form's configs over ``tiles`` that VARIANT_SPACE allows for ``problem`` under ``limits``;
    the baseline's without FAST_EXP and PIPE, as the space file's configs are."""
    from tunesvc.templates.attention import TEMPLATE

    space, env = variant_space(), TEMPLATE.problem_vars(problem)
    out = []
    for fast, pipe in FORMS.values():
        for m, n, warps, stages in tiles:
            for tma in (0, 1):
                config: dict[str, Any] = {"BLOCK_M": m, "BLOCK_N": n, "TMA": tma, "WS": 0}
                if fast or pipe:
                    config |= {"FAST_EXP": fast * fast_exp, "PIPE": pipe}
                config |= {"num_warps": warps, "num_stages": stages}
                if not space.violations(config, env, limits):
                    out.append(config)
    return out


def write_rows(db: str, problem: dict[str, Any], peer_ms: float | None) -> int:
    """The trials of ``problem``'s key in ``db`` as rows of CSV; how many."""
    import triton

    from tunesvc.device import fork_safe_current_device
    from tunesvc.store import Store
    from tunesvc.templates.attention import TEMPLATE

    device = fork_safe_current_device()
    store = Store(db)
    rows = []
    try:
        kv, dev = store.kernel_version_id(TEMPLATE), store.device_id(device)
        shape = "B{B} H{H} S{S} D{D} {}".format("causal" if problem["causal"] else "full", **problem)
        for t in store.trials(kv, dev, str(TEMPLATE.key(problem))):
            c, ok = t.config, t.status == "ok" and t.time_ms
            rows.append(
                {
                    "date": datetime.date.today().isoformat(),
                    "gpu": device.name,
                    "triton": triton.__version__,
                    "shape": shape,
                    "form": form_of(c),
                    "fast_exp": c.get("FAST_EXP", 0),
                    "pipe": c.get("PIPE", 0),
                    "tma": c.get("TMA", 0),
                    "block_m": c["BLOCK_M"],
                    "block_n": c["BLOCK_N"],
                    "num_warps": c["num_warps"],
                    "num_stages": c["num_stages"],
                    "status": t.status,
                    "time_ms": f"{t.time_ms:.6f}" if ok else "",
                    "peer_ms": f"{peer_ms:.6f}" if peer_ms else "",
                    "peer_over_ours": f"{peer_ms / t.time_ms:.4f}" if ok and peer_ms else "",
                    "config_hash": t.config_hash,
                }
            )
    finally:
        store.close()
    append_rows(CSV, rows, FIELDS)
    return len(rows)


def report(path: Path) -> None:
    """Per shape (its latest rows), each form's fastest over SDPA, with its tiles; per form the
    geometric mean of those ratios over the shapes that have all four forms."""
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r["time_ms"]]
    latest = {r["shape"]: (r["date"], r["gpu"]) for r in rows}
    print(f"{'shape':>28} {'SDPA ms':>8} " + " ".join(f"{form:>27}" for form in FORMS))
    ratios: dict[str, list[float]] = {form: [] for form in FORMS}
    for shape, (date, gpu) in latest.items():
        mine = [r for r in rows if r["shape"] == shape and (r["date"], r["gpu"]) == (date, gpu)]
        sdpa = next((float(r["peer_ms"]) for r in mine if r["peer_ms"]), None)
        cells, best = [], {}
        for form in FORMS:
            of_form = [r for r in mine if r["form"] == form]
            if not of_form or sdpa is None:
                cells.append(f"{'-':>27}")
                continue
            fastest = min(of_form, key=lambda r: float(r["time_ms"]))
            best[form] = sdpa / float(fastest["time_ms"])
            tiles = f"{fastest['block_m']}/{fastest['block_n']} tma{fastest['tma']} w{fastest['num_warps']}s{fastest['num_stages']}"
            cells.append(f"{best[form]:6.3f}x {tiles:>19}")
        if len(best) == len(FORMS):
            for form, ratio in best.items():
                ratios[form].append(ratio)
        print(f"{shape:>28} {sdpa or float('nan'):8.3f} " + " ".join(cells), flush=True)
    if any(ratios.values()):
        means = [math.exp(sum(map(math.log, r)) / len(r)) for r in ratios.values()]
        print(f"{'geomean':>28} {'':>8} " + " ".join(f"{m:6.3f}x {'':>19}" for m in means), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--db", default="attention_fwd_variants.db", help="the sweeps' database (resumes what it holds)"
    )
    parser.add_argument(
        "--shapes", default=":", help="a slice of the shapes, i:j (heldout.py's medium set, D=128 first)"
    )
    parser.add_argument("--fast-exp", type=int, choices=(1, 2), default=1, help="FAST_EXP of the fast-exp forms")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds: start no shape that may end past them")
    parser.add_argument("--report", action="store_true", help="print the report from the CSV and exit")
    parser.add_argument("--check", action="store_true", help="tiny shapes, a scratch database and CSV")
    args = parser.parse_args()
    global CSV
    if args.check:
        scratch = tempfile.mkdtemp(prefix="attention-fwd-variants-check-")
        args.db, CSV = os.path.join(scratch, "check.db"), Path(scratch) / "attention_fwd_variants.csv"
    if args.report:
        report(CSV)
        return 0
    shapes = CHECK_SHAPES if args.check else tuple(sorted(MEDIUM_ATTENTION, key=lambda shape: -shape[3]))
    shapes = tuple(shapes[i] for i in slice_of(args.shapes, len(shapes)))
    problems = problems_of(shapes, "float16" if args.check else "bfloat16")

    from _common import sweep

    from tunesvc.device import fork_safe_current_device
    from tunesvc.templates.attention import TEMPLATE

    limits = fork_safe_current_device().limits()
    if args.check:
        # the interpreter runs FAST_EXP configs with exp2 in float32 (the launcher): --check sends
        # them through every step all the same
        limits["has_packed_ex2"] = 1
    tiles = CHECK_TILES if args.check else None
    started = time.perf_counter()
    longest, written = 0.0, 0

    def stop(problem: dict[str, Any]) -> bool:
        left = math.inf if args.time_limit is None else args.time_limit - (time.perf_counter() - started)
        if left > longest:
            return False
        print(
            f"stopped before {TEMPLATE.key(problem)}: {left:.0f} s left, a shape took up to {longest:.0f} s", flush=True
        )
        return True

    def ended(result: Any) -> None:
        nonlocal longest, written
        longest = max(longest, result.wall_seconds)
        problem = next(p for p in problems if str(TEMPLATE.key(p)) == result.shape_key)
        written += write_rows(args.db, problem, result.peer_ms)

    sweep(
        TEMPLATE,
        problems,
        args.db,
        strategy="grid",
        budget=None,  # every candidate
        refit_selector=False,
        candidates=lambda p: form_configs(p, tiles or TILES[p["D"]], args.fast_exp, limits),
        on_result=ended,
        stop=stop,
    )
    print(f"swept in {time.perf_counter() - started:.0f} s; {written} trials written to {CSV}", flush=True)
    report(CSV)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
