"""What a measurement was taken on: a GPU's fingerprint, or Triton's CPU interpreter.

Timings are only comparable on the same hardware, so every trial and winner points at a
device row. Two ids matter: ``hardware_id`` (GPU model, compute capability, SM count) decides
whose winners the runtime may use; ``fingerprint`` adds driver, CUDA, torch and Triton versions,
so a software upgrade is visible in the store without hiding the tuned configs from the runtime.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import inspect
import json
import os
import platform
import sys
from dataclasses import asdict
from dataclasses import dataclass

from tunesvc import settings
from tunesvc._processes import call_in_forked_child
from tunesvc._processes import can_fork_gpu_children
from tunesvc._processes import use_interpreter_without_gpu

__all__ = [
    "Device",
    "can_fork_gpu_children",
    "current_device",
    "device_at",
    "fork_safe_current_device",
    "interpreting",
    "torch_device",
    "use_interpreter_without_gpu",
]


@dataclass(frozen=True)
class Device:
    kind: str  # "cuda" or "interpreter"
    name: str
    capability: str
    sm_count: int
    memory_bytes: int
    max_shared_memory: int
    max_num_regs: int
    driver: str
    cuda: str
    torch: str
    triton: str

    @property
    def hardware_id(self) -> str:
        return f"{self.name}|sm_{self.capability.replace('.', '')}|{self.sm_count}SM"

    @property
    def fingerprint(self) -> str:
        data = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()[:16]

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def has_tma(self) -> bool:
        """Whether kernels may load through tensor descriptors (TMA).

        Needs Hopper (sm_90) or newer and a Triton that offers ``tl.make_tensor_descriptor``
        (3.4+); Triton's interpreter emulates descriptors (checked with Triton 3.9).
        """
        import triton.language as tl  # triton is heavy: a Device is made and read without it

        if not hasattr(tl, "make_tensor_descriptor"):
            return False
        if self.kind == "interpreter":
            return True
        return tuple(int(part) for part in self.capability.split(".")) >= (9, 0)

    @property
    def has_ws(self) -> bool:
        """Whether kernels may warp-specialise a loop (``tl.range(..., warp_specialize=True)``).

        Needs Hopper (sm_90) or newer and a Triton whose ``tl.range`` takes the flag (3.4+);
        Triton's interpreter accepts the flag and runs the loop as a plain one (checked with 3.9).
        """
        import triton.language as tl  # triton is heavy: a Device is made and read without it

        if "warp_specialize" not in inspect.signature(tl.range).parameters:
            return False
        if self.kind == "interpreter":
            return True
        return tuple(int(part) for part in self.capability.split(".")) >= (9, 0)

    def limits(self) -> dict[str, int]:
        """The names that space constraints may use."""
        return {
            "max_shared_memory": self.max_shared_memory,
            "sm_count": self.sm_count,
            "max_num_regs": self.max_num_regs,
            "has_tma": int(self.has_tma),
            "has_ws": int(self.has_ws),
        }

    def to_dict(self) -> dict:
        return {**asdict(self), "hardware_id": self.hardware_id, "fingerprint": self.fingerprint}


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter."""
    return settings.interpreting()


_current: Device | None = None


def current_device() -> Device:
    """The device this process measures on: the current CUDA GPU, else the interpreter (read once)."""
    global _current
    if _current is None:
        _current = _read_device()
    return _current


_at: dict[int, Device] = {}


def device_at(index: int) -> Device:
    """The CUDA GPU of this index (read once per index); -1: :func:`current_device`."""
    if index < 0:
        return current_device()
    device = _at.get(index)
    if device is None:
        device = _at[index] = _read_device(index)
    return device


def fork_safe_current_device() -> Device:
    """:func:`current_device`, read without initialising CUDA in this process while it has not.

    A child forked for the purpose asks the driver (a fraction of a second), so this process
    stays one that can fork GPU processes: a sweep then forks its compile and measuring workers
    from it, with torch, triton and tunesvc already imported, instead of having a server import
    them again (seconds). Once this process has initialised CUDA, or where fork is missing, it
    reads the device itself (and where the child died before answering, so that an error says why).
    """
    global _current
    if _current is None and not interpreting() and can_fork_gpu_children():
        _current = call_in_forked_child(_read_device)
    return current_device()


def _read_device(index: int | None = None) -> Device:
    if interpreting():
        return _interpreter()
    # torch and triton are heavy: a Device is made and read without them (the store, bundles)
    import torch
    import triton

    if not torch.cuda.is_available():
        return _interpreter()
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    limits = triton.runtime.driver.active.utils.get_device_properties(index)
    return Device(
        kind="cuda",
        name=props.name,
        capability=f"{props.major}.{props.minor}",
        sm_count=props.multi_processor_count,
        memory_bytes=props.total_memory,
        max_shared_memory=int(limits["max_shared_mem"]),
        max_num_regs=int(limits["max_num_regs"]),
        driver=_nvidia_driver(),
        cuda=str(torch.version.cuda),
        torch=torch.__version__,
        triton=triton.__version__,
    )


def _interpreter() -> Device:
    # The interpreter has no shared memory or register file: its limits never prune a config,
    # and its timings are its own, stored under this device and never mixed with a GPU's.
    return Device(
        kind="interpreter",
        name=f"triton-interpreter ({platform.machine()})",
        capability="0.0",
        sm_count=os.cpu_count() or 1,
        memory_bytes=0,
        max_shared_memory=1 << 30,
        max_num_regs=1 << 30,
        driver="",
        cuda="",
        torch=_version("torch"),
        triton=_version("triton"),
    )


def _version(module: str) -> str:
    """The version of torch or triton: the imported module's, else the installed package's (the
    same text), so that the interpreter's device is read without importing them (seconds)."""
    loaded = sys.modules.get(module)
    if loaded is None:
        try:
            return importlib.metadata.version(module)
        except importlib.metadata.PackageNotFoundError:  # installed under another name (pytorch-triton)
            loaded = importlib.import_module(module)
    return str(loaded.__version__)


def _nvidia_driver() -> str:
    try:
        import pynvml  # nvidia-ml-py, present where the CUDA stack is

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return "unknown"


def torch_device() -> str:
    """Where tensors for the current device live."""
    return "cuda" if current_device().is_gpu else "cpu"
