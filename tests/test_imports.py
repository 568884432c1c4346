"""tunesvc's modules import each other without a cycle, counting the imports inside functions and
those by name, and each layer imports only what it may (DESIGN.md, "The house").

The graph is read from the source (no module is imported): an edge for every ``import`` of a
tunesvc module, at the top of a module or inside a function (those run too, later), except under
``if TYPE_CHECKING:`` (counted only where a rule says so). ``from package import name`` is an
edge to ``package.name`` where that is a module, else to the package. An import by name
(``importlib.import_module("tunesvc.x")``, ``__import__``) is an edge to the module it names;
one whose name is built (``f"tunesvc.kernels.{family}"``) is an edge to every module under the
name's fixed part, since it may reach any of them.

The rules:

- serving (tunesvc.serving.*, the shipped kernels and their templates) imports no tuning (the
  sweep, search strategies, measurers, selector fitting), no capture and no fleet
  (tunesvc.fleet); mode 'tune' reaches the sweep through the policy the package root registers;
- capture (tunesvc._capture) imports no fleet; tuning (tunesvc.tuning) imports no capture;
- nothing imports the CLI (tunesvc.cli) but the CLI and ``python -m tunesvc``;
- the store imports no measurer nor anything above it, its type annotations included (it keeps
  the records of tunesvc.records);
- the foundation (:data:`FOUNDATION`: settings, records and the other base modules) imports
  nothing above it, its type annotations included; tunesvc.records imports nothing of tunesvc's;
- no cycle among modules, none between rooms (the packages and top-level modules of tunesvc),
  and no import climbs back up: no module of a package imports a module outside it that reaches
  back into the package;
- no module imports an underscore name, or from an underscore module, of another package (a
  package's underscore names are its own modules' alone; the others import what its root exports).

The package root (``tunesvc``) is the one module above every room: it wires the layers together
(the tune-on-miss policy for serving, the kernel and template loaders for the templates) and
loads its public names on first use, so it is left out of the room rules; a cycle through it is
still one.
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


#: the functions that import a module given its name as a string
BY_NAME = ("import_module", "__import__")


def _named(node: ast.expr, module: str, package: str) -> tuple[str, bool] | None:
    """The module name an import by name gives (``"tunesvc.x"``), or the fixed part of a built one
    (``f"tunesvc.kernels.{family}"``: ``"tunesvc.kernels."``, True); None where no part is fixed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value, False
    parts = node.values if isinstance(node, ast.JoinedStr) else []
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        parts = [node.left]
    fixed = ""
    for part in parts:  # the fixed start of the name, up to its first part that varies
        if isinstance(part, ast.Constant) and isinstance(part.value, str):
            fixed += part.value
        elif isinstance(part, ast.FormattedValue) and ast.unparse(part.value) == "__name__":
            fixed += module
        elif isinstance(part, ast.FormattedValue) and ast.unparse(part.value) == "__package__":
            fixed += package
        else:
            return (fixed, True) if fixed else None
    return (fixed, False) if fixed else None


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

    tree = ast.parse(path.read_text())
    visit(tree.body)
    for call in ast.walk(tree):  # imports by name: no TYPE_CHECKING block makes one
        if not (isinstance(call, ast.Call) and call.args):
            continue
        function = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        given = _named(call.args[0], module, package) if function in BY_NAME else None
        if given is None or not given[0].startswith("tunesvc"):
            continue
        name, built = given
        named.extend([m for m in modules if m.startswith(name)] if built else [name])
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
SERVING = ("tunesvc.serving", "tunesvc.kernels", "tunesvc.templates")
#: what serving may not import: tuning, capture, the fleet (tunesvc.fleet: the batch runner, the
#: queue and worker placement), and the CLI and reports on top
NOT_SERVING = (
    *("tunesvc.tuning", "tunesvc.search", "tunesvc.bench", "tunesvc.verify"),
    "tunesvc._capture",
    "tunesvc.fleet",
    *("tunesvc.cli", "tunesvc.report", "tunesvc.completion"),
)
#: the foundation: what every layer imports, importing nothing above it (tunesvc.shipped: the
#: loaders of the shipped kernels and templates, which the package root sets)
FOUNDATION = (
    *("tunesvc.settings", "tunesvc.records", "tunesvc.errors", "tunesvc.text", "tunesvc.files"),
    *("tunesvc.checks", "tunesvc.command", "tunesvc.schemas", "tunesvc._processes", "tunesvc.timeline"),
    *("tunesvc.device", "tunesvc.space", "tunesvc.template", "tunesvc.shipped"),
)


def _broken(graph: dict[str, set[str]], starts: list[str], banned: tuple[str, ...]) -> list[str]:
    """The import chains from ``starts`` that reach a module of ``banned``."""
    chains = _chains(graph, starts)
    return sorted(" -> ".join(chain) for module, chain in chains.items() if _within(module, banned))


def test_serving_imports_no_tuning_capture_or_fleet():
    graph = _graph()
    starts = sorted(m for m in graph if _within(m, SERVING))
    assert {"tunesvc.serving.runtime", "tunesvc.serving.selector", "tunesvc.kernels.matmul"} <= set(starts)
    chains = _chains(graph, starts)
    assert "tunesvc.store" in chains and "tunesvc.serving.bundle_format" in chains  # its winner sources are read
    broken = _broken(graph, starts, NOT_SERVING)
    assert not broken, "serving imports what it may not:\n" + "\n".join(broken)


def test_serving_loads_no_tuning_capture_or_fleet_at_run_time(tmp_path):
    """What the graph cannot see (a module imported by a name built at run time): a process that
    looks configs up through the whole chain, exact, predicted (a stored selector) and nearest,
    from the example database, and from no database, loads none of it, nor scikit-learn or Optuna."""
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
h100, h200 = (Device(**{{f.name: getattr(d, f.name) for f in dataclasses.fields(Device)}}) for d in store.devices())
store.close()
# matmul's current winners are the H200's (exact, nearest); rmsnorm's the H100's, with a selector
runtime = Runtime(db=sys.argv[1], device=h200)
for m in (1000, 4096):
    runtime.lookup("matmul", M=m, N=3000, K=777, dtype="bfloat16")
predicting = Runtime(db=sys.argv[1], device=h100)
for m in (4096, 5000):
    predicting.lookup("rmsnorm", M=m, N=4096, dtype="bfloat16")
Runtime().lookup("softmax", M=3, N=5, dtype="float32")
print(sorted({{*runtime.stats()["matmul"], *predicting.stats()["rmsnorm"]}}))
banned = {NOT_SERVING!r} + ("sklearn", "optuna")
print(sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in banned)))
"""
    done = subprocess.run(
        [sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sources, loaded = done.stdout.strip().splitlines()
    assert sources == "['exact', 'nearest', 'predicted']" and loaded == "[]", done.stdout


def test_capture_imports_no_fleet():
    graph = _graph()
    starts = sorted(m for m in graph if _within(m, ("tunesvc._capture",)))
    assert {"tunesvc._capture.autotuner", "tunesvc._capture.recorded_check"} <= set(starts)
    broken = _broken(graph, starts, ("tunesvc.fleet", "tunesvc.cli"))
    assert not broken, "capture imports the fleet:\n" + "\n".join(broken)


def test_tuning_imports_no_capture():
    graph = _graph()
    starts = sorted(m for m in graph if _within(m, ("tunesvc.tuning",)))
    assert "tunesvc.tuning.sweep" in starts
    broken = _broken(graph, starts, ("tunesvc._capture", "tunesvc.fleet", "tunesvc.cli"))
    assert not broken, "tuning imports capture:\n" + "\n".join(broken)


def test_nothing_imports_the_cli():
    graph = _graph(typing=True)
    allowed = ("tunesvc.cli", "tunesvc.__main__")  # the CLI's own modules, and `python -m tunesvc`
    broken = sorted(
        f"{module} -> {imported}"
        for module, imports in graph.items()
        if not _within(module, allowed)
        for imported in imports
        if _within(imported, ("tunesvc.cli",))
    )
    assert graph["tunesvc.__main__"] == {"tunesvc.cli"}  # the graph is read
    assert not broken, "imports the CLI:\n" + "\n".join(broken)


def test_the_store_imports_no_measurer_nor_anything_above_it():
    graph = _graph(typing=True)  # its annotations too: it keeps records, not a measurer's types
    starts = sorted(m for m in graph if _within(m, ("tunesvc.store",)))
    broken = _broken(graph, starts, ("tunesvc.serving", "tunesvc.bundle", *NOT_SERVING))
    assert not broken, "the store imports what it may not:\n" + "\n".join(broken)


def test_the_foundation_imports_nothing_above_it():
    graph = _graph(typing=True)  # its annotations too
    assert set(FOUNDATION) <= set(graph)
    assert graph["tunesvc.records"] == set()
    broken = sorted(
        f"{module} -> {imported}" for module in FOUNDATION for imported in graph[module] if imported not in FOUNDATION
    )
    assert not broken, "the foundation imports from above it:\n" + "\n".join(broken)


def test_imports_by_name_are_counted():
    graph = _graph()
    assert {"tunesvc.kernels.matmul", "tunesvc.templates.softmax"} <= graph["tunesvc"]  # the root's loaders
    assert "tunesvc._capture.launch" in graph["tunesvc._capture"]  # f"{__name__}.{module}"
    assert not {m for m in graph["tunesvc.templates._shipped"] if _within(m, ("tunesvc.kernels",))}  # nor kernel


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, or None where it has none."""
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
        if cycle:
            return cycle
    return None


def test_no_import_cycle_among_tunesvc_modules():
    graph = _graph()
    assert len(graph) > 20 and graph["tunesvc.tuning.sweep"] >= {"tunesvc.bench", "tunesvc.search"}  # the graph is read
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def _room(module: str) -> str:
    """The room of a module: its package just below tunesvc, or the top-level module itself."""
    return ".".join(module.split(".")[:2])


def test_no_cycle_between_rooms():
    rooms: dict[str, set[str]] = {}
    for module, imports in _graph().items():
        if module != "tunesvc":  # the package root, above every room
            rooms.setdefault(_room(module), set()).update(_room(m) for m in imports if _room(m) != _room(module))
    rooms = {room: {r for r in imported if r in rooms} for room, imported in rooms.items()}
    assert {"tunesvc.serving", "tunesvc.tuning", "tunesvc._capture", "tunesvc.fleet"} <= set(rooms)
    cycle = _cycle(rooms)
    assert cycle is None, "rooms import each other: " + " -> ".join(cycle)


def test_no_import_climbs_back_up():
    """No module of a package imports a module outside it that imports the package again (as
    tuning.on_miss did, importing the sweep at the top of tunesvc, which imported tuning)."""
    graph = _graph()
    packages = sorted({m for m, path in _modules().items() if path.name == "__init__.py"} - {"tunesvc"})
    broken = []
    for package in packages:
        inside = [m for m in graph if _within(m, (package,))]
        outside = sorted({i for m in inside for i in graph[m] if not _within(i, (package,))})
        for chain in _chains(graph, outside).values():
            if _within(chain[-1], (package,)) and chain[0] != "tunesvc":
                broken.append(f"{package}: " + " -> ".join(chain))
    assert not broken, "imports that climb back up:\n" + "\n".join(sorted(broken)[:20])


def test_no_underscore_name_is_imported_from_another_package():
    """Neither an underscore name nor a name from an underscore module of another package
    (``tunesvc.bench._inprocess``): a package's other packages import what its root exports."""
    modules = _modules()
    broken = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("tunesvc") or node.level:
                continue
            source = node.module or ""
            source_package = source if modules.get(source, Path()).name == "__init__.py" else source.rpartition(".")[0]
            # an underscore module below a room (tunesvc.bench._base; not tunesvc._capture, a room)
            hidden = any(part.startswith("_") for part in source.split(".")[2:])
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if (hidden or (private and f"{source}.{alias.name}" not in modules)) and not _within(
                    module, (source_package,)
                ):
                    broken.append(f"{module}: from {source} import {alias.name}")
    assert not broken, "private names imported from another package:\n" + "\n".join(sorted(broken))


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
