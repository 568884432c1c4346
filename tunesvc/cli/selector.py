"""`tune selector` and `tune evaluate`: fit a kernel's selector (configs for shapes nobody tuned)
from the stored trials, and measure it leave-one-shape-out against the nearest rule."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tunesvc.cli._common import DbOption
from tunesvc.cli._common import JsonOption
from tunesvc.cli._common import _complete_kernel
from tunesvc.cli._common import _ms
from tunesvc.cli._common import _print_json
from tunesvc.cli._common import app
from tunesvc.cli._common import console
from tunesvc.cli._common import user_errors
from tunesvc.cli._common import whole_lines
from tunesvc.errors import TunesvcError


def _ratio(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def _pct(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "-"


MinCoverageOption = Annotated[
    float,
    typer.Option(
        "--min-coverage",
        help="Fit on a tuned key only where at least this fraction of the candidates was measured (1.0: all).",
    ),
]


@app.command()
@user_errors
def selector(
    kernel: Annotated[
        str,
        typer.Argument(
            help="Kernel name (see `tune kernels`; the library's names, such as layer_norm, too).",
            autocompletion=_complete_kernel,
        ),
    ],
    cross_measure: Annotated[
        bool,
        typer.Option(
            "--cross-measure",
            help="First measure every distinct winner and runner-up on every tuned key of this device (stored).",
        ),
    ] = False,
    time_budget: Annotated[
        float | None,
        typer.Option(
            help="With --cross-measure: start no further tuned key after this many seconds (a rerun measures "
            "the keys left) \\[default: no limit]."
        ),
    ] = None,
    retime: Annotated[
        bool,
        typer.Option(
            "--retime",
            help="With --cross-measure: also time every candidate on every tuned key once more, as a sweep's "
            "finalists are timed (long graph replays), once per key (stored).",
        ),
    ] = False,
    shard: Annotated[
        str | None,
        typer.Option(
            metavar="I/N",
            help="With --cross-measure: measure only every N-th tuned key from the I-th (0-based) and fit "
            "nothing, so that N processes, one per GPU (CUDA_VISIBLE_DEVICES), split the work on one "
            "--db; then run `tune selector` once to fit.",
        ),
    ] = None,
    min_coverage: MinCoverageOption = 1.0,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fit the kernel's selector on this device from the stored trials, store it, and print it (the model kept, whether it projects a first pick that does not fit the shape onto the nearest config that does, and its leave-one-out score beside the nearest rule's)."""
    from tunesvc.device import current_device
    from tunesvc.store import Store
    from tunesvc.template import get_template
    from tunesvc.tuning import selector_fit  # fitting (scikit-learn), measuring (torch, Triton)
    from tunesvc.tuning import selector_measure
    from tunesvc.tuning.sweep import check_time_budget

    if time_budget is not None and not cross_measure:
        raise TunesvcError("--time-budget limits --cross-measure; add --cross-measure, or drop --time-budget.")
    if retime and not cross_measure:
        raise TunesvcError("--retime is part of --cross-measure; add --cross-measure, or drop --retime.")
    share = _shard(shard, cross_measure)
    check_time_budget(time_budget)
    template, device = get_template(kernel), current_device()
    store = Store(db)
    try:
        measured = 0
        if cross_measure:
            measured = selector_measure.cross_measure(
                store,
                template,
                device,
                on_key=lambda key, n: console.print(f"measuring {n} candidates on {key}"),
                time_budget=time_budget,
                retime=retime,
                shard=share,
            )
        if shard is not None:
            if as_json:
                return _print_json({"trials_measured": measured, "shard": list(share)})
            console.print(f"Measured {measured} trials on share {shard} of the tuned keys; fit nothing.")
            return
        data = selector_fit.training_set(store, template, device, min_coverage=min_coverage)
        fitted, scores = selector_fit.keep(store, template, device, data)
    finally:
        store.close()
    if as_json:
        return _print_json(
            {
                "selector": fitted.to_dict() if fitted else None,
                "leave_one_out": {"selector": scores[0], "nearest": scores[1]} if scores else None,
                "trials_measured": measured,
                "keys": list(data.keys),
                "skipped": [{"shape_key": k, "why": why} for k, why in data.skipped],
            }
        )
    for key, why in data.skipped:
        console.print(f"skipped {key}: {why}", highlight=False, markup=False, soft_wrap=whole_lines(console))
    if fitted is None:
        raise TunesvcError(
            f"{len(data.keys)} tuned key(s) of {template.name} on {device.name} are usable, too few to fit a selector "
            f"and judge it (it needs {selector_fit.MIN_KEYS_KEPT}); tune more shapes, or run with --cross-measure."
        )
    for line in fitted.describe():
        console.print(line, highlight=False, markup=False, soft_wrap=whole_lines(console))
    console.print(
        f"Fitted on {fitted.keys} tuned keys, {len(fitted.candidates)} candidates"
        + (f" ({measured} trials measured first)" if cross_measure else "")
        + f"; kept the {fitted.model} model"
        + (", projecting a first pick that does not fit" if fitted.project else "")
        + f"; stored in {store.shown_url}."
    )
    if scores is not None:
        console.print(
            f"Each tuned key left out in turn, on the stored times, its picks run {scores[0]:.3f}x as long as "
            f"the key's fastest candidate (geometric mean), the nearest rule's {scores[1]:.3f}x.",
            highlight=False,
        )


def _shard(text: str | None, cross_measure: bool) -> tuple[int, int]:
    """``--shard I/N`` as (I, N); (0, 1) without it."""
    if text is None:
        return 0, 1
    if not cross_measure:
        raise TunesvcError("--shard splits --cross-measure; add --cross-measure, or drop --shard.")
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise TunesvcError(f"--shard takes I/N with 0 <= I < N, such as 0/4, not {text!r}.")
    return int(index), int(count)


@app.command()
@user_errors
def evaluate(
    kernel: Annotated[
        str,
        typer.Argument(
            help="Kernel name (see `tune kernels`; the library's names, such as layer_norm, too).",
            autocompletion=_complete_kernel,
        ),
    ],
    min_coverage: MinCoverageOption = 1.0,
    csv: Annotated[
        Path | None,
        typer.Option("--csv", help="Also append one row per held-out key to this CSV file, as each is measured."),
    ] = None,
    time_budget: Annotated[
        float | None,
        typer.Option(
            help="Hold out no further key after this many seconds (the first always is); "
            "the table and the CSV have the keys measured \\[default: no limit]."
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Leave-one-shape-out on this device: each tuned key's winner against what the selector and the nearest rule pick without it, all measured."""
    from tunesvc.device import current_device
    from tunesvc.store import Store
    from tunesvc.template import get_template
    from tunesvc.tuning import selector_fit  # fitting (scikit-learn), measuring (torch, Triton)
    from tunesvc.tuning import selector_measure
    from tunesvc.tuning.sweep import check_time_budget

    check_time_budget(time_budget)
    if csv is not None:
        selector_measure.check_csv_path(csv)
    template, device = get_template(kernel), current_device()
    store = Store(db, readonly=True)
    try:
        progress = None if as_json else (lambda key: console.print(f"held out: {key}", highlight=False))
        rows = selector_measure.evaluate(
            store,
            template,
            device,
            min_coverage=min_coverage,
            on_key=progress,
            on_row=None if csv is None else (lambda row: selector_measure.append_csv([row], csv)),
            time_budget=time_budget,
        )
        tuned = len(selector_fit.tuned_winners(store, template, device.hardware_id))
    finally:
        store.close()
    totals = selector_measure.summary(rows)
    if as_json:
        return _print_json({"rows": [r.to_dict() for r in rows], "summary": totals})
    table = Table(title=f"{template.name} on {device.name}: held-out keys, measured (ratio = tuned ms / pick ms)")
    for column in ("shape key", "tuned ms", "selector", "selector ms", "ratio", "nearest", "nearest ms", "ratio "):
        table.add_column(column)
    for r in rows:
        table.add_row(
            r.shape_key,
            _ms(r.tuned_ms),
            r.selector_source,
            _ms(r.selector_ms),
            _ratio(r.selector_ratio),
            r.nearest_source,
            _ms(r.nearest_ms),
            _ratio(r.nearest_ratio),
        )
    console.print(table)
    summary = Table(title="Within 5% of the tuned best, and the worst ratio")
    for column in ("kernel", "held out", "selector within 5%", "selector worst", "nearest within 5%", "nearest worst"):
        summary.add_column(column)
    for name, t in totals.items():
        summary.add_row(
            name,
            str(t["held_out"]),
            _pct(t["selector_within_5pct"]),
            _ratio(t["selector_worst_ratio"]),
            _pct(t["nearest_within_5pct"]),
            _ratio(t["nearest_worst_ratio"]),
        )
    console.print(summary)
    if len(rows) < tuned:
        console.print(
            f"The time budget held out {len(rows)} of the {tuned} tuned keys; a rerun starts again from the first."
        )
