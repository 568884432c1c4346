"""Selectors: a config for a shape nobody tuned, picked among the kernel's own tuned winners.

One selector per (kernel version, device model). Its candidates are the distinct winners of
that kernel on that device, and its runner-ups: configs whose trials came within ``NEAR_BEST``
of the fastest at ``RUNNER_UP_KEYS`` or more tuned keys (a config that nearly wins twice is a
safer pick between shapes than one key's winner alone), each once it has a trial on every tuned
key. Per tuned shape key, the stored trials say how much slower than
the fastest each candidate ran there, so a key counts only where enough candidates were
measured on it (``min_coverage``; :func:`cross_measure` measures every candidate on every
tuned key, through the sweeps' own measurer, and stores those trials like any other).

Two models are fitted on those times, and the one that, each tuned key left out in turn,
picks faster configs is kept, only where it also beats the runtime's nearest rule:

- ``neighbours``: a candidate is judged by its slowdown at the ``NEIGHBOURS`` nearest tuned
  keys (the template's :meth:`~tunesvc.template.Template.key_distance`), those where it ran,
  each corrected by the template's
  :meth:`~tunesvc.template.Template.wave_fill` of the candidate there and at the new shape (a
  GEMM tile that fills the SMs in whole waves at one shape may leave most of a last wave idle
  at the next); the candidate with the lowest weighted mean is picked.
- ``tree``: a small decision tree (scikit-learn's ``DecisionTreeClassifier``) over the
  template's :meth:`~tunesvc.template.Template.selector_features` (log2 dims, FLOPs and
  intensity, tiles per SM ...) learns each key's fastest candidate; each leaf ranks them.

Either is kept as plain JSON (the neighbours' keys, slowdowns and wave fills; the tree's
``feature``, ``threshold``, ``left``, ``right`` and per-leaf rankings): in the database
(``tunesvc_selectors``, revision 0007) and in bundles. The runtime evaluates it with a few
loops of arithmetic (:meth:`Selector.ranked`), never imports scikit-learn, and unpickles nothing.

Where the first-ranked candidate breaks a constraint of the new shape (a 128-row tile for 24
rows), the runtime takes the next-ranked one, or, for a selector fitted as ``project``ing
(where, left out one key at a time, that picks faster on the stored times), the feasible config
nearest the first (:meth:`~tunesvc.template.Template.nearest_feasible`).

The runtime asks the selector after the exact key and before the nearest one:
exact -> predicted -> nearest -> heuristic.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import struct
import warnings
from collections import Counter
from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from tunesvc.errors import TunesvcError
from tunesvc.space import config_hash

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.space import Config
    from tunesvc.store import Store
    from tunesvc.template import Problem
    from tunesvc.template import ShapeKey
    from tunesvc.template import Template

#: how far apart two shape keys are (a template's key_distance)
Distance = Callable[["ShapeKey", "ShapeKey"], float]

FORMAT = 1
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
#: how far outside the fit's range (in feature units: doublings for the log2 dims) a selector
#: still answers
REACH = 1.0
#: a neighbours selector judges each candidate at this many nearest tuned keys (where it ran) ...
NEIGHBOURS = 3
#: ... weighted 1 / (distance + this), distance in doublings: the nearest counts most, but not alone
SOFTENING = 1.0
#: the models a selector may be; of two that pick equally well, the first (a tree is smaller)
MODELS = ("tree", "neighbours")
#: how ``tune selector`` says that a selector projects (Selector.project)
PROJECT_LINE = "where the first-ranked candidate does not fit a shape: the feasible config nearest it"
#: the strategy of the sweeps that :func:`cross_measure` stores its trials under
CROSS_MEASURE = "cross"
#: the sweep that marks a tuned key whose candidates cross_measure(retime=True) re-timed
CROSS_RETIME = "cross-retime"


def _f32(x: float) -> float:
    """``x`` rounded to float32, as scikit-learn's tree compares its features (its X is float32)."""
    return struct.unpack("f", struct.pack("f", x))[0]


@dataclass(frozen=True)
class Selector:
    """A fitted model choosing among ``candidates``: a decision tree over a template's
    features, or (``model == "neighbours"``) the candidates' slowdowns at the tuned keys.

    Tree: node ``i`` is a split when ``left[i] >= 0``: a problem goes left when
    ``features[feature[i]] <= threshold[i]``, else right; a leaf ranks candidate indices in
    ``leaves[i]``, best first (the first is the tree's own class). A neighbours selector's tree
    is one leaf; it keeps, per tuned key in ``points``, each candidate's natural-log slowdown
    there (None: it did not run there) and its wave fill there (:func:`neighbour_scores`).
    """

    kernel: str
    version: str
    hardware_id: str
    features: tuple[str, ...]
    candidates: tuple[Config, ...]
    feature: tuple[int, ...]
    threshold: tuple[float, ...]
    left: tuple[int, ...]
    right: tuple[int, ...]
    leaves: tuple[tuple[int, ...], ...]
    #: tuned shape keys it was fitted on
    keys: int
    #: per feature, the lowest and highest value the fit saw (empty: no range kept)
    lo: tuple[float, ...] = ()
    hi: tuple[float, ...] = ()
    model: str = "tree"
    points: tuple[str, ...] = ()
    slowdowns: tuple[tuple[float | None, ...], ...] = ()
    fills: tuple[tuple[float, ...], ...] = ()
    #: where its first-ranked candidate breaks a constraint of the new shape, launch the feasible
    #: config nearest it (:meth:`~tunesvc.template.Template.nearest_feasible`) rather than the
    #: next-ranked candidate
    project: bool = False

    @functools.cached_property
    def _points(self) -> list[ShapeKey]:
        from tunesvc.template import ShapeKey

        return [ShapeKey.parse(k) for k in self.points]

    def neighbour_order(self, key: ShapeKey, fill_here: list[float], distance: Distance) -> list[int]:
        """A neighbours selector's candidate indices for a problem of shape key ``key`` whose
        wave fill per candidate is ``fill_here``, best first (those it has no neighbour for,
        none); keys are ``distance`` apart (the template's :meth:`~tunesvc.template.Template.key_distance`)."""
        scores = neighbour_scores([distance(key, p) for p in self._points], self.slowdowns, self.fills, fill_here)
        return [c for _, c in sorted((v, c) for c, v in enumerate(scores) if v is not None)]

    def vector(self, values: dict[str, float]) -> list[float]:
        """The feature vector, in the selector's order (a feature the problem lacks reads 0.0)."""
        return [_f32(float(values.get(name, 0.0))) for name in self.features]

    def knows(self, values: dict[str, float]) -> bool:
        """Whether the fit saw every feature the problem has: a dtype or option it never saw
        is outside what the tree learnt, and gets no prediction."""
        return all(name in self._names for name in values)

    @functools.cached_property
    def _names(self) -> frozenset[str]:
        return frozenset(self.features)

    def leaf(self, x: list[float]) -> int:
        # a hand-written walk, not sklearn's predict: the runtime path never imports scikit-learn
        node = 0
        left, right, feature, threshold = self.left, self.right, self.feature, self.threshold
        while left[node] >= 0:
            node = left[node] if x[feature[node]] <= threshold[node] else right[node]
        return node

    def predict(self, x: list[float]) -> int:
        """The tree's class (a candidate index) for a feature vector."""
        return self.leaves[self.leaf(x)][0]

    def ranked(self, template: Template, problem: Problem, device: Device) -> list[Config]:
        """The candidates for ``problem``, best first; none for a problem outside the fit's features."""
        values = template.selector_features(problem, device)
        if not self.knows(values):
            return []
        x = self.vector(values)
        if not self.covers(x):
            return []

        def fills() -> list[float]:
            return [template.wave_fill(c, problem, device) for c in self.candidates]

        return [self.candidates[i] for i in self.order(x, template.key(problem), fills, template.key_distance)]

    def order(
        self, x: list[float], key: ShapeKey, fill_here: Callable[[], list[float]], distance: Distance
    ) -> list[int]:
        """Candidate indices best first for a problem of feature vector ``x`` (one the selector
        covers) and shape key ``key``: its tree leaf's ranking, or a neighbours selector's order
        given the candidates' wave fills here (``fill_here()``) and the keys' ``distance``
        (both asked only by that model)."""
        if self.model == "neighbours":
            return self.neighbour_order(key, fill_here(), distance)
        return list(self.leaves[self.leaf(x)])

    def covers(self, x: list[float]) -> bool:
        """Whether every feature lies within what the fit saw, widened by ``REACH`` on each side:
        a tree extrapolates with its outermost leaf, which a shape far outside the tuned ones
        (a context 8x longer than any tuned) has no reason to share."""
        if not self.lo:
            return True
        return all(lo - REACH <= v <= hi + REACH for v, lo, hi in zip(x, self.lo, self.hi))

    def pick(self, template: Template, problem: Problem, device: Device) -> Config | None:
        """The first ranked candidate that fits ``problem`` on ``device`` (None: none does); with
        ``project``, where the first does not fit, the feasible config nearest it, if one is near.

        A GEMM tile of 128 rows ranked first for 24 rows breaks the rule that no tile is taller
        than the problem: its nearest feasible config keeps the variant, width and depth at 32
        rows, where the next-ranked candidate may be another kernel altogether."""
        for rank, config in enumerate(self.ranked(template, problem, device)):
            if not template.violations(config, problem, device):
                return config
            if rank == 0 and self.project and (nearest := template.nearest_feasible(config, problem, device)):
                return nearest
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "kernel": self.kernel,
            "version": self.version,
            "hardware_id": self.hardware_id,
            "features": list(self.features),
            "candidates": [dict(c) for c in self.candidates],
            "tree": {
                "feature": list(self.feature),
                "threshold": list(self.threshold),
                "left": list(self.left),
                "right": list(self.right),
                "leaves": [list(leaf) for leaf in self.leaves],
            },
            "keys": self.keys,
            "range": {"lo": list(self.lo), "hi": list(self.hi)},
            "project": self.project,
            **(
                {
                    "model": self.model,
                    "points": list(self.points),
                    "slowdowns": [list(row) for row in self.slowdowns],
                    "fills": [list(row) for row in self.fills],
                }
                if self.model == "neighbours"
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "the selector") -> Selector:
        """A selector from its JSON; anything malformed is one TunesvcError naming ``where``."""
        from pydantic import ValidationError

        try:
            raw = _schema().validate_python(data)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = ".".join(str(p) for p in error["loc"])
            raise TunesvcError(
                f"{where} is damaged ({field or 'its top level'}: {error['msg']}); refit it with `tune selector`."
            ) from None
        tree = raw.tree
        n = len(tree.left)
        if not n or any(len(a) != n for a in (tree.right, tree.feature, tree.threshold, tree.leaves)):
            raise TunesvcError(
                f"{where} is damaged (its tree's arrays differ in length); refit it with `tune selector`."
            )
        for i in range(n):
            if tree.left[i] >= 0:
                # children after their parent: the walk always ends (scikit-learn numbers nodes so)
                if not (i < tree.left[i] < n and i < tree.right[i] < n and 0 <= tree.feature[i] < len(raw.features)):
                    raise TunesvcError(f"{where} is damaged (node {i} points outside the tree); refit it.")
            elif not tree.leaves[i] or any(not 0 <= c < len(raw.candidates) for c in tree.leaves[i]):
                raise TunesvcError(f"{where} is damaged (leaf {i} names no valid candidate); refit it.")
        if raw.range and not (len(raw.range.lo) == len(raw.range.hi) == len(raw.features)):
            raise TunesvcError(f"{where} is damaged (its feature range has another length); refit it.")
        if raw.model == "neighbours":
            from tunesvc.template import ShapeKey

            rows = (*raw.slowdowns, *raw.fills)
            if not (len(raw.points) == len(raw.slowdowns) == len(raw.fills)) or any(
                len(row) != len(raw.candidates) for row in rows
            ):
                raise TunesvcError(f"{where} is damaged (its neighbours' rows differ in length); refit it.")
            for point in raw.points:
                if not all(value > 0 for _, value in ShapeKey.parse(point).dims):
                    raise TunesvcError(f"{where} is damaged (its key '{point[:80]}' has no positive dims); refit it.")
        return cls(
            kernel=raw.kernel,
            version=raw.version,
            hardware_id=raw.hardware_id,
            features=tuple(raw.features),
            candidates=tuple(dict(c) for c in raw.candidates),
            feature=tuple(tree.feature),
            threshold=tuple(tree.threshold),
            left=tuple(tree.left),
            right=tuple(tree.right),
            leaves=tuple(tuple(leaf) for leaf in tree.leaves),
            keys=raw.keys,
            lo=tuple(raw.range.lo) if raw.range else (),
            hi=tuple(raw.range.hi) if raw.range else (),
            model=raw.model,
            points=tuple(raw.points),
            slowdowns=tuple(tuple(row) for row in raw.slowdowns),
            fills=tuple(tuple(row) for row in raw.fills),
            project=raw.project,
        )

    def describe(self) -> list[str]:
        """The tree as indented lines of text (``tune selector``); a neighbours selector's rule and candidates."""
        if self.model == "neighbours":
            return [
                f"the candidate fastest at the {NEIGHBOURS} nearest of {len(self.points)} tuned keys (where it ran), "
                "each time corrected by its wave fill there and here:",
                *(f"  candidate {i}: {_short(c)}" for i, c in enumerate(self.candidates)),
                *([PROJECT_LINE] if self.project else []),
            ]
        lines: list[str] = []

        def walk(node: int, depth: int) -> None:
            pad = "  " * depth
            if self.left[node] < 0:
                best = self.leaves[node][0]
                lines.append(f"{pad}-> candidate {best}: {_short(self.candidates[best])}")
                return
            name, t = self.features[self.feature[node]], self.threshold[node]
            lines.append(f"{pad}if {name} <= {t:.4g}:")
            walk(self.left[node], depth + 1)
            lines.append(f"{pad}else:  # {name} > {t:.4g}")
            walk(self.right[node], depth + 1)

        walk(0, 0)
        if self.project:
            lines.append(PROJECT_LINE)
        return lines


def _short(config: Config) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items())


def _schema() -> Any:
    from typing import Annotated
    from typing import Literal

    from pydantic import BaseModel
    from pydantic import ConfigDict
    from pydantic import Field
    from pydantic import StringConstraints
    from pydantic import TypeAdapter

    from tunesvc.space import MAX_CHOICE_VALUE
    from tunesvc.space import MAX_TEXT_CHOICE

    Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=64)]
    Value = (
        Annotated[int, Field(strict=True, ge=-MAX_CHOICE_VALUE, le=MAX_CHOICE_VALUE)]
        | Annotated[str, StringConstraints(strict=True, max_length=MAX_TEXT_CHOICE)]
    )
    Threshold = Annotated[float, Field(allow_inf_nan=False)]
    Fill = Annotated[float, Field(allow_inf_nan=False, gt=0, le=1)]
    Index = Annotated[int, Field(strict=True, ge=-1, le=1 << 20)]

    class Strict(BaseModel):
        model_config = ConfigDict(strict=True, extra="ignore")

    class Tree(Strict):
        feature: Annotated[list[Annotated[int, Field(strict=True, ge=-2, le=1 << 20)]], Field(max_length=1 << 16)]
        threshold: Annotated[list[Threshold], Field(max_length=1 << 16)]
        left: Annotated[list[Index], Field(max_length=1 << 16)]
        right: Annotated[list[Index], Field(max_length=1 << 16)]
        leaves: Annotated[list[Annotated[list[Index], Field(max_length=1 << 12)]], Field(max_length=1 << 16)]

    class Range(Strict):
        lo: Annotated[list[Threshold], Field(max_length=1024)]
        hi: Annotated[list[Threshold], Field(max_length=1024)]

    class Schema(Strict):
        format: Annotated[int, Field(strict=True, ge=FORMAT, le=FORMAT)]
        kernel: Annotated[str, StringConstraints(min_length=1, max_length=256)]
        version: Annotated[str, StringConstraints(min_length=1, max_length=64)]
        hardware_id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
        features: Annotated[list[Annotated[str, StringConstraints(max_length=256)]], Field(max_length=1024)]
        candidates: Annotated[list[Annotated[dict[Name, Value], Field(min_length=1)]], Field(max_length=1 << 12)]
        tree: Tree
        keys: Annotated[int, Field(strict=True, ge=0)]
        range: Range | None = None
        model: Literal["tree", "neighbours"] = "tree"
        points: Annotated[list[Annotated[str, StringConstraints(max_length=512)]], Field(max_length=1 << 12)] = []
        slowdowns: Annotated[
            list[Annotated[list[Threshold | None], Field(max_length=1 << 12)]], Field(max_length=1 << 12)
        ] = []
        fills: Annotated[list[Annotated[list[Fill], Field(max_length=1 << 12)]], Field(max_length=1 << 12)] = []
        project: bool = False

    return TypeAdapter(Schema)


# -- fitting ------------------------------------------------------------------------------------
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
    entries = store.winners(kernel=template.name, hardware_id=hardware_id, version=template.version)
    return {e.shape_key: dict(e.config) for e in sorted(entries, key=lambda e: e.updated_at)}


def _candidates(winners: dict[str, Config], extra: dict[str, Config] | None = None) -> tuple[Config, ...]:
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


def _runner_up_configs(
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
    candidates = _candidates(
        winners, _runner_up_configs(store, template, device.hardware_id, winners, stored, measured=True)
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
        "lo": tuple(_f32(min(col)) for col in zip(*x)),
        "hi": tuple(_f32(max(col)) for col in zip(*x)),
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


def neighbour_scores(
    distances: list[float],
    slowdowns: tuple[tuple[float | None, ...], ...] | list[list[float | None]],
    fills: tuple[tuple[float, ...], ...] | list[list[float]],
    fill_here: list[float],
) -> list[float | None]:
    """Per candidate, over the ``NEIGHBOURS`` nearest tuned keys (``distances``, infinite: not
    comparable), those where it ran, the mean of its log slowdown there plus the log of its wave
    fill there less the log of its fill here, weighted 1 / (distance + ``SOFTENING``): its expected
    log slowdown here. None where it ran at none of them: every candidate is judged on the same
    keys, so one that could not run near here is not credited with what it did far away. A
    hand-written loop: the runtime's path."""
    nearest = sorted((d, j) for j, d in enumerate(distances) if d != math.inf)[:NEIGHBOURS]
    scores: list[float | None] = []
    for c, here in enumerate(fill_here):
        total = weight = 0.0
        for d, j in nearest:
            slowdown = slowdowns[j][c]
            if slowdown is not None:
                w = 1.0 / (d + SOFTENING)
                total += w * (slowdown + math.log(fills[j][c]) - math.log(here))
                weight += w
        scores.append(total / weight if weight else None)
    return scores


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


def stored_selector(store: Store, template: Template, hardware_id: str) -> Selector | None:
    data = store.selector(template.name, template.version, hardware_id)
    return None if data is None else Selector.from_dict(data, f"the selector of {template.name} in {store.where}")


# -- measuring every candidate on every tuned key ------------------------------------------------
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
    from tunesvc.bench import remeasure_finalists

    winners = tuned_winners(store, template, device.hardware_id)
    stored = store.trial_times(template.name, template.version, device.hardware_id)
    candidates = _candidates(
        winners, _runner_up_configs(store, template, device.hardware_id, winners, stored, measured=False)
    )
    kv_id, device_id = store.kernel_version_id(template), store.device_id(device)
    retimed = store.swept_keys(kv_id, device_id, CROSS_RETIME) if retime else set()
    hashes = {config_hash(c) for c in candidates}
    total, began, measured_keys = 0, _now(), 0
    index, count = shard
    if not 0 <= index < count:
        raise TunesvcError(f"A cross-measure share is (i, n) with 0 <= i < n, not {shard}.")
    for key in sorted(winners)[index::count]:
        missing = [(c, config_hash(c)) for c in candidates if config_hash(c) not in stored.get(key, {})]
        again = retime and key not in retimed
        if not missing and not again:
            continue
        if measured_keys and _spent(began, time_budget):
            break
        measured_keys += 1
        problem = template.problem_of_key(key)
        if on_key is not None:
            on_key(key, len(candidates) if again else len(missing))
        sweep_id = store.start_sweep(kv_id, device_id, key, problem, CROSS_RETIME if again else CROSS_MEASURE, None, 0)
        started = _now()
        with measurer_for(template, problem, device) as measurer:
            results = [(c, h, measurer.measure(c)) for c, h in missing]
            total += sum(i is not None for i in store.add_trials(sweep_id, kv_id, device_id, key, results))
            rows, winner = store.trials(kv_id, device_id, key), config_hash(winners[key])
            if again:  # every candidate, once, as a finalist's round times it
                retimed_now = remeasure_finalists(
                    measurer, rows, 0, measurer.rep_ms / FINALIST_ROUNDS, keep=hashes | {winner}, rounds=1
                )
            else:
                # these are first timings, the stored winner a finalist's longer one (which a GPU
                # at its power cap reads slower): one that beats it is re-timed beside it, as a
                # sweep's finalists are, before it can take the key on a time taken another way
                retimed_now = remeasure_finalists(measurer, rows, 1, measurer.rep_ms, keep={winner})
            store.replace_measurements(retimed_now)
        store.update_winner(kv_id, device_id, key)
        store.finish_sweep(sweep_id, _now() - started)
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


def nearest_pick(
    winners: dict[str, Config], key: str, template: Template, problem: Problem, device: Device
) -> tuple[str, str | None, Config]:
    """(source, matched key, config) of the runtime's nearest rule over ``winners``: the winner of
    the nearest key (the template's key distance) if it fits ``problem``, else the heuristic."""
    from tunesvc.template import ShapeKey

    target = ShapeKey.parse(key)
    distance, matched = min(
        ((template.key_distance(target, ShapeKey.parse(k)), k) for k in winners), default=(math.inf, None)
    )
    if matched is not None and distance != math.inf and not template.violations(winners[matched], problem, device):
        return "nearest", matched, winners[matched]
    return "heuristic", None, template.heuristic(problem, device)


def untuned_answer(store: Store, template: Template, problem: Problem, device: Device) -> tuple[str, Config]:
    """(source, config) the runtime launches for ``problem`` on ``device`` from ``store`` while
    the problem's shape key has no winner: the stored selector's pick, else the nearest tuned
    key's winner, else the heuristic (the runtime's chain less its exact step). A stored
    selector that cannot be read is passed over, as the runtime passes over it."""
    key = str(template.key(problem))
    try:
        fitted = stored_selector(store, template, device.hardware_id)
    except TunesvcError:
        fitted = None
    picked = fitted.pick(template, problem, device) if fitted is not None else None
    if picked is not None:
        return "predicted", picked
    winners = {k: c for k, c in tuned_winners(store, template, device.hardware_id).items() if k != key}
    source, _, config = nearest_pick(winners, key, template, problem, device)
    return source, config


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
    """A --csv path whose folder exists (checked before anything is measured)."""
    if not path.parent.is_dir():
        raise TunesvcError(f"Cannot write {path}: folder {path.parent} does not exist.")


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
