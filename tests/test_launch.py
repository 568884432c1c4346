"""Launch state: Triton's allocator in every thread, and the direct launcher's specialisation key."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

import tunesvc  # chooses the interpreter where there is no GPU
from tunesvc.serving.launch import DirectLaunch
from tunesvc.serving.launch import _key_function
from tunesvc.serving.launch import _no_key
from tunesvc.serving.launch import _NoKey
from tunesvc.serving.launch import use_torch_allocator


def _triton_allocator() -> Any:
    allocation = pytest.importorskip("triton.runtime._allocation")
    return allocation._allocator.get()


def _in_thread(fn: Any) -> Any:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    return result[0]


def test_every_thread_that_launches_gets_the_allocator():
    use_torch_allocator()
    here = _triton_allocator()
    assert callable(here) and type(here).__name__ != "NullAllocator"

    # a new thread (the autograd engine's, say) starts without Triton's allocator...
    assert type(_in_thread(_triton_allocator)).__name__ == "NullAllocator"

    # ...and has it once it launches through the shipped kernels' path
    def launch_then_read() -> Any:
        use_torch_allocator()
        return _triton_allocator()

    assert _in_thread(launch_then_read) is here


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr, SHIFT: tl.constexpr = 0.0):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * scale + SHIFT, mask=mask)


def test_direct_launch_gives_the_kernels_result_from_any_thread():
    launch = DirectLaunch(_scale_kernel)
    assert launch.fn is _scale_kernel.fn  # a template hashes the same source
    x = torch.randn(77)
    expected = x * 3.0 + 1.5

    def run() -> torch.Tensor:
        y = torch.empty_like(x)
        for _ in range(2):  # first launch, then a hit
            launch[(triton.cdiv(77, 32),)](x, y, 77, 3.0, BLOCK=32, SHIFT=1.5)
        return y

    torch.testing.assert_close(run(), expected)
    torch.testing.assert_close(_in_thread(run), expected)


def test_the_key_is_finer_than_tritons_specialisation():
    specialize = pytest.importorskip("triton._C.libtriton").native_specialize_impl
    base = pytest.importorskip("triton.backends.compiler").BaseBackend
    buffer = torch.empty(64)
    args = [
        *(0, 1, 2, 15, 16, 17, 32, 2**31 - 16, 2**31 - 1, 2**31, -(2**31), -(2**31) - 16, 2**63, 2**64 - 16),
        *(0.5, 3.0, True, False),
        buffer,
        buffer[1:],
        buffer[4:],
        buffer.half(),
        buffer.half()[8:],
    ]
    for a in args:
        key_of = _key_function((a,), {"BLOCK": 16})
        for b in args:
            try:
                same = key_of(0, a, {"BLOCK": 16}) == key_of(0, b, {"BLOCK": 16})
            except (_NoKey, AttributeError):  # another kind of argument: never a hit of a's key
                continue
            if same:
                assert specialize(base, a, False, True, True) == specialize(base, b, False, True, True), (a, b)


def test_a_call_of_another_shape_is_not_keyed():
    x = torch.empty(8)
    key_of = _key_function((x, 8, 0.5, None), {"BLOCK": 16, "num_warps": 4})
    assert key_of(0, x, 8, 0.5, None, {"BLOCK": 16, "num_warps": 4}) != key_of(
        0, x, 9, 0.5, None, {"BLOCK": 16, "num_warps": 4}
    )
    assert key_of(1, x, 8, 0.5, None, {"BLOCK": 16, "num_warps": 4})[0] == 1  # the device
    for args, kwargs in [
        ((x, x, 0.5, None), {"BLOCK": 16, "num_warps": 4}),  # a tensor where an integer was
        ((x, 8, 1, None), {"BLOCK": 16, "num_warps": 4}),  # an integer where a float was
        ((x, 8, 0.5, x), {"BLOCK": 16, "num_warps": 4}),  # a tensor where None was
        ((x, 8, 0.5, None), {"BLOCK": 16, "num_stages": 4}),  # another keyword
    ]:
        with pytest.raises((_NoKey, KeyError, AttributeError)):
            key_of(0, *args, kwargs)
    with pytest.raises(TypeError):
        key_of(0, x, 8, 0.5, {"BLOCK": 16, "num_warps": 4})  # fewer arguments
    assert _key_function((x, object()), {}) is _no_key  # a kind it does not key: Triton's path


def test_a_static_launch_passes_every_runtime_parameter_in_order(monkeypatch):
    """The generated static launch: tensors as addresses, constexprs left out, the later
    parameters bound from the first launch, then the scratch pointers (the launcher itself needs
    CUDA; here it records what it is given)."""
    import tunesvc.serving.launch as launch

    calls: list[tuple] = []
    static = launch._Static((lambda *a: calls.append(a), "function", 4, 128, "OiiO"), frozenset({2}), scratch=1)
    monkeypatch.setattr(launch, "_static_launcher", lambda compiled: static)
    fn = launch._static_call(object(), (torch.empty(3), 5, 7), (11,))
    assert fn is not None
    x = torch.empty(8)
    fn(2, 1, 1, 99, x, 6, 7)
    assert calls == [("function", 2, 1, 1, 4, 128, "OiiO", (x.data_ptr(), 6, 11, None), 99)]


@pytest.mark.parametrize("timing", ["graph", "eager"])
def test_a_measurer_times_graphs_without_the_static_launcher(timing, monkeypatch):
    """The measuring process's bench (tunesvc.bench._worker) turns torch's static launcher off
    where it times in CUDA graphs (no host time measured: its import costs the first trial
    seconds) and on where it times eager launches, whose host time is the runtime's."""
    from multiprocessing import Pipe

    from tunesvc.bench import _worker
    from tunesvc.serving import launch

    monkeypatch.setattr(launch, "_static_wanted", timing == "graph")  # the other way round first
    template = tunesvc.get_template("matmul")
    problem = template.problem(M=33, N=17, K=9, dtype=torch.float32)
    parent, child = Pipe()
    try:
        assert _worker._made(child, template, problem, 1.0, timing) is not None
    finally:
        parent.close()
        child.close()
    assert launch._static_wanted is (timing == "eager")
    if timing == "graph":
        assert launch._static_launcher(object()) is None and not launch._STATIC


def test_a_first_shipped_kernel_call_imports_no_dynamo(tmp_path):
    """A process's first call of a shipped kernel (recorded for its launch plan) imports neither
    torch._dynamo nor Inductor: torch wraps a dispatch mode's handler in ``torch._disable_dynamo``
    unless the mode opts out, and that import costs a serving process seconds at its first call."""
    import os
    import subprocess
    import sys

    probe = (
        "import sys, torch\n"
        "from tunesvc.kernels import matmul, rms_norm\n"
        "a, b = torch.randn(33, 29), torch.randn(29, 65)\n"
        "for _ in range(2):\n"
        "    c = matmul(a, b)\n"
        "    rms_norm(a, torch.ones(29))\n"
        "assert torch.allclose(c, a @ b, rtol=1e-3, atol=1e-3)\n"
        "print('torch._dynamo' in sys.modules, 'torch._inductor' in sys.modules)\n"
    )
    env = {**os.environ, "TUNESVC_DB": str(tmp_path / "t.db")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False"], out.stdout
