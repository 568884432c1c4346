"""Measuring for the selector on the device: every candidate on every tuned key
(:func:`cross_measure`), and each tuned key held out in turn (:func:`evaluate`).

Both measure through the sweeps' measurer (:mod:`tunesvc.bench`) and store what they time like
a sweep's trials (cross-measuring) or write it as CSV rows (the evaluation): a selector's
held-out error is measured on the GPU, never assumed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from tunesvc.errors import TunesvcError
from tunesvc.space import config_hash
from tunesvc.tuning.key import Finalists
from tunesvc.tuning.key import KeyTuning
from tunesvc.tuning.selector_fit import choose
from tunesvc.tuning.selector_fit import distinct_candidates
from tunesvc.tuning.selector_fit import nearest_pick
from tunesvc.tuning.selector_fit import runner_up_configs
from tunesvc.tuning.selector_fit import training_set
from tunesvc.tuning.selector_fit import tuned_winners

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.space import Config
    from tunesvc.store import Store
    from tunesvc.template import Template

#: the strategy of the sweeps that :func:`cross_measure` stores its trials under
CROSS_MEASURE = "cross"
#: the sweep that marks a tuned key whose candidates cross_measure(retime=True) re-timed
CROSS_RETIME = "cross-retime"


def cross_measure(
    store: Store,
    template: Template,
    device: Device,
    *,
    on_key: Callable[[str, int], None] | None = None,
    time_budget: float | None = None,
    retime: bool = False,
    shard: tuple[int, int] = (0, 1),
) -> int:
    """Measure every distinct winner and runner-up of ``template`` on every tuned key of
    ``device``'s model where it has no trial yet, through the sweeps' measurer, and store those
    trials (and any new winner) like a sweep's. Returns the number of trials stored. ``on_key(key, n)`` is called
    before a key's ``n`` candidates are measured.

    Measuring a key can change the candidates: a new winner there (a candidate, or one of the
    key's own trials that the re-timing puts first) or a new runner-up. The keys are gone over
    again until no candidate lacks a trial on one of them, so that a config that became a
    candidate on a later key is measured on the earlier ones too; no (key, config) is measured
    twice in one call.

    ``time_budget``: seconds after which no further key is started (the first key with gaps
    always is, so that calls in turn make progress); the keys left keep their gaps, which a
    later call fills, and :func:`training_set` skips them meanwhile.

    ``retime``: also, once per key (a ``cross-retime`` sweep marks it), time every candidate
    there again in one of the finalists' rounds over long graph replays, interleaved, with any
    trial that could then beat them: the selector then learns from times taken as the finalists
    and the held-out benchmark take them, not from first timings (one short timing each, which
    at a GPU's power cap reads some configs faster than others). About 0.6 s a candidate and key
    on an H100.

    ``shard``: (i, n), this call's share of the keys, every n-th from the i-th in key order, so
    that n processes (one per GPU) split the work on one database.
    """
    from tunesvc.bench import FINALIST_ROUNDS
    from tunesvc.bench import measurer_for

    index, count = shard
    if not 0 <= index < count:
        raise TunesvcError(f"A cross-measure share is (i, n) with 0 <= i < n, not {shard}.")
    kv_id, device_id = store.kernel_version_id(template), store.device_id(device)
    retimed = store.swept_keys(kv_id, device_id, CROSS_RETIME) if retime else set()
    total, began, measured_keys = 0, _now(), 0
    #: (key, config hash) pairs this call measured: none is measured twice
    tried: set[tuple[str, str]] = set()
    while True:  # a pass over the keys; the next one measures the candidates that it added
        winners = tuned_winners(store, template, device.hardware_id)
        stored = store.trial_times(template.name, template.version, device.hardware_id)
        candidates = distinct_candidates(
            winners, runner_up_configs(store, template, device.hardware_id, winners, stored, measured=False)
        )
        hashes = {config_hash(c) for c in candidates}
        visited = 0
        for key in sorted(winners)[index::count]:
            missing = [
                (c, h) for c in candidates if (h := config_hash(c)) not in stored.get(key, {}) and (key, h) not in tried
            ]
            again = retime and key not in retimed
            if not missing and not again:
                continue
            if measured_keys and _spent(began, time_budget):
                return total
            measured_keys += 1
            visited += 1
            tried.update((key, h) for _, h in missing)
            problem = template.problem_of_key(key)
            if on_key is not None:
                on_key(key, len(candidates) if again else len(missing))
            # the key is served its stored winner: it is kept among the finalists. The candidates
            # get first timings, the stored winner had a finalist's longer one (which a GPU at its
            # power cap reads slower): the fastest, if it is not the winner, is re-timed beside it,
            # as a sweep's finalists are, before it can take the key on a time taken another way
            tuning = KeyTuning(
                store,
                kv_id,
                device_id,
                key,
                problem=problem,
                strategy=CROSS_RETIME if again else CROSS_MEASURE,
                served=winners[key],
                finalists=Finalists(1),
            )
            tuning.open()
            started = _now()
            with measurer_for(template, problem, device) as measurer:
                total += sum(i is not None for i in tuning.record(tuning.measure(measurer, [c for c, _ in missing])))
                if again:  # every candidate, once, as a finalist's round times it
                    tuning.retime(
                        measurer, Finalists(0, rep_ms=measurer.rep_ms / FINALIST_ROUNDS, rounds=1), keep=hashes
                    )
                    retimed.add(key)
                else:
                    tuning.retime(measurer)
            tuning.finish(_now() - started)
        if not visited:
            return total


def _now() -> float:
    import time

    return time.perf_counter()


def _spent(began: float, time_budget: float | None) -> bool:
    """Whether a --time-budget of seconds from ``began`` (a :func:`_now`) has passed; never without one."""
    return time_budget is not None and _now() - began >= time_budget


# -- leave-one-shape-out evaluation, measured -----------------------------------------------------
#: a pick "within 5%" runs in at most this multiple of the tuned best's time
WITHIN = 1.05
#: interleaved re-timing rounds of the configs compared on one held-out key
ROUNDS = 3


@dataclass(frozen=True)
class HeldOut:
    """One held-out key: its tuned best against what the selector (fitted without it) and the
    nearest rule (without it) would launch, all three measured now, side by side."""

    kernel: str
    device: str
    shape_key: str
    keys_fitted: int
    tuned_config: Config
    tuned_ms: float | None
    selector_source: str  # predicted | nearest | heuristic: what the runtime with that selector launches
    selector_config: Config
    selector_ms: float | None
    nearest_source: str  # nearest | heuristic
    nearest_key: str | None
    nearest_config: Config
    nearest_ms: float | None

    @property
    def selector_ratio(self) -> float | None:
        return _ratio(self.tuned_ms, self.selector_ms)

    @property
    def nearest_ratio(self) -> float | None:
        return _ratio(self.tuned_ms, self.nearest_ms)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {**asdict(self), "selector_ratio": self.selector_ratio, "nearest_ratio": self.nearest_ratio}


def _ratio(tuned_ms: float | None, pick_ms: float | None) -> float | None:
    """tuned / pick: 1.0 is as fast as the tuned best; 0.0 where the pick failed."""
    if tuned_ms is None:
        return None
    return 0.0 if pick_ms is None else tuned_ms / pick_ms


def evaluate(
    store: Store,
    template: Template,
    device: Device,
    *,
    min_coverage: float = 1.0,
    on_key: Callable[[str], None] | None = None,
    on_row: Callable[[HeldOut], None] | None = None,
    time_budget: float | None = None,
) -> list[HeldOut]:
    """Leave-one-shape-out over the tuned keys of ``template`` on ``device``'s model.

    For each key: fit the selector on the other keys (their candidates and trials only), then
    measure on this device, through the sweeps' measurer, the key's tuned winner, what the
    runtime would launch with that selector (predicted, else nearest, else heuristic) and what
    the nearest rule alone would, re-timed in ``ROUNDS`` interleaved rounds (median).
    ``on_row(row)`` is called as each key's row is made (a CSV written as it goes);
    ``time_budget``: seconds after which no further key is held out (the first always is).
    """
    from tunesvc.bench import measurer_for

    winners = tuned_winners(store, template, device.hardware_id)
    if not winners:
        raise TunesvcError(
            f"No tuned key of {template.name} (version {template.version}) on {device.name} in {store.where}; "
            "run `tune sweep` first."
        )
    rows: list[HeldOut] = []
    began = _now()
    for key in sorted(winners):
        if rows and _spent(began, time_budget):
            break
        if on_key is not None:
            on_key(key)
        problem = template.problem_of_key(key)
        others = {k: c for k, c in winners.items() if k != key}
        data = training_set(store, template, device, exclude=(key,), min_coverage=min_coverage)
        fitted, _ = choose(data)
        nearest = nearest_pick(others, key, template, problem, device)
        picked = fitted.pick(template, problem, device) if fitted is not None else None
        chosen = ("predicted", picked) if picked is not None else (nearest[0], nearest[2])
        configs = {config_hash(c): c for c in (winners[key], chosen[1], nearest[2])}
        with measurer_for(template, problem, device) as measurer:
            times = _measured(measurer, configs)
        row = HeldOut(
            kernel=template.name,
            device=device.name,
            shape_key=key,
            keys_fitted=fitted.keys if fitted is not None else 0,
            tuned_config=winners[key],
            tuned_ms=times[config_hash(winners[key])],
            selector_source=chosen[0],
            selector_config=chosen[1],
            selector_ms=times[config_hash(chosen[1])],
            nearest_source=nearest[0],
            nearest_key=nearest[1],
            nearest_config=nearest[2],
            nearest_ms=times[config_hash(nearest[2])],
        )
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def _measured(measurer: Any, configs: dict[str, Config]) -> dict[str, float | None]:
    """Each config checked against the reference, then timed in interleaved rounds as a sweep's
    finalists are (:func:`tunesvc.bench.timed_in_rounds`): the median of its rounds, under the
    same clocks as the others; None where it failed, first or in any round."""
    import statistics

    from tunesvc.bench import timed_in_rounds

    checked = {h: measurer.measure(c) for h, c in configs.items()}
    ok = {h: configs[h] for h, m in checked.items() if m.ok and m.time_ms is not None}
    rounds = timed_in_rounds(measurer, ok, measurer.rep_ms, ROUNDS)
    return {
        h: statistics.median(m.time_ms for m in rounds[h] if m.time_ms is not None)
        if h in rounds and all(m.ok and m.time_ms is not None for m in rounds[h])
        else None
        for h in configs
    }


def summary(rows: list[HeldOut]) -> dict[str, dict[str, Any]]:
    """Per kernel: held-out keys, and for the selector and the nearest rule the fraction of keys
    within 5% of the tuned best and the worst ratio (tuned ms / pick ms)."""
    out: dict[str, dict[str, Any]] = {}
    for kernel in sorted({r.kernel for r in rows}):
        mine = [r for r in rows if r.kernel == kernel and r.tuned_ms is not None]
        entry: dict[str, Any] = {
            "held_out": len(mine),
            "tuned_failed": sum(r.kernel == kernel for r in rows) - len(mine),
        }
        for side in ("selector", "nearest"):
            ratios = [getattr(r, f"{side}_ratio") for r in mine]
            entry[f"{side}_within_5pct"] = sum(x >= 1 / WITHIN for x in ratios) / len(ratios) if ratios else None
            entry[f"{side}_worst_ratio"] = min(ratios) if ratios else None
        entry["predicted"] = sum(r.selector_source == "predicted" for r in mine)
        out[kernel] = entry
    return out


CSV_COLUMNS = (
    "kernel",
    "device",
    "shape_key",
    "keys_fitted",
    "tuned_ms",
    "selector_source",
    "selector_ms",
    "selector_ratio",
    "nearest_source",
    "nearest_key",
    "nearest_ms",
    "nearest_ratio",
    "selector_config",
    "nearest_config",
    "tuned_config",
    "timestamp",
)


def check_csv_path(path: Path) -> None:
    """A --csv path whose folder exists and which is new, empty, or a CSV of these rows (its
    first line :data:`CSV_COLUMNS`): rows are appended only to a file they belong to, never to
    another file, a FIFO (whose opening waits for a reader) or a device. Checked before
    anything is measured, and before each append."""
    import csv

    from tunesvc.files import read_regular

    if not path.parent.is_dir():
        raise TunesvcError(f"Cannot write {path}: folder {path.parent} does not exist.")
    try:
        head = read_regular(path, 64 << 10, "a CSV file")
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TunesvcError(f"Cannot read {path} ({exc.strerror or exc}); check --csv.") from None
    first = next(csv.reader(head.decode("utf-8", "replace").splitlines()[:1]), None)
    if head and tuple(first or ()) != CSV_COLUMNS:
        raise TunesvcError(
            f"{path} exists and is not a CSV of `tune evaluate` (its first line is not its header), "
            "so nothing is appended to it; pass another --csv."
        )


def append_csv(rows: list[HeldOut], path: str | Path) -> None:
    """Append ``rows`` to a CSV file (its header first, if the file is new or empty)."""
    import csv
    import json
    from datetime import UTC
    from datetime import datetime

    path = Path(path)
    check_csv_path(path)
    new = not path.exists() or path.stat().st_size == 0
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        with path.open("a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
            if new:
                writer.writeheader()
            for r in rows:
                d = r.to_dict()
                d.update(
                    timestamp=stamp,
                    **{
                        k: json.dumps(d[k], sort_keys=True)
                        for k in ("selector_config", "nearest_config", "tuned_config")
                    },
                )
                writer.writerow({k: d[k] for k in CSV_COLUMNS})
    except OSError as exc:
        raise TunesvcError(f"Cannot write {path} ({exc.strerror or exc}); check --csv.") from None
