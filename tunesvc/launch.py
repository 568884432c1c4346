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

import contextvars
import inspect
from collections.abc import Callable
from typing import Any

import torch
import triton
from triton import knobs

_allocator_set: contextvars.ContextVar[bool] = contextvars.ContextVar("tunesvc_allocator_set", default=False)


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
    exec(compile(source, "<tunesvc.launch key>", "exec"), namespace)
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
        self._compiled: dict[tuple, tuple[Any, tuple]] = {}
        self._key_of: Callable[..., tuple] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """``kernel[grid](*args, **kwargs)``; ``grid`` a tuple, or a function of the named
        arguments (constexprs included) as Triton calls it."""
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
        compiled, tail = entry
        if callable(grid):
            grid = grid(dict(zip(self._names, (*args, *tail))))
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
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
        self._compiled[key] = (compiled, tail)
        return compiled

    def _default(self, name: str) -> Any:
        default = self.kernel.params[self._names.index(name)].default
        if default is inspect.Parameter.empty:
            raise KeyError(name)
        return default


def direct_launch(kernel: Any) -> DirectLaunch:
    """``kernel`` launched through :class:`DirectLaunch`."""
    return DirectLaunch(kernel)
