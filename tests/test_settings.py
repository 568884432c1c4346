"""One settings module: every environment variable is read in tunesvc/settings.py alone, and a
value that does not parse is one warning and the default, never an exception."""

from __future__ import annotations

import ast
import sys
import warnings
from pathlib import Path

import pytest

from tunesvc import settings

ROOT = Path(__file__).resolve().parents[1]


def _environment_reads(path: Path) -> list[str]:
    """Where ``path`` reads ``os.environ`` or ``os.getenv`` (writes and updates are not reads)."""
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            if node.attr == "getenv":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            elif node.attr == "environ":
                parent = parents.get(node)
                writing = (isinstance(parent, ast.Subscript) and isinstance(parent.ctx, (ast.Store, ast.Del))) or (
                    isinstance(parent, ast.Attribute) and parent.attr in ("setdefault", "update", "pop", "clear")
                )
                if not writing:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


#: the one other reader: the start policy, which runs from its own file before the package exists
#: (tests/test_processes.py loads it alone) and reads only TRITON_INTERPRET and CUDA_VISIBLE_DEVICES
BOOTSTRAP = ROOT / "tunesvc" / "_processes.py"


def test_the_environment_is_read_in_the_settings_module_alone():
    files = [*ROOT.joinpath("tunesvc").rglob("*.py"), *ROOT.joinpath("kernels").rglob("*.py")]
    reads = [where for f in files if f.name != "settings.py" and f != BOOTSTRAP for where in _environment_reads(f)]
    assert reads == []
    assert "TUNESVC_" not in BOOTSTRAP.read_text()
    assert _environment_reads(ROOT / "tunesvc" / "settings.py")  # the check sees reads where they are


@pytest.mark.parametrize(
    "name, value, read, expected",
    [
        ("TUNESVC_MODE", "tuen", lambda: settings.mode("lookup"), "lookup"),
        ("TUNESVC_MAX_KEYS", "lots", settings.max_keys, 256),
        ("TUNESVC_MAX_KEYS", "0", settings.max_keys, 256),
        ("TUNESVC_CLAIM_STALE_S", "-3", settings.claim_stale_s, 10.0),
        ("TUNESVC_CLAIM_STALE_S", "nan", settings.claim_stale_s, 10.0),
        ("TUNESVC_COMPILE_WORKERS", "two", settings.compile_workers, 0),
        # past the range where each works: a wait of 1e308 s overflows, 10**6 processes do not start
        ("TUNESVC_CLAIM_STALE_S", "1e308", settings.claim_stale_s, 10.0),
        ("TUNESVC_CLAIM_STALE_S", "inf", settings.claim_stale_s, 10.0),
        ("TUNESVC_CLAIM_STALE_S", "0.01", settings.claim_stale_s, 10.0),
        ("TUNESVC_COMPILE_WORKERS", "1000000", settings.compile_workers, 0),
        ("TUNESVC_MAX_KEYS", str(10**30), settings.max_keys, 256),
    ],
)
def test_a_value_that_does_not_parse_is_one_warning_and_the_default(name, value, read, expected, monkeypatch):
    monkeypatch.setenv(name, value)
    settings._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read() == expected
        assert read() == expected
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and name in said[0] and repr(value) in said[0], said
    assert caught[0].filename == __file__  # the reader's caller, not tunesvc's settings module


@pytest.mark.parametrize(
    "name, value, read, expected",
    [
        ("TUNESVC_CLAIM_STALE_S", "86400", settings.claim_stale_s, 86400.0),
        ("TUNESVC_CLAIM_STALE_S", "1", settings.claim_stale_s, 1.0),
        ("TUNESVC_COMPILE_WORKERS", str(settings.MAX_COMPILE_WORKERS), settings.compile_workers, 256),
        ("TUNESVC_MAX_KEYS", str(settings.MAX_KEYS), settings.max_keys, settings.MAX_KEYS),
    ],
)
def test_a_value_at_the_edge_of_its_range_is_taken_without_a_warning(name, value, read, expected, monkeypatch):
    monkeypatch.setenv(name, value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read() == expected


def test_every_mode_is_one_vocabulary():
    assert settings.MODES == ("tune", "lookup", "heuristic", "off")
    assert all(settings.check_mode(m) is None for m in settings.MODES)
    assert settings.check_mode("serve") == "Unknown mode 'serve'; use one of tune, lookup, heuristic, off."


def test_every_variable_read_is_documented():
    source = (ROOT / "tunesvc" / "settings.py").read_text()
    named = {n for n in __import__("re").findall(r'"(TUNESVC_[A-Z_]+)"', source)}
    assert named <= set(settings.VARIABLES), named - set(settings.VARIABLES)
    sys.path.insert(0, str(ROOT / "docs"))
    from settings_reference import reference

    docs = (ROOT / "docs" / "settings.md").read_text()
    assert docs == reference(), "docs/settings.md is stale: python docs/settings_reference.py docs/settings.md"
    assert all(f"`{name}`" in docs for name in settings.VARIABLES)
