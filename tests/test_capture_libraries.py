"""Real libraries' triton.autotune kernels (fla-core, liger-kernel; test extra), unmodified,
under capture: in this process (tunesvc.capture), in a process started with TUNESVC_CAPTURE=1,
in four processes started at once, and through ``tune run``.

The cases are in ``_library_kernels.py``, which also runs as the child processes' script and
imports no tunesvc. Outputs are checked against float64 torch; the store must hold exactly one
ok trial per listed config per key (no wrong_result: a config that disagreed with the first
valid one on these kernels would be a capture bug, not the library's), and a process reading
a store that has every key must measure nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import torch
from _capture import trials_by_kernel
from _library_kernels import CASES
from _library_kernels import CONFIGS
from _library_kernels import run

import tunesvc
from tunesvc._capture import STATS
from tunesvc.store import Store

SCRIPT = str(Path(__file__).with_name("_library_kernels.py"))

#: relative error against float64 torch: every case computes in float32
TOLERANCE = 1e-5


def _expected_trials(cases: list[str], results: list[dict]) -> dict[str, Counter[str]]:
    """One ok trial per config per key; each case is one key of its kernel."""
    expected: dict[str, Counter[str]] = {}
    for case, result in zip(cases, results):
        expected.setdefault(result["kernel"], Counter())["ok"] += CONFIGS[case]
    return expected


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNESVC_")}
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"  # the libraries' kernels are jitted at import: set it before
    return env | extra


def _results(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _check(results: list[dict], cases: list[str]) -> None:
    assert [r["case"] for r in results] == cases
    for r in results:
        assert r["rel_error"] <= TOLERANCE, r


def _stored_winners(db: str) -> dict[tuple[str, str], dict]:
    store = Store(db)
    try:
        return {(w.kernel, w.shape_key): w.config for w in store.winners()}
    finally:
        store.close()


def test_library_kernels_under_capture_match_torch_and_are_tuned_once(tmp_db):
    """In-process capture tunes every key once (all trials ok) and launches correct outputs;
    a second round, then a second process started with TUNESVC_CAPTURE=1, measure nothing and
    launch the same configs; so does a process served by the exported bundle alone."""
    cases = list(CASES)
    STATS.clear()
    with tunesvc.capture(db=tmp_db):
        first = [run(case) for case in cases]
    _check(first, cases)
    expected = _expected_trials(cases, first)
    assert trials_by_kernel(tmp_db) == expected
    # each distinct config measured once (torchao lists two of its configs twice)
    assert STATS["benchmarks"] == sum(CONFIGS[case] for case in cases)
    winners = _stored_winners(tmp_db)
    assert len(winners) == len(cases)  # one winner per key

    with tunesvc.capture(db=tmp_db):
        again = [run(case) for case in cases]
    _check(again, cases)
    assert [r["config"] for r in again] == [r["config"] for r in first]

    child = subprocess.run(
        [sys.executable, SCRIPT, *cases],
        env=_child_env(TUNESVC_CAPTURE="1", TUNESVC_DB=tmp_db),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    second = _results(child.stdout)
    _check(second, cases)
    assert [r["config"] for r in second] == [r["config"] for r in first]
    assert trials_by_kernel(tmp_db) == expected  # the second process measured nothing
    assert _stored_winners(tmp_db) == winners

    # shipped as a bundle, the winners serve a process that has no database at all
    bundle = str(Path(tmp_db).with_name("bundle.json"))
    export = subprocess.run(
        [sys.executable, "-m", "tunesvc", "export", "--db", tmp_db, "--out", bundle],
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert export.returncode == 0, export.stderr[-3000:]
    elsewhere = Path(tmp_db).parent / "elsewhere"  # where a default ./tune.db would appear
    elsewhere.mkdir()
    served = subprocess.run(
        [sys.executable, SCRIPT, *cases],
        env=_child_env(TUNESVC_CAPTURE="1", TUNESVC_BUNDLE=bundle),
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert served.returncode == 0, served.stderr[-3000:]
    third = _results(served.stdout)
    _check(third, cases)
    assert [r["config"] for r in third] == [r["config"] for r in first]
    assert list(elsewhere.iterdir()) == []  # served from the bundle: no database made


def test_four_processes_at_once_tune_each_key_once_and_agree(tmp_db):
    """Four processes missing the same keys at the same moment (three by TUNESVC_CAPTURE=1,
    one by ``tune run``): configs x keys trials in all, not four times that, and every process
    launches the stored winner."""
    cases = ["fla_softmax", "liger_gather"]
    script = [sys.executable, SCRIPT, *cases]
    commands = [script] * 3 + [[sys.executable, "-m", "tunesvc", "run", "--db", tmp_db, "--", *script]]
    children = [
        subprocess.Popen(
            command,
            env=_child_env(TUNESVC_CAPTURE="1", TUNESVC_DB=tmp_db),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    outputs = [child.communicate(timeout=600) for child in children]
    for child, (_, stderr) in zip(children, outputs):
        assert child.returncode == 0, stderr[-3000:]
    runs = [_results(stdout) for stdout, _ in outputs]
    for results in runs:
        _check(results, cases)
    assert trials_by_kernel(tmp_db) == _expected_trials(cases, runs[0])
    chosen = [[r["config"] for r in results] for results in runs]
    assert chosen == [chosen[0]] * 4, chosen
    winners = _stored_winners(tmp_db)
    assert len(winners) == len(cases)
    for result in runs[0]:
        (stored,) = [config for (kernel, _), config in winners.items() if kernel == result["kernel"]]
        assert {k: stored.get(k) for k in result["config"]} == result["config"]


def test_lookup_mode_serves_a_library_kernel_without_measuring_and_records_the_miss(tmp_db):
    """``tune run --mode lookup`` on a database with no winners: the first listed config,
    correct output, nothing measured, the miss listed by ``tune misses``."""
    cases = ["fla_softmax", "liger_gather"]
    Store(tmp_db).close()  # the serving database exists, without winners for these keys
    child = subprocess.run(
        [sys.executable, "-m", "tunesvc", "run", "--mode", "lookup", "--db", tmp_db, "--", sys.executable, SCRIPT]
        + cases,
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    results = _results(child.stdout)
    _check(results, cases)
    from fla.ops.utils.softmax import softmax_fwd_kernel
    from liger_kernel.ops.fused_moe_kernels import _token_gather_weighted_sum_kernel

    for result, kernel in zip(results, [softmax_fwd_kernel, _token_gather_weighted_sum_kernel]):
        first = kernel.configs[0]
        assert result["config"] == {**first.kwargs, "num_warps": first.num_warps, "num_stages": first.num_stages}
    assert trials_by_kernel(tmp_db) == {}
    listing = subprocess.run(
        [sys.executable, "-m", "tunesvc", "misses", "--db", tmp_db],
        env=_child_env(COLUMNS="400"),  # rich wraps table cells at the default 80
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listing.returncode == 0, listing.stderr[-3000:]
    for result in results:
        assert result["kernel"] in listing.stdout
