"""A pytest plugin that benchmarks/conformance.py loads (``-p conformance_plugin``) into every run
of a library's own test suite, with capture off and on alike. It changes nothing that a test sees.

- Under Triton's interpreter (TRITON_INTERPRET=1) ``triton.autotune`` asks the GPU driver for a
  benchmarker and finds none, so every multi-config kernel would fail before tunesvc is involved;
  its ``do_bench`` becomes one wall-clock call per config, as in benchmarks/capture.py --smoke.
  Capture measures with its own bench and never reaches this one.
- ``TUNESVC_CAPTURE=1`` is acted on by the interpreter-start hook (tunesvc-capture.pth), which a
  ``pip install --target`` (the GPU machine's) never runs; the plugin makes the same call, which
  does nothing where the hook already ran.
- With CONFORMANCE_STATS set, the process's capture counters (tunesvc._capture.STATS: keys tuned,
  keys served from the store, candidates measured) and the folder of the tunesvc package that
  captured (``tunesvc_from``) go to that JSON file at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def _wall_clock_bench(kernel_call: Any, quantiles: Any = None, **_: Any) -> Any:
    start = time.perf_counter()
    kernel_call()
    ms = (time.perf_counter() - start) * 1e3
    return [ms] * len(quantiles) if quantiles else ms


def pytest_configure(config: Any) -> None:
    if os.environ.get("TUNESVC_CAPTURE", "") not in ("", "0"):
        import _tunesvc_capture

        _tunesvc_capture.install()
    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton.runtime.autotuner import Autotuner

        Autotuner.do_bench = property(lambda self: _wall_clock_bench)  # type: ignore[assignment]


def pytest_unconfigure(config: Any) -> None:
    path = os.environ.get("CONFORMANCE_STATS")
    if not path:
        return
    capture = sys.modules.get("tunesvc._capture")  # imported only where capture took over
    stats: dict[str, Any] = dict(capture.STATS) if capture is not None else {}
    if capture is not None:  # which tunesvc captured (benchmarks/conformance.py --tunesvc runs another tree)
        stats["tunesvc_from"] = os.path.dirname(os.path.dirname(os.path.abspath(capture.__file__)))
    with open(path, "w") as f:
        json.dump(stats, f)
