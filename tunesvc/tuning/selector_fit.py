"""Fitting a selector (the model is :mod:`tunesvc.serving.selector`) from the stored trials.

One selector per (kernel version, device model). Its candidates are the distinct winners of
that kernel on that device, and its runner-ups: configs whose trials came within ``NEAR_BEST``
of the fastest at ``RUNNER_UP_KEYS`` or more tuned keys (a config that nearly wins twice is a
safer pick between shapes than one key's winner alone), each once it has a trial on every tuned
key. Per tuned shape key, the stored trials say how much slower than the fastest each candidate
ran there, so a key counts only where enough candidates were measured on it (``min_coverage``;
:func:`tunesvc.tuning.selector_measure.cross_measure` measures every candidate on every tuned
key, through the sweeps' own measurer, and stores those trials like any other).

Two models are fitted on those times (``neighbours``: the candidates' slowdowns at the nearest
tuned keys, kept as they are; ``tree``: scikit-learn's ``DecisionTreeClassifier`` over the
template's selector features, learning each key's fastest candidate), and the one that, each
tuned key left out in turn, picks faster configs is kept, only where it also beats the
runtime's nearest rule. Each is fitted as ``project``ing (the feasible config nearest a
first-ranked candidate that does not fit a shape) where, left out one key at a time, that picks
faster on the stored times.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from typing import TYPE_CHECKING
from typing import Any

from tunesvc import settings
from tunesvc.errors import TunesvcError
from tunesvc.serving import chain
from tunesvc.serving.selector import Distance
from tunesvc.serving.selector import Selector
from tunesvc.serving.selector import to_float32
from tunesvc.serving.source import DatabaseSource
from tunesvc.serving.source import newest_per_key
from tunesvc.space import config_hash

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.space import Config
    from tunesvc.store import Store
    from tunesvc.template import Problem
    from tunesvc.template import ShapeKey
    from tunesvc.template import Template

#: deep enough to split on M, N and K and the dtype, shallow enough to read
MAX_DEPTH = 5
#: a candidate within this fraction of a key's best counts as a best there: the target is the
#: candidate best on most keys among those, so timing noise between near-equal configs does not
#: split the tree
NEAR_BEST = 0.02
#: a config within NEAR_BEST of the fastest trial at this many tuned keys is a candidate too
RUNNER_UP_KEYS = 2
#: fewest usable tuned keys to fit on; with one, the nearest rule already gives its winner
MIN_KEYS = 2
#: fewest to keep a selector: it is kept only where, each key left out in turn and the others
#: fitted, it picks no slower than the nearest rule (:func:`leave_one_out`)
MIN_KEYS_KEPT = MIN_KEYS + 1
#: the slowdown a ranking charges a candidate that failed or was not measured on a key
UNKNOWN_SLOWDOWN = 4.0
#: the models a selector may be; of two that pick equally well, the first (a tree is smaller)
MODELS = ("tree", "neighbours")


@dataclass(frozen=True)
class TrainingSet:
    """What a fit learns from: per usable key, its features and each candidate's time there."""

    kernel: str
    version: str
    hardware_id: str
    candidates: tuple[Config, ...]
    keys: tuple[str, ...]
    features: tuple[dict[str, float], ...]
    #: per key, per candidate: ms, or None where it failed or was not measured
    times: tuple[tuple[float | None, ...], ...]
    #: tuned keys left out, with why
    skipped: tuple[tuple[str, str], ...]
    #: per key, per candidate: its wave fill there (Template.wave_fill; empty: 1.0 everywhere)
    fills: tuple[tuple[float, ...], ...] = ()
    #: how far apart two keys are (the template's key_distance; None: ShapeKey.distance)
    distance: Distance | None = field(default=None, compare=False)
    #: per key, per candidate that breaks a constraint there: the stored ms of the feasible
    #: config nearest it (what a projecting selector launches), None where it was not measured
    #: or the candidate fits (empty: none known)
    projected: tuple[tuple[float | None, ...], ...] = ()

    def key_distance(self, a: ShapeKey, b: ShapeKey) -> float:
        return a.distance(b) if self.distance is None else self.distance(a, b)

    @property
    def wave_fills(self) -> tuple[tuple[float, ...], ...]:
        """``fills``, or 1.0 for every key and candidate where none were given."""
        return self.fills or tuple((1.0,) * len(self.candidates) for _ in self.keys)


def tuned_winners(store: Store, template: Template, hardware_id: str) -> dict[str, Config]:
    """Shape key -> winner config of the template's current version on this device model
    (the newest measurement where several software stacks tuned a key, as the runtime reads)."""
    return newest_per_key(store.winners(kernel=template.name, hardware_id=hardware_id, version=template.version))


def distinct_candidates(winners: dict[str, Config], extra: dict[str, Config] | None = None) -> tuple[Config, ...]:
    """The distinct winner configs and the ``extra`` ones (runner-ups, by hash), in config-hash
    order (the same set gives the same indices)."""
    by_hash = {**(extra or {}), **{config_hash(c): c for c in winners.values()}}
    return tuple(by_hash[h] for h in sorted(by_hash))


def runner_ups(times: dict[str, dict[str, float | None]], keys: Iterable[str]) -> set[str]:
    """The config hashes that ran within ``NEAR_BEST`` of the fastest trial at ``RUNNER_UP_KEYS``
    or more of ``keys`` (``times``: key -> config hash -> ms, None where it failed)."""
    counts: Counter[str] = Counter()
    for key in keys:
        ran = {h: t for h, t in times.get(key, {}).items() if t is not None}
        if ran:
            best = min(ran.values())
            counts.update(h for h, t in ran.items() if t <= best * (1 + NEAR_BEST))
    return {h for h, n in counts.items() if n >= RUNNER_UP_KEYS}


def runner_up_configs(
    store: Store, template: Template, hardware_id: str, winners: dict[str, Config], stored: dict, *, measured: bool
) -> dict[str, Config]:
    """The runner-ups over the keys of ``winners`` (not winners themselves) by hash; with
    ``measured``, only those with a trial on every one of those keys."""
    hashes = runner_ups(stored, winners) - {config_hash(c) for c in winners.values()}
    if measured:
        hashes = {h for h in hashes if all(h in stored.get(key, {}) for key in winners)}
    return store.trial_configs(template.name, template.version, hardware_id, hashes) if hashes else {}


def training_set(
    store: Store,
    template: Template,
    device: Device,
    *,
    exclude: tuple[str, ...] = (),
    min_coverage: float = 1.0,
) -> TrainingSet:
    """The tuned keys of ``template`` on ``device``'s model but ``exclude``, each with the stored
    times of every candidate (the distinct winners of those keys, and their runner-ups).

    A key counts when at least ``min_coverage`` of the candidates have a trial there (failed or
    not) and one of them ran correctly: elsewhere the fastest candidate is unknown. Runner-ups
    are judged on the trials of the keys not excluded, and are candidates once measured on all of them.
    """
    if not 0 < min_coverage <= 1:
        raise TunesvcError(f"--min-coverage must be in (0, 1], got {min_coverage}.")
    winners = {k: c for k, c in tuned_winners(store, template, device.hardware_id).items() if k not in exclude}
    stored = store.trial_times(template.name, template.version, device.hardware_id)
    candidates = distinct_candidates(
        winners, runner_up_configs(store, template, device.hardware_id, winners, stored, measured=True)
    )
    hashes = [config_hash(c) for c in candidates]
    keys, features, times, skipped, fills, projected = [], [], [], [], [], []
    for key in sorted(winners):
        measured = stored.get(key, {})
        coverage = sum(h in measured for h in hashes) / len(hashes)
        row = tuple(measured.get(h) for h in hashes)
        if coverage < min_coverage:
            skipped.append((key, f"{coverage:.0%} of the candidates measured; run `tune selector --cross-measure`"))
            continue
        if all(t is None for t in row):
            skipped.append((key, "no candidate ran correctly"))
            continue
        try:
            problem = template.problem_of_key(key)
        except TunesvcError as exc:
            skipped.append((key, str(exc)))
            continue
        keys.append(key)
        features.append(template.selector_features(problem, device))
        times.append(row)
        fills.append(tuple(template.wave_fill(c, problem, device) for c in candidates))
        projected.append(
            tuple(_projected_time(template, c, t, problem, device, measured) for c, t in zip(candidates, row))
        )
    return TrainingSet(
        template.name,
        template.version,
        device.hardware_id,
        candidates,
        tuple(keys),
        tuple(features),
        tuple(times),
        tuple(skipped),
        tuple(fills),
        template.key_distance,
        tuple(projected),
    )


def _projected_time(
    template: Template, config: Config, ms: float | None, problem: Problem, device: Device, measured: dict
) -> float | None:
    """The stored ms (``measured``: config hash -> ms) of the feasible config nearest ``config``
    where ``config`` (its own time ``ms``) breaks a constraint of ``problem``; else None."""
    if ms is not None or not template.violations(config, problem, device):
        return None
    nearest = template.nearest_feasible(config, problem, device)
    return None if nearest is None else measured.get(config_hash(nearest))


def _slowdowns(times: tuple[float | None, ...]) -> list[float]:
    best = min(t for t in times if t is not None)
    return [t / best if t is not None else UNKNOWN_SLOWDOWN for t in times]


def targets(data: TrainingSet) -> list[int]:
    """Per key, the candidate to learn: among those within ``NEAR_BEST`` of the key's fastest,
    the one that is so on the most keys (then the faster, then the lower index)."""
    slow = [_slowdowns(row) for row in data.times]
    n = len(data.candidates)
    near = [[s[c] <= 1 + NEAR_BEST for c in range(n)] for s in slow]
    wins = [sum(row[c] for row in near) for c in range(n)]
    return [max((c for c in range(n) if row[c]), key=lambda c: (wins[c], -s[c], -c)) for row, s in zip(near, slow)]


def _features(data: TrainingSet) -> tuple[list[list[float]], dict[str, Any]]:
    """The keys' feature vectors, and the fields every selector fitted on ``data`` shares (its
    identity, candidates, features and their range)."""
    names = tuple(sorted({name for f in data.features for name in f}))
    x = [[float(f.get(name, 0.0)) for name in names] for f in data.features]
    shared = {
        "kernel": data.kernel,
        "version": data.version,
        "hardware_id": data.hardware_id,
        "features": names,
        "candidates": data.candidates,
        "keys": len(data.keys),
        "lo": tuple(to_float32(min(col)) for col in zip(*x)),
        "hi": tuple(to_float32(max(col)) for col in zip(*x)),
    }
    return x, shared


def fit(data: TrainingSet, *, max_depth: int = MAX_DEPTH) -> Selector | None:
    """Fit a selector on ``data``; None with fewer than ``MIN_KEYS`` usable keys."""
    if len(data.keys) < MIN_KEYS:
        return None
    try:
        from sklearn.tree import DecisionTreeClassifier  # offline only: the runtime walks the JSON
    except ImportError:
        raise TunesvcError("Fitting a selector needs scikit-learn; pip install scikit-learn.") from None

    slow = [_slowdowns(row) for row in data.times]
    n = len(data.candidates)
    x, shared = _features(data)
    with (
        warnings.catch_warnings()
    ):  # "more classes than half the samples": usual with a few tuned keys, not the user's to fix
        warnings.simplefilter("ignore", UserWarning)
        tree = DecisionTreeClassifier(max_depth=max_depth, random_state=0).fit(x, targets(data))
    t = tree.tree_
    classes = [int(c) for c in tree.classes_]
    at_leaf: dict[int, list[int]] = {}
    for row, node in enumerate(tree.apply(x)):
        at_leaf.setdefault(int(node), []).append(row)
    leaves: list[tuple[int, ...]] = []
    for node in range(t.node_count):
        if t.children_left[node] >= 0:
            leaves.append(())
            continue
        first = classes[int(t.value[node][0].argmax())]
        rows = at_leaf.get(node, [])

        def score(c: int, rows: list[int] = rows) -> tuple[float, float]:
            # geometric mean slowdown on the leaf's keys, then on every key
            here = sum(math.log(slow[r][c]) for r in rows) / max(len(rows), 1)
            return here, sum(math.log(s[c]) for s in slow) / len(slow)

        leaves.append((first, *sorted((c for c in range(n) if c != first), key=score)))
    return Selector(
        **shared,
        feature=tuple(int(f) if f >= 0 else -1 for f in t.feature),
        threshold=tuple(float(v) if t.children_left[i] >= 0 else 0.0 for i, v in enumerate(t.threshold)),
        left=tuple(int(v) for v in t.children_left),
        right=tuple(int(v) for v in t.children_right),
        leaves=tuple(leaves),
    )


def _log_slowdowns(times: tuple[float | None, ...]) -> tuple[float | None, ...]:
    best = min(t for t in times if t is not None)
    return tuple(math.log(t / best) if t is not None else None for t in times)


def fit_neighbours(data: TrainingSet) -> Selector | None:
    """A neighbours selector of ``data`` (its keys' slowdowns and wave fills, kept as they are);
    None with fewer than ``MIN_KEYS`` usable keys."""
    if len(data.keys) < MIN_KEYS:
        return None
    _, shared = _features(data)
    return Selector(
        **shared,
        feature=(-1,),
        threshold=(0.0,),
        left=(-1,),
        right=(-1,),
        leaves=(tuple(range(len(data.candidates))),),
        model="neighbours",
        points=data.keys,
        slowdowns=tuple(_log_slowdowns(row) for row in data.times),
        fills=data.wave_fills,
    )


def fit_model(data: TrainingSet, model: str) -> Selector | None:
    """A selector of ``model`` (one of ``MODELS``) fitted on ``data``."""
    return fit_neighbours(data) if model == "neighbours" else fit(data)


def _fastest(times: tuple[float | None, ...]) -> int:
    """The index of the fastest candidate among those that ran."""
    return min((t, i) for i, t in enumerate(times) if t is not None)[1]


def _near_best_at(slow: list[list[float]], rows: list[int]) -> set[int]:
    """The candidates within ``NEAR_BEST`` of the fastest at ``RUNNER_UP_KEYS`` or more of ``rows``."""
    counts = Counter(c for j in rows for c, s in enumerate(slow[j]) if s <= 1 + NEAR_BEST)
    return {c for c, n in counts.items() if n >= RUNNER_UP_KEYS}


def leave_one_out(data: TrainingSet, model: str = "tree", project: bool = False) -> tuple[float, float] | None:
    """Geometric-mean slowdown against each key's fastest candidate, over the keys of ``data``,
    of what a selector of ``model`` fitted on the other keys picks and of what the nearest rule
    picks (the fastest of the other keys' winners on the nearest other key): both read from the
    stored times, nothing is measured. As at run time, a fit without a key knows only the other
    keys' winners and runner-ups (near-best at ``RUNNER_UP_KEYS`` of the other keys), and a
    pick skips a candidate that did not run on the key (it broke a constraint there, or failed).
    With ``project``, a first-ranked candidate that broke a constraint there is scored by the
    stored time of the feasible config nearest it (``data.projected``); where that config was
    never measured there, the pick skips it as without ``project``.
    None with too few keys to leave one out."""
    from tunesvc.template import ShapeKey

    if len(data.keys) < MIN_KEYS_KEPT:
        return None
    slow = [_slowdowns(row) for row in data.times]
    parsed = [ShapeKey.parse(k) for k in data.keys]
    fills = data.wave_fills
    ours = theirs = 0.0
    scored = 0
    for i in range(len(data.keys)):
        rest = [j for j in range(len(data.keys)) if j != i]
        # the other keys' winners and runner-ups
        known = sorted({_fastest(data.times[j]) for j in rest} | _near_best_at(slow, rest))
        runs = [c for c in known if data.times[i][c] is not None]
        if not runs:
            continue  # none of them runs here: neither rule has an answer to score
        part = replace(
            data,
            candidates=tuple(data.candidates[c] for c in known),
            keys=tuple(data.keys[j] for j in rest),
            features=tuple(data.features[j] for j in rest),
            times=tuple(tuple(data.times[j][c] for c in known) for j in rest),
            skipped=(),
            fills=tuple(tuple(fills[j][c] for c in known) for j in rest),
        )
        _, near = min((data.key_distance(parsed[i], parsed[j]), j) for j in rest)
        nearest = min(runs, key=lambda c: slow[near][c])
        selector = fit_model(part, model)
        x = selector.vector(data.features[i]) if selector is not None else []
        ranked: list[int] = []
        if selector is not None and selector.covers(x):
            here = fills[i]
            ranked = [
                known[c] for c in selector.order(x, parsed[i], lambda: [here[c] for c in known], data.key_distance)
            ]
        pick = next((c for c in ranked if data.times[i][c] is not None), nearest)
        projected = data.projected[i][ranked[0]] if project and ranked and data.projected else None
        if projected is not None:
            ours += math.log(projected / min(t for t in data.times[i] if t is not None))
        else:
            ours += math.log(slow[i][pick])
        theirs += math.log(slow[i][nearest])
        scored += 1
    if not scored:
        return None
    return math.exp(ours / scored), math.exp(theirs / scored)


def fitted_models() -> tuple[str, ...]:
    """The ``MODELS`` this installation can fit: the tree needs scikit-learn; the neighbours
    model is plain Python, so a machine without scikit-learn still fits and judges one."""
    return MODELS if importlib.util.find_spec("sklearn") is not None else ("neighbours",)


def projects(plain: tuple[float, float], projecting: tuple[float, float]) -> bool:
    """Whether a model projects, given its and the nearest rule's leave-one-out scores without
    and with projecting: unless that picks more than ``NEAR_BEST`` slower, or puts a model that
    was no slower than the nearest rule behind it (which would cost the selector its place)."""
    ours, nearest = projecting
    return ours <= plain[0] * (1 + NEAR_BEST) and (ours <= nearest or plain[0] > plain[1])


def choose(data: TrainingSet) -> tuple[Selector | None, tuple[float, float] | None]:
    """Of the models fitted on ``data`` (:func:`fitted_models`), the one whose picks, each key
    left out in turn, are fastest, with its and the nearest rule's scores
    (:func:`leave_one_out`); (None, None) with too few keys to judge one. Of equals, the first.

    Each projects a first pick that does not fit (the feasible config nearest it, as the space's
    tile limits shrink a tile to the problem) unless, scored so, it picks slower by more than
    ``NEAR_BEST`` than without (:func:`projects`). The stored times can score a projection only where the key
    left out holds a trial of the projected config, one or two keys in forty on the H100's
    GEMMs, so a small difference is one key's timing; shapes outside the tuned range, where a
    first pick breaks a limit far more often, are what it is for."""
    if len(data.keys) < MIN_KEYS_KEPT:
        return None, None
    known = any(t is not None for row in data.projected for t in row)
    judged = []
    for model in fitted_models():
        if (plain := leave_one_out(data, model)) is None:
            continue
        # with no projection the stored times can score, projecting scores as ``plain``
        projecting = (leave_one_out(data, model, project=True) if known else None) or plain
        project = projects(plain, projecting)
        judged.append((projecting if project else plain, model, project))
    if not judged:
        return None, None
    scores, model, project = min(judged, key=lambda item: (item[0][0], MODELS.index(item[1])))
    fitted = fit_model(data, model)
    return (replace(fitted, project=project) if fitted is not None else None), scores


def refit(store: Store, template: Template, device: Device, *, min_coverage: float = 1.0) -> Selector | None:
    """Fit the selector of ``template`` on ``device``'s model from the store and keep it there;
    None (the stored one, if any, stays) when too few keys are usable to fit one and judge it.
    Raises :class:`SelectorWorse`, and removes the stored one, when, left out one key at a
    time, its picks are slower on the stored times than the nearest rule's."""
    return keep(store, template, device, training_set(store, template, device, min_coverage=min_coverage))[0]


def keep(
    store: Store, template: Template, device: Device, data: TrainingSet
) -> tuple[Selector | None, tuple[float, float] | None]:
    """:func:`refit` on a training set already read from the store, with the kept selector's and
    the nearest rule's leave-one-out scores (:func:`leave_one_out`)."""
    selector, scores = choose(data)
    if selector is None or scores is None:
        return None, None
    if scores[0] > scores[1]:
        # a stored one was fitted on fewer keys than these, which say a selector picks worse
        # than the nearest rule: the runtime goes back to that rule
        store.delete_selector(template, device.hardware_id)
        raise SelectorWorse(
            f"Left out one tuned key at a time, {template.name}'s selector picks configs "
            f"{scores[0]:.3f}x slower than the fastest (geometric mean; its better model, {selector.model}) "
            f"and the nearest rule {scores[1]:.3f}x: not kept (nor any stored before), so the runtime "
            "answers untuned shapes with the nearest rule; tune more shapes (or cross-measure them) and refit."
        )
    store.save_selector(template, device.hardware_id, selector.to_dict(), selector.keys)
    return selector, scores


class SelectorWorse(TunesvcError):
    """A fitted selector that the stored times say would pick worse than the nearest rule."""


def refit_after_sweep(store: Store, template: Template, device: Device) -> None:
    """:func:`refit` at the end of a sweep; without scikit-learn installed, of the neighbours
    model alone, with one warning."""
    data = training_set(store, template, device)
    if len(data.keys) < MIN_KEYS_KEPT:  # nothing to fit and judge: do not even import scikit-learn
        return
    if fitted_models() != MODELS:
        warnings.warn(
            "tunesvc: scikit-learn is not installed, so the selector's tree model was not tried; "
            "pip install scikit-learn.",
            RuntimeWarning,
            stacklevel=3,
        )
    with contextlib.suppress(SelectorWorse):  # keep removed the stored one: the nearest rule answers
        keep(store, template, device, data)


def nearest_pick(
    winners: dict[str, Config], key: str, template: Template, problem: Problem, device: Device
) -> tuple[str, str | None, Config]:
    """(source, matched key, config) of the one chain's nearest step over ``winners`` (see
    :func:`tunesvc.serving.chain.nearest`): the winner of the nearest key if it fits ``problem``,
    else the heuristic."""
    from tunesvc.template import ShapeKey

    parsed = [(ShapeKey.parse(k), k) for k in winners]
    found = chain.nearest(template, problem, ShapeKey.parse(key), device, winners, parsed)
    if found is not None:
        return found.source, found.matched_key, found.config
    return chain.HEURISTIC, None, template.heuristic(problem, device)


def untuned_answer(
    store: Store, template: Template, problem: Problem, device: Device, *, transfer: bool | None = None
) -> tuple[str, Config]:
    """(source, config) the runtime launches for ``problem`` on ``device`` from ``store`` while
    the problem's shape key has no winner: the one chain (:mod:`tunesvc.serving.chain`) less its
    exact step, over what the store gives as the runtime's winner source
    (:class:`tunesvc.serving.source.DatabaseSource`): its winners in the space, its selector
    (passed over where it cannot be read, as the runtime passes over it) and a sibling GPU model's
    winners (``transfer``, default: settings)."""
    from tunesvc.template import ShapeKey

    source = DatabaseSource(store, device)
    key = template.key(problem)
    winners = {k: c for k, c in source.winners(template).table.items() if k != str(key)}

    def selector() -> Selector | None:
        try:
            return source.selector(template)
        except TunesvcError:
            return None

    def sibling() -> chain.Sibling | None:
        if not (settings.transfer_enabled() if transfer is None else transfer):
            return None
        found = source.sibling(template)
        table = None if found is None else found.sibling()
        return None if table is None else (table, table.parsed())

    parsed = [(ShapeKey.parse(k), k) for k in winners]
    result = chain.answer(template, problem, key, device, winners, lambda: parsed, selector, sibling)
    return result.source, result.config
