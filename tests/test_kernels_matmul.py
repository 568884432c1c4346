"""Correctness of the grouped GEMM kernel (kernels/matmul.py) in Triton's interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import tunesvc
import tunesvc.kernels
from tunesvc.kernels.matmul import launch_matmul

TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 1e-4}

# none of these is a multiple of any block size in CONFIGS
SHAPES = [(37, 45, 29), (1, 33, 17), (70, 19, 65)]

CONFIGS = [
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 8, "num_stages": 2},
]


def rel_error(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    ref = a.double() @ b.double()
    return ((out.double() - ref).norm() / ref.norm()).item()


def config_id(c: dict) -> str:
    return f"BM{c['BLOCK_M']}-BN{c['BLOCK_N']}-BK{c['BLOCK_K']}-G{c['GROUP_M']}"


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_launch_matmul_matches_float64_reference(shape, dtype, config):
    M, N, K = shape
    a = torch.randn(M, K, dtype=dtype)
    b = torch.randn(K, N, dtype=dtype)
    out = launch_matmul(a, b, config)
    assert out.shape == (M, N)
    assert out.dtype == dtype
    assert rel_error(out, a, b) < TOL[dtype]


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_every_config_writes_every_output_element(config):
    # several tile-rows and tile-columns, ragged on every edge, so GROUP_M ordering matters
    M, N, K = 70, 75, 45
    a = torch.randn(M, K, dtype=torch.float32)
    b = torch.randn(K, N, dtype=torch.float32)
    out = torch.full((M, N), float("nan"), dtype=torch.float32)
    returned = launch_matmul(a, b, config, out=out)
    assert returned.data_ptr() == out.data_ptr()
    assert not torch.isnan(out).any(), f"{int(torch.isnan(out).sum())} output elements were never written"
    assert rel_error(out, a, b) < TOL[torch.float32]


def test_store_is_masked_to_the_output():
    # the output is a window into a larger NaN buffer: writes past M or N would land in it
    M, N, K = 37, 45, 29
    buf = torch.full((M + 16, N + 40), float("nan"), dtype=torch.float32)
    out = buf[:M, :N]
    a = torch.randn(M, K, dtype=torch.float32)
    b = torch.randn(K, N, dtype=torch.float32)
    launch_matmul(a, b, CONFIGS[1], out=out)
    assert not torch.isnan(out).any()
    assert torch.isnan(buf[M:, :]).all() and torch.isnan(buf[:, N:]).all()
    assert rel_error(out, a, b) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_non_contiguous_inputs(dtype):
    M, N, K = 37, 45, 29
    a = torch.randn(M, K, dtype=dtype)
    b = torch.randn(N, K, dtype=dtype).t()  # (K, N) with strides (1, K)
    assert not b.is_contiguous()
    out = launch_matmul(a, b, CONFIGS[0])
    assert rel_error(out, a, b) < TOL[dtype]
    a_t = torch.randn(K, M, dtype=dtype).t()  # transposed A as well
    out = tunesvc.kernels.matmul(a_t, b, config=CONFIGS[1])
    assert rel_error(out, a_t, b) < TOL[dtype]


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
def test_matmul_entry_point_without_tuning(dtype):
    # no database anywhere: the runtime falls back to the heuristic config
    a = torch.randn(37, 29, dtype=dtype)
    b = torch.randn(29, 45, dtype=dtype)
    out = tunesvc.kernels.matmul(a, b)
    assert out.shape == (37, 45) and out.dtype == dtype
    assert rel_error(out, a, b) < TOL[dtype]


def test_matmul_explicit_config_is_used():
    a = torch.randn(1, 17, dtype=torch.float16)
    b = torch.randn(17, 33, dtype=torch.float16)
    out = tunesvc.kernels.matmul(a, b, config=CONFIGS[2])
    assert rel_error(out, a, b) < TOL[torch.float16]
    # an explicit config never touches the runtime
    assert tunesvc.runtime._default is None


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((4, 5), (6, 7)), ((4, 5), (5,)), ((2, 4, 5), (5, 3))],
)
def test_matmul_rejects_mismatched_shapes(a_shape, b_shape):
    a = torch.randn(*a_shape, dtype=torch.float16)
    b = torch.randn(*b_shape, dtype=torch.float16)
    with pytest.raises(ValueError, match="matmul needs A"):
        tunesvc.kernels.matmul(a, b)


def test_matmul_rejects_mixed_dtypes():
    a = torch.randn(4, 5, dtype=torch.float16)
    b = torch.randn(5, 3, dtype=torch.float32)
    with pytest.raises(ValueError, match="one dtype"):
        tunesvc.kernels.matmul(a, b)


def test_kernels_work_when_current_device_is_called_first(tmp_path):
    # BUG: kernels/__init__.py sets TRITON_INTERPRET only when tunesvc.kernels is imported, but
    # tunesvc.current_device() (device.py) imports triton first; triton.language's own @jit
    # helpers (tl.cdiv, ...) are then compiled-mode functions, and every interpreted launch fails
    # with InterpreterError "Cannot call @triton.jit'd outside of the scope of a kernel".
    code = (
        "import tunesvc\n"
        "device = tunesvc.current_device()\n"
        "t = tunesvc.get_template('matmul')\n"
        "p = t.problem(M=16, N=32, K=32)\n"
        "m = tunesvc.Bench(t, p, device).measure(t.heuristic(p, device))\n"
        "print(m.status.value, m.message)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[0] == "ok", proc.stdout
