"""tunesvc: tune Triton kernels per GPU and shape, keep every result, look them up at run time."""

from __future__ import annotations

from tunesvc._processes import use_interpreter_without_gpu

use_interpreter_without_gpu()

from tunesvc.autotuner import TunedKernel  # noqa: E402
from tunesvc.autotuner import autotune  # noqa: E402
from tunesvc.autotuner import tuned  # noqa: E402
from tunesvc.bench import Bench  # noqa: E402
from tunesvc.bench import Measurement  # noqa: E402
from tunesvc.bench import Status  # noqa: E402
from tunesvc.bench import start_forkserver  # noqa: E402
from tunesvc.capture import capture  # noqa: E402
from tunesvc.capture import stats as capture_stats  # noqa: E402
from tunesvc.capture import uncapture  # noqa: E402
from tunesvc.device import Device  # noqa: E402
from tunesvc.device import current_device  # noqa: E402
from tunesvc.errors import TunesvcError  # noqa: E402
from tunesvc.runtime import LookupResult  # noqa: E402
from tunesvc.runtime import Runtime  # noqa: E402
from tunesvc.runtime import configure  # noqa: E402
from tunesvc.runtime import lookup  # noqa: E402
from tunesvc.space import Space  # noqa: E402
from tunesvc.space import config_hash  # noqa: E402
from tunesvc.template import Cost  # noqa: E402
from tunesvc.template import ShapeKey  # noqa: E402
from tunesvc.template import Template  # noqa: E402
from tunesvc.template import get_template  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Bench",
    "Cost",
    "Device",
    "LookupResult",
    "Measurement",
    "Runtime",
    "ShapeKey",
    "Space",
    "Status",
    "Template",
    "TunedKernel",
    "TunesvcError",
    "autotune",
    "capture",
    "capture_stats",
    "config_hash",
    "configure",
    "current_device",
    "get_template",
    "lookup",
    "start_forkserver",
    "tuned",
    "uncapture",
]
