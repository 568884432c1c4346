"""What a database, a bundle or an --out folder from anyone can do to the `tune` command line.

Strings read from a database or bundle reach a terminal and a figure as text: no escape sequence
(OSC 52 sets the clipboard, OSC 0 the window title, CSI 2J clears the screen), no Rich markup,
no mathtext. Files are written where the user asked and nowhere else: never through a planted
link, never over a file the command did not write, one file per device. Kernels go by both
their template and library names; a filter that matches nothing is an error. Numbers and paths
out of range are one sentence. Every case runs the real CLI on real SQLite files.
"""

from __future__ import annotations

import gc
import hashlib
import html
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from _backends import pg_database
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from tunesvc.bundle import bundle_filename
from tunesvc.bundle import bundle_filenames
from tunesvc.cli import app
from tunesvc.cli.sweep import _command_line
from tunesvc.text import figure_text
from tunesvc.text import visible

SEED = 20261130
SHAPE = "37x45x29"
KEY = "M=64,N=45,K=29,dtype=float16"
#: what a hostile string may hold: terminal escapes, Rich markup, emoji codes, mathtext, bidi
HOSTILE = [
    "\x1b]52;c;cHduZWQ=\x07",  # OSC 52: the clipboard
    "\x1b]0;pwned\x07",  # OSC 0: the window title
    "\x1b[2J",  # CSI 2J: clear the screen
    "\x1b[31m",
    "\x9b2J",  # CSI as one C1 byte
    "[/x]",
    "[bold]",
    "[link=http://x]",
    ":smile:",
    "$\\frac{1}{$",
    "$x$",
    "\u202eevil",  # right-to-left override
    "\r",
    "\x00",
    "\x08\x08",
    "\u200b",  # zero-width space
    "\u2028",  # line separator
    "\ufeff",  # zero-width no-break space (BOM)
    "\u2066",  # left-to-right isolate
]
#: what no output may hold: controls but a line break, C1, bidi marks, overrides and isolates,
#: zero-width characters, line and paragraph separators
UNSHOWN = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]")


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    gc.collect()  # `tune sweep` leaves its SQLite connections to the garbage collector
    return result


def squeezed(text: str) -> str:
    """Output without spaces, line breaks and box drawing: a folded table cell joined again."""
    return re.sub(r"[\s\u2500-\u257f]", "", text)


def assert_shown_as_text(result, hostile: str) -> None:
    """No control character but a line break reached the output, no traceback, and the hostile
    string is there whole, its control characters written as escapes, its markup as it is."""
    output = result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in output and "MarkupError" not in output, output
    assert not UNSHOWN.search(output), repr(output)
    assert squeezed(visible(hostile)) in squeezed(output), (visible(hostile), output)


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    """A database of a real sweep (matmul, budget 2) on this machine's device."""
    db = tmp_path_factory.mktemp("safety") / "swept.db"
    result = invoke("sweep", "matmul", "--shape", SHAPE, "--budget", "2", "--db", str(db), "--quiet")
    assert result.exit_code == 0, result.output
    return db


def planted(swept: Path, folder: Path, *, key: str | None = None, device: str | None = None, name: str = "p.db"):
    """A copy of the swept database whose shape key and device name (and hardware id) are
    ``key`` and ``device``, and a capture miss of a kernel, key and device named alike."""
    db = folder / name
    shutil.copy(swept, db)
    connection = sqlite3.connect(db)
    with connection:
        if key is not None:
            for table in ("tunesvc_winners", "tunesvc_trials", "tunesvc_sweeps"):
                connection.execute(f"UPDATE {table} SET shape_key = ?", (key,))
        if device is not None:
            connection.execute("UPDATE tunesvc_devices SET name = ?, hardware_id = ?", (device, device + "|sm_00|2SM"))
        connection.execute(
            "INSERT INTO tunesvc_misses (kernel, version, hardware_id, shape_key, call, count, status, first_seen, "
            "last_seen) VALUES (?, 'v1', ?, ?, '{}', 3, 'open', '2026-01-01 00:00:00', '2026-01-01 00:00:00')",
            (f"mod{device or ''}:fn", device or "gpu", key or KEY),
        )
    connection.close()
    return db


def hostile_strings(n: int) -> list[str]:
    """``n`` strings, each a few hostile parts between ordinary text, drawn from a seeded generator."""
    rng = random.Random(SEED)
    out = list(HOSTILE)
    while len(out) < n:
        parts = rng.sample(HOSTILE, rng.randint(2, 4))
        out.append("M=64" + "".join(f"{p}x{i}" for i, p in enumerate(parts)))
    return out[:n]


@pytest.mark.parametrize("hostile", hostile_strings(24))
def test_stored_strings_reach_show_misses_lookup_and_import_as_text(swept, tmp_path, hostile):
    # a key holding NUL is no key (tunesvc.checks): skipped, as test_store_contract checks
    db = planted(swept, tmp_path, key=KEY + hostile.replace("\x00", ""), device="GPU" + hostile)
    before = db.read_bytes()
    for args in (
        ("show", "--db", str(db)),
        ("show", "--db", str(db), "--all-versions"),
        ("misses", "--db", str(db)),
        ("lookup", "matmul", "--shape", SHAPE, "--db", str(db), "--device", "GPU" + hostile),
    ):
        result = invoke(*args)
        assert result.exit_code == 0, (args, result.output)
        assert_shown_as_text(result, hostile)
    assert db.read_bytes() == before, "a read changed the database"
    result = invoke("import", str(db), "--db", str(tmp_path / "target.db"))
    assert result.exit_code == 0, result.output
    assert_shown_as_text(result, hostile)
    # the bundle of that database: its key and device reach `tune import` as text too
    result = invoke("export", "--db", str(db), "--out", str(tmp_path / "b.json"))
    assert result.exit_code == 0, result.output
    result = invoke("import", str(tmp_path / "b.json"), "--db", str(tmp_path / "target2.db"))
    assert result.exit_code == 0, result.output
    assert_shown_as_text(result, hostile)


def test_markup_closing_tag_in_a_stored_key_is_shown_not_parsed(swept, tmp_path):
    db = planted(swept, tmp_path, key=KEY + "[/x]")
    for args in (("show", "--db", str(db)), ("misses", "--db", str(db))):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
        assert "[/x]" in squeezed(result.output)


def test_a_real_terminal_gets_no_escape_sequence(swept, tmp_path):
    """The installed command in a pseudo-terminal-like setting: rich writes colours (forced), but
    the stored OSC 52, OSC 0 and CSI 2J arrive escaped, as text."""
    db = planted(swept, tmp_path, key=KEY + HOSTILE[0] + HOSTILE[1] + HOSTILE[2])
    env = {**os.environ, "FORCE_COLOR": "1", "COLUMNS": "200"}
    run = subprocess.run(
        [sys.executable, "-m", "tunesvc", "show", "--db", str(db)], capture_output=True, env=env, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert b"\x1b]" not in run.stdout and b"\x1b[2J" not in run.stdout and b"\x07" not in run.stdout
    assert b"\\x1b]52;c;cHduZWQ=\\x07" in run.stdout
    assert b"\x1b[" in run.stdout  # rich's own colours still reach the terminal


@pytest.mark.parametrize("device", ["$\\frac{1}{$", "GPU $x$ [/x] \x1b[2J", "$$", "\\$a$b$"])
def test_report_draws_figures_of_a_device_named_with_mathtext(swept, tmp_path, device):
    db = planted(swept, tmp_path, key=KEY + "$\\frac{1}{$", device=device)
    result = invoke("report", "--db", str(db), "--out", str(tmp_path / "report"))
    assert result.exit_code == 0, result.output
    page = (tmp_path / "report" / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 3  # the convergence and spread figures were drawn
    assert html.escape(visible(device)) in page and not UNSHOWN.search(page)


def test_visible_escapes_what_a_terminal_would_act_on_or_hide_and_cuts_long_strings():
    for hidden, shown in (
        ("\x1b]0;x\x07", "\\x1b]0;x\\x07"),
        ("\x9b2J", "\\x9b2J"),
        ("a\u200bb\u200dc", "a\\u200bb\\u200dc"),  # zero-width space and joiner
        ("\u2028\u2029", "\\u2028\\u2029"),
        ("\ufeff\u2066\u202e", "\\ufeff\\u2066\\u202e"),
        ("\ud800", "\\ud800"),  # a lone surrogate: no UTF-8 can write it
        ("\U000e0041", "\\U000e0041"),  # a tag character
        ("M=64,é,漢,😀 x", "M=64,é,漢,😀 x"),  # letters, symbols and spaces are text
    ):
        assert visible(hidden) == shown
        shown.encode("utf-8")
    long = "k" * 10_000 + "\x1b"
    assert visible(long) == "k" * 4096 + "... (5,905 more characters)"
    assert figure_text("$" + "a" * 1000).startswith(r"\$a") and len(figure_text("a" * 1000)) < 300


#: a few hostile strings together, as one value
MIXED = ["\x1b]52;c;cHduZWQ=\x07[/x]\u200b$\\frac{1}{$\u202e", "\x9b2J[link=http://x]:smile:\u2028\ufeff\x00"]


def planted_everywhere(swept: Path, folder: Path, hostile: str, *, device: bool) -> Path:
    """:func:`planted` with ``hostile`` also in the winner's config, a failed trial's message, the
    sweep's host and the device's software versions (``device``: in its name too; else the
    device stays this machine's, so that its winners are measured and served here)."""
    key = KEY + hostile.replace("\x00", "")  # a key holding NUL is no key (tunesvc.checks)
    db = planted(swept, folder, key=key, device=("GPU" + hostile) if device else None, name="all.db")
    connection = sqlite3.connect(db)
    with connection:
        config = json.loads(connection.execute("SELECT config FROM tunesvc_winners").fetchone()[0])
        config["VARIANT"] = "grouped" + hostile
        connection.execute("UPDATE tunesvc_winners SET config = ?", (json.dumps(config),))
        connection.execute(
            "UPDATE tunesvc_trials SET message = ?, status = 'failed' WHERE id NOT IN "
            "(SELECT trial_id FROM tunesvc_winners)",
            ("message" + hostile,),
        )
        connection.execute("UPDATE tunesvc_sweeps SET host = ?", ("host" + hostile,))
        connection.execute(
            "UPDATE tunesvc_devices SET driver = ?, torch = ?, triton = ?",
            ("d" + hostile, "t" + hostile, "x" + hostile),
        )
    connection.close()
    return db


@pytest.mark.parametrize("hostile", MIXED)
@pytest.mark.parametrize("device", [True, False], ids=["device-named", "this-device"])
def test_stored_strings_reach_every_command_and_the_report_page_as_text(swept, tmp_path, hostile, device):
    db = planted_everywhere(swept, tmp_path, hostile, device=device)
    before = db.read_bytes()
    for args in (
        ("show", "--json"),
        ("misses", "--json"),
        ("lookup", "matmul", "--shape", SHAPE),
        ("verify", "--budget", "1"),
        ("export", "--out", str(tmp_path / "bundles")),
        ("selector", "matmul"),
        ("evaluate", "matmul"),
        ("db", "current"),
        ("report", "--out", str(tmp_path / "report")),
    ):
        result = invoke(*args, "--db", str(db))
        output = result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
        assert "Traceback" not in output and "MarkupError" not in output, (args, output)
        assert not UNSHOWN.search(output), (args, repr(output))
    assert db.read_bytes() == before, "a read changed the database"
    page = (tmp_path / "report" / "report.html").read_text()
    assert not UNSHOWN.search(page) and "<script" not in page
    assert f"driver {html.escape(visible('d' + hostile))}," in page  # the device's driver, in its section


def test_warnings_of_a_users_program_show_stored_strings_as_text(swept, tmp_path):
    """A stored key and config reach the runtime's warning (the winner lies outside the space)
    inside a user's program, under `tune run` too: escaped, never acted on."""
    db = planted_everywhere(swept, tmp_path, MIXED[0], device=False)
    program = tmp_path / "user.py"
    program.write_text("import tunesvc\nprint(tunesvc.lookup('matmul', M=64, N=45, K=29, dtype='float16').source)\n")
    env = {**os.environ, "TUNESVC_DB": str(db), "TRITON_INTERPRET": "1"}
    for command in (
        [sys.executable, str(program)],
        [sys.executable, "-m", "tunesvc", "run", "--", sys.executable, str(program)],
    ):
        run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert run.returncode == 0 and run.stdout.strip() == "heuristic", (run.stdout, run.stderr)
        assert "lie outside its space" in run.stderr and "\\x1b]52;c;cHduZWQ=\\x07" in run.stderr, run.stderr
        assert not UNSHOWN.search(run.stderr), repr(run.stderr)


def test_strings_of_megabytes_are_cut_where_shown(swept, tmp_path):
    """A device and a kernel named with a million characters: each command shows a few
    thousand of them and says how many more there are; the report's figures are drawn at once
    (matplotlib took minutes to lay out such a title)."""
    huge = "G" * 1_000_000
    db = planted(swept, tmp_path, device=huge)
    for args in (("show", "--all-versions"), ("misses",), ("verify",)):
        result = invoke(*args, "--db", str(db))
        assert result.exit_code == 0, result.output
        assert len(result.output) < 40_000 and "more characters" in result.output, (args, len(result.output))
    result = invoke("report", "--db", str(db), "--out", str(tmp_path / "report"))
    assert result.exit_code == 0, result.output
    page = (tmp_path / "report" / "report.html").read_text()
    assert "more characters" in page and len(page) < 1_000_000 and page.count("data:image/png;base64,") >= 3


# -- names ------------------------------------------------------------------------------------------
def test_library_names_of_kernels_are_accepted_and_a_near_miss_is_named():
    for library, template in (("layer_norm", "layernorm"), ("rms_norm", "rmsnorm"), ("decode_attention", "decode")):
        result = invoke("space", library, "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["kernel"] == template
    result = invoke("space", "layer_nrom")
    assert result.exit_code == 1
    assert "Unknown kernel 'layer_nrom' (did you mean 'layer_norm'?)" in result.output
    result = invoke("sweep", "matmul", "--shape", SHAPE, "--strategy", "optunaa", "--db", "x.db")
    assert result.exit_code == 1 and "did you mean 'optuna'?" in result.output
    assert not Path("x.db").exists()


@pytest.mark.parametrize(
    ("library", "template", "shape"),
    [
        ("layer_norm", "layernorm", "4096x4096"),
        ("rms_norm", "rmsnorm", "4096x4096"),
        ("decode_attention", "decode", "1x32x8x4096x128"),
    ],
)
def test_every_command_that_names_a_kernel_takes_the_librarys_name(library, template, shape, tmp_path):
    """`tune kernels` lists the library's names beside the templates', and show, export, lookup,
    selector and evaluate take them for the template's (stored data keeps the template's name)."""
    listed = json.loads(invoke("kernels", "--json").stdout)
    assert library in next(r["aliases"] for r in listed if r["name"] == template)
    assert f"{library} = {template}" in " ".join(invoke("kernels").stdout.split())
    example = str(tmp_path / "example.db")  # a copy: selector opens its database to write
    shutil.copy(Path(__file__).parents[1] / "tune.db.example", example)
    by_template = invoke("show", "--kernel", template, "--db", example, "--json")
    by_library = invoke("show", "--kernel", library, "--db", example, "--json")
    assert by_library.exit_code == 0 and by_library.stdout == by_template.stdout
    assert {w["kernel"] for w in json.loads(by_library.stdout)["winners"]} == {template}
    assert invoke("export", "--kernel", library, "--db", example, "--out", str(tmp_path / "b")).exit_code == 0
    [bundle] = (tmp_path / "b").iterdir()
    assert set(json.loads(bundle.read_text())["kernels"]) == {template}
    answer = invoke("lookup", library, "--shape", shape, "--dtype", "bfloat16", "--db", example, "--json")
    assert answer.exit_code == 0 and json.loads(answer.stdout)["kernel"] == template
    for command in ("selector", "evaluate"):  # no winner on this device: refused, by the template's name
        result = invoke(command, library, "--db", example)
        assert result.exit_code == 1 and f"of {template} " in result.output and "Unknown" not in result.output


def test_a_filter_that_matches_nothing_is_one_sentence_and_exit_1(swept, tmp_path):
    db = tmp_path / "copy.db"
    shutil.copy(swept, db)
    before = db.read_bytes()
    for args, fragment in (
        (("show", "--kernel", "nope"), "--kernel 'nope'"),
        (("show", "--kernel", "matmu"), "(did you mean 'matmul'?)"),
        (("show", "--device", "H100"), "--device 'H100'"),
        (("show", "--shape", "M=3"), "--shape 'M=3'"),
        (("show", "--kernel", "layernorm"), "it holds winners of matmul"),
        (("export", "--kernel", "matmu", "--out", str(tmp_path / "x.json")), "did you mean 'matmul'?"),
        (("verify", "--kernel", "nope"), "--kernel 'nope'"),
        (("misses", "--kernel", "a:b"), "No misses"),
        (("report", "--kernel", "matmu", "--out", str(tmp_path / "r")), "did you mean 'matmul'?"),
    ):
        result = invoke(*args, "--db", str(db))
        assert result.exit_code == 1, (args, result.output)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error: ") and fragment in lines[0], (args, result.output)
    assert db.read_bytes() == before
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "r").exists()
    # the library's name filters as the template's
    result = invoke("show", "--kernel", "matmul", "--db", str(db))
    assert result.exit_code == 0 and "1 winner" in result.output


# -- files ------------------------------------------------------------------------------------------
def test_report_never_writes_through_a_planted_link(swept, tmp_path):
    out = tmp_path / "shared"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (out / "report.html").symlink_to(victim)
    result = invoke("report", "--db", str(swept), "--out", str(out))
    assert result.exit_code == 1 and "symbolic link" in result.output, result.output
    assert victim.read_text() == "precious" and (out / "report.html").is_symlink()
    # a dangling link: its target is never created
    (out / "report.html").unlink()
    (out / "report.html").symlink_to(tmp_path / "elsewhere.html")
    result = invoke("report", "--db", str(swept), "--out", str(out))
    assert result.exit_code == 1 and not (tmp_path / "elsewhere.html").exists()
    # a file the report did not write is kept; a report it wrote is replaced
    (out / "report.html").unlink()
    (out / "report.html").write_text("my notes")
    result = invoke("report", "--db", str(swept), "--out", str(out))
    assert result.exit_code == 1 and "is not a tunesvc report" in result.output
    assert (out / "report.html").read_text() == "my notes"
    (out / "report.html").unlink()
    assert invoke("report", "--db", str(swept), "--out", str(out)).exit_code == 0
    first = (out / "report.html").stat().st_mtime_ns
    assert invoke("report", "--db", str(swept), "--out", str(out)).exit_code == 0
    assert (out / "report.html").stat().st_mtime_ns >= first
    assert sorted(p.name for p in out.iterdir()) == ["report.html"]  # no temporary file left


def test_export_never_writes_through_a_planted_temporary_name_or_link(swept, tmp_path):
    out = tmp_path / "bundles"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    [name] = bundle_filenames([_hardware_id(swept)]).values()
    (out / f".{name}.partial").symlink_to(victim)  # the old fixed temporary name
    result = invoke("export", "--db", str(swept), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert victim.read_text() == "precious"
    assert json.loads((out / name).read_text())["format"] == "tunesvc-bundle"
    # the same device's bundle is replaced; a link in its place, or a file of someone else's, is not
    assert invoke("export", "--db", str(swept), "--out", str(out)).exit_code == 0
    (out / name).unlink()
    (out / name).symlink_to(victim)
    result = invoke("export", "--db", str(swept), "--out", str(out))
    assert result.exit_code == 1 and "symbolic link" in result.output
    assert victim.read_text() == "precious"
    (out / name).unlink()
    (out / name).write_text("{}")
    result = invoke("export", "--db", str(swept), "--out", str(out))
    assert result.exit_code == 1 and "is not a bundle of" in result.output
    assert (out / name).read_text() == "{}"
    # a .json file named by --out: a bundle is replaced, another file is kept
    named = tmp_path / "package.json"
    named.write_text('{"name": "mine"}')
    result = invoke("export", "--db", str(swept), "--out", str(named))
    assert result.exit_code == 1 and named.read_text() == '{"name": "mine"}'


def _hardware_id(db: Path) -> str:
    connection = sqlite3.connect(db)
    try:
        return connection.execute("SELECT hardware_id FROM tunesvc_devices").fetchone()[0]
    finally:
        connection.close()


def test_devices_whose_ids_give_one_file_name_get_one_file_each(swept, tmp_path):
    assert bundle_filename("GPU a/b") == bundle_filename("GPU a_b")
    names = bundle_filenames(["GPU a/b", "GPU a_b", "NVIDIA H100"])
    assert len(set(names.values())) == 3 and names["NVIDIA H100"] == "NVIDIA_H100.json"
    assert names["GPU a/b"] == f"GPU_a_b-{hashlib.sha256(b'GPU a/b').hexdigest()[:8]}.json"
    # a database holding both devices: two bundles, each of its own device
    db = tmp_path / "two.db"
    shutil.copy(swept, db)
    connection = sqlite3.connect(db)
    with connection:
        row = connection.execute("SELECT * FROM tunesvc_devices").fetchone()
        columns = [d[0] for d in connection.execute("SELECT * FROM tunesvc_devices").description]
        connection.execute("UPDATE tunesvc_devices SET name = 'GPU a/b', hardware_id = 'GPU a/b'")
        other = dict(zip(columns, row), id=row[0] + 1, fingerprint="other", name="GPU a_b", hardware_id="GPU a_b")
        connection.execute(
            f"INSERT INTO tunesvc_devices ({', '.join(other)}) VALUES ({', '.join('?' * len(other))})",
            list(other.values()),
        )
        winner = connection.execute("SELECT * FROM tunesvc_winners").fetchone()
        wcolumns = [d[0] for d in connection.execute("SELECT * FROM tunesvc_winners").description]
        copy = dict(zip(wcolumns, winner), id=winner[0] + 1, device_id=row[0] + 1)
        connection.execute(
            f"INSERT INTO tunesvc_winners ({', '.join(copy)}) VALUES ({', '.join('?' * len(copy))})",
            list(copy.values()),
        )
    connection.close()
    out = tmp_path / "out"
    result = invoke("export", "--db", str(db), "--out", str(out))
    assert result.exit_code == 0, result.output
    held = {json.loads(p.read_text())["device"]["hardware_id"] for p in out.glob("*.json")}
    assert held == {"GPU a/b", "GPU a_b"}
    # one device exported alone into a folder holding the other's bundle under the plain name
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "GPU_a_b.json").write_text((out / names["GPU a_b"]).read_text())
    result = invoke("export", "--db", str(db), "--device", "GPU a/b", "--out", str(alone))
    assert result.exit_code == 0, result.output
    assert json.loads((alone / "GPU_a_b.json").read_text())["device"]["hardware_id"] == "GPU a_b"
    assert json.loads((alone / names["GPU a/b"]).read_text())["device"]["hardware_id"] == "GPU a/b"


# -- numbers and paths out of range -----------------------------------------------------------------
def test_huge_counts_and_long_paths_are_one_sentence(swept, tmp_path):
    long = "a" * 300
    for args, fragment in (
        (("sweep", "matmul", "--shape", SHAPE, "--budget", str(2**63), "--db", "n.db"), "--budget must be at most"),
        (("sweep", "matmul", "--shape", SHAPE, "--patience", str(2**63), "--db", "n.db"), "--patience must be"),
        (("sweep", "matmul", "--shape", SHAPE, "--workers", str(2**63), "--db", "n.db"), "--workers must be"),
        (("verify", "--budget", str(2**63), "--db", str(swept)), "--budget must be at most"),
        (("report", "--db", str(swept), "--out", long), "File name too long"),
        (("export", "--db", str(swept), "--out", long), "File name too long"),
        (("export", "--db", str(swept), "--out", long + ".json"), "File name too long"),
        (("show", "--db", f"{long}/x.db"), "File name too long"),
        (("lookup", "matmul", "--shape", SHAPE, "--db", long), "File name too long"),
    ):
        result = invoke(*args)
        assert result.exit_code == 1, (args, result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and fragment in lines[0] and len(lines[0]) < 250, (args, result.output)
    assert not Path("n.db").exists()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("sweep", "matmul", "--shape", SHAPE, "--budget", "0"), "--budget must be at least 1"),
        (("sweep", "matmul", "--shape", SHAPE, "--budget", "-1"), "--budget must be at least 1"),
        (("sweep", "matmul", "--shape", SHAPE, "--patience", "0"), "--patience must be at least 1"),
        (("sweep", "matmul", "--shape", SHAPE, "--workers", "-1"), "--workers must be from 0"),
        (("sweep", "matmul", "--shape", SHAPE, "--seed", "-1"), "--seed must be from 0"),
        (("sweep", "matmul", "--shape", SHAPE, "--seed", str(2**63)), "--seed must be from 0"),
        (("sweep", "matmul", "--shape", SHAPE, "--time-budget", "nan"), "--time-budget must be a positive"),
        (("sweep", "matmul", "--shape", SHAPE, "--time-budget", "-1"), "--time-budget must be a positive"),
        (("verify", "--margin", "nan"), "--margin must be at least 0"),
        (("verify", "--margin", "inf"), "--margin must be at least 0"),
        (("verify", "--margin", "-1"), "--margin must be at least 0"),
        (("verify", "--retune", "--budget", "0"), "--budget must be at least 1"),
        (("selector", "matmul", "--min-coverage", "nan"), "--min-coverage must be in (0, 1]"),
    ],
)
def test_counts_and_fractions_out_of_range_are_one_sentence_and_change_nothing(swept, tmp_path, args, fragment):
    """Zero, negative, NaN and infinite values of numeric options: one line, exit 1, the database
    as it was (a NaN margin once compared false with every time and flagged nothing)."""
    db = tmp_path / "kept.db"
    shutil.copy(swept, db)
    before = db.read_bytes()
    result = invoke(*args, "--db", str(db))
    assert result.exit_code == 1, (args, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0], (args, result.output)
    assert db.read_bytes() == before


# -- a database URL's password ----------------------------------------------------------------------
def test_no_command_prints_the_password_of_a_database_url(tmp_path):
    """Tables' titles, counts and errors name a PostgreSQL database by its URL with the password
    written as ***; the password itself never reaches the output (logs, CI)."""
    for url in pg_database():
        password = make_url(url).password
        assert password
        outputs = []
        for args in (
            ("sweep", "matmul", "--shape", SHAPE, "--budget", "1"),
            ("sweep", "matmul", "--shape", SHAPE, "--budget", "1", "--gpus", "0"),
            ("show",),
            ("show", "--kernel", "nope"),
            ("export", "--out", str(tmp_path / "b")),
            ("import", str(tmp_path / "b")),
            ("misses",),
            ("verify", "--kernel", "nope"),
        ):
            result = invoke(*args, "--db", url)
            outputs.append(result.output)
            assert f":{password}@" not in result.output, (args, result.output)
        assert all("***@" in output for output in outputs[:4]), outputs


# -- the command's name -----------------------------------------------------------------------------
def test_hints_name_the_command_that_was_run(swept, tmp_path):
    script = Path(sys.executable).parent / "tunesvc"
    if not script.exists():
        pytest.skip("tunesvc is not installed as a script beside this interpreter")
    run = subprocess.run(
        [str(script), "show", "--kernel", "nope", "--db", str(swept)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1 and "`tunesvc show`" in run.stderr and "`tune show`" not in run.stderr, run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "tunesvc", "show", "--kernel", "nope", "--db", str(swept)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and "`python -m tunesvc show`" in run.stderr, run.stderr


def test_tune_beside_this_interpreter_is_tunesvc():
    """The README's test command installs the test extra, whose Ray brings a `tune` of its own,
    then tunesvc once more: in the environment it made (this one), `tune` is tunesvc's."""
    script = Path(sys.executable).parent / "tune"
    if not script.exists():
        pytest.skip("tunesvc is not installed as a script beside this interpreter")
    run = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("tunesvc "), (run.stdout, run.stderr)


def test_the_readme_installs_tunesvc_after_its_extras():
    readme = (Path(__file__).parent.parent / "README.md").read_text().splitlines()
    command = readme[readme.index("<!-- test-command -->") + 2]
    installs = [part.strip() for part in command.split("&&") if "pip install" in part]
    assert "'.[test]'" in installs[0] and installs[-1].endswith("pip install -q --no-deps -e ."), installs


def test_hints_in_backquotes_name_the_program_and_other_words_stay(monkeypatch):
    from tunesvc.cli import named
    from tunesvc.cli import program

    monkeypatch.setattr(sys, "argv", ["/venv/bin/tunesvc", "show"])
    assert program() == "tunesvc"
    text = "run `tune sweep` first, or tune it in mode 'tune'; `tune db upgrade` migrates it"
    assert named(text) == "run `tunesvc sweep` first, or tune it in mode 'tune'; `tunesvc db upgrade` migrates it"
    monkeypatch.setattr(sys, "argv", ["/venv/bin/tune", "show"])
    assert named(text) == text


RAYS_TUNE = "#!/venv/bin/python\nimport sys\nfrom ray.tune.cli.scripts import cli\nsys.exit(cli())\n"
OURS = "#!/venv/bin/python\nimport sys\nfrom tunesvc.cli import main\nsys.exit(main())\n"


@pytest.mark.parametrize(("script", "name"), [(RAYS_TUNE, "tunesvc"), (OURS, "tune"), (None, "tune")])
def test_hints_outside_the_cli_name_the_command_that_runs_tunesvc_here(script, name, tmp_path, monkeypatch, swept):
    """`pip install -e '.[ray]'` installs tunesvc, then Ray, whose `tune` takes the name: a hint
    printed in a user's program (no CLI of tunesvc's was typed) then names `tunesvc`."""
    from tunesvc.command import program
    from tunesvc.command import tune_is_tunesvc
    from tunesvc.serving.runtime import Runtime

    scripts = tmp_path / "bin"
    scripts.mkdir()
    if script is not None:
        (scripts / "tune").write_text(script)
    monkeypatch.setattr(sys, "executable", str(scripts / "python"))
    monkeypatch.setattr(sys, "argv", ["train.py"])
    tune_is_tunesvc.cache_clear()
    try:
        assert program() == name
        with pytest.warns(RuntimeWarning, match="using the heuristic one") as caught:
            Runtime(db=str(swept)).lookup("matmul", M=8, N=8, K=8, dtype="bfloat16")
    finally:
        tune_is_tunesvc.cache_clear()
    [said] = [str(w.message) for w in caught if "heuristic one" in str(w.message)]
    assert f"tune it with `{name} sweep`" in said, said


def test_the_resume_command_of_an_interrupted_sweep_hides_a_url_password():
    """Ctrl-C prints the sweep's command to run again: its --db URL's password as ***."""
    sweep = typer.main.get_command(app).commands["sweep"]
    url = "postgresql+psycopg://tunesvc:s3cret@127.0.0.1:5432/tunesvc"
    ctx = sweep.make_context("sweep", ["matmul", "--shape", "64x64x64", "--db", url])
    command = _command_line(ctx, ctx.params["db"])
    assert "s3cret" not in command and "tunesvc:***@127.0.0.1:5432/tunesvc" in command, command
    ctx = sweep.make_context("sweep", ["matmul", "--shape", "64x64x64", "--db", "runs/tune.db"])
    assert _command_line(ctx, ctx.params["db"]).endswith("--db runs/tune.db")
