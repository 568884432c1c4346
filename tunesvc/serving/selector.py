"""The selector's model, as the runtime uses it: its JSON, checked on reading, and :meth:`Selector.pick`.

A selector picks a config for a shape nobody tuned among the kernel's own tuned winners (and
their runner-ups), one per (kernel version, device model). It is one of two models:

- ``neighbours``: a candidate is judged by its slowdown at the ``NEIGHBOURS`` nearest tuned
  keys (the template's :meth:`~tunesvc.template.Template.key_distance`), those where it ran,
  each corrected by the template's :meth:`~tunesvc.template.Template.wave_fill` of the
  candidate there and at the new shape (a GEMM tile that fills the SMs in whole waves at one
  shape may leave most of a last wave idle at the next); the candidate with the lowest
  weighted mean is picked.
- ``tree``: a small decision tree over the template's
  :meth:`~tunesvc.template.Template.selector_features` (log2 dims, FLOPs and intensity, tiles
  per SM ...); each leaf ranks the candidates.

Either is kept as plain JSON (the neighbours' keys, slowdowns and wave fills; the tree's
``feature``, ``threshold``, ``left``, ``right`` and per-leaf rankings): in the database
(``tunesvc_selectors``, revision 0007) and in bundles. The runtime evaluates it with a few
loops of arithmetic (:meth:`Selector.ranked`), never imports scikit-learn, and unpickles nothing.

Where the first-ranked candidate breaks a constraint of the new shape (a 128-row tile for 24
rows), the runtime takes the next-ranked one, or, for a selector fitted as ``project``ing,
the feasible config nearest the first (:meth:`~tunesvc.template.Template.nearest_feasible`).

The runtime asks the selector after the exact key and before the nearest one:
exact -> predicted -> nearest -> transferred -> heuristic. Fitting, cross-measuring and the held-out
evaluation are the tuning side's (:mod:`tunesvc.tuning.selector_fit`,
:mod:`tunesvc.tuning.selector_measure`); this module imports neither.
"""

from __future__ import annotations

import functools
import math
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from tunesvc._processes import remake_cached_property_locks
from tunesvc.errors import TunesvcError

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
#: how far outside the fit's range (in feature units: doublings for the log2 dims) a selector
#: still answers
REACH = 1.0
#: a neighbours selector judges each candidate at this many nearest tuned keys (where it ran) ...
NEIGHBOURS = 3
#: ... weighted 1 / (distance + this), distance in doublings: the nearest counts most, but not alone
SOFTENING = 1.0
#: how ``tune selector`` says that a selector projects (Selector.project)
PROJECT_LINE = "where the first-ranked candidate does not fit a shape: the feasible config nearest it"


def to_float32(x: float) -> float:
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
        return [to_float32(float(values.get(name, 0.0))) for name in self.features]

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


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    # a thread reading a selector's parsed points at a fork would leave them unreadable in the child
    os.register_at_fork(after_in_child=functools.partial(remake_cached_property_locks, Selector))


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


def stored_selector(store: Store, template: Template, hardware_id: str) -> Selector | None:
    data = store.selector(template.name, template.version, hardware_id)
    return None if data is None else Selector.from_dict(data, f"the selector of {template.name} in {store.where}")
