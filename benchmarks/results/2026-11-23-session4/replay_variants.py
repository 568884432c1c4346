"""Replay variants of the Optuna TPE strategy against the ground truth (session 4's exploration).

    python benchmarks/results/2026-11-23-session4/replay_variants.py VARIANT [--seeds 20] [--json out.json]
    python benchmarks/results/2026-11-23-session4/replay_variants.py random ...   (random search)

Each variant is a subclass of OptunaStrategy as it was before session 4 (its startup() cover
turned off, the sampler built here) and is replayed like benchmarks/search_replay.py, cold and
warm. Kept beside search_replay-variants-cpu.log, whose tables it printed (not part of tunesvc).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import optuna
import search_replay

from tunesvc.search import _optuna
from tunesvc.search import make_strategy as real_make
from tunesvc.search import replay
from tunesvc.space import config_hash


def cover_design(strategy):
    """Greedy cover of every (parameter, value) pair not yet seen, over untried feasible configs."""
    rng = random.Random(strategy.seed)
    seen = [*strategy.initial, *[c for c in strategy.candidates if config_hash(c) in strategy.told]]
    uncovered = {(n, v) for n, vals in strategy._choices.items() if len(vals) > 1 for v in vals}
    uncovered -= {(n, c[n]) for c in seen for n in c}
    used = {config_hash(c) for c in seen}
    design = []
    while uncovered:
        left = [c for c in strategy.candidates if config_hash(c) not in used]
        gain = lambda c: sum((n, c[n]) in uncovered for n in strategy.space.names)
        top = max(map(gain, left), default=0)
        if top == 0:
            break
        pick = rng.choice([c for c in left if gain(c) == top])
        design.append(pick)
        used.add(config_hash(pick))
        uncovered -= {(n, pick[n]) for n in pick}
    return design


def spread_design(strategy, k):
    """Greedy maximin: k untried feasible configs, each the farthest (in steps) from those chosen."""
    rng = random.Random(strategy.seed)
    chosen = [*strategy.initial, *[c for c in strategy.candidates if config_hash(c) in strategy.told]]
    used = {config_hash(c) for c in chosen}
    dist = lambda a, b: sum(_optuna._steps(strategy._choices[n], a[n], b[n]) for n in strategy.space.names)
    design = []
    while len(chosen) < k:
        left = [c for c in strategy.candidates if config_hash(c) not in used]
        if not left:
            break
        if not chosen:
            pick = rng.choice(left)
        else:
            score = lambda c: min(dist(c, d) for d in chosen)
            top = max(map(score, left))
            pick = rng.choice([c for c in left if score(c) == top])
        design.append(pick); chosen.append(pick); used.add(config_hash(pick))
    return design


def qmc_design(strategy, k):
    """The first k points of Optuna's QMCSampler (scrambled Sobol, categorical values as one
    coordinate each) over the product of the parameters' values; infeasible points are asked
    like any proposal (told as constrained, counted by TPE as startup trials)."""
    study = optuna.create_study(sampler=optuna.samplers.QMCSampler(
        seed=strategy.seed, scramble=True, warn_independent_sampling=False))
    points = []
    for _ in range(k):
        trial = study.ask(strategy._distributions)
        points.append(strategy.decode(trial.params))
        study.tell(trial, 0.0)
    return points


def make_variant(startup=None, design="random", multivariate_override=True, ordinal=False, capped=False, **tpe_kwargs):
    base = _optuna.OptunaStrategy
    if ordinal:
        class base(_optuna._IndexEncoded):
            constrained = True

    class Variant(base):
        def sampler(self, seed):
            if design in ("cover", "spread"):
                n = 0
            elif design in ("qmc", "qmc-as-cover"):
                n = self._qmc_count()
            elif design == "random-as-cover":
                cover = cover_design(self)
                count = min(10, max(1, len(self.candidates) // 4))
                n = len(self.initial) + len(cover[:max(0, count - len(self.initial))])
            else:
                n = startup(len(self.candidates)) if startup else min(10, max(1, len(self.candidates) // 4))
            return optuna.samplers.TPESampler(
                seed=seed, n_startup_trials=n, multivariate=multivariate_override,
                constraints_func=None if _optuna.SET_CONSTRAINT else _optuna._violation, **tpe_kwargs)

        def _qmc_count(self):
            count = min(10, max(1, len(self.candidates) // 4))
            if design == "qmc":
                return count
            return len(self.initial) + len(cover_design(self)[:max(0, count - len(self.initial))])

        def startup(self):
            return []  # the variants choose their own startup (the committed cover is off here)

        def ask(self):
            if design == "cover" and not getattr(self, "_designed", False):
                self._designed = True
                design_ = cover_design(self)
                if capped:
                    count = min(10, max(1, len(self.candidates) // 4))
                    design_ = design_[:max(0, count - len(self.initial) - len(self.told))]
                self._queue.extend(design_)
            if design in ("qmc", "qmc-as-cover") and not getattr(self, "_designed", False):
                self._designed = True
                self._queue.extend(qmc_design(self, max(0, self._qmc_count() - len(self.initial))))
            if design == "spread" and not getattr(self, "_designed", False):
                self._designed = True
                self._queue.extend(spread_design(self, min(10, max(1, len(self.candidates) // 4))))
            return super().ask()
    return Variant


VARIANTS = {
    "baseline": dict(),
    "startup-n10": dict(startup=lambda n: min(10, max(1, n // 10))),
    "cover": dict(design="cover"),
    "ei-96": dict(n_ei_candidates=96),
    "spread": dict(design="spread"),
    "cover-ei96": dict(design="cover", n_ei_candidates=96),
    "cover-ei8": dict(design="cover", n_ei_candidates=8),
    "ei-8": dict(n_ei_candidates=8),
    "group": dict(group=True),
    "cover-capped": dict(design="cover", capped=True),
    "random-as-cover": dict(design="random-as-cover"),
    "qmc": dict(design="qmc"),
    "qmc-as-cover": dict(design="qmc-as-cover"),
    "cover-gamma25": dict(design="cover", gamma=lambda n: max(1, math.ceil(0.25 * n))),
    "cover-prior2": dict(design="cover", prior_weight=2.0),
    "cover-prior05": dict(design="cover", prior_weight=0.5),
    "ordinal": dict(ordinal=True),
    "cover-ordinal": dict(design="cover", ordinal=True),
    "independent": dict(multivariate_override=False),
    "cover-independent": dict(design="cover", multivariate_override=False),
    "endpoints": dict(consider_endpoints=True),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("variant")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--only", default="")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--cold-only", action="store_true")
    p.add_argument("--json", default="")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    if args.variant == "random":
        make = real_make
        strat = "random"
    else:
        cls = make_variant(**VARIANTS[args.variant])
        def make(name, space, candidates, *, seed=0, initial=(), **kw):
            return cls(space, candidates, seed=seed, initial=initial)
        strat = "optuna"
    replay.make_strategy = make
    out = {}
    t0 = time.time()
    for warm in (False,) if args.cold_only else (False, True):
        for truth in replay.read_ground_truth(search_replay.DEFAULT_CSV):
            if args.only and args.only not in truth.name:
                continue
            initial = search_replay.warm_start(truth.kernel, truth.shape_key) if warm else []
            trials = [replay.trials_to_reach(truth, strat, s, 0.03, initial) for s in range(args.first_seed, args.first_seed + args.seeds)]
            med = statistics.median(trials)
            n = len(truth.configs)
            out[f"{'warm' if warm else 'cold'}|{truth.name}"] = trials
            print(f"{args.variant:12s} {'warm' if warm else 'cold'} {truth.name[:40]:40s} {n:4d} "
                  f"median {med:6g} ({med / n:6.1%}) {'ok' if med / n <= 0.2 else 'MISS'}  {sorted(trials)}", flush=True)
    print(f"{args.variant} done in {time.time() - t0:.0f} s", flush=True)
    if args.json:
        json.dump(out, open(args.json, "w"))


if __name__ == "__main__":
    main()
