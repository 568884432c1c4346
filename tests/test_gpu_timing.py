"""Deployment-matched timing on a GPU: an eager runtime launches a key's eager winner outside
CUDA-graph capture and its graph winner inside it, and the captured graph replays right."""

from __future__ import annotations

import pytest
import torch

import tunesvc
from tunesvc import Status
from tunesvc import config_hash
from tunesvc.bench import Measurement
from tunesvc.bench import relative_error
from tunesvc.store import Store

pytestmark = pytest.mark.gpu


def test_an_eager_runtime_launches_the_graph_winner_inside_cuda_graph_capture(tmp_path):
    from tunesvc.kernels import matmul

    template, device = tunesvc.get_template("matmul"), tunesvc.current_device()
    a = torch.randn(333, 129, device="cuda", dtype=torch.float16)
    b = torch.randn(129, 65, device="cuda", dtype=torch.float16)
    problem = template.problem(M=333, N=65, K=129, dtype=torch.float16)
    graph_config, eager_config = template.feasible(problem, device)[:2]
    assert config_hash(graph_config) != config_hash(eager_config)
    db = str(tmp_path / "t.db")
    store = Store(db)
    try:
        kv, dev, key = store.kernel_version_id(template), store.device_id(device), str(template.key(problem))
        sweep = store.start_sweep(kv, dev, key, problem, "grid", None, 0)
        for timing, config in (("graph", graph_config), ("eager", eager_config)):
            m = Measurement(Status.OK, time_ms=1.0, spread=0.01, reps=3, rel_error=1e-4, message=f"timed: {timing}")
            store.add_trials(sweep, kv, dev, key, [(config, config_hash(config), m)], timing=timing)
            store.update_winner(kv, dev, key, timing=timing)
    finally:
        store.close()
    runtime = tunesvc.configure(db=db, mode="lookup", timing="eager")
    ref = a.double() @ b.double()
    assert relative_error(matmul(a, b), ref) < 5e-3  # eager: the eager winner
    matmul(a, b, config=graph_config)  # compile the graph winner outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = matmul(a, b)
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    assert relative_error(out, a.double() @ b.double()) < 5e-3
    assert [config_hash(c) for c in dict.values(runtime.launch_configs)] == [config_hash(eager_config)]
    twin = runtime._graph().launch_configs
    assert [config_hash(c) for c in twin.values()] == [config_hash(graph_config)]
