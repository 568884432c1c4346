"""Search strategies: ask/tell, warm start, no repeats, resume from stored results."""

from __future__ import annotations

import dataclasses
import math
import time
from contextlib import closing
from pathlib import Path

import optuna
import pytest
import torch
from _backends import db_url  # noqa: F401  (fixture: a SQLite file, a PostgreSQL database)

from tunesvc import Space
from tunesvc import Status
from tunesvc import config_hash
from tunesvc.bench import Measurement
from tunesvc.errors import TunesvcError
from tunesvc.search import GridStrategy
from tunesvc.search import make_strategy
from tunesvc.search._optuna import LOCAL_EVERY
from tunesvc.search._optuna import SET_CONSTRAINT
from tunesvc.search._optuna import VIOLATION
from tunesvc.search._optuna import OptunaStrategy
from tunesvc.search._optuna import _steps
from tunesvc.search._optuna import startup_count
from tunesvc.search.replay import GroundTruth
from tunesvc.search.replay import efficiency
from tunesvc.search.replay import read_ground_truth
from tunesvc.search.replay import trials_to_reach
from tunesvc.search.replay import write_ground_truth
from tunesvc.serving.selector import stored_selector
from tunesvc.store import Store
from tunesvc.store import resolve_url
from tunesvc.store._migrate import HEAD
from tunesvc.template import ShapeKey
from tunesvc.template import Template
from tunesvc.tuning.selector_fit import TrainingSet
from tunesvc.tuning.selector_fit import fit_neighbours
from tunesvc.tuning.selector_fit import untuned_answer
from tunesvc.tuning.selector_measure import cross_measure
from tunesvc.tuning.sweep import check_sweep_arguments
from tunesvc.tuning.sweep import run_sweep
from tunesvc.tuning.sweep import stored_warm_start
from tunesvc.tuning.sweep import study_name
from tunesvc.tuning.sweep import study_storage


@pytest.fixture
def space():
    return Space.from_dict(
        {
            "params": {"A": [1, 2, 4], "B": [16, 32]},
            "launch": {"num_warps": [4, 8]},
            "constraints": {"small": "A * B <= 64"},
        }
    )


@pytest.fixture
def candidates(space):
    return space.feasible({}, {})


def ok(ms: float) -> Measurement:
    return Measurement(Status.OK, time_ms=ms, spread=0.0, reps=3, rel_error=0.0)


def fake_time(config) -> float:
    # a deterministic landscape with one best config
    return 1.0 + abs(config["A"] - 2) + abs(config["B"] - 32) / 16 + (config["num_warps"] == 8) * 0.5


def drain(strategy, limit=1000):
    proposed = []
    while (config := strategy.ask()) is not None:
        proposed.append(config)
        strategy.tell(config, ok(fake_time(config)))
        assert len(proposed) <= limit, "strategy never ends"
    return proposed


def hashes(configs):
    return [config_hash(c) for c in configs]


def test_candidates_fixture(space, candidates):
    assert space.size == 12
    # A * B <= 64 drops (4, 32) for both num_warps
    assert len(candidates) == 10
    assert all(c["A"] * c["B"] <= 64 for c in candidates)


def test_grid_proposes_every_candidate_once_initial_first(space, candidates):
    initial = [candidates[5], candidates[2]]
    grid = GridStrategy(space, candidates, initial=initial)
    proposed = drain(grid)
    assert hashes(proposed[:2]) == hashes(initial)
    assert sorted(hashes(proposed)) == sorted(hashes(candidates))
    assert len(set(hashes(proposed))) == len(candidates)
    # the rest in the space's order
    rest = [c for c in candidates if c not in initial]
    assert proposed[2:] == rest
    assert grid.exhausted
    assert grid.ask() is None


def test_grid_drops_infeasible_initial_configs(space, candidates):
    infeasible = {"A": 4, "B": 32, "num_warps": 4}
    grid = GridStrategy(space, candidates, initial=[infeasible, candidates[3]])
    assert grid.initial == [candidates[3]]
    proposed = drain(grid)
    assert infeasible not in proposed
    assert proposed[0] == candidates[3]


@pytest.mark.parametrize("make", [GridStrategy, OptunaStrategy])
def test_asks_before_tells_give_a_batch_of_distinct_configs(space, candidates, make):
    # a sweep asks for a batch (compiled in parallel) before it tells any result
    strategy = make(space, candidates, seed=0)
    batch = [strategy.ask() for _ in range(6)]
    assert len(set(hashes(batch))) == 6
    assert all(c in candidates for c in batch)
    for config in batch:
        strategy.tell(config, ok(1.0))
    assert strategy.ask() not in batch


def test_grid_resume_skips_stored(space, candidates):
    grid = GridStrategy(space, candidates, initial=[candidates[0]])
    stored = candidates[:4] + [candidates[9]]
    for config in stored:
        grid.tell(config, ok(1.0))
    proposed = drain(grid)
    assert len(proposed) == len(candidates) - len(stored)
    assert not set(hashes(proposed)) & set(hashes(stored))
    assert proposed[0] == candidates[4]


def test_optuna_proposes_only_feasible_never_repeats_and_ends(space, candidates):
    strategy = OptunaStrategy(space, candidates, seed=1, initial=[candidates[7]])
    proposed = drain(strategy, limit=len(candidates))
    assert proposed[0] == candidates[7]  # warm start first
    feasible = set(hashes(candidates))
    assert set(hashes(proposed)) <= feasible
    assert len(set(hashes(proposed))) == len(proposed)  # never repeats
    assert len(proposed) == len(candidates)  # ends only when exhausted
    assert strategy.exhausted
    assert strategy.ask() is None


def first_proposals(strategy, n):
    proposed = []
    for _ in range(n):
        config = strategy.ask()
        proposed.append(config_hash(config))
        strategy.tell(config, ok(fake_time(config)))
    return proposed


def test_optuna_is_reproducible_with_a_seed(space, candidates):
    first = first_proposals(OptunaStrategy(space, candidates, seed=3), 6)
    second = first_proposals(OptunaStrategy(space, candidates, seed=3), 6)
    assert first == second
    assert len(set(first)) == 6


def test_optuna_resume_skips_stored(space, candidates):
    stored = candidates[::2] + [candidates[1]]
    strategy = OptunaStrategy(space, candidates, seed=0, initial=[stored[0], candidates[3]])
    for i, config in enumerate(stored):
        m = ok(fake_time(config)) if i % 3 else Measurement(Status.WRONG_RESULT, rel_error=1.0)
        strategy.tell(config, m)
    proposed = drain(strategy, limit=len(candidates))
    assert proposed[0] == candidates[3]  # the stored initial config is skipped
    assert not set(hashes(proposed)) & set(hashes(stored))
    assert sorted(hashes(proposed + stored)) == sorted(hashes(candidates))


def test_optuna_on_the_matmul_space(template, device):
    problem = template.problem(M=64, N=64, K=64)
    candidates = template.feasible(problem, device)
    assert 0 < len(candidates) < template.space.size
    strategy = make_strategy("optuna", template.space, candidates, seed=0, initial=template.warm_start(problem, device))
    proposed = []
    for _ in range(5):
        config = strategy.ask()
        assert config is not None
        assert template.violations(config, problem, device) == []
        assert config_hash(config) not in hashes(proposed)
        proposed.append(config)
        strategy.tell(config, ok(1.0 + len(proposed)))
    assert proposed[0] == template.heuristic(problem, device)


def test_optuna_resume_tolerates_a_stored_config_outside_the_space(space, candidates):
    """A stored trial whose config is no longer in the space (search_spaces/*.toml edited: the
    kernel version hashes only its source) is replayed into the Optuna study without an error
    (optuna.trial.create_trial refuses a value outside the distribution)."""
    strategy = OptunaStrategy(space, candidates, seed=0)
    strategy.tell({"A": 8, "B": 16, "num_warps": 4}, ok(1.0))
    proposed = drain(strategy, limit=len(candidates))
    assert sorted(hashes(proposed)) == sorted(hashes(candidates))


def test_make_strategy():
    space = Space.from_dict({"params": {"A": [1, 2]}})
    candidates = space.enumerate()
    assert make_strategy("grid", space, candidates).name == "grid"
    assert make_strategy("optuna", space, candidates).name == "optuna"
    with pytest.raises(TunesvcError, match="Unknown strategy 'annealing'"):
        make_strategy("annealing", space, candidates)


# -- more strategies ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["random", "cmaes"])
def test_strategy_proposes_each_feasible_config_once_warm_start_first(space, candidates, name):
    strategy = make_strategy(name, space, candidates, seed=2, initial=[candidates[6]])
    assert strategy.name == name
    proposed = drain(strategy, limit=len(candidates))
    assert proposed[0] == candidates[6]
    assert sorted(hashes(proposed)) == sorted(hashes(candidates))
    assert strategy.ask() is None


def test_random_is_seeded(space, candidates):
    first = first_proposals(make_strategy("random", space, candidates, seed=4), 5)
    assert first == first_proposals(make_strategy("random", space, candidates, seed=4), 5)
    assert first != first_proposals(make_strategy("random", space, candidates, seed=5), 5)


def test_cmaes_samples_indices_of_sorted_choices(space, candidates):
    strategy = make_strategy("cmaes", space, candidates, seed=0)
    # A in (1, 2, 4) is the ordinal 0..2: neighbouring indices are neighbouring tile sizes
    assert strategy.encode({"A": 4, "B": 16, "num_warps": 8}) == {"A": 2, "B": 0, "num_warps": 1}
    assert strategy.decode({"A": 1, "B": 1, "num_warps": 0}) == {"A": 2, "B": 32, "num_warps": 4}


def violations(trials) -> list[float]:
    return [t.constraints[VIOLATION] if SET_CONSTRAINT else t.system_attrs["constraints"][0] for t in trials]


def test_tpe_is_told_infeasible_and_failed_trials_as_constrained_and_without_a_value(space, candidates):
    # stored results (a resumed sweep) and proposals alike: only a measured time is a value
    strategy = OptunaStrategy(space, candidates, seed=0)
    for config in candidates[:3]:
        strategy.tell(config, Measurement(Status.CRASH, message="died"))
    strategy.tell(candidates[3], ok(1.0))
    trials = strategy.study.get_trials()
    assert [t.state.name for t in trials] == ["PRUNED"] * 3 + ["COMPLETE"]
    assert [t.value for t in trials] == [None, None, None, 1.0]
    assert [t.user_attrs["status"] for t in trials] == ["crash"] * 3 + ["ok"]
    assert violations(trials) == [1.0, 1.0, 1.0, 0.0]
    assert strategy.study.metric_names == ["time_ms"]

    strategy = OptunaStrategy(space, candidates, seed=3)
    strategy.study.enqueue_trial({"A": 4, "B": 32, "num_warps": 4})  # the first proposal: A * B > 64
    while (config := strategy.ask()) is not None:
        strategy.tell(config, ok(fake_time(config)) if config["num_warps"] == 4 else Measurement(Status.WRONG_RESULT))
    trials = strategy.study.get_trials()
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert sorted(t.value for t in complete) == sorted(fake_time(c) for c in candidates if c["num_warps"] == 4)
    constrained = [t for t in trials if t.state.name == "PRUNED"]
    assert {t.user_attrs["status"] for t in constrained} == {"wrong_result", "infeasible"}
    assert all(t.value is None for t in constrained) and set(violations(constrained)) == {1.0}
    assert all(t.user_attrs.get("unmeasured") for t in trials if t.state.name == "FAIL")
    assert all(t.user_attrs["status"] in ("repeat", "moved") for t in trials if t.state.name == "FAIL")


@pytest.mark.parametrize("name", ["gp", "cmaes"])
def test_index_encoded_trials_carry_their_config_values_for_optunas_readers(name, space, candidates):
    """CMA-ES and GP sample indices among the sorted values (A=2 is A=4): each trial names its
    config's values too, and an unmeasured proposal says why it was not measured."""
    pytest.importorskip("scipy" if name == "gp" else "cmaes")
    strategy = make_strategy(name, space, candidates, seed=1)
    while (config := strategy.ask()) is not None:
        strategy.tell(config, ok(fake_time(config)))
    trials = strategy.study.get_trials()
    for trial in trials:
        assert trial.user_attrs["config"] == strategy.decode(trial.params)
    assert {t.user_attrs["status"] for t in trials if t.state.name == "FAIL"} <= {"repeat", "infeasible"}
    assert any(t.user_attrs["config"]["A"] == 4 for t in trials if t.state.name == "COMPLETE")


@pytest.mark.parametrize("name", ["gp", "cmaes"])
def test_index_encoded_strategies_record_measured_configs_by_their_values_in_the_database(
    name, space, candidates, tmp_path
):
    """optuna-dashboard reads the study in --db: for CMA-ES and GP it shows each measured config
    once, its parameters as values (A=4, not the index 2), and no unmeasured proposal (repeats,
    infeasible points) as a failed trial; a resumed sweep adds only what is new to it."""
    pytest.importorskip("scipy" if name == "gp" else "cmaes")
    url = f"sqlite:///{tmp_path / 'record.db'}"
    strategy = make_strategy(name, space, candidates, seed=1, storage=url, study_name="k")
    failed = candidates[0]
    strategy.tell(failed, Measurement(Status.WRONG_RESULT, message="differs"))  # a stored failure
    measured = [failed]
    for _ in range(6):
        config = strategy.ask()
        assert config is not None
        strategy.tell(config, ok(fake_time(config)))
        measured.append(config)

    record = optuna.load_study(study_name="k", storage=url)
    assert [config_hash(t.params) for t in record.trials] == hashes(measured)
    assert all(set(t.params.values()) <= {1, 2, 4, 16, 32, 8} for t in record.trials)
    assert all(
        isinstance(d, optuna.distributions.CategoricalDistribution) for d in record.trials[0].distributions.values()
    )
    assert [t.state.name for t in record.trials] == ["FAIL"] + ["COMPLETE"] * 6
    assert [t.user_attrs["status"] for t in record.trials] == ["wrong_result"] + ["ok"] * 6
    assert [t.value for t in record.trials[1:]] == [fake_time(c) for c in measured[1:]]

    resumed = make_strategy(name, space, candidates, seed=2, storage=url, study_name="k")
    for config in measured:  # the sweep tells a resumed strategy its stored trials
        resumed.tell(config, ok(fake_time(config)))
    config = resumed.ask()
    assert config is not None and config_hash(config) not in hashes(measured)
    resumed.tell(config, ok(fake_time(config)))
    assert len(optuna.load_study(study_name="k", storage=url).trials) == len(measured) + 1


@pytest.mark.parametrize("name", ["optuna", "gp", "cmaes"])
def test_the_record_in_the_database_holds_measured_trials_only_each_with_its_span(name, space, candidates, tmp_path):
    """optuna-dashboard reads the record: every strategy's shows the measured configs only (no
    unmeasured proposal as a failed trial), COMPLETE with a time or FAIL with the status it was
    measured with, each spanning its proposal to its measurement (the timeline is not empty)."""
    pytest.importorskip({"optuna": "optuna", "gp": "scipy", "cmaes": "cmaes"}[name])
    url = f"sqlite:///{tmp_path / 'record.db'}"
    strategy = make_strategy(name, space, candidates, seed=1, storage=url, study_name="k")
    stored = candidates[0]
    strategy.tell(stored, ok(fake_time(stored)))  # a stored result: proposed by an earlier sweep
    measured = [stored]
    while (config := strategy.ask()) is not None:
        time.sleep(0.02)  # the trial spans at least this (a lower bound: a sleep is never shorter)
        failed = len(measured) % 3 == 0
        strategy.tell(config, Measurement(Status.COMPILE_ERROR) if failed else ok(fake_time(config)))
        measured.append(config)
    assert len(measured) == len(candidates)
    unmeasured = [t for t in strategy.study.get_trials() if t.user_attrs.get("status") in ("repeat", "moved")]
    record = optuna.load_study(study_name="k", storage=url).trials
    assert [config_hash(t.params) for t in record] == hashes(measured)
    assert not any(t.user_attrs.get("status") in ("repeat", "moved", "infeasible") for t in record), unmeasured
    for trial, config in zip(record, measured, strict=True):
        failed = trial.user_attrs["status"] == "compile_error"
        assert trial.state.name == ("FAIL" if failed else "COMPLETE")
        assert trial.value == (None if failed else fake_time(config))
    assert record[0].duration.total_seconds() == 0  # the stored result was not measured here
    assert all(t.duration.total_seconds() >= 0.02 for t in record[1:])


def test_gp_measures_the_nearest_untried_config_instead_of_asking_again():
    """GPSampler fits its model at every proposal and learns nothing from a failed one: asked
    again after an infeasible or repeated proposal, it proposed the same point up to 50 times per
    measurement (661 proposals, minutes of CPU, for 22 configs). The nearest untried config is
    measured instead: every feasible config once, at most one unmeasured proposal before each."""
    pytest.importorskip("scipy")
    space = Space.from_dict(
        {
            "params": {"BLOCK_M": [1, 2, 4, 8, 16]},
            "launch": {"num_warps": [1, 2, 4, 8, 16]},
            "constraints": {"fits": "BLOCK_M * num_warps <= 64"},
        }
    )
    candidates = space.feasible({}, {})
    strategy = make_strategy("gp", space, candidates, seed=0)
    proposed = []
    while (config := strategy.ask()) is not None and len(proposed) <= len(candidates):
        proposed.append(config)
        strategy.tell(config, ok(1.0 + config["BLOCK_M"] / 7 + config["num_warps"] / 5))
    assert sorted(hashes(proposed)) == sorted(hashes(candidates))
    trials = strategy.study.get_trials()
    assert len(trials) <= 2 * len(candidates), len(trials)
    assert {t.user_attrs["status"] for t in trials if t.state.name == "FAIL"} <= {"repeat", "infeasible"}


def test_a_repeated_proposal_is_not_told_twice_but_replaced_by_its_nearest_untried(space, candidates):
    # TPE that has converged proposes its incumbent again: told its value a second time, the
    # incumbent would weigh double in TPE's densities and pull every later proposal back onto it
    strategy = OptunaStrategy(space, candidates, seed=0)
    proposed = drain(strategy, limit=len(candidates))
    assert sorted(hashes(proposed)) == sorted(hashes(candidates))
    complete = [t for t in strategy.study.get_trials() if t.state.name == "COMPLETE"]
    assert len(complete) == len(candidates)  # one trial per measured config, no repeats
    assert len({tuple(sorted(t.params.items())) for t in complete}) == len(candidates)
    best = {"A": 2, "B": 32, "num_warps": 4}
    strategy = OptunaStrategy(space, candidates, seed=0)
    strategy.tell(best, ok(1.0))
    # one step away in one parameter (A=4 with B=32 is infeasible)
    assert strategy._nearest_untried(best) in (
        {"A": 1, "B": 32, "num_warps": 4},
        {"A": 2, "B": 16, "num_warps": 4},
        {"A": 2, "B": 32, "num_warps": 8},
    )


def values_shown(configs):
    return {(name, config[name]) for config in configs for name in config}


@pytest.fixture
def open_space():
    # 36 configs, no constraints: startup_count is 9, and A's 4 values need 4 configs
    return Space.from_dict({"params": {"A": [1, 2, 4, 8], "B": [16, 32, 64]}, "launch": {"num_warps": [2, 4, 8]}})


@pytest.mark.parametrize("seed", range(5))
def test_tpe_starts_with_a_cover_of_every_value(open_space, seed):
    # i.i.d. random startup trials leave values unseen (4 random configs show all 4 values of A
    # with probability 4!/4^4, under 10%); the cover shows every value of every parameter in
    # as many configs as A has values, then TPE samples
    candidates = open_space.feasible({}, {})
    strategy = OptunaStrategy(open_space, candidates, seed=seed)
    first = first_proposals(strategy, 4)
    assert len(strategy._startup) == 4
    every = values_shown(candidates)
    assert values_shown([c for c in candidates if config_hash(c) in first]) == every
    assert len(set(first)) == 4


def test_tpe_startup_covers_only_what_the_warm_start_and_stored_results_left_unseen(open_space):
    candidates = open_space.feasible({}, {})
    warm = {"A": 1, "B": 16, "num_warps": 2}
    stored = {"A": 2, "B": 32, "num_warps": 4}
    strategy = OptunaStrategy(open_space, candidates, seed=0, initial=[warm])
    strategy.tell(stored, ok(1.0))
    assert strategy.ask() == warm  # the warm start first, then the cover
    startup = strategy._startup
    assert len(startup) == 2  # A=4 and A=8 are left, B=64 and num_warps=8 ride along
    assert values_shown([warm, stored, *startup]) == values_shown(candidates)
    # Optuna's startup count (warm start and stored results included) caps the cover
    strategy = OptunaStrategy(open_space, candidates, seed=0)
    for config in candidates[: startup_count(len(candidates))]:
        strategy.tell(config, ok(1.0))
    strategy.ask()
    assert strategy._startup == []


def test_cmaes_and_gp_keep_their_random_startup(open_space):
    candidates = open_space.feasible({}, {})
    assert make_strategy("cmaes", open_space, candidates, seed=0).startup() == []


def test_a_local_move_changes_one_parameter_one_step_and_repairs_a_coupled_one():
    # BLOCK_M=64 only with 4 warps: from 128 with 8 warps, the move to BLOCK_M=64 is repaired
    # to the nearest feasible config with that value (4 warps), not dropped
    space = Space.from_dict(
        {
            "params": {"BLOCK_M": [32, 64, 128], "BLOCK_N": [32, 64]},
            "launch": {"num_warps": [4, 8]},
            "constraints": {"warps": "BLOCK_M == 128 or num_warps == 4"},
        }
    )
    candidates = space.feasible({}, {})
    strategy = OptunaStrategy(space, candidates, seed=0)
    incumbent = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8}
    strategy.tell(incumbent, ok(1.0))
    moves = strategy._moves(incumbent)
    assert sorted(hashes(moves)) == sorted(
        hashes(
            [
                {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4},  # repaired: 64 with 8 warps is infeasible
                {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 8},
                {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4},
            ]
        )
    )
    assert strategy.local_move() in moves
    strategy.tell({"BLOCK_M": 99, "BLOCK_N": 64, "num_warps": 4}, ok(0.5))  # outside the space: not an incumbent
    assert strategy.local_move() in moves
    assert make_strategy("cmaes", space, candidates).local_every == 0  # CMA-ES and GP: their model alone


def is_a_move(strategy, incumbent, config) -> bool:
    """One parameter one value away from ``incumbent``, the others as near as any untried config
    with that value allows."""

    def steps(a, b):
        return sum(_steps(strategy._choices[n], a[n], b[n]) for n in a)

    untried = [c for c in strategy.candidates if config_hash(c) not in strategy.told]
    return any(
        _steps(strategy._choices[n], incumbent[n], config[n]) == 1
        and steps(incumbent, config) == min(steps(incumbent, c) for c in untried if c[n] == config[n])
        for n in config
    )


@pytest.mark.parametrize("seed", range(3))
def test_every_second_tpe_proposal_is_a_move_from_the_incumbent(open_space, seed):
    candidates = open_space.feasible({}, {})
    strategy = OptunaStrategy(open_space, candidates, seed=seed)
    cover = len(strategy.startup())
    for i in range(-cover + 1, 13):  # i > 0: TPE's i-th proposal
        incumbent = strategy._by_hash[min(strategy.told, key=lambda key: strategy.told[key].time_ms)] if i > 0 else None
        config = strategy.ask()
        if i > 0 and i % LOCAL_EVERY == 0:
            assert is_a_move(strategy, incumbent, config)
        strategy.tell(config, ok(fake_time(config) + 0.001 * i))  # no ties: one incumbent


# -- offline replay -----------------------------------------------------------------------


def synthetic_truth() -> GroundTruth:
    """A structured landscape: a smooth bowl in log2 tile sizes with one optimum, a region that
    fails (too large a tile with too few warps), and warps/stages that matter less."""
    truth = GroundTruth("toy", "N=1")
    for bm in (16, 32, 64, 128, 256):
        for bn in (16, 32, 64, 128, 256):
            for warps in (2, 4, 8):
                for stages in (2, 3, 4, 5):
                    config = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
                    if bm * bn >= 128 * 256 and warps == 2:
                        truth.add(config, Measurement(Status.COMPILE_ERROR))
                        continue
                    x, y = math.log2(bm) - 6, math.log2(bn) - 5
                    ms = 1.0 + 0.3 * x * x + 0.3 * y * y + 0.08 * abs(warps - 4) + 0.04 * abs(stages - 3)
                    truth.add(config, Measurement(Status.OK, time_ms=ms))
    return truth


def test_replay_round_trips_a_csv_and_tpe_beats_random(tmp_path):
    truth = synthetic_truth()
    path = tmp_path / "truth.csv"
    write_ground_truth(path, [truth])
    [read] = read_ground_truth(path)
    assert read.name == "toy N=1" and len(read.configs) == 300
    assert read.best_ms == pytest.approx(truth.best_ms) == pytest.approx(1.0)
    assert (
        read.outcomes[config_hash({"BLOCK_M": 256, "BLOCK_N": 256, "num_warps": 2, "num_stages": 2})].status
        is Status.COMPILE_ERROR
    )
    tpe = efficiency(read, "optuna", seeds=8)
    rand = efficiency(read, "random", seeds=8)
    # only the optimum is within 3%: random search needs about half the space
    assert rand.median_trials > 50
    assert tpe.median_trials < rand.median_trials
    assert tpe.within and tpe.fraction == tpe.median_trials / 300


def test_trials_to_reach_counts_until_within_tolerance():
    truth = synthetic_truth()
    grid_order = [config_hash(c) for c in truth.configs]
    best = min(grid_order, key=lambda h: truth.outcomes[h].time_ms if truth.outcomes[h].ok else 1e9)
    # grid asks in table order: the optimum is the first config within 3%
    within = [h for h in grid_order if truth.outcomes[h].ok and truth.outcomes[h].time_ms <= 1.03]
    assert within[0] == best
    assert trials_to_reach(truth, "grid", seed=0) == grid_order.index(best) + 1


# -- wired into sweeps ----------------------------------------------------------------------


class Toy(Template):
    """y = 2x, with a launch that sleeps 3 ms per unit of A + B + (num_warps == 8): a landscape
    whose times are the config's, not noise, with the heuristic's config the only fastest."""

    name = "toy"
    dims = ("N",)
    dtypes = ("float32",)
    space = Space.from_dict({"params": {"A": [1, 2, 4, 8], "B": [1, 2, 3]}, "launch": {"num_warps": [4, 8]}})

    def key(self, problem):
        return ShapeKey.make({"N": problem["N"]}, {"dtype": problem["dtype"]})

    def make_inputs(self, problem, device):
        return torch.randn(problem["N"])

    def launch(self, inputs, config):
        time.sleep(
            (config["A"] + config["B"] + (config["num_warps"] == 8)) * 1e-2
        )  # steps far above sleep jitter on a loaded machine
        return inputs * 2

    def reference(self, inputs):
        return inputs.double() * 2

    def heuristic(self, problem, device):
        return {"A": 1, "B": 1, "num_warps": 4}


def toy_sweep(store, device, n=64, **kwargs):
    toy = Toy()
    [result] = run_sweep(toy, [toy.problem(N=n, dtype="float32")], store, device=device, **kwargs)
    return result


def test_patience_stops_a_search_that_no_longer_improves(tmp_db, device):
    with closing(Store(tmp_db)) as store:
        result = toy_sweep(store, device, strategy="grid", patience=3)
    # the heuristic is the fastest: three trials later the search stops
    assert result.stopped == "patience" and result.trials_new == 4
    assert result.winner == Toy().heuristic({}, device)


def test_time_budget_stops_a_search(tmp_db, device):
    with closing(Store(tmp_db)) as store:
        result = toy_sweep(store, device, strategy="random", time_budget=0.3)
    assert result.stopped == "time"
    assert 1 <= result.trials_new < 24


def test_a_time_budget_spent_before_the_first_trial_still_measures_one(tmp_db, device):
    """A start slower than the budget (a cold cache, a loaded host) ends the search after its
    first candidate, never with no trial and no winner."""
    with closing(Store(tmp_db)) as store:
        result = toy_sweep(store, device, strategy="random", time_budget=1e-9)
    assert result.stopped == "time"
    assert result.trials_new == 1 and result.winner is not None


def test_warm_start_from_nearest_shapes_and_other_devices(tmp_db, device):
    other = dataclasses.replace(device, name="Other GPU", sm_count=7)
    odd = {"A": 4, "B": 3, "num_warps": 8}
    with closing(Store(tmp_db)) as store:
        toy_sweep(store, device, n=64, strategy="grid", candidates=[odd])  # a winner nearby, this device
        toy_sweep(store, other, n=1024, strategy="grid", candidates=[{**odd, "B": 2}])  # this key, elsewhere
        toy_sweep(store, device, n=4, strategy="grid", candidates=[{**odd, "A": 8}])  # farther away
        toy = Toy()
        problem = toy.problem(N=1024, dtype="float32")
        key = str(toy.key(problem))
        assert stored_warm_start(store, toy, device, key) == [odd, {**odd, "A": 8}, {**odd, "B": 2}]
        # with no selector stored, the runtime launches the nearest tuned shape's winner
        assert untuned_answer(store, toy, problem, device) == ("nearest", odd)
        result = toy_sweep(store, device, n=1024, strategy="optuna", budget=3)
        rows = store.trials(store.kernel_version_id(toy), store.device_id(device), key)
    # what the runtime launched untuned (the nearest tuned shape's winner), the heuristic, then
    # the next nearest tuned shape's winner
    assert [r.config for r in rows] == [odd, toy.heuristic({}, device), {**odd, "A": 8}]
    assert result.trials_new == 3


class ToyEdited(Toy):
    """Toy after an edit to its kernel: the same name, another version."""

    version = "e0e0e0e0e0e0"


def test_a_key_retuned_after_a_kernel_edit_measures_its_old_winners_first(tmp_db, device):
    """After an edit, the key's winner under the earlier version on this device comes first among
    the stored ones (newest version first), before the nearest keys' winners of the new version;
    one from another device or another key does not."""
    other = dataclasses.replace(device, name="Other GPU", sm_count=7)
    old, older, near = (
        {"A": 2, "B": 3, "num_warps": 8},
        {"A": 8, "B": 3, "num_warps": 8},
        {"A": 4, "B": 1, "num_warps": 4},
    )
    older_toy = Toy()
    older_toy.version = "a1a1a1a1a1a1"
    with closing(Store(tmp_db)) as store:
        run_sweep(
            older_toy,
            [older_toy.problem(N=1024, dtype="float32")],
            store,
            device=device,
            strategy="grid",
            candidates=[older],
        )
        time.sleep(0.01)  # the later version's winner is the newer one
        toy_sweep(store, device, n=1024, strategy="grid", candidates=[old])  # this key, the version before the edit
        toy_sweep(store, other, n=1024, strategy="grid", candidates=[{**old, "B": 1}])  # this key, another device
        toy_sweep(store, device, n=64, strategy="grid", candidates=[{**old, "A": 1}])  # another key, old version
        edited = ToyEdited()
        run_sweep(
            edited, [edited.problem(N=64, dtype="float32")], store, device=device, strategy="grid", candidates=[near]
        )
        key = str(edited.key(edited.problem(N=1024, dtype="float32")))
        assert stored_warm_start(store, edited, device, key) == [old, older, near]
        result = run_sweep(
            edited, [edited.problem(N=1024, dtype="float32")], store, device=device, strategy="grid", budget=4
        )[0]
        rows = store.trials(store.kernel_version_id(edited), store.device_id(device), key)
    # what the runtime launches untuned (the nearest tuned key's winner of this version), the
    # heuristic, then the key's old winners
    assert [r.config for r in rows] == [near, edited.heuristic({}, device), old, older]
    assert result.trials_new == 4


def test_untuned_answer_of_an_empty_store_is_the_heuristic(tmp_db, device):
    toy = Toy()
    with closing(Store(tmp_db)) as store:
        assert untuned_answer(store, toy, toy.problem(N=100, dtype="float32"), device) == (
            "heuristic",
            toy.heuristic({}, device),
        )


def _toy_selector(toy, device, first):
    """A neighbours selector over toy keys N=256, 512 and 2048 whose first-ranked candidate,
    ``first``, ran fastest on each of them."""
    second = {**first, "B": 1}
    problems = [toy.problem(N=n, dtype="float32") for n in (256, 512, 2048)]
    data = TrainingSet(
        "toy",
        toy.version,
        device.hardware_id,
        (first, second),
        tuple(str(toy.key(p)) for p in problems),
        tuple(toy.selector_features(p, device) for p in problems),
        ((1.0, 2.0),) * len(problems),
        (),
    )
    fitted = fit_neighbours(data)
    assert fitted is not None
    return fitted


def test_a_sweep_measures_the_selectors_pick_first_and_retimes_it_with_the_finalists(tmp_db, device):
    """What the runtime launched before the sweep (here the selector's pick, the slowest config
    of the space) is its first trial, and is re-timed beside the finalists, so the stored winner
    has beaten it under the same clocks."""
    toy = Toy()
    slowest = {"A": 8, "B": 3, "num_warps": 8}
    fitted = _toy_selector(toy, device, slowest)
    problem = toy.problem(N=1024, dtype="float32")
    with closing(Store(tmp_db)) as store:
        store.save_selector(toy, device.hardware_id, fitted.to_dict(), fitted.keys)
        assert untuned_answer(store, toy, problem, device) == ("predicted", slowest)
        result = toy_sweep(store, device, n=1024, strategy="grid", budget=4, finalists=2)
        rows = store.trials(store.kernel_version_id(toy), store.device_id(device), str(toy.key(problem)))
    assert rows[0].config == slowest and rows[1].config == toy.heuristic({}, device)
    reps = sorted((r.reps, config_hash(r.config) == config_hash(slowest)) for r in rows)
    # the two fastest and the selector's pick: 3 first runs plus 3 rounds of 3; the fourth, 3
    # (or, on a machine so loaded that the fastest re-timed slower than the fourth's first
    # time, the fourth re-timed too, beside the fastest: 12 and 21)
    assert [n for n, _ in reps] in ([3, 12, 12, 12], [12, 12, 12, 21]) and (12, True) in reps
    assert result.winner == toy.heuristic({}, device)


class Throttled(Toy):
    """Toy whose every config runs 50 ms slower from its fifth call on (its check and first
    timing are the first four): a GPU whose clock drops at its power cap over a finalist's
    longer replays."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}

    def launch(self, inputs, config):
        h = config_hash(config)
        self.calls[h] = self.calls.get(h, 0) + 1
        if self.calls[h] > 4:
            time.sleep(0.05)
        return super().launch(inputs, config)


def test_a_trial_whose_first_time_beats_the_retimed_finalists_is_retimed_before_it_can_win(tmp_db, device):
    """The finalists' rounds run slower than first timings (as at a GPU's power cap): the trial
    next after them, whose first time is now below theirs, is re-timed beside the fastest
    finalist and loses to it, instead of winning on a first time taken another way."""
    toy = Throttled()
    fast, second, third, slow = ({"A": a, "B": b, "num_warps": 4} for a, b in ((1, 1), (2, 2), (4, 2), (8, 2)))
    problem = toy.problem(N=64, dtype="float32")
    with closing(Store(tmp_db)) as store:
        [result] = run_sweep(
            toy, [problem], store, strategy="grid", candidates=[fast, second, third, slow], finalists=2, device=device
        )
        rows = store.trials(store.kernel_version_id(toy), store.device_id(device), str(toy.key(problem)))
    reps = {config_hash(r.config): r.reps for r in rows}
    # first timings 20, 40, 60, 100 ms; the finalists' rounds 70 and 90: the third (60) is
    # re-timed (110) beside the first, and the slowest (100) is not
    assert reps[config_hash(third)] == 3 + 3 * 3 and reps[config_hash(slow)] == 3
    assert reps[config_hash(fast)] == 3 + 2 * 3 * 3
    assert result.winner == fast
    times = {config_hash(r.config): r.time_ms for r in rows}
    assert times[config_hash(third)] > times[config_hash(fast)] > 0.06


def test_cross_measure_retimes_a_candidate_that_beats_a_finalist_winner_before_it_takes_the_key(tmp_db, device):
    """Cross-measuring gives a candidate a first timing at a key whose winner was timed as a
    finalist, over the longer replays that a GPU at its power cap reads slower: the candidate
    that reads faster is re-timed beside the winner, loses, and the key keeps its winner."""
    winner, other, candidate = ({"A": a, "B": b, "num_warps": 4} for a, b in ((1, 1), (4, 2), (2, 2)))
    tuned, elsewhere = Throttled().problem(N=128, dtype="float32"), Throttled().problem(N=64, dtype="float32")
    with closing(Store(tmp_db)) as store:
        toy = Throttled()
        options = {"strategy": "grid", "device": device, "refit_selector": False}
        run_sweep(toy, [tuned], store, candidates=[winner, other], finalists=2, **options)
        run_sweep(toy, [elsewhere], store, candidates=[candidate], **options)  # the candidate's key
        key, kv, dev = str(toy.key(tuned)), store.kernel_version_id(toy), store.device_id(device)
        before = {config_hash(r.config): r.time_ms for r in store.trials(kv, dev, key)}
        # a fresh process: the candidate's first timing there is unthrottled (40 ms), below the
        # winner's finalist time (70 ms); its re-timing beside the winner is not (90 ms)
        cross_measure(store, Throttled(), device)
        rows = {config_hash(r.config): r for r in store.trials(kv, dev, key)}
        winners = {w.shape_key: w.config for w in store.winners(kernel="toy")}
    assert before[config_hash(winner)] > 0.06
    assert (
        rows[config_hash(candidate)].reps > 3
        and rows[config_hash(candidate)].time_ms > rows[config_hash(winner)].time_ms
    )
    assert winners[key] == winner


def test_an_unreadable_stored_selector_is_passed_over_as_the_runtime_passes_it_over(tmp_db, device):
    toy = Toy()
    fitted = _toy_selector(toy, device, {"A": 8, "B": 3, "num_warps": 8})
    broken = {**fitted.to_dict(), "candidates": "not a list"}
    with closing(Store(tmp_db)) as store:
        store.save_selector(toy, device.hardware_id, broken, fitted.keys)
        with pytest.raises(TunesvcError):
            stored_selector(store, toy, device.hardware_id)
        assert untuned_answer(store, toy, toy.problem(N=1024, dtype="float32"), device) == (
            "heuristic",
            toy.heuristic({}, device),
        )


def test_optuna_study_lives_in_the_store_database_and_resumes(db_url, device, tmp_path):
    """The study sits in the store's own database (SQLite file or PostgreSQL), where Optuna's API
    finds it by name, and a second sweep resumes it rather than starting another."""
    with closing(Store(db_url)) as store:
        first = toy_sweep(store, device, strategy="optuna", budget=4, seed=1)
        url = study_storage(store)
    assert url == resolve_url(db_url)
    assert [p.name for p in tmp_path.iterdir() if "optuna" in p.name] == []  # no NAME.optuna.db beside it
    toy = Toy()
    name = study_name(toy, device, first.shape_key, "optuna")
    assert optuna.get_all_study_names(storage=url) == [name]
    study = optuna.load_study(study_name=name, storage=url)
    measured = {tuple(sorted(t.params.items())) for t in study.trials if t.state.name == "COMPLETE" and t.value < 1e6}
    assert len(measured) == 4
    first = [t.params for t in study.trials]
    with closing(Store(db_url)) as store:
        more = toy_sweep(store, device, strategy="optuna", budget=6, seed=1)
        assert len(store.winners()) == 1  # tunesvc's own tables are unaffected by Optuna's beside them
    assert more.trials_new == 2 and more.trials_stored == 6
    assert optuna.get_all_study_names(storage=url) == [name]
    study = optuna.load_study(study_name=name, storage=url)
    resumed = {tuple(sorted(t.params.items())) for t in study.trials if t.state.name == "COMPLETE" and t.value < 1e6}
    # the same study, resumed: its first trials kept, the 2 new configs added
    assert len(resumed) == 6 and measured < resumed
    assert [t.params for t in study.trials[: len(first)]] == first and len(study.trials) > len(first)


@pytest.mark.parametrize("strategy", ["optuna", "cmaes", "gp"])
def test_every_optuna_strategy_keeps_a_study_of_values_in_the_database(tmp_db, device, strategy):
    """docs/search.md: each Optuna strategy's sweep leaves a study in --db, named for its key and
    strategy, whose trials name the measured configs by their values."""
    pytest.importorskip({"optuna": "optuna", "cmaes": "cmaes", "gp": "scipy"}[strategy])
    with closing(Store(tmp_db)) as store:
        result = toy_sweep(store, device, strategy=strategy, budget=4, seed=0)
        url = study_storage(store)
        configs = [
            r.config for r in store.trials(store.kernel_version_id(Toy()), store.device_id(device), result.shape_key)
        ]
    study = optuna.load_study(study_name=study_name(Toy(), device, result.shape_key, strategy), storage=url)
    complete = [t.params for t in study.trials if t.state.name == "COMPLETE"]
    assert len(complete) == len(configs) == 4 and all(c in complete for c in configs)


def test_a_database_where_optuna_made_a_study_first_takes_a_sweep_and_keeps_the_study(db_url, device):
    """A user ran `optuna create-study` (or optuna-dashboard) on the URL before tunesvc: opening the
    store creates tunesvc's tables beside Optuna's, the sweep's study joins the one already there,
    and Optuna still reads the first study as it was."""
    url = resolve_url(db_url)
    first = optuna.create_study(study_name="made-first", storage=url)
    first.optimize(lambda trial: (trial.suggest_float("x", -1.0, 1.0) - 0.25) ** 2, n_trials=3)
    before = [(t.number, t.params, t.value, t.state) for t in first.trials]
    with closing(Store(db_url)) as store:
        assert (store.revision_found, store.revision) == (None, HEAD)
        result = toy_sweep(store, device, strategy="optuna", budget=3, seed=0)
        assert result.trials_new == 3 and len(store.winners()) == 1
    toy = Toy()
    name = study_name(toy, device, result.shape_key, "optuna")
    assert sorted(optuna.get_all_study_names(storage=url)) == sorted(["made-first", name])
    kept = optuna.load_study(study_name="made-first", storage=url)
    assert [(t.number, t.params, t.value, t.state) for t in kept.trials] == before
    assert len(optuna.load_study(study_name=name, storage=url).trials) >= 3
    with closing(Store(db_url)) as store:  # reopened: at head, nothing to do
        assert (store.revision_found, store.revision) == (HEAD, HEAD)


def test_a_study_in_an_older_optuna_db_file_beside_the_database_is_not_read(tmp_db, device):
    """tunesvc before schema revision 0005 kept studies in NAME.optuna.db: a sweep neither reads
    nor changes it, and its new study in the database learns the stored trials instead."""
    toy = Toy()
    key = str(toy.key(toy.problem(N=64, dtype="float32")))
    old = Path(tmp_db).with_name("test.optuna.db")
    stale = optuna.create_study(study_name=study_name(toy, device, key, "optuna"), storage=f"sqlite:///{old}")
    stale.enqueue_trial({"A": 8, "B": 3, "num_warps": 8})  # would be measured first if this study were resumed
    before = old.read_bytes()
    with closing(Store(tmp_db)) as store:
        toy_sweep(store, device, strategy="grid", budget=3)
        result = toy_sweep(store, device, strategy="optuna", budget=5, seed=1)
        configs = [r.config for r in store.trials(store.kernel_version_id(toy), store.device_id(device), key)]
        url = study_storage(store)
    assert old.read_bytes() == before
    # a resumed study asks its enqueued trial first: the old one would have proposed this config
    assert result.trials_new == 2 and configs[3] != {"A": 8, "B": 3, "num_warps": 8}
    study = optuna.load_study(study_name=study_name(toy, device, key, "optuna"), storage=url)
    told = [t.params for t in study.trials if t.state.name == "COMPLETE"]
    assert all(c in told for c in configs)  # the 3 grid trials were taught to the new study, then 2 more


def test_sweep_rejects_bad_budgets():
    with pytest.raises(TunesvcError, match="--time-budget must be a positive"):
        check_sweep_arguments("optuna", None, time_budget=0)
    with pytest.raises(TunesvcError, match="--patience must be at least 1"):
        check_sweep_arguments("optuna", None, patience=0)


def test_cross_measure_retime_times_every_candidate_once_per_key_in_a_finalist_round(tmp_db, device):
    """With retime, each tuned key's candidates (the missing one first-timed, then all of them)
    are timed again, once, in a finalist's round, and the key is marked: a second call re-times
    nothing."""
    fast, slow = {"A": 1, "B": 1, "num_warps": 4}, {"A": 2, "B": 2, "num_warps": 4}
    toy = Toy()
    problems = [toy.problem(N=n, dtype="float32") for n in (64, 128)]
    with closing(Store(tmp_db)) as store:
        options = {"strategy": "grid", "device": device, "refit_selector": False, "finalists": 0}
        for problem, config in zip(problems, (fast, slow)):  # a winner per key: two candidates
            run_sweep(toy, [problem], store, candidates=[config], **options)
        kv, dev = store.kernel_version_id(toy), store.device_id(device)
        keys = [str(toy.key(p)) for p in problems]

        def reps():
            return {k: {config_hash(r.config): r.reps for r in store.trials(kv, dev, k)} for k in keys}

        swept = reps()
        assert cross_measure(store, toy, device, retime=True) == 2  # each key's missing candidate
        retimed = reps()
        assert store.swept_keys(kv, dev, "cross-retime") == set(keys)
        assert cross_measure(store, toy, device, retime=True) == 0
        assert reps() == retimed  # every key marked: nothing timed again
        winners = {w.shape_key: w.config for w in store.winners(kernel="toy")}
    for k in keys:
        assert set(retimed[k]) == {config_hash(fast), config_hash(slow)}
        [first_timing] = swept[k].values()  # the sweep's one trial: a first timing's repetitions
        # the sweep's winner and the missing candidate: a first timing, then a round each
        assert all(n > first_timing for n in retimed[k].values())
        assert winners[k] == fast  # 20 ms against 40 ms, both timed the same way: it wins both keys


def test_gp_samples_past_its_startup_beside_results_it_did_not_propose(space, candidates):
    # a stored result (or an untried config measured after MAX_MISSES_PER_ASK repeated
    # proposals) is told to GP as a trial it did not propose; such a trial once carried a
    # constraint that GP's own trials lack, and GPSampler stopped the sweep past its startup
    # trials ("The number of constraints must be the same for all trials")
    strategy = make_strategy("gp", space, candidates, seed=0)
    strategy.tell(candidates[5], ok(fake_time(candidates[5])))
    proposed = []
    for _ in range(startup_count(len(candidates)) + 3):
        config = strategy.ask()
        assert config is not None
        strategy.tell(config, ok(fake_time(config)))
        proposed.append(config)
    assert len(set(hashes(proposed + [candidates[5]]))) == len(proposed) + 1
