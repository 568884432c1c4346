"""The interpreter-start hook behind ``TUNESVC_CAPTURE=1`` (run by ``tunesvc-capture.pth``).

It must cost next to nothing: the .pth line tests the variable itself and imports this module
only when it is set; this module imports only the standard library. It waits for Triton: once
``triton.runtime.autotuner`` is imported (now, or later through a meta-path finder), its
``Autotuner.run`` becomes a trampoline that imports tunesvc at the first autotuned launch and
hands the process to :func:`tunesvc._capture.capture_from_env`. Importing tunesvc (torch, the
store) while Triton is still half-imported would be a circular import; at the first launch
both are complete.
"""

from __future__ import annotations

import os
import sys

TARGET = "triton.runtime.autotuner"


def install() -> None:
    if os.environ.get("TUNESVC_CAPTURE", "") in ("", "0"):
        return
    module = sys.modules.get(TARGET)
    if module is not None and hasattr(module, "Autotuner"):
        patch(module)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def patch(module) -> None:
    """Put the trampoline on ``module.Autotuner.run`` (once)."""
    autotuner = module.Autotuner
    original = autotuner.run
    if getattr(original, "__tunesvc_original__", None) is not None:
        return

    def run(self, *args, **kwargs):
        try:
            from tunesvc._capture import capture_from_env

            capture_from_env()
        except Exception as exc:  # capture fails open: tunesvc that cannot start leaves Triton be
            import warnings

            warnings.warn(
                f"tunesvc: capture could not start ({type(exc).__name__}: {exc}); triton.autotune kernels run "
                "as Triton's own. Check that tunesvc imports (python -c 'import tunesvc').",
                RuntimeWarning,
                stacklevel=2,
            )
        finally:
            if autotuner.run is run:  # tunesvc did not take over: Triton's own, for good
                autotuner.run = original
        return autotuner.run(self, *args, **kwargs)

    run.__tunesvc_original__ = original
    autotuner.run = run


class _Finder:
    """Finds nothing itself: it wraps the loader of triton.runtime.autotuner to patch it once loaded."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


class _Loader:
    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        patch(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)
