"""``@tunesvc.autotune``: a drop-in for ``triton.autotune`` whose configs come from the store.

Put it on a ``@triton.jit`` kernel with a config space and the arguments the best config
depends on; launch as usual (``kernel[grid](...)``)::

    @tunesvc.autotune(space="search_spaces/my_gemm.toml", key=["M", "N", "K"], name="my_gemm",
                      output="c_ptr")
    @triton.jit
    def my_gemm(a_ptr, b_ptr, c_ptr, M, N, K, ..., BLOCK_M: tl.constexpr, ...): ...

    my_gemm[lambda meta: (triton.cdiv(M, meta["BLOCK_M"]),)](a, b, c, M, N, K, ...)

The kernel becomes a :class:`~tunesvc.template.Template` named ``name`` whose version is the
hash of the kernel's source, so its winners live in the same tables as the shipped kernels'
(``tune sweep``/``show``/``export`` read them) and an edited kernel never reuses old configs.
The shape key is the ``key`` arguments' values (integers, exact, as in triton.autotune) plus the
dtype of the tensor ``dtype_arg`` (default: the kernel's first argument).

Which config a launch uses is the runtime's answer (see :class:`tunesvc.Runtime`): the process
runtime (``tunesvc.configure``, ``$TUNESVC_DB``/``$TUNESVC_BUNDLE``/``$TUNESVC_MODE``) or one
built from ``db``/``bundle``/``mode``. In mode ``tune`` a miss is benchmarked now on copies of
the call's own arguments, like triton.autotune, but each candidate's ``output`` is first checked
against ``reference(*args)`` (default: what the heuristic config computes), then the winner is
stored, once across threads and processes.

The hot path is one dict lookup on one flat tuple (the key values, by :func:`operator.itemgetter`,
and the dtype), then the kernel's own ``run``: no database, logging or per-call dicts of ours.
"""

from __future__ import annotations

import operator
import os
import threading
import weakref
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import torch

from tunesvc import settings
from tunesvc.errors import TunesvcError
from tunesvc.serving import runtime as _runtime
from tunesvc.serving.launch import DirectLaunch
from tunesvc.space import LAUNCH_OPTIONS
from tunesvc.space import Space
from tunesvc.template import DTYPES
from tunesvc.template import ShapeKey
from tunesvc.template import Template

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.serving.runtime import Runtime
    from tunesvc.space import Config
    from tunesvc.template import Problem

#: dtypes a user kernel may be keyed on (the shipped templates accept fewer)
ANY_DTYPE = (*DTYPES, "float64", "int8", "int16", "int32", "int64", "uint8", "float8_e4m3fn", "float8_e5m2")


class KernelTemplate(Template):
    """A user's ``@triton.jit`` kernel as a template: key arguments are its dims.

    ``make_inputs`` hands back copies of the call being tuned (set by :class:`TunedKernel` just
    before the runtime tunes a miss): there is no other way to know what a user kernel's inputs
    look like, and they are the shapes that matter.
    """

    dtypes = ANY_DTYPE

    def __init__(
        self,
        kernel: Any,
        name: str,
        key: Sequence[str],
        space: str | os.PathLike | Sequence[Config],
        heuristic: Callable[..., Config] | None,
        output: int | None,
        reference: Callable[..., torch.Tensor] | None,
        tolerance: float | None,
    ) -> None:
        # per-instance values of what a shipped template declares on its class
        self.name = name  # type: ignore[misc]
        self.dims = tuple(key)  # type: ignore[misc]
        self.kernel = kernel
        self.kernel_sources = (kernel,)  # type: ignore[misc]
        self._heuristic = heuristic
        self._output = output
        self._reference = reference
        self._tolerance = tolerance
        self._call: tuple[Any, tuple, dict[str, Any], Problem] | None = None
        if isinstance(space, (str, os.PathLike)):
            self._space_path: Path | None = Path(space)
            self._configs: list[Config] | None = None
        else:
            self._space_path, self._configs = None, [dict(c) for c in space]
            if not self._configs:
                raise TunesvcError(f"tunesvc.autotune({name}): the config list is empty; give at least one config.")

    @property
    def space_path(self) -> Path:
        if self._space_path is None:
            raise TunesvcError(f"{self.name} was given a list of configs, not a space file.")
        return self._space_path

    @property
    def space(self) -> Space:  # not cached on the class: each instance has its own
        cached = self.__dict__.get("_space")
        if cached is None:
            if self._configs is None:
                cached = Space.from_toml(self.space_path, problem_vars=tuple(self.problem_vars_names()))
            else:
                # the union of the listed values, so that Optuna can sample over them
                sections: dict[str, dict[str, list[int | str]]] = {"params": {}, "launch": {}}
                for config in self._configs:
                    for k, v in config.items():
                        values = sections["launch" if k in LAUNCH_OPTIONS else "params"].setdefault(k, [])
                        if v not in values:
                            values.append(v)
                cached = Space.from_dict(sections, source=f"<configs of {self.name}>")
            self.__dict__["_space"] = cached
        return cached

    def feasible(self, problem: Problem, device: Device) -> list[Config]:
        if self._configs is not None:
            return [dict(c) for c in self._configs]
        return super().feasible(problem, device)

    def violations(self, config: Config, problem: Problem, device: Device) -> list[str]:
        if self._configs is not None:
            return [] if config in self._configs else ["not in the listed configs"]
        return super().violations(config, problem, device)

    def nearest_feasible(self, config: Config, problem: Problem, device: Device) -> Config | None:
        if self._configs is not None:
            # the listed configs are the feasible ones: the nearest of them, the first among equals
            nearest = min(self._configs, key=lambda c: self.space.distance(config, c), default=None)
            return None if nearest is None else dict(nearest)
        return super().nearest_feasible(config, problem, device)

    def key(self, problem: Problem) -> ShapeKey:
        return ShapeKey.make({d: problem[d] for d in self.dims}, {"dtype": problem["dtype"]})

    def heuristic(self, problem: Problem, device: Device) -> Config:
        if self._heuristic is not None:
            return dict(self._heuristic(**problem))
        feasible = self.feasible(problem, device)
        if not feasible:
            raise TunesvcError(f"No config of {self.name}'s space fits {self.key(problem)}; widen the space.")
        return feasible[0]

    def tolerance(self, problem: Problem) -> float:
        if self._tolerance is not None:
            return self._tolerance
        return settings.REFERENCE_TOLERANCE.get(problem["dtype"], settings.REFERENCE_TOLERANCE_OTHER)

    def make_inputs(self, problem: Problem, device: Device) -> tuple[Any, tuple, dict[str, Any]]:
        if self._call is None or self._call[3] != problem:
            raise TunesvcError(
                f"{self.name} is tuned on a call's own arguments; launch it in mode 'tune' instead of sweeping it."
            )
        grid, args, kwargs, _ = self._call
        return grid, _copies(args), kwargs

    def launch(self, inputs: tuple[Any, tuple, dict[str, Any]], config: Config) -> torch.Tensor:
        grid, args, kwargs = inputs
        self.kernel.run(*args, grid=grid, warmup=False, **kwargs, **config)
        assert self._output is not None, "a KernelTemplate is made with its output argument's index"
        return args[self._output]

    def reference(self, inputs: tuple[Any, tuple, dict[str, Any]]) -> torch.Tensor:
        grid, args, kwargs = inputs
        if self._reference is not None:
            return self._reference(*_copies(args), **kwargs)
        # no reference given: candidates must agree with the heuristic config
        from tunesvc.device import current_device

        assert self._call is not None, "make_inputs ran first: it is what records the call"
        return self.launch((grid, _copies(args), kwargs), self.heuristic(self._call[3], current_device())).clone()


def _copies(args: tuple) -> tuple:
    """The call's arguments with every tensor copied: tuning must not touch the user's data."""
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


#: every TunedKernel alive, so that tunesvc.configure() can drop the configs they memoised
_KERNELS: weakref.WeakSet[TunedKernel] = weakref.WeakSet()


class TunedKernel:
    """A ``@triton.jit`` kernel that launches with its tuned config; made by :func:`autotune`.

    ``kernel[grid](*args)`` as for the kernel itself; the config's meta-parameters and launch
    options are added by tunesvc and must not be passed. ``last`` is the lookup result of the
    most recent miss, ``template`` the kernel as a template (for ``tunesvc.Runtime.lookup``).
    """

    def __init__(
        self,
        kernel: Any,
        template: KernelTemplate,
        dtype_arg: str | None,
        runtime: Runtime | None,
        db: str | os.PathLike | None,
        bundle: str | os.PathLike | None,
        mode: str | None,
    ) -> None:
        names = list(kernel.arg_names)
        missing = [k for k in (*template.dims, *([dtype_arg] if dtype_arg else [])) if k not in names]
        if missing:
            raise TunesvcError(
                f"{template.name} has no argument {missing[0]}; key names must be the kernel's arguments."
            )
        self.kernel = kernel
        #: a hit calls the compiled kernel's launcher (tunesvc.serving.launch)
        self._direct = DirectLaunch(kernel)
        self.template = template
        self.arg_names = names
        self._positions = [names.index(k) for k in template.dims]
        # itemgetter of two or more items always returns a tuple: a lone key position is repeated
        self._key_of = operator.itemgetter(*self._positions, *self._positions[:1] * (len(self._positions) == 1))
        self._dtype_pos = names.index(dtype_arg) if dtype_arg else 0
        #: a call with fewer positional arguments names a key argument: the slow path
        self._positional_needed = max(*self._positions, self._dtype_pos) + 1
        self._runtime = runtime
        self._runtime_args = (db, bundle, mode) if (db, bundle, mode) != (None, None, None) else None
        self._configs: dict[tuple, Config] = {}
        self._lock = threading.Lock()
        self.last: _runtime.LookupResult | None = None
        _KERNELS.add(self)

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        """The launcher for ``grid``, as ``kernel[grid]`` of a @triton.jit kernel.

        Launch with the tuned config of the call's key (tuned, nearest or heuristic). Keyword
        arguments after the key and dtype arguments (e.g. an untuned constexpr) pass straight
        through to the kernel. Everything the hit path reads is a local of this closure: no
        attribute lookups and no extra frame between the caller and the kernel's ``run``.
        """
        configs, key_of, dtype_pos, needed = self._configs, self._key_of, self._dtype_pos, self._positional_needed
        direct = self._direct

        def launch(*args: Any, **kwargs: Any) -> Any:
            if len(args) < needed:
                args, kwargs = self._positional(args, kwargs)
            typed = args[dtype_pos]
            config = configs.get((*key_of(args), typed.dtype, typed.get_device()))
            if config is None:
                config = self._resolve(grid, args, kwargs)
            return direct.launch(grid, args, {**kwargs, **config} if kwargs else config)

        return launch

    def run(self, *args: Any, grid: Any, **kwargs: Any) -> Any:
        """``kernel.run(*args, grid=...)``, as triton's own JIT functions offer it."""
        return self[grid](*args, **kwargs)

    def _positional(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """Key arguments given by name moved into place (the slow path of keyword calls)."""
        given = dict(zip(self.arg_names, args)) | kwargs
        lead = self.arg_names[: self._positional_needed]
        absent = [n for n in lead if n not in given]
        if absent:
            raise TunesvcError(f"{self.template.name}: argument {absent[0]} is missing.")
        return tuple(given[n] for n in lead), {k: v for k, v in given.items() if k not in lead}

    def runtime(self) -> Runtime:
        if self._runtime is None:
            if self._runtime_args is None:
                return _runtime.default_runtime()
            db, bundle, mode = self._runtime_args
            self._runtime = _runtime.Runtime(db=db, bundle=bundle, mode=mode)
        return self._runtime

    def _resolve(self, grid: Any, args: tuple, kwargs: dict[str, Any]) -> Config:
        typed = args[self._dtype_pos]
        memo_key = (*self._key_of(args), typed.dtype, typed.get_device())
        clash = sorted(set(kwargs) & set(self.template.space.names))
        if clash:
            raise TunesvcError(f"{self.template.name}: {clash[0]} is tuned by tunesvc; do not pass it.")
        with self._lock:  # one thread tunes a missed key; the others then find it here
            config = self._configs.get(memo_key)
            if config is not None:
                return config
            runtime = self.runtime()
            dtype = args[self._dtype_pos].dtype
            problem = {
                **{d: args[p] for d, p in zip(self.template.dims, self._positions)},
                "dtype": str(dtype).removeprefix("torch."),
            }
            if runtime.mode == "tune":
                if self.template._output is None:
                    raise TunesvcError(
                        f"{self.template.name}: mode 'tune' checks each candidate's output; "
                        "name the argument the kernel writes with tunesvc.autotune(..., output=...)."
                    )
                self.template._call = (grid, args, kwargs, self.template.problem(**problem))
            try:
                self.last = runtime.lookup_on(typed.get_device(), self.template, **problem)
            finally:
                self.template._call = None
            config = self._configs[memo_key] = dict(self.last.config)
            return config

    def forget(self) -> None:
        """Drop memoised configs (after the runtime changed): the next launches look up again."""
        with self._lock:
            self._configs.clear()


def autotune(
    configs: Any = None,
    key: Sequence[str] | None = None,
    prune_configs_by: dict[str, Any] | None = None,
    reset_to_zero: Sequence[str] | None = None,
    restore_value: Sequence[str] | None = None,
    pre_hook: Callable[..., Any] | None = None,
    post_hook: Callable[..., Any] | None = None,
    warmup: int | None = None,
    rep: int | None = None,
    use_cuda_graph: bool = False,
    do_bench: Callable[..., Any] | None = None,
    cache_results: bool = False,
    *,
    name: str | None = None,
    db: str | os.PathLike | None = None,
    bundle: str | os.PathLike | None = None,
    mode: str | None = None,
    space: str | os.PathLike | Sequence[Config] | None = None,
    reference: Callable[..., torch.Tensor] | None = None,
    output: str | None = None,
    heuristic: Callable[..., Config] | None = None,
    tolerance: float | None = None,
    dtype_arg: str | None = None,
    runtime: Runtime | None = None,
) -> Callable[[Any], Any]:
    """``triton.autotune``'s signature, tuned and stored by tunesvc.

    With ``triton.Config`` objects (``configs=[triton.Config(...), ...]``) this is an exact
    drop-in for triton.autotune (see :mod:`tunesvc._capture`): same arguments, same behaviour,
    same attributes; winners are kept in the store (``db``/``bundle``, default
    $TUNESVC_DB/$TUNESVC_BUNDLE/./tune.db) under ``name`` (default ``module:qualname``) and a
    miss is tuned in mode ``tune`` (default), served from a fallback in ``lookup``, or left to
    Triton in ``off``.

    With a TOML ``space`` (or plain dict configs) the kernel is a tunesvc template instead:
    ``key``: integer arguments the best config depends on; ``name``: its name in the store
    (default: the function's name); ``heuristic(**key_values, dtype=...)``: the config used when
    nothing is tuned (default: the space's first feasible config); ``output``: the argument the
    kernel writes, compared with ``reference(*args)`` (default: the heuristic config's output)
    within ``tolerance`` when a miss is tuned; ``runtime`` or ``db``/``bundle``/``mode``: where
    the configs come from (default: the process runtime).
    """
    if key is None:
        raise TunesvcError("tunesvc.autotune needs key=[...]: the arguments the best config depends on.")
    if space is None and _triton_configs(configs):
        if runtime is not None or reference is not None or output is not None or heuristic is not None:
            raise TunesvcError(
                "runtime, reference, output and heuristic belong to a space= kernel; a triton.Config list "
                "checks candidates against the first valid config."
            )
        from tunesvc._capture.launch import autotune as captured_autotune

        return captured_autotune(
            configs,
            key,  # type: ignore[arg-type]
            prune_configs_by,
            None if reset_to_zero is None else list(reset_to_zero),
            None if restore_value is None else list(restore_value),
            pre_hook,
            post_hook,
            warmup,
            rep,
            use_cuda_graph,
            do_bench,
            cache_results,
            name=name,
            mode=mode,
            db=db,
            bundle=bundle,
            tolerance=tolerance,
        )
    triton_only = {
        "prune_configs_by": prune_configs_by,
        "reset_to_zero": reset_to_zero,
        "restore_value": restore_value,
        "pre_hook": pre_hook,
        "post_hook": post_hook,
        "warmup": warmup,
        "rep": rep,
        "do_bench": do_bench,
    }
    given = [k for k, v in triton_only.items() if v is not None] + [
        k for k, v in (("use_cuda_graph", use_cuda_graph), ("cache_results", cache_results)) if v
    ]
    if given:
        raise TunesvcError(f"{given[0]} is a triton.autotune option: give configs as triton.Config objects to use it.")
    if space is None:
        space = configs
    elif configs is not None:
        raise TunesvcError("Give tunesvc.autotune configs or space=, not both.")
    if space is None:
        raise TunesvcError("tunesvc.autotune needs configs (triton.Config objects) or space=.")
    if runtime is not None and (db, bundle, mode) != (None, None, None):
        raise TunesvcError("Give tunesvc.autotune a runtime or db/bundle/mode, not both.")
    template_space = space

    def decorate(kernel: Any) -> TunedKernel:
        if not hasattr(kernel, "arg_names") or not hasattr(kernel, "run"):
            raise TunesvcError("tunesvc.autotune decorates a @triton.jit kernel; put it above @triton.jit.")
        out = None
        if output is not None:
            if output not in kernel.arg_names:
                raise TunesvcError(f"{kernel.fn.__name__} has no argument {output}; output must name one.")
            out = list(kernel.arg_names).index(output)
        template = KernelTemplate(
            kernel, name or kernel.fn.__name__, key, template_space, heuristic, out, reference, tolerance
        )
        return TunedKernel(kernel, template, dtype_arg, runtime, db, bundle, mode)

    return decorate


def _triton_configs(configs: Any) -> bool:
    """Whether ``configs`` is a non-empty list of triton.Config objects (triton.autotune's form)."""
    if isinstance(configs, (str, os.PathLike)) or not isinstance(configs, Sequence) or not configs:
        return False
    from triton import Config as TritonConfig

    return all(isinstance(c, TritonConfig) for c in configs)


def tuned(kernel: Any, space: str | os.PathLike | Sequence[Config], key: Sequence[str], **options: Any) -> TunedKernel:
    """``tunesvc.tuned(kernel, space, key, ...)``: :func:`autotune` as a wrapper instead of a decorator."""
    return autotune(key=key, space=space, **options)(kernel)


def _forget_all() -> None:
    for kernel in list(_KERNELS):
        kernel.forget()


def _locks_remade_in_the_child() -> None:
    """In a forked child: each kernel's lock made anew (one held by a parent's thread tuning a
    key at the fork would be held for ever in the child, where that thread does not exist)."""
    for kernel in list(_KERNELS):
        kernel._lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_locks_remade_in_the_child)


_runtime.on_configure.append(_forget_all)
