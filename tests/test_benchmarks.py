"""The benchmark scripts import: a GPU call spent on a script that fails at its imports (a helper
moved out of benchmarks/_common.py, a module moved inside tunesvc) is a call lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py"))

#: each script imported in one process (torch and Triton load once), its failure kept by name
IMPORT_EACH = """
import importlib, json, sys, traceback
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException:
        failed[name] = traceback.format_exc(limit=-3)
print(json.dumps(failed))
"""


def test_each_benchmark_script_imports():
    assert {"_common", "matmul", "gemm_heldout", "attention", "decode", "norms", "launch_cost"} <= set(SCRIPTS)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH, *SCRIPTS],
        cwd=BENCHMARKS,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    failed = json.loads(done.stdout.splitlines()[-1])
    assert not failed, "\n".join(f"{name}:\n{trace}" for name, trace in failed.items())


#: the three ways benchmarks/runtime_overhead.py and benchmarks/matmul.py launch the grouped matmul
#: kernel themselves (fixed config, @tunesvc.autotune from a bundle, triton.autotune), run on a
#: GEMM whose sizes are no multiple of the blocks: each relative error printed, in that order
LAUNCHERS = """
import json, tempfile, torch, triton
from pathlib import Path
import matmul, runtime_overhead as ro
from tunesvc.device import current_device
a, b = torch.randn(50, 40, dtype=torch.float16), torch.randn(40, 70, dtype=torch.float16)
ref = a.float() @ b.float()
error = lambda c: float((c.float() - ref).norm() / ref.norm())
with tempfile.TemporaryDirectory() as folder:
    path = Path(folder) / "decorated.json"
    direct, decorated, tuner = ro.kernel_launchers(ro.GROUPED, path)
    ro.synthetic_bundle(path, current_device(), 0, kernel="matmul_decorated", version=tuner.template.version,
                        extra={"M=64,N=70,K=40,dtype=float16": ro.GROUPED})
    errors = [error(direct(a, b)), error(decorated(a, b))]
matmul.TUTORIAL[:] = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=2, num_warps=4)]
errors.append(error(matmul.autotuned_matmul()[0](a, b)))
print(json.dumps(errors))
"""


def test_the_benchmarks_own_launches_of_the_matmul_kernel_match_its_signature():
    """The host-cost benchmarks launch the kernel with its own arguments, not through tunesvc:
    a new argument of the kernel (B's width NB) must reach them, checked on the interpreter."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHERS], cwd=BENCHMARKS, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.splitlines()[-1])
    assert len(errors) == 3 and all(e < 1e-2 for e in errors), errors


def test_transfer_benchmark_picks_what_the_chain_serves_beside_the_siblings_winner(tmp_path, monkeypatch):
    """benchmarks/transfer.py on tune.db.example as an H100 would read it (the sibling of the H200,
    which holds matmul's current winners):
    per held-out GEMM, "served" is the chain's answer in mode lookup, the sibling's winner only
    where its own trials show a margin over the heuristic, and "transferred" the winner it
    considered; both kinds of answer occur; the summary states the targets."""
    import shutil
    import warnings

    from _devices import H100

    import tunesvc.device
    import tunesvc.serving.runtime

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import transfer

    db = str(tmp_path / "example.db")
    shutil.copyfile(BENCHMARKS.parent / "tune.db.example", db)
    for module in (tunesvc.device, tunesvc.serving.runtime):
        monkeypatch.setattr(module, "current_device", lambda: H100)
    shapes = transfer.problems(db, quick=False, served_only=True)
    assert len(shapes) > len(transfer.problems(db, quick=False))  # SERVED_M's shapes besides
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        picks = transfer.untuned(db, shapes)
    sources = {p["answer"].source for p in picks.values()}
    assert sources == {"transferred", "heuristic"}
    for pick in picks.values():
        answer = pick["answer"]
        if answer.source == "transferred":
            assert answer.config == pick["transferred"] and answer.reason.startswith("transferred: ")
        else:
            assert answer.config == pick["heuristic"] and answer.reason.startswith("heuristic: ")
    assert any(p["answer"].source == "heuristic" and p["transferred"] is not None for p in picks.values())
    lines = transfer.served_summary({"a": 1.0, "b": 1.2}, {"a": 0.5, "b": 1.2})
    assert lines[0] == "served / heuristic: worst 1.000x at a, below 0.95x on 0 of 2 shapes, geometric mean 1.095x"
    assert lines[1].startswith("transferred / heuristic: worst 0.500x at a, below 0.95x on 1 of 2 shapes")
    assert lines[2].endswith(": met")
    assert transfer.served_summary({"a": 0.9}, {})[-1].endswith(": missed")


def test_adopt_takes_kernels_by_commas_or_spaces_and_refuses_a_name_it_has_no_winners_of():
    """adopt-gpu.sh passes ADOPT_KERNELS="a,b" as one argument: split at commas; a name --db holds no
    winners of is refused in one line (kept, every step would find nothing to do and say nothing)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = lambda *kernels: subprocess.run(
        [sys.executable, "adopt.py", "--list", "--kernels", *kernels],
        cwd=BENCHMARKS, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    listed = run("softmax,rmsnorm_bwd", "softmax_bwd")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert [line.split(":")[0] for line in listed.stdout.splitlines()] == ["rmsnorm_bwd", "softmax", "softmax_bwd"]
    refused = run("softmax,sofmax")
    assert refused.returncode == 2 and refused.stdout == ""
    assert "holds no current winners of sofmax; use some of" in refused.stderr.splitlines()[-1]


def test_the_gpu_step_scripts_run_their_steps_in_turn_and_keep_their_files(tmp_path):
    """gemm-gpu.sh and attention-gpu.sh (benchmarks/_gpu_steps.sh) on a stand-in machine: the
    install, nvidia-smi and python3 are stubs, so each step's command line is what is checked; an
    unknown step is said and skipped; the work folder and the saved files come back under $OUT."""
    import shutil

    repo, out, stubs = tmp_path / "repo", tmp_path / "out", tmp_path / "bin"
    for folder in (repo / "benchmarks" / "results", repo / "benchmarks" / "data", out, stubs):
        folder.mkdir(parents=True)
    for name in ("gemm-gpu.sh", "attention-gpu.sh", "_gpu_steps.sh"):
        shutil.copy(BENCHMARKS / name, repo / "benchmarks" / name)
    (repo / "benchmarks" / "_gpu_install.sh").write_text("export PYTHONPATH=/nowhere\n")
    (repo / "tune.db.example").write_text("")
    (repo / "benchmarks" / "results" / "heldout.csv").write_text("rows\n")
    (stubs / "nvidia-smi").write_text("#!/bin/sh\necho 'name, driver'\n")
    (stubs / "python3").write_text(
        '#!/bin/sh\ncase "$*" in *presets*) echo \'-s 1x2x3 -s 4x5x6\';; *) echo "ran $*";; esac\n'
    )
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    work = f"sh-test-{os.getpid()}"
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "OUT": str(out)}
    try:
        for script, steps in (
            ("attention-gpu.sh", ["heldout:0-1", "tests:a or b", "bogus:1"]),
            ("gemm-gpu.sh", ["example:4", "sweep:0:2"]),
        ):
            kind = script.removesuffix("-gpu.sh")
            text = (repo / "benchmarks" / script).read_text().replace(f"WORK={kind}-work ", f"WORK={kind}-work-{work} ")
            assert f"WORK={kind}-work-{work} " in text  # a work folder of this test's own
            (repo / "benchmarks" / script).write_text(text)
            done = subprocess.run(["bash", f"benchmarks/{script}", *steps], cwd=repo, env=env,
                                  capture_output=True, text=True, timeout=120)  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert ("unknown step bogus:1" in done.stdout) == ("bogus:1" in steps)
        attention, gemm = (out / "attention.log").read_text(), (out / "gemm.log").read_text()
        assert f"ran {repo}/benchmarks/heldout.py --db /tmp/attention-work-{work}/heldout.db --size medium" in attention
        assert f"--run attention --picks /tmp/attention-work-{work}/picks.json" in attention
        assert f"-m gpu {repo}/tests -k a or b\nexit 0" in attention
        assert "ran -m tunesvc sweep matmul -s 1x2x3 -s 4x5x6 --dtype bfloat16 --strategy optuna --budget 4" in gemm
        assert (
            f"ran {repo}/benchmarks/gemm_heldout.py --db /tmp/gemm-work-{work}/heldout.db --sweep --shapes 0:2" in gemm
        )
        assert (out / "res" / "heldout.csv").read_text() == "rows\n" and (out / "work.tgz").stat().st_size > 0
    finally:
        for kind in ("attention", "gemm"):
            shutil.rmtree(f"/tmp/{kind}-work-{work}", ignore_errors=True)
