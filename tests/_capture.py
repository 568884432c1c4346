"""What the capture tests share: reading trials back from a store, walking a kernel's ``.fn``
chain as library code does, and the config a triton.autotune kernel last launched."""

from __future__ import annotations

import inspect
import os
import sys
import time
import warnings
from collections import Counter
from typing import Any

import triton
import triton.language as tl
from sqlalchemy import func
from sqlalchemy import select

from tunesvc.store import Store
from tunesvc.store.models import KernelVersion
from tunesvc.store.models import Trial

#: a program whose one triton.autotune kernel (two configs, key n) is launched once and checked;
#: it prints "ran", then exits with the status its first argument gives (0 without one)
DOUBLING_PROGRAM = """
import sys
import torch, triton, triton.language as tl

@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32)], key=["n"],
                 do_bench=lambda fn, quantiles: (fn(), [1.0] * len(quantiles))[1])
@triton.jit
def double(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, 2 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

x = torch.ones(40)
double[lambda m: (triton.cdiv(40, m["BLOCK"]),)](x, 40)
assert bool((x == 2).all())
print("ran")
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def trials_by_kernel(db: str) -> dict[str, Counter[str]]:
    """{kernel name: Counter(status: trials)} of every trial stored in ``db``."""
    store = Store(db)
    try:
        with store.session() as session:
            rows = session.execute(
                select(KernelVersion.kernel, Trial.status, func.count())
                .join(KernelVersion, Trial.kernel_version_id == KernelVersion.id)
                .group_by(KernelVersion.kernel, Trial.status)
            ).all()
    finally:
        store.close()
    counts: dict[str, Counter[str]] = {}
    for kernel, status, n in rows:
        counts.setdefault(kernel, Counter())[status] += n
    return counts


def trial_total(db: str) -> int:
    return sum(sum(c.values()) for c in trials_by_kernel(db).values())


def base_function(kernel: Any) -> Any:
    """The Python function under a kernel, found as library wrappers find it: ``.fn`` until a function."""
    while not inspect.isfunction(kernel):
        kernel = kernel.fn
    return kernel


def captured_name(kernel: Any) -> str:
    """The name a captured kernel is stored under: ``module:qualname`` of its Python function."""
    fn = base_function(kernel)
    return f"{fn.__module__}:{fn.__qualname__}"


def autotuner_of(kernel: Any) -> Any:
    """The autotuner in a kernel's ``.fn`` chain (under any @triton.heuristics above it)."""
    while not hasattr(kernel, "configs"):
        kernel = kernel.fn
    return kernel


def config_dict(config: Any) -> dict[str, Any]:
    """A triton.Config as plain data: its meta-parameters and launch options."""
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


def launched_config(kernel: Any) -> dict[str, Any]:
    """The config the kernel's last launch used (``best_config``, which library code reads)."""
    return config_dict(autotuner_of(kernel).best_config)


def wall_clock_bench(kernel_call: Any, quantiles: Any = None, **_: Any) -> Any:
    """One wall-clock run in ms: triton.autotune's own benchmarker needs a GPU driver, and the
    interpreter has none, so plain triton.autotune kernels are given this one on the CPU."""
    start = time.perf_counter()
    kernel_call()
    ms = (time.perf_counter() - start) * 1e3
    return [ms] * len(quantiles) if quantiles else ms


def next_line() -> int:
    """The line after the caller's: where a test launches the kernel whose warnings it checks."""
    return sys._getframe(1).f_lineno + 1


def said_at(caught: list[warnings.WarningMessage]) -> set[tuple[str, int]]:
    """Where tunesvc's warnings in ``caught`` point: the (file, line) each names."""
    return {(w.filename, w.lineno) for w in caught if str(w.message).startswith("tunesvc:")}


def interpreter_env(**extra: str) -> dict[str, str]:
    """This environment for a child process on Triton's interpreter, without any TUNESVC_ variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNESVC_")}
    return {**env, "TRITON_INTERPRET": "1", **extra}


@triton.jit
def scale(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    """out = alpha * x."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def cast(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out = x in out's dtype (float8, integers, bool)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask).to(out_ptr.dtype.element_ty), mask=mask)
