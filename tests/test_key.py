"""One key's tuning (tunesvc.tuning.key): the one finalist rule, and KeyTuning's record, re-time
and winner on a real store and a real in-process measurer (the Triton interpreter's device)."""

from __future__ import annotations

import time
from contextlib import closing

import torch

from tunesvc import Space
from tunesvc import config_hash
from tunesvc.bench import Bench
from tunesvc.bench import Measurement
from tunesvc.bench import Status
from tunesvc.store import Store
from tunesvc.template import ShapeKey
from tunesvc.template import Template
from tunesvc.tuning.key import Finalists
from tunesvc.tuning.key import KeyTuning
from tunesvc.tuning.key import first_pass
from tunesvc.tuning.sweep import run_sweep


class Sleepy(Template):
    """y = 2x, a config's launch sleeping 20 ms per unit of A: times that are the config's, far
    apart beside the sleep's jitter on a loaded machine."""

    name = "sleepy"
    dims = ("N",)
    dtypes = ("float32",)
    space = Space.from_dict({"params": {"A": [1, 2, 3, 4]}, "launch": {"num_warps": [4]}})

    def key(self, problem):
        return ShapeKey.make({"N": problem["N"]}, {"dtype": problem["dtype"]})

    def make_inputs(self, problem, device):
        return torch.randn(problem["N"])

    def launch(self, inputs, config):
        time.sleep(config["A"] * 2e-2)
        return inputs * 2

    def reference(self, inputs):
        return inputs.double() * 2

    def heuristic(self, problem, device):
        return {"A": 1, "num_warps": 4}


def configs(*values):
    return [{"A": a, "num_warps": 4} for a in values]


def ok(ms, spread=0.0):
    return Measurement(Status.OK, time_ms=ms, spread=spread, reps=1)


def test_the_window_and_the_count_bound_the_contenders():
    assert Finalists(3).contenders([1.0, 1.5, 9.0, None]) == 3  # no window: the count alone
    assert Finalists(2).contenders([1.0, 1.5, 9.0]) == 2
    # the noise rule: those within the noise of the fastest, CONTENDER_FLOOR (3%) at least
    assert Finalists(3, noise=True).contenders([1.0, 1.02, 1.5, 9.0, None]) == 2
    assert Finalists(3, noise=True).contenders([1.0, 1.3, 2.0], [0.2, 0.2, 0.2]) == 2  # within 20% + 20%
    assert Finalists(1, noise=True).contenders([1.0, 1.01]) == 1
    assert Finalists(3, window=0.05).contenders([1.03, 1.0, 1.2]) == 2
    assert Finalists(3, window=0.05).contenders([None, None]) == 0
    assert Finalists(0).contenders([1.0, 2.0]) == 0


def _winner_of(store, template, device, problem, measured, **options):
    """The winner a KeyTuning stores from ``measured``: (config, measurement)s recorded in that order."""
    tuning = _key(store, template, device, problem, strategy="test", **options)
    tuning.record([(c, config_hash(c), m) for c, m in measured])
    outcome = tuning.finish(0.0)
    assert outcome.winner is not None
    return outcome.winner.config


def test_a_tie_goes_to_the_served_answer_then_the_heuristic_whatever_the_order_measured(tmp_path, device):
    template = Sleepy()
    problem = template.problem(N=16, dtype="float32")
    a, b, c = configs(1, 2, 3)
    cases = [
        # (served, heuristic, measurements, winner): b is 3% slower than a, inside a's 5% noise
        (b, None, [(a, ok(1.0, 0.05)), (b, ok(1.03, 0.05)), (c, ok(2.0))], b),
        (None, c, [(a, ok(1.0, 0.05)), (b, ok(1.04, 0.05)), (c, ok(1.02, 0.05))], c),
        # outside the fastest's interval (1% noise at least): the fastest, whoever was served
        (b, c, [(a, ok(1.0, 0.001)), (b, ok(1.03, 0.001)), (c, ok(1.02, 0.001))], a),
        # the served answer failed: the tie is the heuristic's
        (b, c, [(a, ok(1.0, 0.05)), (b, Measurement(Status.WRONG_RESULT, rel_error=1.0)), (c, ok(1.01))], c),
    ]
    for i, (served, heuristic, measured, expected) in enumerate(cases):
        for order, rows in enumerate((measured, measured[::-1])):
            with closing(Store(tmp_path / f"tie-{i}-{order}.db")) as store:
                got = _winner_of(store, template, device, problem, rows, served=served, heuristic=heuristic)
            assert got == expected, (i, order)


def test_a_tie_neither_served_nor_the_heuristic_goes_to_the_cheaper_config():
    from tunesvc.tuning.key import config_cost
    from tunesvc.tuning.key import tie_break

    small = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    big = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3}
    deep = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 4}
    assert config_cost(small) < config_cost(big) < config_cost(deep)
    ordered = sorted([deep, big, small], key=lambda c: tie_break(c, config_hash(c), None, None))
    assert ordered == [small, big, deep]
    # the served answer comes before the heuristic, both before the cheaper
    first = min([small, big, deep], key=lambda c: tie_break(c, config_hash(c), deep, big))
    assert first == deep


def test_a_tied_winner_replaces_a_stored_faster_one_only_within_the_noise(tmp_db, device):
    template = Sleepy()
    problem = template.problem(N=16, dtype="float32")
    a, b = configs(1, 2)
    with closing(Store(tmp_db)) as store:
        assert _winner_of(store, template, device, problem, [(a, ok(1.0, 0.05))]) == a
        # b, served and tied with a, takes the key; the stored winner a is within its noise
        assert _winner_of(store, template, device, problem, [(b, ok(1.03, 0.05))], served=b) == b


def _key(store, template, device, problem, **options):
    kv_id, device_id = store.kernel_version_id(template), store.device_id(device)
    return KeyTuning(store, kv_id, device_id, str(template.key(problem)), problem=dict(problem), **options)


def test_the_served_answer_is_retimed_beside_the_fastest_and_reported_with_the_winner(tmp_db, device):
    template = Sleepy()
    problem = template.problem(N=16, dtype="float32")
    fast, middle, slow = configs(1, 2, 4)
    with closing(Store(tmp_db)) as store:
        tuning = _key(store, template, device, problem, strategy="test", served=slow, finalists=Finalists(1))
        bench = Bench(template, problem, device)
        ids = tuning.record(tuning.measure(bench, [fast, middle, slow]))
        assert all(i is not None for i in ids) and tuning.new == 3
        first = {r.config_hash: r.reps for r in tuning.trials()}
        assert [r.config_hash for r in tuning.chosen()] == [config_hash(fast), config_hash(slow)]
        retimed = dict(tuning.retime(bench))
        outcome = tuning.finish(1.0)
        rows = {r.config_hash: r for r in tuning.trials()}
    # the fastest and the served answer, each re-timed in three rounds; the middle one not
    assert rows[config_hash(fast)].id in retimed and rows[config_hash(slow)].id in retimed
    assert rows[config_hash(middle)].reps == first[config_hash(middle)]
    assert rows[config_hash(slow)].reps > first[config_hash(slow)]
    assert outcome.winner is not None and outcome.winner.config == fast
    assert outcome.served == slow and outcome.served_measurement is not None
    assert outcome.served_measurement.time_ms > outcome.winner_measurement.time_ms
    assert outcome.served_measurement.spread is not None and outcome.served_measurement.spread >= 0


def test_nothing_is_retimed_where_fewer_than_two_trials_qualify(tmp_db, device):
    template = Sleepy()
    problem = template.problem(N=16, dtype="float32")
    fast, slow = configs(1, 3)
    with closing(Store(tmp_db)) as store:
        # no finalists, and the served answer alone: nothing to compare it with
        tuning = _key(store, template, device, problem, strategy="test", served=slow, finalists=Finalists(0))
        bench = Bench(template, problem, device)
        tuning.record(tuning.measure(bench, [fast, slow]))
        assert tuning.retime(bench) == []


def test_a_remeasure_replaces_stored_trials_and_opens_no_sweep_without_new_ones(tmp_db, device):
    template = Sleepy()
    problem = template.problem(N=16, dtype="float32")
    fast, slow = configs(1, 3)
    with closing(Store(tmp_db)) as store:
        tuning = _key(store, template, device, problem, strategy="test")
        tuning.record([(fast, config_hash(fast), ok(1.0)), (slow, config_hash(slow), ok(2.0))])
        tuning.finish(0.0)
        # measured again: the slow config is now the faster; its stored trial takes the measurement
        again = _key(store, template, device, problem, strategy="again", replace=True)
        assert again.record([(slow, config_hash(slow), ok(0.5))]) == [None]
        outcome = again.finish(0.0)
        rows = again.trials()
        kv_id, device_id = store.kernel_version_id(template), store.device_id(device)
        assert store.swept_keys(kv_id, device_id, "again") == set()  # no new trial: no sweep row
    assert len(rows) == 2 and again.new == 0
    assert outcome.winner is not None and outcome.winner.config == slow and outcome.winner.time_ms == 0.5


def test_the_first_pass_checks_before_it_times(device):
    class Wrong(Sleepy):
        def launch(self, inputs, config):
            out = super().launch(inputs, config)
            return out + 1 if config["A"] == 2 else out

    template = Wrong()
    bench = Bench(template, template.problem(N=16, dtype="float32"), device)
    right, wrong = first_pass(bench, configs(1, 2))
    assert right.ok and right.time_ms > 0
    assert wrong.status is Status.WRONG_RESULT and wrong.time_ms is None


def test_a_sweeps_finalist_window_leaves_the_far_ones_with_their_first_time(tmp_db, device):
    """finalists=3, finalist_window=1.5: of first times 20, 40 and 80 ms, the two within 2.5x of
    the fastest are re-timed (the fastest is also the untuned answer, the heuristic), the third not."""
    template = Sleepy()
    problem = template.problem(N=16, dtype="float32")
    fast, near, far = configs(1, 2, 4)
    with closing(Store(tmp_db)) as store:
        [result] = run_sweep(
            template,
            [problem],
            store,
            candidates=[fast, near, far],
            finalists=3,
            finalist_window=1.5,
            device=device,
            refit_selector=False,
        )
        reps = {
            r.config_hash: r.reps
            for r in store.trials(store.kernel_version_id(template), store.device_id(device), result.shape_key)
        }
    assert reps[config_hash(far)] == 3  # its three first runs alone
    assert reps[config_hash(fast)] == reps[config_hash(near)] == 3 + 3 * 3
    assert result.winner == fast
