"""tunesvc's modules import each other without a cycle, counting the imports inside functions,
and each layer imports only what it may (DESIGN.md, "The house").

The graph is read from the source (no module is imported): an edge for every ``import`` of a
tunesvc module, at the top of a module or inside a function (those run too, later), except under
``if TYPE_CHECKING:`` (counted only where a rule says so). ``from package import name`` is an
edge to ``package.name`` where that is a module, else to the package.

The rules:

- serving (tunesvc.serving.runtime, tunesvc.serving.launch, tunesvc.serving.ops, tunesvc.serving.*, the shipped kernels)
  imports no tuning (the sweep, search strategies, measurers, selector fitting), no capture and
  no fleet (tunesvc.fleet); mode 'tune' reaches the sweep through the policy the package root
  registers;
- the store imports no measurer nor anything above it, its type annotations included (it keeps
  the records of tunesvc.records);
- tunesvc.records imports nothing of tunesvc's.
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


def _imports(module: str, path: Path, modules: dict[str, Path], *, typing: bool = False) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    named: list[str] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and not typing:
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


def _graph(*, typing: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    return {module: _imports(module, path, modules, typing=typing) for module, path in modules.items()}


def _chains(graph: dict[str, set[str]], starts: list[str]) -> dict[str, list[str]]:
    """Every module reachable from ``starts``, with one import chain that reaches it."""
    chains = {start: [start] for start in starts}
    todo = list(starts)
    while todo:
        module = todo.pop()
        for imported in sorted(graph[module]):
            if imported not in chains:
                chains[imported] = [*chains[module], imported]
                todo.append(imported)
    return chains


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(f"{p}.") for p in packages)


#: serving's modules: the runtime with its winner sources and chain, launch, ops, the selector's
#: model, and the shipped kernels and their templates, which run on them
SERVING = (
    *(
        "tunesvc.serving.runtime",
        "tunesvc.serving.launch",
        "tunesvc.serving.ops",
        "tunesvc.serving",
        "tunesvc.kernels",
        "tunesvc.templates",
    ),
)
#: what serving may not import: tuning, capture, the fleet (tunesvc.fleet: the batch queue and worker placement), and the CLI and
#: reports on top
NOT_SERVING = (
    *("tunesvc.tuning.sweep", "tunesvc.search", "tunesvc.bench", "tunesvc.tuning", "tunesvc.verify"),
    *("tunesvc._capture", "tunesvc._capture.autotuner"),
    "tunesvc.fleet",
    *("tunesvc.cli", "tunesvc.report", "tunesvc.completion"),
)


def test_serving_imports_no_tuning_capture_or_fleet():
    graph = _graph()
    starts = sorted(m for m in graph if _within(m, SERVING))
    assert {"tunesvc.serving.runtime", "tunesvc.serving.selector", "tunesvc.kernels.matmul"} <= set(starts)
    chains = _chains(graph, starts)
    assert "tunesvc.store" in chains and "tunesvc.bundle" in chains  # its winner sources are read
    broken = sorted(" -> ".join(chain) for module, chain in chains.items() if _within(module, NOT_SERVING))
    assert not broken, "serving imports what it may not:\n" + "\n".join(broken)


def test_serving_loads_no_tuning_capture_or_fleet_at_run_time(tmp_path):
    """What the graph cannot see (a module imported by name): a process that looks configs up
    through the whole chain, exact, predicted (a stored selector) and nearest, from the example
    database, and from no database, loads none of it, nor scikit-learn or Optuna."""
    db = tmp_path / "example.db"
    db.write_bytes((ROOT / "tune.db.example").read_bytes())
    code = f"""
import dataclasses, sys, warnings
warnings.simplefilter("ignore")
import tunesvc.kernels
from tunesvc.device import Device
from tunesvc.serving.runtime import Runtime
from tunesvc.store import Store
store = Store(sys.argv[1], readonly=True)
stored = store.devices()[-1]
store.close()
h100 = Device(**{{f.name: getattr(stored, f.name) for f in dataclasses.fields(Device)}})
runtime = Runtime(db=sys.argv[1], device=h100)
for m in (1000, 4096, 3):
    runtime.lookup("matmul", M=m, N=3000, K=777, dtype="bfloat16")
Runtime().lookup("softmax", M=3, N=5, dtype="float32")
print(sorted(runtime.stats()["matmul"]))
banned = {NOT_SERVING!r} + ("sklearn", "optuna")
print(sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in banned)))
"""
    done = subprocess.run(
        [sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sources, loaded = done.stdout.strip().splitlines()
    assert sources == "['exact', 'nearest', 'predicted']" and loaded == "[]", done.stdout


def test_the_store_imports_no_measurer_nor_anything_above_it():
    graph = _graph(typing=True)  # its annotations too: it keeps records, not a measurer's types
    starts = sorted(m for m in graph if _within(m, ("tunesvc.store",)))
    chains = _chains(graph, starts)
    above = (
        "tunesvc.serving.runtime",
        "tunesvc.serving.launch",
        "tunesvc.serving.ops",
        "tunesvc.serving",
        "tunesvc.bundle",
        *NOT_SERVING,
    )
    broken = sorted(" -> ".join(chain) for module, chain in chains.items() if _within(module, above))
    assert not broken, "the store imports what it may not:\n" + "\n".join(broken)


def test_records_import_nothing_of_tunesvc():
    assert _graph(typing=True)["tunesvc.records"] == set()


def test_no_import_cycle_among_tunesvc_modules():
    modules = _modules()
    graph = {module: _imports(module, path, modules) for module, path in modules.items()}
    assert len(graph) > 20 and graph["tunesvc.tuning.sweep"] >= {"tunesvc.bench", "tunesvc.search"}  # the graph is read
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


def test_every_package_of_tunesvc_is_installed():
    """pyproject.toml lists packages by name: a package folder missing there is missing from
    every non-editable install (the wheel, `pip install --target`), though editable ones work."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(p.parent.relative_to(root).parts)
        for p in (root / "tunesvc").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert folders <= listed, sorted(folders - listed)
