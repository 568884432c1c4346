"""tunesvc: tune Triton kernels per GPU and shape, keep every result, look them up at run time."""

from __future__ import annotations

from tunesvc.bench import Bench
from tunesvc.bench import Measurement
from tunesvc.bench import Status
from tunesvc.device import Device
from tunesvc.device import current_device
from tunesvc.errors import TunesvcError
from tunesvc.runtime import LookupResult
from tunesvc.runtime import Runtime
from tunesvc.runtime import configure
from tunesvc.runtime import lookup
from tunesvc.space import Space
from tunesvc.space import config_hash
from tunesvc.template import Cost
from tunesvc.template import ShapeKey
from tunesvc.template import Template
from tunesvc.template import get_template

__version__ = "0.1.0"

__all__ = [
    "Bench", "Cost", "Device", "LookupResult", "Measurement", "Runtime", "ShapeKey", "Space",
    "Status", "Template", "TunesvcError", "config_hash", "configure", "current_device",
    "get_template", "lookup",
]
