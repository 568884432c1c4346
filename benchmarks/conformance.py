"""Real libraries' own test suites, run unmodified without capture and twice under it.

    python benchmarks/conformance.py fetch [--wheels]        # test files (and GPU wheels) into .conformance/
    python benchmarks/conformance.py [run] [--libraries liger-kernel conch-triton-kernels] [--out DIR]
    python benchmarks/conformance.py tree f744484^            # that commit's tunesvc into .conformance/trees/
    python benchmarks/conformance.py run --runs b --tunesvc .conformance/trees/COMMIT   # run (b) with it

For each library of LIBRARIES (pip name, pinned version, where its test files come from, which
of them run), pytest runs the selection three times, each in a fresh process: (a) without
capture, (b) with ``TUNESVC_CAPTURE=1`` on a fresh SQLite database, (c) again on that database.
Per-test outcomes come from pytest's JUnit XML; the suite conforms when every test has the same
outcome in all three runs and run (c) adds no trial and no sweep to the database (nothing
measured). Wall times of the three runs are recorded beside them; the speed requirement is that
(b) takes no longer than (a) (``SLOWER_BY`` allows for the spread of a test run's wall time).
Rows go to benchmarks/data/conformance.csv; benchmarks/RESULTS.md shows the latest per library.

Run (b)'s database is read (``Store.rejected_trials``, before run (c)) for each captured kernel's
candidates measured and those stored as ``wrong_result``, with their reasons: one row per kernel
in benchmarks/data/conformance_rejections.csv, naming the tunesvc tree and its commit. ``--runs b``
runs (b) alone (rejection rows only); ``--tunesvc TREE`` makes the runs capture with another
tunesvc source tree (``tree REVISION`` exports one of this checkout's commits), installed apart
and put first on their PYTHONPATH: the counts before and after a change of capture's check.
benchmarks/conformance-gpu.sh runs all of it on the GPU machine.

Test files are each library's own, at the release that matches the pinned version: extracted
from its sdist on the package index where the sdist ships them, else from a mirror of its
repository at the release tag (``--mirror``: folders ``owner+name/repo`` holding bare git
repositories). ``fetch`` puts them under .conformance/sources/ (git-ignored), which travels to
a machine without network (``carry``); with ``--wheels`` it also downloads the pinned libraries
as CPython 3.12 wheels into .conformance/wheels/ for the GPU machine's offline install.

Every run loads benchmarks/pytest_plugins/conformance_plugin.py (it gives triton.autotune a
benchmarker under the interpreter and turns capture on where no .pth hook runs). Without a GPU
only the libraries whose selection runs under Triton's interpreter are run (TRITON_INTERPRET=1).
A library that is missing, of another version, or does not import gets a row that says so.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.metadata
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = ROOT / ".conformance"
CSV = HERE / "data" / "conformance.csv"
REJECTIONS_CSV = HERE / "data" / "conformance_rejections.csv"
PLUGINS = HERE / "pytest_plugins"
MIRROR = Path("/work/.mirror")
#: a pytest run's wall time varies by a few percent between identical runs
SLOWER_BY = 1.05
#: seconds one pytest run may take (--timeout overrides)
TIMEOUT = 240
#: the three runs by their letters in --runs: (a) without capture, (b) on a fresh database, (c) again
RUNS = {"a": ("plain", False), "b": ("capture_first", True), "c": ("capture_second", True)}

COLUMNS = (
    "timestamp",
    "run",
    "library",
    "version",
    "device",
    "torch",
    "triton",
    "tests",
    "passed",
    "failed",
    "skipped",
    "same_outcome",
    "differing",
    "run_plain_s",
    "run_capture_first_s",
    "run_capture_second_s",
    "trials_first",
    "trials_second_new",
    "sweeps_first",
    "sweeps_second_new",
    "status",
)

#: per library and captured kernel, what run (b) measured and stored as wrong_result
REJECTION_COLUMNS = (
    "timestamp",
    "run",
    "library",
    "version",
    "device",
    "torch",
    "triton",
    "tunesvc_tree",
    "tunesvc_commit",
    "kernel",
    "kernel_version",
    "candidates",
    "rejected",
    "reasons",
    "status",
)


@dataclass(frozen=True)
class Library:
    """One library's test selection. ``source`` is ``sdist`` (the package index) or
    ``git:OWNER/NAME@TAG`` (a mirror of its repository); ``paths`` are extracted from it, and
    pytest runs ``tests`` (paths or node ids, relative to the extracted root) with ``select``
    as ``-k`` and ``env`` added to the environment of all three runs. ``cpu``: the selection
    passes under Triton's interpreter. ``needs``: pinned pip specs of what the library or its
    tests import beyond torch, triton, transformers, einops and pytest (fetched as wheels too)."""

    name: str
    version: str
    module: str
    source: str
    paths: tuple[str, ...]
    tests: tuple[str, ...]
    covers: str
    select: str | None = None
    cpu: bool = False
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    needs: tuple[str, ...] = ()


#: in the order they run: where a time budget stops the run, the libraries that cover the most
#: (host TMA descriptors, configs built by a pruner, fp8 outputs) have run first
LIBRARIES = [
    Library(
        "flag-gems",
        "5.0.2",
        "flag_gems",
        "git:flagos-ai/FlagGems@v5.0.2",
        ("tests/",),
        ("tests/test_mm.py", "tests/test_w8a8_block_fp8_matmul.py"),
        "host TMA descriptors (its Hopper mm builds TensorDescriptors and a config pre_hook sets their "
        "block shape); FlagGems' LibTuner, an Autotuner subclass with its own pruning; an fp8 block GEMM",
        # float16 (dtype0) only, one shape per test: each key compiles every config twice (runs a and b)
        select="(test_mm and dtype0-15-160-1024 and not self_transpose) or (w8a8 and (128-256-512 or 64-128-128))",
    ),
    Library(
        "gemlite",
        # 0.5.x's own test file imports a name its gemlite.core no longer has (scale_activations):
        # it fails to collect at its own release, with or without capture
        "0.4.8",
        "gemlite",
        "sdist",
        ("tests/",),
        ("tests/test_gemlitelineartriton.py",),
        "an early_config_prune that builds new triton.Configs (block sizes fitted to M, N, K, the group "
        "size and shared memory); fp8 x fp8 GEMMs; restore_value on its GEMV kernels",
        select="fp16xfp16 or fp8xfp8 or fp16xWn_asymmetric",
    ),
    Library(
        "torchao",
        "0.18.0",
        "torchao",
        "git:pytorch/ao@v0.18.0",
        ("test/prototype/blockwise_fp8_training/",),
        ("test/prototype/blockwise_fp8_training/test_blockwise_kernels.py",),
        "fp8 outputs (blockwise float8_e4m3fn quantisation of activations, 45 configs keyed on K) and "
        "fp8 GEMMs autotuned on N and K",
        # one block size and two shapes: the quantisation kernels list 45 configs, compiled per key
        select="act_quant_lhs[128 or act_quant_rhs[128 or 1x128_128x128[dtype0-2-512-128 "
        "or 1x128_128x128[dtype0-3-2048-2048",
    ),
    Library(
        "cut-cross-entropy",
        "25.1.1",
        "cut_cross_entropy",
        "sdist",
        ("tests/",),
        ("tests/test_cce_lse.py", "tests/test_cce_loss_backward.py", "tests/test_cce_indexed_dot.py"),
        "an autograd Function (linear cross-entropy, forward and backward); early_config_prune with a "
        "perf_model and top_k; restore_value (LSE) and reset_to_zero (dE, dC, Out) outputs updated in place",
        select="shape1 and not torch_compile and not dtype0",
        # the library's own switch from one fixed config to its triton.autotune kernels
        env=(("CCE_AUTOTUNE", "1"),),
    ),
    Library(
        "fla-core",
        "0.5.2",
        "fla",
        "git:fla-org/flash-linear-attention@v0.5.2",
        ("tests/",),
        # node ids, a shape or two each: the 26 tests of a -k over these three files compile every
        # config of each new key and passed 200 s without capture on an H200
        (
            "tests/modules/test_conv.py::test_conv_decoding[B2_T64_D128_W3_activationswish_has_biasTrue_has_residualTrue_torch.float32]",
            "tests/modules/test_conv.py::test_conv_decoding[B2_T64_D128_W3_activationNone_has_biasTrue_has_residualFalse_torch.float16]",
            "tests/ops/utils/test_cumsum.py::test_global_reversed_cumsum[B2-T500-H4-D60-torch.float32]",
            "tests/modules/test_l2norm.py::test_l2norm[B2-T500-H4-D64-torch.float32]",
            "tests/modules/test_l2norm.py::test_l2norm[B4-T1024-H5-D1024-torch.bfloat16]",
        ),
        "autograd Functions (l2norm, causal conv1d); a decode step that rolls its cache in place "
        "(restore_value) on fla's own Autotuner subclass; @triton.heuristics above the autotuner",
    ),
    Library(
        "liger-kernel",
        "0.8.5",
        "liger_kernel",
        "sdist",
        # the tests' shared helpers and conftest, without test/resources (27 MB of data sets)
        ("test/__init__.py", "test/conftest.py", "test/utils.py", "test/transformers/"),
        ("test/transformers/test_fused_moe.py",),
        "an autograd Function (LigerFusedMoEFunction): forward through a 40-config token gather-sum "
        "autotuned on H_dim, K_dim and a bool, backward through kernels that accumulate with atomic adds "
        "into outputs they reset_to_zero",
        # float32 only: the bfloat16 case fails under the interpreter with capture off as well
        select="test_single_token or (test_correctness and dtype0 and 7-4-64-32-2)",
        cpu=True,
    ),
    Library(
        "late-interaction-kernels",
        "0.4.5",
        "late_interaction_kernels",
        "sdist",
        ("tests/",),
        (
            "tests/test_fp8.py::test_maxsim_fp8_parity[tensor-token-Nq2_Nd8_Lq32_Ld128_d128]",
            "tests/test_fp8.py::test_maxsim_fp8_parity[token-tensor-Nq2_Nd8_Lq32_Ld128_d128]",
            "tests/test_backward.py::test_grad_parity_fp16[2-4-16-32-128]",
            "tests/test_backward.py::test_grad_parity_fp16[4-8-32-128-128]",
            "tests/test_varlen.py::test_varlen_backward_matches_padded[q_lens0-d_lens0-128]",
        ),
        "bool keys (the fp8 MaxSim kernel is keyed on SCALE_Q_PER_TOKEN and SCALE_D_PER_TOKEN); "
        "early_config_prune by shared memory; an autograd Function whose backward kernels "
        "reset_to_zero the gradients they accumulate into; cache_results=True (Triton's own disk cache)",
        # node ids, one or two shapes per kernel family: its tests hard-code device="cuda" (GPU only)
    ),
    Library(
        "siglip-kernel",
        "0.1.2",
        "siglip_kernel",
        "sdist",
        ("tests/",),
        (
            "tests/test_correctness.py::test_fully_fused_loss[64-128]",
            "tests/test_correctness.py::test_fully_fused_gradients[64-128]",
            "tests/test_gpu_kernels.py::test_autotuned_fused_loss[128-256]",
            "tests/test_gpu_kernels.py::test_autotuned_fused_gradients[64-128]",
            "tests/test_new_backends.py::test_chunked_epilogue_parity",
            "tests/test_new_backends.py::test_chunked_epilogue_fp8_parity",
            "tests/test_new_backends.py::test_epilogue_repeat_calls_consistent",
        ),
        "autograd Functions (a fused SigLIP loss, forward and backward in one kernel) whose autotuned "
        "kernels reset_to_zero their gradient and loss outputs; early_config_prune on B and D; a GEMM "
        "with a BCE epilogue (bf16 and fp8) that writes per-program partial sums it reset_to_zero",
        # one shape per test: each (B, D) is a new key; the package imports CUDA state (GPU only)
    ),
    Library(
        "mase-triton",
        "0.0.7",
        "mase_triton",
        "sdist",
        ("test/",),
        ("test/test_optical_compute_quantized_core.py",),
        "kernels launched from torch.library custom ops (quantised linear and bmm, forward and backward "
        "through register_autograd) autotuned on M, N, K, with bool constexprs (USE_BIAS, SKIP_QUANTIZE) "
        "and a seed they advance",
        # its ops' CPU implementations are PyTorch code: under the interpreter no Triton kernel runs,
        # so the selection is the GPU's (the cuda-parametrised cases launch the Triton kernels)
        needs=("colorlog==6.12.0",),
    ),
    Library(
        "conch-triton-kernels",
        "1.3",
        "conch",
        "sdist",
        ("tests/",),
        # node ids: a -k on "10" also picks 100 and 1000 boxes, too many for the interpreter
        tuple(f"tests/nms_test.py::test_nms_conch_vs_reference[{p}]" for p in ("0-0.2-10", "1-0.5-10", "2-0.8-100")),
        "non-max suppression: a 5-config IoU-mask kernel keyed on num_boxes whose int mask later "
        "kernels read; the test seeds every RNG itself and compares kept indices exactly",
        cpu=True,
    ),
]
BY_NAME = {lib.name: lib for lib in LIBRARIES}


class FetchError(RuntimeError):
    """A library's test files could not be had; the message says why and what to do."""


def _interpreter() -> bool:
    """Whether runs use Triton's interpreter: no GPU, or TRITON_INTERPRET=1 already set."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    import torch

    return not torch.cuda.is_available()


# -- test files ----------------------------------------------------------------------------------
def source_dir(lib: Library, cache: Path = CACHE) -> Path:
    return cache / "sources" / f"{lib.name}-{lib.version}"


def fetch(lib: Library, cache: Path = CACHE, mirror: Path = MIRROR) -> Path:
    """The folder holding ``lib``'s test files (its ``paths``), extracted once from its sdist on
    the package index or from its mirrored repository at the release tag."""
    dest = source_dir(lib, cache)
    done = dest / ".complete"
    if done.exists():
        return dest
    with tempfile.TemporaryDirectory(prefix="conformance-") as tmp:
        staging = Path(tmp) / "tree"
        staging.mkdir()
        if lib.source == "sdist":
            _extract_sdist(lib, Path(tmp), staging)
        elif lib.source.startswith("git:"):
            _extract_git(lib, mirror, staging)
        else:
            raise FetchError(f"{lib.name}: unknown source {lib.source!r}.")
        missing = [p for p in lib.paths if not (staging / p).exists()]
        if missing:
            raise FetchError(f"{lib.name} {lib.version}: its {lib.source} has no {', '.join(missing)}.")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():  # a fetch interrupted before .complete
            shutil.rmtree(dest)
        staging.rename(dest)
    done.write_text(f"{lib.name}=={lib.version} from {lib.source}\n")
    return dest


def _extract_sdist(lib: Library, tmp: Path, dest: Path) -> None:
    download = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(tmp)]
        + [f"{lib.name}=={lib.version}"],
        capture_output=True,
        text=True,
    )
    archives = sorted(tmp.glob("*.tar.gz"))
    if download.returncode != 0 or not archives:
        tail = "\n".join(line for line in download.stderr.splitlines() if not line.startswith("WARNING: Location"))
        raise FetchError(
            f"Cannot download the sdist of {lib.name}=={lib.version} from the package index "
            f"(pip exit {download.returncode}): {tail[-1500:]}"
        )
    with tarfile.open(archives[0]) as tar:
        members = []
        for member in tar.getmembers():
            _, _, inner = member.name.partition("/")  # an sdist's files sit under NAME-VERSION/
            if any(inner == p.rstrip("/") or inner.startswith(p) for p in lib.paths):
                member.name = inner
                members.append(member)
        tar.extractall(dest, members=members, filter="data")


def _extract_git(lib: Library, mirror: Path, dest: Path) -> None:
    repo, _, tag = lib.source.removeprefix("git:").partition("@")
    git_dir = mirror / repo.replace("/", "+") / "repo"
    if not git_dir.is_dir():
        raise FetchError(
            f"{lib.name}'s test files come from {repo} at {tag}, and {git_dir} holds no mirror of it; "
            f"clone it there (git clone --bare) or pass --mirror."
        )
    archive = subprocess.run(
        ["git", "--git-dir", str(git_dir), "archive", "--format=tar", tag, "--", *lib.paths],
        capture_output=True,
    )
    if archive.returncode != 0:
        raise FetchError(f"git archive {tag} of {git_dir} failed: {archive.stderr.decode()[-500:]}")
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, capture_output=True)
    if untar.returncode != 0:
        raise FetchError(f"Cannot extract {repo}@{tag}: {untar.stderr.decode()[-500:]}")


def fetch_wheels(libs: list[Library], cache: Path = CACHE) -> Path:
    """CPython 3.12 x86-64 wheels of the pinned libraries and of what they need (``needs``) for a
    machine that reaches no index (a library published only as an sdist is built into a wheel here)."""
    dest = cache / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    specs = [f"{lib.name}=={lib.version}" for lib in libs]
    specs += sorted({need for lib in libs for need in lib.needs} - set(specs))
    for spec in specs:
        binary = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version"]
            + ["3.12", "--implementation", "cp", *[f"--platform={p}" for p in platforms], "--platform=any"]
            + ["-d", str(dest), spec],
            capture_output=True,
            text=True,
        )
        if binary.returncode != 0:
            built = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), spec],
                capture_output=True,
                text=True,
            )
            if built.returncode != 0:
                raise FetchError(f"No wheel of {spec} for CPython 3.12: {built.stderr[-800:]}")
        print(f"wheel of {spec} in {dest}", flush=True)
    return dest


# -- one pytest run ------------------------------------------------------------------------------
@dataclass
class Run:
    """One pytest process: its wall time, exit status and per-test outcomes."""

    wall_s: float
    returncode: int | None  # None: killed at the time limit
    outcomes: dict[str, str]
    stats: dict[str, int] = field(default_factory=dict)


def outcomes_of(junit: Path) -> dict[str, str]:
    """Test id -> passed | failed | error | skipped, from pytest's JUnit XML. A test with an
    error in its teardown after a pass or failure gets ``<outcome>+error``."""
    try:
        root = ET.parse(junit).getroot()
    except (FileNotFoundError, ET.ParseError):  # no file, or half a file from a killed run: no outcomes
        return {}
    outcomes: dict[str, str] = {}
    for case in root.iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kinds[0]] if kinds else "passed"
        outcomes[test] = f"{outcomes[test]}+{outcome}" if test in outcomes else outcome
    return outcomes


def run_pytest(lib: Library, where: Path, env: dict[str, str], log: Path, timeout: float) -> Run:
    junit = log.with_suffix(".xml")
    stats = log.with_suffix(".stats.json")
    junit.unlink(missing_ok=True)
    stats.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", "-c", str(PLUGINS / "pytest.ini"), "--rootdir", str(where)]
    command += ["-p", "no:cacheprovider", "-p", "conformance_plugin", "-q"]
    command += ["--junitxml", str(junit), "-o", "junit_family=xunit2", *lib.args, *lib.tests]
    if lib.select:
        command += ["-k", lib.select]
    env = env | {"CONFORMANCE_STATS": str(stats)}
    start = time.perf_counter()
    with log.open("w") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        child = subprocess.Popen(command, cwd=where, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            returncode: int | None = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            returncode = None
    wall = time.perf_counter() - start
    counters = json.loads(stats.read_text()) if stats.exists() else {}
    return Run(wall, returncode, outcomes_of(junit), counters)


def stored_counts(db: Path) -> tuple[int, int]:
    """(trials, sweeps) in a tunesvc SQLite database; none when capture never opened it."""
    if not db.exists():
        return 0, 0
    connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        counts = []
        for table in ("tunesvc_trials", "tunesvc_sweeps"):
            counts.append(connection.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] if table in tables else 0)
        return counts[0], counts[1]
    finally:
        connection.close()


def rejections(db: Path) -> list[Any]:
    """Per kernel version captured into ``db``: its trials (candidates measured) and those stored
    as ``wrong_result`` by message (tunesvc's ``Store.rejected_trials``, opened read-only: a
    database written by an older tree is read at its own schema revision)."""
    if not db.exists():
        return []
    from tunesvc.store import Store

    store = Store(db, readonly=True)
    try:
        return list(store.rejected_trials())
    finally:
        store.engine.dispose()


def tree_commit(tree: Path) -> str:
    """The commit of a tunesvc source tree: ``git rev-parse`` where it is a checkout (``+dirty``
    with uncommitted changes to tracked files), else the ``.commit`` file that ``tree`` and
    ``fetch`` write beside the files (a tree carried without its .git); else ``unknown``."""
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0 and Path(tree, ".git").exists():
        dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True)  # fmt: skip
        return head.stdout.strip()[:12] + ("+dirty" if dirty.stdout.strip() else "")
    marker = tree / ".commit"
    return marker.read_text().strip() if marker.exists() else "unknown"


#: what installing a tunesvc tree reads (its tests, benchmarks and example database stay behind)
TREE_PATHS = (
    "README.md",
    "pyproject.toml",
    "setup.py",
    "_tunesvc_capture.py",
    "tunesvc-capture.pth",
    "tunesvc",
    "kernels",
    "search_spaces",
)


def export_tree(revision: str, cache: Path = CACHE) -> Path:
    """The tunesvc source tree at ``revision`` of this checkout (``git archive``), under
    .conformance/trees/COMMIT, with its commit in ``.commit``: the tree that ``--tunesvc`` runs."""
    parsed = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{revision}^{{commit}}"],
                            capture_output=True, text=True)  # fmt: skip
    if parsed.returncode != 0:
        raise FetchError(f"{revision!r} is no commit of {ROOT}: {parsed.stderr.strip()[-300:]}")
    commit = parsed.stdout.strip()[:12]
    dest = cache / "trees" / commit
    if (dest / ".commit").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, *TREE_PATHS], capture_output=True
    )
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, capture_output=True)
    if archive.returncode != 0 or untar.returncode != 0:
        raise FetchError(f"Cannot export {commit}: {(archive.stderr or untar.stderr).decode()[-300:]}")
    (dest / ".commit").write_text(f"{commit} ({revision})\n")
    return dest


def install_tree(tree: Path, work: Path) -> Path:
    """A folder where ``tree``'s tunesvc is installed (``pip install --target``, no index, no
    build isolation: it runs offline), put first on the runs' PYTHONPATH by ``--tunesvc``."""
    target = (work / f"tunesvc-{tree_commit(tree).split()[0]}").resolve()
    if (target / "tunesvc").is_dir():
        return target
    built = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation"]
        + ["--no-compile", "--target", str(target), str(tree)],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0 or not (target / "tunesvc").is_dir():
        raise FetchError(f"Cannot install the tunesvc tree {tree} (pip exit {built.returncode}): {built.stderr[-800:]}")
    return target


def base_env(interpreter: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNESVC_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PLUGINS), env.get("PYTHONPATH", "")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the extracted test folders stay as fetched
    if interpreter:
        env["TRITON_INTERPRET"] = "1"  # set before any import of triton in the child
    return env


def installed(lib: Library, env: dict[str, str]) -> str | None:
    """None when ``lib`` is installed at its pinned version and imports; else why not."""
    try:
        version = importlib.metadata.version(lib.name)
    except importlib.metadata.PackageNotFoundError:
        return f"not installed (pip install {lib.name}=={lib.version})"
    if version != lib.version:
        return f"{lib.name} {version} is installed, the suite pins {lib.version}"
    probe = subprocess.run(
        [sys.executable, "-c", f"import {lib.module}"], env=env, capture_output=True, text=True, timeout=300
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        return f"import {lib.module} fails: {last[:300]}"
    return None


@dataclass
class Conformance:
    """The three runs of one library's selection and what they show."""

    lib: Library
    runs: dict[str, Run]
    trials: tuple[int, int]  # after (b), after (c)
    sweeps: tuple[int, int]
    status: str = "ok"
    #: Store.rejected_trials of run (b)'s database, read before run (c)
    rejected: list[Any] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """All three runs were asked for (``--runs abc``): the verdicts below apply."""
        return all(name in self.runs for name, _ in RUNS.values())

    @property
    def differing(self) -> list[str]:
        plain = self.runs["plain"].outcomes
        tests = sorted(set().union(*(r.outcomes for r in self.runs.values())))
        return [
            t for t in tests if len({r.outcomes.get(t, "absent") for r in self.runs.values()}) > 1 or t not in plain
        ]

    @property
    def same_outcome(self) -> bool:
        complete = all(r.returncode is not None and r.outcomes for r in self.runs.values())
        return complete and not self.differing

    @property
    def nothing_measured_again(self) -> bool:
        return self.trials[1] == self.trials[0] and self.sweeps[1] == self.sweeps[0]

    @property
    def no_slower(self) -> bool:
        return self.runs["capture_first"].wall_s <= SLOWER_BY * self.runs["plain"].wall_s


def conform(
    lib: Library,
    work: Path,
    timeout: float,
    interpreter: bool,
    cache: Path = CACHE,
    deadline: float | None = None,
    runs_of: str = "abc",
    tunesvc_path: Path | None = None,
) -> Conformance:
    """Run ``lib``'s selection (a) without capture, (b) with it on a fresh database, (c) again
    (those of ``runs_of``; (c) needs (b)); each run stops after ``timeout`` seconds or at
    ``deadline`` (time.monotonic()), if sooner. ``tunesvc_path``: a folder holding another
    tunesvc installation, first on the runs' PYTHONPATH (``install_tree``)."""
    where = source_dir(lib, cache)
    db = work / f"{lib.name}.db"
    db.unlink(missing_ok=True)
    env = base_env(interpreter) | dict(lib.env)
    if tunesvc_path is not None:
        env["PYTHONPATH"] = os.pathsep.join((str(tunesvc_path), env["PYTHONPATH"]))
    runs: dict[str, Run] = {}
    cut: set[str] = set()  # runs given less than ``timeout`` by the deadline
    counts: list[tuple[int, int]] = []
    rejected: list[Any] = []
    for name, capture in (RUNS[letter] for letter in "abc" if letter in runs_of):
        run_env = dict(env)
        # a fresh Triton cache for (a) and for (b), so both compile everything; (c) is a later
        # process on the machine where (b) ran, and finds (b)'s compiled kernels
        cache_of = "plain" if name == "plain" else "capture"
        run_env["TRITON_CACHE_DIR"] = str(work / f"triton-cache-{lib.name}-{cache_of}")
        if capture:
            run_env |= {"TUNESVC_CAPTURE": "1", "TUNESVC_DB": str(db), "TUNESVC_MODE": "tune"}
        print(f"  {lib.name}: run {name} ...", flush=True)
        limit = timeout if deadline is None else max(1.0, min(timeout, deadline - time.monotonic()))
        if limit < timeout:
            cut.add(name)
        run = run_pytest(lib, where, run_env, work / f"{lib.name}.{name}.log", limit)
        runs[name] = run
        counted = _tally(run.outcomes)
        print(
            f"  {lib.name}: run {name}: {run.wall_s:.1f} s, exit {run.returncode}, {len(run.outcomes)} tests "
            f"({counted}){'' if not run.stats else f', capture {run.stats}'}",
            flush=True,
        )
        if capture:
            counts.append(stored_counts(db))
        if name == "capture_first":
            rejected = rejections(db)
    counts += [counts[-1] if counts else (0, 0)] * (2 - len(counts))  # (c) not run: nothing new
    status = "ok"
    timed_out = [name for name, run in runs.items() if run.returncode is None and name not in cut]
    stopped = [name for name, run in runs.items() if run.returncode is None and name in cut]
    if timed_out or stopped:
        said = [f"timed out after {timeout:.0f} s: {', '.join(timed_out)}"] if timed_out else []
        said += [f"stopped where the --budget ran out: {', '.join(stopped)}"] if stopped else []
        status = "; ".join(said)
    elif "passed" not in next(iter(runs.values())).outcomes.values():
        # a selection that fails to collect fails alike three times: the same outcome, tested nothing
        first = next(iter(runs))
        said = "without capture" if first == "plain" else f"in run {first}"
        status = f"no test passed {said} (exit {runs[first].returncode}; see {lib.name}.{first}.log)"
    elif tunesvc_path is not None and any(
        not str(r.stats.get("tunesvc_from", "")).startswith(str(tunesvc_path.resolve()))
        for r in runs.values()
        if r.stats
    ):
        found = {str(r.stats.get("tunesvc_from")) for r in runs.values() if r.stats}
        status = f"the runs captured with tunesvc from {', '.join(sorted(found))}, not from --tunesvc's {tunesvc_path}"
    elif "capture_first" in runs and counts[0][0] == 0:
        status = "run (b) stored no trial: the selection launched no autotuned kernel under capture"
    trials, sweeps = (counts[0][0], counts[1][0]), (counts[0][1], counts[1][1])
    return Conformance(lib, runs, trials, sweeps, status, rejected)


def _tally(outcomes: dict[str, str]) -> str:
    tally: dict[str, int] = {}
    for outcome in outcomes.values():
        tally[outcome] = tally.get(outcome, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(tally.items())) or "none"


# -- rows ------------------------------------------------------------------------------------------
def environment() -> dict[str, str]:
    import torch
    import triton

    import tunesvc

    return {"device": tunesvc.current_device().name, "torch": torch.__version__, "triton": triton.__version__}


def row_of(result: Conformance | None, lib: Library, common: dict[str, str], status: str = "") -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLUMNS, "") | common | {"library": lib.name, "version": lib.version}
    if result is None:
        return row | {"status": status}
    plain = result.runs["plain"].outcomes
    return row | {
        "tests": len(plain),
        "passed": sum(o == "passed" for o in plain.values()),
        "failed": sum(o.startswith(("failed", "error")) or o.endswith("error") for o in plain.values()),
        "skipped": sum(o == "skipped" for o in plain.values()),
        "same_outcome": result.same_outcome,
        "differing": " ".join(result.differing[:20]),
        "run_plain_s": f"{result.runs['plain'].wall_s:.2f}",
        "run_capture_first_s": f"{result.runs['capture_first'].wall_s:.2f}",
        "run_capture_second_s": f"{result.runs['capture_second'].wall_s:.2f}",
        "trials_first": result.trials[0],
        "trials_second_new": result.trials[1] - result.trials[0],
        "sweeps_first": result.sweeps[0],
        "sweeps_second_new": result.sweeps[1] - result.sweeps[0],
        "status": result.status,
    }


#: one reason's message as the rejections CSV keeps it (a message names tensors and figures)
REASON_CHARS = 300


def rejection_rows(
    result: Conformance | None, lib: Library, common: dict[str, str], status: str = ""
) -> list[dict[str, Any]]:
    """One row per kernel version that run (b) captured: its candidates measured, those rejected
    as ``wrong_result``, and the reasons (``trials x reason: the most frequent message``, most
    first, `` | `` between them); one row without a kernel where run (b) captured none or did not run."""
    row: dict[str, Any] = dict.fromkeys(REJECTION_COLUMNS, "") | common | {"library": lib.name, "version": lib.version}
    if result is None:
        return [row | {"status": status}]
    if not result.rejected:
        return [row | {"candidates": 0, "rejected": 0, "status": result.status}]
    from tunesvc.records import wrong_reasons

    return [
        row
        | {
            "kernel": r.kernel,
            "kernel_version": r.kernel_version,
            "candidates": r.trials,
            "rejected": r.rejected,
            "reasons": " | ".join(_reason_text(reason, n, said) for reason, n, said in wrong_reasons(r.wrong)),
            "status": result.status,
        }
        for r in result.rejected
    ]


def _reason_text(reason: str, trials: int, said: str) -> str:
    """``trials x reason: the rest of its most frequent message`` (a message starts with its reason)."""
    rest = said[len(reason) :].lstrip(": ") if said.startswith(reason) else said
    return f"{trials} x {reason}" + (f": {rest[:REASON_CHARS]}" if rest else "")


def append_rows(path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...] = COLUMNS) -> None:
    new = not path.exists()
    if not new:
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
        if tuple(header) != columns:
            raise SystemExit(f"{path}: columns {header} are not {list(columns)}; nothing appended.")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", nargs="?", choices=["run", "fetch", "tree"], default="run")
    parser.add_argument("revision", nargs="?", help="tree: the commit of this checkout to export (e.g. f744484^)")
    parser.add_argument("--libraries", nargs="+", choices=list(BY_NAME), default=None, help="default: all")
    parser.add_argument("--out", type=Path, default=None, help="logs and JUnit files (default: a temporary folder)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds one pytest run may take")
    parser.add_argument(
        "--budget", type=float, default=None, help="seconds for all libraries; those not reached get a row saying so"
    )
    parser.add_argument("--csv", type=Path, default=CSV)
    parser.add_argument("--rejections-csv", type=Path, default=REJECTIONS_CSV)
    parser.add_argument(
        "--runs",
        default="abc",
        help="which runs: a (without capture), b (capture, fresh database), c (again); b alone counts "
        "the rejected candidates; conformance rows need all three",
    )
    parser.add_argument(
        "--tunesvc",
        type=Path,
        default=None,
        help="a tunesvc source tree (see the tree action) that the runs use instead of the installed one",
    )
    parser.add_argument("--no-csv", action="store_true", help="print the results, append no rows")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where fetched test files (and wheels) go")
    parser.add_argument("--mirror", type=Path, default=MIRROR, help="folder of OWNER+NAME/repo git mirrors")
    parser.add_argument("--wheels", action="store_true", help="fetch: also CPython 3.12 wheels of the libraries")
    args = parser.parse_args()
    libs = [BY_NAME[n] for n in args.libraries] if args.libraries else list(LIBRARIES)
    runs_of = args.runs.lower()
    if not runs_of or set(runs_of) - set(RUNS) or ("c" in runs_of and "b" not in runs_of):
        parser.error(f"--runs {args.runs!r}: give letters of a, b, c (c needs b), e.g. abc or b.")

    if args.action == "tree":
        if not args.revision:
            parser.error("tree: name the commit to export, e.g. `tree f744484^`.")
        try:
            print(f"tunesvc at {args.revision}: {export_tree(args.revision, args.cache)}")
        except FetchError as exc:
            print(exc, file=sys.stderr)
            return 1
        return 0
    if args.action == "fetch":
        args.cache.mkdir(parents=True, exist_ok=True)
        # the commit of this checkout for rows written where it travels without its .git
        (args.cache / "commit").write_text(tree_commit(ROOT) + "\n")
        failed = 0
        for lib in libs:
            try:
                print(f"{lib.name} {lib.version}: test files in {fetch(lib, args.cache, args.mirror)}", flush=True)
            except FetchError as exc:
                failed += 1
                print(exc, file=sys.stderr)
        if args.wheels:
            fetch_wheels(libs, args.cache)
        return 1 if failed else 0

    interpreter = _interpreter()
    if interpreter and not args.libraries:
        libs = [lib for lib in libs if lib.cpu]
        print("Triton's interpreter: only the selections that run on the CPU.", flush=True)
    work = args.out or Path(tempfile.mkdtemp(prefix="conformance-"))
    work.mkdir(parents=True, exist_ok=True)
    tunesvc_path = None
    if args.tunesvc is not None:
        if not (args.tunesvc / "tunesvc" / "__init__.py").exists():
            parser.error(f"--tunesvc {args.tunesvc}: no tunesvc source tree there (no tunesvc/__init__.py).")
        try:
            tunesvc_path = install_tree(args.tunesvc, work)
        except FetchError as exc:
            print(exc, file=sys.stderr)
            return 1
        tree, commit = str(args.tunesvc), tree_commit(args.tunesvc)
    else:
        carried = args.cache / "commit"
        commit = tree_commit(ROOT)
        if commit == "unknown" and carried.exists():
            commit = f"{carried.read_text().strip()} (at fetch)"
        tree = "this checkout"
    started = datetime.datetime.now(datetime.UTC)
    common = environment() | {
        "timestamp": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "run": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    print(f"{common['device']}, torch {common['torch']}, triton {common['triton']}; logs in {work}", flush=True)
    print(f"tunesvc: {tree} at {commit}; runs {', '.join(RUNS[letter][0] for letter in runs_of)}", flush=True)
    tagged = common | {"tunesvc_tree": tree, "tunesvc_commit": commit}
    complete = runs_of == "abc"
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    deadline = None if args.budget is None else time.monotonic() + args.budget

    rejected_rows: list[dict[str, Any]] = []

    def record(row: dict[str, Any], rejected: list[dict[str, Any]]) -> None:
        # each library's rows as soon as they are known: a run stopped from outside keeps the rows so far
        if complete:  # a conformance row says all three runs; --runs b gives rejection rows only
            rows.append(row)
        rejected_rows.extend(rejected)
        if not args.no_csv:
            if complete:
                append_rows(args.csv, [row])
            if "b" in runs_of:
                append_rows(args.rejections_csv, rejected, REJECTION_COLUMNS)

    for lib in libs:
        print(f"{lib.name} {lib.version}: {lib.covers}", flush=True)
        if deadline is not None and deadline - time.monotonic() < 30:
            print(f"  not run: the --budget of {args.budget:.0f} s is spent", flush=True)
            why = f"not run: the --budget of {args.budget:.0f} s was spent"
            record(row_of(None, lib, common, why), rejection_rows(None, lib, tagged, why))
            failures.append(f"{lib.name}: not run (budget)")
            continue
        try:
            fetch(lib, args.cache, args.mirror)
        except FetchError as exc:
            print(f"  {exc}", flush=True)
            why = f"test files not fetched: {exc}"
            record(row_of(None, lib, common, why), rejection_rows(None, lib, tagged, why))
            failures.append(f"{lib.name}: test files not fetched")
            continue
        why = installed(lib, base_env(interpreter))
        if why is not None:
            print(f"  {why}", flush=True)
            record(row_of(None, lib, common, why), rejection_rows(None, lib, tagged, why))
            failures.append(f"{lib.name}: {why}")
            continue
        try:
            result = conform(lib, work, args.timeout, interpreter, args.cache, deadline, runs_of, tunesvc_path)
        except Exception as exc:  # this script's own failure on one library must not lose the others' rows
            print(f"  {lib.name}: the benchmark failed: {type(exc).__name__}: {exc}", flush=True)
            why = f"benchmark error: {type(exc).__name__}: {exc}"
            record(row_of(None, lib, common, why), rejection_rows(None, lib, tagged, why))
            failures.append(f"{lib.name}: benchmark error")
            continue
        record(row_of(result, lib, common) if complete else {}, rejection_rows(result, lib, tagged))
        for r in result.rejected:
            print(
                f"  {lib.name}: {r.kernel}: {r.trials} candidates measured, {r.rejected} rejected as wrong", flush=True
            )
            for reason, n, said in r.reasons():
                print(f"    {n} x {reason}: {said[:REASON_CHARS]}", flush=True)
        if not complete:
            if result.status != "ok":
                failures.append(f"{lib.name}: {result.status}")
            continue
        verdicts = [
            f"same outcome {'yes' if result.same_outcome else 'NO'}",
            f"nothing measured in run (c) {'yes' if result.nothing_measured_again else 'NO'}",
            f"first capture run no slower {'yes' if result.no_slower else 'NO'}",
        ]
        print(f"  {lib.name}: {'; '.join(verdicts)}; {result.trials[0]} trials stored by run (b)", flush=True)
        for test in result.differing[:20]:
            print(f"    differs: {test}: " + " / ".join(r.outcomes.get(test, "absent") for r in result.runs.values()))
        if result.status != "ok" or not (result.same_outcome and result.nothing_measured_again and result.no_slower):
            failures.append(f"{lib.name}: {result.status}; {'; '.join(verdicts)}")
    if "b" in runs_of:
        print(f"\nCandidates of run (b), tunesvc {tree} at {commit}:")
        print("| library | kernel | candidates | rejected as wrong |")
        print("|---|---|---|---|")
        for r in rejected_rows:
            print(f"| {r['library']} | {r['kernel']} | {r['candidates']} | {r['rejected']} |")
    if not complete:
        if not args.no_csv and "b" in runs_of:
            print(f"{len(rejected_rows)} rows appended to {args.rejections_csv}")
        for line in failures:
            print(f"FAILED {line}")
        return 1 if failures else 0
    print(
        "| library | version | tests | same outcome | plain s | capture first s | capture second s | trials | new in (c) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['library']} | {row['version']} | {row['tests']} | {row['same_outcome']} | {row['run_plain_s']} "
            f"| {row['run_capture_first_s']} | {row['run_capture_second_s']} | {row['trials_first']} "
            f"| {row['trials_second_new']} |" + (f" {row['status']}" if row["status"] != "ok" else "")
        )
    if not args.no_csv:
        print(f"{len(rows)} rows appended to {args.csv}, {len(rejected_rows)} to {args.rejections_csv}")
    for line in failures:
        print(f"FAILED {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
