"""Capture of Autotuner subclasses that replace ``run`` with their own (FlagGems' LibTuner is
one: its own key rule and its own search policy): the subclass keeps its key and its launch;
its misses are resolved by tunesvc (stored, tuned, or the fallback while serving)."""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from _capture import interpreter_env
from _capture import trials_by_kernel
from triton.runtime.autotuner import Autotuner

import tunesvc
from tunesvc._capture import STATS
from tunesvc.store import Store

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)]


@triton.jit
def _scale(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask), mask=mask)


class PersistentCache:
    """A library's own config cache that is no dict (FlagGems keeps one in a database)."""

    def __init__(self):
        self.rows = {}

    def __contains__(self, key):
        return self.rows.get(key) is not None

    def __getitem__(self, key):
        return self.rows[key]

    def __setitem__(self, key, config):
        self.rows[key] = config


class BucketTuner(Autotuner):
    """A library-style autotuner: keys bucket ``n`` by log2, and its policy (here: the last
    config, counted) stands for its own benchmarking; ``run`` is its own, not Autotuner.run;
    its cache is its own kind of object."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.policy_calls = 0
        self.cache = PersistentCache()

    def run(self, *args, **kwargs):
        nargs = {**dict(zip(self.arg_names, args)), **kwargs}
        key = tuple(round(math.log2(nargs[k])) for k in self.keys) + tuple(
            str(v.dtype) for v in nargs.values() if hasattr(v, "dtype")
        )
        if key not in self.cache:
            self.policy_calls += 1
            self.cache[key] = self.configs[-1]
        config = self.cache[key]
        self.best_config = config
        return self.fn.run(*args, **kwargs, **config.all_kwargs())


def bucket_tune(fn):
    return BucketTuner(fn, fn.arg_names, CONFIGS, ["n"], None, None)


def launch(kernel, n, alpha=2.0):
    x, out = torch.randn(n), torch.empty(n)
    kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n, alpha)
    torch.testing.assert_close(out, alpha * x)


@pytest.fixture(autouse=True)
def _fresh():
    STATS.clear()
    yield
    tunesvc.uncapture()


def test_a_subclass_run_tunes_its_misses_through_tunesvc_and_keeps_its_own_key(tmp_db):
    kernel = bucket_tune(_scale)
    with tunesvc.capture(mode="tune", db=tmp_db):
        launch(kernel, 300)
        launch(kernel, 290)  # log2 bucket 8 again: the subclass's own key, a hit
        assert kernel.policy_calls == 0  # its own search never ran
        assert STATS["tuned"] == 1 and STATS["benchmarks"] == len(CONFIGS)
        tuned = kernel.best_config
    # a new instance (a new process's) reads the stored winner: nothing measured, no policy
    STATS.clear()
    again = bucket_tune(_scale)
    with tunesvc.capture(mode="tune", db=tmp_db):
        launch(again, 301)
    assert again.policy_calls == 0 and STATS == {"stored": 1}
    assert again.best_config.all_kwargs() == tuned.all_kwargs()
    store = Store(tmp_db, readonly=True)
    try:
        [winner] = store.winners()
    finally:
        store.close()
    assert winner.kernel.endswith(":_scale") and winner.shape_key.startswith("n=8,")


def test_a_subclass_serving_never_benchmarks_and_without_capture_runs_as_written(tmp_db):
    kernel = bucket_tune(_scale)
    with tunesvc.capture(mode="lookup", db=tmp_db):
        launch(kernel, 77)
    assert kernel.policy_calls == 0 and STATS["fallback"] == 1 and "benchmarks" not in STATS
    assert kernel.best_config is CONFIGS[0]  # nothing stored: the first listed config
    store = Store(tmp_db, readonly=True)
    try:
        assert [m.shape_key for m in store.misses()] == ["n=6,x_ptr.dtype=float32,out_ptr.dtype=float32"]
    finally:
        store.close()
    plain = bucket_tune(_scale)
    launch(plain, 77)
    assert plain.policy_calls == 1 and plain.best_config is CONFIGS[-1]
    # the kernel captured before, capture now off: its own cache and search again, untouched
    assert list(kernel.cache.rows) == []
    launch(kernel, 77)
    assert kernel.policy_calls == 1 and kernel.best_config is CONFIGS[-1]
    assert list(kernel.cache.inner.rows) == [(6, "torch.float32", "torch.float32")]


def test_a_subclass_defined_while_capturing_is_routed_too(tmp_db):
    with tunesvc.capture(mode="lookup", db=tmp_db):

        class Later(BucketTuner):
            def run(self, *args, **kwargs):
                return super().run(*args, **kwargs)

        kernel = Later(_scale, _scale.arg_names, CONFIGS, ["n"], None, None)
        launch(kernel, 40)
    assert kernel.policy_calls == 0 and STATS["fallback"] == 1


@triton.jit
def _scale_rows(x_desc, out_desc, alpha, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WRONG: tl.constexpr):
    """out = alpha * x through host-side tensor descriptors; WRONG adds one (a wrong config)."""
    m, n = tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N
    y = alpha * x_desc.load([m, n])
    if WRONG:
        y += 1.0
    out_desc.store([m, n], y)


def _set_block_shapes(nargs):
    """A config pre-hook as FlagGems' host-TMA GEMM has: descriptors' blocks from the config."""
    for name in ("x_desc", "out_desc"):
        nargs[name].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_N"]]


class NargsTuner(BucketTuner):
    """Sets ``self.nargs`` before its cache lookup and reads it after, for the config's
    pre-hook, as FlagGems' LibTuner does."""

    def run(self, *args, **kwargs):
        self.nargs = dict(zip(self.arg_names, args))
        key = (args[0].base.shape[0], args[0].base.shape[1], str(args[0].base.dtype))
        if key not in self.cache:
            self.policy_calls += 1
            self.cache[key] = self.configs[0]
        config = self.cache[key]
        config.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()})
        return self.fn.run(*args, **kwargs, **config.all_kwargs())


def test_host_descriptor_arguments_are_checked_and_the_subclass_nargs_kept(tmp_db):
    from triton.tools.tensor_descriptor import TensorDescriptor

    configs = [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "WRONG": int(wrong)}, pre_hook=_set_block_shapes)
        for m, n, wrong in ((16, 16, False), (32, 16, False), (16, 32, True))
    ]
    kernel = NargsTuner(_scale_rows, _scale_rows.arg_names, configs, [], None, None)
    x = torch.randn(40, 72)
    out = torch.full_like(x, float("nan"))
    x_desc, out_desc = (TensorDescriptor.from_tensor(t, [16, 16]) for t in (x, out))
    with tunesvc.capture(mode="tune", db=tmp_db):
        kernel[lambda m: (triton.cdiv(40, m["BLOCK_M"]), triton.cdiv(72, m["BLOCK_N"]))](x_desc, out_desc, 0.5)
    torch.testing.assert_close(out, 0.5 * x)
    assert kernel.policy_calls == 0 and STATS["tuned"] == 1
    [(name, statuses)] = trials_by_kernel(tmp_db).items()
    # the tensors under the descriptors were compared: the config that adds one is caught
    assert name.endswith(":_scale_rows") and statuses == {"ok": 2, "wrong_result": 1}


DESCRIPTOR_CONFIGS = [
    triton.Config({"BLOCK_M": m, "BLOCK_N": n, "WRONG": int(wrong)}, pre_hook=_set_block_shapes)
    for m, n, wrong in ((16, 16, False), (32, 16, False), (16, 32, True))
]
scale_rows = triton.autotune(configs=DESCRIPTOR_CONFIGS, key=[])(_scale_rows)


def test_a_call_with_host_descriptors_is_recorded_and_tuned_offline(tmp_db):
    from triton.tools.tensor_descriptor import TensorDescriptor
    from typer.testing import CliRunner

    from tunesvc.cli import app

    x = torch.randn(40, 72)
    out = torch.full_like(x, float("nan"))
    x_desc, out_desc = (TensorDescriptor.from_tensor(t, [16, 16]) for t in (x, out))
    with tunesvc.capture(mode="lookup", db=tmp_db):
        scale_rows[lambda m: (triton.cdiv(40, m["BLOCK_M"]), triton.cdiv(72, m["BLOCK_N"]))](x_desc, out_desc, 0.5)
    torch.testing.assert_close(out, 0.5 * x)  # the first listed config, served untuned
    assert STATS == {"fallback": 1}
    runner = CliRunner()
    name = f"{__name__}:_scale_rows"
    tuned = runner.invoke(app, ["misses", "--tune", "--kernel", name, "--db", tmp_db])
    assert tuned.exit_code == 0 and "tuned: BM=" in tuned.output, tuned.output
    # rebuilt over new tensors of the recorded shapes: the wrong config caught there too
    assert trials_by_kernel(tmp_db) == {name: {"ok": 2, "wrong_result": 1}}


def test_a_recorded_descriptor_that_is_not_valid_is_refused_in_one_sentence():
    from tunesvc._capture import rebuild_call
    from tunesvc.device import current_device
    from tunesvc.errors import TunesvcError

    tensor = {"tensor": {"shape": [40, 72], "stride": [72, 1], "dtype": "torch.float32"}}
    bad = {"descriptor": {**tensor, "shape": [40, 72], "strides": [71, 1], "block_shape": [16, 16]}}
    call = {"args": [bad, {"value": 0.5}], "kwargs": {}, "grids": [[3, 5]]}
    with pytest.raises(TunesvcError, match=r"^The recorded call's tensor descriptor is not valid here \(") as caught:
        rebuild_call(scale_rows, call, current_device())
    assert "\n" not in str(caught.value)


# a library module whose autotuner is a subclass with its own run, defined at its import (as
# FlagGems' LibTuner is) and so after the interpreter-start hook has patched Triton's autotuner
_LIBRARY = """
import math

import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner


class BucketTuner(Autotuner):
    def run(self, *args, **kwargs):
        nargs = {**dict(zip(self.arg_names, args)), **kwargs}
        key = tuple(round(math.log2(nargs[k])) for k in self.keys)
        if key not in self.cache:
            self.policy_calls = getattr(self, "policy_calls", 0) + 1
            self.cache[key] = self.configs[-1]
        self.best_config = self.cache[key]
        return self.fn.run(*args, **kwargs, **self.best_config.all_kwargs())


class LoggedTuner(BucketTuner):  # a subclass of the subclass, without a run of its own
    pass


@triton.jit
def scale(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask), mask=mask)


CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)]
kernel = LoggedTuner(scale, scale.arg_names, CONFIGS, ["n"], None, None)
"""

_SCRIPT = """
import json, os, sys

import torch
import triton

import library

if os.environ.get("LATE_CAPTURE"):  # as a pytest plugin does: the library's subclass exists already
    os.environ["TUNESVC_CAPTURE"] = "1"
    import _tunesvc_capture

    _tunesvc_capture.install()
x = torch.randn(300)
out = torch.empty_like(x)
library.kernel[lambda m: (triton.cdiv(300, m["BLOCK"]),)](x, out, 300, 2.0)
torch.testing.assert_close(out, 2.0 * x)
capture = sys.modules.get("tunesvc._capture")
print(json.dumps({
    "policy_calls": getattr(library.kernel, "policy_calls", 0),
    "stats": dict(capture.STATS) if capture else None,
}))
"""


@pytest.mark.parametrize("late", [False, True], ids=["at-start", "after-the-library"])
def test_the_start_up_hook_captures_a_subclass_with_a_run_of_its_own(tmp_path, tmp_db, late):
    """TUNESVC_CAPTURE=1 in a process whose only autotuner is a library's subclass with its own
    run, which never calls Autotuner.run: its first launch starts capture all the same, its miss
    is tuned by tunesvc (its own search never runs), and a second process reads the winner; also
    where the hook is installed after the library defined its subclass (conformance's plugin)."""
    (tmp_path / "library.py").write_text(_LIBRARY)
    (tmp_path / "script.py").write_text(_SCRIPT)

    def run(**env):
        done = subprocess.run(
            [sys.executable, "script.py"],
            cwd=tmp_path,
            env=interpreter_env(**env),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    on = {"LATE_CAPTURE": "1"} if late else {"TUNESVC_CAPTURE": "1"}
    first = run(**on, TUNESVC_DB=tmp_db)
    assert first == {"policy_calls": 0, "stats": {"tuned": 1, "benchmarks": len(CONFIGS)}}
    assert {kernel for kernel in trials_by_kernel(tmp_db)} == {"library:scale"}
    assert run(**on, TUNESVC_DB=tmp_db) == {"policy_calls": 0, "stats": {"stored": 1}}
    # without the variable the subclass runs its own search and tunesvc is never imported
    assert run(TUNESVC_DB=tmp_db) == {"policy_calls": 1, "stats": None}


def test_a_subclass_whose_run_is_no_plain_function_is_defined_and_runs_as_written(tmp_db, tmp_path):
    """A run that is a partialmethod (no __name__) or a staticmethod is left as written: defining
    such a class while capturing, or in a process started with TUNESVC_CAPTURE=1, never fails."""
    with tunesvc.capture(mode="tune", db=tmp_db):

        class Partial(Autotuner):
            run = functools.partialmethod(Autotuner.run)

        kernel = Partial(_scale, _scale.arg_names, CONFIGS, ["n"], None, None)
        launch(kernel, 100)  # its partialmethod calls Autotuner.run, which capture has
    assert STATS["tuned"] == 1
    (tmp_path / "odd.py").write_text(
        "import functools, torch, triton\n"
        "from triton.runtime.autotuner import Autotuner\n"
        "class Partial(Autotuner):\n"
        "    run = functools.partialmethod(Autotuner.run)\n"
        "print('defined')\n"
    )
    done = subprocess.run(
        [sys.executable, "odd.py"],
        cwd=tmp_path,
        env=interpreter_env(TUNESVC_CAPTURE="1", TUNESVC_DB=tmp_db),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "defined", done.stderr


def test_a_subclass_whose_cache_cannot_be_replaced_runs_its_own_search_with_one_warning(tmp_db):
    """A subclass whose ``cache`` property takes only its own kinds of cache: tunesvc cannot stand
    in for it, so the subclass searches as it would alone, said once."""

    class CheckedCache(BucketTuner):
        @property
        def cache(self):
            return self._rows

        @cache.setter
        def cache(self, value):
            if not isinstance(value, (dict, PersistentCache)):
                raise TypeError(f"a cache is a dict or a PersistentCache, not {type(value).__name__}")
            self._rows = value

    kernel = CheckedCache(_scale, _scale.arg_names, CONFIGS, ["n"], None, None)
    with tunesvc.capture(mode="tune", db=tmp_db), pytest.warns(RuntimeWarning, match="setting up failed") as said:
        launch(kernel, 100)
        launch(kernel, 3000)
    assert kernel.policy_calls == 2 and "benchmarks" not in STATS
    assert len([w for w in said if "tunesvc" in str(w.message)]) == 1


class CountingTuner(Autotuner):
    """A subclass whose run reads its cache as a dict: its size, whether it is empty, its keys."""

    def run(self, *args, **kwargs):
        nargs = dict(zip(self.arg_names, args))
        key = (nargs["n"],)
        self.seen = (len(self.cache), bool(self.cache), list(self.cache))
        if key not in self.cache:
            self.cache[key] = self.configs[-1]
        self.best_config = self.cache[key]
        return self.fn.run(*args, **kwargs, **self.best_config.all_kwargs())


def test_a_subclass_reads_its_cache_as_a_dict_while_captured(tmp_db):
    """len(), truth and iteration of the cache a subclass's run sees: its own keys and those
    tunesvc answered, as the dict would hold them without capture (a TypeError before)."""
    kernel = CountingTuner(_scale, _scale.arg_names, CONFIGS, ["n"], None, None)
    kernel.cache[(7,)] = CONFIGS[0]  # a key of its own, from before capture
    with tunesvc.capture(mode="lookup", db=tmp_db):
        launch(kernel, 100)
        assert kernel.seen == (1, True, [(7,)])
        launch(kernel, 200)
        assert kernel.seen == (2, True, [(7,), (100,)])
        assert len(kernel.cache) == 3 and list(kernel.cache) == [(7,), (100,), (200,)]
    empty = CountingTuner(_scale, _scale.arg_names, CONFIGS, ["n"], None, None)
    with tunesvc.capture(mode="lookup", db=tmp_db):
        launch(empty, 100)
    assert empty.seen == (0, False, [])
    # a cache of its own that has no len(): refused as without capture, and truthy as without it
    kernel = bucket_tune(_scale)
    with tunesvc.capture(mode="lookup", db=tmp_db):
        launch(kernel, 100)
        assert bool(kernel.cache)
        with pytest.raises(TypeError, match="has no len"):
            len(kernel.cache)


class Registered:
    """A mixin that registers its subclasses (a plugin registry's __init_subclass__)."""

    found: list[str] = []

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Registered.found.append(cls.__name__)


class RefusesRun(type):
    """A metaclass that freezes ``run`` once the class is made."""

    def __setattr__(cls, name, value):
        if name == "run":
            raise AttributeError(f"{cls.__name__}.run is frozen")
        super().__setattr__(name, value)


def test_a_subclass_defined_while_capturing_keeps_its_class_hooks_and_metaclass(tmp_db, tmp_path):
    """Classes defined while capturing: a mixin's __init_subclass__ still runs (capture's own hook
    on Autotuner skipped it), and a metaclass that refuses a new ``run`` leaves the class's run as
    written, where defining the class (or capturing) raised its AttributeError."""
    Registered.found.clear()
    with tunesvc.capture(mode="tune", db=tmp_db):

        class Plugin(BucketTuner, Registered):
            def run(self, *args, **kwargs):
                return super().run(*args, **kwargs)

        class Frozen(BucketTuner, metaclass=RefusesRun):
            def run(self, *args, **kwargs):
                return super().run(*args, **kwargs)

        assert Registered.found == ["Plugin"]
        launch(Plugin(_scale, _scale.arg_names, CONFIGS, ["n"], None, None), 100)
        frozen = Frozen(_scale, _scale.arg_names, CONFIGS, ["n"], None, None)
        launch(frozen, 100)
    assert frozen.policy_calls == 0 and STATS["tuned"] == 1  # Frozen's run calls BucketTuner's, wrapped
    tunesvc.capture(mode="tune", db=tmp_db)  # wrapping every subclass again passes over Frozen
    (tmp_path / "frozen.py").write_text(
        "from triton.runtime.autotuner import Autotuner\n"
        "from test_capture_subclass import Registered, RefusesRun\n"
        "class Frozen(Autotuner, Registered, metaclass=RefusesRun):\n"
        "    def run(self, *args, **kwargs):\n"
        "        return super().run(*args, **kwargs)\n"
        "print(Registered.found)\n"
    )
    done = subprocess.run(
        [sys.executable, "frozen.py"],
        cwd=tmp_path,
        env=interpreter_env(TUNESVC_CAPTURE="1", TUNESVC_DB=tmp_db, PYTHONPATH=str(Path(__file__).parent)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "['Frozen']", done.stderr
