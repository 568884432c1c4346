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
launchers. Its key is at least as fine as Triton's specialisation (dtype and 16-byte alignment of
each tensor; each integer's 1 / multiple-of-16 / 32-bit range classes; the value of every
keyword argument), so a hit launches the kernel Triton would have picked.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable
from typing import Any

import torch
import triton

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


_INT32 = range(-(2**31), 2**31)


def _arg_class(arg: Any) -> Any:
    """What Triton specialises a runtime argument on (or finer)."""
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    if type(arg) is int:
        return (arg == 1, arg % 16 == 0, arg in _INT32, arg >= 2**63)
    if type(arg) is float or type(arg) is bool or arg is None:
        return type(arg)
    return _UNKNOWN


_UNKNOWN = object()


class DirectLaunch:
    """``kernel[grid](*args, **kwargs)`` that, after the first launch of a specialisation, calls
    the compiled kernel's launcher directly; anything it cannot key goes to Triton's own path.

    Positional arguments are the kernel's leading parameters; keyword arguments are constexprs
    and launch options (every call site of the shipped kernels has this shape). Attributes
    other than ``[grid]`` are the wrapped kernel's, so a template hashes the same source.
    """

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.fn = kernel.fn  # a template's version hashes the kernel's Python source
        params: list[Any] = getattr(kernel, "params", None) or []
        # the interpreter's InterpretedFunction has no compiled kernel to keep
        self._direct = isinstance(kernel, triton.runtime.jit.JITFunction) and bool(params)
        self._names = [p.name for p in params]
        self._constexpr = {p.name for p in params if p.is_constexpr}
        self._compiled: dict[tuple, tuple[Any, tuple]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """``kernel[grid](*args, **kwargs)``; ``grid`` a tuple, or a function of the named
        arguments (constexprs included) as Triton calls it."""
        if not self._direct:
            return self.kernel.run(*args, grid=grid, warmup=False, **kwargs)
        from triton import knobs
        from triton.runtime.driver import driver

        active = driver.active
        device = active.get_current_device()
        key = (device, *map(_arg_class, args), *kwargs.items())
        entry = self._compiled.get(key)
        enter = knobs.runtime.launch_enter_hook
        # a profiler's launch hooks (proton) want Triton's own launch metadata: its path
        if entry is None or getattr(enter, "calls", enter):
            return self._first_launch(key, grid, args, kwargs)
        compiled, tail = entry
        if callable(grid):
            grid = grid(dict(zip(self._names, (*args, *tail))))
        stream = active.get_current_stream(device)
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        compiled.run(
            grid[0],
            g1,
            g2,
            stream,
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
        if _UNKNOWN in key or compiled is None:
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
