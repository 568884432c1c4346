"""The interpreter-start hook behind ``TUNESVC_CAPTURE=1`` (run by ``tunesvc-capture.pth``).

It must cost next to nothing: the .pth line tests the variable itself and imports this module
only when it is set; this module imports only the standard library. It waits for Triton: once
``triton.runtime.autotuner`` is imported (now, or later through a meta-path finder), its
``Autotuner.run``, and the own ``run`` of each subclass defined later (FlagGems' ``LibTuner``),
becomes a trampoline that imports tunesvc at the first autotuned launch and hands the process to
:func:`tunesvc._capture.capture_from_env`. Importing tunesvc (torch, the
store) while Triton is still half-imported would be a circular import; at the first launch
both are complete.
"""

from __future__ import annotations

import os
import sys
import threading
import types

TARGET = "triton.runtime.autotuner"
#: torch's module through which Dynamo traces a Triton kernel's call inside torch.compile
COMPILED_TARGET = "torch._higher_order_ops.triton_kernel_wrap"


def install() -> None:
    if os.environ.get("TUNESVC_CAPTURE", "") in ("", "0"):
        return
    _watch(TARGET, "Autotuner", patch)
    _watch(COMPILED_TARGET, "TritonHOPifier", patch_compiled)


def _watch(name, attribute, on_load) -> None:
    """``on_load(module)`` now if ``name`` is imported, else once it is."""
    module = sys.modules.get(name)
    if module is not None and hasattr(module, attribute):
        on_load(module)
    elif not any(isinstance(f, _Finder) and f.target == name for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(name, on_load))


def patch(module) -> None:
    """Put the trampoline on ``module.Autotuner.run`` and on the own ``run`` of each subclass,
    defined already or later (FlagGems' ``LibTuner`` never calls ``Autotuner.run``), once."""
    global TRITON_RUN
    autotuner = module.Autotuner
    if getattr(autotuner.run, "__tunesvc_original__", None) is not None:
        return
    TRITON_RUN = autotuner.run
    todo = [autotuner]
    while todo:  # a library imported before this hook ran (a pytest plugin's late call) has its subclasses
        cls = todo.pop()
        _trampoline(autotuner, cls)
        todo.extend(cls.__subclasses__())
    if "__init_subclass__" not in autotuner.__dict__:

        def init_subclass(cls, **kwargs):
            super(autotuner, cls).__init_subclass__(**kwargs)
            _trampoline(autotuner, cls)

        autotuner.__init_subclass__ = classmethod(init_subclass)
        _HOOKED[autotuner] = None


#: class -> its own run, for every class whose run is a trampoline now (Autotuner -> None while
#: its __init_subclass__ is the hook's)
_HOOKED: dict = {}
#: Triton's own Autotuner.run, kept before a library may put its own run over the trampoline
TRITON_RUN = None
_STARTED = []
#: Autotuner -> tunesvc's run, once capture started: what a trampoline kept by a library calls
_CAPTURED: dict = {}
_LOCK = threading.Lock()


def _trampoline(autotuner, cls) -> None:
    """Make ``cls``'s own ``run`` start tunesvc at its first call, then run as tunesvc left it."""
    original = cls.__dict__.get("run")
    # a plain function only: a run that is a staticmethod, a partialmethod or another descriptor
    # stays as written (its subclass is left to Triton), and defining a class never fails here
    if type(original) is not types.FunctionType or getattr(original, "__tunesvc_original__", None) is not None:
        return

    def run(self, *args, **kwargs):
        _start(autotuner)
        now = cls.__dict__.get("run")  # the class's own run as tunesvc left it: itself, or wrapped
        if now is run or getattr(now, "__tunesvc_original__", None) is not original:
            # gone, or a library's own run that called this one, found there: tunesvc's beneath it
            now = _CAPTURED.get(cls, original)
        return now(self, *args, **kwargs)

    run.__tunesvc_original__ = original
    run.__name__, run.__qualname__, run.__doc__ = original.__name__, original.__qualname__, original.__doc__
    try:
        cls.run = run
    except Exception:  # a metaclass that refuses it: left as written, as above
        return
    _HOOKED[cls] = original


def patch_compiled(module) -> None:
    """Start tunesvc where Dynamo first traces a Triton kernel, too: inside torch.compile no
    ``Autotuner.run`` is called, so a program whose autotuned kernels all run in compiled code
    would never reach the trampolines above. The trampoline on torch's
    ``TritonHOPifier.call_triton_kernel`` puts torch's method back, starts tunesvc (which puts its
    own hook there, :mod:`tunesvc._capture.compiled`) and calls what the class then holds."""
    cls = getattr(module, "TritonHOPifier", None)
    original = None if cls is None else cls.__dict__.get("call_triton_kernel")
    if _STARTED or type(original) is not types.FunctionType or hasattr(original, "__tunesvc_original__"):
        return

    def call_triton_kernel(self, *args, **kwargs):
        if cls.__dict__.get("call_triton_kernel") is call_triton_kernel:
            cls.call_triton_kernel = original
        autotuner = sys.modules.get(TARGET)
        if autotuner is not None and hasattr(autotuner, "Autotuner"):
            _start(autotuner.Autotuner)
        return cls.call_triton_kernel(self, *args, **kwargs)

    call_triton_kernel.__tunesvc_original__ = original
    call_triton_kernel.__name__, call_triton_kernel.__qualname__ = original.__name__, original.__qualname__
    try:
        cls.call_triton_kernel = call_triton_kernel
    except Exception:  # left as it is: compiled regions are Inductor's until tunesvc starts
        pass


def _start(autotuner) -> None:
    """Every trampoline's first act: put each class's own run back, then let tunesvc take over
    (it wraps ``Autotuner.run`` and its subclasses' runs as ``tunesvc.capture()`` does)."""
    with _LOCK:
        if _STARTED:  # once: a library that kept a trampoline calls it at every launch
            return
        _STARTED.append(True)
        for cls, original in list(_HOOKED.items()):
            if original is None:  # the subclass hook on Autotuner itself
                if "__init_subclass__" in autotuner.__dict__:
                    del autotuner.__init_subclass__
            elif getattr(cls.__dict__.get("run"), "__tunesvc_original__", None) is original:
                cls.run = original
            del _HOOKED[cls]
    try:
        from tunesvc._capture import capture_from_env
        from tunesvc._capture.launch import captured_run

        capture_from_env()
        _CAPTURED[autotuner] = captured_run
    except Exception as exc:  # capture fails open: tunesvc that cannot start leaves Triton be
        import warnings

        message = (
            f"tunesvc: capture could not start ({type(exc).__name__}: {exc}); triton.autotune kernels run "
            "as Triton's own. Check that tunesvc imports (python -c 'import tunesvc')."
        )
        try:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        except Exception:  # an error filter (-W error) would end the launch: said on stderr instead
            sys.stderr.write(f"RuntimeWarning: {message}\n")


class _Finder:
    """Finds nothing itself: it wraps the loader of its target module to patch it once loaded."""

    def __init__(self, target=TARGET, on_load=None) -> None:
        self.target = target
        self.on_load = on_load or patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.target:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, self.on_load)
                return spec
        return None


class _Loader:
    def __init__(self, loader, on_load) -> None:
        self._loader = loader
        self._on_load = on_load

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._on_load(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)
