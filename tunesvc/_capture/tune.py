"""Tuning a captured key: on a launch's miss, once across processes and hosts, or offline on a recorded call.

:func:`tune_locked` takes the one key claim (other processes wait, then read the winner) and
measures on the call's own arguments, leaving no trace but the store; :func:`tune_key` checks and
times every candidate, re-times the finalists and stores every trial and the winner.
:func:`tune_recorded` tunes a key recorded while serving (`tune misses --tune`), and
:func:`measure_stored` re-measures stored configs on a recorded call (`tune verify`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import TYPE_CHECKING
from typing import Any

from tunesvc import settings
from tunesvc._capture.bench import CaptureBench
from tunesvc._capture.bench import aliased
from tunesvc._capture.bench import measure_configs
from tunesvc._capture.bench import measuring_context
from tunesvc._capture.bench import pruned_configs
from tunesvc._capture.bench import tensors_of
from tunesvc._capture.bench import untraced
from tunesvc._capture.failopen import STAGE
from tunesvc._capture.failopen import STATS
from tunesvc._capture.failopen import TUNE_SECONDS
from tunesvc._capture.identity import config_dict
from tunesvc._capture.precompile import precompiled_configs
from tunesvc._capture.recorded import describe_call
from tunesvc._capture.recorded import find_autotuner
from tunesvc._capture.recorded import rebuild_call
from tunesvc._capture.sharing import Settings
from tunesvc._capture.sharing import State
from tunesvc.bench import Measurement
from tunesvc.bench import Status
from tunesvc.errors import TunesvcError
from tunesvc.settings import LOOKUP
from tunesvc.settings import TUNE
from tunesvc.space import config_hash
from tunesvc.tuning.key import FIRST_PASS_SHARE
from tunesvc.tuning.key import KeyTuning
from tunesvc.tuning.key import in_process

if TYPE_CHECKING:
    from triton.runtime.autotuner import Autotuner

    from tunesvc._capture.bench import Pruned
    from tunesvc._capture.sharing import Shared
    from tunesvc.device import Device
    from tunesvc.records import TrialRecord
    from tunesvc.store import Store


def tune_locked(
    tuner: Autotuner,
    state: State,
    shared: Shared,
    text: str,
    args: tuple,
    kwargs: dict[str, Any],
    pruned: Pruned,
) -> Any:
    """Tune the key once across processes and hosts; the others wait and then read the winner
    (the one key claim: :class:`tunesvc.tuning.claim.KeyClaim`)."""
    from tunesvc.device import current_device
    from tunesvc.tuning.claim import KeyClaim

    with STAGE("prune"):
        candidates = pruned()
    with STAGE("open the database"):
        store = shared.store(create=True)
        assert store is not None
        device = current_device()
    template = state.template

    def winner() -> Any:
        rows = store.winners(kernel=state.name, hardware_id=device.hardware_id, version=template.version)
        return state.match(next((w.config for w in rows if w.shape_key == text), None), pruned)

    ident = f"{state.name}|{template.version}|{device.hardware_id}|{text}"
    with STAGE("claim"), KeyClaim(store, state.name, ident, text, winner) as claim:
        if claim.winner is not None:
            STATS["stored"] += 1
            return claim.winner
        started = time.perf_counter()
        with untraced(tensors_of((args, kwargs))):
            config = tune_key(tuner, state, store, device, text, list(candidates), aliased(args), aliased(kwargs))
        TUNE_SECONDS[0] += time.perf_counter() - started
        return config


def tune_key(
    tuner: Autotuner,
    state: State,
    store: Store,
    device: Device,
    text: str,
    candidates: list[Any],
    args: tuple,
    kwargs: dict[str, Any],
    *,
    grids: dict[str, Any] | None = None,
    call: dict[str, Any] | None = None,
    notes: dict[str, str] | None = None,
) -> Any:
    """Check and time every candidate on the call's arguments, store every trial and the winner
    (:class:`tunesvc.tuning.key.KeyTuning`, with capture's first pass: in this process, under
    the key claim the caller holds, a quarter of the replay length each and the finalists
    within 5% of the fastest, :func:`tunesvc.tuning.key.in_process`). No served answer is kept
    among the finalists: a captured key is tuned at its first launch, before it was served one.

    Returns the winning triton.Config (the first candidate where none is correct: its launch
    then raises what triton.autotune would). The call's tensors are left as they were given.
    ``notes``: a line per config hash that its trial's message ends with (``tune adopt``'s provenance).
    """
    template = state.template
    rep_ms = float(getattr(tuner, "num_reps", None) or settings.REP_MS)
    with STAGE("store"):
        started = time.perf_counter()
        # the call as data: `tune verify` and offline tuning rebuild inputs of the same shapes from it
        call = call if call is not None else describe_call(tuner, args, kwargs)
        tuning = KeyTuning(
            store,
            store.kernel_version_id(template),
            store.device_id(device),
            text,
            problem=call,
            strategy="capture",
            budget=len(candidates),
            heuristic=config_dict(candidates[0]) if candidates else None,  # the untuned fallback's: the first listed
            finalists=in_process(device, rep_ms),
            replace=True,  # measured before (`tune verify --retune`): the stored trials take the new measurements
        )
        tuning.open()
    with (
        STAGE("measure"),
        measuring_context(),
        precompiled_configs(tuner, state, device, candidates, call, args, kwargs) as ready,
    ):
        bench = CaptureBench(
            tuner,
            device,
            args,
            kwargs,
            rep_ms=rep_ms * FIRST_PASS_SHARE,
            tolerance=state.options.get("tolerance"),
            grids=grids,
            candidates=candidates,
        )
        try:
            measured = measure_configs(bench, candidates, ready)
            STATS["benchmarks"] += bench.measurements
            results = [(config_dict(c), config_hash(config_dict(c)), m) for c, m in zip(candidates, measured)]
            if notes:
                results = [(c, h, m.noted(notes.get(h))) for c, h, m in results]
            with STAGE("store"):
                tuning.record(results)
            tuning.retime(bench)
        finally:
            bench.restore()  # the caller launches the winner on the inputs as they were given
    # what triton.autotune leaves for code that reads them (first measurements, as Triton's)
    tuner.configs_timings = {
        c: [m.time_ms if m.ok and m.time_ms is not None else math.inf] * 3 for c, (_, _, m) in zip(candidates, results)
    }
    tuner.bench_time = time.perf_counter() - started
    with STAGE("store"):
        winner = tuning.finish(time.perf_counter() - started).winner
    # a key counts as tuned only where a winner was stored; one whose every candidate failed is failed
    STATS["tuned" if winner is not None else "failed"] += 1
    if winner is None:
        return candidates[0]
    return state.match(winner.config, lambda: candidates) or candidates[0]


def tune_recorded(
    store: Store,
    name: str,
    version: str,
    shape_key: str,
    call: dict[str, Any],
    *,
    time_limit_s: float | None = settings.REPLAY_TIME_LIMIT_S,
) -> Any:
    """Tune one recorded key offline: import the kernel, rebuild the call, tune as on a miss, in
    a process of its own (:func:`_apart`), stopped after ``time_limit_s``.

    Returns the winning config as stored (a dict), or raises TunesvcError with the reason.
    """
    return _apart(name, shape_key, _tune_recorded_here, store.url, name, version, shape_key, call, limit=time_limit_s)


def _tune_recorded_here(store: Store, name: str, version: str, shape_key: str, call: dict[str, Any]) -> Any:
    winner, rows, _ = _tune_recorded_call(
        store, name, version, shape_key, call,
        since="the key was recorded", then="; run the program again to record it anew",
        none_kept=f"No config of {name} has a recorded grid for {shape_key}.",
    )  # fmt: skip
    if winner is None:  # every candidate failed: no winner, not tuned
        statuses = Counter(r.status for r in rows)
        said = next((r.message for r in rows if r.message), None)
        raise TunesvcError(
            f"Every candidate of {name} failed on {shape_key} ("
            + ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
            + (f", the first saying {said}" if said else "")
            + "), so it has no winner."
        )
    return winner


def adopt_recorded(
    store: Store,
    name: str,
    version: str,
    shape_key: str,
    configs: list[dict[str, Any]],
    *,
    recorded_on: str,
    notes: dict[str, str] | None = None,
    time_limit_s: float | None = settings.REPLAY_TIME_LIMIT_S,
) -> tuple[dict[str, Any] | None, int]:
    """Tune a captured key on this device over ``configs`` only (`tune adopt`: another GPU
    model's winners and the first listed config), on inputs rebuilt from the call its sweep
    recorded on the device model ``recorded_on``, as a miss tunes it; in a process of its own
    (:func:`_apart`), stopped after ``time_limit_s``. The call is recorded for this device too.

    Returns the stored winner (None where no candidate ran correctly) and the id of the
    kernel's version in the store, or raises TunesvcError with the reason."""
    done: tuple[dict[str, Any] | None, int] = _apart(
        name, shape_key, _adopt_recorded_here, store.url, name, version, shape_key, configs, recorded_on, notes,
        limit=time_limit_s,
    )  # fmt: skip
    return done


def _adopt_recorded_here(
    store: Store,
    name: str,
    version: str,
    shape_key: str,
    configs: list[dict[str, Any]],
    recorded_on: str,
    notes: dict[str, str] | None,
) -> tuple[dict[str, Any] | None, int]:
    winner, _, kv_id = _tune_recorded_call(
        store, name, version, shape_key, None, recorded_on=recorded_on, configs=configs, notes=notes,
        since="its winners were tuned",
        none_kept=f"None of the configs to adopt for {shape_key} is in {name}'s config list with a recorded grid.",
    )  # fmt: skip
    return winner, kv_id


def _tune_recorded_call(
    store: Store,
    name: str,
    version: str,
    shape_key: str,
    call: dict[str, Any] | None,
    *,
    since: str,
    then: str = "",
    none_kept: str,
    recorded_on: str = "",
    configs: list[dict[str, Any]] | None = None,
    notes: dict[str, str] | None = None,
) -> tuple[dict[str, Any] | None, list[TrialRecord], int]:
    """Tune a key on this device over the configs that have a grid in its recorded call, rebuilt
    here (``call``; None: the call recorded on the device model ``recorded_on``): ``configs``
    where the kernel lists them, else every config Triton's pruning keeps.

    Returns the stored winner (None where no candidate ran correctly), the key's trials and the id
    of the kernel's version; raises TunesvcError where the kernel changed since ``version`` (the
    message says ``since`` and ends with ``then``) or no config is kept (``none_kept``)."""
    from tunesvc.device import current_device

    tuner = find_autotuner(name)
    state = State(tuner, Settings(TUNE, store.url, None), name, {})
    if state.template.version != version:
        raise TunesvcError(f"{name} changed since {since} (version {version}, now {state.template.version}){then}.")
    if call is None:
        call = store.captured_call(name, shape_key, recorded_on)
        if call is None:
            raise TunesvcError(
                f"No recorded call of {name} for {shape_key} on the other device; it cannot be re-measured here."
            )
    device = current_device()
    args, kwargs, grids = rebuild_call(tuner, call, device, shape_key)
    offered = pruned_configs(tuner, args, kwargs) if configs is None else [state.listed(c) for c in configs]
    candidates = [c for c in offered if c is not None and config_hash(config_dict(c)) in grids]
    if not candidates:
        raise TunesvcError(none_kept)
    winner = tune_key(
        tuner, state, store, device, shape_key, candidates, args, kwargs, grids=grids, call=call, notes=notes
    )
    kv_id = store.kernel_version_id(state.template)
    rows = store.trials(kv_id, store.device_id(device), shape_key)
    correct = any(r.status == Status.OK.value for r in rows)
    return (config_dict(winner) if correct else None), rows, kv_id


def measure_stored(
    store: Store,
    name: str,
    shape_key: str,
    configs: list[dict[str, Any]],
    device: Device,
    *,
    time_limit_s: float | None = settings.REPLAY_TIME_LIMIT_S,
    recorded_on: str | None = None,
) -> list[Measurement]:
    """Re-measure stored configs of a captured key on ``device``, on inputs rebuilt from the
    call its sweep recorded on the device model ``recorded_on`` (a hardware id; default:
    ``device``'s) (`tune verify`), in a process of its own (:func:`_apart`); each config after
    the first is checked against the first's output (or a later one's, where the first wrote NaN
    or inf: see :class:`CaptureBench`); stopped after ``time_limit_s``."""
    hardware_id = recorded_on or device.hardware_id
    measured: list[Measurement] = _apart(
        name, shape_key, _measure_stored_here, store.url, name, shape_key, configs, device, hardware_id,
        limit=time_limit_s,
    )  # fmt: skip
    return measured


def _measure_stored_here(
    store: Store, name: str, shape_key: str, configs: list[dict[str, Any]], device: Device, hardware_id: str
) -> list[Measurement]:
    tuner = find_autotuner(name)
    call = store.captured_call(name, shape_key, hardware_id)
    if call is None:
        raise TunesvcError(f"No recorded call of {name} for {shape_key}; tune it again to re-measure it.")
    args, kwargs, grids = rebuild_call(tuner, call, device, shape_key)
    state = State(tuner, Settings(LOOKUP, store.url, None), name, {})
    with measuring_context():
        bench = CaptureBench(tuner, device, args, kwargs, grids=grids)
        listed = [state.listed(stored) for stored in configs]
        try:
            measured = iter(measure_configs(bench, [c for c in listed if c is not None]))
        finally:
            bench.restore()
    gone = Measurement(Status.INVALID, message="not in the kernel's config list any more")
    return [gone if config is None else next(measured) for config in listed]


def _apart(name: str, shape_key: str, work: Any, url: str, *args: Any, limit: float | None = None) -> Any:
    """``work(store, *args)`` in a measuring child (:func:`tunesvc._processes.start_child`) with
    its own connection to the database at ``url``; its answer, or TunesvcError with its reason
    (the child stopped where it runs past ``limit`` seconds).

    A recorded call is data from anyone, and :func:`tunesvc._capture.recorded.check_call` judges
    it against itself, not against the kernel's code: a kernel that multiplies two arguments the
    check bounds one by one (a row's stride by the program id) may still reach past the buffers
    rebuilt for it. Launched in a child, such a call kills the child, never this process; what the
    child stored before it died is its sweep's start, no trial and no winner.
    """
    import signal

    from tunesvc._processes import receive_within
    from tunesvc._processes import start_child

    process, connection = start_child(_apart_main, work, url, args)
    try:
        answer = receive_within(process, connection, limit)
    except EOFError:
        answer = None
    except TimeoutError:
        raise TunesvcError(
            f"Replaying the recorded call of {name} on {shape_key} ran past its time limit of {limit:g} s, so "
            "its process was stopped and the key left as it was; pass a longer --time-limit if it needs one."
        ) from None
    finally:
        connection.close()
        process.join()
    if answer is None:
        code = process.exitcode or 0
        how = signal.Signals(-code).name if -code in signal.valid_signals() else f"exit status {code}"
        raise TunesvcError(
            f"Replaying the recorded call of {name} on {shape_key} ended the process that launched it ({how}): "
            "the kernel reaches past the buffers rebuilt from the record, or crashes here, so nothing was measured."
        )
    kind, value = answer
    if kind == "error":
        raise TunesvcError(value)
    if kind == "failed":  # raised by Triton or torch on what the record holds
        raise TunesvcError(f"Replaying the recorded call of {name} on {shape_key} failed ({value}).")
    return value


def _apart_main(connection: Any, work: Any, url: str, args: tuple[Any, ...]) -> None:
    from tunesvc.store import Store

    try:
        store = Store(url)
        try:
            answer: tuple[str, Any] = ("ok", work(store, *args))
        finally:
            store.close()
    except TunesvcError as exc:
        answer = ("error", str(exc))
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        answer = ("failed", f"{type(exc).__name__}: {first}" if first else type(exc).__name__)
    connection.send(answer)
    connection.close()
