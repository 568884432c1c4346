"""tunesvc: tune Triton kernels per GPU and shape, keep every result, look them up at run time.

The public names below load on first use (PEP 562): ``import tunesvc`` itself imports neither
torch, Triton nor SQLAlchemy, so the `tune` CLI answers --help and shell completion at once.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING
from typing import Any

from tunesvc.timeline import mark as _mark

_mark("tunesvc import start")

from tunesvc._processes import use_interpreter_without_gpu  # noqa: E402

use_interpreter_without_gpu()

from tunesvc.serving import on_miss as _on_miss  # noqa: E402


def _tune_on_miss(miss: _on_miss.MissedKey) -> dict[str, Any]:
    """Mode 'tune''s policy: the tuning side's, handed to serving here (which never imports
    tuning) and imported on the first miss, so that ``import tunesvc`` stays light."""
    from tunesvc.tuning.on_miss import tune_on_miss

    return tune_on_miss(miss)


_on_miss.register(_tune_on_miss)

from tunesvc import shipped as _shipped  # noqa: E402


def _kernels_of(family: str) -> ModuleType:
    """A shipped template's kernel module, handed to the templates here: the kernels import their
    templates, so the templates never import the kernels."""
    return importlib.import_module(f"tunesvc.kernels.{family}")


def _template_module(name: str) -> ModuleType:
    """A shipped template's module, handed to the catalogue (tunesvc.template) here: the
    templates subclass its Template, so it never imports them."""
    return importlib.import_module(f"tunesvc.templates.{name}")


_shipped.use_loaders(kernels=_kernels_of, templates=_template_module)

if TYPE_CHECKING:
    from tunesvc._capture import capture
    from tunesvc._capture import stats as capture_stats
    from tunesvc._capture import uncapture
    from tunesvc._capture.autotuner import TunedKernel
    from tunesvc._capture.autotuner import autotune
    from tunesvc._capture.autotuner import tuned
    from tunesvc.bench import Bench
    from tunesvc.bench import Measurement
    from tunesvc.bench import Status
    from tunesvc.bench import start_forkserver
    from tunesvc.device import Device
    from tunesvc.device import current_device
    from tunesvc.errors import TunesvcError
    from tunesvc.serving.runtime import LookupResult
    from tunesvc.serving.runtime import Runtime
    from tunesvc.serving.runtime import configure
    from tunesvc.serving.runtime import lookup
    from tunesvc.space import Space
    from tunesvc.space import config_hash
    from tunesvc.template import Cost
    from tunesvc.template import ShapeKey
    from tunesvc.template import Template
    from tunesvc.template import get_template

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "TunedKernel": "tunesvc._capture.autotuner",
    "autotune": "tunesvc._capture.autotuner",
    "tuned": "tunesvc._capture.autotuner",
    "Bench": "tunesvc.bench",
    "Measurement": "tunesvc.bench",
    "Status": "tunesvc.bench",
    "start_forkserver": "tunesvc.bench",
    "capture": "tunesvc._capture",
    "capture_stats": "tunesvc._capture:stats",
    "uncapture": "tunesvc._capture",
    "Device": "tunesvc.device",
    "current_device": "tunesvc.device",
    "TunesvcError": "tunesvc.errors",
    "LookupResult": "tunesvc.serving.runtime",
    "Runtime": "tunesvc.serving.runtime",
    "configure": "tunesvc.serving.runtime",
    "lookup": "tunesvc.serving.runtime",
    "Space": "tunesvc.space",
    "config_hash": "tunesvc.space",
    "Cost": "tunesvc.template",
    "ShapeKey": "tunesvc.template",
    "Template": "tunesvc.template",
    "get_template": "tunesvc.template",
}

#: subpackages and modules reachable as attributes (``tunesvc.kernels.matmul(...)``) after a
#: bare ``import tunesvc``, as when this file imported them eagerly: name -> the module (the
#: runtime, ops, sweep and autotuner kept their attribute names when they moved into their layers)
_SUBMODULES = {
    **{
        name: f"tunesvc.{name}"
        for name in (
            "bench",
            "bundle",
            "cli",
            "completion",
            "device",
            "errors",
            "fleet",
            "kernels",
            "report",
            "search",
            "serving",
            "space",
            "store",
            "template",
            "tuning",
            "verify",
        )
    },
    "autotuner": "tunesvc._capture.autotuner",
    "ops": "tunesvc.serving.ops",
    "runtime": "tunesvc.serving.runtime",
    "sweep": "tunesvc.tuning.sweep",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module, _, attribute = _EXPORTS[name].partition(":")
        value = getattr(importlib.import_module(module), attribute or name)
    elif name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name])
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_SUBMODULES})


_mark("tunesvc imported")

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
