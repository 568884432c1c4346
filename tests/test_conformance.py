"""Real libraries' own test suites (the selections of benchmarks/conformance.py that run under
Triton's interpreter), each run without capture, under capture on a fresh database, and again
on that database: every test has the same outcome in the three runs, the first capture run
tunes (trials stored) and the second measures nothing.

The test files come from each library's sdist on the package index (fetched once into the
git-ignored .conformance/ folder); the libraries themselves are pinned in the ``test`` extra.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import tunesvc

# benchmarks/ is a folder of scripts, not a package: the benchmark's own table and runner, imported
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import conformance

CPU_LIBRARIES = [lib for lib in conformance.LIBRARIES if lib.cpu]


def test_at_least_two_libraries_run_under_the_interpreter():
    assert len(CPU_LIBRARIES) >= 2
    assert all(lib.source == "sdist" for lib in CPU_LIBRARIES)  # CI reaches the package index only


@pytest.mark.parametrize("lib", CPU_LIBRARIES, ids=lambda lib: lib.name)
def test_a_library_suite_has_the_same_outcomes_with_capture_and_is_measured_once(lib, tmp_path):
    try:
        conformance.fetch(lib)
    except conformance.FetchError as exc:
        pytest.fail(f"{lib.name}'s own tests are needed from the package index: {exc}")
    why = conformance.installed(lib, conformance.base_env(interpreter=True))
    assert why is None, f"{why}; the test extra pins it (pip install -e '.[test]')"

    result = conformance.conform(lib, tmp_path, conformance.TIMEOUT, interpreter=True)
    logs = {name: (tmp_path / f"{lib.name}.{name}.log").read_text()[-3000:] for name in result.runs}
    assert result.status == "ok", (result.status, logs)
    plain = result.runs["plain"].outcomes
    assert plain and all(outcome == "passed" for outcome in plain.values()), (plain, logs["plain"])
    assert result.same_outcome, (
        [(t, [r.outcomes.get(t) for r in result.runs.values()]) for t in result.differing],
        logs,
    )
    assert result.trials[0] > 0, "the first capture run stored no trial: capture never took over"
    assert result.runs["capture_first"].stats.get("tuned", 0) > 0
    assert result.nothing_measured_again, (result.trials, result.sweeps)
    second = result.runs["capture_second"].stats
    assert second.get("stored", 0) > 0 and not second.get("benchmarks") and not second.get("tuned"), second


def test_outcomes_are_read_per_test_from_junit_xml(tmp_path):
    junit = tmp_path / "run.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="t.test_a" name="test_ok" />'
        '<testcase classname="t.test_a" name="test_bad"><failure message="x" /></testcase>'
        '<testcase classname="t.test_a" name="test_gpu"><skipped message="no GPU" /></testcase>'
        '<testcase classname="t.test_a" name="test_ok" ><error message="teardown" /></testcase>'
        "</testsuite></testsuites>"
    )
    assert conformance.outcomes_of(junit) == {
        "t.test_a::test_ok": "passed+error",
        "t.test_a::test_bad": "failed",
        "t.test_a::test_gpu": "skipped",
    }
    assert conformance.outcomes_of(tmp_path / "absent.xml") == {}


def test_a_test_whose_outcome_differs_or_a_trial_in_the_third_run_fails_the_suite():
    lib = CPU_LIBRARIES[0]
    same = {"a::x": "passed", "a::y": "skipped"}
    runs = {name: conformance.Run(1.0, 0, dict(same)) for name in ("plain", "capture_first", "capture_second")}
    ok = conformance.Conformance(lib, runs, trials=(5, 5), sweeps=(1, 1))
    assert ok.same_outcome and ok.nothing_measured_again and not ok.differing
    runs["capture_first"] = conformance.Run(1.0, 1, {"a::x": "failed", "a::y": "skipped"})
    runs["capture_second"] = conformance.Run(1.0, 0, {**same, "a::z": "passed"})
    differs = conformance.Conformance(lib, runs, trials=(5, 6), sweeps=(1, 2))
    assert differs.differing == ["a::x", "a::z"]
    assert not differs.same_outcome and not differs.nothing_measured_again
    runs["capture_second"] = conformance.Run(1.0, None, dict(same))  # killed at its time limit
    assert not conformance.Conformance(lib, runs, trials=(5, 5), sweeps=(1, 1)).same_outcome


def test_results_page_shows_the_latest_conformance_run_per_library_and_device(tmp_path):
    import results_page

    path = tmp_path / "conformance.csv"
    base = dict.fromkeys(conformance.COLUMNS, "") | {"library": "lib", "version": "1", "device": "GPU A"}
    rows = [
        base | {"timestamp": "2030-01-01T00:00:00Z", "tests": "3", "passed": "3", "failed": "0", "skipped": "0",
                "same_outcome": "True", "run_plain_s": "10", "run_capture_first_s": "8",
                "run_capture_second_s": "4", "trials_first": "12", "trials_second_new": "0", "status": "ok"},
        base | {"timestamp": "2030-01-02T00:00:00Z", "tests": "3", "passed": "2", "failed": "1", "skipped": "0",
                "same_outcome": "False", "differing": "t::a", "run_plain_s": "10", "run_capture_first_s": "12",
                "run_capture_second_s": "5", "trials_first": "12", "trials_second_new": "2", "status": "ok"},
        base | {"library": "other", "timestamp": "2030-01-02T00:00:00Z", "status": "not installed"},
    ]  # fmt: skip
    conformance.append_rows(path, rows)
    page = "\n".join(results_page._conformance(path))
    assert (
        "| lib | 1 | GPU A | 2030-01-02 | 3: 2 / 1 / 0 | **no** | 10.0 | 12.0 (1.20) | 5.0 (0.50) | 12 | **2** | ok |"
        in page
    )
    assert "2030-01-01" not in page
    assert "| other | 1 | GPU A | 2030-01-02 |  |  |  |  |  |  |  | not installed |" in page
    assert "- lib (GPU A): t::a" in page


def test_runs_cut_short_by_the_budget_say_so_not_timed_out(tmp_path):
    """A run given less than --timeout because the --budget ran out is killed at the deadline;
    the row says the budget stopped it, not that the library's run took longer than --timeout."""
    lib = CPU_LIBRARIES[0]
    try:
        conformance.fetch(lib)
    except conformance.FetchError as exc:
        pytest.fail(f"{lib.name}'s own tests are needed from the package index: {exc}")
    result = conformance.conform(lib, tmp_path, 600, interpreter=True, deadline=time.monotonic() + 1.0)
    assert all(run.returncode is None for run in result.runs.values())
    assert result.status == "stopped where the --budget ran out: plain, capture_first, capture_second"


@pytest.mark.parametrize(
    "lib", [lib for lib in conformance.LIBRARIES if lib.source == "sdist"], ids=lambda lib: lib.name
)
def test_a_library_from_its_sdist_ships_the_test_files_its_selection_names(lib):
    """The GPU-only selections too: each node id's or path's file is in the release's sdist, and
    what the library needs beyond the image's packages is pinned (its wheel is fetched with it)."""
    try:
        where = conformance.fetch(lib)
    except conformance.FetchError as exc:
        pytest.fail(f"{lib.name}'s own tests are needed from the package index: {exc}")
    for test in lib.tests:
        assert (where / test.partition("::")[0]).exists(), f"{lib.name} {lib.version} has no {test}"
    assert all("==" in need for need in lib.needs), lib.needs


@triton.jit
def _shifted_copy(x_ptr, out_ptr, n, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    """out[i + SHIFT] = x[i]: with SHIFT 1, a config that writes its results one place off."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs + SHIFT, tl.load(x_ptr + offs, mask=mask), mask=mask)


def test_rejected_candidates_are_counted_per_kernel_with_their_reasons_and_shown_per_tree(tmp_path):
    import results_page

    db = tmp_path / "lib.db"
    configs = [triton.Config({"SHIFT": s, "BLOCK": b}) for s, b in ((0, 16), (1, 32), (0, 64), (1, 64))]
    kernel = tunesvc.autotune(configs=configs, key=["n"], db=str(db))(_shifted_copy)
    x, out = torch.rand(200) + 1.0, torch.zeros(201)
    kernel[lambda meta: (triton.cdiv(200, meta["BLOCK"]),)](x, out, 200)

    [found] = conformance.rejections(db)
    assert found.kernel.endswith(":_shifted_copy") and (found.trials, found.rejected) == (4, 2)
    lib = CPU_LIBRARIES[0]
    runs = {"capture_first": conformance.Run(1.0, 0, {"t::a": "passed"})}
    result = conformance.Conformance(lib, runs, trials=(4, 4), sweeps=(1, 1), rejected=[found])
    assert not result.complete
    common = {"device": "GPU A", "tunesvc_tree": "this checkout", "tunesvc_commit": "new", "run": "2030-01-02"}
    [row] = conformance.rejection_rows(result, lib, common)
    assert (row["candidates"], row["rejected"], row["status"]) == (4, 2, "ok")
    assert row["reasons"].startswith("2 x tensor argument 1 (out_ptr): relative error "), row["reasons"]
    [none] = conformance.rejection_rows(None, lib, common, "not installed")
    assert (none["kernel"], none["status"]) == ("", "not installed")

    path = tmp_path / "rejections.csv"
    before = row | {"tunesvc_commit": "old (f744484^)", "run": "2030-01-01", "candidates": 4, "rejected": 3}
    conformance.append_rows(path, [before, row], conformance.REJECTION_COLUMNS)
    page = "\n".join(results_page._rejections(path))
    assert f"| {lib.name} | {found.kernel} | 4 / **3** | 4 / **2** |" in page  # the older tree first
    assert "| library | kernel | tunesvc old (f744484^) | tunesvc new |" in page
    assert (
        f"Rejections with tunesvc new on GPU A (trials x reason: a message):\n\n- {lib.name} `{found.kernel}`: 2 x"
        in page
    )
    assert "did not finish" not in page
    stopped = row | {"tunesvc_commit": "newer", "run": "2030-01-03", "status": "timed out after 240 s: capture_first"}
    conformance.append_rows(path, [stopped], conformance.REJECTION_COLUMNS)
    page = "\n".join(results_page._rejections(path))
    assert (
        f"- {lib.name} with tunesvc newer: timed out after 240 s: capture_first; the counts are of the kernels" in page
    )
    with pytest.raises(SystemExit, match="columns"):
        conformance.append_rows(path, [row])  # the conformance table's columns: refused, nothing appended


def test_run_b_alone_with_another_tunesvc_tree_captures_with_that_tree(tmp_path):
    """``--runs b --tunesvc TREE``: a tree exported at a commit (f744484^ on the GPU; HEAD here)
    is installed apart and captures run (b); its database is read for the rejection counts."""
    lib = next(lib for lib in CPU_LIBRARIES if lib.name == "conch-triton-kernels")
    try:
        conformance.fetch(lib)
    except conformance.FetchError as exc:
        pytest.fail(f"{lib.name}'s own tests are needed from the package index: {exc}")
    tree = conformance.export_tree("HEAD", tmp_path / "cache")
    assert (tree / "tunesvc" / "__init__.py").exists() and not (tree / "tests").exists()
    installed = conformance.install_tree(tree, tmp_path)
    result = conformance.conform(lib, tmp_path, conformance.TIMEOUT, True, runs_of="b", tunesvc_path=installed)
    assert list(result.runs) == ["capture_first"] and result.status == "ok", result.status
    assert result.runs["capture_first"].stats["tunesvc_from"].startswith(str(installed))
    assert result.rejected and sum(r.trials for r in result.rejected) == result.trials[0] > 0
    head = subprocess.run(["git", "-C", str(conformance.ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert conformance.tree_commit(tree) == f"{head.stdout.strip()[:12]} (HEAD)"
