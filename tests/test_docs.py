"""The docs cannot drift: docs/cli.md is the CLI's own output, README and docs link to pages that
exist, and benchmarks/RESULTS.md is what its CSV files say."""

from __future__ import annotations

import csv
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from tunesvc.cli import app

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
CLI_MD = ROOT / "docs" / "cli.md"
CLI_DOCS_COMMAND = "python docs/cli_reference.py docs/cli.md"


def _commands():
    return typer.main.get_command(app).commands


def _leaves(commands=None, prefix=""):
    """(name, command) of every command that runs, sub-commands of groups as "db upgrade"."""
    for name, command in (commands if commands is not None else _commands()).items():
        if hasattr(command, "commands"):  # a group (typer.Typer added with add_typer)
            yield from _leaves(command.commands, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


def test_cli_reference_is_generated_from_the_cli(tmp_path):
    out = tmp_path / "cli.md"
    argv = CLI_DOCS_COMMAND.replace("python", sys.executable, 1).replace("docs/cli.md", str(out)).split()
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, timeout=120)
    assert CLI_MD.read_text() == out.read_text(), f"docs/cli.md is stale; regenerate it with `{CLI_DOCS_COMMAND}`."


def test_cli_reference_has_no_html_entities_or_tags():
    # typer's own generator writes rich's HTML of each help text: `kernel&#x27;s`, `[x&gt;=0]`
    text = CLI_MD.read_text()
    assert "kernel's config space" in text
    assert not re.findall(r"&(?:#x?[0-9a-fA-F]+|[a-zA-Z]+);", text), "docs/cli.md holds HTML entities"
    assert not re.search(r"</?(?:span|div|pre|code)\b", text), "docs/cli.md holds HTML tags"


def test_cli_reference_covers_every_command_and_option():
    text = CLI_MD.read_text()
    names = [name for name, _ in _leaves()]
    assert {"kernels", "sweep", "show", "lookup", "export", "import", "db init", "db upgrade"} <= set(names)
    for name, command in _leaves():
        section = text.partition(f"## `tune {name}`\n")[2]
        assert section, f"docs/cli.md has no section for `tune {name}`; regenerate it with `{CLI_DOCS_COMMAND}`."
        section = section.split("\n## ", 1)[0]
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--"):
                    assert f"`{opt}" in section or f", {opt}" in section, f"docs/cli.md lacks {opt} of `tune {name}`"


def test_cli_reference_lists_every_command_whole():
    """Each group's **Commands** list names every command with its help's first paragraph, uncut."""
    import inspect

    text = CLI_MD.read_text()

    def check(group, title):
        listing = text.partition(f"# `{title}`\n")[2].split("\n#", 1)[0].partition("**Commands**:\n")[2]
        entries = dict(re.findall(r"^\* `([^`]+)`: (.*)$", listing, re.M))
        assert set(entries) == set(group.commands), f"the command list of `{title}` is not every command"
        for name, command in group.commands.items():
            first = " ".join(inspect.cleandoc(command.help or "").split("\n\n")[0].split())
            assert entries[name] == first, f"docs/cli.md cuts the summary of `{title} {name}`"
            if hasattr(command, "commands"):
                check(command, f"{title} {name}")

    check(typer.main.get_command(app), "tune")


def test_readme_lists_every_command_and_links_the_reference():
    for name in _commands():
        assert re.search(rf"`tune {name}\b", README), f"README's CLI table lacks `tune {name}`"
    assert "](docs/cli.md)" in README


def _links(path: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", path.read_text())


def test_readme_and_docs_link_only_to_files_that_exist():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "RESULTS.md"]
    checked = 0
    for page in pages:
        for link in _links(page):
            if re.match(r"[a-z]+:", link) or link.startswith("#"):
                continue  # a URL or an anchor on the same page
            target = (page.parent / link.split("#")[0]).resolve()
            assert target.exists(), f"{page.relative_to(ROOT)} links to {link}, which does not exist"
            checked += 1
    assert checked >= 5
    for doc in ("cli", "timing", "search", "shape-keys", "scale-out", "schema"):
        assert f"](docs/{doc}.md)" in README, f"README does not link docs/{doc}.md"


def test_readme_is_short_and_keeps_the_test_command():
    assert len(README.encode()) <= 12_000, f"README.md is {len(README.encode())} bytes; keep it within 12 KB"
    # .ci/run runs the line two lines after the marker
    lines = README.splitlines()
    command = lines[lines.index("<!-- test-command -->") + 2]
    assert "pytest" in command and "pip install" in command


def test_readme_quotes_the_current_matmul_version():
    from tunesvc.template import get_template

    quoted = re.search(r"matmul ([0-9a-f]{12}) \(current version, used by lookups\)", README)
    assert quoted, "README's tour no longer names matmul's current version"
    assert quoted.group(1) == get_template("matmul").version, (
        "matmul's version changed: rerun the README's two commands and its tour, and paste their output"
    )


def test_readme_and_docs_describe_the_product_not_its_history():
    pattern = re.compile(r"\bsession\b|\brun \d+\b|\bthe issue\b|\(20\d\d-\d\d-\d\d|\bissue \d+\b", re.IGNORECASE)
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found = pattern.findall(page.read_text())
        assert not found, f"{page.relative_to(ROOT)} narrates how it was made: {found}"


def _results_page():
    """benchmarks/results_page.py as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("results_page", ROOT / "benchmarks" / "results_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_rows(path, columns, rows):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)


def test_results_page_is_generated_from_the_csv_files():
    module = _results_page()
    assert list((ROOT / "benchmarks" / "results").glob("*.csv")), "no benchmark results"
    assert (ROOT / "benchmarks" / "RESULTS.md").read_text() == module.render(), (
        f"benchmarks/RESULTS.md is stale; regenerate it with `{module.COMMAND}`."
    )


def test_readme_performance_table_is_computed_from_the_csv_files():
    """The README's table is the CSVs' (as RESULTS.md's Summary): regenerated by the results page's
    command, and each range recomputed here from the rows it names."""
    module = _results_page()
    assert module.readme_with_table(README) == README, (
        f"README.md's performance table is stale; regenerate it with `{module.COMMAND}`."
    )
    rows = [r for path in sorted((ROOT / "benchmarks" / "results").glob("*.csv")) for r in csv.DictReader(path.open())]
    table = README[README.index(module.README_HEADER) :].split("\n\n")[0].splitlines()[2:]
    assert len(table) == len(module.README_ROWS)
    for line, (_, _, groups) in zip(table, module.README_ROWS, strict=True):
        spreads = []
        for kernel, peer, method in groups:
            group = [r for r in rows if (r["kernel"], r["peer"], r["timing_method"]) == (kernel, peer, method)]
            latest = max(r["date"] for r in group)
            ratios = [
                float(r["ratio"]) if r["ratio"] else float(r["peer_ms"]) / float(r["ours_ms"])
                for r in group
                if r["date"] == latest
            ]
            spreads.append(f"{min(ratios):.2f}-{max(ratios):.2f}x")
        assert line.split(" | ")[2] == " / ".join(spreads), line


def test_readme_performance_table_quotes_what_tune_report_of_the_example_shows(tmp_path):
    """The table's `tune report` column is the worst and best speed-up of the report's own Summary
    of tune.db.example, per kernel of the row (the report's page is parsed, not recomputed)."""
    import html

    module = _results_page()
    result = CliRunner().invoke(app, ["report", "--db", str(ROOT / "tune.db.example"), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "report.html").read_text()
    summary = page[page.index('id="summary"') :].split("</table>")[0]
    shown: dict[str, str] = {}
    for row in re.findall(r"<tr>(.*?)</tr>", summary, re.S):
        cells = [re.sub(r"<br>.*", "", c, flags=re.S) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        if len(cells) < 7:  # the header; a kernel with older versions only
            continue
        kernel = html.unescape(re.sub(r"<[^>]+>", "", cells[0]))
        best, worst = (html.unescape(c).removesuffix("x") for c in cells[5:7])
        shown[kernel] = "-" if worst == "-" else f"{worst}-{best}x"
    table = README[README.index(module.README_HEADER) :].split("\n\n")[0].splitlines()[2:]
    for line, (_, _, groups) in zip(table, module.README_ROWS, strict=True):
        assert line.split(" | ")[-1].rstrip(" |") == " / ".join(shown[kernel] for kernel, _, _ in groups), line


def test_version_flag():
    from typer.testing import CliRunner

    from tunesvc import __version__

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert f"tunesvc {__version__}" in result.output


def test_results_page_says_which_held_out_target_is_missed_and_shows_the_latest_evaluation(tmp_path):
    module = _results_page()
    base = {**dict.fromkeys(module.COLUMNS, ""), "gpu": "GPU A"}
    rows = []
    for shape, tuned_ms, pick_ms in (("M=1,N=64,K=64", 1.0, 1.0), ("M=3,N=64,K=64", 2.0, 2.5)):
        for role, ms in (("tuned", tuned_ms), ("selector", pick_ms), ("space best of 50", tuned_ms * 0.99)):
            rows.append({**base, "date": "2030-01-02", "kernel": f"matmul [{role}]", "shape": shape,
                         "ours_ms": str(ms), "peer_ms": "1.0"})  # fmt: skip
    # a later run of one of those shapes on the same GPU (a ceiling's): it does not stand for the set
    rows.append({**base, "date": "2030-01-05", "kernel": "matmul [tuned]", "shape": "M=3,N=64,K=64",
                 "ours_ms": "0.25", "peer_ms": "1.0"})  # fmt: skip
    # a later run on another GPU model, with no untuned pick there (nothing tuned on it): its own row
    rows.append({**base, "gpu": "GPU B", "date": "2030-01-03", "kernel": "matmul [tuned]", "shape": "M=1,N=64,K=64",
                 "ours_ms": "0.5", "peer_ms": "1.0"})  # fmt: skip
    _write_rows(tmp_path / "heldout.csv", module.COLUMNS, rows)
    (tmp_path / "evaluate").mkdir()
    fields = ["kernel", "shape_key", "selector_ratio", "nearest_ratio", "timestamp"]
    with (tmp_path / "evaluate" / "matmul.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerow(dict(zip(fields, ["matmul", "M=1,N=64,K=64", "0.5", "0.5", "2030-01-01T00:00:00"])))
        writer.writerow(dict(zip(fields, ["matmul", "M=1,N=64,K=64", "0.8", "0.8", "2030-01-02T00:00:00"])))
        # a second run that date measures the key again: the page counts the later measurement, once
        writer.writerow(dict(zip(fields, ["matmul", "M=1,N=64,K=64", "1.0", "0.9", "2030-01-02T05:00:00"])))
    page = "\n".join(module._targets(tmp_path))
    # tuned / peer 1.0 and 0.5: geomean 0.707 of 1.0; the lowest 0.5 of 0.9, with its ceiling; picks 1.0 and 0.8
    assert "- matmul (GPU A), tuned / peer geometric mean: 0.707, 70% of the target 1.0" in page
    assert (
        "- matmul (GPU A), lowest tuned / peer: 0.500, 55% of the target 0.9 at M=3,N=64,K=64; the best of 50" in page
    )
    assert "- matmul (GPU A), share of picks within 5% of tuned: 0.500, 55% of the target 0.9" in page
    assert "- matmul (GPU A), worst pick / tuned: 0.800, 94% of the target 0.85 at M=3,N=64,K=64" in page
    assert "| matmul | 2030-01-02 | GPU A | 2 | 0.707x (>= 1.0) |" in page
    assert "| matmul | 2030-01-03 | GPU B | 1 | 2.000x (>= 1.0) | 2.000x (>= 0.9), M=1,N=64,K=64 | - | - |" in page
    # the evaluation file keeps every run; the page shows the last date's, the last row per key
    assert "run of 2030-01-02" in page and "| matmul | 1 | 100% | 1.000, M=1,N=64,K=64 | 0% | 0.900," in page


def test_results_page_gives_the_measured_reasons_of_its_own_run_for_a_missed_target(tmp_path):
    module = _results_page()
    base = {**dict.fromkeys(module.COLUMNS, ""), "gpu": "GPU A"}
    run, older = "2030-01-02T08:00:00Z", "2030-01-01T08:00:00Z"
    rows = []
    # matmul: the selector misses by 25% at M=3, the fastest candidate does not
    for shape, tuned, pick, best in (("M=1,N=64,K=64", 1.0, 1.0, 1.0), ("M=3,N=64,K=64", 2.0, 2.5, 2.0)):
        for role, ms in (("tuned", tuned), ("selector", pick), ("best candidate", best)):
            rows.append({**base, "run": run, "kernel": f"matmul [{role}]", "shape": shape,
                         "ours_ms": str(ms), "peer_ms": "1.0"})  # fmt: skip
    rows.append({**base, "run": run, "kernel": "attention [tuned]", "shape": "S=9", "ours_ms": "1.0", "peer_ms": "0.8"})
    _write_rows(tmp_path / "heldout.csv", module.COLUMNS, rows)
    reasons = [
        # this run: M=3 rounded up to a 16-row tile, where the peer takes 2.4 ms and ours 2.0
        ("matmul [tuned, M=3 rounded up to BLOCK_M]", "M=16,N=64,K=64", "2.0", "cuBLAS", "2.4", run),
        # the same shape's in another run, and another shape's, are not this one's
        ("matmul [tuned, M=3 rounded up to BLOCK_M]", "M=16,N=64,K=64", "2.0", "cuBLAS", "9.9", older),
        ("matmul [tuned, M=1 rounded up to BLOCK_M]", "M=16,N=64,K=64", "2.0", "cuBLAS", "7.7", run),
        ("attention [tuned]", "S=9", "1.0", "torch SDPA, FLASH_ATTENTION backend", "1.2", run),
        ("attention [tuned]", "S=9", "1.0", "torch SDPA, CUDNN_ATTENTION backend", "0.8", run),
        ("attention [tuned]", "S=9", "1.0", "torch SDPA, default: cudnn_sdpa_kernel", "0.8", run),
        # the tuned winners against cuBLAS as their sweeps timed them: 0.625x and 1.0x (another run's: not)
        ("matmul [tuned, as its sweep timed it]", "M=3,N=64,K=64", "1.6", "cuBLAS", "1.0", run),
        ("matmul [tuned, as its sweep timed it]", "M=1,N=64,K=64", "1.0", "cuBLAS", "1.0", run),
        ("matmul [tuned, as its sweep timed it]", "M=3,N=64,K=64", "1.0", "cuBLAS", "5.5", older),
    ]

    def page_with(reasons):
        _write_rows(tmp_path / "heldout_reasons.csv", module.COLUMNS, [
            {**base, "run": r, "kernel": k, "shape": sh, "ours_ms": o, "peer": pe, "peer_ms": pm}
            for k, sh, o, pe, pm, r in reasons
        ])  # fmt: skip
        return "\n".join(module._targets(tmp_path))

    page = page_with(reasons)
    assert (
        "- matmul (GPU A), share of picks within 5% of tuned: 0.500, 55% of the target 0.9; the fastest of the selector's "
        "candidates was within 5% of tuned on 100% of the 2 shapes" in page
    )
    assert (
        "- matmul (GPU A), worst pick / tuned: 0.800, 94% of the target 0.85 at M=3,N=64,K=64; the fastest of the selector's"
        " candidates ran at 1.000 of tuned there" in page
    )
    assert (
        "at M=3,N=64,K=64; with M rounded up to the tuned config's BLOCK_M (M=16), the same config ran at 1.200x"
        " the peer in that run, taking 1.00x its time at M=3 and the peer 2.40x: so the padding rows its tiles"
        " compute, which the peer's do not, account for the miss" in page
    )
    assert "9.9" not in page and "7.7" not in page and "3.850x" not in page and "5.500x" not in page
    assert "account for the miss; its sweep had timed the same config at 0.625x the peer" in page
    assert (
        "; as the sweeps timed them, tuned / peer geometric mean 0.791x over 2 of the 2 shapes, against 0.707x"
        " timed here" in page
    )
    # the geometric mean with both shapes' M rounded up (3.85x and 1.2x), this run's rows alone
    assert (
        "- matmul (GPU A), tuned / peer geometric mean: 0.707, 70% of the target 1.0; with M rounded up to the tuned"
        " config's BLOCK_M (2 of the 2 shapes; the rest as they are), tuned / peer geometric mean 2.149x in that run,"
        " against 0.707x" in page
    )
    # where the rounded-up shape misses the target too, padding is not the whole reason
    slow_peer = [(k, sh, o, pe, "1.6" if pm == "2.4" else pm, r) for k, sh, o, pe, pm, r in reasons]
    assert (
        "the same config ran at 0.800x the peer in that run, taking 1.00x its time at M=3 and the peer 1.60x: so its"
        " tiles compute the padding rows, and below 0.9 at M=16 too, the rest of the gap is the kernel's at that size"
        in page_with(slow_peer)
    )
    assert (
        "- attention (GPU A), tuned / peer geometric mean: 0.800, 88% of the target 0.9; tuned / torch SDPA, "
        "CUDNN_ATTENTION backend 0.800x; torch SDPA, FLASH_ATTENTION backend 1.200x (geometric means, same run), "
        "SDPA's default ran cudnn_sdpa_kernel" in page
    )


def test_results_page_keeps_two_held_out_runs_of_one_date_apart(tmp_path):
    module = _results_page()
    base = dict.fromkeys(module.COLUMNS, "")
    rows = []
    # a row from before the run column, then two named runs of the same date, the last past
    # midnight: it alone makes the table, and the shape only the earlier runs measured is left out
    for date, run, shape, ours in (
        ("2030-01-02", "", "M=5,N=64,K=64", "4.0"),
        ("2030-01-02", "2030-01-02T08:00:00Z", "M=3,N=64,K=64", "2.0"),
        ("2030-01-02", "2030-01-02T23:59:00Z", "M=1,N=64,K=64", "1.0"),
        ("2030-01-03", "2030-01-02T23:59:00Z", "M=7,N=64,K=64", "1.0"),
    ):
        for role in ("tuned", "nearest"):
            rows.append({**base, "date": date, "run": run, "gpu": "GPU X", "kernel": f"matmul [{role}]",
                         "shape": shape, "ours_ms": ours, "peer_ms": "1.0"})  # fmt: skip
    _write_rows(tmp_path / "heldout.csv", module.COLUMNS, rows)
    page = "\n".join(module._targets(tmp_path))
    assert "| matmul | 2030-01-02T23:59:00Z | GPU X | 2 | 1.000x (>= 1.0) | 1.000x (>= 0.9), M=1,N=64,K=64 |" in page
    assert "M=3,N=64,K=64" not in page and "M=5,N=64,K=64" not in page
    # the row without a run alone: its date names the run
    _write_rows(tmp_path / "heldout.csv", module.COLUMNS, rows[:2])
    assert "| matmul | 2030-01-02 | GPU X | 1 | 0.250x (>= 1.0) |" in "\n".join(module._targets(tmp_path))


def test_a_results_file_of_another_layout_is_refused_in_one_sentence(tmp_path):
    module = _results_page()
    path = tmp_path / "heldout.csv"
    path.write_text(",".join(module.COLUMNS[:-1]) + "\n")
    before = path.read_text()
    with pytest.raises(SystemExit, match=r"heldout.csv: columns .* are not \[") as raised:
        module.read_rows(path)
    assert "\n" not in str(raised.value)
    assert path.read_text() == before


def test_results_page_gives_each_held_out_gemm_below_the_floor_with_its_tiles_and_roofline(tmp_path):
    module = _results_page()
    base = {**dict.fromkeys(module.COLUMNS, ""), "gpu": "GPU A", "date": "2030-01-02", "run": "2030-01-02T00:00:00Z"}
    base |= {"kernel": "matmul [held-out, exact]", "timing_method": "cuda_graph", "peer": "cuBLAS (torch.matmul)"}
    rows = [
        {**base, "shape": "M=300,N=64,K=64", "ours_ms": "2.0", "peer_ms": "1.0", "ratio": "0.5",
         "tiles_per_sm": "0.270", "roofline": "0.400", "config": "VARIANT=splitk SPLIT_K=3"},
        {**base, "shape": "M=8,N=64,K=64", "ours_ms": "1.0", "peer_ms": "2.0", "ratio": "2.0",
         "tiles_per_sm": "0.500", "roofline": "0.900", "config": "VARIANT=tma"},
        # untuned (the database did not hold the key): not counted against the targets
        {**base, "kernel": "matmul [held-out, heuristic]", "shape": "M=9,N=64,K=64", "ratio": "0.1"},
    ]  # fmt: skip
    _write_rows(tmp_path / "gemm_heldout.csv", module.COLUMNS, rows)
    page = "\n".join(module._gemm_heldout(tmp_path))
    assert "- run 2030-01-02T00:00:00Z, GPU A: 2 shapes, cuBLAS / tuned geometric mean 1.000x" in page
    assert "lowest 0.500x (target >= 0.9)" in page
    assert (
        "  - M=300,N=64,K=64: 0.500x; the winner (VARIANT=splitk SPLIT_K=3) has 0.270 output tiles per SM "
        "and reached 40% of its roofline, cuBLAS 80%" in page
    )
    assert "M=8," not in page and "M=9," not in page
    table = "\n".join(module._table(rows))
    assert "| tiles/SM | roofline | config |" in table and "| 0.27 | 40% | VARIANT=splitk SPLIT_K=3 |" in table
    assert "tiles/SM" not in "\n".join(module._table([{**dict.fromkeys(module.COLUMNS, ""), "ratio": "1.0"}]))


_RECORDER = """
import sys
sys.path.insert(0, {benchmarks!r})
import _common
_common.RESULTS_DIR = __import__("pathlib").Path({folder!r})
row = {{"kernel": "k [{who}]", "shape": "M=1", "ours_ms": "1.0", "peer": "p", "peer_ms": "1.0", "ratio": "1.0"}}
for _ in range(40):
    _common.record("shared", [dict(row) for _ in range(6)])
"""


def test_benchmark_processes_recording_at_once_append_whole_rows(tmp_path):
    """heldout.py --gpus runs a process per GPU, all appending to the same CSV files."""
    scripts = [_RECORDER.format(benchmarks=str(ROOT / "benchmarks"), folder=str(tmp_path), who=i) for i in range(3)]
    children = [subprocess.Popen([sys.executable, "-c", s], stdout=subprocess.DEVNULL) for s in scripts]
    assert [c.wait(timeout=300) for c in children] == [0, 0, 0]
    module = _results_page()
    rows = module.read_rows(tmp_path / "shared.csv")
    assert len(rows) == 3 * 40 * 6
    assert {r["kernel"] for r in rows} == {"k [0]", "k [1]", "k [2]"}
    assert all(r["ratio"] == "1.0" and r["gpu"] for r in rows)
    assert (tmp_path / "shared.csv").read_bytes().count(b"date,gpu") == 1


_EARLIER_RECORDER = """
import sys
sys.path.insert(0, {benchmarks!r})
import _common
_common.RESULTS_DIR = __import__("pathlib").Path({folder!r})
row = {{"kernel": "k", "shape": "M=1", "ours_ms": "2.0", "peer": "p", "peer_ms": "1.0", "ratio": "0.5"}}
_common.record("old", [row])
_common.record("old", [{{**row, "tiles_per_sm": "0.25"}}])
"""


def test_a_results_file_of_the_earlier_layout_is_read_and_appended_to_in_it(tmp_path):
    """Files written before tiles_per_sm, roofline and config read with those empty; record
    appends to one in its own layout, and refuses, in one sentence, rows that need the new columns."""
    module = _results_page()
    path = tmp_path / "old.csv"
    before = ",".join(module.EARLIER_COLUMNS) + "\n" + ",".join(["2030-01-01", "GPU A"] + [""] * 14) + "\n"
    path.write_text(before)
    script = _EARLIER_RECORDER.format(benchmarks=str(ROOT / "benchmarks"), folder=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "old.csv has no column tiles_per_sm" in done.stderr
    rows = module.read_rows(path)
    assert len(rows) == 2 and rows[0]["date"] == "2030-01-01"
    assert rows[1]["ratio"] == "0.5" and rows[1]["tiles_per_sm"] == "" and set(rows[1]) == set(module.COLUMNS)
    assert path.read_text().splitlines()[0] == ",".join(module.EARLIER_COLUMNS)


def test_readme_tour_lookup_prints_what_the_readme_says(monkeypatch):
    """The tour's `tune lookup` on tune.db.example prints the README's lines (the database's path
    aside, which is the reader's own)."""
    import shlex

    from typer.testing import CliRunner

    tour = README[README.index("## A tour of `tune.db.example`") :]
    block = tour[tour.index("$ tune lookup") :].split("\n$ ")[0].split("\n```")[0]
    command, *printed = block.strip().splitlines()
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(app, shlex.split(command)[2:], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output

    def path_aside(line: str) -> str:
        return re.sub(r"read from database \S+", "read from database tune.db.example", line)

    assert [path_aside(line) for line in result.stdout.splitlines()] == [path_aside(line) for line in printed]


def _trimmed(output: str) -> list[str]:
    """The README's way of quoting the CLI: each line without its padding, tables without their
    border lines."""
    lines = [line.strip() for line in output.splitlines()]
    return [line for line in lines if line and not line.startswith(("┏", "┡", "└"))]


def test_readme_tour_show_prints_what_the_readme_says(monkeypatch):
    """The tour's `tune show` on tune.db.example, piped: the README's lines, in the tool's row order
    and layout (one row per key, the title as printed), borders aside."""
    import shlex

    tour = README[README.index("## A tour of `tune.db.example`") :]
    command, *printed = tour[tour.index("$ tune show") :].split("\n$ ")[0].strip().splitlines()
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(app, shlex.split(command)[2:], env={"COLUMNS": None})
    assert result.exit_code == 0, result.output
    assert _trimmed(result.stdout) == printed


def test_readme_first_show_lists_rows_in_the_tools_order_one_line_each():
    """The two commands' `tune show` (interpreter times, so not rerun here): its rows in the order
    `tune show` sorts keys (M=64 before M=128), each key's config on its one line."""
    from tunesvc.text import natural_order

    block = README[README.index("## Two commands") :].split("```")[1]
    shown = block[block.index("Winners on triton-interpreter") :].split(" winners;")[0]
    rows = [line for line in shown.splitlines() if line.startswith("│")]
    keys = [row.split("│")[1].strip() for row in rows]
    assert len(keys) == 2 and all(keys)
    assert keys == sorted(keys, key=natural_order)


def test_readme_says_how_errors_exit(tmp_path):
    """README: a TunesvcError is one sentence on stderr with exit 1; a usage mistake is typer's
    boxed usage message with exit 2."""
    assert "Errors (an empty filter too): one sentence, exit 1; usage mistakes: typer's boxed message, exit 2." in (
        " ".join(README.split())
    )
    result = CliRunner().invoke(app, ["show", "--db", str(ROOT / "tune.db.example"), "--kernel", "nosuch"])
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: No winners in")
    result = CliRunner().invoke(app, ["show", "--bogus"])
    assert result.exit_code == 2
    assert "No such option: --bogus" in result.stderr and "╭" in result.stderr


def test_shape_keys_doc_says_what_tune_lookup_prints_on_the_example(tmp_path):
    """docs/shape-keys.md's worked example on tune.db.example: 1000x3000x777 is `exact`;
    3000x3000x777 is the key M=4096,..., `nearest` (the H200 has no selector of matmul): the
    winner of M=1024,..., two doublings away."""
    doc = " ".join((ROOT / "docs" / "shape-keys.md").read_text().split())
    assert "`--shape 1000x3000x777` is `exact`" in doc
    assert "it is `nearest`: the winner of `M=1024,...`, two doublings away" in doc

    def answer(shape: str) -> str:
        args = ["lookup", "matmul", "--shape", shape, "--dtype", "bfloat16", "--db", str(ROOT / "tune.db.example")]
        result = CliRunner().invoke(app, [*args, "--device", "NVIDIA H200"], env={"COLUMNS": "300"})
        assert result.exit_code == 0, result.output
        return result.stdout

    assert "answer  exact for NVIDIA H200;" in answer("1000x3000x777")
    printed = answer("3000x3000x777")
    assert "key     M=4096,N=3000,K=777,dtype=bfloat16:" in printed
    assert (
        "answer  nearest for NVIDIA H200: tuned key M=1024,N=3000,K=777,dtype=bfloat16, 2.00 doublings away" in printed
    )


def test_schema_page_names_every_table_and_every_migration():
    from tunesvc.store.models import Base

    text = (ROOT / "docs" / "schema.md").read_text()
    tables = set(Base.metadata.tables)
    assert {"tunesvc_winners", "tunesvc_misses", "tunesvc_selectors"} <= tables
    for table in sorted(tables):
        assert f"| `{table}` |" in text, f"docs/schema.md's table list lacks `{table}`"
    versions = sorted((ROOT / "tunesvc" / "store" / "alembic" / "versions").glob("[0-9]*.py"))
    assert len(versions) >= 7
    for path in versions:
        revision = re.search(r'^revision = "([^"]+)"', path.read_text(), re.M)
        assert revision, f"{path.name} names no revision"
        assert f"| {revision.group(1)} |" in text, f"docs/schema.md's migration list lacks {path.name}"


def test_results_page_states_the_served_targets_against_the_heuristic(tmp_path):
    """benchmarks/transfer.py's rows: served / heuristic per held-out GEMM of a GPU's latest run
    with served rows (a --served-only run, nothing tuned), its worst and geometric mean against the
    targets, and transferred (served blind) beside it."""
    module = _results_page()
    base = {**dict.fromkeys(module.COLUMNS, ""), "gpu": "NVIDIA H200", "peer_ms": "1.0"}
    rows = []
    for shape, heuristic_ms, served_ms, transferred_ms in (
        ("M=1,N=64,K=64", 1.0, 1.0, 1.5),  # the heuristic served: the transfer would have lost
        ("M=32,N=64,K=64", 1.0, 0.8, 0.8),  # transferred, 1.25x
        ("M=64,N=64,K=64", 1.0, 1.1, 1.1),  # transferred, 0.909x: below the floor
    ):
        for role, ms in (("heuristic", heuristic_ms), ("served", served_ms), ("transferred", transferred_ms)):
            rows.append({**base, "date": "2030-01-02", "run": "2030-01-02T10:00:00Z", "kernel": f"matmul [{role}]",
                         "shape": shape, "ours_ms": str(ms)})  # fmt: skip
    # an older run of one shape: not the latest, left out
    rows.append({**base, "date": "2030-01-01", "run": "2030-01-01T10:00:00Z", "kernel": "matmul [served]",
                 "shape": "M=1,N=64,K=64", "ours_ms": "9.0"})  # fmt: skip
    _write_rows(tmp_path / "transfer.csv", module.COLUMNS, rows)
    page = "\n".join(module._transfer_targets(tmp_path))
    assert "Targets: served at least\n0.95x the heuristic on every shape and 1.0x on average" in page
    assert "| NVIDIA H200 | 2030-01-02T10:00:00Z | 3 | served | 0.909, M=64,N=64,K=64 | 1 | 1.044x |" in page
    assert "| NVIDIA H200 | 2030-01-02T10:00:00Z | 3 | transferred | 0.667, M=1,N=64,K=64 | 2 | 0.912x |" in page
    assert "- NVIDIA H200, worst served / heuristic: 0.909 at M=64,N=64,K=64, 96% of the target 0.95" in page
    assert "geometric mean" not in page.split("Missed, and by how much:")[1]  # 1.044 meets 1.0


def test_results_page_counts_each_adopted_key_as_its_latest_run_timed_it(tmp_path):
    """A later run of a few kernels re-times some keys and adds others: the targets count every
    key once, at its latest run's side-by-side ratio, not the latest run's keys alone."""
    module = _results_page()
    base = {**dict.fromkeys(module.COLUMNS, ""), "gpu": "GPU A", "date": "2030-01-02"}

    def row(run, label, shape, ratio):
        return {**base, "run": run, "kernel": f"softmax [{label}]", "shape": shape, "ratio": str(ratio)}

    first, second = "2030-01-02T01:00:00Z", "2030-01-02T09:00:00Z"
    rows = [
        row(first, "adopted", "M=1", 1.0),
        row(first, "adopted", "M=2", 0.5),  # re-timed below: the later ratio counts
        row(second, "adopted", "M=2", 0.99),
        row(second, "adopted", "M=3", 0.95),  # outside 3%
        row(second, "8 trials", "M=3", 1.0),
    ]
    _write_rows(tmp_path / "adopt.csv", module.COLUMNS, rows)
    page = "\n".join(module._adopt_targets(tmp_path, runs_csv=tmp_path / "none.csv"))
    assert f"| GPU A | 2 ({second}) | adopted | 3 | 67% within 3% | 0.950, softmax M=3 |" in page
    assert f"| GPU A | 1 ({second}) | 8 trials | 1 | 100% within 2% |" in page
    assert "0.500" not in page
    assert "- GPU A, adopted within 3%: 67% of the keys, target 90%" in page


def test_results_page_times_attention_forward_and_backward_together_per_shape_of_one_run(tmp_path):
    """The held-out table's forward+backward row: per shape both directions tuned in one run, the
    peers' summed time over ours, with the 0.8 floor's miss; another run of the backward alone
    (a later, partial one) makes no such row for its GPU."""
    module = _results_page()
    base = {**dict.fromkeys(module.COLUMNS, ""), "gpu": "GPU A", "date": "2030-01-02", "run": "2030-01-02T01:00:00Z"}
    rows = []
    for shape, times in (
        ("B=1,H=2,S=100,D=64,causal=0", (1.0, 0.9, 3.0, 2.0)),
        ("B=1,H=2,S=300,D=64,causal=1", (1.0, 1.0, 2.0, 2.0)),
    ):
        fwd, fwd_peer, bwd, bwd_peer = times
        rows.append(
            {**base, "kernel": "attention [tuned]", "shape": shape, "ours_ms": str(fwd), "peer_ms": str(fwd_peer)}
        )
        rows.append(
            {**base, "kernel": "attention_bwd [tuned]", "shape": shape, "ours_ms": str(bwd), "peer_ms": str(bwd_peer)}
        )
    rows.append({**base, "gpu": "GPU B", "run": "2030-01-02T05:00:00Z", "kernel": "attention_bwd [tuned]",
                 "shape": "B=1,H=2,S=100,D=64,causal=0", "ours_ms": "1.0", "peer_ms": "1.0"})  # fmt: skip
    _write_rows(tmp_path / "heldout.csv", module.COLUMNS, rows)
    page = "\n".join(module._targets(tmp_path))
    # (0.9 + 2.0) / (1.0 + 3.0) = 0.725 at S=100; (1 + 2) / (1 + 2) = 1 at S=300
    assert (
        "| attention forward+backward | 2030-01-02T01:00:00Z | GPU A | 2 | 0.851x (-) | 0.725x (>= 0.8), B=1,H=2,S=100"
        in page
    )
    assert (
        "- attention forward+backward (GPU A), lowest tuned / peer: 0.725, 90% of the target 0.8 at B=1,H=2,S=100"
        in page
    )
    assert "forward+backward | 2030-01-02T01:00:00Z | GPU B" not in page
