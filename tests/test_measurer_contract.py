"""The measuring protocol's contract (tunesvc.bench.Measurer), run over every implementation that
runs on the CPU interpreter: Bench (in this process), Worker (a Bench in a child process) and
capture's CaptureBench (a triton.autotune kernel's listed configs on one call's own tensors).

Each rule of the Measurer docstring is a test here: a correct config is OK with a time, a wrong
one WRONG_RESULT with its relative error and no time, one that fails to compile or launch an
error status (never an exception), the same inputs for every candidate (a kernel that
accumulates into its output is judged on one call), the measurer goes on after a failure, the
torch peer's absence is INVALID, and close may be called twice. A test fails when a Measurer
subclass in tunesvc is not run here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

import tunesvc
import tunesvc._capture
from tunesvc import Status
from tunesvc.bench import Bench
from tunesvc.bench import Measurement
from tunesvc.bench import Measurer
from tunesvc.bench import Worker
from tunesvc.kernels.matmul import MatmulTemplate

SHAPE = {"M": 20, "N": 33, "K": 20, "dtype": "float32"}
GOOD = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2}
#: correct as well: a second candidate measured between two of GOOD
OTHER = {**GOOD, "BLOCK_M": 32}
#: the contract template scales its output by 1.5 for BLOCK_N=64
WRONG = {**GOOD, "BLOCK_N": 64}
#: the contract template raises for 3 stages, as a launch that fails
FAILS = {**GOOD, "num_stages": 3}
#: one tile-row: breaks "group"; 64 > next_pow2(20): "tile_m"
INFEASIBLE = {**GOOD, "GROUP_M": 8, "BLOCK_M": 64}


class ContractMatmul(MatmulTemplate):
    """The shipped matmul, wrong for BLOCK_N=64, failing for 3 stages, and without a torch peer
    (module level: a Worker's child unpickles it by name)."""

    space_path = tunesvc.get_template("matmul").space_path

    def launch(self, inputs, config):
        if config.get("num_stages") == 3:
            raise RuntimeError("launch failed\nsecond line")
        out = super().launch(inputs, config)
        return out * 1.5 if config.get("BLOCK_N") == 64 else out

    def peer(self, inputs):
        return None


@triton.jit
def accumulate(x_ptr, out_ptr, n, OFFSET: tl.constexpr, BLOCK: tl.constexpr):
    """out += x + OFFSET: in place, so a candidate run on another's output is off by x."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(out_ptr + offs, mask=mask) + tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, acc + OFFSET, mask=mask)


CAPTURE_CONFIGS = {
    "good": triton.Config({"BLOCK": 16, "OFFSET": 0}),
    "other": triton.Config({"BLOCK": 32, "OFFSET": 0}),
    "wrong": triton.Config({"BLOCK": 16, "OFFSET": 5}),
    "fails": triton.Config({"BLOCK": 24, "OFFSET": 0}),  # tl.arange of a length that is no power of 2
}


@dataclasses.dataclass
class Case:
    """A measurer and its configs: correct (two), wrong, failing, and infeasible where it checks constraints."""

    measurer: Measurer
    good: Any
    other: Any
    wrong: Any
    fails: Any
    infeasible: Any | None


def _bench(device) -> Case:
    template = ContractMatmul()
    return Case(Bench(template, template.problem(**SHAPE), device), GOOD, OTHER, WRONG, FAILS, INFEASIBLE)


def _worker(device) -> Case:
    template = ContractMatmul()
    worker = Worker(template, template.problem(**SHAPE), device, timeout_s=60.0)
    return Case(worker, GOOD, OTHER, WRONG, FAILS, INFEASIBLE)


def _capture(device) -> Case:
    tuner = triton.autotune(configs=list(CAPTURE_CONFIGS.values()), key=["n"])(accumulate)
    n = 40
    x, out = torch.randn(n), torch.randn(n)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
    bench = tunesvc._capture.CaptureBench(tuner, device, (x, out, n), {"grid": grid, "warmup": False}, tolerance=1e-5)
    c = CAPTURE_CONFIGS
    return Case(bench, c["good"], c["other"], c["wrong"], c["fails"], None)


#: every Measurer on the CPU interpreter, by the name a test id shows
MEASURERS = {Bench: _bench, Worker: _worker, tunesvc._capture.CaptureBench: _capture}


@pytest.fixture(params=list(MEASURERS), ids=lambda cls: cls.__name__)
def case(request, device) -> Iterator[Case]:
    made = MEASURERS[request.param](device)
    with made.measurer:
        made.measurer.wait_ready()
        yield made


def assert_ok(m: Measurement) -> None:
    assert m.status is Status.OK, m
    assert m.time_ms is not None and m.time_ms > 0
    assert m.reps >= 1 and m.spread is not None and m.spread >= 0
    assert m.rel_error is not None and m.rel_error < 1e-5
    assert m.message is not None and m.message.startswith("timed: "), m.message  # how it was timed


def assert_failed(m: Measurement, *statuses: Status) -> None:
    assert m.status in statuses, m
    assert not m.ok and m.time_ms is None
    assert m.message and "\n" not in m.message


# -- coverage ---------------------------------------------------------------------------------
def _subclasses(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in {direct, *_subclasses(direct)}}


def test_every_measurer_is_run_by_this_suite():
    ours = {cls for cls in _subclasses(Measurer) if cls.__module__.startswith("tunesvc.")}
    missing = sorted(cls.__qualname__ for cls in ours - MEASURERS.keys())
    assert not missing, f"Measurer subclasses this contract suite does not run (add them to MEASURERS): {missing}"


def test_the_protocol_states_its_rules():
    rules = Measurer.__doc__ or ""
    for rule in ("Failures are statuses", "Checked, then timed", "Same inputs for every candidate", "Peer", "Close"):
        assert rule in rules, rule


# -- the rules, each measurer -----------------------------------------------------------------
def test_a_correct_config_is_ok_with_a_time(case):
    assert_ok(case.measurer.measure(case.good))
    assert_ok(case.measurer.measure(case.other))


def test_configs_timed_together_get_one_measurement_each_in_order(case):
    assert_ok(case.measurer.measure(case.good))
    assert_ok(case.measurer.measure(case.other))
    together = case.measurer.time_together([case.good, case.other, case.good])
    assert len(together) == 3
    for m in together:
        assert m.status is Status.OK and m.time_ms is not None and m.time_ms > 0, m
        assert m.spread is not None and m.spread >= 0 and m.reps >= 1
    assert case.measurer.time_together([]) == []


def test_a_wrong_config_is_wrong_result_with_its_error_and_no_time(case):
    assert_ok(case.measurer.measure(case.good))  # a capture's reference is the first valid config's output
    m = case.measurer.measure(case.wrong)
    assert_failed(m, Status.WRONG_RESULT)
    assert m.rel_error is not None and m.rel_error > 1e-2 and m.reps == 0


def test_a_config_that_fails_to_compile_or_launch_is_a_status_not_an_exception(case):
    assert_failed(case.measurer.measure(case.fails), Status.COMPILE_ERROR, Status.ERROR)
    assert_ok(case.measurer.measure(case.good))  # goes on after a failure


def test_an_infeasible_config_is_invalid_and_never_launched(case):
    if case.infeasible is None:
        pytest.skip("a captured kernel's candidates are its own listed configs: no constraints to break")
    m = case.measurer.measure(case.infeasible)
    assert_failed(m, Status.INVALID)
    assert "group" in (m.message or "") and "tile_m" in (m.message or "")


def test_every_candidate_sees_the_same_inputs(case):
    """Measured again after others (an in-place capture kernel among them), a config gives the same answer."""
    first = case.measurer.measure(case.good)
    for config in (case.other, case.wrong, case.fails, case.other):
        case.measurer.measure(config)
    again = case.measurer.measure(case.good)
    assert_ok(first)
    assert_ok(again)
    assert again.rel_error == pytest.approx(first.rel_error, abs=1e-7)
    assert case.measurer.measure(case.wrong).status is Status.WRONG_RESULT


def test_time_only_retimes_a_checked_config(case):
    assert_ok(case.measurer.measure(case.good))
    m = case.measurer.time_only(case.good, rep_ms=5.0)
    assert m.status is Status.OK and m.time_ms is not None and m.time_ms > 0 and m.reps >= 1


def test_no_torch_peer_is_invalid_never_an_exception(case):
    assert_failed(case.measurer.time_peer(), Status.INVALID)


def test_close_may_be_called_twice(case):
    assert_ok(case.measurer.measure(case.good))
    case.measurer.close()
    case.measurer.close()
