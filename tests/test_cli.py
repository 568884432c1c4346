"""The `tune` command line through typer's CliRunner: output, exit codes, one-line errors."""

from __future__ import annotations

import gc
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tunesvc.cli import app

SHAPE = "37x45x29"
KEY = "M=64,N=45,K=29,dtype=float16"


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    gc.collect()  # `tune sweep` never closes its Store: let its SQLite connections go now
    return result


def flat(text: str) -> str:
    """A table as one line of words: box borders gone, wrapped lines joined."""
    return " ".join(re.sub("[\u2500-\u257f]", " ", text).split())


def assert_one_line_error(result, *fragments: str) -> str:
    assert result.exit_code != 0
    # a TunesvcError ends as typer.Exit(1); anything else escaping is a bug with a traceback
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "Error" in lines[0]
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A database made by `tune sweep` (budget 2), and that command's result."""
    db = str(tmp_path_factory.mktemp("cli") / "swept.db")
    result = invoke("sweep", "matmul", "--shape", SHAPE, "--budget", "2", "--db", db)
    return db, result


@pytest.fixture
def db(swept, tmp_path):
    """A private copy of the swept database (with its WAL, should one be left)."""
    path = tmp_path / "copy.db"
    shutil.copy(swept[0], path)
    if Path(swept[0] + "-wal").exists():
        shutil.copy(swept[0] + "-wal", str(path) + "-wal")
    return str(path)


def test_kernels(template):
    result = invoke("kernels")
    assert result.exit_code == 0, result.output
    assert "matmul" in result.stdout
    assert "MxNxK" in result.stdout
    assert str(template.space.size) in result.stdout  # space size


def test_kernels_json(template):
    result = invoke("kernels", "--json")
    assert result.exit_code == 0, result.output
    [row] = [r for r in json.loads(result.stdout) if r["name"] == "matmul"]
    assert row["dims"] == ["M", "N", "K"]
    assert row["version"] == template.version
    assert row["space_size"] == template.space.size == 120000
    assert row["presets"] == sorted(template.presets) and {"llm", "tiny", "skinny"} <= set(row["presets"])
    assert Path(row["space_file"]).name == "matmul.toml"


def test_space_json(template, device):
    result = invoke("space", "matmul", "--shape", SHAPE, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    problem = template.parse_shape(SHAPE)
    assert data["size"] == 120000
    assert data["feasible"] == len(template.feasible(problem, device)) > 0
    assert data["feasible"] < data["size"]
    assert data["shape_key"] == KEY
    assert data["heuristic"] == template.heuristic(problem, device)
    assert data["parameters"]["BLOCK_N"] == [32, 64, 128, 256]
    assert "group" in data["constraints"]


def test_space_table():
    result = invoke("space", "matmul", "--shape", SHAPE)
    assert result.exit_code == 0, result.output
    assert "BLOCK_M" in result.stdout and "Constraints" in result.stdout
    assert "feasible of 120000" in " ".join(result.stdout.split())  # rich wraps at the terminal width


def test_sweep_prints_a_table(swept, device):
    db, result = swept
    assert result.exit_code == 0, result.output
    assert "shape key" in result.stdout and "winner" in result.stdout
    assert "M=64" in result.stdout
    assert "trials 2 · new 2" in flat(result.stdout)  # trials stored for the key, of them new
    assert "new: of them, measured by this run" in flat(result.stdout)  # the legend
    assert Path(db).is_file()


def test_sweep_again_measures_nothing_new(db):
    result = invoke("sweep", "matmul", "--shape", SHAPE, "--budget", "2", "--db", db, "--json")
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)
    assert row["trials_new"] == 0 and row["trials_stored"] == 2
    assert row["shape_key"] == KEY


def test_sweep_json_optuna(tmp_db):
    result = invoke(
        "sweep",
        "matmul",
        "--shape",
        "16x32x32",
        "--strategy",
        "optuna",
        "--budget",
        "2",
        "--seed",
        "1",
        "--db",
        tmp_db,
        "--json",
    )
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)
    assert row["trials_new"] == 2 and row["winner"] is not None


def test_show(db):
    result = invoke("show", "--db", db)
    assert result.exit_code == 0, result.output
    assert "matmul" in result.stdout
    assert "1 winner; 2 trials, 0 failed or invalid, in" in result.stdout


def test_show_json(db, device, template):
    result = invoke("show", "--db", db, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    [winner] = data["winners"]
    assert winner["kernel"] == "matmul" and winner["shape_key"] == KEY
    assert winner["hardware_id"] == device.hardware_id
    assert winner["kernel_version"] == template.version
    assert data["trials"] == {"ok": 2}
    # a filter that matches nothing is an error, with --json too (stdout stays empty for a script)
    empty = invoke("show", "--db", db, "--kernel", "conv", "--json")
    assert empty.exit_code == 1 and empty.stdout == "" and "--kernel 'conv'" in empty.output


def test_show_does_not_change_the_database(db):
    before = Path(db).read_bytes()
    for args in (
        ("show", "--db", db),
        ("show", "--db", db, "--json"),
        ("lookup", "matmul", "--shape", SHAPE, "--db", db),
    ):
        assert invoke(*args).exit_code == 0
    assert Path(db).read_bytes() == before


def test_tunesvc_db_env_var(db, monkeypatch):
    monkeypatch.setenv("TUNESVC_DB", db)
    result = invoke("show", "--json")
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["winners"]) == 1


def test_lookup_json_exact(db):
    result = invoke("lookup", "matmul", "--shape", SHAPE, "--db", db, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["source"] == "exact"
    assert data["key"] == data["matched_key"] == KEY
    shown = json.loads(invoke("show", "--db", db, "--json").stdout)
    assert data["config"] == shown["winners"][0]["config"]


def test_lookup_nearest_and_heuristic(db):
    near = json.loads(invoke("lookup", "matmul", "--shape", "100x45x29", "--db", db, "--json").stdout)
    assert near["source"] == "nearest" and near["matched_key"] == KEY
    text = invoke("lookup", "matmul", "--shape", "100x45x29", "--db", db)
    assert "nearest" in text.stdout and "tuned key" in text.stdout
    other = json.loads(invoke("lookup", "matmul", "--shape", SHAPE, "--dtype", "float32", "--db", db, "--json").stdout)
    assert other["source"] == "heuristic"


def test_lookup_without_any_database_is_the_heuristic(tmp_path):
    """With no --db and no ./tune.db, `tune lookup` answers as the runtime it describes does (the
    heuristic) and creates no file."""
    result = invoke("lookup", "matmul", "--shape", SHAPE, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["source"] == "heuristic"
    assert list(tmp_path.iterdir()) == []


def test_export_and_lookup_from_bundle(db, tmp_path):
    out = tmp_path / "bundles"
    result = invoke("export", "--db", db, "--out", str(out))
    assert result.exit_code == 0, result.output
    [path] = list(out.glob("*.json"))
    assert "wrote" in result.stdout
    assert json.loads(path.read_text())["kernels"]["matmul"]["winners"][KEY]
    looked = invoke("lookup", "matmul", "--shape", SHAPE, "--bundle", str(path), "--json")
    assert looked.exit_code == 0, looked.output
    from_db = json.loads(invoke("lookup", "matmul", "--shape", SHAPE, "--db", db, "--json").stdout)
    assert json.loads(looked.stdout)["config"] == from_db["config"]
    single = invoke("export", "--db", db, "--out", str(tmp_path / "one.json"))
    assert single.exit_code == 0 and (tmp_path / "one.json").is_file()


def test_no_arguments_shows_help():
    result = invoke()
    assert "sweep" in result.output and "lookup" in result.output


# -- bad inputs: one line, no traceback, database untouched -----------------------------------------
BAD = {
    "unknown_kernel": (["sweep", "conv2d", "--shape", SHAPE, "--budget", "2"], "Unknown kernel 'conv2d'"),
    "unknown_kernel_lookup": (["lookup", "conv2d", "--shape", SHAPE], "Unknown kernel"),
    "unknown_strategy": (
        ["sweep", "matmul", "--shape", SHAPE, "--budget", "2", "--strategy", "annealing"],
        "Unknown strategy",
    ),
    "bad_shape": (["sweep", "matmul", "--shape", "12x", "--budget", "2"], "12x"),
    "impossible_shape": (["sweep", "matmul", "--shape", "0x4x4", "--budget", "2"], "M=0 is impossible"),
    "non_integer_shape": (["lookup", "matmul", "--shape", "4xKx4"], "not an integer"),
    "bad_dtype": (["sweep", "matmul", "--shape", SHAPE, "--dtype", "int8"], "int8"),
    "unknown_preset": (["sweep", "matmul", "--preset", "huge"], "no preset 'huge'"),
    "no_shape": (["sweep", "matmul"], "--shape"),
    "zero_budget": (["sweep", "matmul", "--shape", SHAPE, "--budget", "0"], "--budget must be at least 1"),
    "malformed_pair": (["sweep", "matmul", "--shape", "M=37,N45,K=29", "--budget", "2"], "N45"),
    "export_nothing": (["export", "--kernel", "conv"], "No winners"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_is_one_line_and_leaves_the_database_alone(db, name):
    args, fragment = BAD[name]
    before = Path(db).read_bytes()
    result = invoke(*args, "--db", db)
    assert_one_line_error(result, fragment)
    assert Path(db).read_bytes() == before


@pytest.mark.parametrize(
    "args",
    [
        ["sweep", "matmul", "--shape", SHAPE, "--strategy", "annealing"],
        ["sweep", "matmul", "--shape", SHAPE, "--budget", "0"],
    ],
    ids=["unknown_strategy", "zero_budget"],
)
def test_rejected_sweep_creates_no_database(tmp_path, args):
    """A sweep whose options are refused (a mistyped strategy, a zero budget) leaves no new
    database behind: the options are checked before the store is opened."""
    result = invoke(*args, "--db", "new.db")
    assert_one_line_error(result)
    assert not (tmp_path / "new.db").exists()


def test_show_on_a_text_file(tmp_path):
    path = tmp_path / "notes.txt"
    text = b"not a database, just some text\n" * 30
    path.write_bytes(text)
    for command in (
        ["show"],
        ["lookup", "matmul", "--shape", SHAPE],
        ["export"],
        ["sweep", "matmul", "--shape", SHAPE],
    ):
        result = invoke(*command, "--db", str(path))
        assert_one_line_error(result, "is not a SQLite database")
        assert path.read_bytes() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_space_of_an_unknown_kernel():
    assert_one_line_error(invoke("space", "conv2d"), "Unknown kernel 'conv2d'")


def test_space_with_a_bad_shape():
    assert_one_line_error(invoke("space", "matmul", "--shape", "37x45"), "has 2 dims")


def test_show_on_a_missing_file(tmp_path):
    result = invoke("show", "--db", str(tmp_path / "missing.db"))
    assert_one_line_error(result, "No database at")
    assert not (tmp_path / "missing.db").exists()
    result = invoke("show")  # ./tune.db by default
    assert_one_line_error(result, "No database at tune.db")
    assert list(tmp_path.iterdir()) == []


def test_sweep_into_a_missing_folder(tmp_path):
    result = invoke("sweep", "matmul", "--shape", SHAPE, "--budget", "2", "--db", str(tmp_path / "nope" / "x.db"))
    assert_one_line_error(result, "does not exist")
    assert not (tmp_path / "nope").exists()


def test_show_on_a_directory(tmp_path):
    result = invoke("show", "--db", str(tmp_path))
    assert_one_line_error(result, "is a directory")


# -- show filters, sweep --quiet, --debug --------------------------------------------------------------
def test_show_filters_by_device_and_shape(db, device):
    def shown(*args: str) -> dict:
        result = invoke("show", "--db", db, "--json", *args)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    everything = shown()
    for args in (
        ("--device", device.name[3:9].upper()),
        ("--device", device.hardware_id),
        ("--shape", "M=64"),
        ("--shape", "FLOAT16"),
        ("--kernel", "matmul", "--device", device.name, "--shape", "K=29"),
    ):
        assert shown(*args) == everything, args  # substrings, any case
    for args in (("--device", "no such gpu"), ("--shape", "float32"), ("--shape", "M=6_"), ("--shape", "%")):
        result = invoke("show", "--db", db, "--json", *args)  # LIKE wildcards are plain text: no match
        assert result.exit_code == 1 and result.stdout == "" and f"{args[0]} '{args[1]}'" in result.output, args
    assert shown("--device", device.name, "--shape", "N=45")["trials"] == {"ok": 2}

    table = invoke("show", "--db", db, "--shape", "M=64")
    assert table.exit_code == 0, table.output
    assert "matmul" in table.stdout and "1 winner; 2 trials, 0 failed or invalid, in" in table.stdout
    none = invoke("show", "--db", db, "--device", "no such gpu")
    assert_one_line_error(none, "No winners in", "match --device 'no such gpu'", "it holds winners of matmul")


def test_sweep_quiet_has_no_progress_bar(db):
    args = ("sweep", "matmul", "--shape", SHAPE, "--budget", "2", "--db", db)
    loud = invoke(*args)
    assert loud.exit_code == 0, loud.output
    assert KEY in loud.stderr and "/2" in loud.stderr  # the progress bar, on stderr even when not a terminal
    for flag in ("--quiet", "-q"):
        quiet = invoke(*args, flag)
        assert quiet.exit_code == 0, quiet.output
        assert quiet.stderr == ""
        assert KEY in quiet.stdout and "trials 2 · new 0" in flat(quiet.stdout)  # the table still prints


def test_debug_keeps_the_traceback(tmp_path):
    from tunesvc import TunesvcError

    missing = str(tmp_path / "missing.db")
    result = invoke("--debug", "show", "--db", missing)
    assert result.exit_code == 1
    assert isinstance(result.exception, TunesvcError) and "No database at" in str(result.exception)
    # the flag is per run: the next command without it is back to one line
    assert_one_line_error(invoke("show", "--db", missing), "No database at")

    done = subprocess.run(
        [sys.executable, "-m", "tunesvc", "--debug", "show", "--db", missing],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert "tunesvc.errors.TunesvcError: No database at" in done.stderr
    assert list(tmp_path.iterdir()) == []
