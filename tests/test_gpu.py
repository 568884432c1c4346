"""GPU-only checks: the real compiler, real timings (skipped without a CUDA GPU)."""

from __future__ import annotations

import pytest
import torch

import tunesvc
from tunesvc.bench import Bench
from tunesvc.bench import Status
from tunesvc.device import current_device
from tunesvc.kernels.matmul import TEMPLATE
from tunesvc.kernels.matmul import launch_matmul
from tunesvc.store import Store
from tunesvc.sweep import run_sweep

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
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < (2e-2 if dtype == torch.bfloat16 else 5e-3), (config, err)


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
