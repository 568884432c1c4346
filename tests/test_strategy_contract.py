"""The search protocol's contract (tunesvc.search.Strategy), run over every registered strategy.

Each rule of :class:`~tunesvc.search.Strategy`'s docstring is one test here, parametrized over
:data:`tunesvc.search.STRATEGIES` (a test fails when a strategy is registered, or a Strategy
subclass written, that this suite does not run): proposals lie in the feasible set, are never
repeated, warm-start configs come first, a failed trial told back does not stop the search, the
strategy runs dry when the set is exhausted, and the same seed and tells give the same proposals.
"""

from __future__ import annotations

import pytest

from tunesvc import Space
from tunesvc import Status
from tunesvc import config_hash
from tunesvc.bench import Measurement
from tunesvc.search import STRATEGIES
from tunesvc.search import Strategy
from tunesvc.search import make_strategy

#: 3 * 2 * 2 = 12 configs, 8 of them feasible (A * B <= 64)
SPACE = {
    "params": {"A": [1, 2, 4], "B": [16, 32]},
    "launch": {"num_warps": [4, 8]},
    "constraints": {"small": "A * B <= 64"},
}


@pytest.fixture
def space() -> Space:
    return Space.from_dict(SPACE)


@pytest.fixture
def candidates(space: Space) -> list[dict]:
    feasible = space.feasible({}, {})
    assert 0 < len(feasible) < len(space.enumerate()), "the space must have infeasible configs"
    return feasible


#: registered, and too slow for this suite on a busy CPU: GP fits a Gaussian process per ask
#: (20 s each here; its own tests are in test_search.py)
SLOW = ("gp",)


@pytest.fixture(params=[s for s in STRATEGIES if s not in SLOW])
def name(request) -> str:
    return request.param


def timed(config: dict) -> Measurement:
    """A made-up time: the config's parameters decide it, so every strategy sees one landscape."""
    ms = 1.0 + 0.1 * config["A"] + 0.01 * config["B"] + 0.001 * config["num_warps"]
    return Measurement(Status.OK, time_ms=ms, spread=0.01, reps=3, rel_error=0.0)


def failed(config: dict) -> Measurement:
    return Measurement(Status.COMPILE_ERROR, message="out of registers")


def run(strategy: Strategy, measure=timed, budget: int | None = None) -> list[dict]:
    """The sweep's loop: ask, measure, tell, until the strategy says None (or the budget is spent)."""
    proposed: list[dict] = []
    while budget is None or len(proposed) < budget:
        config = strategy.ask()
        if config is None:
            break
        proposed.append(config)
        strategy.tell(config, measure(config))
    return proposed


def hashes(configs: list[dict]) -> list[str]:
    return [config_hash(c) for c in configs]


# -- coverage ---------------------------------------------------------------------------------
def _subclasses(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in {direct, *_subclasses(direct)}}


def test_every_strategy_is_registered_and_run_by_this_suite(space, candidates):
    made = {type(make_strategy(name, space, candidates)) for name in STRATEGIES}
    concrete = {cls for cls in _subclasses(Strategy) if not getattr(cls, "__abstractmethods__", None)}
    # not a test's own, nor a private base shared by strategies (_IndexEncoded)
    concrete = {cls for cls in concrete if cls.__module__.startswith("tunesvc.") and not cls.__name__.startswith("_")}
    unregistered = sorted(cls.__qualname__ for cls in concrete - made)
    assert not unregistered, (
        f"Strategy subclasses that make_strategy cannot make (add them to STRATEGIES): {unregistered}"
    )
    assert {make_strategy(name, space, candidates).name for name in STRATEGIES} == set(STRATEGIES)


def test_the_protocol_states_its_rules():
    rules = Strategy.__doc__ or ""
    for rule in (
        "Inside the feasible set",
        "No repeats",
        "Exhaustion",
        "Warm start",
        "Failures are data",
        "Determinism",
    ):
        assert rule in rules, rule


# -- the rules, each strategy -----------------------------------------------------------------
def test_ask_tell_proposes_every_feasible_config_once_then_none(name, space, candidates):
    strategy = make_strategy(name, space, candidates, seed=3)
    proposed = run(strategy)
    # inside the feasible set (so never outside the space nor breaking a constraint), never twice
    assert sorted(hashes(proposed)) == sorted(hashes(candidates))
    for config in proposed:
        assert not space.violations(config, {}, {})
    assert strategy.exhausted
    assert strategy.ask() is None and strategy.ask() is None  # runs dry, and stays dry


def test_a_budget_below_the_set_is_the_sweeps_and_the_strategy_resumes(name, space, candidates):
    strategy = make_strategy(name, space, candidates, seed=1)
    first = run(strategy, budget=3)
    assert len(first) == 3 and not strategy.exhausted
    rest = run(strategy)  # asked again later: goes on where it stopped, no repeats
    assert sorted(hashes(first + rest)) == sorted(hashes(candidates))


def test_asked_and_not_yet_told_is_never_proposed_again(name, space, candidates):
    strategy = make_strategy(name, space, candidates, seed=2)
    batch = [strategy.ask() for _ in range(len(candidates))]  # a batch to compile in parallel
    assert None not in batch
    assert sorted(hashes(batch)) == sorted(hashes(candidates))  # type: ignore[arg-type]
    assert strategy.ask() is None  # all pending: nothing left to propose
    for config in batch:
        assert config is not None
        strategy.tell(config, timed(config))
    assert strategy.exhausted and strategy.ask() is None


def test_failed_trials_told_back_do_not_stop_the_search(name, space, candidates):
    strategy = make_strategy(name, space, candidates, seed=4)
    proposed = run(strategy, measure=lambda c: failed(c) if c["A"] == 1 else timed(c))
    assert sorted(hashes(proposed)) == sorted(hashes(candidates))

    everything_fails = make_strategy(name, space, candidates, seed=4)
    assert sorted(hashes(run(everything_fails, measure=failed))) == sorted(hashes(candidates))


def test_wrong_results_and_crashes_are_told_like_any_measurement(name, space, candidates):
    statuses = [Status.WRONG_RESULT, Status.CRASH, Status.TIMEOUT, Status.ERROR, Status.INVALID]
    strategy = make_strategy(name, space, candidates, seed=5)
    seen: list[dict] = []

    def measure(config: dict) -> Measurement:
        seen.append(config)
        status = statuses[len(seen) % len(statuses)]
        if len(seen) % 2:
            return timed(config)
        return Measurement(status, rel_error=0.5 if status is Status.WRONG_RESULT else None, message="bad")

    assert sorted(hashes(run(strategy, measure=measure))) == sorted(hashes(candidates))


def test_warm_start_configs_come_first_and_infeasible_ones_are_dropped(name, space, candidates):
    warm = [candidates[-1], candidates[2]]
    infeasible = next(c for c in space.enumerate() if space.violations(c, {}, {}))
    strategy = make_strategy(name, space, candidates, seed=6, initial=[infeasible, *warm])
    proposed = run(strategy)
    assert hashes(proposed[:2]) == hashes(warm)
    assert config_hash(infeasible) not in hashes(proposed)
    assert sorted(hashes(proposed)) == sorted(hashes(candidates))


def test_stored_results_told_first_are_not_proposed(name, space, candidates):
    """A resumed sweep tells what is stored before it asks: those configs are never proposed."""
    strategy = make_strategy(name, space, candidates, seed=7)
    stored = candidates[:3]
    for config in stored:
        strategy.tell(config, timed(config))
    proposed = run(strategy)
    assert sorted(hashes(stored + proposed)) == sorted(hashes(candidates))
    assert not set(hashes(stored)) & set(hashes(proposed))


def test_the_same_seed_and_tells_give_the_same_proposals(name, space, candidates):
    first = hashes(run(make_strategy(name, space, candidates, seed=11)))
    assert hashes(run(make_strategy(name, space, candidates, seed=11))) == first


def test_a_single_candidate(name, space, candidates):
    strategy = make_strategy(name, space, candidates[:1], seed=0)
    assert hashes(run(strategy)) == hashes(candidates[:1])
    assert strategy.exhausted and strategy.ask() is None
