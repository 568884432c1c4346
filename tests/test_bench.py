"""Bench: every candidate is checked against the reference before it is timed."""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import tunesvc
from tunesvc import Bench
from tunesvc import Status
from tunesvc import config_hash
from tunesvc.bench import CALLER
from tunesvc.bench import MAX_INPUT_SETS
from tunesvc.bench import Compiler
from tunesvc.bench import input_bytes
from tunesvc.bench import input_sets_needed
from tunesvc.bench import relative_error
from tunesvc.kernels.matmul import MatmulTemplate
from tunesvc.store import Store
from tunesvc.tuning.key import certified
from tunesvc.tuning.sweep import run_sweep

SHAPE = {"M": 20, "N": 33, "K": 20}
SMALL = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2}


class _Matmul(MatmulTemplate):
    """A matmul template subclass that keeps the shipped space file and counts launches."""

    space_path = tunesvc.get_template("matmul").space_path

    def __init__(self) -> None:
        self.launches = 0

    def launch(self, inputs, config):
        self.launches += 1
        return super().launch(inputs, config)


class WrongAnswer(_Matmul):
    def launch(self, inputs, config):
        return super().launch(inputs, config) * 1.5


class Crashes(_Matmul):
    def launch(self, inputs, config):
        self.launches += 1
        raise RuntimeError("boom\nsecond line")


class WrongShape(_Matmul):
    def launch(self, inputs, config):
        return super().launch(inputs, config)[:, :-1]


@pytest.fixture
def problem(template):
    return template.problem(**SHAPE, dtype="float32")


def test_measure_ok(template, problem, device):
    bench = Bench(template, problem, device)
    assert bench.inputs[0].shape == (20, 20) and bench.inputs[1].shape == (20, 33)
    assert bench.inputs[0].abs().sum() > 0  # random, never zeros
    m = bench.measure(SMALL)
    assert m.status is Status.OK and m.ok
    assert m.time_ms is not None and m.time_ms > 0
    assert m.reps >= 1
    assert m.spread is not None and m.spread >= 0
    assert m.rel_error is not None and m.rel_error < 1e-5
    assert m.message == "timed: interpreter, wall clock"


def test_measure_ok_half_precision(template, device):
    problem = template.problem(**SHAPE, dtype="bfloat16")
    m = Bench(template, problem, device).measure(SMALL)
    assert m.status is Status.OK
    assert m.rel_error < template.tolerance(problem)


def test_infeasible_config_is_invalid_and_never_launched(problem, device):
    tpl = _Matmul()
    bad = {**SMALL, "GROUP_M": 8, "BLOCK_M": 64}  # one tile-row: breaks "group"; 64 > next_pow2(20): "tile_m"
    m = Bench(tpl, problem, device).measure(bad)
    assert m.status is Status.INVALID
    assert "group" in m.message and "tile_m" in m.message
    assert m.time_ms is None
    assert tpl.launches == 0


def test_wrong_result_is_never_timed(problem, device):
    tpl = WrongAnswer()
    m = Bench(tpl, problem, device).measure(SMALL)
    assert m.status is Status.WRONG_RESULT
    assert not m.ok
    assert m.time_ms is None and m.reps == 0
    assert m.rel_error == pytest.approx(0.5, rel=1e-3)
    assert "relative error" in m.message
    assert tpl.launches == 1  # the correctness check only


def test_launch_that_raises_is_an_error(problem, device):
    tpl = Crashes()
    m = Bench(tpl, problem, device).measure(SMALL)
    assert m.status is Status.ERROR
    assert m.time_ms is None
    assert m.message.startswith("RuntimeError")
    assert "\n" not in m.message
    assert tpl.launches == 1


def test_wrong_output_shape_is_recorded_not_raised(problem, device):
    # a candidate's failure is data, not a crash of the sweep: relative_error reads a wrong shape as inf
    m = Bench(WrongShape(), problem, device).measure(SMALL)
    assert m.status in (Status.WRONG_RESULT, Status.ERROR)
    assert m.time_ms is None


def test_relative_error():
    ref = torch.tensor([3.0, 4.0])
    assert relative_error(ref.clone(), ref) == 0.0
    assert relative_error(torch.tensor([3.0, 5.0]), ref) == pytest.approx(1 / 5)
    assert relative_error(torch.tensor([3.0, float("nan")]), ref) == math.inf
    assert relative_error(torch.tensor([float("inf"), 4.0]), ref) == math.inf
    assert relative_error(torch.tensor([3.0, 4.0], dtype=torch.float16), ref) == 0.0


def test_graph_replays_cycle_through_enough_input_copies_to_miss_l2():
    l2 = 50 * 2**20
    assert input_sets_needed(l2 // 4, l2) == 8  # together 2x L2: each set is evicted before its turn
    assert input_sets_needed(l2 // 3, l2) == 7  # 6 sets would hold 2 bytes short of 2x L2
    assert input_sets_needed(3 * l2, l2) == 1  # larger than L2 alone
    assert input_sets_needed(1000, l2) == MAX_INPUT_SETS  # tiny inputs: capped
    a, b = torch.randn(3, 5), torch.randn(5, 7, dtype=torch.float16)
    assert input_bytes((a, {"b": b, "n": 3}, [None])) == 3 * 5 * 4 + 5 * 7 * 2


def test_bench_on_the_interpreter_times_one_input_set(template, problem, device):
    bench = Bench(template, problem, device)
    assert bench.input_sets() == [bench.inputs]


CRASH = {**SMALL, "BLOCK_N": 64}
HANG = {**SMALL, "num_stages": 3}


class Faulty(_Matmul):
    """Kills its measuring process for CRASH and never returns for HANG (module level: the
    worker process unpickles it by reference)."""

    def launch(self, inputs, config):
        if config == CRASH:
            os._exit(3)
        if config == HANG:
            time.sleep(3600)
        return super().launch(inputs, config)


def test_isolated_sweep_records_crash_and_timeout_and_goes_on(tmp_db, problem, device):
    tpl = Faulty()
    other = {**SMALL, "BLOCK_M": 32}
    configs = [SMALL, CRASH, other, HANG, {**other, "GROUP_M": 1, "BLOCK_K": 16}]
    assert all(tpl.violations(c, problem, device) == [] for c in configs)
    store = Store(tmp_db)
    try:
        [result] = run_sweep(
            tpl,
            [problem],
            store,
            strategy="grid",
            candidates=configs,
            isolate=True,
            measure_timeout=6.0,
            finalists=0,
            device=device,
        )
        rows = store.trials(store.kernel_version_id(tpl), store.device_id(device), result.shape_key)
    finally:
        store.close()
    status = {config_hash(r.config): r for r in rows}
    assert [status[config_hash(c)].status for c in configs] == ["ok", "crash", "ok", "timeout", "ok"]
    assert "exit code 3" in status[config_hash(CRASH)].message
    assert "replaced" in status[config_hash(HANG)].message
    assert result.winner in (SMALL, other, configs[4]) and result.failures == 2
    # the configs after each failure were measured by a fresh process and are correct
    assert status[config_hash(configs[4])].rel_error < 1e-5
    # the torch peer was timed in the measuring process too, on the candidates' inputs
    assert result.peer_ms > 0


def test_finalists_are_remeasured_interleaved(tmp_db, template, problem, device):
    store = Store(tmp_db)
    configs = [SMALL, {**SMALL, "BLOCK_M": 32}, {**SMALL, "BLOCK_N": 64}]
    try:
        [result] = run_sweep(
            template, [problem], store, strategy="grid", candidates=configs, finalists=2, device=device
        )
        rows = store.trials(store.kernel_version_id(template), store.device_id(device), result.shape_key)
    finally:
        store.close()
    # each of the two fastest: its 3 first runs plus at least 3 rounds of 3; the third keeps its
    # 3 unless its first time beat the fastest finalist's new one (the interpreter's clock is
    # noisy), and then it is re-timed too: no trial left with its first time alone is faster
    retimed = [r for r in rows if r.reps >= 12]
    assert len(retimed) >= 2 and all(r.reps in (3, 12, 21) for r in rows)
    # the fastest, or the tie rule's pick among those within its noise (the heuristic served before)
    chosen = certified(rows, result.heuristic, result.heuristic)
    assert chosen is not None and result.winner == chosen.config and result.winner_ms == chosen.time_ms
    assert min(rows, key=lambda r: r.time_ms) in retimed
    assert all(r.spread >= 0 for r in rows)


def test_compiler_replaces_a_pool_whose_worker_died(problem):
    with Compiler(2) as compiler:
        outcome = compiler.compile(Faulty(), problem, [CRASH, SMALL])
        assert "compile worker died" in outcome[0]
        assert compiler.restarts == 1
        # the next batch compiles in the new pool
        assert compiler.compile(Faulty(), problem, [SMALL, {**SMALL, "BLOCK_M": 32}]) == {0: None, 1: None}
        assert compiler.restarts == 1


OWNER = """
import time
from tunesvc.bench import Compiler
from tunesvc.kernels.matmul import TEMPLATE
import tunesvc

if __name__ == "__main__":
    problem = TEMPLATE.problem(M=24, N=40, K=36)
    compiler = Compiler(2)
    assert compiler.compile(TEMPLATE, problem, [TEMPLATE.heuristic(problem, tunesvc.current_device())]) == {0: None}
    print(*compiler._pool._processes, flush=True)
    time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_compile_workers_exit_when_their_sweep_is_killed(tmp_path):
    """A sweep killed with SIGKILL leaves no compile worker behind (nor, through them, a forkserver)."""
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(pid) for pid in owner.stdout.readline().split()]
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        deadline = time.monotonic() + 20
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in workers)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        owner.stdout.close()


SLOW = {**SMALL, "BLOCK_M": 32}


class SlowToCompile(_Matmul):
    """Takes 4 s to "compile" SLOW in a compile worker (a child process) and notes when it is done."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker
        self.measured_at: dict[str, float] = {}  # first launch of each config in this (the sweep's) process

    def launch(self, inputs, config):
        if multiprocessing.parent_process() is not None:
            if config == SLOW:
                time.sleep(4)
                with open(self.marker, "w") as f:
                    f.write(repr(time.time()))
        else:
            self.measured_at.setdefault(config_hash(config), time.time())
        return super().launch(inputs, config)


FIRST = {**SMALL, "BLOCK_K": 16}


@pytest.mark.parametrize("order", ["fast first", "slow first"])
def test_a_sweep_measures_the_rest_itself_while_its_new_pool_starts(order, tmp_db, tmp_path, problem, device):
    tpl = SlowToCompile(str(tmp_path / "slow-compiled"))
    store = Store(tmp_db)
    try:
        [result] = run_sweep(
            tpl,
            [problem],
            store,
            strategy="grid",
            workers=3,
            isolate=False,
            finalists=0,
            device=device,
            candidates=[FIRST, SMALL, SLOW] if order == "fast first" else [FIRST, SLOW, SMALL],
        )
    finally:
        store.close()
    assert result.trials_new == 3 and result.failures == 0
    slow_compiled = float((tmp_path / "slow-compiled").read_text())
    # the pool's first batch: its first candidate is compiled and measured here on its own, then
    # the pool starts; until one of its workers has finished a compile, this process compiles
    # and measures the rest itself, from the last, never waiting for SLOW's 4 s in a worker
    measured = tpl.measured_at
    rest = [SLOW, SMALL] if order == "fast first" else [SMALL, SLOW]
    times = [measured[config_hash(c)] for c in [FIRST, *rest]]
    assert times == sorted(times) and times[-1] < slow_compiled


class AllSlowToCompile(SlowToCompile):
    """Takes 4 s to "compile" any config in a compile worker."""

    def launch(self, inputs, config):
        if multiprocessing.parent_process() is not None:
            time.sleep(4)
        return super().launch(inputs, config)


def test_what_was_measured_while_the_pool_started_is_re_timed_with_the_finalists(tmp_db, tmp_path, problem, device):
    """Those candidates were timed beside the new workers' CUDA contexts, inputs and first
    launches on the same GPU: each is timed again beside the fastest, whatever its first time."""
    from tunesvc.bench import Bench

    tpl = AllSlowToCompile(str(tmp_path / "slow-compiled"))
    retimed: list[set[str]] = []
    together = Bench.time_together

    def seen(self, configs, *args, **kwargs):
        retimed.append({config_hash(c) for c in configs})
        return together(self, configs, *args, **kwargs)

    store = Store(tmp_db)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Bench, "time_together", seen)
            [result] = run_sweep(
                tpl, [problem], store, strategy="grid", workers=3, isolate=False, device=device,
                candidates=[FIRST, SMALL, SLOW],
            )  # fmt: skip
    finally:
        store.close()
    assert result.trials_new == 3 and result.failures == 0
    assert retimed and {config_hash(SMALL), config_hash(SLOW)} <= retimed[0]


def test_compile_each_yields_each_config_as_it_finishes(problem, tmp_path):
    with Compiler(2) as compiler:
        outcomes = compiler.compile_each(
            SlowToCompile(str(tmp_path / "m")), problem, [SLOW, SMALL, {**SMALL, "BLOCK_K": 16}]
        )
        assert next(outcomes) == (1, None)  # the fast second config, while the slow first one compiles
        assert not (tmp_path / "m").exists()
        assert sorted(outcomes) == [(0, None), (2, None)]
        assert (tmp_path / "m").exists()


def test_compile_each_with_spare_hands_the_caller_the_last_configs_while_nothing_has_compiled(problem, tmp_path):
    """A pool whose one worker is busy (SLOW takes it 4 s): every config is handed out at once,
    from the last, for the caller to compile itself; the pool's compiles are still waited for,
    and none is handed out twice."""
    with Compiler(1) as compiler:
        outcomes = compiler.compile_each(SlowToCompile(str(tmp_path / "m")), problem, [SLOW, SMALL, FIRST], spare=True)
        assert [next(outcomes) for _ in range(3)] == [(2, CALLER), (1, CALLER), (0, CALLER)]
        assert not (tmp_path / "m").exists()  # handed out before the worker compiled SLOW
        assert list(outcomes) == []
        assert (tmp_path / "m").exists() and compiler.restarts == 0
        # without spare, the configs come as the pool compiles them
        assert sorted(compiler.compile_each(SlowToCompile(str(tmp_path / "n")), problem, [SMALL, FIRST])) == [
            (0, None),
            (1, None),
        ]


def test_compile_past_the_timeout_is_reported_and_the_pool_replaced(problem, tmp_path):
    with Compiler(2) as compiler:
        template = SlowToCompile(str(tmp_path / "m"))
        # both workers up, with this test's module imported (it defines the template)
        assert compiler.compile(template, problem, [SMALL, {**SMALL, "BLOCK_K": 16}]) == {0: None, 1: None}
        compiler.timeout_s = 2.0  # SLOW takes 4 s
        assert compiler.compile(template, problem, [SLOW, SMALL]) == {0: "compile timeout after 2 s", 1: None}
        assert compiler.restarts == 1
        compiler.timeout_s = 120.0
        assert compiler.compile(template, problem, [SMALL]) == {0: None}  # the new pool compiles


def test_workers_server_preloads_tunesvc_and_its_kernels():
    from tunesvc._processes import forkserver_context
    from tunesvc.bench import start_forkserver

    start_forkserver(wait=True)
    context = forkserver_context()
    queue = context.Queue()
    # exec, a builtin: a target from a module would import that module (and tunesvc) in the child
    modules = ("torch", "triton", "tunesvc", "tunesvc.kernels", "tunesvc.kernels.matmul")
    code = f"import sys; queue.put([m for m in {modules!r} if m in sys.modules])"
    child = context.Process(target=exec, args=(code, {"queue": queue}))
    child.start()
    # a worker forked from the server finds them imported (a preload that fails is silently skipped)
    assert queue.get(timeout=60) == ["torch", "triton", "tunesvc", "tunesvc.kernels", "tunesvc.kernels.matmul"]
    child.join()


def test_workers_are_forked_from_a_process_without_cuda_and_start_after_parallel_cpu_work(monkeypatch):
    """Fork, not the server, while CUDA is not initialised here; a child forked after this process
    ran parallel torch CPU ops (GNU OpenMP's pool does not survive fork) still starts."""
    import tunesvc.bench._worker
    from tunesvc._processes import worker_context
    from tunesvc.bench import Worker
    from tunesvc.device import current_device

    assert worker_context().get_start_method() == "fork"
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(700, 700)
        assert torch.isfinite((x @ x).softmax(-1)).all()  # the parallel region the child must not hang in
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setattr(tunesvc.bench._worker, "STARTUP_TIMEOUT_S", 30.0)
    template = MatmulTemplate()
    worker = Worker(template, template.problem(M=20, N=33, K=20, dtype="float32"), current_device(), timeout_s=5.0)
    worker.wait_ready()  # TunesvcError if the child hung
    assert worker.measure(SMALL).status is Status.OK
    # a finalist's re-timing, its replay length sent through the pipe with its rep_ms
    retimed = worker.time_only(SMALL, 5.0, 1.0)
    assert retimed.status is Status.OK and retimed.time_ms > 0 and worker._process is not None
    child = worker._process
    with Compiler(1) as compiler:  # forked after the measuring child: holds a copy of its pipe's parent end
        compiler._starting.join()
        worker.close()
    assert child.exitcode == 0  # told to stop, it exits at once (not killed after the close's 5 s grace)


class NoInputs(_Matmul):
    name = "no_inputs_matmul"

    def make_inputs(self, problem, device):
        raise MemoryError("no room for the inputs of this problem")


def test_a_measuring_process_that_cannot_make_its_inputs_says_why_in_one_line():
    """Its child's error (out of memory, a template's own) is the sweep's message, not a hint to
    run again without isolation; a later problem still gets a process of its own."""
    from tunesvc.bench import Worker
    from tunesvc.device import current_device
    from tunesvc.errors import TunesvcError

    template = NoInputs()
    problem = template.problem(M=20, N=33, K=20, dtype="float32")
    worker = Worker(template, problem, current_device(), timeout_s=5.0)
    try:
        with pytest.raises(TunesvcError) as caught:
            worker.wait_ready()
        said = str(caught.value)
        assert "could not make the inputs and reference" in said and "MemoryError: no room" in said, said
        assert "\n" not in said
        good = _Matmul()
        worker.load(good, good.problem(M=20, N=33, K=20, dtype="float32"))
        assert worker.measure(SMALL).status is Status.OK
    finally:
        worker.close()
