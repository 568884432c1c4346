"""Launch state of the shipped kernels: Triton's allocator in every thread, and a direct launch
of the already compiled kernel on a hit.

Triton keeps its allocator (``triton.set_allocator``, the scratch memory that on-device tensor
descriptors need) in a :class:`contextvars.ContextVar`: each thread, and each asyncio task made
before it was set, starts without one. The autograd engine runs a backward on its own thread, so
an allocator set once per process leaves a TMA backward with "no allocator was set". The flag
that says "set here" is a ContextVar too, so it is exactly as local as Triton's own setting.

``JITFunction.run`` binds and specialises every argument, builds a cache-key string and checks
the kernel's globals on every call: most of a launch's host time for a kernel with twenty
arguments. :class:`DirectLaunch` does that once per (device, argument specialisation,
constexprs, options), keeps the ``CompiledKernel`` that Triton chose, and afterwards calls its
launcher (``CompiledKernel.run``) as ``JITFunction.run`` itself does, like Inductor's static
launchers. Its key is finer than Triton's specialisation (each tensor's dtype and address mod
16, each integer's value, every keyword argument's value), so a hit launches the kernel Triton
would have picked; an integer value not seen before (a new M) is one launch through Triton.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import inspect
import os
import tempfile
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import triton
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils._python_dispatch import _pop_mode_temporarily
from triton import knobs

from tunesvc import settings
from tunesvc.serving import runtime as _runtime_module

_allocator_set: contextvars.ContextVar[bool] = contextvars.ContextVar("tunesvc_allocator_set", default=False)


def _dynamo_guards() -> Any:
    """torch's compiled guard helpers (``torch._C._dynamo.guards``), or None in a torch without them."""
    try:
        return importlib.import_module("torch._C._dynamo.guards")
    except ImportError:
        return None


_GUARDS = _dynamo_guards()


def _inductor_allocators() -> dict[str, Callable[..., torch.Tensor]]:
    """Per device type, the allocator Inductor's generated code calls: ``(size, stride, dtype)``
    as tuples, on the current device, with no argument parsing (torch's comment on it: about 2 us
    less per call than ``torch.empty_strided``). A torch without them: none, and plans call
    ``torch.empty_like`` and the like."""
    found = {kind: getattr(_GUARDS, f"_empty_strided_{kind}", None) for kind in ("cuda", "cpu")}
    return {kind: fn for kind, fn in found.items() if callable(fn)}


_ALLOCATORS = _inductor_allocators()


def _tensor_guards(tensors: list[torch.Tensor]) -> Any:
    """Dynamo's compiled check of these tensors' Python type, dispatch keys, dtype, device,
    requires_grad, sizes and strides (``TensorGuards(...).check(*tensors)``, one C++ call, what a
    compiled graph's guards run), or None where this torch has none or refuses them."""
    make = getattr(_GUARDS, "TensorGuards", None)
    if make is None or not tensors:
        return None
    try:
        guards = make(
            *tensors,
            dynamic_dims_sizes=[list(t.shape) for t in tensors],
            dynamic_dims_strides=[list(t.stride()) for t in tensors],
        )
        return guards if guards.check(*tensors) is True else None
    except Exception:  # a torch whose TensorGuards takes other arguments: the plans' dict alone
        return None


def _torch_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    # torch's caching allocator on the current device and stream: no cudaMalloc per launch
    return torch.empty(size, device="cuda", dtype=torch.int8)


def use_torch_allocator() -> None:
    """Give Triton an allocator in this thread/context (once per context; a ContextVar get after)."""
    if not _allocator_set.get():
        set_allocator = getattr(triton, "set_allocator", None)  # Triton < 3.2 has no runtime allocations
        if set_allocator is not None:
            set_allocator(_torch_scratch)
        _allocator_set.set(True)


class _NoKey(Exception):
    """A call whose arguments the direct launcher does not key: Triton's own path launches it."""


def _no_key(*args: Any) -> Any:
    raise _NoKey


def _key_function(args: tuple, kwargs: dict[str, Any]) -> Callable[..., tuple]:
    """A function of (device, *args, kwargs) giving the key of calls shaped like this one.

    Generated like Triton's own binder, from the argument kinds of this call and nothing a file
    supplies: one Python frame instead of a loop over the arguments (a tenth of the time). The
    key is finer than Triton's specialisation: a tensor's dtype and address mod 16, an integer's
    value, a bool's value; a float is a float (its value is not specialised). A call that
    differs in kind (a tensor where an integer was, another keyword) fails a guard: _NoKey.
    """
    names = [f"a{i}" for i in range(len(args))]
    parts = ["device"]
    for name, arg in zip(names, args):
        kind = type(arg)
        if isinstance(arg, torch.Tensor):
            parts += [f"{name}.dtype", f"{name}.data_ptr() & 15"]
        elif kind is int or kind is bool:
            parts.append(f"({name} if {name}.__class__ is {kind.__name__} else no_key())")
        elif kind is float:
            parts.append(f"({name}.__class__ is float or no_key())")
        elif arg is None:
            parts.append(f"({name} is None or no_key())")
        else:
            return _no_key
    for kw, value in kwargs.items():
        if not isinstance(value, (int, float, str, bool)) or not kw.isidentifier():
            return _no_key
        parts.append(f"kw[{kw!r}]")
    parts.append("len(kw)")
    source = f"def key({', '.join(['device', *names, 'kw'])}):\n    return ({', '.join(parts)},)\n"
    namespace: dict[str, Any] = {"no_key": _no_key}
    exec(compile(source, "<tunesvc.serving.launch key>", "exec"), namespace)
    return namespace["key"]


class _Driver:
    """Triton's active driver's device and stream getters, read once (each is a proxy lookup)."""

    device: Callable[[], int] | None = None
    stream: Callable[[int], int] | None = None

    @classmethod
    def load(cls) -> None:
        from triton.runtime.driver import driver

        cls.device = driver.active.get_current_device
        cls.stream = driver.active.get_current_stream


class DirectLaunch:
    """``kernel[grid](*args, **kwargs)`` that, after the first launch of a specialisation, calls
    the compiled kernel's launcher directly; anything it cannot key goes to Triton's own path.

    Positional arguments are the kernel's leading parameters; keyword arguments are constexprs
    and launch options (every call site of the shipped kernels has this shape). Attributes
    other than ``[grid]`` are the wrapped kernel's, so a template hashes the same source.
    """

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.fn = getattr(kernel, "fn", None)  # a template's version hashes the kernel's Python source
        params: list[Any] = getattr(kernel, "params", None) or []
        # the interpreter's InterpretedFunction has no compiled kernel to keep
        self._direct = isinstance(kernel, triton.runtime.jit.JITFunction) and bool(params)
        self._names = [p.name for p in params]
        self._constexpr = {p.name for p in params if p.is_constexpr}
        #: key -> (the CompiledKernel, the parameters after the positional ones, its static launch or None)
        self._compiled: dict[tuple, tuple[Any, tuple, Callable[..., Any] | None]] = {}
        self._key_of: Callable[..., tuple] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """``kernel[grid](*args, **kwargs)``; ``grid`` a tuple, or a function of the named
        arguments (constexprs included) as Triton calls it."""
        recording = _recording.get()
        if recording is not None:
            return self._recorded(recording, grid, args, kwargs)
        if not self._direct:
            return self.kernel.run(*args, grid=grid, warmup=False, **kwargs)
        get_device = _Driver.device
        if get_device is None:
            _Driver.load()
            get_device = _Driver.device
        assert get_device is not None and _Driver.stream is not None
        device = get_device()
        key_of = self._key_of
        if key_of is None:
            key_of = self._key_of = _key_function(args, kwargs)
        try:
            key = key_of(device, *args, kwargs)
        except Exception:  # _NoKey, or a call of another shape (arity, keyword): Triton's path
            return self.kernel.run(*args, grid=grid, warmup=False, **kwargs)
        entry = self._compiled.get(key)
        enter = knobs.runtime.launch_enter_hook
        # a profiler's launch hooks (proton) want Triton's own launch metadata, and the kernel's
        # pre-run hooks their call: Triton's path
        if entry is None or getattr(enter, "calls", enter) or self.kernel.pre_run_hooks:
            return self._first_launch(key, grid, args, kwargs)
        compiled, tail, static = entry
        if callable(grid):
            grid = grid(dict(zip(self._names, (*args, *tail))))
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        if static is not None:
            static(grid[0], g1, g2, _Driver.stream(device), *args)
            return compiled
        compiled.run(
            grid[0],
            g1,
            g2,
            _Driver.stream(device),
            compiled.function,
            compiled.packed_metadata,
            None,
            enter,
            knobs.runtime.launch_exit_hook,
            *args,
            *tail,
        )
        return compiled

    def _recorded(self, recording: _Recording, grid: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """The launch, noted in ``recording`` with the compiled kernel and grid a replay calls."""
        compiled = self.launch_once(grid, args, kwargs)
        if not self._direct:
            recording.launched(self, None, grid, args, kwargs)
            return compiled
        device = _Driver.device() if _Driver.device is not None else None
        try:
            key = self._key_of(device, *args, kwargs) if self._key_of is not None else None
        except Exception:
            key = None
        entry = self._compiled.get(key) if key is not None else None
        if entry is None or entry[0] is not compiled or self.kernel.pre_run_hooks:
            name = getattr(self.fn, "__name__", "a kernel")
            recording.refused = recording.refused or f"{name} was launched through Triton's own path"
            return compiled
        if callable(grid):
            grid = grid(dict(zip(self._names, (*args, *entry[1]))))
        recording.launched(self, entry, tuple(grid), args, kwargs)
        return compiled

    def launch_once(self, grid: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """:meth:`launch` outside any recording (the interpreter's own tensor ops are not the call's)."""
        token = _recording.set(None)
        try:
            with _disable_current_modes():
                return self.launch(grid, args, kwargs)
        finally:
            _recording.reset(token)

    def _first_launch(self, key: tuple, grid: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        compiled = self.kernel.run(*args, grid=grid, warmup=False, **kwargs)
        if compiled is None:
            return compiled
        rest = self._names[len(args) :]
        if any(name in kwargs and name not in self._constexpr for name in rest):
            return compiled  # a runtime argument given by name: not a call shape kept here
        # the launcher takes every parameter in order, constexprs included; they are fixed by the key
        try:
            tail = tuple(kwargs[name] if name in kwargs else self._default(name) for name in rest)
        except KeyError:
            return compiled
        if not hasattr(compiled, "run") or not hasattr(compiled, "packed_metadata"):
            return compiled
        self._compiled[key] = (compiled, tail, _static_call(compiled, args, tail))
        return compiled

    def _default(self, name: str) -> Any:
        default = self.kernel.params[self._names.index(name)].default
        if default is inspect.Parameter.empty:
            raise KeyError(name)
        return default


def direct_launch(kernel: Any) -> DirectLaunch:
    """``kernel`` launched through :class:`DirectLaunch`."""
    return DirectLaunch(kernel)


# -- launch plans: a hit replays what the first call of its key launched ------------------------

#: the recording of the op call running in this thread/context, if any
_recording: contextvars.ContextVar[_Recording | None] = contextvars.ContextVar("tunesvc_recording", default=None)

#: factory ops whose output a replay makes again (LaunchPlan._allocation): contents undefined both ways
_ALLOCATIONS = frozenset(
    {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided"}
)


@contextlib.contextmanager
def outside_recording() -> Iterator[None]:
    """Run code that is no part of the op call being recorded in this context (a config lookup
    that may sweep): no launch of it is noted, and the recording's dispatch mode does not see it."""
    recording = _recording.get()
    if recording is None:
        yield
        return
    token = _recording.set(None)
    try:
        if _get_current_dispatch_mode() is recording:
            with _pop_mode_temporarily():
                yield
        else:
            yield
    finally:
        _recording.reset(token)


_runtime_module.outside_recording = outside_recording


class _Recording(TorchDispatchMode):
    """Every aten op and every :class:`DirectLaunch` launch of one op call.

    A call is replayable when its only aten ops were allocations with undefined contents and
    views, and every kernel it launched went through a :class:`DirectLaunch` (the shipped
    families' launch path). Anything else (a copy, a zeroed buffer, a host sync, a kernel's first
    launch before it was keyed) leaves the call unreplayable; it runs as it is.
    """

    def __init__(self) -> None:
        super().__init__()
        self.allocations: dict[int, torch.Tensor] = {}  # by storage address (they are held: none is reused)
        self.launches: list[tuple[DirectLaunch, Any, Any, tuple, dict[str, Any]]] = []
        self.refused: str | None = None

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in torch._disable_dynamo otherwise, which imports
        # torch._dynamo (and Inductor, sympy: seconds) at a process's first shipped-kernel call; a
        # recording runs only in eager calls (an op traced by Dynamo never records), so nothing here is compiled
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        if name in _ALLOCATIONS:
            # by storage: the Python object the caller gets is not always the one seen here
            self.allocations[_storage(out)] = out
        elif not func.is_view and self.refused is None:
            self.refused = f"it runs {func}"
        return out

    def launched(self, kernel: DirectLaunch, entry: Any, grid: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        self.launches.append((kernel, entry, grid, args, kwargs))

    def plan(self, inputs: tuple, output: Any, budget: int) -> LaunchPlan | str:
        """The plan that replays this call for inputs of the same key (keeping workspaces up to
        ``budget`` bytes), or why there is none."""
        if self.refused is not None:
            return self.refused
        if not self.launches:
            return "it launched no kernel"
        return LaunchPlan.build(inputs, output, self, budget)


@dataclass(frozen=True)
class _Static:
    """A compiled kernel loaded by torch's static launcher (what Inductor launches with)."""

    call: tuple  # (launch, function, num_warps, shared, argument types): a launch's first arguments
    constexprs: frozenset[int]  # parameter indices the cubin does not take
    scratch: int  # trailing None arguments (Triton's scratch pointers, unused)


_STATIC: dict[Any, _Static | None] = {}
_LOADED: list[Any] = []  # the static kernels: each owns its loaded module
_static_wanted = True


def use_static_launcher(wanted: bool) -> None:
    """Whether later first launches load torch's static launcher. Its module comes with
    ``torch._inductor``, whose import brings ``torch._dynamo`` and sympy (seconds in a fresh
    process); a process that times kernels in CUDA graphs, where host time is not measured,
    launches through Triton's own launcher instead (the same kernel, replayed the same)."""
    global _static_wanted
    _static_wanted = wanted


def _static_launcher(compiled: Any) -> _Static | None:
    """``compiled`` through torch's static launcher, or None where it cannot launch it (no such
    launcher in this torch, TMA descriptors, scratch memory, clusters; :func:`use_static_launcher`
    turned off). One per compiled kernel."""
    if not _static_wanted:
        return None
    if compiled not in _STATIC:
        _STATIC[compiled] = _load_static(compiled)
    return _STATIC[compiled]


def _load_static(compiled: Any) -> _Static | None:
    launcher_cls = None
    for module in ("static_triton_launcher", "static_cuda_launcher"):  # the name differs between torch releases
        try:
            launcher_cls = importlib.import_module(f"torch._inductor.runtime.{module}").StaticallyLaunchedCudaKernel
            break
        except (ImportError, AttributeError):
            continue
    metadata = compiled.metadata
    if launcher_cls is None or "cubin" not in getattr(compiled, "asm", {}):
        return None
    if getattr(metadata, "launch_pdl", False) or getattr(metadata, "launch_cooperative_grid", False):
        return None  # launch attributes it does not set
    try:
        if not hasattr(compiled, "_cubin_path"):
            compiled._cubin_path = None  # Inductor's cache sets it; the kernel is loaded from its bytes below
        kernel = launcher_cls(compiled)
        with tempfile.TemporaryDirectory(prefix="tunesvc-cubin-") as folder:
            kernel.reload_cubin_from_raw(os.path.join(folder, "kernel.cubin"))
            kernel.load_kernel(torch.cuda.current_device())
        scratch = int(kernel.has_global_scratch) + int(kernel.has_profile_scratch)
        types = kernel.arg_tys + "O" * scratch
        call = (kernel.C_impl._launch_kernel, kernel.function, kernel.num_warps, kernel.shared, types)
        _LOADED.append(kernel)
        return _Static(call, frozenset(kernel.full_constexprs), scratch)
    except Exception:  # NotImplementedError for what it does not launch; any other failure: Triton's launcher
        return None


def _static_call(compiled: Any, args: tuple, tail: tuple) -> Callable[..., Any] | None:
    """``launch(grid0, grid1, grid2, stream, *args)`` of ``compiled`` through torch's static
    launcher for calls whose positional arguments are of the kinds of ``args`` (a tensor where
    a tensor is: DirectLaunch's key guards that) and whose later parameters are ``tail``;
    generated (no text a file supplies) so that a hit is one frame. None where the static
    launcher cannot launch the kernel: Triton's launcher does."""
    static = _static_launcher(compiled)
    if static is None:
        return None
    names = [f"a{i}" for i in range(len(args))]
    tails = {f"t{i}": value for i, value in enumerate(tail, len(args))}  # fixed by the key: bound by name
    namespace: dict[str, Any] = dict(zip(("static_launch", "function", "warps", "shared", "types"), static.call))
    namespace.update(tails)
    every = [*names, *tails]
    values = _static_arguments(
        static, [f"{n}.data_ptr()" if isinstance(v, torch.Tensor) else n for n, v in zip(every, (*args, *tail))]
    )
    source = (
        f"def launch(g0, g1, g2, stream, {', '.join(names)}):\n"
        f"    static_launch(function, g0, g1, g2, warps, shared, types, {_tuple(values)}, stream)\n"
    )
    exec(compile(source, "<tunesvc.serving.launch static>", "exec"), namespace)
    return namespace["launch"]


def _static_arguments(static: _Static, values: list[str]) -> list[str]:
    """The source of the static launcher's argument tuple: every parameter's expression in
    ``values`` (a tensor's is its address) but the constexprs', then the scratch pointers."""
    return [v for i, v in enumerate(values) if i not in static.constexprs] + ["None"] * static.scratch


def _tuple(items: list[str]) -> str:
    """The source of a tuple of these expressions (``()`` for none)."""
    return f"({', '.join(items)},)" if items else "()"


class _Unplannable(Exception):
    """Why a recorded call cannot be replayed."""


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _layout(t: torch.Tensor) -> tuple:
    return t.shape, t.stride(), t.storage_offset(), t.dtype


class LaunchPlan:
    """The launches of one recorded op call as one generated function of (args, stream).

    Each tensor a kernel was given is named by where it came from: the call's i-th argument (or
    a view of it); a buffer the call allocated and returns (allocated again per call, with the
    same size, strides, dtype and device, or a view of it); a buffer it allocated and dropped (a
    workspace: the recorded one again, kept with the plan while the op's workspace budget lasts,
    else allocated per call); or a tensor that existed before the call and that the call did not
    receive (a cache per device and stream, such as split-K's arrival counters: the same tensor
    again). Plans are keyed by stream, so two streams never share a workspace. Every other
    argument is the recorded value: the plan's key (shapes, strides, dtypes, address alignment,
    scalar arguments, device, stream) fixes them all. The function
    is generated from the recording, with every value bound by name (no text a file supplies),
    so that a hit is one Python frame: the speed of Inductor's generated launchers.
    """

    def __init__(self, inputs: tuple, allocations: dict[int, torch.Tensor]) -> None:
        self.namespace: dict[str, Any] = {
            "empty": torch.empty,
            "empty_like": torch.empty_like,
            "empty_strided": torch.empty_strided,
            "use_torch_allocator": use_torch_allocator,
        }
        self.lines: list[str] = []
        self.allocations = allocations
        self.arguments = inputs
        self.inputs = {id(t): i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)}
        self.names: dict[tuple, str] = {}  # by storage address and layout
        #: a tensor's address where it is cheaper than its name's .data_ptr() (no view made per call)
        self.addresses: dict[str, str] = {}
        self.returned: set[int] = set()  # storage addresses of the tensors the call returns
        self.budget = 0  # bytes of workspace this plan may still keep
        self.kept = 0  # bytes of workspace it keeps
        self.keeping: dict[int, bool] = {}  # by storage address: whether a workspace is kept
        self.replay: Callable[[tuple, int], Any] = _no_key
        self.source = ""
        #: the compiled check of the call's tensors (_tensor_guards) and the rest of its key, set
        #: where the hit path tries the last plan first; None: only the dict finds it
        self.guards: Any = None
        self.rest: tuple | None = None

    @classmethod
    def build(cls, inputs: tuple, output: Any, recording: _Recording, budget: int = 0) -> LaunchPlan | str:
        """The plan of a recorded call, or one phrase saying why there is none; it keeps the
        call's workspaces up to ``budget`` bytes in all (:attr:`kept`), and allocates the rest per call."""
        plan = cls(inputs, recording.allocations)
        plan.budget = budget
        outputs = output if isinstance(output, tuple) else (output,)
        plan.returned = {_storage(t) for t in outputs if isinstance(t, torch.Tensor)}
        if len(plan.inputs) < sum(isinstance(t, torch.Tensor) for t in inputs):
            return "one tensor is given as two arguments"  # a later call may give two
        try:
            for kernel, entry, grid, args, kwargs in recording.launches:
                plan._launch(kernel, entry, grid, args, kwargs)
            result = plan._result(output)
        except _Unplannable as reason:
            return str(reason)
        plan.source = "def replay(args, stream):\n" + "".join(f"    {line}\n" for line in plan.lines)
        plan.source += f"    return {result}\n"
        exec(compile(plan.source, "<tunesvc.serving.launch plan>", "exec"), plan.namespace)
        plan.replay = plan.namespace["replay"]
        # what the build read: the recorded call's arguments and buffers, which a plan kept for
        # the process would pin (a new shape's activations each); kept workspaces are constants
        plan.arguments, plan.allocations = (), {}
        return plan

    def _keep(self, buffer: torch.Tensor) -> bool:
        """Keep this workspace with the plan, if it fits what is left of the op's budget."""
        storage = _storage(buffer)
        if storage not in self.keeping:  # once per buffer: its views go where it goes
            size = buffer.untyped_storage().nbytes()
            self.keeping[storage] = size <= self.budget
            if self.keeping[storage]:
                self.budget -= size
                self.kept += size
        return self.keeping[storage]

    def _constant(self, value: Any) -> str:
        name = f"c{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def _tensor(self, t: torch.Tensor) -> str:
        if id(t) in self.inputs:
            return f"args[{self.inputs[id(t)]}]"
        storage, layout = _storage(t), _layout(t)
        name = self.names.get((storage, layout))
        if name is not None:
            return name
        size, stride = self._constant(tuple(t.shape)), self._constant(t.stride())
        made = self.allocations.get(storage)
        if made is not None and storage not in self.returned and self._keep(made):
            name = self._constant(t)  # a workspace of the call, kept with the plan (keyed by stream)
            self.addresses[name] = self._constant(t.data_ptr())
        elif made is not None:
            if layout == _layout(made):
                name = f"t{len(self.names)}"
                self.lines.append(f"{name} = {self._allocation(t, size, stride)}")
            elif t.dtype == made.dtype:  # a view of a buffer the call made (a slice of stacked gradients)
                base = self._tensor(made)
                name = f"t{len(self.names)}"
                self.lines.append(f"{name} = {base}.as_strided({size}, {stride}, {t.storage_offset()})")
            else:
                raise _Unplannable("a kernel was given a buffer the call made, as another dtype")
        elif sharing := [
            i for i, a in enumerate(self.arguments) if isinstance(a, torch.Tensor) and _storage(a) == storage
        ]:
            if len(sharing) > 1 or t.dtype != self.arguments[sharing[0]].dtype:
                raise _Unplannable("a kernel was given a view of arguments that share memory")
            i = sharing[0]
            offset = t.storage_offset() - self.arguments[i].storage_offset()
            name = f"args[{i}].as_strided({size}, {stride}, args[{i}].storage_offset() + {offset})"
            delta = offset * t.element_size()
            self.addresses[name] = f"(args[{i}].data_ptr() + {delta})" if delta else f"args[{i}].data_ptr()"
        else:
            name = self._constant(t)  # a workspace that outlives the call: kept alive here
            self.addresses[name] = self._constant(t.data_ptr())
        self.names[(storage, layout)] = name
        return name

    def _allocation(self, t: torch.Tensor, size: str, stride: str) -> str:
        """The cheapest call that makes a buffer like ``t`` (host time, in this order: Inductor's
        allocator for its device type where ``t`` is on the current device; empty_like of an
        argument of its shape, dtype and contiguity; new_empty of one of its dtype and device;
        torch.empty; torch.empty_strided). The plan's key fixes every argument's layout, and the
        current device, so the buffer lands where the recorded one did."""
        fast = _ALLOCATORS.get(t.device.type)
        if fast is not None and (t.device.type != "cuda" or t.device.index == torch.cuda.current_device()):
            self.namespace["empty_fast"] = fast
            return f"empty_fast({size}, {stride}, {self._constant(t.dtype)})"
        if t.is_contiguous():
            same = [i for i, a in enumerate(self.arguments) if isinstance(a, torch.Tensor) and a.device == t.device]
            for i in same:
                a = self.arguments[i]
                if a.shape == t.shape and a.dtype == t.dtype and a.is_contiguous():
                    return f"empty_like(args[{i}])"
            for i in same:
                if self.arguments[i].dtype == t.dtype:
                    return f"args[{i}].new_empty({size})"
            return f"empty({size}, dtype={self._constant(t.dtype)}, device={self._constant(t.device)})"
        return f"empty_strided({size}, {stride}, dtype={self._constant(t.dtype)}, device={self._constant(t.device)})"

    def _launch(self, kernel: DirectLaunch, entry: Any, grid: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
            raise _Unplannable("a kernel was given a tensor by keyword")
        names = [self._tensor(a) if isinstance(a, torch.Tensor) else self._constant(a) for a in args]
        if entry is None:  # the interpreter has no compiled kernel: the launch goes through DirectLaunch
            launch, grid_name, kw = self._constant(kernel.launch), self._constant(grid), self._constant(kwargs)
            self.lines.append(f"{launch}({grid_name}, {_tuple(names)}, {kw})")
            return
        compiled, tail, _ = entry
        g0, g1, g2 = (self._constant(g) for g in (*grid, 1, 1)[:3])
        every = [*names, *(self._constant(v) for v in tail)]
        static = _static_launcher(compiled)
        if static is not None:  # torch's static launcher: a third less host time than Triton's
            launch, function, warps, shared, types = (self._constant(v) for v in static.call)
            values = _static_arguments(
                static,
                [
                    self.addresses.get(n, f"{n}.data_ptr()") if isinstance(v, torch.Tensor) else n
                    for n, v in zip(every, (*args, *tail))
                ],
            )
            self.lines.append(
                f"{launch}({function}, {g0}, {g1}, {g2}, {warps}, {shared}, {types}, {_tuple(values)}, stream)"
            )
            return
        if getattr(compiled.metadata, "global_scratch_size", 0) > 0:
            self.lines.append("use_torch_allocator()")  # this thread's allocator, as the first call had
        run, function, metadata = (
            self._constant(v) for v in (compiled.run, compiled.function, compiled.packed_metadata)
        )
        joined = ", ".join(every)
        self.lines.append(f"{run}({g0}, {g1}, {g2}, stream, {function}, {metadata}, None, None, None, {joined})")

    def _result(self, output: Any) -> str:
        outputs = output if isinstance(output, tuple) else (output,)
        returned = []
        for t in outputs:
            made = self.allocations.get(_storage(t)) if isinstance(t, torch.Tensor) else None
            if id(t) not in self.inputs and (made is None or made.dtype != t.dtype):
                raise _Unplannable("it returns something other than its arguments and the buffers it allocated")
            returned.append(self._tensor(t))
        return f"({', '.join(returned)},)" if isinstance(output, tuple) else returned[0]


_SCALARS = (int, bool, float, str, type(None))


def _kinds(args: tuple, seen: list[set[type]] | None = None) -> list[set[type]]:
    """The kinds each argument position has taken (torch.Tensor, or a scalar's class)."""
    kinds = [set(k) for k in seen] if seen is not None and len(seen) == len(args) else [set() for _ in args]
    for kind, arg in zip(kinds, args):
        kind.add(torch.Tensor if isinstance(arg, torch.Tensor) else type(arg))
    return kinds


def _plan_key_parts(
    kinds: list[set[type]], entry: bool = False, names: list[str] | None = None, guarded: bool = False
) -> list[str] | None:
    """The source of the plan key's items after the current device and stream, for calls whose
    arguments (named ``names``, else a0, a1, ...) are of these kinds: each tensor's shape, strides, dtype and
    address mod 16, the first tensor's device index, and every other argument's class and value
    (so 1, 1.0 and True differ); an argument of another kind (a config dict) leaves the call
    unkeyed unless it is None. None where the kinds cannot be keyed (a position that took a
    tensor and a scalar).

    ``entry``: the key of a family's public function, which checks its arguments before the
    op runs: every tensor's device index, whether it requires grad, and whether grad mode is on
    are part of it too (a hit skips the checks; a call that autograd records is never replayed).

    ``guarded``: the items a plan's tensor guards (:func:`_tensor_guards`) leave to check: the
    same, but of each tensor its address mod 16 alone (the guards check the rest, and every
    tensor's device); None where a tensor may be None (the guards take tensors) or there is none."""
    parts = ["grad_enabled()"] if entry else []
    first = ""  # the first tensor's device index
    for i, kind in enumerate(kinds):
        name = names[i] if names else f"a{i}"
        if torch.Tensor in kind:
            extra = f", {name}.get_device(), {name}.requires_grad" if entry else ""
            meta = f"({name}.shape, {name}.stride(), {name}.dtype, {name}.data_ptr() & 15{extra})"
            if kind == {torch.Tensor}:
                parts.append(f"{name}.data_ptr() & 15" if guarded else meta)
                first = first or f"{name}.get_device()"
            elif kind == {torch.Tensor, type(None)} and not guarded:
                parts.append(f"(None if {name} is None else {meta})")
            else:
                return None
        elif all(k in _SCALARS for k in kind):
            parts += [f"{name}.__class__", name]
        else:
            parts.append(f"(None if {name} is None else no_key())")
    if guarded:
        return parts if first else None
    if not entry:
        parts.append(first or "None")
    return parts


def _guarded_tensors(kinds: list[set[type]], args: list[Any] | tuple) -> list[Any]:
    """The arguments (or their names) a plan's tensor guards check, in order: those of the
    positions that are always tensors."""
    return [arg for arg, kind in zip(args, kinds) if kind == {torch.Tensor}]


def _hit_source(
    names: list[str], items: list[str], indent: str = "    ", rest: list[str] | None = None, tensors: str = ""
) -> str:
    """The source of the hit path of a plans' call of arguments ``names`` keyed by ``items``: key
    the call, find its plan and replay it; anything else (no plan yet, an argument this key does
    not take, a recording under way, another runtime, a launch hook) goes to ``slow``.

    ``rest`` (the :func:`_plan_key_parts` items left to check past the guards) and ``tensors``
    (the guarded arguments' source): the last plan hit comes first, taken where its tensor
    guards pass this call's tensors and the rest of its key is this call's. One C++ check
    replaces building, hashing and comparing the tensors' part of the key; the dict answers otherwise."""
    args = ", ".join(names)
    lookup = [f"plan = plans[(index, s, {', '.join(items)},)]"]
    if rest is not None:
        lookup = [
            "plan = owner.last",
            f"if plan is None or not plan.guards.check({tensors}) or plan.rest != (index, s, {', '.join(rest)},):",
            f"    {lookup[0]}",
            "    if plan is not None and plan.guards is not None:",
            "        owner.last = plan",
        ]
    lines = [
        "index = device()",
        "s = stream(index)",
        "try:",
        *(f"    {line}" for line in lookup),
        "except Exception:  # no plan yet, or an argument this key does not take",
        f"    return slow({args})",
        "if (",
        "    plan is None",
        "    or recording.get() is not None",
        "    or not owner.active",
        "    or runtime._default is not owner._runtime",
        "    or (knobs.runtime.launch_enter_hook is not None and hooked())",
        "):",
        f"    return slow({args})",
        f"return plan.replay(({args}{',' if names else ''}), s)",
    ]
    return "".join(f"{indent}{line}\n" for line in lines)


#: the names the hit path's source binds or reads (a function that carries it may not have parameters of these names)
HIT_NAMES = frozenset(
    {"index", "s", "plan", "device", "stream", "plans", "slow", "recording", "owner", "runtime", "knobs", "hooked"}
    | {"grad_enabled", "no_key"}
)


def _hit_namespace(plans: LaunchPlans) -> dict[str, Any]:
    """The names :func:`_hit_source` reads; ``device`` and ``stream`` are looked up once, at the
    first call (CUDA is not initialised on import)."""
    namespace: dict[str, Any] = {
        "grad_enabled": torch.is_grad_enabled,
        "no_key": _no_key,
        "plans": plans.plans,
        "slow": plans._slow,
        "recording": _recording,
        "owner": plans,
        "runtime": _runtime_module,
        "knobs": knobs,
        "hooked": _hooked,
    }

    def first_device() -> int:
        namespace["device"], namespace["stream"] = plans._where()
        return namespace["device"]()

    namespace["device"] = first_device
    return namespace


def _guarded_hit(kinds: list[set[type]], entry: bool, names: list[str]) -> dict[str, Any]:
    """The keyword arguments of :func:`_hit_source` that put a plan's tensor guards first, where
    this torch has them and the kinds allow them; none otherwise."""
    rest = _plan_key_parts(kinds, entry, names, guarded=True)
    if rest is None or getattr(_GUARDS, "TensorGuards", None) is None:
        return {}
    return {"rest": rest, "tensors": ", ".join(_guarded_tensors(kinds, names))}


def _plan_functions(
    plans: LaunchPlans, kinds: list[set[type]]
) -> tuple[Callable[..., tuple], Callable[..., Any], Callable[..., tuple] | None]:
    """``key(*args)`` (the plan key: the current device and stream, then :func:`_plan_key_parts`),
    ``call(*args)``, the hit path of ``plans`` in one frame (:func:`_hit_source`), and
    ``rest(*args)``, the key's items that a plan's tensor guards leave to check (None where the
    hit path has no guards). Generated like _key_function (no text a file supplies): an argument
    of a kind not seen raises in ``key``, and the caller regenerates them."""
    parts = _plan_key_parts(kinds, plans.entry)
    if parts is None:
        return _no_key, plans._slow, None
    names = [f"a{i}" for i in range(len(kinds))]
    guarded = _guarded_hit(kinds, plans.entry, names)
    source = (
        f"def key({', '.join(names)}):\n"
        f"    index = device()\n"
        f"    return (index, stream(index), {', '.join(parts)},)\n"
        f"def call({', '.join(names)}):\n" + _hit_source(names, parts, **guarded)
    )
    if guarded:
        source += f"def rest({', '.join(names)}):\n    return ({', '.join(guarded['rest'])},)\n"
    namespace = _hit_namespace(plans)
    exec(compile(source, "<tunesvc.serving.launch plan key>", "exec"), namespace)
    return namespace["key"], namespace["call"], namespace.get("rest")


def entry_source(plans: LaunchPlans, names: list[str]) -> tuple[str, dict[str, Any]]:
    """The body (indented once) and the names it reads of a function of parameters ``names``
    that replays ``plans``'s plan on a hit, keyed by the kinds ``plans`` was made with
    (:func:`tunesvc.serving.ops.replayed` puts it after its torch.compile branch); ("", {}) where those
    kinds cannot be keyed."""
    assert plans.fixed is not None
    parts = _plan_key_parts(plans.fixed, plans.entry, names)
    if parts is None:
        return "", {}
    return _hit_source(names, parts, **_guarded_hit(plans.fixed, plans.entry, names)), _hit_namespace(plans)


def _hooked() -> bool:
    """A profiler's launch hook (proton): launches go through Triton's path, which calls it."""
    enter = knobs.runtime.launch_enter_hook
    return bool(getattr(enter, "calls", enter))


class LaunchPlans:
    """An op's function, with the launches of its first call per key replayed on later calls.

    The key is the call's arguments (shapes, strides, dtypes, address alignment, scalars), the
    current CUDA device and stream. A call without a plan runs the function under a
    :class:`_Recording`; a call it can replay becomes the key's plan, and one it cannot is tried
    again (a first call allocates workspaces, a tune-on-miss sweeps) until ``tries`` calls
    have failed; then the key always runs the function. Plans answer for one tuned-config
    runtime: when ``tunesvc.configure`` installs another, they are dropped. A hit is one
    generated frame (:attr:`call`); a family's public function carries that frame in its own
    body (:func:`tunesvc.serving.ops.replayed`, ``entry``).
    """

    tries = 3
    #: plans kept per op at most (shapes that vary without end, each a key): later keys run the function
    most = 4096
    #: bytes of workspace (split-K partial sums, decode's partial results) an op's plans keep in all,
    #: each plan's own, so a replay allocates only its outputs; beyond it workspaces are allocated per call
    workspace = 64 << 20
    #: False (or TUNESVC_REPLAY=0): every call runs the function, nothing is recorded or replayed
    active = settings.replay_enabled()

    def __init__(self, fn: Callable[..., Any], entry: bool = False, kinds: list[set[type]] | None = None) -> None:
        self.fn = fn
        #: the kinds of the arguments, fixed (a family function's annotations), else learnt from the calls
        self.fixed = kinds
        #: a family's public function (checks, views, the op call): keyed by :func:`_plan_key_parts` with ``entry``
        self.entry = entry
        self.plans: dict[tuple, LaunchPlan | None] = {}
        #: why each key that has no plan has none (the last recording's reason)
        self.refusals: dict[tuple, str] = {}
        self._failures: dict[tuple, int] = {}
        self._key_of: Callable[..., tuple] | None = None
        self._kinds: list[set[type]] | None = kinds
        self._runtime: Any = None
        self.kept = 0  # bytes of workspace its plans keep
        #: the call: a hit in one generated frame (_plan_functions), else :meth:`_slow`
        self.call: Callable[..., Any] = self._slow
        #: the key's items past a plan's tensor guards (_plan_functions), None: no guards
        self._rest_of: Callable[..., tuple] | None = None
        #: the plan the hit path found last, tried first on the next call (its guards, then the rest of its key)
        self.last: LaunchPlan | None = None

    def __call__(self, *args: Any) -> Any:
        return self.call(*args)

    def _slow(self, *args: Any) -> Any:
        if _recording.get() is not None or not self.active:  # inside another op's recording: its launches
            return self.fn(*args)
        if _runtime_module._default is not self._runtime:
            self._forget()
        key_of = self._key_of or self._rekey(args)
        try:
            key = key_of(*args)
            plan = self.plans.get(key, _MISSING)
        except Exception:  # an argument of a kind not seen before (unhashable too): a key function for both kinds
            try:
                key = self._rekey(args)(*args)
                plan = self.plans.get(key, _MISSING)
            except Exception:  # _NoKey (an argument it cannot key): the function as it is
                return self.fn(*args)
        if plan is _MISSING:
            return self._record(key, args)
        enter = knobs.runtime.launch_enter_hook
        if plan is None or getattr(enter, "calls", enter):  # a profiler's hook: Triton's path calls it
            return self.fn(*args)
        return plan.replay(args, key[1])

    def _rekey(self, args: tuple) -> Callable[..., tuple]:
        kinds = self.fixed if self.fixed is not None else _kinds(args, self._kinds)
        if self._key_of is not None and kinds == self._kinds:
            raise _NoKey  # no kind is new: this call cannot be keyed (a tensor subclass, a config dict)
        self._kinds = kinds
        self._key_of, self.call, self._rest_of = _plan_functions(self, kinds)
        self.last = None
        return self._key_of

    def _forget(self) -> None:
        """Drop every plan: another runtime answers (``tunesvc.configure``)."""
        self.plans.clear()
        self.last = None
        self.kept = 0
        self._failures.clear()
        self._runtime = _runtime_module._default

    @staticmethod
    def _where() -> tuple[Callable[[], int], Callable[[int], int]]:
        """Readers of the current CUDA device and its current stream; -1 and 0 under the interpreter."""
        from tunesvc.device import interpreting

        if interpreting() or not torch.cuda.is_available():
            return (lambda: -1), (lambda index: 0)
        torch.cuda.init()  # what the getters below need; a no-op once CUDA is up
        # what Triton's driver reads, without its Python frames
        device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
        stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if stream is None:
            _Driver.load()
            stream = _Driver.stream
        assert stream is not None
        return device, stream

    def _record(self, key: tuple, args: tuple) -> Any:
        if len(self.plans) >= self.most:  # keys without end (a dim that takes every value): no more plans
            return self.fn(*args)
        if any(not isinstance(a, torch.Tensor) and a.__class__ not in _SCALARS for a in args):
            self.plans[key] = None  # keyed by its class and value, but a plan holds only scalars' values
            self.refusals[key] = "an argument is neither a tensor nor a scalar"
            return self.fn(*args)
        if (
            self.entry
            and torch.is_grad_enabled()
            and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        ):
            self.plans[key] = None  # autograd records the call (the key says so): it always runs the function
            self.refusals[key] = "autograd records it"
            return self.fn(*args)
        recording = _Recording()
        token = _recording.set(recording)
        try:
            with recording:
                output = self.fn(*args)
        finally:
            _recording.reset(token)
        if _runtime_module._default is not self._runtime:  # the call made the runtime: plans answer for it
            self._forget()
        budget = self.workspace - self.kept
        plan = recording.plan(args, output, budget) if not _hooked() else "a launch hook is set"
        if isinstance(plan, LaunchPlan):
            if self._rest_of is not None:
                assert self._kinds is not None  # set with _rest_of
                plan.guards = _tensor_guards(_guarded_tensors(self._kinds, args))
                plan.rest = (key[0], key[1], *self._rest_of(*args))
                if plan.guards is not None:
                    self.last = plan
            self.plans[key] = plan
            self.kept += plan.kept
            self.refusals.pop(key, None)
        else:
            self.refusals[key] = plan
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            if failures >= self.tries:
                self.plans[key] = None
        return output


_MISSING: Any = object()
