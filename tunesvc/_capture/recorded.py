"""A captured call as data, and back: what offline tuning and `tune verify` replay.

:func:`describe_call` records a call (its tensors by shape, stride and dtype, the grid of each
listed config); :func:`record_missed_call` writes a miss served untuned, with its call, for
`tune misses --tune`. Offline, :func:`find_autotuner` imports a kernel by its name,
:func:`check_call` refuses a record that cannot be replayed safely, and :func:`rebuild_call`
makes arguments from one. Tuning a recorded key and re-measuring its stored configs
(:func:`tunesvc._capture.tune.tune_recorded`, :func:`tunesvc._capture.tune.measure_stored`) are
:mod:`tunesvc._capture.tune`'s.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING
from typing import Any

import torch
from triton.runtime.autotuner import Autotuner

from tunesvc._capture.bench import is_descriptor
from tunesvc._capture.identity import config_dict
from tunesvc._capture.identity import kernel_name
from tunesvc._capture.identity import value_text
from tunesvc.errors import TunesvcError
from tunesvc.space import config_hash
from tunesvc.text import visible
from tunesvc.text import warn

if TYPE_CHECKING:
    from tunesvc._capture.sharing import Shared
    from tunesvc._capture.sharing import State
    from tunesvc.device import Device


def record_missed_call(
    shared: Shared,
    state: State,
    text: str,
    tuner: Autotuner,
    args: tuple,
    kwargs: dict,
    *,
    values: bool = True,
    traced: bool = False,
    create: bool = False,
) -> None:
    """Write the miss to the database for offline tuning; serving goes on if it cannot (``values``,
    ``traced``: see :func:`describe_call`; ``create``: make the database where there is none)."""
    from tunesvc.store import DatabaseLocked

    if shared.locked_out is not None:  # another process held the write lock: nothing is written
        return
    try:
        store = shared.store(create=create)
        if store is None:
            return
        from tunesvc.device import current_device

        device = current_device()
        call = describe_call(tuner, args, kwargs, values=values, traced=traced)
        store.record_miss(state.template, device, text, call)
    except DatabaseLocked as exc:  # said once for the process, not once a miss
        shared.lock_out(exc)
    except Exception as exc:  # a serving process never fails on bookkeeping
        warn(visible(f"tunesvc: could not record the miss of {state.name} ({exc})."), RuntimeWarning)


def describe_call(
    tuner: Autotuner, args: tuple, kwargs: dict[str, Any], *, values: bool = True, traced: bool = False
) -> dict[str, Any]:
    """The call's arguments as data (tensors by shape, stride and dtype; small integer tensors by
    value, since they are often offsets or indices), and the grid each listed config launches.
    ``values=False`` (inside CUDA-graph capture, where reading a GPU tensor on the host is refused):
    GPU tensors by shape, stride and dtype alone. ``traced``: the tensors are a trace's stand-ins
    (torch.compile's fake tensors), which hold no values at all: every tensor by shape alone."""

    def arg(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            out: dict[str, Any] = {
                "tensor": {"shape": list(value.shape), "stride": list(value.stride()), "dtype": str(value.dtype)}
            }
            readable = not traced and (values or value.device.type == "cpu")
            if readable and not value.is_floating_point() and value.numel() <= 4096:
                out["tensor"]["values"] = value.detach().cpu().flatten().tolist()
            return out
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"value": value}
        if is_descriptor(value) and isinstance(value.base, torch.Tensor):
            return {
                "descriptor": {
                    **arg(value.base),
                    **{f: [int(x) for x in getattr(value, f)] for f in ("shape", "strides", "block_shape")},
                    "padding": str(getattr(value, "padding", "zero")),
                }
            }
        return {"unsupported": type(value).__name__}

    grid = kwargs.get("grid")
    nargs = {**dict(zip(tuner.arg_names, args)), **kwargs}
    grids: list[list[int] | None] = []
    for config in tuner.configs:
        try:
            g = grid({**nargs, **config.all_kwargs()}) if callable(grid) else grid
            grids.append([int(x) for x in (g if isinstance(g, (tuple, list)) else (g,))])
        except Exception:
            grids.append(None)
    return {
        "args": [arg(a) for a in args],
        "kwargs": {k: arg(v) for k, v in kwargs.items() if k not in ("grid", "warmup")},
        "grids": grids,
    }


def find_autotuner(name: str) -> Autotuner:
    """Import the module ``name`` (``module:qualname``) names and find its autotuned kernel.

    Only ever called on a user's request on the command line (the module's import runs its code).
    TunesvcError, in one sentence, when the module does not import or holds no such kernel.
    """
    module_name, _, qualname = name.partition(":")
    if module_name == "__main__":
        raise TunesvcError(f"{name} was defined in a script run as __main__; move it to a module to tune it offline.")
    if "<locals>" in qualname.split("."):  # torchao builds its fp8 GEMMs inside a function, for one
        raise TunesvcError(
            f"{name} is defined inside a function, so no import reaches it; "
            "tune it where the program launches it (mode tune) instead."
        )
    from tunesvc.template import import_user_module

    try:
        module = import_user_module(module_name)
    except TunesvcError as exc:  # no such module: its sentence says where it was looked for
        raise TunesvcError(
            f"Module {module_name} of {name} does not import here: {str(exc)[:1].lower()}{str(exc)[1:]}"
        ) from None
    except Exception as exc:
        raise TunesvcError(
            f"Module {module_name} of {name} does not import here ({type(exc).__name__}: {exc})."
        ) from None
    for value in list(vars(module).values()):
        obj, seen = value, 0
        while obj is not None and seen < 8:  # a wrapper (heuristics, a library's) walked by .fn
            if isinstance(obj, Autotuner):
                try:
                    if kernel_name(obj.fn) == name:
                        return obj
                except AttributeError:
                    pass
                break
            obj, seen = getattr(obj, "fn", None), seen + 1
    raise TunesvcError(f"Module {module_name} has no autotuned kernel {qualname}; was it renamed?")


def _host_memory() -> int:
    """This machine's memory in bytes (the interpreter's device memory)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf: 16 GiB
        return 16 << 30


def _constexprs(tuner: Autotuner) -> set[str]:
    """The names of the kernel's ``tl.constexpr`` parameters (its JITFunction's, under any wrappers)."""
    fn: Any = tuner.fn
    for _ in range(8):
        if hasattr(fn, "params"):
            return {p.name for p in fn.params if getattr(p, "is_constexpr", False)}
        fn = getattr(fn, "fn", None)
    return set()


def check_call(tuner: Autotuner, call: Any, device: Device, shape_key: str | None = None) -> None:
    """Refuse (:class:`tunesvc._capture.recorded_check.RefusedCall`, one sentence) a recorded call that
    cannot be replayed safely on ``device`` (see :mod:`tunesvc._capture.recorded_check`), or whose key
    arguments and dtypes disagree with ``shape_key``, the key it is stored under."""
    from tunesvc._capture.recorded_check import RefusedCall
    from tunesvc._capture.recorded_check import check_recorded_call

    check_recorded_call(
        call,
        arg_names=list(tuner.arg_names),
        key_names=list(tuner.keys),
        constexprs=_constexprs(tuner),
        listed=len(tuner.configs),
        memory_bytes=device.memory_bytes or _host_memory(),
    )
    if shape_key is None:
        return
    stored = dict(part.partition("=")[::2] for part in shape_key.split(","))
    for name, spec in [*zip(tuner.arg_names, call.get("args", [])), *call.get("kwargs", {}).items()]:
        if name in tuner.keys and "value" in spec:
            field, recorded = name, value_text(spec["value"])
        elif "tensor" in spec:
            field, recorded = f"{name}.dtype", str(spec["tensor"]["dtype"]).removeprefix("torch.")
        else:
            continue
        if field in stored and stored[field] != recorded:
            raise RefusedCall(
                f"The recorded call is refused, never launched: its {field} is {recorded}, "
                f"and the key it is stored under says {stored[field]}."
            )


def rebuild_call(
    tuner: Autotuner, call: dict[str, Any], device: Device, shape_key: str | None = None
) -> tuple[tuple, dict[str, Any], dict[str, Any]]:
    """Arguments of a recorded call (random floats, recorded small integer tensors), and the grid
    of each listed config by its hash. TunesvcError when the record cannot be replayed, or not
    safely (:func:`check_call`, before anything is allocated)."""
    from tunesvc.device import torch_device

    check_call(tuner, call, device, shape_key)
    where = torch_device()

    def value(spec: dict[str, Any]) -> Any:
        if "value" in spec:
            return spec["value"]
        if "descriptor" in spec:
            return descriptor(spec["descriptor"])
        if "tensor" not in spec:
            raise TunesvcError(
                f"The recorded call has an argument of type {spec.get('unsupported')}; it cannot be replayed."
            )
        t = spec["tensor"]
        dtype = getattr(torch, str(t["dtype"]).removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise TunesvcError(f"The recorded call names an unknown dtype {t['dtype']!r}.")
        # filled through the storage it spans: a stride of 0 (an expanded tensor) makes elements
        # share a location, which torch's in-place fills and copies refuse
        shape, stride = t["shape"], t["stride"]
        extent = 0 if math.prod(shape) == 0 else 1 + sum((n - 1) * s for n, s in zip(shape, stride))
        storage = torch.zeros(extent, dtype=dtype, device=where)
        if "values" in t:
            spots = torch.arange(extent, device=where).as_strided(shape, stride).flatten()
            storage[spots] = torch.tensor(t["values"], dtype=dtype, device=where)
        elif dtype.is_floating_point:
            storage.normal_()
        return storage.as_strided(shape, stride)

    def descriptor(spec: dict[str, Any]) -> Any:
        """A host-side tensor descriptor over a new tensor (FlagGems' host-TMA GEMM takes them)."""
        try:
            from triton.tools.tensor_descriptor import TensorDescriptor
        except ImportError:
            raise TunesvcError(
                "The recorded call has a tensor descriptor argument and this Triton has no host-side descriptors."
            ) from None
        base = value(spec)
        try:
            fields = {f: [int(x) for x in spec[f]] for f in ("shape", "strides", "block_shape")}
            return TensorDescriptor(base, **fields, padding=str(spec.get("padding", "zero")))
        except (AssertionError, KeyError, TypeError, ValueError) as exc:  # Triton checks with asserts
            raise TunesvcError(
                f"The recorded call's tensor descriptor is not valid here ({exc or 'a check failed'})."
            ) from None

    args = tuple(value(a) for a in call.get("args", []))
    kwargs = {k: value(v) for k, v in call.get("kwargs", {}).items()}
    grids = {
        config_hash(config_dict(c)): tuple(g) for c, g in zip(tuner.configs, call.get("grids", [])) if g is not None
    }
    if not grids:
        raise TunesvcError("The recorded call has no launch grid; launch the kernel once in mode tune instead.")
    return args, {**kwargs, "grid": None, "warmup": False}, grids
