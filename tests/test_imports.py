"""tunesvc's modules import each other without a cycle, counting the imports inside functions.

The graph is read from the source (no module is imported): an edge for every ``import`` of a
tunesvc module, at the top of a module or inside a function (those run too, later), except under
``if TYPE_CHECKING:``. ``from package import name`` is an edge to ``package.name`` where that is
a module, else to the package.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _modules() -> dict[str, Path]:
    modules = {}
    for path in (ROOT / "tunesvc").rglob("*.py"):
        if "versions" in path.parts:  # Alembic's revision scripts: run by Alembic, imported by nobody
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    for path in (ROOT / "kernels").glob("*.py"):  # installed as tunesvc.kernels
        modules["tunesvc.kernels" + ("" if path.stem == "__init__" else f".{path.stem}")] = path
    return modules


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    named: list[str] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                named.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                named.extend(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    visit(inner)

    visit(ast.parse(path.read_text()).body)
    found = set()
    for name in named:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def test_no_import_cycle_among_tunesvc_modules():
    modules = _modules()
    graph = {module: _imports(module, path, modules) for module, path in modules.items()}
    assert len(graph) > 20 and graph["tunesvc.sweep"] >= {"tunesvc.bench", "tunesvc.search"}  # the graph is read
    done: set[str] = set()

    def cycle_from(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for imported in sorted(graph[module]):
            found = cycle_from(imported, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = cycle_from(module, [])
        assert cycle is None, " -> ".join(cycle)


def test_the_cli_has_a_name_no_other_package_claims():
    """Ray installs a `tune` command too (whichever package installs last owns it): `tunesvc` is
    the same CLI under its own name."""
    from importlib.metadata import entry_points

    ours = {ep.name: ep.value for ep in entry_points(group="console_scripts") if ep.dist and ep.dist.name == "tunesvc"}
    assert ours == {"tune": "tunesvc.cli:main", "tunesvc": "tunesvc.cli:main"}
    script = Path(sys.executable).with_name("tunesvc")
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("tunesvc"), done.stdout + done.stderr
