"""Optuna samplers behind the ask/tell protocol: TPE, CMA-ES and GP.

Every Optuna strategy shares one loop: the study proposes a point, the point maps to a config,
a config outside the feasible set is told to the study at once (no benchmark spent), a measured
one is told its time. A study's only values are measured times (its objective is named
``time_ms``): what was not timed is told without a value, so Optuna's tools (optuna-dashboard's
history, parameter importances) see real times only. What differs is the encoding of a config
(TPE samples categorical values; CMA-ES and GP need numbers, so each parameter becomes the index
of its value among the sorted choices: log2 for the power-of-two ones) and how a failure is told:
TPE as a pruned trial with a violated constraint (an infeasible proposal, or a candidate that did
not compile, run or check out; TPE ranks a trial with a violated constraint in its "bad" density
whatever its state, and stops proposing its neighbourhood); CMA-ES and GP, which model values
only, as a failed trial. TPE's proposal of a config already measured is told as a failed trial
(so TPE never sees a measurement twice) and replaced by the untried feasible config nearest to
it. TPE's startup trials are not i.i.d.
random draws but a cover of the space's values (see :meth:`OptunaStrategy.startup`), and every
second proposal of TPE after them is moved onto the incumbent's neighbourhood (see
:meth:`OptunaStrategy.local_move`).

Every sampler's study lives in memory: it holds each proposal, the unmeasured ones too (an
infeasible point, a repeat, TPE's proposal replaced by a local move), and a resumed sweep teaches
a new one the stored trials. With ``storage`` (a database URL: the store's own) a second study,
named by the caller, in Optuna's tables beside tunesvc's (Optuna's RDBStorage), records what was
measured, for Optuna's own tools (optuna-dashboard) to read: one trial per measured config over
the parameters' values (``BLOCK_M`` 4096, never an index), COMPLETE with its time or FAIL with
its status, spanning the time from its proposal to its measurement. No sampler ever runs on it,
so nothing in it is unpickled or trusted.
"""

from __future__ import annotations

import datetime
import random
import time
import warnings
from typing import TYPE_CHECKING
from typing import Any

import optuna
from optuna.trial import TrialState
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from tunesvc.bench import one_line as _one_line
from tunesvc.errors import TunesvcError
from tunesvc.search._base import Strategy
from tunesvc.space import Config
from tunesvc.space import config_hash
from tunesvc.store import BUSY_TIMEOUT_S

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tunesvc.bench import Measurement
    from tunesvc.space import Space

#: infeasible proposals in a row (each a study trial, no benchmark) before the nearest feasible
#: untried config is measured instead
MAX_MISSES_PER_ASK = 50
#: user attribute of a proposal that was not measured (infeasible or already tried), told as FAIL
UNMEASURED = "unmeasured"
#: name of a trial's constraint: 1 for infeasible or failed, 0 for correct
VIOLATION = "violation"
#: Optuna 5 records constraints on the trial (set_constraint) and TPE reads them there; older
#: versions compute them after each trial through the sampler's constraints_func
SET_CONSTRAINT = hasattr(optuna.Trial, "set_constraint")
#: the study's objective, named where Optuna can name it (3.2+)
METRIC = "time_ms"
#: how a trial that was not timed is told to TPE: pruned (no value) with a violated constraint.
#: TPE takes pruned trials into its densities and files any trial with a violated constraint
#: among the bad ones before looking at its state or value; FAIL would hide it from TPE.
UNTIMED = TrialState.PRUNED
#: user attribute of a trial: the tunesvc status of its measurement; of a proposal not measured,
#: why: "infeasible" (outside the feasible set), "repeat" (already measured), or "moved" (a
#: local move near it was measured instead)
STATUS = "status"
#: user attribute of a trial: its config as launched (parameter values, where the study's own
#: parameters of CMA-ES and GP are indices among the sorted values), for optuna-dashboard's readers
CONFIG = "config"
#: attempts at opening Optuna's storage (see rdb_storage)
STORAGE_ATTEMPTS = 5
#: most startup trials before a model samples: Optuna's default of 10, fewer on a small space
MAX_STARTUP_TRIALS = 10
#: every this many of TPE's proposals (after the startup), one is moved onto the incumbent's
#: neighbourhood (see OptunaStrategy.local_move)
LOCAL_EVERY = 2


def startup_count(n_candidates: int) -> int:
    """Startup trials (warm start included) before a sampler's model proposes: a quarter of a
    small space, at most Optuna's default."""
    return min(MAX_STARTUP_TRIALS, max(1, n_candidates // 4))


def rdb_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's storage in the database at ``url``, creating Optuna's tables there if needed.

    SQLite connections wait for another writer's lock as long as the store's do (sweeps of
    several workers share the file). Optuna creates its tables by checking, then creating: two
    processes that open a new database at once can both find a table missing, and the later
    CREATE (or the later revision stamp) fails; it then finds the work done on the next attempt.
    """
    kwargs = {"connect_args": {"timeout": BUSY_TIMEOUT_S}} if make_url(url).get_backend_name() == "sqlite" else {}
    for attempt in range(1, STORAGE_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except DBAPIError:
            time.sleep(0.05 * attempt)
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)


def _violation(trial: optuna.trial.FrozenTrial) -> tuple[float]:
    return (float(trial.user_attrs.get(VIOLATION, 0.0)),)


class OptunaStrategy(Strategy):
    """Optuna's TPE sampler (multivariate) over the space's categorical parameters.

    Each parameter is sampled only among the values that occur in the feasible set (for M=16
    that is BLOCK_M=16 alone). Stored trials from an earlier run are added to the study, so a
    resumed sweep samples where the killed one left off.
    """

    name = "optuna"
    #: tell infeasible and failed trials as constrained (TPE) rather than failed
    constrained = True
    #: every this many proposals of the sampler, one is a local move (0: never)
    local_every = LOCAL_EVERY
    #: CMA-ES, GP: measure the untried config nearest an infeasible or repeated proposal at once,
    #: rather than asking the sampler again (up to MAX_MISSES_PER_ASK times)
    replace_misses = False

    def __init__(
        self,
        space: Space,
        candidates: list[Config],
        *,
        seed: int = 0,
        initial: Sequence[Config] = (),
        storage: str | None = None,
        study_name: str | None = None,
    ) -> None:
        super().__init__(space, candidates, seed=seed, initial=initial)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._choices = {
            name: [v for v in space.parameters[name].choices if any(c[name] == v for c in candidates)]
            for name in space.names
        }
        self._distributions = self.distributions()
        with warnings.catch_warnings():  # multivariate TPE and GP are "experimental" in some versions
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = self.sampler(seed)
        # the sampler's study lives in memory: it holds every proposal, the unmeasured ones too
        # (each is a trial the sampler learns from); the database gets the record of what was
        # measured (see open_record)
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        _name_metric(self.study)
        self._rng = random.Random(seed)
        #: configs the sampler's study already has a finished trial of
        self._in_study: set[str] = set()
        #: the record in the database (None: no storage, or an unusable study there)
        self.record: optuna.Study | None = None
        self._record_distributions: dict[str, optuna.distributions.BaseDistribution] = {
            n: optuna.distributions.CategoricalDistribution(v) for n, v in self._choices.items()
        }
        #: hashes of the configs the record holds a measured trial of
        self._recorded: set[str] = set()
        #: when each pending config was proposed: the start of its record trial
        self._asked_at: dict[str, datetime.datetime] = {}
        #: warm-start configs not yet proposed, each enqueued just before the ask that takes it
        self._queue = list(self.initial)
        #: the startup configs, chosen at the first ask (after stored results are told)
        self._startup: list[Config] | None = None
        self._pending: dict[str, optuna.Trial] = {}
        self._by_hash = {config_hash(c): c for c in candidates}
        #: asks answered by the sampler (not by the warm start or the startup)
        self._sampled = 0
        if storage:
            self.open_record(storage, study_name)

    def open_record(self, storage: str, name: str | None) -> None:
        """Open (or create) the study named ``name`` in the database at ``storage`` as this
        strategy's record: one trial per measured config, over the parameters' values, with the
        time from its proposal to its measurement. A stored study this strategy could not have
        written is left as it is, with one warning, and nothing is recorded."""
        try:
            study = optuna.create_study(
                direction="minimize",
                sampler=optuna.samplers.RandomSampler(),  # never asked: trials are added, not sampled
                load_if_exists=True,
                storage=rdb_storage(storage),
                study_name=name,
            )
            self._recorded = self._check(study)
        except DBAPIError:  # the database itself: the store reports it
            raise
        except Exception as exc:  # whatever a damaged study makes Optuna raise
            warnings.warn(
                f"tunesvc: the Optuna study {name!r} in the database is unusable ({_one_line(exc)}); it is left "
                "as it is, and this sweep's trials are kept in tunesvc's tables only.",
                RuntimeWarning,
                stacklevel=4,
            )
            return
        _name_metric(study)
        self.record = study

    def _check(self, study: optuna.Study) -> set[str]:
        """The hashes of the configs ``study`` holds measured trials of; ValueError unless it is
        one this strategy wrote: minimising, every trial over the parameters' values, every value
        a time (a study of an older version, TPE's own, passes: its unmeasured proposals are
        skipped)."""
        if study.directions != [optuna.study.StudyDirection.MINIMIZE]:
            raise ValueError(f"its direction is {study.directions}, not minimize")
        measured = set()
        for trial in study.get_trials(deepcopy=False):
            if set(trial.distributions) != set(self._record_distributions):
                raise ValueError(f"trial {trial.number} has other parameters")
            for param, distribution in trial.distributions.items():
                if self._record_distributions[param] != distribution:
                    raise ValueError(f"trial {trial.number} has another distribution of {param}")
                if not distribution._contains(distribution.to_internal_repr(trial.params[param])):
                    raise ValueError(f"trial {trial.number} has {param} outside its distribution")
            for value in trial.values or ():
                if not (isinstance(value, float) and 0 <= value < float("inf")):
                    raise ValueError(f"trial {trial.number} has value {value!r}, not a time")
            marks = [trial.user_attrs.get(VIOLATION, 0.0), *trial.system_attrs.get("constraints", ())]
            if not all(isinstance(m, (int, float)) and not isinstance(m, bool) for m in marks):
                raise ValueError(f"trial {trial.number} has constraints that are not numbers")
            unmeasured = trial.user_attrs.get(UNMEASURED) or trial.user_attrs.get(STATUS) == "infeasible"
            if trial.state.is_finished() and not unmeasured:
                measured.add(config_hash(dict(trial.params)))
        return measured

    # -- what each sampler changes ------------------------------------------------------
    def sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        # no random startup of TPE's own: the startup trials are the cover of startup(), asked
        # like the warm start, and TPE samples from the first trial that is not queued
        return optuna.samplers.TPESampler(
            seed=seed,
            n_startup_trials=0,
            multivariate=True,
            constraints_func=None if SET_CONSTRAINT else _violation,
        )

    def startup(self) -> list[Config]:
        """The configs measured after the warm start and before TPE samples: a cover of every
        value of every parameter that neither the warm start nor a stored result has shown.

        TPE's density of a categorical parameter can only favour a value it has seen in its
        "good" trials; i.i.d. random startup trials leave values unseen and, on a small space,
        use up the trials a search has: ``startup_count(36)`` is 9 random trials on a space
        where 20% is 7. Greedily, each startup config is the untried feasible config that shows
        the most values not yet seen (ties broken by a generator of the strategy's seed), until
        every value is seen or ``startup_count`` trials are known (warm start and stored results
        included, as Optuna counts its startup trials): at least as many configs as the parameter
        with the most values has, more where constraints couple parameters (3 to 10 cold on the
        problems of benchmarks/data/ground_truth.csv).
        """
        seen = [*self.initial, *(c for c in self.candidates if config_hash(c) in self.told)]
        known = {config_hash(c) for c in seen}
        unseen = {(n, v) for n, values in self._choices.items() if len(values) > 1 for v in values}
        unseen -= {(n, c[n]) for c in seen for n in self.space.names}
        left = [c for c in self.candidates if config_hash(c) not in known]
        rng = random.Random(self.seed)
        design: list[Config] = []
        while unseen and len(known) + len(design) < startup_count(len(self.candidates)):
            shown = [sum((n, c[n]) in unseen for n in self.space.names) for c in left]
            most = max(shown, default=0)
            if most == 0:
                break
            config = rng.choice([c for c, k in zip(left, shown) if k == most])
            design.append(config)
            left.remove(config)
            unseen -= {(n, config[n]) for n in self.space.names}
        return design

    def distributions(self) -> dict[str, Any]:
        return {n: optuna.distributions.CategoricalDistribution(v) for n, v in self._choices.items()}

    def encode(self, config: Config) -> dict[str, Any]:
        return {name: config[name] for name in self.space.names}

    def decode(self, params: dict[str, Any]) -> Config:
        return {name: params[name] for name in self.space.names}

    # -- ask / tell ---------------------------------------------------------------------
    def ask(self) -> Config | None:
        if self._startup is None:
            self._startup = self.startup()
            self._queue.extend(self._startup)
        self._drop_tried_from_queue()
        local = False
        if not self._queue and self.local_every:
            self._sampled += 1
            local = self._sampled % self.local_every == 0
        misses = 0
        while not self.exhausted:
            self._drop_tried_from_queue()
            if self._queue:
                self.study.enqueue_trial(self.encode(self._queue.pop(0)))
            elif local:
                local = False
                move = self.local_move()
                if move is not None:
                    self.study.enqueue_trial(self.encode(move))
            trial = self.study.ask(self._distributions)
            config = self.decode(trial.params)
            trial.set_user_attr(CONFIG, config)
            key = config_hash(config)
            if key in self._feasible and not self._tried(key):
                self._pending[key] = trial
                self.asked.add(key)
                self._asked_at[key] = _now()
                return config
            if not self.constrained:  # CMA-ES, GP: as before, a miss is told as failed or repeated
                misses += 1
                if key in self.told and key in self._feasible:
                    self._tell_study(trial, self.told[key])
                else:
                    trial.set_user_attr(STATUS, "repeat" if key in self._feasible else "infeasible")
                    self.study.tell(trial, state=TrialState.FAIL)
                if self.replace_misses:
                    nearest = self._nearest_untried(config)
                    if nearest is None:
                        return None
                    self.study.enqueue_trial(self.encode(nearest))
                    continue
                if misses < MAX_MISSES_PER_ASK:
                    continue
                return self._random_untried()
            if key not in self._feasible:
                # TPE learns where the feasible set ends: an infeasible proposal is a constrained
                # trial without a value (no benchmark spent), and the next ask draws again
                _set_violation(trial, 1.0)
                trial.set_user_attr(STATUS, "infeasible")
                self.study.tell(trial, state=UNTIMED)
                misses += 1
                if misses < MAX_MISSES_PER_ASK:
                    continue
            else:
                # A config already measured (or in the batch) is no new evidence: told again, its
                # value would count twice in TPE's densities and pull the next proposals back
                # onto it, until TPE only repeats itself. It is told as FAIL, which TPE ignores,
                # and the untried config nearest to it is measured instead.
                trial.set_user_attr(UNMEASURED, True)
                trial.set_user_attr(STATUS, "repeat")
                self.study.tell(trial, state=TrialState.FAIL)
            nearest = self._nearest_untried(config)
            if nearest is None:
                return None
            self.study.enqueue_trial(self.encode(nearest))
        return None

    def local_move(self) -> Config | None:
        """The untried config one move from the incumbent (the best measured config) nearest to
        TPE's own proposal, or None when the incumbent has no untried move.

        TPE's density favours the values of its good trials: where a region holds several
        near-best configs and the best one lies one step outside it, TPE keeps proposing inside
        the region (on causal attention of benchmarks/data/ground_truth.csv, the four 128x64
        configs 3.6-5.8% from the best, which is one BLOCK_M step from them). Every
        ``local_every``-th proposal is therefore a step of a pattern search from the incumbent
        (Hooke and Jeeves, J. ACM 8(2), 1961), the step TPE's proposal points to: the move
        nearest it. A move changes one parameter to a neighbouring value (any other value of a
        text parameter) and, where a constraint couples that parameter to others (BLOCK_M=64
        only with 4 warps), takes the untried feasible config with that value nearest to the
        incumbent. TPE's proposal itself is told as an unmeasured failure, which TPE ignores,
        and the move is measured and told as any trial.
        """
        best = None
        for key, m in self.told.items():
            if m.ok and m.time_ms is not None and key in self._by_hash and (best is None or m.time_ms < best[1]):
                best = (self._by_hash[key], m.time_ms)
        if best is None:
            return None
        moves = self._moves(best[0])
        if not moves:
            return None
        trial = self.study.ask(self._distributions)
        proposal = self.decode(trial.params)
        trial.set_user_attr(CONFIG, proposal)
        trial.set_user_attr(UNMEASURED, True)
        trial.set_user_attr(STATUS, "moved")  # a local move near it is measured instead
        self.study.tell(trial, state=TrialState.FAIL)
        return self._nearest(proposal, moves)

    def _moves(self, incumbent: Config) -> list[Config]:
        """Untried feasible configs one move from ``incumbent`` (see :meth:`local_move`)."""
        left = self._untried()
        moves: dict[str, Config] = {}
        for name, values in self._choices.items():
            for value in values:
                if _steps(values, incumbent[name], value) != 1:
                    continue
                repaired = self._nearest(incumbent, [c for c in left if c[name] == value])
                if repaired is not None:
                    moves.setdefault(config_hash(repaired), repaired)
        return list(moves.values())

    def _random_untried(self) -> Config | None:
        left = self._untried()
        if not left:
            return None
        config = self._rng.choice(left)
        self.asked.add(config_hash(config))
        self._asked_at[config_hash(config)] = _now()
        return config

    def _tried(self, key: str) -> bool:
        return key in self.told or key in self.asked or key in self._pending

    def _untried(self) -> list[Config]:
        return [c for c in self.candidates if not self._tried(config_hash(c))]

    def _drop_tried_from_queue(self) -> None:
        while self._queue and self._tried(config_hash(self._queue[0])):
            self._queue.pop(0)

    def _nearest_untried(self, config: Config) -> Config | None:
        """The untried feasible config nearest ``config``: fewest steps between neighbouring
        values of each parameter (a text value counts one step when it differs); ties broken by
        the strategy's seeded generator."""
        return self._nearest(config, self._untried())

    def _nearest(self, config: Config, among: list[Config]) -> Config | None:
        def distance(candidate: Config) -> int:
            return sum(_steps(self._choices[n], config[n], candidate[n]) for n in self.space.names)

        if not among:
            return None
        least = min(map(distance, among))
        return self._rng.choice([c for c in among if distance(c) == least])

    def tell(self, config: Config, measurement: Measurement) -> None:
        super().tell(config, measurement)
        key = config_hash(config)
        trial = self._pending.pop(key, None)
        if trial is not None:
            self._tell_study(trial, measurement)
        elif key in self._feasible and key not in self._in_study:  # a stored result: teach the sampler
            ok = measurement.ok
            status = {STATUS: str(measurement.status), CONFIG: config}
            if ok or self.constrained:
                # constraints only for TPE: GP requires every trial to have the same constraints,
                # and its own trials have none (a stored one with a constraint stopped its sweep)
                fields = _constraint_fields(0.0 if ok else 1.0) if self.constrained else {}
                fields["user_attrs"] = {**fields.get("user_attrs", {}), **status}
                self.study.add_trial(
                    optuna.trial.create_trial(
                        params=self.encode(config),
                        distributions=self._distributions,
                        **({"value": measurement.time_ms} if ok else {"state": UNTIMED}),
                        **fields,
                    )
                )
            else:
                self.study.add_trial(
                    optuna.trial.create_trial(
                        params=self.encode(config),
                        distributions=self._distributions,
                        state=TrialState.FAIL,
                        user_attrs=status,
                    )
                )
        self._in_study.add(key)
        self._record(config, measurement)

    def _record(self, config: Config, measurement: Measurement) -> None:
        """Add a measured config to the record, once: COMPLETE with its time, or FAIL with its
        status; its span runs from the proposal to the result (a stored result, proposed by an
        earlier sweep, spans no time)."""
        key = config_hash(config)
        asked_at = self._asked_at.pop(key, None)
        if self.record is None or key in self._recorded or key not in self._feasible:
            return
        ok = measurement.ok and measurement.time_ms is not None
        trial = optuna.trial.create_trial(
            params={n: config[n] for n in self.space.names},
            distributions=self._record_distributions,
            user_attrs={STATUS: str(measurement.status)},
            **({"value": measurement.time_ms} if ok else {"state": TrialState.FAIL}),
        )
        trial.datetime_complete = _now()
        trial.datetime_start = asked_at or trial.datetime_complete
        self.record.add_trial(trial)
        self._recorded.add(key)

    def _tell_study(self, trial: optuna.Trial, measurement: Measurement) -> None:
        trial.set_user_attr(STATUS, str(measurement.status))
        if measurement.ok:
            if self.constrained:
                _set_violation(trial, 0.0)
            self.study.tell(trial, measurement.time_ms)
        elif self.constrained:
            _set_violation(trial, 1.0)
            self.study.tell(trial, state=UNTIMED)
        else:
            self.study.tell(trial, state=TrialState.FAIL)


def _now() -> datetime.datetime:
    # Optuna's own trials carry local naive times (datetime.now()); the record's match them
    return datetime.datetime.now()


def _steps(choices: list[Any], a: Any, b: Any) -> int:
    """Steps between two values of one parameter: their distance in its sorted choices when
    numeric (neighbouring tile sizes are one step apart), else 0 or 1."""
    if a == b:
        return 0
    if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in choices) and a in choices and b in choices:
        ordered = sorted(choices)
        return abs(ordered.index(a) - ordered.index(b))
    return 1


def _name_metric(study: optuna.Study) -> None:
    """Name the objective ``time_ms`` (optuna-dashboard labels its axes with it), where this
    Optuna can (3.2+) and the study has no name for it yet."""
    if not hasattr(study, "set_metric_names") or study.metric_names == [METRIC]:
        return
    with warnings.catch_warnings():  # "experimental" in Optuna 3.x
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([METRIC])


def _set_violation(trial: optuna.Trial, value: float) -> None:
    if SET_CONSTRAINT:
        trial.set_constraint(VIOLATION, value)
    else:
        trial.set_user_attr(VIOLATION, value)


def _constraint_fields(value: float) -> dict[str, Any]:
    """create_trial's arguments that mark a stored trial feasible (0) or not (1)."""
    if SET_CONSTRAINT:
        return {"constraints": {VIOLATION: value}}
    # add_trial does not run the sampler's after_trial, where constraints_func's values are
    # stored under this system attribute (Optuna 3.x-4.x)
    return {"user_attrs": {VIOLATION: value}, "system_attrs": {"constraints": (value,)}}


class _IndexEncoded(OptunaStrategy):
    """Each numeric parameter as the integer index of its value among the sorted feasible choices.

    For a power-of-two parameter the index is its log2 offset, so neighbouring indices are
    neighbouring tile sizes: the ordinal structure CMA-ES and GP model. A parameter with text
    values (a kernel variant) has no order and stays categorical, which CMA-ES samples
    independently of the rest.

    The record in the database names each config by its values, not its indices (see the
    module's docstring).
    """

    constrained = False
    # CMA-ES and GP propose from their own model alone: a local move is TPE's remedy
    local_every = 0

    def startup(self) -> list[Config]:
        # CMA-ES and GP keep their samplers' own random startup trials
        return []

    def _ordinal(self) -> dict[str, list[Any]]:
        return {
            n: sorted(v)
            for n, v in self._choices.items()
            if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
        }

    def distributions(self) -> dict[str, Any]:
        ordinal = self._ordinal()
        return {
            n: optuna.distributions.IntDistribution(0, len(ordinal[n]) - 1)
            if n in ordinal
            else optuna.distributions.CategoricalDistribution(v)
            for n, v in self._choices.items()
        }

    def encode(self, config: Config) -> dict[str, Any]:
        ordinal = self._ordinal()
        return {n: ordinal[n].index(config[n]) if n in ordinal else config[n] for n in self.space.names}

    def decode(self, params: dict[str, Any]) -> Config:
        ordinal = self._ordinal()
        return {n: ordinal[n][int(params[n])] if n in ordinal else params[n] for n in self.space.names}


class CmaEsStrategy(_IndexEncoded):
    """Optuna's CMA-ES sampler (needs the ``cmaes`` package) over the index-encoded space.

    Its sampler's study lives in memory, never in the database: Optuna's CmaEsSampler keeps its
    optimizer as a pickle in the trials' system attributes (``cma:optimizer:*``) and unpickles it
    from there, so a study read from a shared database could run code. The database holds the
    record only (see the module's docstring).
    """

    name = "cmaes"

    def sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        try:
            import cmaes  # noqa: F401  (Optuna imports it lazily, on the first relative sample)
        except ImportError:
            raise TunesvcError("--strategy cmaes needs the cmaes package; run `pip install cmaes`.") from None
        return optuna.samplers.CmaEsSampler(
            seed=seed,
            n_startup_trials=startup_count(len(self.candidates)),
            warn_independent_sampling=False,
            independent_sampler=optuna.samplers.RandomSampler(seed=seed),
        )


class GPStrategy(_IndexEncoded):
    """Optuna's Gaussian-process sampler (needs scipy) over the index-encoded space.

    GPSampler fits its model to the measured trials at every proposal (a fraction of a second to
    seconds of CPU) and learns nothing from a failed trial, so once its acquisition's maximum sits
    on an infeasible or measured point it proposes that point again and again: on a space of 22
    feasible configs, 661 proposals for 22 measurements. Such a proposal is told as failed and the
    untried config nearest to it is measured instead, as TPE's repeats are; GP then models that
    measurement like its own.
    """

    name = "gp"
    replace_misses = True

    def sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        if not hasattr(optuna.samplers, "GPSampler"):
            raise TunesvcError(f"--strategy gp needs Optuna 3.6 or newer (found {optuna.__version__}); upgrade optuna.")
        try:
            import scipy  # noqa: F401  (GPSampler imports it lazily, on the first sample)
        except ImportError:
            raise TunesvcError("--strategy gp needs scipy; run `pip install scipy`.") from None
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup_count(len(self.candidates)))
