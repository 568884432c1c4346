"""triton.autotune kernels inside torch.compile under capture: Dynamo's trace of the kernel's call
gets a one-config autotuner holding the stored winner (nothing measured, by tunesvc or by the
compiler); a miss, a symbolic key or a failure inside the hook leaves torch's own behaviour (a
miss recorded for `tune misses --tune`, a failure said in one line); results equal eager ones.

On the CPU, Dynamo's path for user-defined Triton kernels is reached with ``backend="aot_eager"``,
whose graph launches the traced kernel through Triton's interpreter. Two things torch checks
first are not so there, and :func:`traceable` gives them: ``has_triton()`` finds no Triton device
on a CPU-only machine, and Dynamo walks a kernel's ``.fn`` chain down to a ``JITFunction``, which
the interpreter's ``InterpretedFunction`` is not (its parameters are JITFunction's, for the same
function). Everything else (tracing, pruning, the hook, the store, the launch) is real.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch
import torch.utils._triton
import triton
import triton.language as tl
from _capture import interpreter_env
from _capture import trial_total
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction
from typer.testing import CliRunner

import tunesvc
import tunesvc._capture.compiled as capture_compiled
from tunesvc._capture import STATS
from tunesvc._capture import summary_line
from tunesvc._capture import summary_record
from tunesvc.cli import app
from tunesvc.store import Store

torch_dynamo = pytest.importorskip("torch._dynamo")

#: the largest block last: in the interpreter, fewer programs are faster, so tuning is likely to pick
#: a config other than the first listed one (the tests never rely on which one wins)
CONFIGS = [triton.Config({"BLOCK": b}) for b in (16, 32, 128)]
N = 1000


def cpu_bench(fn, quantiles=None, **_):
    """triton.autotune's do_bench for the interpreter, which has no benchmarker of its own."""
    start = time.perf_counter()
    fn()
    ms = (time.perf_counter() - start) * 1e3
    return [ms] * len(quantiles) if quantiles else ms


@triton.jit
def _scale(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask), mask=mask)


def autotuned(**options):
    options.setdefault("key", ["n"])
    return triton.autotune(configs=CONFIGS, do_bench=cpu_bench, **options)(_scale)


def program(kernel):
    """What a user compiles: the kernel between two torch ops."""

    def f(x):
        out = torch.empty_like(x)
        n = x.numel()
        kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n, 3.0)
        return out + 1

    return f


class Recording:
    """A torch.compile backend that keeps each graph Dynamo traced and runs it as aot_eager does."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.registry import lookup_backend

        self.graphs.append(gm)
        return lookup_backend("aot_eager")(gm, example_inputs)

    def kernels(self):
        """The Triton kernel of every user-kernel call in the graphs, as the op launches it."""
        from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

        return [
            kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
            for gm in self.graphs
            for node in gm.graph.nodes
            if "triton_kernel_wrapper" in str(node.target)
        ]


def compiled(f, **options):
    backend = Recording()
    return torch.compile(f, backend=backend, fullgraph=True, **options), backend


@pytest.fixture(autouse=True)
def traceable(monkeypatch):
    """Dynamo's user-kernel path on the interpreter (see the module's docstring)."""
    monkeypatch.setattr(torch.utils._triton, "has_triton", lambda: True)
    monkeypatch.setattr(triton, "JITFunction", (JITFunction, InterpretedFunction))
    monkeypatch.setattr(
        InterpretedFunction, "params", property(lambda self: JITFunction(self.fn).params), raising=False
    )
    torch_dynamo.reset()
    STATS.clear()
    yield
    tunesvc.uncapture()
    torch_dynamo.reset()


def configs_of(kernel):
    return [c.all_kwargs() for c in kernel.configs]


def stored_winner(db, kernel):
    """Tune the key of ``N`` by an eager launch under capture; the config it stored."""
    x = torch.randn(N)
    with tunesvc.capture(db=db):
        program(kernel)(x)
    assert STATS["tuned"] == 1
    STATS.clear()
    return kernel.best_config


def test_a_stored_winner_is_all_the_compiled_graph_holds_and_nothing_is_measured(tmp_db):
    kernel = autotuned()
    winner = stored_winner(tmp_db, kernel)
    trials = trial_total(tmp_db)
    x = torch.randn(N)
    expected = program(kernel)(x)  # eager, uncaptured: Triton's own autotuner
    with tunesvc.capture(db=tmp_db):
        f, backend = compiled(program(kernel))
        out = f(x)
    torch.testing.assert_close(out, expected)
    [traced] = backend.kernels()
    assert configs_of(traced) == [winner.all_kwargs()]  # the compiler gets one config: nothing to benchmark
    assert dict(STATS) == {"compiled_stored": 1}  # the one-config kernel's launch is Triton's: untouched
    assert trial_total(tmp_db) == trials
    line = summary_line([summary_record()])
    assert line.endswith("; keys inside torch.compile: 1 served from the store."), line


def test_a_miss_in_mode_tune_is_left_to_the_compiler_and_recorded_with_its_call(tmp_db):
    kernel = autotuned()
    x = torch.randn(N)
    with tunesvc.capture(db=tmp_db):
        f, backend = compiled(program(kernel))
        out = f(x)
    torch.testing.assert_close(out, 3.0 * x + 1)
    [traced] = backend.kernels()
    assert traced is kernel  # torch's own: Inductor would tune it (aot_eager launches it, captured)
    assert STATS["compiled_missed"] == 1 and "compiled_stored" not in STATS
    store = Store(tmp_db, readonly=True)
    try:
        [miss] = store.misses()
    finally:
        store.close()
    assert miss.shape_key == "n=1000,x_ptr.dtype=float32,out_ptr.dtype=float32"
    assert miss.call["args"][0] == {"tensor": {"shape": [N], "stride": [1], "dtype": "torch.float32"}}
    assert miss.call["args"][2:] == [{"value": N}, {"value": 3.0}]
    assert miss.call["grids"] == [[triton.cdiv(N, c.kwargs["BLOCK"])] for c in CONFIGS]
    line = summary_line([summary_record()])
    assert "keys inside torch.compile: 0 served from the store, 1 tuned by Inductor (no stored winner" in line


KERNELS = """
import time
import triton
import triton.language as tl

def cpu_bench(fn, quantiles=None, **_):
    start = time.perf_counter()
    fn()
    ms = (time.perf_counter() - start) * 1e3
    return [ms] * len(quantiles) if quantiles else ms

@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32, 128)], key=["n"], do_bench=cpu_bench)
@triton.jit
def scale(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask), mask=mask)
"""


def test_a_miss_served_untuned_in_mode_lookup_is_tuned_offline_and_then_served(tmp_db, tmp_path, monkeypatch):
    (tmp_path / "compkernels.py").write_text(textwrap.dedent(KERNELS))
    monkeypatch.syspath_prepend(str(tmp_path))
    import compkernels

    x = torch.randn(N)
    f = program(compkernels.scale)
    Store(tmp_db).close()  # lookup records misses in a database that is there
    with tunesvc.capture(db=tmp_db, mode="lookup"):
        first, backend = compiled(f)
        torch.testing.assert_close(first(x), 3.0 * x + 1)
    [traced] = backend.kernels()
    assert configs_of(traced) == [CONFIGS[0].all_kwargs()]  # the one chain's answer: nothing stored yet
    assert dict(STATS) == {"compiled_fallback": 1}
    tuned = CliRunner().invoke(app, ["misses", "--tune", "--kernel", "compkernels:scale", "--db", tmp_db])
    assert tuned.exit_code == 0 and "tuned: BLOCK=" in tuned.output, tuned.output
    store = Store(tmp_db, readonly=True)
    try:
        [winner] = store.winners(kernel="compkernels:scale")
    finally:
        store.close()
    STATS.clear()
    torch_dynamo.reset()
    with tunesvc.capture(db=tmp_db, mode="lookup"):
        again, backend = compiled(f)
        torch.testing.assert_close(again(x), 3.0 * x + 1)
    [traced] = backend.kernels()
    assert [{k: traced.configs[0].all_kwargs()[k] for k in winner.config}] == [winner.config]
    assert dict(STATS) == {"compiled_stored": 1}


def test_a_key_symbolic_at_trace_time_is_left_to_the_compiler(tmp_db):
    kernel = autotuned()
    stored_winner(tmp_db, kernel)
    with tunesvc.capture(db=tmp_db):
        f, backend = compiled(program(kernel), dynamic=True)
        for n in (N, 77):
            x = torch.randn(n)
            torch.testing.assert_close(f(x), 3.0 * x + 1)
    assert {id(k) for k in backend.kernels()} == {id(kernel)}  # one graph, for every n: torch's own
    assert STATS["compiled_dynamic"] == 1 and "compiled_stored" not in STATS
    store = Store(tmp_db, readonly=True)
    try:
        assert store.misses() == []  # no one config could be served to it: nothing to tune for it
    finally:
        store.close()
    assert "1 tuned by Inductor (a key argument symbolic at trace time)" in summary_line([summary_record()])


def _boom(*args, **kwargs):
    raise RuntimeError("injected fault")


def test_a_fault_inside_the_hook_leaves_torchs_own_behaviour_with_one_warning(tmp_db, monkeypatch):
    kernel = autotuned()
    stored_winner(tmp_db, kernel)
    monkeypatch.setattr(capture_compiled, "_traced", _boom)
    x = torch.randn(N)
    expected = program(kernel)(x)
    with tunesvc.capture(db=tmp_db), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f, backend = compiled(program(kernel))
        torch.testing.assert_close(f(x), expected)
        torch_dynamo.reset()
        g, again = compiled(program(kernel))  # traced anew: left to the compiler, silently
        torch.testing.assert_close(g(x), expected)
    said = [str(w.message) for w in caught if str(w.message).startswith("tunesvc:")]
    assert len(said) == 1, said
    assert ":_scale: " in said[0] and "injected fault" in said[0] and "tuned by Inductor" in said[0], said[0]
    assert "\n" not in said[0]
    assert backend.kernels() == [kernel] and again.kernels() == [kernel]
    assert STATS["compiled_failed_open"] == 1 and "compiled_stored" not in STATS


def _keep_large(configs, named_args, **kwargs):
    """A pruner that keeps the configs with a block of 32 or more."""
    return [c for c in configs if c.kwargs["BLOCK"] >= 32]


def test_a_pruned_kernel_is_chosen_among_the_configs_its_pruner_keeps(tmp_db):
    """Mode heuristic: the first config the pruning keeps, not the first listed; a pruner that
    keeps one config leaves it to the compiler, which compiles it alone."""
    kernel = autotuned(prune_configs_by={"early_config_prune": _keep_large})
    x = torch.randn(N)
    with tunesvc.capture(db=tmp_db, mode="heuristic"):
        f, backend = compiled(program(kernel))
        torch.testing.assert_close(f(x), 3.0 * x + 1)
    [traced] = backend.kernels()
    assert configs_of(traced) == [CONFIGS[1].all_kwargs()]
    assert dict(STATS) == {"compiled_fallback": 1}

    STATS.clear()
    torch_dynamo.reset()
    alone = autotuned(prune_configs_by={"early_config_prune": lambda configs, named_args, **kw: configs[-1:]})
    with tunesvc.capture(db=tmp_db):
        f, backend = compiled(program(alone))
        torch.testing.assert_close(f(x), 3.0 * x + 1)
    [traced] = backend.kernels()
    assert configs_of(traced) == [CONFIGS[-1].all_kwargs()]
    assert dict(STATS) == {"compiled_untuned": 1}


def test_a_pruned_kernels_listed_winner_is_served_without_its_pruner(tmp_db):
    kernel = autotuned(prune_configs_by={"early_config_prune": _keep_large})
    winner = stored_winner(tmp_db, kernel)
    x = torch.randn(N)
    with tunesvc.capture(db=tmp_db):
        f, backend = compiled(program(kernel))
        torch.testing.assert_close(f(x), 3.0 * x + 1)
    [traced] = backend.kernels()
    assert configs_of(traced) == [winner.all_kwargs()]
    assert dict(STATS) == {"compiled_stored": 1}


def test_heuristics_beneath_the_autotuner_are_applied_to_the_served_config(tmp_db):
    kernel = triton.autotune(configs=CONFIGS, key=["n"], do_bench=cpu_bench)(
        triton.heuristics({"alpha": lambda args: 2.0})(_scale_heuristic)
    )
    x = torch.randn(N)
    with tunesvc.capture(db=tmp_db):
        program_h = _program_heuristic(kernel)
        program_h(x)  # eager: tuned and stored
        winner = kernel.best_config
        STATS.clear()
        f, backend = compiled(program_h)
        torch.testing.assert_close(f(x), 2.0 * x)
    [traced] = backend.kernels()
    assert [c.kwargs["BLOCK"] for c in traced.configs] == [winner.kwargs["BLOCK"]]
    assert dict(STATS) == {"compiled_stored": 1}


@triton.jit
def _scale_heuristic(x_ptr, out_ptr, n, alpha: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask), mask=mask)


def _program_heuristic(kernel):
    def f(x):
        out = torch.empty_like(x)
        n = x.numel()
        kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
        return out

    return f


def test_without_capture_compiled_regions_are_torchs_own(tmp_db):
    kernel = autotuned()
    stored_winner(tmp_db, kernel)
    from torch._higher_order_ops.triton_kernel_wrap import TritonHOPifier

    assert not getattr(TritonHOPifier.call_triton_kernel, "__tunesvc_compiled__", False)
    with tunesvc.capture(db=tmp_db):
        assert TritonHOPifier.call_triton_kernel.__tunesvc_compiled__
    assert not getattr(TritonHOPifier.call_triton_kernel, "__tunesvc_compiled__", False)
    f, backend = compiled(program(kernel))
    x = torch.randn(N)
    torch.testing.assert_close(f(x), 3.0 * x + 1)
    assert backend.kernels() == [kernel] and not STATS


#: a program whose one autotuned kernel runs only inside torch.compile (with the seam of
#: ``traceable`` above); it prints whether torch's module was imported when capture started
COMPILED_PROGRAM = """
import json, sys
import torch, triton
import torch.utils._triton
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction
torch.utils._triton.has_triton = lambda: True
triton.JITFunction = (JITFunction, InterpretedFunction)
InterpretedFunction.params = property(lambda self: JITFunction(self.fn).params)
import compkernels

if sys.argv[1] == "eager":
    x = torch.randn(1000)
    out = torch.empty_like(x)
    compkernels.scale[lambda m: (triton.cdiv(1000, m["BLOCK"]),)](x, out, 1000, 3.0)
    raise SystemExit(0)

def f(x):
    out = torch.empty_like(x)
    n = x.numel()
    compkernels.scale[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n, 3.0)
    return out

x = torch.randn(1000)
torch.testing.assert_close(torch.compile(f, backend="aot_eager", fullgraph=True)(x), 3.0 * x)
print(json.dumps({"stats": sys.modules["tunesvc._capture"].stats()}))
"""


def test_environment_capture_starts_where_a_compiled_region_first_traces_a_kernel(tmp_db, tmp_path):
    """Under TUNESVC_CAPTURE=1 a program whose autotuned kernels all run inside torch.compile
    never calls Autotuner.run: capture starts at Dynamo's first trace of a kernel, serves the
    stored winner there, and its summary line says so."""
    (tmp_path / "compkernels.py").write_text(textwrap.dedent(KERNELS))
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(COMPILED_PROGRAM))
    env = interpreter_env(TUNESVC_CAPTURE="1", TUNESVC_DB=tmp_db, TUNESVC_SUMMARY="1")

    def run(*args):
        done = subprocess.run(
            [sys.executable, str(script), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    run("eager")  # tunes the key and stores its winner
    served = run("compiled")
    assert json.loads(served.stdout.strip().splitlines()[-1])["stats"] == {"compiled_stored": 1}
    assert served.stderr.strip().splitlines()[-1] == (
        "tunesvc: 1 kernel captured; keys: 0 served from the store, 0 tuned in 0.0 s, 0 with one config, "
        "0 served untuned; keys inside torch.compile: 1 served from the store."
    )


HOOK_PROGRAM = """
import sys
import tunesvc
tunesvc.capture()
target = "torch._higher_order_ops.triton_kernel_wrap"
before = [name for name in ("torch._dynamo", target) if name in sys.modules]
from torch._higher_order_ops.triton_kernel_wrap import TritonHOPifier
hooked = getattr(TritonHOPifier.call_triton_kernel, "__tunesvc_compiled__", False)
tunesvc.uncapture()
after = getattr(TritonHOPifier.call_triton_kernel, "__tunesvc_compiled__", False)
print(before, hooked, after)
"""


def test_capture_hooks_torch_compile_once_torch_imports_it_and_never_imports_it_itself(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", HOOK_PROGRAM],
        cwd=tmp_path,
        env=interpreter_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["[]", "True", "False"]


def test_the_summary_says_what_happened_inside_torch_compile_over_processes():
    line = summary_line(
        [
            {"kernels": 1, "stored": 0, "tuned": 0, "compiled": {"stored": 2, "missed": 1}},
            {"kernels": 1, "stored": 1, "tuned": 0, "compiled": {"dynamic": 1}},
        ]
    )
    assert line == (
        "tunesvc: 2 kernels captured; keys: 1 served from the store, 0 tuned in 0.0 s, 0 with one config, "
        "0 served untuned; keys inside torch.compile: 2 served from the store, 1 tuned by Inductor (no stored "
        "winner; recorded for `tune misses --tune`), 1 tuned by Inductor (a key argument symbolic at trace time)."
    )
    unhooked = summary_line(
        [{"kernels": 0, "compiled_unhooked": ["torch 9.0 has no TritonHOPifier.call_triton_kernel"]}]
    )
    assert unhooked.endswith(
        "; compiled regions (torch.compile) are tuned by Inductor: torch 9.0 has no TritonHOPifier.call_triton_kernel."
    )
