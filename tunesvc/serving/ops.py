"""The one launch path of the shipped kernels: each family is a ``torch.library`` custom op.

Dynamo cannot trace a Triton launch behind a Python dict lookup; a ``torch.library`` custom op
is opaque to it: the op's fake implementation gives output shapes while tracing, and the real
one (lookup + launch) runs when the compiled graph runs. A family with a backward registers it
on the forward op (``register_autograd``), and the backward calls the family's backward op, so
``torch.compile(fullgraph=True)`` traces forward and backward, and eager autograd works the same.

Outside torch.compile the dispatcher would only add host time per call, so a kernel's entry
(:meth:`KernelOp.call`) calls the op's Python function directly, through a
``torch.autograd.Function`` made of the same setup and backward functions when autograd must
record the call: an eager call does not pay for the dispatcher and the op's per-call checks,
which are taken only while torch.compile traces. A family uses it like this (see
``tunesvc.kernels.rmsnorm``)::

    def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        ...  # look up the tuned config, launch: y and rstd

    rmsnorm_op = kernel_op("rmsnorm", _rmsnorm, lambda x, w, eps: (torch.empty_like(x), x.new_empty(...)))
    rmsnorm_op.register_autograd(backward, setup_context)  # backward calls rmsnorm_bwd_op.call(...)

    def rms_norm(x, w, eps=1e-6):
        y, _ = rmsnorm_op.call(x, w, eps, grad_inputs=(x, w))
        return y

The op's arguments must be types torch.library accepts (tensors, ints, floats, bools, strings,
optionals and lists of them): an explicit config travels as text (:func:`config_arg`). Its
outputs may alias neither its inputs nor each other: a launch that returns views of one buffer
returns the buffer, and the caller takes the views. A hit of the tuned-config lookup does no
host synchronisation, so the op may be captured in a CUDA graph.
"""

from __future__ import annotations

import ast
import functools
import inspect
import types
import typing
from collections.abc import Callable
from collections.abc import Iterable
from typing import TYPE_CHECKING
from typing import Any
from typing import ParamSpec
from typing import TypeVar
from typing import cast

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

from tunesvc.serving.launch import HIT_NAMES
from tunesvc.serving.launch import LaunchPlans
from tunesvc.serving.launch import entry_source

if TYPE_CHECKING:
    from tunesvc.space import Config

_is_compiling = torch.compiler.is_compiling
#: tensors that a trace passes in place of real ones: they have no data for a kernel to read
_TRACED = (FakeTensor, FunctionalTensor)
_is_grad_enabled = torch.is_grad_enabled
P = ParamSpec("P")
R = TypeVar("R")


class KernelOp:
    """``fn`` registered as the custom op ``tunesvc::<name>`` (``.op``); ``.eager`` is the eager path."""

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        fake: Callable[..., Any],
        mutates_args: tuple[str, ...] = (),
        replay: bool = True,
    ) -> None:
        self.name = name
        self.fn = fn
        #: the eager path: ``fn``, its launches replayed per key after the first call (LaunchPlans)
        self.eager: Callable[..., Any] = LaunchPlans(fn) if replay else fn
        self.op = torch.library.custom_op(f"tunesvc::{name}", fn, mutates_args=mutates_args)
        self.op.register_fake(fake)
        self._eager_autograd: type[torch.autograd.Function] | None = None

    def register_autograd(self, backward: Callable[..., Any], setup_context: Callable[..., Any]) -> None:
        """The op's backward (``backward(ctx, *grads)``, ``setup_context(ctx, inputs, output)``),
        for the op and for eager calls alike; it should launch through another op's :meth:`call`
        so that torch.compile traces it too."""
        self.op.register_autograd(backward, setup_context=setup_context)
        fn = self.eager

        # forward(ctx, ...) calls setup_context itself: a Function with its own setup_context
        # binds every call's arguments through inspect.signature: nearly half of an eager call's host time
        def forward(ctx: Any, *args: Any) -> Any:
            output = fn(*args)
            setup_context(ctx, args, output)
            return output

        self._eager_autograd = type(
            f"{self.name}_autograd",
            (torch.autograd.Function,),
            {"forward": staticmethod(forward), "backward": staticmethod(backward)},
        )

    def call(self, *args: Any, grad_inputs: Iterable[torch.Tensor | None] = ()) -> Any:
        """Run the op: through the dispatcher while torch.compile traces; else its function,
        inside the autograd function when grad mode is on and one of ``grad_inputs`` requires grad."""
        # AOTAutograd traces a registered backward outside Dynamo, on fake or functional tensors;
        # a trace replaces every tensor, and every op's first argument is one: one check suffices
        if _is_compiling() or (args and isinstance(args[0], _TRACED)):
            return self.op(*args)
        if self._eager_autograd is not None and _is_grad_enabled():
            for t in grad_inputs:  # a loop, not any(<generator>): no generator frame per call
                if t is not None and t.requires_grad:
                    return self._eager_autograd.apply(*args)
        return self.eager(*args)


def replayed(fn: Callable[P, R]) -> Callable[P, R]:
    """A family's public function whose eager calls replay, per key, what its first call did.

    The key (:class:`tunesvc.serving.launch.LaunchPlans` with ``entry``) is every tensor argument's
    shape, strides, dtype, alignment, device and requires_grad, every other argument's value,
    grad mode, and the current device and stream: a hit skips the function's argument checks,
    its reshapes and the op's own key, and keeps the buffers it computes but does not return
    (layer_norm's mean and rstd, attention's log-sum-exp) as workspaces. A call that autograd
    records, a torch.compile trace and a call it cannot key run the function. ``fn`` takes
    positional-or-keyword and keyword-only parameters only; the wrapper has its signature
    (generated from it, so that a call binds no ``**kwargs``); ``wrapper.plans`` is its plans.
    """
    parameters = list(inspect.signature(fn).parameters.values())
    hints = typing.get_type_hints(fn)  # the annotations of tunesvc's own function, evaluated
    namespace: dict[str, Any] = {"fn": fn, "compiling": _is_compiling}
    header: list[str] = []
    positional: list[str] = []
    keywords: list[str] = []
    for i, p in enumerate(parameters):
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise TypeError(f"replayed: {fn.__name__} has a parameter {p.name} of kind {p.kind.description}")
        if p.kind is p.KEYWORD_ONLY and not keywords:
            header.append("*")
        if p.default is not p.empty:
            namespace[f"d{i}"] = p.default
        header.append(p.name if p.default is p.empty else f"{p.name}=d{i}")
        (keywords if p.kind is p.KEYWORD_ONLY else positional).append(p.name)
    names = positional + keywords
    generated = (
        HIT_NAMES | {"fn", "compiling", "owner_plans", "by_position"} | {n for n in namespace if n.startswith("d")}
    )
    if taken := sorted(generated & set(names)):
        raise TypeError(f"replayed: {fn.__name__}'s parameters {taken} are names its generated body uses")
    call = ", ".join(positional + [f"{k}={k}" for k in keywords])
    source = f"def by_position({', '.join(names)}):\n    return fn({call})\n" if keywords else ""
    exec(compile(source, f"<tunesvc.serving.ops replayed {fn.__name__}>", "exec"), namespace)
    plans = LaunchPlans(namespace.get("by_position", fn), entry=True, kinds=[_kind(hints.get(n)) for n in names])
    hit, reads = entry_source(plans, names)  # reads: the hit path's names, which it updates itself
    reads.update(namespace, owner_plans=plans)
    source = f"def {fn.__name__}({', '.join(header)}):\n    if compiling():\n        return fn({call})\n" + (
        hit or f"    return owner_plans({', '.join(names)})\n"
    )
    exec(compile(source, f"<tunesvc.serving.ops replayed {fn.__name__}>", "exec"), reads)
    wrapper = functools.update_wrapper(reads[fn.__name__], fn)
    wrapper.plans = plans  # type: ignore[attr-defined]
    return cast("Callable[P, R]", wrapper)


def _kind(hint: Any) -> set[type]:
    """The kinds of argument an annotation allows, as LaunchPlans keys them: torch.Tensor, None,
    the scalar classes, and ``object`` for anything else (a config dict: the call is not keyed)."""
    allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds: set[type] = set()
    for a in allowed:
        if a is type(None) or a is None:
            kinds.add(type(None))
        elif a is torch.Tensor or a in (int, float, bool, str):
            kinds.add(a)
        else:
            kinds.add(object)
    return kinds


def kernel_op(
    name: str,
    fn: Callable[..., Any],
    fake: Callable[..., Any],
    mutates_args: tuple[str, ...] = (),
    replay: bool = True,
) -> KernelOp:
    """Register ``fn`` (type-annotated) as ``tunesvc::<name>`` with ``fake`` as its shape function.

    ``replay``: eager calls replay the launches of the first call of their key
    (:class:`tunesvc.serving.launch.LaunchPlans`); False for an op whose launches depend on more than
    its arguments' shapes and scalars, the device and the stream."""
    return KernelOp(name, fn, fake, mutates_args, replay)


def config_arg(config: Config | None) -> str:
    """A config as an op argument: its items as Python literals; "" for the tuned config.

    ``repr`` of a tuple of (str, int | str) pairs is what Dynamo can trace (``json.dumps`` is not).
    """
    return "" if config is None else repr(tuple(config.items()))


def config_of(arg: str) -> Config | None:
    """The config :func:`config_arg` wrote (literals only: nothing is evaluated); None for ""."""
    return dict(_config_items(arg)) if arg else None


@functools.lru_cache(maxsize=256)
def _config_items(arg: str) -> tuple[tuple[str, Any], ...]:
    # a tuple is cached, and each call gets its own dict: a launch may not change another's config
    return tuple(ast.literal_eval(arg))
