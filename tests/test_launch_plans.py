"""Launch plans: an eager call of a shipped op replays the launches of the first call of its key.

Each family runs with fresh random inputs of one shape (the later calls are replays), and every
output and gradient must equal what the ops' own functions compute for the same inputs; calls a
plan cannot replay run the function, and plans are dropped when another runtime answers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import triton
import triton.language as tl
from test_ops import FAMILIES
from test_ops import _run

import tunesvc
import tunesvc.kernels
from tunesvc.serving import launch
from tunesvc.serving.launch import LaunchPlans
from tunesvc.serving.launch import direct_launch
from tunesvc.serving.ops import KernelOp
from tunesvc.serving.ops import kernel_op
from tunesvc.serving.ops import replayed


def _shipped_ops() -> dict[str, KernelOp]:
    """Every op of the shipped families, by name."""
    modules = [m for name, m in sys.modules.items() if name.startswith("tunesvc.kernels.")]
    return {op.name: op for m in modules for op in vars(m).values() if isinstance(op, KernelOp)}


@pytest.fixture(autouse=True)
def heuristic_runtime():
    tunesvc.configure(mode="heuristic")
    yield
    tunesvc.configure(mode="heuristic")


def _unplanned(monkeypatch: pytest.MonkeyPatch, fn: Callable[[], Any]) -> Any:
    with monkeypatch.context() as m:
        m.setattr(LaunchPlans, "active", False)
        return fn()


@pytest.mark.parametrize("autograd", [True, False], ids=["autograd", "no_grad"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_replayed_calls_compute_what_the_functions_compute(family, autograd, monkeypatch):
    """With autograd the op's plan replays inside the autograd function; without it the
    family's function's plan replays (checks, views, dropped statistics and all)."""
    fn, make_inputs, grad = FAMILIES[family]
    with torch.set_grad_enabled(autograd):
        for _ in range(3):  # the first call records; the next two replay, each on fresh inputs
            inputs = make_inputs("cpu")
            replayed = _run(fn, inputs, grad if autograd else ())
            expected = _unplanned(monkeypatch, lambda: _run(fn, inputs, grad if autograd else ()))
            assert len(replayed) == len(expected)
            for got, want in zip(replayed, expected):
                torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_hit_of_a_familys_function_still_refuses_what_its_checks_refuse():
    """The function's key holds every tensor's shape, dtype and device: a call its checks would
    refuse has another key, so it runs the function and gets the checks' sentence."""
    x, w, b = torch.randn(4, 3, 37), torch.randn(37), torch.randn(37)
    for _ in range(3):
        with torch.no_grad():
            tunesvc.kernels.layer_norm(x, w, b)
    with pytest.raises(ValueError, match="weight and bias of shape"):
        tunesvc.kernels.layer_norm(x, torch.randn(36), b)
    with pytest.raises(ValueError, match="float16, bfloat16 or float32"):
        tunesvc.kernels.layer_norm(x.double(), w, b)
    with pytest.raises(ValueError, match="weight and bias of shape"):
        tunesvc.kernels.layer_norm(x, w.to("meta"), b)
    want = torch.nn.functional.layer_norm(x, (37,), w, b)
    torch.testing.assert_close(tunesvc.kernels.layer_norm(x, w, b), want)  # still a hit, still right


def test_a_call_autograd_records_is_never_replayed_by_the_familys_function():
    x, w = torch.randn(5, 37, requires_grad=True), torch.randn(37)
    plans = tunesvc.kernels.rms_norm.plans
    for _ in range(3):
        y = tunesvc.kernels.rms_norm(x, w)
        assert y.grad_fn is not None  # autograd recorded it, every time
    assert [plans.refusals.get(k) for k, v in plans.plans.items() if v is None] == ["autograd records it"]
    with torch.no_grad():
        for _ in range(2):
            assert tunesvc.kernels.rms_norm(x, w).grad_fn is None
    assert sum(plan is not None for plan in plans.plans.values()) == 1


def test_an_unkeyed_argument_runs_the_function_and_later_calls_still_replay():
    x = torch.randn(5, 37)
    config = {"BLOCK_M": 2, "BLOCK_N": 64, "num_warps": 1, "num_stages": 1}
    plans = tunesvc.kernels.softmax.plans
    with torch.no_grad():
        for explicit in (None, config, None, config, None):
            torch.testing.assert_close(tunesvc.kernels.softmax(x, config=explicit), torch.softmax(x, -1))
        planned = dict(plans.plans)
        for explicit in (config, None, None):  # the config is never recorded; None hits the plan made above
            torch.testing.assert_close(tunesvc.kernels.softmax(x, config=explicit), torch.softmax(x, -1))
    assert plans.plans == planned and all(plan is not None for plan in planned.values())


def test_a_view_the_family_returns_is_made_again_from_each_replays_buffer():
    """layer_norm returns its (M, N) result viewed as x's shape, and keeps mean and rstd (not
    returned) as the plan's workspaces: a replay allocates one buffer."""
    w, b = torch.randn(37), torch.randn(37)
    with torch.no_grad():
        outs = [tunesvc.kernels.layer_norm(x := torch.randn(2, 3, 37), w, b) for _ in range(3)]
        torch.testing.assert_close(outs[-1], torch.nn.functional.layer_norm(x, (37,), w, b))
    assert len({y.data_ptr() for y in outs}) == 3 and outs[-1].shape == (2, 3, 37)
    (plan,) = [p for p in tunesvc.kernels.layer_norm.plans.plans.values() if p is not None]
    assert plan.source.count("empty") == 1, plan.source


def test_every_forward_but_dropout_has_a_plan_after_one_call():
    """Without autograd, the family's function has a plan (its checks and views are skipped on a
    hit); with it, the autograd function's forward replays the op's plan."""
    for fn, make_inputs, grad in FAMILIES.values():
        with torch.no_grad():
            fn(*make_inputs("cpu"))
        _run(fn, make_inputs("cpu"), grad)
    entries = [getattr(tunesvc.kernels, name) for name in tunesvc.kernels.__all__ if name != "dropout"]
    assert len(entries) >= 7 and not hasattr(tunesvc.kernels.dropout, "plans")
    for entry in entries:
        plans = entry.plans
        assert any(plan is not None for plan in plans.plans.values()), f"{entry.__name__}: {plans.refusals}"
    ops = _shipped_ops()
    assert not isinstance(ops["dropout"].eager, LaunchPlans)  # its seed is an argument: a plan per call
    differentiable = [op for name, op in ops.items() if name + "_bwd" in ops and name != "dropout"]
    assert len(differentiable) >= 5
    for op in differentiable:
        plans = op.eager
        assert isinstance(plans, LaunchPlans)
        assert any(plan is not None for plan in plans.plans.values()), f"{op.name}: {plans.refusals}"


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * scale, mask=mask)


_scale = direct_launch(_scale_kernel)


def _scale_rows(x: torch.Tensor, scale: float) -> torch.Tensor:
    y = torch.empty_like(x)
    _scale[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), scale, BLOCK=64)
    return y


def _twice_then_sum(x: torch.Tensor, scale: float) -> torch.Tensor:
    y = _scale_rows(x, scale)
    return y + x  # an op a replay would skip: no plan


def _view_of_argument(x: torch.Tensor, scale: float) -> torch.Tensor:
    y = torch.empty_like(x[1:])
    _scale[(triton.cdiv(y.numel(), 64),)](x[1:], y, y.numel(), scale, BLOCK=64)
    return y


def _pair(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _scale_rows(x, 1.0), _scale_rows(y, 2.0)


_pair_op = kernel_op("_plans_pair", _pair, lambda x, y: (torch.empty_like(x), torch.empty_like(y)))
_scale_op = kernel_op("_plans_scale", _scale_rows, lambda x, scale: torch.empty_like(x))
_sum_op = kernel_op("_plans_sum", _twice_then_sum, lambda x, scale: torch.empty_like(x))
_view_op = kernel_op("_plans_view", _view_of_argument, lambda x, scale: torch.empty_like(x[1:]))


def test_a_plan_reads_each_calls_arguments_and_scalars_are_part_of_its_key():
    x = torch.randn(37, 3)
    torch.testing.assert_close(_scale_op.call(x, 2.0), 2.0 * x)
    plans = _scale_op.eager
    assert isinstance(plans, LaunchPlans) and len(plans.plans) == 1
    for scale in (2.0, 2.0, -0.5):
        x = torch.randn(37, 3)
        torch.testing.assert_close(_scale_op.call(x, scale), scale * x)
    assert len(plans.plans) == 2  # one per scale
    # other strides: another key, the right answer
    x = torch.randn(3, 37).T
    torch.testing.assert_close(_scale_op.call(x.contiguous(), 3.0), 3.0 * x)


def test_a_view_of_an_argument_is_taken_again_from_each_calls_argument():
    for _ in range(3):
        x = torch.randn(11, 5)
        torch.testing.assert_close(_view_op.call(x, 1.5), 1.5 * x[1:])
    assert all(plan is not None for plan in _view_op.eager.plans.values())


def test_a_call_that_runs_other_ops_is_never_replayed():
    for _ in range(LaunchPlans.tries + 2):
        x = torch.randn(37)
        torch.testing.assert_close(_sum_op.call(x, 2.0), 3.0 * x)
    plans = _sum_op.eager
    assert list(plans.plans.values()) == [None]
    assert list(plans.refusals.values()) == ["it runs aten.add.Tensor"]


def test_one_tensor_given_twice_is_not_replayed_for_two():
    x = torch.randn(40)
    torch.testing.assert_close(_pair_op.call(x, x), (x, 2.0 * x))
    assert list(_pair_op.eager.refusals.values()) == ["one tensor is given as two arguments"]
    for _ in range(2):  # records, then replays: each argument read from its own place
        a, b = torch.randn(40), torch.randn(40)
        torch.testing.assert_close(_pair_op.call(a, b), (a, 2.0 * b))


def test_plans_are_dropped_when_another_runtime_answers():
    x = torch.randn(37, 3)
    _scale_op.call(x, 4.0)
    plans = _scale_op.eager
    assert plans.plans
    tunesvc.configure(mode="heuristic")
    _scale_op.call(x, 4.0)  # records again, for the new runtime
    assert len(plans.plans) == 1 and plans._runtime is tunesvc.serving.runtime._default


def test_a_plan_keeps_neither_the_arguments_nor_the_results_of_the_call_it_recorded():
    """A plan holds its kept workspaces, not the recorded call's tensors: a process that sees a
    new shape per call would otherwise pin each first call's activations."""
    import gc
    import weakref

    with torch.no_grad():
        for fn, make_inputs, _ in FAMILIES.values():
            inputs = make_inputs("cpu")
            out = fn(*inputs)
            outs = out if isinstance(out, tuple) else (out,)
            held = [weakref.ref(t) for t in (*inputs, *outs) if isinstance(t, torch.Tensor)]
            del inputs, out, outs
            gc.collect()
            assert not [ref for ref in held if ref() is not None], fn.__name__
    plans = [
        p
        for name in tunesvc.kernels.__all__
        if name != "dropout"
        for p in getattr(tunesvc.kernels, name).plans.plans.values()
    ]
    assert plans and all(p is None or (p.arguments == () and p.allocations == {}) for p in plans)


needs_guards = pytest.mark.skipif(
    getattr(launch._GUARDS, "TensorGuards", None) is None, reason="this torch has no compiled tensor guards"
)


@needs_guards
def test_the_last_plan_is_replayed_only_for_a_call_its_guards_and_key_pass():
    """The hit path tries the plan it found last first: for the same layout and scalars it is
    taken; a tensor of another shape, strides or dtype, an address of another alignment, or
    another scalar each finds its own plan, calls alternating between them."""
    base = torch.randn(6, 40)
    variants = [
        base,
        torch.randn(6, 41),
        torch.randn(40, 6).t(),  # (6, 40) with other strides
        torch.randn(6, 40, dtype=torch.float64),
        torch.randn(6 * 40 + 1)[1:].view(6, 40),  # same layout, address 4 bytes past 16
    ]
    plans = _scale_op.eager
    assert isinstance(plans, LaunchPlans)
    with torch.no_grad():
        for _ in range(3):
            for x in variants:
                for scale in (2.0, 3):
                    torch.testing.assert_close(_scale_op.call(x, scale), scale * x)
                    assert plans.last is not None and plans.last.guards.check(x)
                    assert plans.last.rest[2:] == (x.data_ptr() & 15, type(scale), scale)
    assert len(plans.plans) == 2 * len(variants) and all(p is not None for p in plans.plans.values())
    for x in variants:  # exactly one plan passes each call's guards and the rest of its key
        taking = [
            p for p in plans.plans.values() if p.guards.check(x) and p.rest[2:] == (x.data_ptr() & 15, float, 2.0)
        ]
        assert len(taking) == 1


@needs_guards
def test_a_familys_function_takes_its_last_plan_only_for_the_same_layout():
    """softmax's public function keeps its last plan's guards: float16 and float32 inputs of one
    shape, and two shapes, alternate without one replaying the other's launch."""
    xs = [torch.randn(5, 37), torch.randn(5, 37).half(), torch.randn(5, 38), torch.randn(3, 5, 37)]
    with torch.no_grad():
        for _ in range(3):
            for x in xs:
                torch.testing.assert_close(tunesvc.kernels.softmax(x), torch.softmax(x.float(), -1).to(x.dtype))
                assert tunesvc.kernels.softmax.plans.last.guards.check(x)
        before = list(tunesvc.kernels.softmax.plans.plans.values())
        tunesvc.configure(mode="heuristic")  # another runtime: the plans and the last one go
        tunesvc.kernels.softmax(xs[0])
    plans = tunesvc.kernels.softmax.plans
    assert len(before) == len(xs) and len(plans.plans) == 1 and all(plans.last is not p for p in before)


def _maybe_scaled(x: torch.Tensor, other: torch.Tensor | None, scale: float | None) -> torch.Tensor:
    return _scale_rows(x if other is None else other, 1.0 if scale is None else scale)


_maybe_op = kernel_op("_plans_maybe", _maybe_scaled, lambda x, other, scale: torch.empty_like(x))


def test_an_argument_that_is_sometimes_none_is_keyed_either_way():
    x, other = torch.randn(50), torch.randn(50)
    for _ in range(2):
        for args, want in (((x, None, None), x), ((x, other, None), other), ((x, None, 3.0), 3.0 * x)):
            torch.testing.assert_close(_maybe_op.call(*args), want)
    plans = _maybe_op.eager
    assert isinstance(plans, LaunchPlans)
    assert len(plans.plans) == 3 and all(plan is not None for plan in plans.plans.values())


def test_a_tune_on_miss_sweep_is_not_part_of_the_recorded_call(tmp_path):
    """Mode 'tune' sweeps a missed key inside the first call: outside the recording (its ops are
    the sweep's), so that first call still becomes the key's plan, and the next replays it."""
    tunesvc.configure(db=str(tmp_path / "tune.db"), mode="tune", budget=2)
    x = torch.randn(7, 45)
    torch.testing.assert_close(tunesvc.kernels.softmax(x), torch.softmax(x, -1))
    plans = tunesvc.kernels.softmax.plans
    assert [plan is not None for plan in plans.plans.values()] == [True], plans.refusals
    assert tunesvc.serving.runtime.default_runtime().stats()["softmax"] == {"tuned": 1}
    x = torch.randn(7, 45)
    torch.testing.assert_close(tunesvc.kernels.softmax(x), torch.softmax(x, -1))


def test_an_op_keeps_at_most_its_cap_of_plans(monkeypatch):
    monkeypatch.setattr(LaunchPlans, "most", 2)
    plans = _scale_op.eager
    assert isinstance(plans, LaunchPlans)
    x = torch.randn(37)
    for scale in (1.5, 2.5, 3.5, 3.5):  # the third key finds the cap: the function runs, unrecorded
        torch.testing.assert_close(_scale_op.call(x, scale), scale * x)
    assert len(plans.plans) == 2 and not plans.refusals


def _with_workspace(x: torch.Tensor) -> torch.Tensor:
    tmp = torch.empty_like(x)
    _scale[(triton.cdiv(x.numel(), 64),)](x, tmp, x.numel(), 2.0, BLOCK=64)
    y = torch.empty_like(x)
    _scale[(triton.cdiv(x.numel(), 64),)](tmp, y, x.numel(), 3.0, BLOCK=64)
    return y


_workspace_op = kernel_op("_plans_workspace", _with_workspace, lambda x: torch.empty_like(x))


@pytest.mark.parametrize(("budget", "allocations"), [(64 << 20, 1), (0, 2)])
def test_a_workspace_is_kept_with_the_plan_within_the_ops_budget(budget, allocations, monkeypatch):
    """The buffer a call allocates and drops is the plan's own while the op's workspace budget
    lasts; past it each replay allocates it again. Either way each replay computes the right answer."""
    monkeypatch.setattr(LaunchPlans, "workspace", budget)
    for _ in range(3):
        x = torch.randn(100)
        torch.testing.assert_close(_workspace_op.call(x), 6.0 * x)
    plans = _workspace_op.eager
    assert isinstance(plans, LaunchPlans)
    (plan,) = plans.plans.values()
    assert plan is not None and plan.source.count("= empty") == allocations, plan.source
    assert plans.kept == (400 if allocations == 1 else 0)


def _doubled_transposed(x: torch.Tensor) -> torch.Tensor:
    """2 x^T for a contiguous x, in a buffer with x's strides: the result's strides are those of no argument."""
    y = torch.empty_like(x).t()
    _scale[(triton.cdiv(x.numel(), 64),)](x, y.t(), x.numel(), 2.0, BLOCK=64)
    return y


_transposed_op = kernel_op("_plans_transposed", _doubled_transposed, lambda x: torch.empty_like(x).t())


@pytest.mark.skipif("cpu" not in launch._ALLOCATORS, reason="this torch has no Inductor allocator for the CPU")
def test_a_replay_allocates_through_inductors_allocator_with_the_recorded_layout():
    """Where torch has Inductor's allocator for the device type, a replay's buffers come from it
    (no argument parsing) with the size, strides and dtype the function's own buffers had."""
    for dtype in (torch.float32, torch.float16):
        first = _transposed_op.call(torch.randn(3, 5).to(dtype))
        x = torch.randn(3, 5).to(dtype)
        again = _transposed_op.call(x)
        layout = (again.shape, again.stride(), again.dtype, again.device)
        assert layout == (first.shape, first.stride(), first.dtype, first.device) == ((5, 3), (1, 5), dtype, x.device)
        assert again.data_ptr() != first.data_ptr()
        torch.testing.assert_close(again, 2.0 * x.t())
    plans = _transposed_op.eager
    assert isinstance(plans, LaunchPlans)
    sources = [p.source for p in plans.plans.values() if p is not None]
    assert len(sources) == 2 and all(s.count("= empty_fast(") == 1 for s in sources), sources


def test_a_family_function_may_not_name_a_parameter_as_its_generated_body_does():
    def scaled(x: torch.Tensor, stream: float) -> torch.Tensor:
        return x * stream

    with pytest.raises(TypeError, match=r"\['stream'\] are names its generated body uses"):
        replayed(scaled)
