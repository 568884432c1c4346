"""Capture: tunesvc.autotune as triton.autotune's drop-in, and every triton.autotune kernel of a
process routed through the store (tunesvc.capture, TUNESVC_CAPTURE=1, `tune run`)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import triton
import triton.language as tl
from _backends import pg_database
from _capture import interpreter_env
from triton.runtime.autotuner import Autotuner
from typer.testing import CliRunner

import tunesvc
from tunesvc._capture import STATS
from tunesvc._capture import CapturedKey
from tunesvc._capture import CapturedTemplate
from tunesvc.cli import app
from tunesvc.store import Store

CAPTURE = sys.modules["tunesvc._capture"]
CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)]


def cpu_bench(fn, quantiles):
    """triton.autotune's do_bench for the interpreter, which has no benchmarker of its own."""
    start = time.perf_counter()
    fn()
    return [(time.perf_counter() - start) * 1e3] * len(quantiles)


@triton.jit
def _scale_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, alpha * x + y, mask=mask)


@triton.jit
def _atomic_sum(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    """total += sum(x) by one atomic add per program: accumulates into its output."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_add(total_ptr, tl.sum(x, axis=0))


@triton.jit
def _add_in_place(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """x += y: a second run on the same x would add y twice."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def _sometimes_wrong(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out = x, except with BLOCK 32, which doubles it: a config that computes a wrong answer."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if BLOCK == 32:
        x = x * 2
    tl.store(out_ptr + offs, x, mask=mask)


@triton.jit
def _log(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out = log(x): -inf where x is 0, in every config alike; BLOCK 16 writes NaN everywhere
    (a config that computes garbage)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.log(tl.load(x_ptr + offs, mask=mask, other=1.0))
    if BLOCK == 16:
        y = y + float("nan")
    tl.store(out_ptr + offs, y, mask=mask)


def grid(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


def trials(db, kernel_suffix=""):
    store = Store(db, readonly=True)
    try:
        with store.session() as session:
            from sqlalchemy import select

            from tunesvc.store.models import KernelVersion
            from tunesvc.store.models import Trial

            rows = session.execute(
                select(KernelVersion.kernel, Trial.shape_key, Trial.status, Trial.config).join(
                    KernelVersion, Trial.kernel_version_id == KernelVersion.id
                )
            ).all()
    finally:
        store.close()
    return [r for r in rows if r.kernel.endswith(kernel_suffix)]


@pytest.fixture(autouse=True)
def _fresh_stats():
    STATS.clear()
    yield
    tunesvc.uncapture()


def test_drop_in_matches_triton_autotune_and_is_a_triton_autotuner(tmp_db):
    n = 1001
    x, y = torch.randn(n), torch.randn(n)
    theirs = triton.autotune(configs=CONFIGS, key=["n"], do_bench=cpu_bench)(_scale_add)
    ours = tunesvc.autotune(configs=CONFIGS, key=["n"], db=tmp_db)(_scale_add)
    out_theirs, out_ours = torch.full((n,), float("nan")), torch.full((n,), float("nan"))
    theirs[grid(n)](x, y, out_theirs, n, 0.5)
    ours[grid(n)](x, y, out_ours, n, 0.5)
    torch.testing.assert_close(out_ours, out_theirs)
    torch.testing.assert_close(out_ours, 0.5 * x + y)
    assert isinstance(ours, Autotuner)
    assert ours.base_fn is _scale_add.fn and ours.fn is _scale_add
    assert ours.configs is CONFIGS and ours.keys == ["n"] and ours.arg_names == theirs.arg_names
    assert ours.best_config in CONFIGS
    # the same key tuple as Triton's own cache
    assert set(ours.cache) == set(theirs.cache) == {(n, "torch.float32", "torch.float32", "torch.float32")}
    assert STATS["tuned"] == 1 and STATS["benchmarks"] == len(CONFIGS)
    assert set(ours.configs_timings) == set(CONFIGS) and ours.bench_time > 0
    rows = trials(tmp_db)
    assert len(rows) == len(CONFIGS) and {r.status for r in rows} == {"ok"}
    assert rows[0].kernel.endswith(":_scale_add") and rows[0].shape_key == (
        "n=1001,x_ptr.dtype=float32,y_ptr.dtype=float32,out_ptr.dtype=float32"
    )
    # a hit: nothing measured, the same config; keyword launches key alike
    ours[grid(n)](x, y, out_ours, n=n, alpha=2.0)
    torch.testing.assert_close(out_ours, 2.0 * x + y)
    assert STATS["benchmarks"] == len(CONFIGS)


def test_reset_to_zero_on_an_atomic_accumulator_tunes_every_config_correctly(tmp_db):
    n = 777
    x = torch.randn(n)
    total = torch.zeros(1)
    kernel = tunesvc.autotune(configs=CONFIGS, key=["n"], reset_to_zero=["total_ptr"], db=tmp_db)(_atomic_sum)
    kernel[grid(n)](x, total, n)
    rows = trials(tmp_db)
    assert len(rows) == len(CONFIGS) and {r.status for r in rows} == {"ok"}, [(r.config, r.status) for r in rows]
    # the user's tensor holds one call's result, as after triton.autotune
    torch.testing.assert_close(total, x.sum().reshape(1), rtol=1e-5, atol=1e-5)


def test_restore_value_in_place_kernel_tunes_every_config_correctly(tmp_db):
    n = 555
    x, y = torch.randn(n), torch.randn(n)
    expected = x + y
    kernel = tunesvc.autotune(configs=CONFIGS, key=["n"], restore_value=["x_ptr"], db=tmp_db)(_add_in_place)
    kernel[grid(n)](x, y, n)
    rows = trials(tmp_db)
    assert len(rows) == len(CONFIGS) and {r.status for r in rows} == {"ok"}, [(r.config, r.status) for r in rows]
    torch.testing.assert_close(x, expected)


def test_a_config_that_computes_a_wrong_answer_is_stored_as_such_and_never_wins(tmp_db):
    n = 300
    x, out = torch.randn(n), torch.empty(n)
    configs = [triton.Config({"BLOCK": b}) for b in (16, 32, 64)]
    kernel = tunesvc.autotune(configs=configs, key=["n"], db=tmp_db)(_sometimes_wrong)
    kernel[grid(n)](x, out, n)
    status = {r.config["BLOCK"]: r.status for r in trials(tmp_db)}
    assert status == {16: "ok", 32: "wrong_result", 64: "ok"}
    assert kernel.best_config.kwargs["BLOCK"] != 32
    torch.testing.assert_close(out, x)


def test_a_first_config_writing_nan_gives_way_to_one_that_writes_finite_values(tmp_db):
    n = 301
    x, out = torch.rand(n) + 0.5, torch.empty(n)
    kernel = tunesvc.autotune(configs=[triton.Config({"BLOCK": b}) for b in (16, 32, 64)], key=["n"], db=tmp_db)(_log)
    kernel[grid(n)](x, out, n)
    torch.testing.assert_close(out, x.log())
    status = {r.config["BLOCK"]: r.status for r in trials(tmp_db)}
    assert status == {16: "wrong_result", 32: "ok", 64: "ok"} and kernel.best_config.kwargs["BLOCK"] != 16
    assert STATS["benchmarks"] == 4  # the first config measured again, against the second


def test_outputs_rightly_infinite_in_every_config_are_all_correct(tmp_db):
    n = 301
    x, out = torch.rand(n) + 0.5, torch.empty(n)
    x[::7] = 0.0  # log(0) = -inf: the right answer there
    kernel = tunesvc.autotune(configs=[triton.Config({"BLOCK": b}) for b in (32, 64, 128)], key=["n"], db=tmp_db)(_log)
    kernel[grid(n)](x, out, n)
    torch.testing.assert_close(out, x.log())
    assert [r.status for r in trials(tmp_db)] == ["ok"] * 3


def test_per_config_pre_hook_and_a_single_surviving_config(tmp_db):
    calls = []
    configs = [
        triton.Config({"BLOCK": 16}, pre_hook=lambda nargs: calls.append(("a", nargs["n"]))),
        triton.Config({"BLOCK": 64}, pre_hook=lambda nargs: calls.append(("b", nargs["n"]))),
    ]
    n = 99
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
    kernel = tunesvc.autotune(configs=configs, key=["n"], db=tmp_db)(_scale_add)
    kernel[grid(n)](x, y, out, n, 1.0)
    assert {c for c, _ in calls} == {"a", "b"} and all(v == n for _, v in calls)
    torch.testing.assert_close(out, x + y)
    # pruned to one config: launched untuned, as triton.autotune does
    pruned = tunesvc.autotune(
        configs=CONFIGS, key=["n"], db=tmp_db, prune_configs_by={"early_config_prune": lambda cs, nargs, **kw: cs[-1:]}
    )(_scale_add)
    pruned[grid(n)](x, y, out, n, 1.0)
    assert pruned.best_config is CONFIGS[-1] and STATS["untuned"] == 1


def _first_of_one(configs, nargs, **kwargs):
    """An early_config_prune that keeps one config: the last."""
    return configs[-1:]


@pytest.mark.parametrize("mode", ["tune", "lookup"])
@pytest.mark.parametrize(
    "configs, prune",
    [(CONFIGS[-1:], None), (CONFIGS, {"early_config_prune": _first_of_one})],
    ids=["one listed config", "pruned to one"],
)
def test_a_key_left_one_config_launches_it_with_nothing_measured_stored_or_recorded(
    tmp_db, mode, configs, prune, monkeypatch, capsys
):
    """Nothing to choose between: the one config is launched as Triton's autotuner launches it,
    which (Triton 3.8 on) benchmarks nothing, prints nothing and leaves the reset_to_zero
    arguments as the caller gave them, and (before) benchmarks it, prints its line and zeroes
    them; tunesvc measures nothing, stores no trial or winner and records no miss, in any Triton
    version."""
    Store(tmp_db).close()  # a database there: mode lookup records the misses it serves
    monkeypatch.setattr(triton.knobs.autotuning, "print", True)  # TRITON_PRINT_AUTOTUNING=1
    benched = []

    def counting_bench(fn, quantiles):
        benched.append(fn)
        return cpu_bench(fn, quantiles)

    def build():
        return triton.autotune(
            configs, key=["n"], reset_to_zero=["total_ptr"], prune_configs_by=prune, do_bench=counting_bench
        )(_atomic_sum)

    n = 77
    x = torch.arange(n, dtype=torch.float64)
    theirs = torch.full((1,), 5.0, dtype=torch.float64)
    build()[grid(n)](x, theirs, n)  # Triton's own autotuner, as the program runs without capture
    assert theirs.item() in (x.sum().item(), 5.0 + x.sum().item())
    printed = "Triton autotuning for function _atomic_sum" in capsys.readouterr().out
    benched.clear()
    with tunesvc.capture(db=tmp_db, mode=mode):
        kernel = build()
        total = torch.full((1,), 5.0, dtype=torch.float64)
        kernel[grid(n)](x, total, n)
        kernel[grid(n)](x, total, n)  # a hit: accumulates, as Triton's second launch of a key
    assert kernel.best_config is configs[-1]
    assert total.item() == theirs.item() + x.sum().item()
    assert ("Triton autotuning for function _atomic_sum" in capsys.readouterr().out) == printed
    stats = tunesvc.capture_stats()
    assert benched == [] and stats.get("benchmarks", 0) == 0
    assert stats.get("tuned", 0) == 0 and stats.get("fallback", 0) == 0
    assert stats.get("untuned", 0) == (0 if prune is None else 1)  # one listed config: Triton's own
    store = Store(tmp_db, readonly=True)
    try:
        assert store.winners() == [] and store.trial_counts() == {} and store.misses() == []
    finally:
        store.close()


def test_lookup_mode_never_benchmarks_records_the_miss_and_takes_the_nearest_winner(tmp_db):
    x, y = torch.randn(1000), torch.randn(1000)
    tuned = tunesvc.autotune(configs=CONFIGS, key=["n"], db=tmp_db)(_scale_add)
    tuned[grid(1000)](x, y, torch.empty(1000), 1000, 1.0)
    winner = tuned.best_config
    STATS.clear()
    serving = tunesvc.autotune(configs=CONFIGS, key=["n"], db=tmp_db, mode="lookup")(_scale_add)
    out = torch.empty(900)
    serving[grid(900)](x[:900], y[:900], out, 900, 1.0)
    torch.testing.assert_close(out, x[:900] + y[:900])
    assert serving.best_config is winner  # the nearest stored key's winner
    half = torch.randn(50, dtype=torch.float16)
    out16 = torch.empty(50, dtype=torch.float16)
    serving[grid(50)](half, half, out16, 50, 1.0)
    assert serving.best_config is CONFIGS[0]  # no stored key of that dtype: the first listed config
    assert STATS["benchmarks"] == 0 and STATS["fallback"] == 2
    store = Store(tmp_db, readonly=True)
    misses = {m.shape_key: m for m in store.misses()}
    store.close()
    assert set(misses) == {
        "n=900,x_ptr.dtype=float32,y_ptr.dtype=float32,out_ptr.dtype=float32",
        "n=50,x_ptr.dtype=float16,y_ptr.dtype=float16,out_ptr.dtype=float16",
    }
    call = misses["n=900,x_ptr.dtype=float32,y_ptr.dtype=float32,out_ptr.dtype=float32"].call
    assert call["args"][0]["tensor"] == {"shape": [900], "stride": [1], "dtype": "torch.float32"}
    assert call["args"][3] == {"value": 900} and call["grids"][0] == [57]


def test_key_text_distance():
    distance = CapturedTemplate("k", "v", []).key_distance

    def key_distance(a: str, b: str) -> float:
        return distance(CapturedKey.of(a), CapturedKey.of(b))

    assert key_distance("n=1000,flag=True", "n=1000,flag=True") == 0
    assert key_distance("n=1000,flag=True", "n=1000,flag=False") == float("inf")
    assert 0 < key_distance("n=0,x.dtype=float16", "n=3,x.dtype=float16") < float("inf")


def test_capture_routes_kernels_decorated_before_and_after(tmp_db):
    n = 201
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
    before = triton.autotune(configs=CONFIGS, key=["n"], do_bench=cpu_bench)(_scale_add)
    with tunesvc.capture(db=tmp_db) as handle:
        assert CAPTURE.capturing() is not None
        after = triton.autotune(configs=CONFIGS, key=["n", "alpha"])(_scale_add)
        before[grid(n)](x, y, out, n, 1.0)
        torch.testing.assert_close(out, x + y)
        after[grid(n)](x, y, out, n, 0.25)
        torch.testing.assert_close(out, 0.25 * x + y)
    assert handle.closed and Autotuner.run is CAPTURE.TRITON_AUTOTUNER_RUN
    keys = {r.shape_key for r in trials(tmp_db)}
    assert keys == {
        "n=201,x_ptr.dtype=float32,y_ptr.dtype=float32,out_ptr.dtype=float32",
        "n=201,alpha=0.25,x_ptr.dtype=float32,y_ptr.dtype=float32,out_ptr.dtype=float32",
    }
    assert STATS["tuned"] == 2
    # released: Triton's own autotuner again (it benchmarks with cpu_bench, tunesvc counts nothing)
    STATS.clear()
    before[grid(n)](x, y, out, n + 0, 3.0)
    assert not STATS


KERNELS = """
import triton
import triton.language as tl

@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)],
                 key=["n"], do_bench=lambda fn, quantiles: (fn(), [1.0] * len(quantiles))[1])
@triton.jit
def scale_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)
"""

SCRIPT = """
import json, sys
import torch, triton
import mykernels

n = 333
x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
mykernels.scale_add[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, out, n, 2.0)
torch.testing.assert_close(out, 2.0 * x + y)
capture = sys.modules.get("tunesvc._capture")
print(json.dumps({"stats": capture.stats() if capture else None, "best": mykernels.scale_add.best_config.kwargs}))
"""


@pytest.fixture
def script(tmp_path):
    (tmp_path / "mykernels.py").write_text(textwrap.dedent(KERNELS))
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return path


_env = interpreter_env


def _run(script, env):
    done = subprocess.run(
        [sys.executable, str(script)], cwd=script.parent, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_environment_capture_of_an_unmodified_kernel_and_a_second_process_benchmarks_nothing(script, tmp_db):
    first = _run(script, _env(TUNESVC_CAPTURE="1", TUNESVC_DB=tmp_db))
    assert first["stats"] == {"tuned": 1, "benchmarks": 6}
    stored = trials(tmp_db)
    assert {r.kernel for r in stored} == {"mykernels:scale_add"} and len(stored) == 6
    second = _run(script, _env(TUNESVC_CAPTURE="1", TUNESVC_DB=tmp_db))
    assert second["stats"] == {"stored": 1} and second["best"] == first["best"]
    assert len(trials(tmp_db)) == 6
    # without the variable, the hook does nothing and tunesvc is never imported
    assert _run(script, _env(TUNESVC_DB=tmp_db))["stats"] is None


def test_a_database_file_with_no_tables_yet_is_tuned_into_not_given_up(script, tmp_path):
    """Another process has created the file and not yet its tables: capture treats it as no
    database (tunes the key, creating them), not as an unusable one (Triton's own autotuner)."""
    db = tmp_path / "new.db"
    sqlite3.connect(db).close()  # an empty SQLite file
    assert db.exists() and db.stat().st_size == 0
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=script.parent,
        env=_env(TUNESVC_CAPTURE="1", TUNESVC_DB=str(db)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "not a tunesvc database yet" not in done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["stats"] == {"tuned": 1, "benchmarks": 6}
    assert len(trials(str(db))) == 6


def test_processes_missing_one_key_at_once_tune_it_once(script, tmp_db):
    env = _env(TUNESVC_CAPTURE="1", TUNESVC_DB=tmp_db)
    procs = [
        subprocess.Popen([sys.executable, str(script)], cwd=script.parent, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    results = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(r["stats"].get("tuned", 0) for r in results) == [0, 0, 1]
    assert len({json.dumps(r["best"]) for r in results}) == 1
    assert len(trials(tmp_db)) == 6


@pytest.fixture
def pg_url():
    yield from pg_database()


def test_hosts_missing_one_key_at_once_on_a_server_database_tune_it_once(script, tmp_path, pg_url):
    """No shared lock file (each process its own temp folder, as on separate hosts): the claim
    in the PostgreSQL database alone makes one process tune and the others wait for its winner."""
    Store(pg_url).close()  # a server database is created by `tune db init` first
    url = pg_url
    procs = []
    for i in range(3):
        host_tmp = tmp_path / f"host{i}"
        host_tmp.mkdir()
        env = _env(TUNESVC_CAPTURE="1", TUNESVC_DB=url, TMPDIR=str(host_tmp))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)], cwd=script.parent, env=env, stdout=subprocess.PIPE, text=True
            )
        )
    results = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(r["stats"].get("tuned", 0) for r in results) == [0, 0, 1]
    assert len({json.dumps(r["best"]) for r in results}) == 1
    assert len(trials(url)) == 6


def test_tune_run_captures_a_command_and_returns_its_exit_code(script, tmp_db, monkeypatch):
    for k, v in _env().items():
        monkeypatch.setenv(k, v)
    runner = CliRunner()
    result = runner.invoke(app, ["run", "--db", tmp_db, "--", sys.executable, str(script)])
    assert result.exit_code == 0, result.output
    assert {r.kernel for r in trials(tmp_db)} == {"mykernels:scale_add"}
    failing = runner.invoke(app, ["run", "--", sys.executable, "-c", "raise SystemExit(3)"])
    assert failing.exit_code == 3
    serving = runner.invoke(app, ["run", "--mode", "lookup", "--db", tmp_db, "--", sys.executable, str(script)])
    assert serving.exit_code == 0, serving.output
    # --compile-workers reaches the command as TUNESVC_COMPILE_WORKERS; a negative count is refused
    echo = "import os; raise SystemExit(int(os.environ['TUNESVC_COMPILE_WORKERS']))"
    assert runner.invoke(app, ["run", "--compile-workers", "5", "--", sys.executable, "-c", echo]).exit_code == 5
    refused = runner.invoke(app, ["run", "--compile-workers", "-1", "--", sys.executable, "-c", "pass"])
    assert refused.exit_code == 2 and "compile-workers" in refused.output


def _elsewhere(tmp_path, monkeypatch):
    """Run from a folder where the script's module does not import (and forget any imported copy)."""
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.delitem(sys.modules, "mykernels", raising=False)


def test_the_tools_see_captured_kernels_and_a_bundle_serves_them_without_a_database(
    script, tmp_db, tmp_path, monkeypatch
):
    _run(script, _env(TUNESVC_CAPTURE="1", TUNESVC_DB=tmp_db))
    runner = CliRunner()
    key = "n=333,x_ptr.dtype=float32,y_ptr.dtype=float32,out_ptr.dtype=float32"
    shown = runner.invoke(app, ["show", "--db", tmp_db, "--kernel", "mykernels:scale_add", "--json"])
    assert shown.exit_code == 0 and [w["shape_key"] for w in json.loads(shown.output)["winners"]] == [key]
    exact = runner.invoke(app, ["lookup", "mykernels:scale_add", "--shape", key, "--db", tmp_db, "--json"])
    assert exact.exit_code == 0, exact.output
    assert json.loads(exact.output)["source"] == "exact"
    near = runner.invoke(app, ["lookup", "mykernels:scale_add", "--shape", key.replace("333", "300"), "--db", tmp_db])
    assert near.exit_code == 0 and "nearest" in near.output
    partial = runner.invoke(app, ["lookup", "mykernels:scale_add", "--shape", "n=333", "--db", tmp_db])
    assert partial.exit_code == 1 and "config  -" not in partial.output
    assert "is not a whole key of mykernels:scale_add: its stored keys name n, x_ptr.dtype," in partial.output
    other = runner.invoke(
        app, ["lookup", "mykernels:scale_add", "--shape", key.replace("float32", "float16"), "--db", tmp_db]
    )
    assert other.exit_code == 0 and "config  -" not in other.output and "first config" in other.output
    # verify says when the module does not import, and re-measures once it does
    _elsewhere(tmp_path, monkeypatch)
    unnamed = runner.invoke(app, ["verify", "--db", tmp_db, "--json"])
    [verdict] = json.loads(unnamed.output)
    assert verdict["flags"] == ["not-measured"] and "--kernel mykernels:scale_add" in verdict["detail"]
    named = ["verify", "--db", tmp_db, "--kernel", "mykernels:scale_add", "--json"]
    unimported = runner.invoke(app, named)
    assert unimported.exit_code == 0, unimported.output
    [verdict] = json.loads(unimported.output)
    assert verdict["flags"] == ["unknown-kernel"] and "does not import" in verdict["detail"]
    monkeypatch.syspath_prepend(str(tmp_path))
    verified = runner.invoke(app, named)
    [verdict] = json.loads(verified.output)
    assert verdict["measured_ms"] is not None and "wrong" not in verdict["flags"], verdict
    report = runner.invoke(app, ["report", "--db", tmp_db, "--out", str(tmp_path / "report")])
    assert report.exit_code == 0, report.output
    assert "captured triton.autotune kernel" in (tmp_path / "report" / "report.html").read_text()
    # shipped as a bundle: served with no database, nothing measured
    bundle = tmp_path / "bundle.json"
    assert runner.invoke(app, ["export", "--db", tmp_db, "--out", str(bundle)]).exit_code == 0
    served = _run(script, _env(TUNESVC_CAPTURE="1", TUNESVC_BUNDLE=str(bundle)))
    assert served["stats"] == {"stored": 1}
    assert not (script.parent / "tune.db").exists()


def test_verify_retunes_an_edited_captured_kernel_on_its_recorded_call(script, tmp_db, tmp_path, monkeypatch):
    _run(script, _env(TUNESVC_CAPTURE="1", TUNESVC_DB=tmp_db))
    module = script.parent / "mykernels.py"
    module.write_text(
        module.read_text().replace("alpha * tl.load", "tl.load(x_ptr + offs, mask=mask) * alpha + 0 * tl.load")
    )
    _elsewhere(tmp_path, monkeypatch)
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = CliRunner()
    command = ["verify", "--db", tmp_db, "--kernel", "mykernels:scale_add", "--json"]
    [verdict] = json.loads(runner.invoke(app, command).output)
    assert verdict["flags"] == ["stale-kernel"] and verdict["retuned_config"] is None
    retuned = runner.invoke(app, [*command, "--retune"])
    assert retuned.exit_code == 0, retuned.output
    [verdict] = json.loads(retuned.output)
    assert verdict["flags"] == ["stale-kernel"] and verdict["retuned_ms"] is not None
    store = Store(tmp_db, readonly=True)
    try:
        versions = {w.kernel_version: w.config for w in store.winners(kernel="mykernels:scale_add")}
    finally:
        store.close()
    assert len(versions) == 2 and verdict["retuned_config"] in versions.values()
    assert len(trials(tmp_db)) == 12  # every listed config measured again, as the new version


def test_misses_recorded_while_serving_are_tuned_offline(script, tmp_db, tmp_path, monkeypatch):
    served = _run(script, _env(TUNESVC_CAPTURE="1", TUNESVC_MODE="lookup", TUNESVC_DB=tmp_db))
    assert served["stats"] == {"fallback": 1}
    runner = CliRunner()
    listed = runner.invoke(app, ["misses", "--db", tmp_db, "--json"])
    [miss] = json.loads(listed.output)
    assert miss["kernel"] == "mykernels:scale_add" and miss["status"] == "open"
    _elsewhere(tmp_path, monkeypatch)
    unnamed = runner.invoke(app, ["misses", "--tune", "--db", tmp_db])
    assert unnamed.exit_code == 1 and "--kernel module:qualname" in unnamed.output
    named = ["misses", "--tune", "--kernel", "mykernels:scale_add", "--db", tmp_db]
    failed = runner.invoke(app, named)
    assert failed.exit_code == 1 and "does not import" in failed.output  # not tuned: the miss stays open
    monkeypatch.syspath_prepend(str(tmp_path))
    tuned = runner.invoke(app, named)
    assert tuned.exit_code == 0 and "tuned: BLOCK=" in tuned.output, tuned.output
    assert len(trials(tmp_db)) == 6
    again = _run(script, _env(TUNESVC_CAPTURE="1", TUNESVC_MODE="lookup", TUNESVC_DB=tmp_db))
    assert again["stats"] == {"stored": 1}


def test_a_kernel_defined_inside_a_function_is_served_and_its_misses_say_where_to_tune(tmp_db):
    nested = triton.autotune(configs=CONFIGS, key=["n"])(_nested_kernel())
    n = 77
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
    with tunesvc.capture(mode="lookup", db=tmp_db):
        nested[grid(n)](x, y, out, n, 2.0)
    torch.testing.assert_close(out, 2.0 * x + y)
    name = CAPTURE.kernel_name(nested.fn)
    assert "<locals>" in name
    result = CliRunner().invoke(app, ["misses", "--tune", "--kernel", name, "--db", tmp_db])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "not tuned:" in said and "is defined inside a function" in said, said
    assert trials(tmp_db) == []


def _nested_kernel():
    @triton.jit
    def scale_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

    return scale_add


@triton.jit
def _masked_scale(x_ptr, out_ptr, BLOCK: tl.constexpr, n, scale, USE_SCALE: tl.constexpr, EVEN: tl.constexpr):
    """out = x * scale (or x); ``n`` comes after a tuned meta-parameter, so it is passed by name."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if USE_SCALE:
        x = x * scale
    tl.store(out_ptr + offs, x, mask=mask)


def test_heuristics_above_and_below_bool_and_float_keys_keyword_launches_and_fn_walkers(tmp_db):
    configs = [triton.Config({"BLOCK": b}) for b in (16, 64)]
    below = triton.heuristics({"EVEN": lambda args: args["n"] % 16 == 0})(_masked_scale)
    tuned = tunesvc.autotune(configs=configs, key=["n", "scale", "USE_SCALE"], db=tmp_db)(below)
    above = triton.heuristics({"USE_SCALE": lambda args: args["scale"] != 1.0})(tuned)
    n = 211
    x, out = torch.randn(n), torch.empty(n)
    above[grid(n)](x, out, n=n, scale=0.5)
    torch.testing.assert_close(out, 0.5 * x)
    above[grid(n)](x, out, n=n, scale=1.0)
    torch.testing.assert_close(out, x)
    keys = sorted(r.shape_key for r in trials(tmp_db, ":_masked_scale"))
    assert keys == [
        "n=211,scale=0.5,USE_SCALE=True,x_ptr.dtype=float32,out_ptr.dtype=float32",
        "n=211,scale=0.5,USE_SCALE=True,x_ptr.dtype=float32,out_ptr.dtype=float32",
        "n=211,scale=1.0,USE_SCALE=False,x_ptr.dtype=float32,out_ptr.dtype=float32",
        "n=211,scale=1.0,USE_SCALE=False,x_ptr.dtype=float32,out_ptr.dtype=float32",
    ]
    # what a library's wrapper walks: .fn down to the Python function, the name it is stored under
    fn, names = above, []
    while hasattr(fn, "fn"):
        names.append(type(fn).__name__)
        fn = fn.fn
    assert names[:3] == ["Heuristics", "CapturedKernel", "Heuristics"] and fn is _masked_scale.fn
    assert CAPTURE.kernel_name(above.fn) == f"{__name__}:_masked_scale"


@pytest.mark.gpu
def test_gpu_capture_matches_triton_autotune_and_tunes_accumulators(tmp_db):
    n = 1_000_003
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    configs = [triton.Config({"BLOCK": b}, num_warps=w) for b in (256, 1024, 4096) for w in (4, 8)]
    theirs = triton.autotune(configs=configs, key=["n"])(_scale_add)
    ours = tunesvc.autotune(configs=configs, key=["n"], db=tmp_db)(_scale_add)
    out_theirs, out_ours = torch.empty_like(x), torch.empty_like(x)
    theirs[grid(n)](x, y, out_theirs, n, 0.5)
    ours[grid(n)](x, y, out_ours, n, 0.5)
    torch.testing.assert_close(out_ours, out_theirs)
    assert {r.status for r in trials(tmp_db)} == {"ok"} and STATS["benchmarks"] == len(configs)
    total = torch.zeros(1, device="cuda")
    summed = tunesvc.autotune(configs=configs, key=["n"], reset_to_zero=["total_ptr"], db=tmp_db)(_atomic_sum)
    summed[grid(n)](x, total, n)
    torch.testing.assert_close(total, x.sum().reshape(1), rtol=1e-4, atol=1e-2)
    assert {r.status for r in trials(tmp_db, ":_atomic_sum")} == {"ok"}


def test_an_unusable_database_leaves_the_kernel_to_triton(tmp_path):
    (tmp_path / "not-a-db").write_text("this is not SQLite")
    n = 97
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
    kernel = tunesvc.autotune(configs=CONFIGS, key=["n"], db=str(tmp_path / "not-a-db"), do_bench=cpu_bench)(_scale_add)
    with pytest.warns(RuntimeWarning, match="not a SQLite database.*Triton's own autotuner"):
        kernel[grid(n)](x, y, out, n, 1.0)
    torch.testing.assert_close(out, x + y)
    assert (tmp_path / "not-a-db").read_text() == "this is not SQLite"


def test_a_key_whose_every_candidate_fails_is_counted_failed_not_tuned(tmp_db):
    """The summary calls a key tuned only where a winner was stored: one whose every candidate
    fails (each config's pre_hook raises, so it cannot launch here) is counted failed, and its
    launch raises what triton.autotune's would."""
    from tunesvc._capture import summary_line
    from tunesvc._capture import summary_record

    def cannot_launch(nargs):
        raise RuntimeError("this config cannot launch here")

    configs = [triton.Config({"BLOCK": b}, pre_hook=cannot_launch) for b in (16, 32)]
    ours = tunesvc.autotune(configs=configs, key=["n"], db=tmp_db)(_scale_add)
    n = 100
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
    with pytest.raises(RuntimeError, match="cannot launch here"):
        ours[grid(n)](x, y, out, n, 0.5)
    assert STATS["tuned"] == 0 and STATS["failed"] == 1
    line = summary_line([summary_record()])
    assert "0 tuned in" in line and "1 failed (no candidate ran correctly)" in line, line
