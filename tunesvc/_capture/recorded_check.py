"""Whether a recorded call (:func:`tunesvc._capture.describe_call`) can be replayed safely.

`tune misses --tune` and `tune verify --kernel` rebuild a captured kernel's call from a record in
the database and launch every candidate on it. A kernel indexes its tensors by its integer
arguments, its grid and the values of its integer tensors (offsets, indices); the record is data,
and one that was corrupted or edited after the program wrote it (an integer argument of 10**8
beside tensors of 1,500 elements) would make every candidate read and write far past the
buffers rebuilt for it, or launch more programs than ever finish. The record was written from a
real, working call, so these relations held when it was made; :func:`check_recorded_call`
refuses, in one sentence and before anything is allocated or launched, a record where they do
not hold:

- **Tensors**: shape and stride are lists of equal length (at most MAX_DIMS) of integers
  ``>= 0``; the dtype is torch's; recorded values (small integer tensors) are as many as the
  shape holds, each an integer in the dtype's range. A tensor's *extent* is the number of
  elements its storage spans, ``1 + sum((size - 1) * stride)`` (0 when it is empty): what a
  rebuilt tensor holds, exactly.
- **Memory**: the rebuilt tensors' bytes fit in a quarter of the device's memory (measuring keeps
  a pristine copy of them, the reference outputs and a candidate's outputs beside them).
- **Integers**: with ``E`` the largest extent of any tensor of the call (a tensor descriptor's
  base included), every integer argument lies in ``[-E, E]`` (a size, a stride, an offset or a
  count of anything a tensor of the call holds is no larger); a key argument (the sizes Triton
  keys on) in ``[0, E]``; a ``tl.constexpr`` argument up to the power of two at or above ``E``
  (a block that covers a whole row); and each recorded value of an integer tensor wider than a
  byte (offsets, indices: fla's ``cu_seqlens``, Liger's gather indices) in ``[-E, E]``. A call
  with no tensor reaches no memory through its integers, and is not bounded by them.
- **Grids**: each listed config's grid is 1 to 3 integers ``>= 0`` within CUDA's per-dimension
  limits, and launches at most ``max(E, GRID_FLOOR)`` programs (one program per element at
  most; GRID_FLOOR for persistent kernels, which launch one per SM whatever the size).
- **Tensor descriptors**: shape, strides and block shape of one length, the span of the
  descriptor within its base tensor's extent, each block dimension from 1 up to the power of two
  at or above ``E``.

This judges a record against itself, not against the kernel's code: it is what can be told
without running the kernel. It is conservative: a recorded integer beyond every tensor's extent
that is not a size (a seed, packed int4 weights in a small int32 tensor) is refused too, and
such a key is tuned where the program launches it (mode tune) instead. It is not complete: a
kernel may multiply two arguments bounded one by one (a row's stride by the program id), so a
record that passes is still replayed in a process of its own (:func:`tunesvc._capture.tune._apart`),
whose death ends only that replay.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tunesvc.errors import TunesvcError

#: dimensions of a recorded tensor at most
MAX_DIMS = 16
#: programs any recorded grid may launch whatever its tensors' extent (persistent kernels launch
#: one per SM, or a few per SM, on tensors that may be smaller)
GRID_FLOOR = 4096
#: CUDA's grid limits per dimension (x, y, z)
GRID_LIMITS = (2**31 - 1, 65535, 65535)
#: integer dtypes whose values are data, never an index (quantized bytes, masks): range-checked only
_BYTE_DTYPES = (torch.bool, torch.int8, torch.uint8)
#: what the rebuilt tensors may take of the device's memory (see the module docstring)
MEMORY_SHARE = 4


class RefusedCall(TunesvcError):
    """A recorded call that is not replayed: one sentence saying why."""


def _refuse(reason: str) -> RefusedCall:
    return RefusedCall(f"The recorded call is refused, never launched: {reason}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ints(value: Any, what: str, *, low: int = 0) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise _refuse(f"{what} is not a list of integers")
    if len(value) > MAX_DIMS:
        raise _refuse(f"{what} has {len(value)} dimensions, more than {MAX_DIMS}")
    below = next((v for v in value if v < low), None)
    if below is not None:
        raise _refuse(f"{what} holds {below}, below {low}")
    return value


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


class _Tensor:
    """One recorded tensor, checked: its dtype, extent in elements, bytes and recorded values."""

    def __init__(self, spec: Any, where: str) -> None:
        if not isinstance(spec, dict):
            raise _refuse(f"{where} is not a tensor record")
        shape = _ints(spec.get("shape"), f"the shape of {where}")
        stride = _ints(spec.get("stride"), f"the stride of {where}")
        if len(shape) != len(stride):
            raise _refuse(f"{where} has {len(shape)} sizes but {len(stride)} strides")
        dtype = getattr(torch, str(spec.get("dtype")).removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise _refuse(f"{where} names an unknown dtype {spec.get('dtype')!r}")
        self.dtype, self.where = dtype, where
        numel = math.prod(shape)
        self.extent = 0 if numel == 0 else 1 + sum((n - 1) * s for n, s in zip(shape, stride))
        self.bytes = self.extent * dtype.itemsize
        self.values: list[int] = []
        if "values" in spec:
            values = spec["values"]
            if dtype.is_floating_point or dtype.is_complex:
                raise _refuse(f"{where} is a {dtype} tensor with recorded values, which only integer tensors have")
            if not isinstance(values, list) or len(values) != numel:
                count = len(values) if isinstance(values, list) else "no list of"
                raise _refuse(f"{where} has shape {shape} ({numel} elements) but {count} recorded values")
            if dtype == torch.bool:
                if not all(isinstance(v, (bool, int)) and v in (0, 1) for v in values):
                    raise _refuse(f"{where} is a bool tensor with values other than true and false")
            else:
                info = torch.iinfo(dtype)
                odd = next((v for v in values if not _is_int(v) or not info.min <= v <= info.max), None)
                if odd is not None or not all(_is_int(v) for v in values):
                    raise _refuse(f"{where} holds the value {odd!r}, not an integer of {dtype}")
                if dtype not in _BYTE_DTYPES:
                    self.values = values


def check_recorded_call(
    call: Any,
    *,
    arg_names: list[str],
    key_names: list[str],
    constexprs: set[str],
    listed: int,
    memory_bytes: int,
) -> None:
    """Raise :class:`RefusedCall` (one sentence) where ``call`` cannot be replayed safely (see the
    module docstring); ``arg_names``, ``key_names`` and ``constexprs`` are the kernel's, ``listed``
    its count of listed configs (one grid each), ``memory_bytes`` the device's memory."""
    if not isinstance(call, dict):
        raise _refuse("it is not a record of arguments")
    args, kwargs, grids = call.get("args", []), call.get("kwargs", {}), call.get("grids", [])
    if not isinstance(args, list) or not isinstance(kwargs, dict) or not isinstance(grids, list):
        raise _refuse("its arguments, keyword arguments or grids are not lists and a mapping")
    if len(args) > len(arg_names):
        raise _refuse(f"it has {len(args)} arguments, and the kernel takes {len(arg_names)}")
    if len(grids) > listed:
        raise _refuse(f"it has {len(grids)} grids, and the kernel lists {listed} configs")
    named = [*zip(arg_names, args), *kwargs.items()]
    tensors: list[_Tensor] = []
    scalars: list[tuple[str, int]] = []
    descriptors: list[tuple[str, dict[str, Any], _Tensor]] = []
    for name, spec in named:
        if not isinstance(spec, dict):
            raise _refuse(f"argument {name} is not a record")
        if "tensor" in spec:
            tensors.append(_Tensor(spec["tensor"], f"tensor argument {name}"))
        elif "descriptor" in spec:
            desc = spec["descriptor"]
            if not isinstance(desc, dict):
                raise _refuse(f"argument {name} is not a tensor descriptor record")
            base = _Tensor(desc.get("tensor"), f"the tensor under descriptor {name}")
            tensors.append(base)
            descriptors.append((name, desc, base))
        elif "value" in spec and _is_int(spec["value"]):
            scalars.append((name, spec["value"]))
    total = sum(t.bytes for t in tensors)
    budget = memory_bytes // MEMORY_SHARE
    if total > budget:
        raise _refuse(
            f"its tensors would take {total:,} bytes, more than a {MEMORY_SHARE}th of this device's {memory_bytes:,}"
        )
    reach = max((t.extent for t in tensors), default=0)
    if tensors:
        _check_integers(scalars, tensors, reach, set(key_names), constexprs)
    for name, desc, base in descriptors:
        _check_descriptor(name, desc, base, reach)
    _check_grids(grids, reach)


def _check_integers(
    scalars: list[tuple[str, int]], tensors: list[_Tensor], reach: int, keys: set[str], constexprs: set[str]
) -> None:
    past = f"while the largest tensor of the call spans {reach} elements, so a launch could reach past its buffers"
    for name, value in scalars:
        if name in keys and name not in constexprs and value < 0:
            raise _refuse(f"key argument {name} is {value}, a negative size")
        bound = _pow2_at_least(reach) if name in constexprs else reach
        if abs(value) > bound:
            raise _refuse(f"argument {name} is {value} {past}")
    for t in tensors:
        odd = next((v for v in t.values if abs(v) > reach), None)
        if odd is not None:
            raise _refuse(f"{t.where} holds the value {odd} {past}")


def _check_descriptor(name: str, desc: dict[str, Any], base: _Tensor, reach: int) -> None:
    shape = _ints(desc.get("shape"), f"the shape of descriptor {name}")
    strides = _ints(desc.get("strides"), f"the strides of descriptor {name}")
    block = _ints(desc.get("block_shape"), f"the block shape of descriptor {name}", low=1)
    if not len(shape) == len(strides) == len(block):
        raise _refuse(f"descriptor {name} has shape, strides and block shape of different lengths")
    spans = 0 if math.prod(shape) == 0 else 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    if spans > base.extent:
        raise _refuse(f"descriptor {name} spans {spans} elements of a tensor of {base.extent}")
    if max(block, default=1) > _pow2_at_least(reach):
        raise _refuse(f"descriptor {name} has a block of {max(block)}, past a tensor of {reach} elements")


def _check_grids(grids: list[Any], reach: int) -> None:
    most = max(reach, GRID_FLOOR)
    for grid in grids:
        if grid is None:
            continue
        if not isinstance(grid, list) or not 1 <= len(grid) <= 3 or not all(_is_int(g) for g in grid):
            raise _refuse(f"its grid {grid!r} is not 1 to 3 integers")
        over = next(((g, limit) for g, limit in zip(grid, GRID_LIMITS) if not 0 <= g <= limit), None)
        if over is not None:
            raise _refuse(f"its grid {tuple(grid)} has a dimension of {over[0]}, outside 0 to {over[1]}")
        programs = math.prod(grid)
        if programs > most:
            raise _refuse(
                f"its grid {tuple(grid)} launches {programs:,} programs, more than the "
                f"{most:,} that the largest tensor of the call ({reach} elements) allows"
            )
