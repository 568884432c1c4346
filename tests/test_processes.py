"""The process start policy (tunesvc/_processes.py): choosing Triton's interpreter costs no torch import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _capture import DOUBLING_PROGRAM

PROCESSES = Path(__file__).resolve().parent.parent / "tunesvc" / "_processes.py"

# the module loaded from its file, alone: importing it as tunesvc._processes would run tunesvc's
# __init__, which imports torch for its own reasons
CHILD = """
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("policy", sys.argv[1])
policy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(policy)
if sys.argv[2] == "maybe-gpu":
    policy._may_have_gpu = lambda: True
policy.use_interpreter_without_gpu()
decided = {"torch": "torch" in sys.modules, "flag": os.environ.get("TRITON_INTERPRET")}
import triton
import torch
print(json.dumps({"decided": decided, "flag_at_triton": os.environ.get("TRITON_INTERPRET"),
                  "gpus": torch.cuda.device_count()}))
"""


def _run(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(PROCESSES), mode], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _no_gpu_nodes() -> bool:
    return not (any(Path("/dev").glob("nvidia[0-9]*")) or Path("/dev/kfd").exists() or Path("/dev/dxg").exists())


@pytest.mark.skipif(sys.platform == "win32", reason="Windows has no /dev: torch decides there")
def test_the_backend_is_chosen_without_importing_torch():
    seen = _run("as-is")
    assert seen["decided"]["torch"] is False
    assert seen["flag_at_triton"] == ("1" if seen["gpus"] == 0 else None)  # torch agrees with the choice
    if _no_gpu_nodes():  # decided at once
        assert seen["decided"]["flag"] == "1"


def test_where_a_gpu_may_be_present_torch_decides_just_before_triton_is_imported():
    seen = _run("maybe-gpu")
    assert seen["decided"] == {"torch": False, "flag": None}
    assert seen["flag_at_triton"] == ("1" if seen["gpus"] == 0 else None)


@pytest.mark.skipif(sys.platform == "win32" or not _no_gpu_nodes(), reason="needs a machine without a GPU")
def test_without_a_gpu_capture_runs_where_triton_would_and_tune_run_sets_the_interpreter(tmp_path):
    """As the README says: on a machine without a GPU, a program under TUNESVC_CAPTURE=1 uses
    Triton's interpreter exactly where it would without tunesvc (TRITON_INTERPRET=1 set by its
    user), and `tune run` sets it for the command it runs, as every `tune` command does."""
    (tmp_path / "program.py").write_text(DOUBLING_PROGRAM)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TUNESVC_", "TRITON_INTERPRET"))}
    base["TUNESVC_DB"] = str(tmp_path / "tune.db")

    def run(*command: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(command), cwd=tmp_path, env={**base, **env}, capture_output=True, text=True, timeout=300
        )

    alone = run(sys.executable, "program.py")
    captured = run(sys.executable, "program.py", TUNESVC_CAPTURE="1")
    assert alone.returncode != 0 and captured.returncode != 0  # Triton finds no driver, with or without tunesvc
    interpreted = run(sys.executable, "program.py", TUNESVC_CAPTURE="1", TRITON_INTERPRET="1")
    assert interpreted.returncode == 0 and "ran" in interpreted.stdout, interpreted.stderr[-2000:]
    through_tune = run(str(Path(sys.executable).with_name("tune")), "run", "--", sys.executable, "program.py")
    assert through_tune.returncode == 0 and "ran" in through_tune.stdout, through_tune.stderr[-2000:]


def _collect_the_pool(holder: list) -> None:
    import gc

    holder.clear()  # the child's copy of the pool goes: its weakref callback runs here, if it can
    gc.collect()
    os._exit(0)


def test_a_child_forked_while_a_pools_lock_is_held_can_collect_the_pool():
    """A pool's manager thread takes the pool's shutdown lock at times; a child forked meanwhile
    inherited it held, and collecting its copy of the pool (whose weakref callback takes that
    lock) hung the child for ever: a measuring child that never started."""
    import threading

    from tunesvc._processes import worker_context
    from tunesvc._processes import worker_pool

    if worker_context().get_start_method() != "fork":
        pytest.skip("children are forked only while this process has not initialised CUDA")
    holder = [worker_pool(1)]  # nothing else refers to the pool
    assert holder[0].submit(abs, -3).result(timeout=60) == 3  # its manager thread running
    lock = holder[0]._shutdown_lock
    held, forked = threading.Event(), threading.Event()

    def hold() -> None:  # the manager thread's hold, made long enough to fork in
        with lock:
            held.set()
            forked.wait(60)

    holder_thread = threading.Thread(target=hold)
    holder_thread.start()
    held.wait(60)
    child = worker_context().Process(target=_collect_the_pool, args=(holder,))
    try:
        child.start()
    finally:
        forked.set()
        holder_thread.join()
    child.join(60)
    hung = child.exitcode is None
    if hung:
        child.kill()
        child.join()
    holder[0].shutdown()
    assert not hung and child.exitcode == 0
