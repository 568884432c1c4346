"""Checking and timing a captured key's candidates on the call's own arguments.

The candidates are the configs Triton's pruning keeps for the call (:func:`pruned_configs`,
:class:`Pruned`); :class:`CaptureBench` measures each (its output against the first valid
config's, the inputs restored before each one), :func:`measure_configs` runs it over the candidates and
:func:`contender_count` says how many finalists are re-timed. Measuring leaves no trace but the store:
:func:`untraced` (no autograd; the RNG, the device and the stream put back), :func:`aliased`
(the call's tensors under version counters of their own), and :func:`measuring_context`, which marks the
thread so that the autotuned launches the measuring causes tune nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING
from typing import Any

import torch

from tunesvc import settings
from tunesvc._capture.failopen import LeftToTriton
from tunesvc._capture.identity import config_dict
from tunesvc.bench import Bench
from tunesvc.bench import Measurement
from tunesvc.bench import Status
from tunesvc.bench import compile_error_types
from tunesvc.bench import one_line as _one_line
from tunesvc.bench import out_of_resources_types
from tunesvc.bench import relative_error
from tunesvc.space import config_hash
from tunesvc.tuning.key import IN_PROCESS

if TYPE_CHECKING:
    from triton.runtime.autotuner import Autotuner

    from tunesvc.device import Device


#: a candidate's largest relative error against the first valid config's output, by dtype
#: (settings.CONFIG_TOLERANCE: the one table, by name)
TOLERANCE = {getattr(torch, name): tolerance for name, tolerance in settings.CONFIG_TOLERANCE.items()}
LOOSE_TOLERANCE = settings.CONFIG_TOLERANCE_OTHER

#: at most this many finalists, those whose first time is within FINALIST_WINDOW of the
#: fastest's (capture's parameters of the one finalist rule, tunesvc.tuning.key.IN_PROCESS)
FINALISTS = IN_PROCESS.count
FINALIST_WINDOW = IN_PROCESS.window


#: how deep this thread is in tunesvc's own measuring of a kernel (see :func:`measuring_context`)
MEASURING = threading.local()


@contextmanager
def measuring_context() -> Iterator[None]:
    """Mark this thread as measuring: autotuned launches that the measuring itself causes tune
    nothing. A library may have put autotuned kernels under torch's ops (FlagGems' ``use_gems``
    and ``enable`` replace the CUDA kernels of norm, sub, copy and others), and tunesvc's checks
    and timing call those ops: tuning such a key there would be a tuning inside a tuning, and
    the same kernel's key again inside its own (its lock is held). Such a key gets its stored
    winner or the fallback, and is not remembered: when the program launches it, it is tuned.
    """
    MEASURING.depth = getattr(MEASURING, "depth", 0) + 1
    try:
        yield
    finally:
        MEASURING.depth -= 1


def is_nested() -> bool:
    return getattr(MEASURING, "depth", 0) > 0


@contextmanager
def untraced(tensors: list[torch.Tensor]) -> Iterator[None]:
    """Tuning leaves no trace but the store: no autograd graph (inference mode where the call's
    tensors are inference tensors, which only it may write), the RNG states, the current CUDA
    device and stream as they were."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    device = torch.cuda.current_device() if cuda else None
    stream = torch.cuda.current_stream() if cuda else None
    inference = any(t.is_inference() for t in tensors)
    grad_off = torch.inference_mode() if inference else torch.no_grad()
    try:
        with torch.random.fork_rng(devices=[device] if device is not None else [], device_type="cuda"), grad_off:
            yield
    finally:
        if device is not None:
            torch.cuda.set_device(device)
            torch.cuda.set_stream(stream)  # type: ignore[arg-type]


def aliased(values: Any) -> Any:
    """The call's arguments with each tensor as ``Tensor.data``: the same memory under a version
    counter of its own, so that restoring the inputs between candidates (and reset_to_zero,
    restore_value) never bumps the version of a tensor autograd saved for backward."""

    def alias(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.data
        base = v.base if is_descriptor(v) else None
        if isinstance(base, torch.Tensor) and dataclasses.is_dataclass(v) and not isinstance(v, type):
            return dataclasses.replace(v, base=base.data)
        return v

    if isinstance(values, dict):
        return {k: alias(v) for k, v in values.items()}
    return tuple(alias(v) for v in values)


def pruned_configs(tuner: Autotuner, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
    """The configs Triton's pruning keeps for a call, each once (a list may repeat one: torchao's
    int8 GEMM lists two of its 27 twice). ``prune_configs`` reads the call from ``tuner.nargs``,
    which is put back as it was after: a subclass's own run (FlagGems' LibTuner) sets it before
    its cache lookup, which lands here, and reads it again after."""
    before = getattr(tuner, "nargs", None)
    tuner.nargs = dict(zip(tuner.arg_names, args))
    try:
        kept = tuner.prune_configs(kwargs)
    finally:
        tuner.nargs = before
    unique: dict[str, Any] = {}
    for config in kept:
        unique.setdefault(config_hash(config_dict(config)), config)
    return list(unique.values())


class Pruned:
    """The configs Triton's pruning keeps for one call (:func:`pruned_configs`), computed on first use."""

    def __init__(self, tuner: Autotuner, args: tuple, kwargs: dict[str, Any]) -> None:
        self._call = (tuner, args, kwargs)
        self._configs: list[Any] | None = None

    def __call__(self) -> list[Any]:
        if self._configs is None:
            tuner, args, kwargs = self._call
            try:
                kept = pruned_configs(tuner, args, kwargs)
            except Exception as exc:
                if not _raised_by_pruning(exc):
                    raise
                # the kernel's own pruning refuses the call: Triton's run raises it, in its words
                raise LeftToTriton from exc
            if not kept:  # an early_config_prune that kept nothing (Triton 3.6 has no check of its own)
                raise LeftToTriton
            self._configs = kept
        return self._configs


@functools.cache
def benchmarks_one_config() -> bool:
    """Whether this Triton's autotuner benchmarks a key whose pruning keeps one config, and so
    zeroes its ``reset_to_zero`` arguments and prints its TRITON_PRINT_AUTOTUNING line as after
    any tuning: before Triton 3.8, which launches that config unmeasured, as a kernel's one
    listed config, and leaves the arguments as the caller gave them."""
    import triton

    found = re.match(r"(\d+)\.(\d+)", triton.__version__)
    return found is not None and (int(found[1]), int(found[2])) < (3, 8)


def _raised_by_pruning(exc: BaseException) -> bool:
    """Whether ``exc`` came from the autotuner's ``prune_configs`` (Triton's, or a subclass's; the
    kernel's ``early_config_prune`` and ``perf_model`` run inside it), not from tunesvc's own code:
    the frame that :func:`pruned_configs` called is ``prune_configs``."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is pruned_configs.__code__:
            below = tb.tb_next
            return below is not None and below.tb_frame.f_code.co_name == "prune_configs"
        tb = tb.tb_next
    return False


class CaptureBench(Bench):
    """Checks and times a captured kernel's configs on one call's own arguments.

    The tensors of the call are snapshotted before the first candidate and restored before each
    one, so every candidate starts from the same inputs (an accumulating or in-place kernel is
    judged on what one call computes). A candidate's output is every tensor argument after its
    launch (before the post-hook, which may restore them), compared with the first valid
    config's: the tensors that config wrote by relative error within the dtype's tolerance,
    the others exactly, except scratch tensors of per-program partials (:func:`_slot_axes`), which
    are compared by their sums over the axes where the two configs wrote different slots (the
    trial's message says so). Where that config wrote NaN or inf and a later one writes none,
    the later one is the reference from then on (a config that computes garbage may come first
    in a list).
    """

    def __init__(
        self,
        tuner: Autotuner,
        device: Device,
        args: tuple,
        kwargs: dict[str, Any],
        *,
        rep_ms: float = settings.REP_MS,
        tolerance: float | None = None,
        grids: dict[str, Any] | None = None,
        candidates: list[Any] = (),  # type: ignore[assignment]
    ) -> None:
        self.tuner = tuner
        self.device = device
        self.rep_ms = rep_ms
        self.problem = {}
        self.inputs = (tuple(args), dict(kwargs))
        self._input_sets = None
        self._tolerance = tolerance
        self._grids = grids
        #: every config a finalist's stored dict may name: listed, or built by the pruner for this call
        self._configs = {config_hash(config_dict(c)): c for c in (*tuner.configs, *candidates)}
        self._tensors = tensors_of(self.inputs)
        self._names = _tensor_names(tuner, self.inputs, self._tensors)
        self._pristine = [t.clone() for t in self._tensors]
        #: the tensors the autotuner zeroes before each launch (reset_to_zero), by position
        reset = set(getattr(tuner, "reset_to_zero", None) or ())
        self._reset = [name in reset for name in self._names]
        self._pristine_zero: list[bool] | None = None  # made by the first _starts
        self.ref: list[torch.Tensor] | None = None
        self._ref_starts: list[_Start] = []
        self._written: list[bool] = []
        #: set by the measure that made its config the reference in place of an earlier one
        self.took_over = False
        self._ref_finite = True
        self.measurements = 0

    def restore(self) -> None:
        for t, saved in zip(self._tensors, self._pristine):
            _write(t, saved)

    def input_sets(self) -> list[Any]:
        if self._input_sets is None:
            from tunesvc.bench import input_bytes
            from tunesvc.bench import input_sets_needed
            from tunesvc.bench import l2_bytes

            count = input_sets_needed(input_bytes(self._pristine), l2_bytes()) if self.device.is_gpu else 1
            self._input_sets = [self.inputs] + [_cloned(self.inputs) for _ in range(count - 1)]
        return self._input_sets

    def _launch(self, config: Any, inputs: Any, *, check: bool = False, starts: list[_Start] | None = None) -> Any:
        args, kwargs = inputs
        if self._grids is not None:
            kwargs = {**kwargs, "grid": self._grids[config_hash(config_dict(config))]}

        def outputs() -> list[torch.Tensor]:  # read before the post-hook, which may restore them
            self._sync()
            return [t.clone() for t in self._tensors]

        def started() -> None:  # after the pre-hooks, which may zero tensors (reset_to_zero, init_to_zero)
            if starts is not None:
                try:
                    starts[:] = self._starts()
                except Exception:  # a torch op a library replaced refused: no scratch, every tensor element-wise
                    starts.clear()

        return launch_listed(self.tuner, config, args, kwargs, outputs if check else None, started)

    def _starts(self) -> list[_Start]:
        """What each tensor holds as the launch starts: whether it is all zero, and whether the
        autotuner or a pre-hook made it so (a tensor declared scratch, see :func:`_slot_axes`)."""
        if self._pristine_zero is None:
            self._pristine_zero = [_is_zero(t) for t in self._pristine]
        out = []
        for t, saved, reset, zero in zip(self._tensors, self._pristine, self._reset, self._pristine_zero):
            if _same(t, saved):
                out.append(_Start(zero=zero, zeroed=reset and zero))
            else:
                now_zero = _is_zero(t)
                out.append(_Start(zero=now_zero, zeroed=now_zero))
        return out

    def measure(self, config: Any) -> Measurement:
        self.measurements += 1
        self.restore()
        start = time.perf_counter()
        starts: list[_Start] = []
        try:
            outputs = self._launch(config, self.inputs, check=True, starts=starts)
            self._sync()
        except out_of_resources_types() as exc:
            return Measurement(Status.INVALID, message=_one_line(exc))
        except compile_error_types() as exc:
            return Measurement(Status.COMPILE_ERROR, message=_one_line(exc))
        except Exception as exc:  # a candidate's failure is data
            return Measurement(Status.ERROR, message=f"{type(exc).__name__}: {_one_line(exc)}")
        elapsed_ms = (time.perf_counter() - start) * 1e3
        assert outputs is not None
        note = None
        if self.ref is None:  # the first valid config is the reference
            self.ref, self._ref_starts = outputs, starts
            self._written = [not _same(out, saved) for out, saved in zip(outputs, self._pristine)]
            self._ref_finite = self._finite(outputs)
            err = 0.0
        elif not self._ref_finite and self._finite(outputs):
            # the reference wrote NaN or inf where this config writes none: this one takes over,
            # and the configs measured before it are to be judged again (see measure_configs)
            self.ref, self._ref_starts, self._ref_finite, self.took_over = outputs, starts, True, True
            err = 0.0
        else:
            err, message, note = self._error(outputs, starts)
            if message:
                return Measurement(Status.WRONG_RESULT, rel_error=err, message=message)
        if not self.device.is_gpu:  # the interpreter: its one run is its time
            how = "timed: interpreter, wall clock of its one run"
            return Measurement(
                Status.OK, time_ms=elapsed_ms, spread=0.0, reps=1, rel_error=err, message=_and(how, note)
            )
        timed = self._timed(self._launcher(config), rel_error=err)
        return dataclasses.replace(timed, message=_and(timed.message, note)) if timed.ok and note else timed

    def _finite(self, outputs: list[torch.Tensor]) -> bool:
        """No NaN or inf in the floating tensors the reference config wrote."""
        return all(
            bool(torch.isfinite(_widened(out)).all())
            for out, written in zip(outputs, self._written)
            if written and (out.is_floating_point() or out.is_complex())
        )

    def _error(self, outputs: list[torch.Tensor], starts: list[_Start]) -> tuple[float, str | None, str | None]:
        """The largest relative error against the reference, the reason where it is wrong (None
        where it is right), and a note naming the tensors compared by their slot sums."""
        assert self.ref is not None
        worst = 0.0
        summed: list[str] = []
        for i, (out, ref, written) in enumerate(zip(outputs, self.ref, self._written)):
            what, dtype = f"tensor argument {i} ({self._names[i]})", out.dtype
            try:
                axes = _slot_axes(out, ref, starts[i], self._ref_starts[i]) if starts and self._ref_starts else None
            except Exception:  # a torch op a library replaced refused: compared element by element
                axes = None
            if axes is not None:
                out, ref = _slot_sums(out, axes), _slot_sums(ref, axes)
                over = f"its sums over {_listed(axes)} (the configs wrote different slots of it)"
                summed.append(f"{what} compared by {over}")
                what = f"{what}, by {over}"
            elif not written or not (out.is_floating_point() or out.is_complex()):
                if not _same(out, ref):
                    return math.inf, f"{what}: differs from the first valid config's", None
                continue
            if not (out.is_floating_point() or out.is_complex()):  # slot sums of integers: exact
                if not _same(out, ref):
                    return math.inf, f"{what}: differs from the first valid config's", None
                continue
            tolerance = self._tolerance if self._tolerance is not None else TOLERANCE.get(dtype, LOOSE_TOLERANCE)
            err = relative_error(_widened(out), _widened(ref))
            if not err <= tolerance:
                return err, f"{what}: relative error {err:.3g} > {tolerance:g} against the first valid config", None
            worst = max(worst, err)
        return worst, None, "; ".join(summed) or None

    def time_peer(self) -> Measurement:
        """INVALID: a captured kernel has no template, so no torch peer (Bench's would raise on it)."""
        return Measurement(Status.INVALID, message="a captured kernel has no torch peer")

    def _launcher(self, config: Any):
        if isinstance(config, dict):  # a finalist, by its stored dict
            config = self._configs[config_hash(config)]
        return lambda inputs: lambda: self._launch(config, inputs)


def _and(how: str | None, note: str | None) -> str | None:
    """An ok measurement's message: how it was timed, then what its check noted."""
    return "; ".join(part for part in (how, note) if part) or None


def contender_count(measured: list[Measurement]) -> int:
    """How many of a key's fastest correct candidates capture's finalists take on a GPU (the one
    rule, :class:`tunesvc.tuning.key.Finalists`, with capture's window): those whose first time
    is within FINALIST_WINDOW of the fastest, at most FINALISTS. A fastest candidate ahead of
    every other by more than the window wins on its first time (one contender: no re-timing)."""
    return IN_PROCESS.contenders(m.time_ms if m.ok else None for m in measured)


@dataclasses.dataclass(frozen=True)
class _Start:
    """A tensor as a checked launch starts: all zero, and zeroed by the autotuner or a pre-hook."""

    zero: bool
    zeroed: bool


def _slot_axes(out: torch.Tensor, ref: torch.Tensor, start: _Start, ref_start: _Start) -> tuple[int, ...] | None:
    """The axes over which two configs' outputs of one tensor are compared by their sums, or None
    for an element-by-element comparison.

    A tensor that starts both launches all zero, whose written (nonzero) slots differ along some
    axes, is compared by its sums over those axes, where it is declared scratch (zeroed by the
    autotuner or a pre-hook) or one config's slots along each of them are a subset of the
    other's; every other tensor element by element.

    Why: a kernel that writes per-program partials (one slot per program along an axis, split-K,
    atomics into a zeroed buffer) leaves its reader to sum them, and a config with other blocks
    uses other slots, so only the sums over the slot axes are what the program computes. A slot
    is written where any element in it is nonzero (a write of zero over zero is invisible, and
    adds nothing to a sum). A tensor only the program zeroed (``torch.zeros``) may be a true
    output, so there the slots must nest, as those of fewer programs do: a config writing its
    results one place off is then compared element by element, and rejected.
    """
    if not (start.zero and ref_start.zero) or out.shape != ref.shape or out.dim() == 0 or out.numel() == 0:
        return None
    declared = start.zeroed and ref_start.zeroed
    written, ref_written = _widened(out) != 0, _widened(ref) != 0
    axes = []
    for axis in range(out.dim()):
        others = tuple(a for a in range(out.dim()) if a != axis)
        used = written.any(dim=others) if others else written
        ref_used = ref_written.any(dim=others) if others else ref_written
        if torch.equal(used, ref_used):
            continue
        if not declared and bool((used & ~ref_used).any()) and bool((ref_used & ~used).any()):
            return None
        axes.append(axis)
    return tuple(axes) or None


def _slot_sums(t: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
    """``t`` summed over ``axes``: in float64 (complex as its real and imaginary parts), integers
    and bools in int64."""
    if t.is_complex():
        return torch.view_as_real(t.sum(dim=axes, dtype=torch.complex128))
    if t.is_floating_point():
        return _widened(t).sum(dim=axes, dtype=torch.float64)
    return t.sum(dim=axes, dtype=torch.int64)


def _listed(axes: tuple[int, ...]) -> str:
    if len(axes) == 1:
        return f"axis {axes[0]}"
    return f"axes {', '.join(map(str, axes[:-1]))} and {axes[-1]}"


def _is_zero(t: torch.Tensor) -> bool:
    """Every element zero (a tensor of none is not: it holds no slots)."""
    return t.numel() > 0 and not bool((_widened(t) != 0).any())


def _widened(t: torch.Tensor) -> torch.Tensor:
    """A float tensor of a dtype torch does little arithmetic on (float8 e4m3/e5m2: no ``abs`` on
    CUDA, so no ``isfinite``) as float32, by value; other tensors as they are."""
    if t.is_floating_point() and t.element_size() == 1:
        return t.float()
    return t


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal in shape and bits (float8 compared as bytes: torch has no ``eq`` for it everywhere)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point() and a.element_size() == 1:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


def launch_listed(
    tuner: Autotuner,
    config: Any,
    args: tuple,
    kwargs: dict[str, Any],
    after: Callable[[], Any] | None = None,
    started: Callable[[], Any] | None = None,
) -> Any:
    """Launch the kernel with one of its listed configs as its autotuner would: the config's and
    the tuner's pre-hooks, ``started()``, the launch, ``after()`` (what it returns is returned),
    the post-hook."""
    launch = config.all_kwargs()
    full = {**dict(zip(tuner.arg_names, args)), **kwargs, **launch}
    if config.pre_hook:
        config.pre_hook(full)
    tuner.pre_hook(full)
    try:
        if started is not None:
            started()
        tuner.fn.run(*args, **kwargs, **launch)
        result = after() if after is not None else None
    except Exception as exc:
        try:
            tuner.post_hook(full, exception=exc)
        finally:
            raise
    tuner.post_hook(full, exception=None)
    return result


def measure_configs(
    bench: CaptureBench, configs: list[Any], ready: Callable[[int], None] | None = None
) -> list[Measurement]:
    """Each config measured by ``bench`` (once ``ready(i)`` returns, where given); where one takes
    over as the reference, the configs before it are measured again, against it."""
    out: list[Measurement] = []
    for i, config in enumerate(configs):
        if ready is not None:
            ready(i)
        measurement = bench.measure(config)
        if bench.took_over:
            bench.took_over = False
            out = [bench.measure(earlier) for earlier in configs[: len(out)]]
        out.append(measurement)
    return out


def _write(t: torch.Tensor, values: torch.Tensor) -> None:
    """``t.copy_(values)``, also where elements of ``t`` share a location (an expanded input, of
    stride 0), which copy_ refuses: written through the storage ``t`` spans, whose shared
    locations ``values`` (a copy of ``t``) gives one value each."""
    extent = 1  # the elements spanned by the dims of smaller strides: a larger stride must clear them
    for s, n in sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1):
        if s < extent:
            break
        extent += (n - 1) * s
    else:  # no two elements share a location
        t.copy_(values)
        return
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    spots = torch.arange(extent, device=t.device).as_strided(t.shape, t.stride()).flatten()
    t.as_strided((extent,), (1,))[spots] = values.flatten().to(t.dtype)


def tensors_of(inputs: tuple[tuple, dict[str, Any]]) -> list[torch.Tensor]:
    """The call's tensors: its tensor arguments and the tensors under its host-side tensor
    descriptors (``triton.tools.tensor_descriptor.TensorDescriptor``: FlagGems' host-TMA GEMM
    takes A, B and C only so), each once."""
    args, kwargs = inputs
    found: dict[int, torch.Tensor] = {}
    for v in (*args, *kwargs.values()):
        tensor = v.base if is_descriptor(v) else v
        if isinstance(tensor, torch.Tensor):
            found.setdefault(id(tensor), tensor)
    return list(found.values())


def _tensor_names(tuner: Autotuner, inputs: tuple[tuple, dict[str, Any]], tensors: list[torch.Tensor]) -> list[str]:
    """The argument name of each of the call's tensors (the first, where several name one)."""
    args, kwargs = inputs
    names: dict[int, str] = {}
    for name, v in (*zip(tuner.arg_names, args), *kwargs.items()):
        tensor = v.base if is_descriptor(v) else v
        if isinstance(tensor, torch.Tensor):
            names.setdefault(id(tensor), name)
    return [names.get(id(t), "?") for t in tensors]


def is_descriptor(value: Any) -> bool:
    # by name: triton.tools.tensor_descriptor exists from Triton 3.4, and launches stay import-free
    return type(value).__name__ == "TensorDescriptor" and hasattr(value, "block_shape")


def _cloned(inputs: tuple[tuple, dict[str, Any]]) -> tuple[tuple, dict[str, Any]]:
    args, kwargs = inputs

    def copy(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.clone()
        base = v.base if is_descriptor(v) else None
        if isinstance(base, torch.Tensor) and dataclasses.is_dataclass(v) and not isinstance(v, type):
            return dataclasses.replace(v, base=base.clone())  # a host-side descriptor over a copy
        return v

    return tuple(copy(a) for a in args), {k: copy(v) for k, v in kwargs.items()}
