"""What `tune` prints for people: help with every default, tables that keep whole shape keys and
kernel names at 80 and 120 columns, lookups that say where their answer came from."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from tunesvc.cli import app
from tunesvc.store import Store
from tunesvc.template import get_template


def invoke(*args: str, width: int = 80):
    # rich reads COLUMNS when stdout is not a terminal (CliRunner's, or a pipe)
    return CliRunner().invoke(app, list(args), env={"COLUMNS": str(width)})


def _leaves(commands=None, prefix=""):
    for name, command in (commands if commands is not None else typer.main.get_command(app).commands).items():
        if hasattr(command, "commands"):
            yield from _leaves(command.commands, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


def _flat(text: str) -> str:
    """Help text with the panels' borders gone and the lines joined, as one line of words."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


@pytest.mark.parametrize("name", [name for name, _ in _leaves()])
def test_help_shows_every_bracketed_default_and_readable_types(name):
    command = dict(_leaves())[name]
    result = invoke(*name.split(), "--help", width=200)
    assert result.exit_code == 0, result.output
    shown = _flat(result.stdout)
    assert "<bool>" not in shown and "<list[" not in shown, shown
    for param in command.params:
        # rich markup would eat "[default: ./tune.db]" and "[grid: all; others: 50]" unless escaped
        for bracketed in re.findall(r"\\?\[[^\]]*\]", param.help or ""):
            assert " ".join(bracketed.lstrip("\\").split()) in shown, (name, param.name, bracketed)


def test_help_of_sweep_names_the_defaults_that_matter():
    shown = _flat(invoke("sweep", "--help", width=100).stdout)
    for text in ("[default: ./tune.db]", "[grid: all; others: 50]", "[default: no limit]", "tunesvc[ray]"):
        assert text in shown, text


# -- tables: whole shape keys and kernel names at 80 and 120 columns ------------------------------
EXAMPLE = Path(__file__).parent.parent / "tune.db.example"


def _example_winners():
    store = Store(str(EXAMPLE), readonly=True)
    try:
        winners = store.winners()
    finally:
        store.close()
    current = {w.kernel: get_template(w.kernel).version for w in winners}
    return [w for w in winners if w.kernel_version == current[w.kernel]], [
        w for w in winners if w.kernel_version != current[w.kernel]
    ]


def _intact(text: str, output: str) -> bool:
    """``text`` whole on one line of ``output``, not part of a longer key or name."""
    pattern = rf"(?<![\w=,]){re.escape(text)}(?![\w=,])"
    return any(re.search(pattern, line) for line in output.splitlines())


@pytest.mark.parametrize("width", [80, 120])
def test_show_keeps_every_current_shape_key_whole(width):
    current, older = _example_winners()
    assert current and older  # the example holds old kernel versions beside the current ones
    result = invoke("show", "--db", str(EXAMPLE), width=width)
    assert result.exit_code == 0, result.output
    *tables, _summary = result.stdout.splitlines()
    assert max(len(line) for line in tables) <= width  # the summary line is one line, soft-wrapped
    for w in current:
        assert _intact(w.shape_key, result.stdout), (w.kernel, w.shape_key)
        assert f"{w.kernel} {w.kernel_version} (current version, used by lookups)" in result.stdout
    for version in {w.kernel_version for w in older}:
        assert version not in result.stdout  # older versions only with --all-versions
    assert _intact(f"{len(current)} winners ({len(older)} of older kernel versions: --all-versions)", result.stdout)

    every = invoke("show", "--db", str(EXAMPLE), "--all-versions", width=width)
    assert every.exit_code == 0, every.output
    for w in older:
        assert _intact(w.shape_key, every.stdout)
        assert f"{w.kernel} {w.kernel_version} (older version, not used by lookups)" in every.stdout
    assert f"{len(current) + len(older)} winners;" in every.stdout


def test_show_orders_shape_keys_by_their_numbers():
    """M=1, 16, 128, 1024 (by value), not M=1, 1024, 128, 16 (as text)."""
    result = invoke("show", "--db", str(EXAMPLE), "--kernel", "matmul", "--shape", "N=4096,K=4096,", width=200)
    assert result.exit_code == 0, result.output
    ms = [int(m) for m in re.findall(r"│ M=(\d+),N=4096,K=4096,", result.stdout)]
    assert len(ms) >= 4 and len(set(ms)) == len(ms), result.stdout
    assert ms == sorted(ms)


def test_a_lookup_says_when_it_ignores_tuned_keys_of_another_dtype():
    """The example is tuned in bfloat16: a lookup without --dtype (float16) answers with the
    heuristic and says which keys it could not use, and how to use them."""
    args = ["lookup", "matmul", "--shape", "3000x3000x777", "--db", str(EXAMPLE), "--device", H200]
    result = invoke(*args, width=200)
    assert result.exit_code == 0, result.output
    assert "answer  heuristic for NVIDIA H200" in result.stdout
    found = re.search(r"note    matmul is tuned on NVIDIA H200 for (\d+) keys in bfloat16, which a float16 "
                      r"lookup does not use; pass --dtype bfloat16", result.stdout)  # fmt: skip
    assert found, result.stdout
    stored = [w for w in _example_winners()[0] if w.kernel == "matmul" and "dtype=bfloat16" in w.shape_key]
    assert int(found.group(1)) == len(stored)
    assert json.loads(invoke(*args, "--json").stdout)["other_dtypes"] == {"bfloat16": len(stored)}
    exact = invoke(*args[:3], "1000x3000x777", "--dtype", "bfloat16", *args[4:], width=200)
    assert "answer  exact" in exact.stdout and "note" not in exact.stdout


def test_show_json_marks_the_current_versions():
    current, older = _example_winners()
    data = json.loads(invoke("show", "--db", str(EXAMPLE), "--json").stdout)
    assert sorted(w["shape_key"] for w in data["winners"]) == sorted(w.shape_key for w in current)
    assert all(w["current"] for w in data["winners"])
    every = json.loads(invoke("show", "--db", str(EXAMPLE), "--json", "--all-versions").stdout)["winners"]
    assert sum(not w["current"] for w in every) == len(older)


@pytest.mark.parametrize("width", [80, 120])
def test_kernels_keeps_every_kernel_name_whole(width):
    result = invoke("kernels", width=width)
    assert result.exit_code == 0, result.output
    for name in json.loads(invoke("kernels", "--json").stdout):
        assert _intact(name["name"], result.stdout), name["name"]
        assert _intact(name["version"], result.stdout)


@pytest.mark.parametrize("width", [80, 120])
def test_import_table_keeps_every_shape_key_whole(tmp_path, width):
    current, older = _example_winners()
    result = invoke("import", str(EXAMPLE), "--db", str(tmp_path / "t.db"), width=width)
    assert result.exit_code == 0, result.output
    for w in current + older:
        assert _intact(w.shape_key, result.stdout), w.shape_key
    assert f"{len(current) + len(older)} added, 0 replaced, 0 kept" in result.stdout
    assert all(result.stdout.count(w.hardware_id) == 1 for w in current)  # each device once, in a heading


def test_import_heading_keeps_the_device_name_whole_whatever_the_source_path(tmp_path):
    hardware_ids = sorted({w.hardware_id for w in _example_winners()[0]})
    assert len(hardware_ids) == 2  # the H100's, and the H200's matmul
    # source paths of every length modulo the width: a wrapped heading would split the name on some
    for pad in range(0, 80, 7):
        source = tmp_path / f"d{'x' * pad}" / EXAMPLE.name
        source.parent.mkdir()
        shutil.copyfile(EXAMPLE, source)
        result = invoke("import", str(source), "--db", str(tmp_path / f"{pad}.db"), width=80)
        assert result.exit_code == 0, result.output
        for hardware_id in hardware_ids:
            assert f"From {source}, winners of {hardware_id}" in result.stdout.splitlines()


def test_verify_with_no_winners_of_this_device_says_so_in_one_line():
    result = invoke("verify", "--db", str(EXAMPLE), width=80)
    assert result.exit_code == 0, result.output
    [line] = result.stdout.splitlines()
    assert (
        line.startswith("No winners of ")
        and "to verify: it holds NVIDIA H100 80GB HBM3, NVIDIA H200 winners only" in line
    )
    assert "(verify on one of those GPUs, measure them here with --from-device" in line


# -- lookups say where they read and how the shape was bucketed --------------------------------------
H100 = "NVIDIA H100 80GB HBM3"
#: where tune.db.example's matmul winners of the current version were measured
H200 = "NVIDIA H200"


def test_lookup_names_the_database_and_the_bucketing(tmp_path):
    (tmp_path / "sub").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "sub" / "example.db")
    args = ("--dtype", "bfloat16", "--db", "sub/example.db", "--device", H200)  # relative to the cwd, tmp_path
    exact = invoke("lookup", "matmul", "--shape", "1000x3000x777", *args)
    assert exact.exit_code == 0, exact.output
    lines = exact.stdout.splitlines()
    assert lines[0] == (
        "key     M=1024,N=3000,K=777,dtype=bfloat16: M=1000 rounded up to the power of two 1024 "
        "(every M from 513 to 1024 shares it); other dims as given"
    )
    assert lines[1] == f"answer  exact for {H200}; read from database {tmp_path / 'sub' / 'example.db'}"
    assert lines[2].startswith("config  VARIANT=")

    # no selector of the H200's (its sweeps did not cross-measure), so the nearest rule answers
    near = invoke("lookup", "matmul", "--shape", "3000x3000x777", *args)
    assert near.exit_code == 0, near.output
    assert f"nearest for {H200}: tuned key M=1024,N=3000,K=777,dtype=bfloat16, 2.00 doublings away" in near.stdout
    assert "log2 scale" in near.stdout
    data = json.loads(invoke("lookup", "matmul", "--shape", "3000x3000x777", *args, "--json").stdout)
    assert data["bucketed"] == {"M": [3000, 4096]} and data["distance"] == 2.0
    assert data["read"] == f"database {tmp_path / 'sub' / 'example.db'}"

    given = invoke("lookup", "matmul", "--shape", "1024x3000x777", *args)
    assert "key     M=1024,N=3000,K=777,dtype=bfloat16: every dim as given" in given.stdout


def test_lookup_without_a_database_says_which_file_it_looked_for(tmp_path):
    result = invoke("lookup", "matmul", "--shape", "90x70x50")
    assert result.exit_code == 0, result.output
    assert "answer  heuristic for " in result.stdout
    assert f"no database: {tmp_path / 'tune.db'} does not exist" in result.stdout


def test_the_cli_prints_no_raw_python_warning(tmp_path):
    shutil.copy(EXAMPLE, tmp_path / "tune.db")
    # an untuned answer (the nearest tuned key's) from ./tune.db: the runtime warns about the miss;
    # the answer line says it instead
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunesvc",
            "lookup",
            "matmul",
            "--shape",
            "3000x3000x777",
            "--dtype",
            "bfloat16",
            "--device",
            H200,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "answer  nearest for" in done.stdout
    assert done.stderr == ""


def test_warnings_become_one_clean_line(capsys):
    from tunesvc.cli import user_errors

    @user_errors
    def command() -> None:
        warnings.warn("tunesvc: something to know.", RuntimeWarning, stacklevel=1)

    command()
    err = capsys.readouterr().err
    assert err == "Warning: tunesvc: something to know.\n"


def test_the_library_lookup_warning_names_the_database_it_read(tmp_path):
    import tunesvc

    with pytest.warns(RuntimeWarning, match=re.escape(f"(no database: {tmp_path / 'tune.db'} does not exist")):
        tunesvc.lookup("matmul", M=90, N=70, K=50)
    shutil.copy(EXAMPLE, tmp_path / "tune.db")  # H100 winners only: this device still misses
    tunesvc.configure()
    with pytest.warns(RuntimeWarning, match=re.escape(f"(database {tmp_path / 'tune.db'})")):
        tunesvc.lookup("matmul", M=90, N=70, K=50)


# -- tune sweep --gpus draws its progress ---------------------------------------------------------
def test_sweep_gpus_shows_a_progress_bar_per_job(tmp_path):
    args = ("sweep", "matmul", "--shape", "37x45x29", "--shape", "100x45x29", "--budget", "2", "--gpus", "0,1")
    result = invoke(*args, "--db", str(tmp_path / "t.db"), width=100)
    assert result.exit_code == 0, result.output
    bars = [line for line in result.stderr.splitlines() if "━" in line]
    for key in ("M=64,N=45,K=29,dtype=float16", "M=128,N=45,K=29,dtype=float16"):
        [bar] = [line for line in bars if line.startswith(key + " ")]
        assert " done " in bar and " 2/2 " in bar, bar  # the job's status and its trials of the budget
    quiet = invoke(*args, "--db", str(tmp_path / "q.db"), "--quiet")
    assert quiet.exit_code == 0 and "━" not in quiet.stderr


@pytest.mark.parametrize("best", [True, False], ids=["sweep", "sweep-gpus"])
def test_sweep_progress_at_an_80_column_terminal_keeps_counts_and_clock_whole(best):
    """Three-digit counts, the best time and the clock whole, the key and its phase cut at their
    end instead; every line two columns short of the edge, where a terminal echoes ^C."""
    import io

    from rich.console import Console

    from tunesvc.cli._progress import sweep_progress

    screen = io.StringIO()
    console = Console(width=80, force_terminal=True, file=screen, color_system=None)
    progress = sweep_progress(console, best=best, disable=False)
    rows = {
        "M=128,N=70,K=50,dtype=float16": ("checking and timing", "best 43.47 ms", 123),
        "B=4,H=16,S=1024,D=128,causal=True,dtype=bfloat16": ("compiling 352 candidates", "best 0.02087 ms", 5),
    }
    for key, (phase, best_ms, done) in rows.items():
        progress.update(progress.add_task(key, total=352, phase=phase, best=best_ms), completed=done)
    console.print(progress.get_renderable())
    lines = screen.getvalue().splitlines()
    assert len(lines) == 2 and all(len(line) <= 78 for line in lines), lines
    for line, (key, (_, best_ms, done)) in zip(lines, rows.items(), strict=True):
        assert line.startswith(key[:20]) and f" {done:3}/352 " in line, line
        assert re.search(r" \d+:\d\d:\d\d$", line) and (best_ms in line) == best, line
    assert "compiling" not in lines[1] and "…" in lines[1]  # the long key's phase gave way first


# -- tune sweep into a pipe ------------------------------------------------------------------------
def test_sweep_into_a_pipe_prints_whole_lines_and_the_table_side_by_side(tmp_path):
    """Without a terminal and without $COLUMNS (`tune sweep ... | cat`), rich's 80 columns would cut
    the progress lines and fold the table into one column: each key's bar and row is one whole line."""
    args = ("sweep", "matmul", "--shape", "37x45x29", "--shape", "100x70x50", "--budget", "2")
    result = CliRunner().invoke(app, [*args, "--db", str(tmp_path / "t.db")], env={"COLUMNS": None})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    [header] = [line for line in lines if "shape key" in line]
    assert all(f" {column} " in header for column in ("winner", "ms", "heuristic ms", "speed-up", "failed")), header
    for key in ("M=64,N=45,K=29,dtype=float16", "M=128,N=70,K=50,dtype=float16"):
        [bar] = [line for line in result.stderr.splitlines() if line.startswith(key + " ")]
        assert " done " in bar and " 2/2 " in bar and re.search(r" best [0-9.]+ ms +\d+:\d\d:\d\d$", bar), bar
        [row] = [line for line in lines if f" {key} " in line]
        assert "VARIANT=" in row and "stages=" in row and row.rstrip().endswith("│"), row


@pytest.mark.parametrize(
    "args",
    [
        ["show", "--db", "tune.db.example", "--kernel", "matmul"],  # its summary line is 120 characters
        ["show", "--db", "tune.db.example", "--kernel", "nosuch"],  # an error naming the command
    ],
)
def test_messages_word_wrap_at_an_80_column_terminal(args):
    """At a terminal of 80 columns a message is wrapped between words (the terminal itself would cut
    them at its edge); the same message to a pipe is one line (see test_docs)."""
    root = Path(__file__).parent.parent
    env = {**os.environ, "COLUMNS": "80", "FORCE_COLOR": "1"}  # rich: a terminal
    done = subprocess.run(
        [sys.executable, "-m", "tunesvc", *args], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    text = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)
    lines = [line.rstrip() for line in text.splitlines()]
    assert max(map(len, lines)) <= 80, lines
    message = next(i for i, line in enumerate(lines) if re.match(r"\d+ winners? |Error: ", line))
    # the wrapped message is whole words: its lines joined again are what a pipe prints on one line
    piped = subprocess.run(
        [sys.executable, "-m", "tunesvc", *args], cwd=root, capture_output=True, text=True, timeout=120
    )
    whole = next(line for line in (piped.stdout + piped.stderr).splitlines() if line.startswith(lines[message][:8]))
    assert len(whole) > 80
    joined = lines[message]
    for line in lines[message + 1 :]:
        if " ".join((joined + " " + line).split()) not in " ".join(whole.split()):
            break
        joined += " " + line
    assert " ".join(joined.split()) == " ".join(whole.split())
