"""Capture never breaks a program: a failure injected at every stage inside tunesvc leaves the
launch to Triton's own autotuner with one warning; tuning leaves no trace but the store
(autograd version counters, requires_grad, the RNG, the user's tensors), under no_grad,
inference_mode, autocast and from a second thread; configs that a pruner builds are stored and
served; outputs of every dtype are compared by value; keys that change on every call are left to
Triton; a bad setting is a warning; claims of dead or stopped processes are taken over in seconds;
and a captured run says what it did in one line."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from _capture import cast as _cast
from _capture import interpreter_env
from _capture import next_line
from _capture import said_at
from _capture import scale as _scale
from _capture import trials_by_kernel

import tunesvc
import tunesvc._capture.bench as capture_bench
import tunesvc._capture.sharing as capture_sharing
import tunesvc._capture.tune as capture_tune
from tunesvc._capture import STATS
from tunesvc.store import Store
from tunesvc.tuning import claim

CAPTURE = sys.modules["tunesvc._capture"]
CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)]
N = 1001  # no block size divides it


def cpu_bench(fn, quantiles):
    """triton.autotune's do_bench for the interpreter (Triton's own needs a GPU driver)."""
    start = time.perf_counter()
    fn()
    return [(time.perf_counter() - start) * 1e3] * len(quantiles)


@triton.jit
def _add_in_place(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """x += y: the user's tensor is both input and output."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def grid(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


def autotuned(fn, **options):
    options.setdefault("key", ["n"])
    return triton.autotune(configs=CONFIGS, do_bench=cpu_bench, **options)(fn)


@pytest.fixture(autouse=True)
def _fresh():
    STATS.clear()
    yield
    tunesvc.uncapture()


def _tunesvc_warnings(caught):
    return [str(w.message) for w in caught if str(w.message).startswith("tunesvc:")]


# -- faults at every stage ------------------------------------------------------------------------
def _boom(*args, **kwargs):
    raise RuntimeError("injected fault")


#: stage -> (where the fault is injected, the stage the warning names): a function is patched in the
#: module whose code calls it (tunesvc._capture re-exports names; patching it there injects nothing)
FAULTS = {
    "look up": (capture_sharing.Shared, "table", "look up"),
    "prune": (capture_bench, "pruned_configs", "prune"),
    "claim": (claim.KeyClaim, "__enter__", "claim"),
    "compile": (capture_tune, "precompiled_configs", "measure"),
    "check": (capture_bench, "relative_error", "measure"),
    "time": (capture_bench.CaptureBench, "measure", "measure"),
    "store": (Store, "add_trials", "store"),
    "store winner": (Store, "update_winner", "store"),
}


@pytest.mark.parametrize("stage", sorted(FAULTS))
def test_a_fault_at_any_stage_runs_the_launch_as_triton_autotune_with_one_warning(stage, tmp_db, monkeypatch):
    """The in-place kernel's result is what Triton's own autotuner gives (x + y once, the
    tensors restored after any partial measuring), the warning names the kernel and the stage
    and points at the launch, and later launches run as Triton's with no further warning."""
    x0, y = torch.randn(N), torch.randn(N)
    expected = x0.clone()
    plain = autotuned(_add_in_place, restore_value=["x_ptr"])
    plain[grid(N)](expected, y, N)
    target, name, named = FAULTS[stage]
    monkeypatch.setattr(target, name, _boom)
    kernel = autotuned(_add_in_place, restore_value=["x_ptr"])
    x = x0.clone()
    with tunesvc.capture(db=tmp_db), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        launch = next_line()
        kernel[grid(N)](x, y, N)
        torch.testing.assert_close(x, expected, rtol=0, atol=0)
        kernel[grid(N)](x, y, N)  # Triton's own now: silently
        kernel[grid(N + 10)](torch.randn(N + 10), torch.randn(N + 10), N + 10)
    torch.testing.assert_close(x, x0 + y + y)
    said = _tunesvc_warnings(caught)
    assert len(said) == 1, said
    assert "_add_in_place" in said[0] and "injected fault" in said[0] and "Triton's own autotuner" in said[0]
    assert f": {named} failed with RuntimeError" in said[0], said[0]
    assert "\n" not in said[0]
    assert said_at(caught) == {(__file__, launch)}
    assert not STATS["tuned"]


def test_a_fault_in_a_subclass_autotuners_cache_lets_the_subclass_search_as_alone(tmp_db, monkeypatch):
    """An Autotuner subclass with a run of its own (FlagGems' LibTuner's shape) goes through
    tunesvc's cache; a fault there leaves its own search to answer."""
    from triton.runtime.autotuner import Autotuner

    class OwnRun(Autotuner):
        def run(self, *args, **kwargs):
            key = (args[2],)
            if key not in self.cache:
                self.cache[key] = self.configs[-1]
            config = self.cache[key]
            self.best_config = config
            return self.fn.run(*args, **kwargs, **config.all_kwargs())

    own_check = OwnRun.run.__tunesvc_original__.__code__.co_firstlineno + 2  # its cache check
    tuner = OwnRun(_scale, _scale.arg_names, CONFIGS, ["n"], None, None, do_bench=cpu_bench)
    monkeypatch.setattr(capture_sharing.Shared, "table", _boom)
    x, out = torch.randn(N), torch.empty(N)
    with tunesvc.capture(db=tmp_db), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuner.run(x, out, N, 3.0, grid=grid(N), warmup=False)
    torch.testing.assert_close(out, 3.0 * x)
    assert tuner.best_config is CONFIGS[-1]
    assert len(_tunesvc_warnings(caught)) == 1
    # the warning names the first frame outside tunesvc and Triton: the subclass's own cache check
    assert said_at(caught) == {(__file__, own_check)}


# -- no trace -------------------------------------------------------------------------------------
class _Double(torch.autograd.Function):
    """y = 2x by a captured kernel; backward by another; x and y saved for backward, so that a
    bumped version counter of either fails the backward."""

    forward_kernel = None
    backward_kernel = None

    @staticmethod
    def forward(ctx, x):
        y = torch.empty_like(x)
        _Double.forward_kernel[grid(x.numel())](x, y, x.numel(), 2.0)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        _x, _y = ctx.saved_tensors  # unpacking checks their versions
        gx = torch.empty_like(g)
        _Double.backward_kernel[grid(g.numel())](g.contiguous(), gx, g.numel(), 2.0)
        return gx


def test_tuning_inside_an_autograd_function_keeps_version_counters_and_the_backward(tmp_db):
    _Double.forward_kernel = autotuned(_scale)
    _Double.backward_kernel = autotuned(_scale, key=["n", "alpha"])  # a key of its own
    x = torch.randn(N, requires_grad=True)
    with tunesvc.capture(db=tmp_db), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = _Double.apply(x)
        assert x._version == 0 and y._version == 0
        y.sum().backward()
    assert not _tunesvc_warnings(caught)
    assert STATS["tuned"] == 2  # forward and backward, each measured
    torch.testing.assert_close(x.grad, torch.full((N,), 2.0))
    torch.testing.assert_close(y.detach(), 2.0 * x.detach())
    assert x.requires_grad and y.requires_grad and y.grad_fn is not None


def _rng_hook(nargs, reset_only=False):
    if not reset_only:  # a tuner-level hook drawing random numbers: only the benchmarking calls it so
        torch.rand(3)


def _check_untraced(run_in, tmp_db, make=torch.randn):
    """Tune a key inside ``run_in``; the output is right, the RNG as before, versions unchanged."""
    kernel = autotuned(_add_in_place, pre_hook=_rng_hook)
    result = {}

    def body():
        x, y = make(N), make(N)
        x0 = x.clone()
        versions = None if x.is_inference() else (x._version, y._version)
        rng = torch.get_rng_state()
        kernel[grid(N)](x, y, N)
        result["rng_kept"] = torch.equal(rng, torch.get_rng_state())
        result["right"] = torch.equal(x, x0 + y)
        result["versions"] = versions == (None if x.is_inference() else (x._version, y._version))

    with tunesvc.capture(db=tmp_db):
        run_in(body)
    assert result == {"rng_kept": True, "right": True, "versions": True}
    assert STATS["tuned"] == 1


def test_tuning_under_no_grad_leaves_no_trace(tmp_db):
    def run_in(body):
        with torch.no_grad():
            body()

    _check_untraced(run_in, tmp_db)


def test_tuning_under_inference_mode_on_inference_tensors_leaves_no_trace(tmp_db):
    def run_in(body):
        with torch.inference_mode():
            body()

    _check_untraced(run_in, tmp_db)


def test_tuning_of_inference_tensors_outside_inference_mode_leaves_no_trace(tmp_db):
    def make(n):
        with torch.inference_mode():
            return torch.randn(n)

    _check_untraced(lambda body: body(), tmp_db, make=make)


def test_tuning_under_autocast_leaves_no_trace(tmp_db):
    def run_in(body):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            body()

    _check_untraced(run_in, tmp_db)


def test_tuning_from_a_second_thread_leaves_no_trace(tmp_db):
    def run_in(body):
        errors = []

        def target():
            try:
                body()
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        thread = threading.Thread(target=target)
        thread.start()
        thread.join()
        assert not errors

    _check_untraced(run_in, tmp_db)


def test_a_kernel_launched_from_a_torch_library_op_is_tuned_without_trace(tmp_db):
    """A library's custom op (torch.library) whose implementation launches a captured kernel."""
    kernel = autotuned(_scale)

    @torch.library.custom_op("tunesvc_test::triple", mutates_args=())
    def triple(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        kernel[grid(x.numel())](x, out, x.numel(), 3.0)
        return out

    x = torch.randn(N)
    with tunesvc.capture(db=tmp_db):
        out = triple(x)
    torch.testing.assert_close(out, 3.0 * x)
    assert x._version == 0 and STATS["tuned"] == 1


# -- every config triton.autotune could launch --------------------------------------------------
def _built_by_pruner(configs, nargs, **kwargs):
    """New triton.Config objects, not members of the list: a block size adapted to the call and
    num_stages added (as a library's early_config_prune builds them)."""
    small = max(16, min(64, triton.next_power_of_2(nargs["n"]) // 16))
    return [triton.Config({"BLOCK": small}, num_warps=w, num_stages=2) for w in (1, 2, 4)]


@pytest.mark.parametrize(
    "prune",
    [
        {"early_config_prune": _built_by_pruner},
        {"perf_model": lambda **kw: kw["BLOCK"] * kw["num_warps"], "top_k": 3},
    ],
    ids=["early_config_prune", "perf_model"],
)
def test_configs_a_pruner_keeps_or_builds_are_stored_and_served_without_measuring_again(prune, tmp_db):
    x, out = torch.randn(N), torch.empty(N)
    with tunesvc.capture(db=tmp_db), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        autotuned(_scale, prune_configs_by=prune)[grid(N)](x, out, N, 2.0)
    assert not _tunesvc_warnings(caught)
    torch.testing.assert_close(out, 2.0 * x)
    assert STATS["tuned"] == 1 and STATS["benchmarks"] == 3
    stored = trials_by_kernel(tmp_db)
    STATS.clear()
    kernel = autotuned(_scale, prune_configs_by=prune)  # a new process's kernel object
    out.zero_()
    with tunesvc.capture(db=tmp_db):
        kernel[grid(N)](x, out, N, 2.0)
    torch.testing.assert_close(out, 2.0 * x)
    assert dict(STATS) == {"stored": 1}
    assert trials_by_kernel(tmp_db) == stored
    if "early_config_prune" in prune:
        assert kernel.best_config.num_stages == 2  # one the pruner built, served from the store


@pytest.mark.parametrize(
    "dtype", [torch.float8_e5m2, torch.float8_e4m3fn, torch.int32, torch.int8, torch.bool, torch.bfloat16]
)
def test_outputs_of_every_dtype_are_compared_by_value(dtype, tmp_db):
    """Every config writes the same values: all trials are ok, the output is Triton's."""
    x = torch.randn(N) * 4
    expected = torch.empty(N, dtype=dtype)
    autotuned(_cast)[grid(N)](x, expected, N)
    out = torch.empty(N, dtype=dtype)
    with tunesvc.capture(db=tmp_db), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        autotuned(_cast)[grid(N)](x, out, N)
    assert not _tunesvc_warnings(caught)
    assert (
        torch.equal(out.view(torch.uint8), expected.view(torch.uint8))
        if dtype.itemsize == 1
        else torch.equal(out, expected)
    )
    assert sum(trials_by_kernel(tmp_db).values(), start=__import__("collections").Counter()) == {"ok": len(CONFIGS)}


@triton.jit
def _wrong_when_32(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if BLOCK == 32:
        x = x + 1.0
    tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty), mask=mask)


def test_a_float8_config_that_writes_other_values_is_found_wrong(tmp_db):
    x = torch.randn(N)
    out = torch.empty(N, dtype=torch.float8_e5m2)
    with tunesvc.capture(db=tmp_db):
        autotuned(_wrong_when_32)[grid(N)](x, out, N)
    counts = sum(trials_by_kernel(tmp_db).values(), start=__import__("collections").Counter())
    assert counts == {"ok": 4, "wrong_result": 2}


# -- keys -------------------------------------------------------------------------------------------
def test_a_key_naming_a_tensor_is_left_to_triton_with_one_warning_and_no_rows(tmp_db):
    kernel = autotuned(_scale, key=["x_ptr", "n"])
    with tunesvc.capture(db=tmp_db), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            x, out = torch.randn(N), torch.empty(N)
            launch = next_line()
            kernel[grid(N)](x, out, N, 2.0)
            torch.testing.assert_close(out, 2.0 * x)
    said = _tunesvc_warnings(caught)
    assert len(said) == 1 and "Tensor" in said[0], said
    assert said_at(caught) == {(__file__, launch)}
    assert not os.path.exists(tmp_db) or not trials_by_kernel(tmp_db)


def test_a_kernel_past_max_keys_is_left_to_triton_and_stores_nothing_more(tmp_db, monkeypatch):
    monkeypatch.setenv("TUNESVC_MAX_KEYS", "2")
    kernel = autotuned(_scale)
    with tunesvc.capture(db=tmp_db), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (100, 200, 300, 400, 500):
            x, out = torch.randn(n), torch.empty(n)
            kernel[grid(n)](x, out, n, 2.0)
            torch.testing.assert_close(out, 2.0 * x)
    said = _tunesvc_warnings(caught)
    assert len(said) == 1 and "TUNESVC_MAX_KEYS" in said[0], said
    assert STATS["tuned"] == 2
    assert sum(trials_by_kernel(tmp_db).values(), start=__import__("collections").Counter()) == {"ok": 2 * len(CONFIGS)}


# -- modes and settings ---------------------------------------------------------------------------
def test_heuristic_mode_launches_the_first_pruned_config_and_reads_nothing(tmp_db):
    x, out = torch.randn(N), torch.empty(N)
    kernel = autotuned(_scale)
    with tunesvc.capture(mode="heuristic", db=tmp_db):
        kernel[grid(N)](x, out, N, 2.0)
    torch.testing.assert_close(out, 2.0 * x)
    assert kernel.best_config is CONFIGS[0] and dict(STATS) == {"heuristic": 1}
    assert not os.path.exists(tmp_db)


APP = """
import sys, warnings
import torch, triton
import tunesvc
import appkernels

n = 333
x, out = torch.randn(n), torch.empty(n)
appkernels.scale[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n, 2.0)
torch.testing.assert_close(out, 2.0 * x)
from tunesvc.kernels import softmax
a = torch.randn(5, 37)
torch.testing.assert_close(softmax(a), torch.softmax(a, -1))
print("source", tunesvc.lookup("matmul", M=16, N=32, K=32, dtype="float16").source)
print("ok")
"""

APP_KERNELS = """
import time
import triton
import triton.language as tl

def slow_bench(fn, quantiles):
    fn()
    return [1.0] * len(quantiles)

def nap(nargs, reset_only=False):
    time.sleep(float(__import__("os").environ.get("APP_NAP", "0")))

@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)],
                 key=["n"], do_bench=slow_bench, pre_hook=nap)
@triton.jit
def scale(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask), mask=mask)
"""


@pytest.fixture
def app(tmp_path):
    (tmp_path / "appkernels.py").write_text(textwrap.dedent(APP_KERNELS))
    path = tmp_path / "app.py"
    path.write_text(textwrap.dedent(APP))
    return path


_env = interpreter_env


def _tune(*args, env, cwd):
    return subprocess.run(
        [sys.executable, "-m", "tunesvc", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("mode", ["off", "heuristic", "lookup", "tune"])
def test_every_mode_means_the_same_to_tune_run_shipped_kernels_and_lookups(mode, app, tmp_path):
    """`tune run --mode M`: the captured kernel, a shipped kernel and tunesvc.lookup all accept
    M (TUNESVC_MODE=off once made every shipped kernel raise), and the run ends with its summary."""
    done = _tune("run", "--mode", mode, "--", sys.executable, str(app), env=_env(), cwd=app.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "ok"
    summary = done.stderr.strip().splitlines()[-1]
    assert summary.startswith("tunesvc: ") and summary.endswith("."), done.stderr
    tuned = "1 tuned in" in summary
    assert tuned == (mode == "tune"), summary
    assert ("0 kernels captured" in summary) == (mode == "off"), summary
    assert not [p.name for p in app.parent.iterdir() if p.name.endswith(".lock")]


@pytest.mark.parametrize(
    "variable, value",
    [("TUNESVC_MODE", "tuen"), ("TUNESVC_DB", "/tmp/" + "x" * 300 + ".db"), ("TUNESVC_COMPILE_WORKERS", "many")],
)
def test_a_bad_setting_is_one_warning_and_the_program_runs(variable, value, app):
    env = _env(TUNESVC_CAPTURE="1", **{variable: value})
    done = subprocess.run(
        [sys.executable, str(app)], env=env, cwd=app.parent, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "ok"
    said = [line for line in done.stderr.splitlines() if "tunesvc:" in line and "no tuned config" not in line]
    assert said and all(variable in line for line in said), done.stderr  # each line names what to fix
    assert len([line for line in said if "appkernels:scale" in line]) <= 1
    assert "Traceback" not in done.stderr


def test_each_warning_of_a_captured_program_names_the_programs_own_line(app, tmp_path):
    """Under TUNESVC_CAPTURE=1 with a damaged database: the captured kernel's fail-open warning
    names the line of its launch, the shipped kernel's and the lookup's name their calls, each
    past tunesvc's, Triton's and torch's frames (and the start-up hook's)."""
    db = tmp_path / "damaged.db"
    db.write_text("not a database")
    env = _env(TUNESVC_CAPTURE="1", TUNESVC_DB=str(db))
    done = subprocess.run(
        [sys.executable, str(app)], env=env, cwd=app.parent, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = app.read_text().splitlines()
    launch, shipped, lookup = (
        next(n for n, line in enumerate(lines, 1) if text in line) for text in ("scale[", "softmax(a)", "lookup(")
    )
    said = [line for line in done.stderr.splitlines() if "RuntimeWarning: tunesvc:" in line]
    assert said and {line.split(": RuntimeWarning: ")[0] for line in said} == {
        f"{app}:{n}" for n in (launch, shipped, lookup)
    }, done.stderr
    assert any(line.startswith(f"{app}:{launch}: ") and "appkernels:scale" in line for line in said)


def test_summary_line_of_a_captured_program_where_asked(app, tmp_path):
    env = _env(TUNESVC_CAPTURE="1", TUNESVC_SUMMARY="1", TUNESVC_DB=str(tmp_path / "s.db"))
    first = subprocess.run([sys.executable, str(app)], env=env, cwd=app.parent, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert (
        first.stderr.strip()
        .splitlines()[-1]
        .startswith("tunesvc: 1 kernel captured; keys: 0 served from the store, 1 tuned in")
    )
    again = subprocess.run([sys.executable, str(app)], env=env, cwd=app.parent, capture_output=True, text=True)
    assert (
        again.stderr.strip()
        .splitlines()[-1]
        .startswith("tunesvc: 1 kernel captured; keys: 1 served from the store, 0 tuned in")
    )


def test_shipped_and_captured_kernels_tune_a_miss_under_the_one_key_claim(tmp_db, monkeypatch):
    """Mode 'tune' of a shipped kernel and a captured kernel's miss both go through KeyClaim
    (no lock file anywhere): each claims its key once, and a second lookup claims nothing."""
    entered = []
    original = claim.KeyClaim.__enter__

    def counting(self):
        entered.append(self.kernel)
        return original(self)

    monkeypatch.setattr(claim.KeyClaim, "__enter__", counting)
    runtime = tunesvc.Runtime(db=tmp_db, mode="tune", budget=2)
    assert runtime.lookup("softmax", M=5, N=37, dtype="float32").source == "tuned"
    assert runtime.lookup("softmax", M=5, N=37, dtype="float32").source == "tuned"  # memoised
    kernel = autotuned(_scale)
    x, out = torch.randn(N), torch.empty(N)
    with tunesvc.capture(db=tmp_db):
        kernel[grid(N)](x, out, N, 2.0)
    assert entered == ["softmax", CAPTURE.kernel_name(kernel.fn)]
    assert not list(Path(tmp_db).parent.glob("*.lock"))


# -- claims of dead and stopped processes -----------------------------------------------------------
def _running_claim(db: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(db):
            try:
                with sqlite3.connect(db) as connection:
                    if connection.execute("SELECT count(*) FROM tunesvc_jobs WHERE status = 'running'").fetchone()[0]:
                        return
            except sqlite3.OperationalError:  # tables not made yet
                pass
        time.sleep(0.1)
    raise AssertionError("the first process never claimed the key")


class _Lines:
    """The lines a child writes to ``stream``, each with the monotonic time it was read, read by a
    thread; :meth:`wait_for` waits on an event set per line, not on a clock."""

    def __init__(self, stream) -> None:
        self.lines: list[tuple[float, str]] = []
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._changed:
                self.lines.append((time.monotonic(), line))
                self._changed.notify_all()
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wait_for(self, text: str, timeout: float) -> float | None:
        """When the first line holding ``text`` was read (None: none before the stream closed,
        or within ``timeout`` seconds, a cap against a hang and no part of what is tested)."""
        with self._changed:
            self._changed.wait_for(lambda: self._closed or any(text in line for _, line in self.lines), timeout)
            return next((at for at, line in self.lines if text in line), None)

    def text(self) -> str:
        self._thread.join(timeout=60)
        with self._changed:
            return "".join(line for _, line in self.lines)


#: TUNESVC_CLAIM_STALE_S of the stopped holder's test: its heartbeat (every STALE_S / 4) stops
#: with it, and the waiter takes its claim over once the last beat is this old
STALE_S = 8.0
#: ... and of the killed holder's: a stale heartbeat would take 90 s or more, so a takeover within
#: TAKEOVER_S of the kill is the dead process seen (the waiter polls every claim.POLL_S)
KILLED_STALE_S = 120.0
#: the most seconds from the signal to the waiter's "took the claim", over what the claim itself
#: waits (nothing for a killed holder, at most STALE_S for a stopped one): slack for a loaded
#: machine. On 2 cores with 4 busy loops beside the test, the killed holder's claim was taken
#: 0.22 s after the kill (one poll) and the stopped one's 7.1-8.0 s after the stop (never past STALE_S)
TAKEOVER_S = 20.0


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_claim_of_a_killed_or_stopped_process_is_taken_over_in_seconds(how, app, tmp_path):
    """The holder dies (kill -9, reaped) or stops (SIGSTOP) while tuning, with the next process
    already waiting on its claim (it said so while the holder's heartbeat went on); the waiter
    takes the claim over in seconds (not the minute a stale heartbeat took): a dead holder's at
    once, a stopped one's once its heartbeat is STALE_S old; it says that it waited and tunes the key.

    The times are taken from the signal to the waiter's line that it took the claim, read as the
    waiter writes it: how long the processes take to start and the key to tune is not counted."""
    db = str(tmp_path / "claims.db")
    stale = KILLED_STALE_S if how == "killed" else STALE_S
    env = _env(TUNESVC_CAPTURE="1", TUNESVC_DB=db, TUNESVC_CLAIM_STALE_S=f"{stale:g}")
    holder = subprocess.Popen(
        [sys.executable, str(app)],
        env=env | {"APP_NAP": "600"},  # holds the claim for as long as the test runs
        cwd=app.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    waiter = None
    out = tmp_path / "waiter.out"
    try:
        _running_claim(db)
        with out.open("w") as stdout:
            waiter = subprocess.Popen(
                [sys.executable, str(app)], env=env, cwd=app.parent, stdout=stdout, stderr=subprocess.PIPE, text=True
            )
        said = _Lines(waiter.stderr)
        assert said.wait_for("tunesvc: waiting for", timeout=300) is not None, said.text()
        assert said.wait_for("tunesvc: waited", timeout=0) is None  # a live holder's claim is not taken
        holder.send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        signalled = time.monotonic()
        if how == "killed":
            holder.wait()  # reaped, as a parent reaps its killed child: its pid is gone
        took = said.wait_for("tunesvc: waited", timeout=300)
        assert waiter.wait(timeout=300) == 0, said.text()
    finally:
        holder.kill()
        holder.wait()
        if waiter is not None:
            waiter.kill()
            waiter.wait()
    stderr = said.text()
    assert out.read_text().splitlines()[-1] == "ok"
    assert took is not None and "took the claim." in stderr, stderr
    assert took - signalled < (0.0 if how == "killed" else STALE_S) + TAKEOVER_S, (took - signalled, stderr)
    store = Store(db)
    try:
        assert [w.shape_key for w in store.winners()] and store.winners()[0].kernel == "appkernels:scale"
    finally:
        store.close()


def test_the_summary_record_adds_up_over_processes():
    line = CAPTURE.summary_line(
        [
            {"kernels": 2, "stored": 3, "tuned": 1, "tune_s": 1.25, "untuned": 0, "fallback": 1, "failed_open": {}},
            {
                "kernels": 1,
                "stored": 0,
                "tuned": 2,
                "tune_s": 2.0,
                "untuned": 1,
                "fallback": 0,
                "failed_open": {"claim failed": 1},
            },
        ]
    )
    assert line == (
        "tunesvc: 3 kernels captured; keys: 3 served from the store, 3 tuned in 3.2 s, 1 with one config, "
        "1 served untuned; left to Triton's autotuner: 1 claim failed."
    )
    assert json.loads(json.dumps(CAPTURE.summary_record()))["kernels"] >= 0


def test_finalists_are_the_candidates_within_the_window_of_the_fastest():
    from tunesvc.records import Measurement
    from tunesvc.records import Status

    def ok(ms):
        return Measurement(Status.OK, time_ms=ms, spread=0.0, reps=1)

    wrong = Measurement(Status.WRONG_RESULT, time_ms=0.5, rel_error=1.0)
    assert CAPTURE.contender_count([ok(1.0), ok(1.2), wrong]) == 1  # ahead by more than the window
    assert CAPTURE.contender_count([ok(1.03), ok(1.0), ok(1.2)]) == 2
    assert CAPTURE.contender_count([ok(1.0)] * 5) == CAPTURE.FINALISTS
    assert CAPTURE.contender_count([wrong]) == 0


def test_only_keys_hashed_by_identity_are_left_to_triton():
    assert CAPTURE.by_identity(torch.zeros(1)) and CAPTURE.by_identity((1, torch.zeros(1)))
    assert CAPTURE.by_identity(object())
    assert not any(CAPTURE.by_identity(v) for v in (None, 3, 2.5, True, "x", torch.float16, (1, 2), tl.float16))


def _outcome(call):
    try:
        call()
    except Exception as exc:  # the program's own exception, compared by type and text
        return type(exc).__name__, str(exc)
    return "ok", ""


@pytest.mark.parametrize(
    "how",
    ["a tuned parameter passed", "a launch option passed", "run() without warmup"],
)
def test_a_call_triton_refuses_is_refused_the_same_under_capture(how, tmp_db):
    """A launch that Triton's autotuner refuses (a meta-parameter or launch option its configs
    set passed by the caller; ``run`` called without ``warmup``) ends with Triton's exception
    under capture too, on its first call and on a call of a key tuned before."""
    x = torch.randn(N)

    def call(kernel):
        out = torch.empty(N)
        if how == "a tuned parameter passed":
            kernel[grid(N)](x, out, N, 2.0, BLOCK=32)
        elif how == "a launch option passed":
            kernel[grid(N)](x, out, N, 2.0, num_warps=2)
        else:
            kernel.run(x, out, N, 2.0, grid=grid(N))

    def sequence(kernel):  # refused, a plain call that tunes the key, refused again (a cached key)
        first = _outcome(lambda: call(kernel))
        kernel[grid(N)](x, torch.empty(N), N, 2.0)
        return first, _outcome(lambda: call(kernel))

    expected = sequence(autotuned(_scale))
    assert all(outcome != "ok" for outcome, _ in expected)
    kernel = autotuned(_scale)
    with tunesvc.capture(db=tmp_db), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sequence(kernel) == expected
    assert _tunesvc_warnings(caught) == []


def _launch_in_child(n, queue):
    import tunesvc._capture.sharing as sharing

    inherited = len(sharing.SHARED)
    kernel = FORKED[0]
    x, out = torch.randn(n), torch.empty(n)
    kernel[grid(n)](x, out, n, 2.0)
    torch.testing.assert_close(out, x * 2.0)
    queue.put((inherited, sum(s._store is not None for s in sharing.SHARED.values())))


FORKED: list = []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX's")
def test_a_forked_child_tunes_on_connections_of_its_own(tmp_db):
    """A captured process that forks: the child drops the parent's database connections (never
    used from two processes) and opens its own; both store their keys, and the file is sound."""
    import multiprocessing

    import tunesvc._capture.sharing as sharing

    FORKED[:] = [autotuned(_scale)]
    with tunesvc.capture(db=tmp_db):
        FORKED[0][grid(N)](torch.randn(N), torch.empty(N), N, 2.0)  # the parent's store is open
        assert any(s._store is not None for s in sharing.SHARED.values())
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_launch_in_child, args=(N + 7, queue))
        child.start()
        inherited, opened = queue.get(timeout=120)
        child.join(timeout=120)
        assert child.exitcode == 0
        FORKED[0][grid(N + 13)](torch.randn(N + 13), torch.empty(N + 13), N + 13, 2.0)  # the parent goes on
    assert (inherited, opened) == (0, 1)  # none of the parent's; one of its own
    with sqlite3.connect(tmp_db) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        keys = {row[0] for row in connection.execute("select shape_key from tunesvc_winners")}
    assert {key.split(",")[0] for key in keys} == {f"n={n}" for n in (N, N + 7, N + 13)}


def test_a_deep_copy_of_a_captured_kernel_is_a_kernel_of_its_own(tmp_db):
    """copy.deepcopy of a kernel captured and launched (a model deep-copied with the kernels it
    holds) copies as Triton's does, where tunesvc's state (its lock) raised a TypeError: the copy
    makes its state at its first launch, a tunesvc.autotune copy with its own name and settings."""
    import copy

    plain, ours = autotuned(_scale), tunesvc.autotune(CONFIGS, ["n"], name="ours", mode="lookup", db=tmp_db)(_scale)
    with tunesvc.capture(db=tmp_db):
        for kernel in (plain, ours):
            kernel[grid(N)](torch.randn(N), torch.empty(N), N, 2.0)
            twin = copy.deepcopy(kernel)
            x, out = torch.randn(N + 1), torch.empty(N + 1)
            twin[grid(N + 1)](x, out, N + 1, 2.0)
            torch.testing.assert_close(out, 2.0 * x)
            assert twin.__dict__["_tunesvc"] is not kernel.__dict__["_tunesvc"]
    assert twin.__dict__["_tunesvc"].name == "ours" and twin.__dict__["_tunesvc"].settings.mode == "lookup"
    assert STATS["tuned"] == 2  # the plain kernel's two keys; ours serves them in mode lookup
    tunesvc.uncapture()
    copy.deepcopy(plain)[grid(N)](torch.randn(N), torch.empty(N), N, 2.0)  # capture off: Triton's


_WRAPPING_LIBRARY = """
import sys

sys.path.insert(0, {tests!r})
import threading

import torch
import triton
from _capture import scale
from triton.runtime.autotuner import Autotuner

LOCK, CALLS = threading.Lock(), []
original = Autotuner.run


def locked_run(self, *args, **kwargs):  # a library's own run: it serialises every autotuned launch
    CALLS.append(1)
    with LOCK:
        return original(self, *args, **kwargs)


Autotuner.run = locked_run
configs = [triton.Config({{"BLOCK": b}}) for b in (16, 32, 64)]
kernel = triton.autotune(configs, key=["n"], do_bench=lambda fn, quantiles: [1.0] * len(quantiles))(scale)
for n in (100, 200, 300):
    x, out = torch.randn(n), torch.empty(n)
    kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n, 2.0)
    torch.testing.assert_close(out, 2.0 * x)
capture = sys.modules.get("tunesvc._capture")
print(len(CALLS), sorted(capture.STATS.items()) if capture else None)
"""


def test_a_library_that_replaces_autotuner_run_keeps_its_run(tmp_path, tmp_db):
    """A library's own Autotuner.run (a lock around every launch, a recorder) stays in place
    under capture: TUNESVC_CAPTURE=1 no longer drops it at the first launch (tunesvc runs
    beneath it), and a kernel left to Triton there (mode off) no longer recurses until
    RecursionError (Triton's run was taken to be the library's); uncapture() or capture() again
    no longer put Triton's or tunesvc's in its place; one that was there before capture() is
    left as it is, said once."""
    (tmp_path / "library.py").write_text(_WRAPPING_LIBRARY.format(tests=str(Path(__file__).parent)))

    def run(**env):
        done = subprocess.run(
            [sys.executable, "library.py"],
            cwd=tmp_path,
            env=interpreter_env(TUNESVC_CAPTURE="1", TUNESVC_DB=tmp_db, **env),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0 and "tunesvc:" not in done.stderr, done.stderr
        return done.stdout.strip()

    assert run() == "3 [('benchmarks', 9), ('tuned', 3)]"
    assert run(TUNESVC_MODE="off") == "3 []"

    from triton.runtime.autotuner import Autotuner

    calls = []
    kernel = autotuned(_scale)
    with tunesvc.capture(db=tmp_db):
        original = Autotuner.run

        def recorded(self, *args, **kwargs):
            calls.append(1)
            return original(self, *args, **kwargs)

        Autotuner.run = recorded
        try:
            kernel[grid(N)](torch.randn(N), torch.empty(N), N, 2.0)  # captured, through the library's run
            tunesvc.uncapture()
            assert Autotuner.run is recorded
            kernel[grid(N + 1)](torch.randn(N + 1), torch.empty(N + 1), N + 1, 2.0)  # Triton's, through it
            assert calls == [1, 1] and STATS["tuned"] == 1
            with pytest.warns(RuntimeWarning, match="Autotuner.run is .*recorded") as said:
                tunesvc.capture(db=tmp_db)
            assert len(said) == 1 and Autotuner.run is recorded
            kernel[grid(N + 2)](torch.randn(N + 2), torch.empty(N + 2), N + 2, 2.0)
            assert calls == [1, 1, 1] and STATS["tuned"] == 2  # it calls tunesvc's: captured
        finally:
            Autotuner.run = original
