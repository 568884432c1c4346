"""Every ``triton.autotune`` kernel, unmodified, tuned once and served from the store.

Two ways in, one mechanism:

- ``tunesvc.autotune(configs, key, ...)`` with ``triton.Config`` objects builds a
  :class:`CapturedKernel`, a subclass of Triton's own ``Autotuner`` (so ``fn``, ``base_fn``,
  ``configs``, ``keys``, ``cache``, ``best_config``, ``prune_configs``, ``warmup`` ... are
  Triton's), whose ``run`` is tunesvc's;
- :func:`capture` (or ``TUNESVC_CAPTURE=1``, or ``tune run -- CMD``) puts that same ``run`` on
  Triton's ``Autotuner`` class, so every autotuned kernel of the process, decorated before or
  after, from any library, goes through tunesvc.

A kernel is identified by ``module:qualname`` of its Python function (also the path to import
it); its version hashes its source's syntax tree, its config list and the Triton version, so
an edited kernel, a changed config list or another Triton never reuses stored winners. The
shape key is Triton's own autotuning key (the ``key`` arguments' values, then the dtype of every
tensor argument), written as readable text: ``n_cols=1000,HAS_BIAS=True,x.dtype=float16``.

A launch looks the key tuple up in one dict (as Triton's own cache does) and runs the kernel.
On a miss: the stored winner (database or bundle) if there is one; else, in mode ``tune``,
every config that survives Triton's pruning is checked and timed on the call's own arguments
(one process per key across processes and hosts: the one key claim), every trial and the
winner stored; in mode ``lookup`` the runtime's one chain (:mod:`tunesvc.serving.chain`: the
nearest stored key's winner, a sibling GPU model's, else the first config Triton's pruning keeps)
and the miss recorded for offline tuning; in mode ``heuristic`` the first config Triton's pruning
keeps, nothing read; in mode ``off``, Triton's own autotuner (see :mod:`tunesvc.settings`). A
call that Triton refuses (a parameter its configs set passed by the caller) goes to Triton's own
run, which refuses it. A forked child opens database connections of its own.

Capture fails open: whatever goes wrong inside tunesvc on a launch (a bug, an unusual config,
dtype or hook, a damaged, locked or unreachable database, a kernel whose key changes on every
call) is one warning line naming the kernel, the reason and what to do, and the launch, and every
later launch of that kernel in the process, runs as Triton's own autotuner would. Tuning leaves
no trace but the store: it measures on aliases of the call's tensors (``Tensor.data``: autograd
version counters untouched), without autograd, with the RNG state, the current device and stream
put back, and the tensors' contents restored (see :func:`tunesvc._capture.bench.untraced`).

The modules, each importing only those listed before it:

- :mod:`~tunesvc._capture.identity`: kernel names and versions, key text, stored configs, and a
  captured kernel as the store and the runtime see it (no torch, no Triton: `tune lookup` reads it);
- :mod:`~tunesvc._capture.failopen`: failing open (:func:`~tunesvc._capture.failopen.give_up`),
  the process's counters and the summary;
- :mod:`~tunesvc._capture.sharing`: :class:`Settings`, what the kernels of one Settings share, and
  each kernel's own state;
- :mod:`~tunesvc._capture.bench`: the candidates, checked and timed on the call's own arguments;
- :mod:`~tunesvc._capture.recorded`: a call as data and back (offline tuning, `tune verify`);
- :mod:`~tunesvc._capture.precompile`: compile workers ahead of the measuring;
- :mod:`~tunesvc._capture.tune`: tuning a key, on a miss or offline on a recorded call;
- :mod:`~tunesvc._capture.miss`: a key's first launch, stored, tuned or the fallback;
- :mod:`~tunesvc._capture.compiled`: kernels inside ``torch.compile``, served the stored winner where
  Dynamo traces their call (a hook on torch's ``TritonHOPifier``, put on while capture is on);
- :mod:`~tunesvc._capture.launch`: the launch path, :class:`CapturedKernel` and :func:`autotune`,
  :func:`capture` and :func:`uncapture`.

What these modules share is their internal surface, named without an underscore (the package
itself is private: ``tunesvc._capture``): ``give_up``, ``STAGE``, ``State``, ``Shared``,
``pruned_configs``, ``measure_configs`` ...; a name with an underscore is its own module's alone.

The names below load on first use (PEP 562), each from the module that defines it, so that
importing :mod:`tunesvc._capture.identity` imports no torch. A test that patches a name patches
it in the module whose code reads it: setting it on this package changes nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from tunesvc._capture.bench import FINALISTS
    from tunesvc._capture.bench import CaptureBench
    from tunesvc._capture.bench import contender_count
    from tunesvc._capture.failopen import STATS
    from tunesvc._capture.failopen import stats
    from tunesvc._capture.failopen import summary_line
    from tunesvc._capture.failopen import summary_record
    from tunesvc._capture.identity import CapturedKey
    from tunesvc._capture.identity import CapturedTemplate
    from tunesvc._capture.identity import config_dict
    from tunesvc._capture.identity import kernel_name
    from tunesvc._capture.identity import kernel_version
    from tunesvc._capture.identity import key_text
    from tunesvc._capture.launch import TRITON_AUTOTUNER_RUN
    from tunesvc._capture.launch import Capture
    from tunesvc._capture.launch import CapturedKernel
    from tunesvc._capture.launch import autotune
    from tunesvc._capture.launch import capture
    from tunesvc._capture.launch import capture_from_env
    from tunesvc._capture.launch import capturing
    from tunesvc._capture.launch import uncapture
    from tunesvc._capture.miss import by_identity
    from tunesvc._capture.precompile import RecordedKernel
    from tunesvc._capture.precompile import compile_workers
    from tunesvc._capture.recorded import check_call
    from tunesvc._capture.recorded import describe_call
    from tunesvc._capture.recorded import find_autotuner
    from tunesvc._capture.recorded import rebuild_call
    from tunesvc._capture.sharing import Settings
    from tunesvc._capture.tune import adopt_recorded
    from tunesvc._capture.tune import measure_stored
    from tunesvc._capture.tune import tune_recorded

#: name -> the module of this package that defines it
_EXPORTS = {
    "FINALISTS": "bench",
    "CaptureBench": "bench",
    "contender_count": "bench",
    "STATS": "failopen",
    "stats": "failopen",
    "summary_line": "failopen",
    "summary_record": "failopen",
    "CapturedKey": "identity",
    "CapturedTemplate": "identity",
    "config_dict": "identity",
    "kernel_name": "identity",
    "kernel_version": "identity",
    "key_text": "identity",
    "TRITON_AUTOTUNER_RUN": "launch",
    "Capture": "launch",
    "CapturedKernel": "launch",
    "autotune": "launch",
    "capture": "launch",
    "capture_from_env": "launch",
    "capturing": "launch",
    "uncapture": "launch",
    "by_identity": "miss",
    "RecordedKernel": "precompile",
    "compile_workers": "precompile",
    "check_call": "recorded",
    "describe_call": "recorded",
    "find_autotuner": "recorded",
    "rebuild_call": "recorded",
    "Settings": "sharing",
    "adopt_recorded": "tune",
    "measure_stored": "tune",
    "tune_recorded": "tune",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = [
    "FINALISTS",
    "STATS",
    "TRITON_AUTOTUNER_RUN",
    "Capture",
    "CaptureBench",
    "CapturedKernel",
    "CapturedKey",
    "CapturedTemplate",
    "RecordedKernel",
    "Settings",
    "adopt_recorded",
    "autotune",
    "by_identity",
    "capture",
    "capture_from_env",
    "capturing",
    "check_call",
    "compile_workers",
    "config_dict",
    "contender_count",
    "describe_call",
    "find_autotuner",
    "kernel_name",
    "kernel_version",
    "key_text",
    "measure_stored",
    "rebuild_call",
    "stats",
    "summary_line",
    "summary_record",
    "tune_recorded",
    "uncapture",
]
