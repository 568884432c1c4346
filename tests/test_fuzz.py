"""Seeded fuzzing and faults: files and arguments from anyone must never run code, hang or crash.

Every case is a mutation drawn from a generator seeded per test (SEED), so a failure reproduces
exactly. Over space files, constraint expressions, bundles, damaged databases and command lines
the suite asserts: no traceback (only TunesvcError, or typer's own usage errors in the CLI),
every case done within DEADLINE_S, no exit 0 on bad input, no file created or changed by a
failing command, and no code executed from data (a planted pickle, a planted module).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tunesvc
from tunesvc import TunesvcError
from tunesvc.cli import app
from tunesvc.serving.runtime import Runtime
from tunesvc.space import Expression
from tunesvc.space import Space
from tunesvc.store import Store
from tunesvc.template import SHIPPED

SEED = 20261124
#: the most seconds any one case may take (a hang is a failure, not a stuck suite)
DEADLINE_S = 5
SMALL = {"M": 33, "N": 45, "K": 29}


class Hang(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float = DEADLINE_S):
    """Fail a case that runs longer than ``seconds`` (SIGALRM: pytest runs tests in the main thread)."""

    def expire(*_):
        raise Hang(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def one_line(message: str) -> str:
    assert message and "\n" not in message and "Traceback" not in message, message
    return message


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` and its content hash: what a failing command must leave as it was."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def assert_refused(result, args) -> None:
    """A bad invocation: non-zero exit, no exception but SystemExit, one line (typer's usage box aside)."""
    assert result.exit_code != 0, (args, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
    assert "Traceback" not in result.output, (args, result.output)
    if result.exit_code == 1:  # a TunesvcError; 2 is typer's own usage error
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error: "), (args, result.output)


# -- space files --------------------------------------------------------------------------------
EXPRESSION_ATOMS = ["BLOCK_M", "M", "num_warps", "0", "1", "3", "2**64", "1e308", "'x'", "-1", "True", "0.5"]
BAD_EXPRESSIONS = [
    "9**9**9 > 0",
    " + ".join(["M"] * 250) + " > 0",
    "cdiv(M, 2, 3) > 0",
    "abs(M, 1) > 0",
    "min() > 0",
    "max(M) > 0",
    "next_pow2() > 0",
    "M / 0 > 1",
    "M % 0 == 1",
    "cdiv(M, 0) > 1",
    "(" * 5000 + "M" + ")" * 5000 + " > 0",
    "(" * 40 + "M" + ")" * 40 + " > 0",
    "M ** 65 > 0",
    "M ** -1 > 0",
    "M ** 0.5 > 0",
    "M < 10000000000000000000000000000",
    "__import__('os').system('touch pwned') == 0",
    "M.__class__ == 1",
    "[M][0] > 0",
    "min(*[M]) > 0",
    "lambda: 1",
    "M if",
    "\x00",
    "M" * 2000 + " > 0",
]


def _mutate_toml(text: str, rng: random.Random) -> bytes:
    """One mutation of a space file's text; each kind is one a hand or a broken copy makes."""
    lines = text.splitlines()
    kind = rng.randrange(12)
    i = rng.randrange(len(lines)) if lines else 0
    if kind == 0:  # a constraint replaced by a hostile expression
        return (text + f'\n[constraints]\nfuzz = "{rng.choice(BAD_EXPRESSIONS)}"\n').encode("utf-8", "surrogatepass")
    if kind == 1:  # a random expression of the grammar's atoms and operators
        parts = [rng.choice(EXPRESSION_ATOMS)]
        for _ in range(rng.randrange(1, 12)):
            parts += [
                rng.choice(["+", "*", "-", "//", "%", "**", "<", "==", "and", "or", ","]),
                rng.choice(EXPRESSION_ATOMS),
            ]
        fn = rng.choice(["", "min", "max", "abs", "cdiv", "next_pow2"])
        return (text + f'\n[constraints]\nfuzz = "{fn}({" ".join(parts)}) > 0"\n').encode()
    if kind == 2:  # invalid UTF-8
        data = bytearray(text.encode())
        data[rng.randrange(len(data))] = rng.choice([0xFF, 0xC0, 0x80])
        return bytes(data)
    if kind == 3:  # truncated anywhere
        return text.encode()[: rng.randrange(len(text))]
    if kind == 4:  # deep nesting
        depth = rng.choice([50, 1000, 5000])
        return (text + "\nfuzz = " + "[" * depth + "]" * depth + "\n").encode()
    if kind == 5:  # a huge grid: 41 choices for six parameters
        extra = "".join(f"P{j} = [{', '.join(map(str, range(1, 42)))}]\n" for j in range(6))
        return text.replace("[params]\n", "[params]\n" + extra, 1).encode()
    if kind == 6:  # a value of the wrong type or size
        value = rng.choice(['"x"', "1.5", "true", "{}", "[[1]]", str(2**62), "-4", '["a", 1]', "[]", '""'])
        if "=" in lines[i] and not lines[i].lstrip().startswith("["):
            lines[i] = lines[i].split("=", 1)[0] + "= " + value
        return "\n".join(lines).encode()
    if kind == 7:  # an unknown section or table key
        return (
            text + rng.choice(["\n[tuning]\nx = 1\n", "\n[params.sub]\nx = [1]\n", "\n[launch]\nthreads = [4]\n"])
        ).encode()
    if kind == 8:  # a name that is not an identifier
        return text.replace("[params]\n", '[params]\n"BLOCK M" = [1]\n', 1).encode()
    if kind == 9:  # a text parameter used as a number
        return (
            text.replace("[params]\n", '[params]\nFUZZ = ["a", "b"]\n', 1) + '\n[constraints]\nfuzz2 = "FUZZ * 2 > 1"\n'
        ).encode()
    if kind == 10:  # a line dropped
        del lines[i]
        return "\n".join(lines).encode()
    return (text + "\n" + "".join(rng.choice("[]{}=\"',.#\n") for _ in range(40))).encode()  # noise


FILE_LEVEL = ("not valid TOML", "not UTF-8", "is a folder", "nests tables too deeply", "space file not found")


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_fuzzed_space_files_fail_cleanly_and_quickly(name, tmp_path, device):
    template = tunesvc.get_template(name)
    text = Path(template.space_path).read_text()
    rng = random.Random(f"{SEED}:{name}")
    dims = dict(zip(template.dims, (3, 45, 29, 17, 33)))
    dims.update({k: v for k, v in (("D", 64), ("HKV", 1)) if k in dims})  # head dims of 64 or 128; HQ % HKV == 0
    options = {name: allowed[0] for name, allowed in template.options.items()}
    problem = template.problem_vars(template.problem(**dims, **options))
    loaded = refused = 0
    for case in range(16):
        data = _mutate_toml(text, rng)
        path = tmp_path / f"{case}.toml"
        path.write_bytes(data)
        with deadline():
            try:
                space = Space.from_toml(path, problem_vars=tuple(template.problem_vars_names()))
            except TunesvcError as exc:
                message = one_line(str(exc))
                assert str(path) in message
                assert "[" in message or any(f in message for f in FILE_LEVEL), message
                refused += 1
                continue
            loaded += 1
            try:
                space.feasible(problem, device.limits())
            except TunesvcError as exc:  # a constraint that cannot be evaluated names itself
                assert "[constraints." in one_line(str(exc))
    assert refused >= 8, (loaded, refused)  # most mutations break the file


def test_directory_as_space_file_and_expression_bounds(tmp_path):
    folder = tmp_path / "space.toml"
    folder.mkdir()
    with pytest.raises(TunesvcError, match="is a folder"):
        Space.from_toml(folder)
    for source in BAD_EXPRESSIONS:
        with deadline(1), pytest.raises(ValueError) as info:
            Expression(source)
        one_line(str(info.value))


def test_random_expressions_load_or_refuse_and_never_raise_raw_errors():
    rng = random.Random(SEED)
    env_choices = [0, 1, 7, 2**40, -3, 10**18]
    evaluated = 0
    for _ in range(400):
        parts = [rng.choice(EXPRESSION_ATOMS[:7])]
        for _ in range(rng.randrange(1, 8)):
            op = rng.choice(["+", "*", "-", "/", "//", "%", "**", "<", "<=", "==", " and ", " or "])
            parts += [op, rng.choice(EXPRESSION_ATOMS[:7])]
        source = "".join(parts)
        if rng.random() < 0.3:
            source = f"{rng.choice(['min', 'max', 'abs', 'cdiv', 'next_pow2'])}({source}, M)"
        with deadline(1):
            try:
                expr = Expression(source)
            except ValueError as exc:
                one_line(str(exc))
                continue
            space = Space.from_dict(
                {"params": {"BLOCK_M": [16, 32]}, "constraints": {"c": source}}, problem_vars=("M", "num_warps")
            )
            env = {"M": rng.choice(env_choices), "num_warps": rng.choice(env_choices), "BLOCK_M": 16}
            try:
                space._holds("c", expr, env)
                evaluated += 1
            except TunesvcError as exc:
                assert "[constraints.c]" in one_line(str(exc))
    assert evaluated > 50


def test_space_of_41_to_the_6_configs_is_refused_at_once(tmp_path):
    path = tmp_path / "big.toml"
    path.write_text("[params]\n" + "".join(f"P{j} = [{', '.join(map(str, range(1, 42)))}]\n" for j in range(6)))
    with deadline(1), pytest.raises(TunesvcError, match=r"\[params\] spans 4,750,104,241 configs"):
        Space.from_toml(path)


# -- bundles ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def good_bundle(tmp_path_factory):
    """A real bundle of matmul winners on this device (written by `tune export`), its database, and its winners."""
    folder = tmp_path_factory.mktemp("bundle")
    template = tunesvc.get_template("matmul")
    device = tunesvc.current_device()
    configs = template.space.feasible(template.problem_vars(template.problem(**SMALL)), device.limits())
    db = folder / "source.db"
    store = Store(db)
    try:
        for i, config in enumerate(configs[:4]):
            key = str(template.key(template.problem(M=16 * (i + 1), N=45, K=29)))
            store.merge_winner("matmul", template.version, device, key, config, 0.5 + i, "test")
    finally:
        store.close()
    path = folder / "good.json"
    result = invoke("export", "--out", str(path), "--db", str(db))
    assert result.exit_code == 0, result.output
    return path


def _leaves(data, at=()):
    """(path, value) of every value in a JSON document, the root excepted."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield (*at, k), v
            yield from _leaves(v, (*at, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield (*at, i), v
            yield from _leaves(v, (*at, i))


OPTIONAL = {"name", "capability", "sm_count", "torch", "triton"}
REQUIRED = {
    "format",
    "format_version",
    "device",
    "kernels",
    "hardware_id",
    "version",
    "winners",
    "configs",
    "config",
    "time_ms",
}


def _wrong_type(value, rng: random.Random):
    """A value that is wrong wherever ``value`` stood in a bundle."""
    if isinstance(value, bool) or value is None:
        return rng.choice(["x", [], {}])
    if isinstance(value, int):
        return rng.choice(["x", None, [], {}, 1.5, True, 10**30, -(10**30)])
    if isinstance(value, float):
        return rng.choice(["x", None, -1.0, 0, True, [], "__INF__", "__NAN__"])
    if isinstance(value, str):
        return rng.choice([None, 1.5, [], {}, True, 7])
    return rng.choice(["x", 1, [], None] if isinstance(value, dict) else ["x", 1, {}, None])


def _mutate_bundle(text: str, rng: random.Random) -> bytes:
    """One mutation that always makes the bundle invalid."""
    data = json.loads(text)
    kind = rng.randrange(8)
    if kind == 0:
        return text.encode()[: rng.randrange(1, len(text) - 1)]  # truncated
    if kind == 1:  # a config nested deeply (a deep document anywhere else in matmul's section is ignored)
        depth = rng.choice([1000, 100_000])
        return text.replace('"configs": {', '"configs": {"deep": ' + "[" * depth + "]" * depth + ", ", 1).encode()
    if kind == 2:
        raw = bytearray(text.encode())
        raw[rng.randrange(len(raw))] = 0xFF  # invalid UTF-8
        return bytes(raw)
    leaves = [(p, v) for p, v in _leaves(data) if p[-1] not in OPTIONAL or kind == 3]
    path, value = rng.choice(leaves)
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    if kind == 4:  # a required field missing
        path, _ = rng.choice([(p, v) for p, v in _leaves(data) if p[-1] in REQUIRED])
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        del parent[path[-1]]
    elif kind == 5:  # a config outside the schema
        configs = data["kernels"]["matmul"]["configs"]
        digest = rng.choice(sorted(configs))
        configs[digest] = rng.choice([{}, {"BLOCK_M": 10**30}, {"BLOCK_M": 1.5}, {"BLOCK_M": True}, {"not a name": 1}])
    elif kind == 6:  # device fields
        data["device"][rng.choice(["capability", "sm_count", "hardware_id"])] = rng.choice(
            ["abc", -1, None, 10**30, ""]
        )
        if data["device"].get("hardware_id") in ("abc",):
            data["device"]["hardware_id"] = None
    else:
        parent[path[-1]] = _wrong_type(value, rng)
    out = json.dumps(data)
    return out.replace('"__INF__"', "Infinity").replace('"__NAN__"', "NaN").encode()


def test_fuzzed_bundles_are_refused_by_import_and_lookup_and_fall_back_in_the_runtime(good_bundle, tmp_path, device):
    text = good_bundle.read_text()
    rng = random.Random(SEED)
    target = tmp_path / "target.db"
    assert invoke("import", str(good_bundle), "--db", str(target)).exit_code == 0  # a database to import into
    target_before = snapshot(tmp_path)
    for case in range(60):
        data = _mutate_bundle(text, rng)
        path = tmp_path / f"bad{case}.json"
        path.write_bytes(data)
        before = {**target_before, path.name: hashlib.sha256(data).hexdigest()}
        with deadline():
            result = invoke("import", str(path), "--db", str(target))
        assert_refused(result, ("import", case, data[:300]))
        with deadline():
            result = invoke("lookup", "matmul", "--shape", "16x45x29", "--bundle", str(path))
        assert_refused(result, ("lookup", case, data[:300]))
        with deadline(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = Runtime(bundle=path, device=device).lookup("matmul", M=16, N=45, K=29)
        # the whole kernel falls back, or (a config outside the space) only the entries it names
        assert found.source in ("heuristic", "exact"), (case, data[:300])
        assert any(str(path) in str(w.message) for w in caught), (case, [str(w.message) for w in caught])
        assert {k: v for k, v in snapshot(tmp_path).items() if k in before} == before
        assert set(snapshot(tmp_path)) == set(before), "a failing command created a file"
        path.unlink()
        target_before = snapshot(tmp_path)


def test_configs_outside_the_space_fall_back_once_with_a_warning_naming_the_entry(good_bundle, tmp_path, device):
    data = json.loads(good_bundle.read_text())
    section = data["kernels"]["matmul"]
    keys = sorted(section["winners"])
    section["configs"]["odd"] = {"BLOCK_M": 48}  # a whole number, but not a choice
    section["configs"]["unknown"] = {"BLOCK_Q": 16}
    section["winners"][keys[0]]["config"] = "odd"
    section["winners"][keys[1]]["config"] = "unknown"
    path = tmp_path / "outside.json"
    path.write_text(json.dumps(data))
    runtime = Runtime(bundle=path, device=device)
    template = tunesvc.get_template("matmul")
    problem = {**dict(zip(template.dims, (int(p.split("=")[1]) for p in keys[0].split(",")[:3]))), "dtype": "float16"}
    with pytest.warns(RuntimeWarning, match=r"2 stored winner\(s\) of matmul lie outside its space \(first: M="):
        found = runtime.lookup("matmul", **problem)
    assert found.source != "exact"  # the bad entry is not used
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")  # warned once: no second warning for the next lookups
        runtime.lookup("matmul", M=1, N=2, K=3)
    assert [str(w.message) for w in said] == []
    assert_refused(invoke("import", str(path), "--db", str(tmp_path / "t.db")), "outside")
    assert not (tmp_path / "t.db").exists()


# -- damaged databases ---------------------------------------------------------------------------
def _damage(data: bytes, rng: random.Random) -> tuple[bytes, bool]:
    """A damaged copy of a SQLite file, and whether the damage must be detected on open."""
    page = int.from_bytes(data[16:18], "big")
    kind = rng.randrange(5)
    if kind == 0:
        return data[: rng.randrange(1, len(data) - 1)], True  # truncated anywhere
    if kind == 1:
        return bytes(rng.randrange(256) for _ in range(100)) + data[100:], True  # garbage header
    if kind == 2:
        pages = len(data) // page
        i = rng.randrange(1, pages)
        return data[: i * page] + bytes(page) + data[(i + 1) * page :], False  # a page zeroed (maybe a free one)
    if kind == 3:
        raw = bytearray(data)
        for _ in range(rng.randrange(1, 20)):
            at = rng.randrange(100, len(raw))
            raw[at] = rng.randrange(256)
        return bytes(raw), False  # bytes flipped: inside a record, SQLite cannot tell
    return data[:100] + bytes(page - 100) + data[page:], True  # the schema page wiped


def test_damaged_databases_are_refused_or_read_never_crash_and_never_change(good_bundle, tmp_path):
    source = good_bundle.parent / "source.db"
    data = source.read_bytes()
    rng = random.Random(SEED)
    refused = 0
    for case in range(40):
        damaged, must_refuse = _damage(data, rng)
        path = tmp_path / f"d{case}.db"
        path.write_bytes(damaged)
        before = snapshot(tmp_path)
        for args in (
            ("show", "--db", str(path)),
            ("export", "--out", str(tmp_path / f"out{case}.json"), "--db", str(path)),
            ("import", str(good_bundle), "--db", str(path)),
        ):
            with deadline():
                result = invoke(*args)
            if result.exit_code == 0:
                assert not must_refuse, (case, args, result.output)
                before = snapshot(tmp_path)  # a damage SQLite cannot see: the command may write
                continue
            assert_refused(result, (case, args))
            assert snapshot(tmp_path) == before, (case, args, result.output, "a failing command changed a file")
            refused += 1
    assert refused >= 40


def test_read_only_commands_leave_no_side_files(good_bundle, tmp_path):
    db = tmp_path / "wal.db"
    db.write_bytes((good_bundle.parent / "source.db").read_bytes())
    assert invoke("import", str(good_bundle), "--db", str(db)).exit_code == 0  # a writer: WAL mode
    assert not Path(f"{db}-wal").exists()
    before = snapshot(tmp_path)
    for args in (
        ("show", "--db", str(db)),
        ("lookup", "matmul", "--shape", "16x45x29", "--db", str(db)),
        ("db", "current", "--db", str(db)),
    ):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
    assert snapshot(tmp_path) == before  # no -wal, no -shm


def test_read_only_media(good_bundle, tmp_path):
    """A database on a read-only mount is read: no side file is needed (SQLite's immutable mode)."""
    db = tmp_path / "media" / "t.db"
    db.parent.mkdir()
    db.write_bytes((good_bundle.parent / "source.db").read_bytes())
    mount = tmp_path / "ro"
    mount.mkdir()
    if os.geteuid() != 0:
        db.parent.chmod(0o555)  # what a read-only medium looks like to a user: no new file in the folder
        target = db
    else:
        made = subprocess.run(["mount", "--bind", str(db.parent), str(mount)], capture_output=True)
        if made.returncode != 0:
            pytest.skip(f"root without mount rights cannot make a read-only folder here: {made.stderr.decode()[:80]}")
        subprocess.run(["mount", "-o", "remount,ro,bind", str(mount)], check=True)
        target = mount / "t.db"
    try:
        with pytest.raises(OSError):
            (target.parent / "probe").write_text("x")
        result = invoke("show", "--db", str(target), "--json")
        assert result.exit_code == 0, result.output
        assert len(json.loads(result.output)["winners"]) == len(
            json.loads(good_bundle.read_text())["kernels"]["matmul"]["winners"]
        )
        result = invoke("lookup", "matmul", "--shape", "16x45x29", "--db", str(target), "--json")
        assert json.loads(result.output)["source"] == "exact"
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(mount)], check=True)
        else:
            db.parent.chmod(0o755)
    assert sorted(p.name for p in db.parent.iterdir()) == ["t.db"]


# -- command lines ------------------------------------------------------------------------------
BAD_INVOCATIONS = [
    ["space", "matmul", "--shape", "[/x]"],
    ["sweep", "matmul", "--shape", "[/x]"],
    ["lookup", "matmul", "--shape", "[bold]1x2[/bold]x3[/]"],
    ["sweep", "matmul", "--shape", "33x33x33", "--db", ""],
    ["sweep", "matmul", "--shape", "33x33x33", "--db", "sqlite:///"],
    ["sweep", "matmul", "--shape", "33x33x33", "--db", "sqlite://"],
    ["sweep", "matmul", "--shape", "33x33x33", "--db", ":memory:"],
    ["sweep", "matmul", "--shape", "33x33x33", "--workers", "-5"],
    ["sweep", "matmul", "--shape", "33x33x33", "--seed", "-1", "--strategy", "optuna"],
    ["sweep", "matmul", "--shape", "33x33x33", "--seed", str(2**32)],
    ["sweep", "matmul", "--shape", "1000000000000x33x33"],
    ["sweep", "matmul", "--shape", "1000000x1000000x1000000"],
    ["sweep", "matmul", "--shape", "0x33x33"],
    ["sweep", "matmul", "--shape", "-3x33x33"],
    ["sweep", "matmul", "--shape", "33x33"],
    ["sweep", "matmul", "--shape", "1e3x33x33"],
    ["sweep", "matmul", "--shape", "M=33,N=33"],
    ["sweep", "matmul", "--shape", "33x33x33", "--budget", "0"],
    ["sweep", "matmul", "--shape", "33x33x33", "--budget", "-1"],
    ["sweep", "matmul", "--shape", "33x33x33", "--time-budget", "nan"],
    ["sweep", "matmul", "--shape", "33x33x33", "--time-budget", "-1"],
    ["sweep", "matmul", "--shape", "33x33x33", "--patience", "0"],
    ["sweep", "matmul", "--shape", "33x33x33", "--strategy", "nope"],
    ["sweep", "matmul", "--shape", "33x33x33", "--dtype", "int8"],
    ["sweep", "matmul", "--preset", "nope"],
    ["sweep", "matmul"],
    ["sweep", ":", "--shape", "33x33x33"],
    ["sweep", "nope", "--shape", "33x33x33"],
    ["sweep", "os:system", "--shape", "33x33x33"],
    ["sweep", "matmul:", "--shape", "33x33x33"],
    ["sweep", ":matmul", "--shape", "33x33x33"],
    ["space", "..:x"],
    ["lookup", "matmul", "--shape", "33x33x33", "--db", "postgresql://u:secret@h:abc/db"],
    ["show", "--db", "postgresql://u:secret@h:99999999/db"],
    ["show", "--db", "nope://x"],
    ["show", "--db", "missing.db"],
    ["show", "--db", "."],
    ["export", "--db", "missing.db"],
    ["import", "missing.json"],
    ["import", "."],
    ["verify", "--margin", "-1", "--db", "missing.db"],
    ["report", "--db", "missing.db"],
    ["db", "upgrade", "--db", "missing.db"],
    ["db", "current", "--db", "missing.db"],
    ["lookup", "matmul", "--shape", "33x33x33", "--bundle", "."],
    ["lookup", "matmul", "--shape", "33x33x33", "--bundle", "missing.json"],
    ["lookup", "matmul", "--shape", "33x33x33", "--db", "x.db", "--bundle", "y.json"],
]


def test_bad_invocations_are_one_line_and_create_nothing(tmp_path):
    before = snapshot(tmp_path)
    for args in BAD_INVOCATIONS:
        with deadline():
            result = invoke(*args)
        assert_refused(result, args)
        assert "secret" not in result.output, args  # a password never printed
        assert snapshot(tmp_path) == before, (args, "a failing command created or changed a file")


def test_random_argument_values_are_refused_or_run(tmp_path):
    """Seeded garbage in each option of the commands that create nothing: refused in one line, or run."""
    rng = random.Random(SEED)
    junk = ["", "-1", "0", "nan", "inf", "1e400", "[/x]", "[bold]", "x" * 300, "\x1b[31m", "../..", "a:b:c", "💥", "\\"]
    before = snapshot(tmp_path)
    for _ in range(60):
        command = rng.choice(
            [
                ["space", "matmul", "--shape"],
                ["lookup", "matmul", "--shape"],
                ["show", "--kernel"],
                ["show", "--shape"],
                ["space"],
                ["lookup"],
                ["show", "--device"],
            ]
        )
        args = [*command, rng.choice(junk)]
        if command == ["lookup"]:
            args += ["--shape", "33x33x33"]
        with deadline():
            result = invoke(*args)
        if result.exit_code != 0:
            assert_refused(result, args)
        assert snapshot(tmp_path) == before, args


def test_cli_subprocess_errors_have_no_traceback(tmp_path):
    """Through the installed console script's module, as a user runs it (stderr, exit code)."""
    for args in (
        ["space", "matmul", "--shape", "[/x]"],
        ["sweep", "matmul", "--shape", "33x33x33", "--db", ""],
        ["show", "--db", str(tmp_path)],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "tunesvc", *args], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
        assert done.returncode != 0, args
        assert "Traceback" not in done.stderr + done.stdout, (args, done.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- code from data ------------------------------------------------------------------------------
class _Payload:
    """Unpickling this writes a marker file: proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "ran"))


def test_planted_cmaes_pickle_in_the_database_never_runs(tmp_path, template, device):
    """A database whose Optuna study holds a pickled CMA-ES optimizer (`cma:optimizer:*`):
    Optuna's own CmaEsSampler on that storage unpickles it (the control), tunesvc's CMA-ES never does."""
    import optuna

    from tunesvc.search import make_strategy
    from tunesvc.tuning.sweep import study_name
    from tunesvc.tuning.sweep import study_storage

    problem = template.problem(**SMALL)
    key = str(template.key(problem))
    db = tmp_path / "colleague.db"
    store = Store(db)
    url = study_storage(store)
    store.close()
    candidates = template.feasible(problem, device)
    name = study_name(template, device, key, "cmaes")
    marker = tmp_path / "pwned"
    probe = make_strategy("cmaes", template.space, candidates, seed=0)
    payload = pickle.dumps(_Payload(str(marker))).hex()
    study = optuna.create_study(study_name=name, storage=url, direction="minimize")
    rng = random.Random(SEED)
    for i in range(20):
        study.add_trial(
            optuna.trial.create_trial(
                params={
                    n: rng.randrange(int(d.high) + 1) if hasattr(d, "high") else d.choices[0]
                    for n, d in probe._distributions.items()
                },
                distributions=probe._distributions,
                value=1.0 + i,
                system_attrs={"cma:optimizer:0": payload, "cma:generation": 0},
            )
        )
    # control: the plant is live; Optuna's sampler reading this storage runs it
    control = optuna.load_study(study_name=name, storage=url, sampler=optuna.samplers.CmaEsSampler(seed=0))
    with warnings.catch_warnings(), contextlib.suppress(Exception):  # the "optimizer" it unpickled is no optimizer
        warnings.simplefilter("ignore")
        control.ask(probe._distributions)
    assert marker.exists()
    marker.unlink()
    # tunesvc's CMA-ES strategy, handed the same storage and study name as a sweep would
    strategy = make_strategy("cmaes", template.space, candidates, seed=0, storage=url, study_name=name)
    from tunesvc.bench import Measurement
    from tunesvc.bench import Status

    for i in range(25):
        config = strategy.ask()
        if config is None:
            break
        strategy.tell(config, Measurement(Status.OK, time_ms=1.0 + i))
    assert not marker.exists()
    # and the whole command: `tune sweep --strategy cmaes --db colleague.db`
    result = invoke(
        "sweep", "matmul", "--shape", "33x45x29", "--strategy", "cmaes", "--budget", "3", "--db", str(db), "--quiet"
    )
    assert result.exit_code == 0, result.output
    assert not marker.exists()


PLANTED_MODULE = """
from pathlib import Path
Path(__file__).with_name("imported").write_text("ran")
TEMPLATE = None
"""


def test_kernel_names_in_data_never_import_a_module(tmp_path, template, device, monkeypatch):
    """A database and a bundle naming kernels 'plant:TEMPLATE' and 'this:x', with plant.py in the
    working folder (on sys.path, as for `python -m`): no command reading them imports either."""
    (tmp_path / "plant.py").write_text(textwrap.dedent(PLANTED_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "shared.db"
    store = Store(db)
    try:
        config = template.space.enumerate()[0]
        store.merge_winner("plant:TEMPLATE", "v1", device, "M=64,N=64,K=32,dtype=float16", config, 1.0, "test")
        store.merge_winner("this:x", "v1", device, "M=64,N=64,K=32,dtype=float16", config, 1.0, "test")
    finally:
        store.close()
    bundle = tmp_path / "shared.json"
    preloaded = {"plant", "this"} & set(sys.modules)
    for args in (
        ["show", "--db", str(db)],
        ["verify", "--db", str(db)],
        ["report", "--db", str(db), "--out", str(tmp_path / "report")],
        ["export", "--out", str(bundle), "--db", str(db), "--device", device.hardware_id],
        ["import", str(bundle), "--db", str(tmp_path / "other.db")],
        ["verify", "--db", str(tmp_path / "other.db")],
    ):
        result = invoke(*args)
        assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
        assert not (tmp_path / "imported").exists(), args
        assert {"plant", "this"} & set(sys.modules) == preloaded, args
    assert bundle.exists()
    # and as a user runs it: the working folder first on sys.path
    done = subprocess.run(
        [sys.executable, "-m", "tunesvc", "verify", "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "kernel not found here" in done.stdout or "unknown" in done.stdout.lower(), done.stdout
    assert not (tmp_path / "imported").exists() and "Zen of Python" not in done.stdout


def test_expression_cannot_escape_its_whitelist(tmp_path):
    marker = tmp_path / "pwned"
    for source in [
        f"__import__('pathlib').Path('{marker}').write_text('x') == 0",
        "().__class__.__bases__[0].__subclasses__() == 0",
        "(lambda: 0)() == 0",
        "[x for x in (1,)] == 0",
        "M.__add__(1) > 0",
        "getattr(M, 'real') > 0",
        "eval('1') == 1",
        "min.__self__ == 0",
    ]:
        with pytest.raises(ValueError):
            Expression(source)
    assert not marker.exists()


def test_winner_time_bounds(good_bundle):
    """Infinity, NaN and true as a time are refused by the bundle's schema."""
    for bad in ("Infinity", "NaN", "true", "-1", "0", '"1"'):
        text = good_bundle.read_text()
        data = json.loads(text)
        section = data["kernels"]["matmul"]
        key = sorted(section["winners"])[0]
        section["winners"][key]["time_ms"] = "__X__"
        mutated = json.dumps(data).replace('"__X__"', bad)
        path = good_bundle.parent / "time.json"
        path.write_text(mutated)
        with pytest.raises(TunesvcError) as info:
            tunesvc.bundle.read_bundle(path)
        assert "time_ms" in one_line(str(info.value)) or bad in ("Infinity", "NaN"), (bad, str(info.value))
    assert math.isfinite(1.0)


def test_a_really_full_disk_is_named_and_leaves_no_partial_bundle(good_bundle, tmp_path):
    """A small tmpfs filled to the last byte (needs root with mount rights; elsewhere
    tests/test_faults.py simulates a full disk through SQLite's max_page_count)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True).returncode
    ):
        pytest.skip("needs root with mount rights for a small tmpfs")
    try:
        db = disk / "t.db"
        assert invoke("db", "init", "--db", str(db)).exit_code == 0
        with contextlib.suppress(OSError), (disk / "fill").open("wb") as fill:
            while True:
                fill.write(bytes(64 << 10))
        result = invoke("import", str(good_bundle), "--db", str(db))
        assert_refused(result, "import onto a full disk")
        assert "is full (no space left)" in result.output
        source = good_bundle.parent / "source.db"
        result = invoke("export", "--out", str(disk / "out.json"), "--db", str(source))
        assert_refused(result, "export onto a full disk")
        assert "No space left" in result.output
        assert sorted(p.name for p in disk.iterdir() if not p.name.startswith("t.db")) == ["fill"]
    finally:
        subprocess.run(["umount", str(disk)], check=True)


#: damage to a sweep's Optuna study, each caught when the strategy opens the study
STUDY_DAMAGE = {
    "a value that is text": "UPDATE trial_values SET value = 'NaN'",
    "a negative time": "UPDATE trial_values SET value = -5",
    "an infinite value type": "UPDATE trial_values SET value_type = 'INF_POS'",
    "a parameter outside its choices": "UPDATE trial_params SET param_value = 99",
    "a distribution that is no JSON": "UPDATE trial_params SET distribution_json = 'not json'",
    "another distribution kind": "UPDATE trial_params SET distribution_json = "
    """'{"name": "IntDistribution", "attributes": {"low": 0, "high": 3, "log": false, "step": 1}}'""",
    "an unknown distribution class": """UPDATE trial_params SET distribution_json = '{"name": "Evil", "attributes": {}}'""",
    "an unknown trial state": "UPDATE trials SET state = 'BOGUS'",
    "a maximising study": "UPDATE study_directions SET direction = 'MAXIMIZE'",
    "an unknown direction": "UPDATE study_directions SET direction = 'SIDEWAYS'",
    "user attributes that are no JSON": "INSERT OR REPLACE INTO trial_user_attributes (trial_id, key, value_json) "
    "VALUES (1, 'status', '{{{')",
    "constraints that are not numbers": "INSERT OR REPLACE INTO trial_system_attributes (trial_id, key, value_json) "
    """VALUES (1, 'constraints', '["a", {}]')""",
}


@pytest.fixture(scope="module")
def optuna_swept(tmp_path_factory):
    db = tmp_path_factory.mktemp("optuna") / "swept.db"
    args = (
        "sweep",
        "matmul",
        "--shape",
        "33x45x29",
        "--strategy",
        "optuna",
        "--budget",
        "3",
        "--db",
        str(db),
        "--quiet",
    )
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return db


def _optuna_rows(db: Path) -> list:
    import sqlite3

    with contextlib.closing(sqlite3.connect(db)) as connection:
        return [
            connection.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in (
                "studies",
                "study_directions",
                "trials",
                "trial_values",
                "trial_params",
                "trial_user_attributes",
            )
        ]


@pytest.mark.parametrize("damage", sorted(STUDY_DAMAGE))
def test_a_damaged_optuna_study_is_left_alone_and_the_sweep_goes_on(damage, optuna_swept, tmp_path, template, device):
    """A damaged study in the database (Optuna raises on it, or TPE would be misled by it): the
    sweep warns in one line, searches with a new in-memory study taught the stored trials, stores
    its trials, and changes none of the study's rows."""
    import sqlite3

    from tunesvc.search import make_strategy
    from tunesvc.tuning.sweep import study_name
    from tunesvc.tuning.sweep import study_storage

    db = tmp_path / "damaged.db"
    # SQLite's backup: the swept database with what its write-ahead log still holds
    with contextlib.closing(sqlite3.connect(optuna_swept)) as source, contextlib.closing(sqlite3.connect(db)) as copy:
        source.backup(copy)
    with contextlib.closing(sqlite3.connect(db)) as connection:
        connection.execute(STUDY_DAMAGE[damage])
        connection.commit()
    rows = _optuna_rows(db)
    store = Store(db)
    try:
        url = study_storage(store)
        stored = len(store.winners())
    finally:
        store.close()
    problem = template.problem(**SMALL)
    name = study_name(template, device, str(template.key(problem)), "optuna")
    assert any(name in row for row in rows[0])  # the studies table holds the sweep's study
    with pytest.warns(RuntimeWarning, match="study .* is unusable"):
        strategy = make_strategy(
            "optuna", template.space, template.feasible(problem, device), seed=0, storage=url, study_name=name
        )
    assert strategy.study._storage.__class__.__name__ == "InMemoryStorage"
    result = invoke("sweep", "matmul", "--shape", "33x45x29", "--strategy", "optuna", "--budget", "5", "--db", str(db))
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert _optuna_rows(db) == rows
    store = Store(db, readonly=True)
    try:
        assert len(store.winners()) == stored == 1
    finally:
        store.close()
    with contextlib.closing(sqlite3.connect(db)) as connection:
        assert connection.execute("SELECT count(*) FROM tunesvc_trials").fetchone()[0] == 5
