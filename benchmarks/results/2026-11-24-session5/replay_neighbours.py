"""Replay variants of the Optuna TPE strategy that also measure the incumbent's untried
neighbours (session 5's exploration; not part of tunesvc).

    python benchmarks/results/2026-11-24-session5/replay_neighbours.py VARIANT [--seeds 20]
        [--first-seed 0] [--only NAME] [--cold-only] [--json out.json]

Each variant subclasses OptunaStrategy with its committed local move off (local_every = 0: main
at the start of session 5, the startup cover, then TPE; `base` is that) and decides, before each ask after the startup, whether this trial
goes to an untried feasible neighbour of the incumbent (the best measured config) instead of
TPE's proposal. Neighbours are at `_steps` distance 1 (one parameter one value away), or with
moves="projected" one parameter one value away with the others repaired to the nearest feasible
untried config (what was committed, as proj2-tpe). VARIANT `optuna` is the committed strategy.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import search_replay

from tunesvc.search import _optuna
from tunesvc.search import make_strategy as real_make
from tunesvc.search import replay
from tunesvc.space import config_hash


def make_variant(when="every", k=2, order="random", radius=1, repeat="proposal", moves="exact", offset=0):
    class Variant(_optuna.OptunaStrategy):
        # the committed local move off: each variant makes its own (base: main before session 5)
        local_every = 0

        def _incumbent(self):
            best = None
            for c in self.candidates:
                m = self.told.get(config_hash(c))
                if m is not None and m.ok and (best is None or m.time_ms < best[1]):
                    best = (c, m.time_ms)
            return best[0] if best else None

        def _dist(self, a, b):
            return sum(_optuna._steps(self._choices[n], a[n], b[n]) for n in self.space.names)

        def _neighbours(self, inc):
            left = [c for c in self.candidates if not self._tried(config_hash(c))]
            if moves == "projected":
                # one parameter one value away, the others repaired to the nearest feasible
                # untried config with that value (constraints couple parameters)
                found = {}
                for n, values in self._choices.items():
                    if len(values) < 2:
                        continue
                    for v in values:
                        if _optuna._steps(values, inc[n], v) != 1:
                            continue
                        with_v = [c for c in left if c[n] == v]
                        if not with_v:
                            continue
                        d = min(self._dist(inc, c) for c in with_v)
                        pick = self._rng.choice([c for c in with_v if self._dist(inc, c) == d])
                        found.setdefault(config_hash(pick), (pick, n))
                self._move_param = {h: n for h, (c, n) in found.items()}
                return [c for c, n in found.values()]
            for r in range(1, radius + 1):
                near = [c for c in left if self._dist(inc, c) == r]
                if near:
                    return near
            return []

        def _pick(self, inc, near):
            if order == "random":
                return self._rng.choice(near)
            if order == "fixed":  # first parameter in the space's order that differs, lowest value first
                def key(c):
                    i = self.space.names.index(self._moved(inc, c))
                    return (i, str(c[self.space.names[i]]))
                return min(near, key=key)
            if order == "value":  # the changed value whose best measured config is fastest
                def score(c):
                    n = self._moved(inc, c)
                    times = [m.time_ms for h, m in self.told.items() if m.ok and self._cfg[h][n] == c[n]]
                    return min(times) if times else float("inf")  # unmeasured value: last? see below
                s = {config_hash(c): score(c) for c in near}
                best = min(s.values())
                return self._rng.choice([c for c in near if s[config_hash(c)] == best])
            if order == "value-unseen-first":
                def score(c):
                    n = self._moved(inc, c)
                    times = [m.time_ms for h, m in self.told.items() if m.ok and self._cfg[h][n] == c[n]]
                    return min(times) if times else float("-inf")
                s = {config_hash(c): score(c) for c in near}
                best = min(s.values())
                return self._rng.choice([c for c in near if s[config_hash(c)] == best])
            if order == "tpe":  # the neighbour nearest TPE's own proposal (told unmeasured)
                trial = self.study.ask(self._distributions)
                proposal = self.decode(trial.params)
                trial.set_user_attr(_optuna.UNMEASURED, True)
                self.study.tell(trial, state=_optuna.TrialState.FAIL)
                d = {config_hash(c): self._dist(proposal, c) for c in near}
                least = min(d.values())
                return self._rng.choice([c for c in near if d[config_hash(c)] == least])
            if order == "rare-good":  # fewest among the better half of the measured configs
                ok = sorted((m.time_ms, h) for h, m in self.told.items() if m.ok)
                good = [h for _, h in ok[: max(1, len(ok) // 2)]]
                def count(c):
                    n = self._moved(inc, c)
                    return sum(1 for h in good if self._cfg[h][n] == c[n])
                s = {config_hash(c): count(c) for c in near}
                least = min(s.values())
                return self._rng.choice([c for c in near if s[config_hash(c)] == least])
            if order == "rare":  # the changed value with the fewest measured configs
                def count(c):
                    n = self._moved(inc, c)
                    return sum(1 for h in self.told if self._cfg[h][n] == c[n])
                s = {config_hash(c): count(c) for c in near}
                least = min(s.values())
                return self._rng.choice([c for c in near if s[config_hash(c)] == least])
            if order in ("cyclic", "cyclic-rs"):  # the parameters in turn, skipping those with no move
                names = self.space.names
                if not hasattr(self, "_turn"):
                    self._turn = 0 if order == "cyclic" else random.Random(self.seed).randrange(len(names))
                by = {}
                for c in near:
                    by.setdefault(self._moved(inc, c), []).append(c)
                for i in range(len(names)):
                    n = names[(self._turn + i) % len(names)]
                    if n in by:
                        self._turn = (self._turn + i + 1) % len(names)
                        return self._rng.choice(by[n])
            raise ValueError(order)

        def _moved(self, inc, c):
            if moves == "projected":
                return self._move_param[config_hash(c)]
            return next(n for n in self.space.names if c[n] != inc[n])

        def ask(self):
            if not hasattr(self, "_cfg"):
                self._cfg = {config_hash(c): c for c in self.candidates}
                self._post = 0
                self._last_best = None
                self._stall = 0
            if self._startup is None or self._queue:
                return self._ask_repeat_aware()
            self._post += 1
            inc = self._incumbent()
            use = False
            if inc is not None:
                if when == "every":
                    use = (self._post + offset) % k == 0
                elif when == "stall":  # after k TPE trials without a new incumbent
                    key = config_hash(inc)
                    if key != self._last_best:
                        self._last_best, self._stall = key, 0
                    use = self._stall >= k
                    self._stall = 0 if use else self._stall + 1
            if use:
                near = self._neighbours(inc)
                if near:
                    self._queue.append(self._pick(inc, near))
            return self._ask_repeat_aware()

        def _ask_repeat_aware(self):
            return super().ask()

        def _nearest_untried(self, config):
            if repeat == "incumbent" and hasattr(self, "_cfg"):
                inc = self._incumbent()
                if inc is not None:
                    near = self._neighbours(inc)
                    if near:
                        return self._pick(inc, near)
            return super()._nearest_untried(config)

    return Variant


VARIANTS = {
    "base": dict(when="never"),
    "every2-random": dict(when="every", k=2, order="random"),
    "every3-random": dict(when="every", k=3, order="random"),
    "every2-fixed": dict(when="every", k=2, order="fixed"),
    "every2-value": dict(when="every", k=2, order="value"),
    "every3-value": dict(when="every", k=3, order="value"),
    "every2-valueu": dict(when="every", k=2, order="value-unseen-first"),
    "every2-random-r2": dict(when="every", k=2, order="random", radius=2),
    "every2-value-r2": dict(when="every", k=2, order="value", radius=2),
    "every2-fixed-r2": dict(when="every", k=2, order="fixed", radius=2),
    "every3-value-r2": dict(when="every", k=3, order="value", radius=2),
    "proj2-random": dict(when="every", k=2, order="random", moves="projected"),
    "proj2-fixed": dict(when="every", k=2, order="fixed", moves="projected"),
    "proj2-value": dict(when="every", k=2, order="value", moves="projected"),
    "proj3-random": dict(when="every", k=3, order="random", moves="projected"),
    "proj3-fixed": dict(when="every", k=3, order="fixed", moves="projected"),
    "proj3-value": dict(when="every", k=3, order="value", moves="projected"),
    "projstall2-value": dict(when="stall", k=2, order="value", moves="projected"),
    "projstall1-value": dict(when="stall", k=1, order="value", moves="projected"),
    "proj2-rare": dict(when="every", k=2, order="rare", moves="projected"),
    "proj3-rare": dict(when="every", k=3, order="rare", moves="projected"),
    "proj2-cyclic": dict(when="every", k=2, order="cyclic", moves="projected"),
    "proj2-cyclic-rs": dict(when="every", k=2, order="cyclic-rs", moves="projected"),
    "proj3-cyclic-rs": dict(when="every", k=3, order="cyclic-rs", moves="projected"),
    "every2-rare": dict(when="every", k=2, order="rare"),
    "proj2-tpe": dict(when="every", k=2, order="tpe", moves="projected"),
    "proj3-tpe": dict(when="every", k=3, order="tpe", moves="projected"),
    "proj2-rare-good": dict(when="every", k=2, order="rare-good", moves="projected"),
    "proj3-rare-good": dict(when="every", k=3, order="rare-good", moves="projected"),
    "proj2o-rare": dict(when="every", k=2, order="rare", moves="projected", offset=1),
    "proj2o-rare-good": dict(when="every", k=2, order="rare-good", moves="projected", offset=1),
    "proj1-rare": dict(when="every", k=1, order="rare", moves="projected"),
    "proj2o-tpe": dict(when="every", k=2, order="tpe", moves="projected", offset=1),
    "proj2o-random": dict(when="every", k=2, order="random", moves="projected", offset=1),
    "stall2-random": dict(when="stall", k=2, order="random"),
    "stall1-random": dict(when="stall", k=1, order="random"),
    "stall2-value": dict(when="stall", k=2, order="value"),
    "repeat-inc-random": dict(when="never", repeat="incumbent", order="random"),
    "repeat-inc-value": dict(when="never", repeat="incumbent", order="value"),
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
    if args.variant in ("random", "optuna"):
        make, strat = real_make, args.variant
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
            seeds = range(args.first_seed, args.first_seed + args.seeds)
            trials = [replay.trials_to_reach(truth, strat, s, 0.03, initial) for s in seeds]
            med = statistics.median(trials)
            n = len(truth.configs)
            share = sum(t <= int(0.2 * n) for t in trials) / len(trials)
            out[f"{'warm' if warm else 'cold'}|{truth.name}"] = trials
            print(f"{args.variant:18s} {'warm' if warm else 'cold'} {truth.name[:40]:40s} {n:4d} "
                  f"median {med:6g} ({med / n:6.1%}) {'ok  ' if med / n <= 0.2 else 'MISS'} "
                  f"share<=20% {share:4.0%}  {sorted(trials) if len(trials) <= 20 else ''}", flush=True)
    print(f"{args.variant} done in {time.time() - t0:.0f} s", flush=True)
    if args.json:
        json.dump(out, open(args.json, "w"))


if __name__ == "__main__":
    main()
