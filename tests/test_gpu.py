"""GPU-only checks: the real compiler, real timings (skipped without a CUDA GPU)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import tunesvc
from tunesvc.bench import GRAPH_BELOW_MS
from tunesvc.bench import MAX_INPUT_SETS
from tunesvc.bench import Bench
from tunesvc.bench import Status
from tunesvc.bench import relative_error
from tunesvc.device import current_device
from tunesvc.kernels.matmul import TEMPLATE
from tunesvc.kernels.matmul import launch_matmul
from tunesvc.space import Space
from tunesvc.store import Store
from tunesvc.template import ShapeKey
from tunesvc.template import Template
from tunesvc.tuning.sweep import run_sweep

pytestmark = pytest.mark.gpu


def test_device_fingerprint_is_a_gpu():
    device = current_device()
    assert device.is_gpu
    assert device.sm_count > 0 and device.max_shared_memory > 48 * 1024
    assert device.capability.count(".") == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1000, 3000, 777), (1, 4097, 129), (333, 65, 4100)])
def test_matmul_matches_reference(dtype, shape):
    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    ref = a.double() @ b.double()
    for config in TEMPLATE.warm_start(TEMPLATE.problem(M=m, N=n, K=k, dtype=str(dtype)), current_device())[:4]:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
        launch_matmul(a, b, config, out=out)
        err = relative_error(out, ref)
        assert err < (2e-2 if dtype == torch.bfloat16 else 5e-3), (config, err)


@pytest.mark.parametrize("split", [2, 3, 8])
def test_split_k_reduces_once_per_tile_and_deterministically(split):
    """The last of a tile's programs to arrive adds the slices: many tiles and slices racing on
    the SMs, every run bitwise the same and right (a missing release or acquire shows here)."""
    m, n, k = 61, 4099, 8191
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    ref = a.double() @ b.double()
    config = {
        "VARIANT": "splitk",
        "BLOCK_M": 64,
        "BLOCK_N": 32,
        "BLOCK_K": 64,
        "GROUP_M": 1,
        "SPLIT_K": split,
        "num_warps": 4,
        "num_stages": 3,
    }
    first = launch_matmul(a, b, config)
    assert relative_error(first, ref) < 2e-2
    for _ in range(20):
        assert torch.equal(launch_matmul(a, b, config), first)


def test_split_k_counters_across_graphs_streams_and_growth():
    """Split-K's counters are zeroed once per stream and reset by the kernel: a CUDA graph
    replayed with eager calls between its replays, a problem that outgrows the counters after
    the graph was captured, and another stream all give the same, right result."""
    config = {
        "VARIANT": "splitk",
        "BLOCK_M": 64,
        "BLOCK_N": 32,
        "BLOCK_K": 64,
        "GROUP_M": 1,
        "SPLIT_K": 4,
        "num_warps": 4,
        "num_stages": 3,
    }
    a = torch.randn(61, 2049, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2049, 999, device="cuda", dtype=torch.bfloat16)
    expected = launch_matmul(a, b, config)
    assert relative_error(expected, a.double() @ b.double()) < 2e-2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = launch_matmul(a, b, config)
    big_a = torch.randn(300, 1000, device="cuda", dtype=torch.bfloat16)
    big_b = torch.randn(1000, 8191, device="cuda", dtype=torch.bfloat16)  # 5 x 256 tiles: past 1024 counters
    big = launch_matmul(big_a, big_b, config)
    assert relative_error(big, big_a.double() @ big_b.double()) < 2e-2
    other = torch.cuda.Stream()
    for _ in range(5):
        captured.zero_()
        graph.replay()
        assert torch.equal(captured, expected)
        assert torch.equal(launch_matmul(a, b, config), expected)
        with torch.cuda.stream(other):
            on_other = launch_matmul(a, b, config)
        torch.cuda.current_stream().wait_stream(other)
        assert torch.equal(on_other, expected)


def test_bench_times_with_events_and_flags_wrong_configs():
    problem = TEMPLATE.problem(M=512, N=512, K=512, dtype="bfloat16")
    bench = Bench(TEMPLATE, problem, current_device())
    m = bench.measure(TEMPLATE.heuristic(problem, current_device()))
    assert m.status is Status.OK and 0 < m.time_ms < 10 and m.reps > 1
    too_big = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 5}
    assert bench.measure(too_big).status is Status.INVALID


def test_sweep_then_lookup_on_gpu(tmp_path):
    db = str(tmp_path / "gpu.db")
    problem = TEMPLATE.problem(M=1000, N=3000, K=777, dtype="bfloat16")
    [result] = run_sweep(TEMPLATE, [problem], Store(db), strategy="optuna", budget=8)
    assert result.winner is not None and result.trials_stored == 8
    found = tunesvc.Runtime(db=db).lookup("matmul", M=1000, N=3000, K=777, dtype="bfloat16")
    assert found.source == "exact" and found.config == result.winner


FORKED_SWEEP = """
import json, sys, torch
from tunesvc._processes import worker_context
from tunesvc.device import fork_safe_current_device
from tunesvc.kernels.matmul import TEMPLATE
from tunesvc.store import Store
from tunesvc.tuning.sweep import run_sweep
device = fork_safe_current_device()
start_method = worker_context().get_start_method()
[r] = run_sweep(TEMPLATE, [TEMPLATE.problem(M=300, N=260, K=200, dtype="float16")], Store(sys.argv[1]), budget=6, workers=3)
print(json.dumps({"gpu": device.is_gpu, "start": start_method, "trials": r.trials_stored, "failures": r.failures,
                  "winner": r.winner is not None, "cuda_here": torch.cuda.is_initialized()}))
"""


def test_a_sweep_forks_its_workers_from_a_process_that_never_initialises_cuda(tmp_path):
    """In a fresh process (this one has used CUDA): the device is read in a child, the compile and
    measuring workers are forked from the sweep's process, and they use the GPU."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", FORKED_SWEEP, str(tmp_path / "fork.db")], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {
        "gpu": True,
        "start": "fork",
        "trials": 6,
        "failures": 0,
        "winner": True,
        "cuda_here": False,
    }


def test_tuned_matmul_is_captured_in_a_cuda_graph(tmp_path):
    """A lookup hit does no host sync: the tuned launch records into a CUDA graph and replays right."""
    from tunesvc.kernels import matmul

    a = torch.randn(333, 129, device="cuda", dtype=torch.float16)
    b = torch.randn(129, 65, device="cuda", dtype=torch.float16)
    tunesvc.configure(mode="heuristic")
    matmul(a, b)  # first call: resolve the config and compile the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = matmul(a, b)
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    assert relative_error(out, ref) < 5e-3


def test_autotune_decorator_tunes_on_miss_on_gpu(tmp_path):
    """tunesvc.autotune in mode tune: measured with CUDA events, stored, then a plain hit."""
    import triton
    import triton.language as tl

    @triton.jit
    def scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3.0, mask=mask)

    configs = [{"BLOCK": b, "num_warps": w} for b in (256, 1024) for w in (4, 8)]
    kernel = tunesvc.autotune(
        configs, key=["n"], name="scale_gpu", output="y_ptr", db=str(tmp_path / "gpu.db"), mode="tune"
    )(scale)
    n = 1_000_003
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
    kernel[grid](x, y, n)
    assert kernel.last.source == "tuned" and kernel.last.config in configs
    torch.cuda.synchronize()
    assert relative_error(y, 3 * x.double()) < 1e-6


@triton.jit
def _double_kernel(x_ptr, y_ptr, n, offset, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offset + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


FAULT = {"BLOCK": 256, "num_warps": 4}


class Faults(Template):
    """y = 2x, except that FAULT stores 2^40 elements past y: an illegal memory access on purpose."""

    name = "faults"
    dims = ("N",)
    dtypes = ("float32",)
    space = Space.from_dict({"params": {"BLOCK": [128, 256, 512]}, "launch": {"num_warps": [4]}})

    def key(self, problem):
        return ShapeKey.make({"N": problem["N"]}, {"dtype": problem["dtype"]})

    def make_inputs(self, problem, device):
        return torch.randn(problem["N"], device="cuda")

    def launch(self, inputs, config):
        y = torch.empty_like(inputs)
        offset = 1 << 40 if config == FAULT else 0
        _double_kernel[(triton.cdiv(inputs.numel(), config["BLOCK"]),)](
            inputs, y, inputs.numel(), offset, BLOCK=config["BLOCK"], num_warps=config["num_warps"]
        )
        return y

    def reference(self, inputs):
        return inputs.double() * 2

    def heuristic(self, problem, device):
        return {"BLOCK": 128, "num_warps": 4}


@pytest.mark.parametrize("workers", [0, 2])  # 2: the fault kills a compile worker first, then the measuring one
def test_a_faulting_kernel_is_a_crash_and_the_sweep_goes_on(tmp_path, workers):
    template = Faults()
    problem = template.problem(N=100_003, dtype="float32")
    configs = [{"BLOCK": 128, "num_warps": 4}, FAULT, {"BLOCK": 512, "num_warps": 4}]
    store = Store(str(tmp_path / "faults.db"))
    try:
        [result] = run_sweep(
            template, [problem], store, strategy="grid", candidates=configs, workers=workers, isolate=True, finalists=0
        )
        rows = store.trials(store.kernel_version_id(template), store.device_id(current_device()), result.shape_key)
    finally:
        store.close()
    assert [r.status for r in rows] == ["ok", "crash", "ok"]
    assert rows[2].rel_error < 1e-6  # measured by a fresh worker, on a healthy context
    assert result.winner in (configs[0], configs[2])


def test_small_kernels_are_timed_from_a_cuda_graph_and_finalists_side_by_side():
    problem = TEMPLATE.problem(M=64, N=64, K=64, dtype="bfloat16")
    bench = Bench(TEMPLATE, problem, current_device())
    heuristic = TEMPLATE.heuristic(problem, current_device())
    m = bench.measure(heuristic)
    assert m.status is Status.OK and 0 < m.time_ms < 0.02
    # a 64^3 GEMM takes a few us, under the launch overhead: timed from a graph. Its 64 input
    # copies hold under 2 MB, less than the L2: the timing says its inputs were found there
    assert m.message is not None and m.message.startswith("timed: graph, L2 warm"), m.message
    # the replay cycles through copies of the inputs that together exceed L2 twice
    sets = bench.input_sets()
    assert len(sets) == MAX_INPUT_SETS and sets[0] is bench.inputs
    assert len({a.data_ptr() for a, _ in sets}) == len(sets)
    other = {**heuristic, "BLOCK_K": 32 if heuristic["BLOCK_K"] != 32 else 64}
    assert bench.measure(other).ok
    together = bench.time_together([heuristic, other])
    assert [t.status for t in together] == [Status.OK, Status.OK]
    assert all("timed together" in (t.message or "") and 0 < (t.time_ms or 0) < 0.02 for t in together)
    # the same config timed twice side by side reads the same time, within a few percent
    a, b = bench.time_together([heuristic, heuristic])
    assert a.time_ms is not None and b.time_ms is not None and abs(a.time_ms / b.time_ms - 1) < 0.05
    big = TEMPLATE.problem(M=8192, N=8192, K=8192, dtype="bfloat16")
    slow = Bench(TEMPLATE, big, current_device()).measure(TEMPLATE.heuristic(big, current_device()))
    assert slow.ok and slow.time_ms > GRAPH_BELOW_MS
    assert (slow.message or "").startswith("timed: events")  # over GRAPH_BELOW_MS: event timing is exact enough


def test_tuned_matmul_under_torch_compile_with_cuda_graphs():
    """mode="reduce-overhead" records the compiled graph, custom op tunesvc::matmul included, as a CUDA graph."""
    from tunesvc.kernels import matmul

    tunesvc.configure(mode="heuristic")

    @torch.compile(fullgraph=True, mode="reduce-overhead")
    def f(a, b):
        return torch.relu(matmul(a, b)) + 1.0

    a = torch.randn(333, 129, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(129, 65, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):  # warm-up, record, replay
        out = f(a, b)
    ref = torch.relu(a.double() @ b.double()) + 1.0
    assert relative_error(out, ref) < 2e-2


def test_a_measuring_process_that_timed_a_backward_peer_makes_the_next_problems_inputs():
    """layernorm_bwd's torch peer (autograd's backward) once failed to capture in a CUDA graph,
    which left torch's CUDA generator capturing in that process: the next problem loaded into
    the same measuring process could not make its inputs. It must make them and measure."""
    from tunesvc.bench import Worker

    template = tunesvc.get_template("layernorm_bwd")
    device = current_device()
    first, second = template.problem(M=1000, N=1000, dtype="bfloat16"), template.problem(M=300, N=700, dtype="bfloat16")
    worker = Worker(template, first, device, timeout_s=60.0)
    try:
        worker.wait_ready()
        worker.time_peer()  # whatever it gives: a time, or a failure
        worker.load(template, second)
        worker.wait_ready()
        assert worker.measure(template.heuristic(second, device)).status is Status.OK
    finally:
        worker.close()


def test_a_capture_that_fails_at_its_end_leaves_torch_random_numbers_working():
    """torch skips its generator's capture epilogue where cudaStreamEndCapture fails; every later
    torch.randn on the GPU then raised "Offset increment outside graph capture" (GraphTimer mends it)."""
    from tunesvc.bench._inprocess import GraphTimer

    x = torch.ones(1000, device="cuda")

    def unsafe() -> None:
        (x * 2).sum().item()  # a wait for the GPU: not allowed while a stream captures

    with pytest.raises(RuntimeError):  # torch's CUDA errors are RuntimeErrors
        GraphTimer([unsafe], 0.01)
    assert torch.randn(10, device="cuda").isfinite().all()


@pytest.mark.parametrize("name", ["layernorm_bwd", "rmsnorm_bwd", "bias_act_residual_bwd", "attention_bwd"])
def test_a_backward_peer_is_timed_from_a_cuda_graph(name):
    """Its forward runs on the stream the graph captures on (tunesvc.template.backward_peer), so
    autograd's backward is captured, not timed by events for want of a graph."""
    template = tunesvc.get_template(name)
    problem = {
        "layernorm_bwd": {"M": 1000, "N": 1000, "dtype": "bfloat16"},
        "rmsnorm_bwd": {"M": 1000, "N": 1000, "dtype": "bfloat16"},
        "bias_act_residual_bwd": {"M": 1000, "N": 1000, "act": "gelu", "dtype": "bfloat16"},
        "attention_bwd": {"B": 1, "H": 4, "S": 300, "D": 64, "causal": True, "dtype": "bfloat16"},
    }[name]
    with Bench(template, template.problem(**problem), current_device()) as bench:
        m = bench.time_peer()
    assert m.status is Status.OK and "timed: graph" in (m.message or ""), m
