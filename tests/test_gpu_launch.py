"""Launch state on the GPU: every family forward and backward through autograd, with each variant
its space offers, after other kernels ran in this process, from a second Python thread and on a
second CUDA stream; and the direct launcher picks the compiled kernel Triton would pick."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

import tunesvc
from tunesvc.bench import relative_error
from tunesvc.device import current_device
from tunesvc.serving.launch import DirectLaunch

pytestmark = pytest.mark.gpu

CONTEXTS = ("main", "thread", "stream")


def _module(name: str) -> Any:
    return importlib.import_module(f"tunesvc.kernels.{name}")


def _in_context(context: str, fn: Callable[[], Any]) -> Any:
    """fn() here, on a new Python thread, or on a side stream ordered after the current one."""
    if context == "thread":
        result: list[Any] = []
        errors: list[BaseException] = []

        def run() -> None:
            try:
                result.append(fn())
            except BaseException as exc:  # re-raised on the test's thread
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        if errors:
            raise errors[0]
        return result[0]
    if context == "stream":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = fn()
        torch.cuda.current_stream().wait_stream(side)
        return out
    return fn()


def _pick(template: Any, problem: dict[str, Any], **want: Any) -> dict[str, Any]:
    """The first feasible config of the template's space with these parameter values."""
    for config in template.feasible(template.problem(**problem), current_device()):
        if all(config.get(k) == v for k, v in want.items()):
            return dict(config)
    pytest.skip(f"{template.name} has no feasible config with {want} for {problem} on {current_device().name}")


@pytest.fixture
def configs(monkeypatch):
    """use(template, config): the runtime launches ``template`` with ``config`` (mode heuristic,
    the template's heuristic answering it), for every shape, in any thread."""
    tunesvc.configure(mode="heuristic")

    def use(template: Any, config: dict[str, Any]) -> None:
        monkeypatch.setattr(template, "heuristic", lambda problem, device: dict(config))

    yield use
    tunesvc.configure(mode="heuristic")


@pytest.fixture(scope="module", autouse=True)
def other_kernels_first():
    """Every family launched once before these tests: the process is not a fresh one."""
    tunesvc.configure(mode="heuristic")
    x = torch.randn(33, 257, device="cuda", dtype=torch.float16)
    w = torch.randn(257, device="cuda", dtype=torch.float16)
    tunesvc.kernels.layer_norm(x, w, w)
    tunesvc.kernels.rms_norm(x, w)
    tunesvc.kernels.softmax(x)
    tunesvc.kernels.bias_act_residual(x, w, x)
    tunesvc.kernels.dropout(x, 0.1, 3)
    tunesvc.kernels.matmul(x, x.T.contiguous())
    q = torch.randn(1, 2, 130, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    tunesvc.kernels.attention(q, q, q).sum().backward()
    torch.cuda.synchronize()


def _close(out: torch.Tensor, ref: torch.Tensor, tol: float = 1e-2) -> None:
    error = relative_error(out, ref)
    assert error < tol, f"relative error {error:.3g}"


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize(
    ("variant", "split"), [("grouped", 1), ("persistent", 1), ("tma", 1), ("splitk", 4), ("splittail", 1)]
)
def test_matmul_each_variant(configs, context, variant, split):
    mm = _module("matmul")
    # the space keeps the persistent grid for more tiles than SMs
    m, n, k = (1000, 3001, 515) if variant == "persistent" else (37, 301, 515)
    problem = {"M": m, "N": n, "K": k, "dtype": "bfloat16"}
    configs(mm.TEMPLATE, _pick(mm.TEMPLATE, problem, VARIANT=variant, SPLIT_K=split))
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = _in_context(context, lambda: tunesvc.kernels.matmul(a, b))
    torch.cuda.synchronize()
    _close(out, a.float() @ b.float())


@pytest.mark.parametrize("context", CONTEXTS)
def test_matmul_split_tail_slices_the_last_wave(configs, context):
    # 8 x 24 tiles of 128 x 256: the 60 past the first wave run as two slices of K each
    mm = _module("matmul")
    M, N, K = 1000, 6144, 4096
    config = {"VARIANT": "splittail", "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1}
    config.update(num_warps=8, num_stages=3)
    sms = current_device().sm_count
    _, slices = mm.tail_split(8 * 24, K // 64, 64, sms)
    if slices == 1:
        pytest.skip(f"{current_device().name}'s {sms} SMs leave no partial wave worth slicing at this shape")
    configs(mm.TEMPLATE, config)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    out = _in_context(context, lambda: tunesvc.kernels.matmul(a, b))
    torch.cuda.synchronize()
    _close(out, a.float() @ b.float())
    assert torch.equal(mm.launch_matmul(a, b, config), out)  # the slices add up in one order


def test_matmul_tma_tiles_nearest_the_shared_memory_limit_compile():
    # the space's tma_shared_memory constraint is the only check before a trial compiles: every
    # TMA tile it admits within 15% of the device's limit must fit (Triton raises OutOfResources)
    mm = _module("matmul")
    device = current_device()
    if not device.limits()["has_tma"]:
        pytest.skip(f"{device.name} has no tensor descriptors: the space holds no TMA kernel there")
    problem = mm.TEMPLATE.problem(M=4096, N=4096, K=4096, dtype="bfloat16")
    a = torch.randn(300, 520, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(520, 700, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    tried = set()
    for config in mm.TEMPLATE.feasible(problem, device):
        if config["VARIANT"] not in ("tma", "splittail"):
            continue
        bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
        staged = ((bm + bn) * bk * config["num_stages"] + bm * bn) * 2
        key = (config["VARIANT"], bm, bn, bk, config["num_warps"], config["num_stages"])
        if staged < 0.85 * device.max_shared_memory or key in tried:
            continue
        tried.add(key)
        _close(mm.launch_matmul(a, b, config), ref)
    assert tried, f"no TMA tile of the space comes within 15% of {device.name}'s shared memory"


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize(("tma", "ws", "bwd_tma"), [(0, 0, 0), (1, 0, 1), (1, 1, 1), (0, 0, 1), (1, 0, 0)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_forward_and_backward_each_variant(configs, context, tma, ws, bwd_tma, causal):
    at = _module("attention")
    B, H, S, D = 2, 3, 333, 64
    problem = {"B": B, "H": H, "S": S, "D": D, "causal": causal, "dtype": "float16"}
    # Triton 3.6's warp-specialisation pass fails to compile (or computes inf with) the space's
    # 4-warp WS configs, which a sweep stores as compile_error or wrong_result: the WS case takes
    # an 8-warp one, which H100 sweeps measured correct
    shape = {"num_warps": 8, "BLOCK_M": 128, "BLOCK_N": 64} if ws else {}
    configs(at.TEMPLATE, _pick(at.TEMPLATE, problem, TMA=tma, WS=ws, **shape))
    configs(at.BWD_TEMPLATE, _pick(at.BWD_TEMPLATE, problem, TMA=bwd_tma))
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    do = torch.randn(B, H, S, D, device="cuda", dtype=torch.float16)

    def run() -> tuple[torch.Tensor, ...]:
        out = tunesvc.kernels.attention(q, k, v, causal=causal)
        # the backward runs on the autograd engine's own thread: it must find Triton's allocator
        return (out, *torch.autograd.grad(out, (q, k, v), do))

    got = _in_context(context, run)
    torch.cuda.synchronize()
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(leaves[0], leaves[1], leaves[2], is_causal=causal)
    refs = (ref, *torch.autograd.grad(ref, leaves, do.float()))
    for out, expected in zip(got, refs):
        _close(out, expected)


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("family", ["layernorm", "rmsnorm", "softmax", "pointwise", "dropout"])
def test_row_families_forward_and_backward(configs, context, family):
    M, N = 77, 1031
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(N, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    F = torch.nn.functional
    ours: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ref: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    if family == "layernorm":
        ours, ref = (lambda x, w: tunesvc.kernels.layer_norm(x, w, w)), (lambda x, w: F.layer_norm(x, (N,), w, w))
    elif family == "rmsnorm":
        ours, ref = (lambda x, w: tunesvc.kernels.rms_norm(x, w)), (lambda x, w: F.rms_norm(x, (N,), w, 1e-6))
    elif family == "softmax":
        ours, ref = (lambda x, w: tunesvc.kernels.softmax(x * w)), (lambda x, w: torch.softmax(x * w, -1))
    elif family == "pointwise":
        ours = lambda x, w: tunesvc.kernels.bias_act_residual(x, w, r, "gelu")
        ref = lambda x, w: _module("pointwise").bias_act_residual_reference(x, w, r.float(), "gelu")
    else:
        ours = lambda x, w: tunesvc.kernels.dropout(x * w, 0.25, 7)
        # the same mask: where ours kept an element it is scaled by 1 / (1 - p), else zero
        ref = lambda x, w: (x * w) * (tunesvc.kernels.dropout(torch.ones_like(x), 0.25, 7).float())

    def run() -> tuple[torch.Tensor, ...]:
        out = ours(x, w)
        return (out, *torch.autograd.grad(out, (x, w), dy))

    got = _in_context(context, run)
    torch.cuda.synchronize()
    leaves = [t.detach().float().requires_grad_() for t in (x, w)]
    expected = ref(*leaves)
    refs = (expected, *torch.autograd.grad(expected, leaves, dy.float()))
    for out, want in zip(got, refs):
        _close(out, want, 2e-2)


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("splits", [1, 4])
def test_decode_each_split_count(configs, context, splits):
    dec = _module("decode")
    B, HQ, HKV, S, D = 3, 8, 2, 300, 128
    problem = {"B": B, "HQ": HQ, "HKV": HKV, "S": S, "D": D, "paged": False, "dtype": "float16"}
    configs(dec.TEMPLATE, _pick(dec.TEMPLATE, problem, NUM_SPLITS=splits))
    q = torch.randn(B, HQ, D, device="cuda", dtype=torch.float16)
    kc, vc = (torch.randn(B, S, HKV, D, device="cuda", dtype=torch.float16) for _ in range(2))
    seq_lens = torch.tensor([S, 17, 200], device="cuda", dtype=torch.int32)
    out = _in_context(context, lambda: tunesvc.kernels.decode_attention(q, kc, vc, seq_lens))
    torch.cuda.synchronize()
    _close(out, dec.decode_reference(q, kc, vc, seq_lens))


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, out_ptr, n, stride, a, BLOCK: tl.constexpr, SHIFT: tl.constexpr = 0):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs * stride, mask=mask)
    tl.store(out_ptr + offs, a * x + tl.load(y_ptr + offs, mask=mask) + SHIFT, mask=mask)


def test_direct_launch_picks_the_compiled_kernel_triton_picks():
    """Across alignments, integer classes and constexprs, a hit of the direct launcher launches
    the CompiledKernel that Triton's own dispatch returns for the same arguments."""
    direct = DirectLaunch(_axpy_kernel)
    buffer = torch.randn(4096 + 64, device="cuda")
    for offset in (0, 1, 4):
        for n, stride in ((1000, 1), (1024, 1), (1, 2), (17, 16)):
            for shift in (0, 3):
                x = buffer[offset:]
                y = torch.randn(n, device="cuda")
                out = torch.empty(n, device="cuda")
                grid = (triton.cdiv(n, 128),)
                kwargs = {"BLOCK": 128, "SHIFT": shift, "num_warps": 4}
                direct[grid](x, y, out, n, stride, 2.5, **kwargs)  # the first launch: Triton's path
                out.zero_()
                chosen = direct.launch(grid, (x, y, out, n, stride, 2.5), kwargs)  # a hit
                expected = _axpy_kernel.warmup(x, y, out, n, stride, 2.5, grid=grid, **kwargs)
                assert chosen is expected, (offset, n, stride, shift)
                torch.cuda.synchronize()
                # float32: a few roundings of terms as large as the shift (3) in a result near 0.2: 1e-5
                _close(out, 2.5 * x[: n * stride : stride] + y + shift, 1e-5)


@pytest.mark.parametrize("context", CONTEXTS)
def test_autotune_hits_launch_directly_with_a_grid_function(context, tmp_path):
    """@tunesvc.autotune over a declared space and over triton.Config lists: hits (direct
    launches) with a grid computed from the config, for two sizes, give the kernel's answer."""
    spaced = tunesvc.autotune(
        space=[{"BLOCK": 256, "num_warps": 4}, {"BLOCK": 1024, "num_warps": 8}],
        key=["n"],
        name="axpy_space_launch",
        mode="heuristic",
        dtype_arg="x_ptr",
    )(_axpy_kernel)
    listed = tunesvc.autotune(
        [triton.Config({"BLOCK": 256}, num_warps=4), triton.Config({"BLOCK": 1024}, num_warps=8)],
        key=["n"],
        name="axpy_listed_launch",
        mode="lookup",  # no stored winner: the first listed config, nothing benchmarked
        db=str(tmp_path / "none.db"),
    )(_axpy_kernel)
    for kernel in (spaced, listed):
        for n in (1000, 4099):
            x, y = (torch.randn(n, device="cuda") for _ in range(2))
            out = torch.empty(n, device="cuda")

            def run(kernel: Any = kernel, x: torch.Tensor = x, y: torch.Tensor = y, out: torch.Tensor = out) -> None:
                n = x.numel()
                for _ in range(3):  # a miss, then hits
                    out.zero_()
                    kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n, 1, 0.5)

            _in_context(context, run)
            torch.cuda.synchronize()
            _close(out, 0.5 * x + y, 1e-6)


@pytest.mark.parametrize("autograd", [True, False], ids=["autograd", "no_grad"])
@pytest.mark.parametrize("context", CONTEXTS)
def test_replayed_calls_compute_what_the_functions_compute(context, autograd, monkeypatch):
    """Every family three times on fresh inputs (the later calls replay the first call's
    launches, tunesvc.serving.launch.LaunchPlans: the op's inside autograd, the family function's
    without it): outputs and gradients equal the ops' own functions'."""
    from test_ops import FAMILIES
    from test_ops import _run

    from tunesvc.serving.launch import LaunchPlans

    def run(fn: Callable[..., Any], inputs: tuple, grad: tuple[int, ...]) -> Any:
        with torch.set_grad_enabled(autograd):  # grad mode is per thread: set where the call runs
            return _run(fn, inputs, grad if autograd else ())

    tunesvc.configure(mode="heuristic")
    for family, (fn, make_inputs, grad) in FAMILIES.items():
        for _ in range(3):
            inputs = make_inputs("cuda")
            got = _in_context(context, lambda: run(fn, inputs, grad))
            with monkeypatch.context() as m:
                m.setattr(LaunchPlans, "active", False)
                expected = run(fn, inputs, grad)
            torch.cuda.synchronize()
            for g, e in zip(got, expected, strict=True):
                torch.testing.assert_close(g, e, rtol=0, atol=0, msg=lambda m: f"{family}: {m}")


def test_a_replayed_call_is_captured_in_a_cuda_graph():
    """A key's plan under graph capture (the capture stream is its own key), replayed with new data."""
    tunesvc.configure(mode="heuristic")
    x = torch.randn(77, 1031, device="cuda", dtype=torch.bfloat16)
    a = torch.randn(37, 515, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(515, 301, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        tunesvc.kernels.softmax(x), tunesvc.kernels.matmul(a, b)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm the capture's key: record, then replay
        for _ in range(2):
            tunesvc.kernels.softmax(x), tunesvc.kernels.matmul(a, b)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, c = tunesvc.kernels.softmax(x), tunesvc.kernels.matmul(a, b)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        a.copy_(torch.randn_like(a))
        graph.replay()
        torch.cuda.synchronize()
        _close(y, torch.softmax(x.float(), -1))
        _close(c, a.float() @ b.float())


_STATIC_PROBE = """
import sys
import torch
from tunesvc.serving.launch import use_static_launcher
use_static_launcher(sys.argv[1] == "on")
from tunesvc.kernels import matmul
a = torch.randn(333, 129, device="cuda", dtype=torch.float16)
b = torch.randn(129, 65, device="cuda", dtype=torch.float16)
for _ in range(2):
    c = matmul(a, b)
err = ((c.double() - a.double() @ b.double()).norm() / (a.double() @ b.double()).norm()).item()
print(err, "torch._inductor" in sys.modules, "torch._dynamo" in sys.modules)
"""


@pytest.mark.parametrize("static", ["on", "off"])
def test_without_the_static_launcher_a_fresh_process_never_imports_inductor(static):
    """What a graph-timed measurer does (tunesvc.bench._worker): with the static launcher off, a
    shipped kernel's launches are right and torch._inductor (and with it torch._dynamo) is never
    imported; on, it is: the static launcher is what brings it."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _STATIC_PROBE, static], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    err, inductor, dynamo = out.stdout.split()
    assert float(err) < 1e-2
    assert (inductor, dynamo) == (("True", "True") if static == "on" else ("False", "False"))
