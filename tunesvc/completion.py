"""What `tune` offers on TAB: kernel names, search strategies, a kernel's presets.

A shell calls `tune` on every TAB press, so nothing here imports torch or Triton (1.5 s and
more): kernel names come from :data:`tunesvc.template.SHIPPED` and the ``tunesvc.templates``
entry points (their names, not their code), and a shipped kernel's presets are read from its
template module's source (:mod:`tunesvc.templates`) as a syntax tree, which is data, instead of
importing it (light as it is, a TAB press pays for the space files it would read).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

from tunesvc.template import ALIASES
from tunesvc.template import SHIPPED

#: the package of the shipped templates (found, never imported here)
_KERNELS_PACKAGE = "tunesvc.templates"


def kernel_names() -> list[str]:
    """Shipped template names, then entry-point templates' names (not loaded)."""
    from importlib.metadata import entry_points  # here: only kernel names need it

    names = list(SHIPPED)
    names += [ep.name for ep in entry_points(group="tunesvc.templates") if ep.name not in SHIPPED]
    return names


def strategy_names() -> tuple[str, ...]:
    from tunesvc.search import STRATEGIES

    return STRATEGIES


def preset_names(kernel: str) -> list[str]:
    """A shipped kernel's preset names, in the order its template declares them; none for others
    (an entry point's or a module:attribute's presets are known only by importing its code)."""
    kernel = ALIASES.get(kernel, kernel)  # the library's name of a shipped kernel (layer_norm)
    if kernel not in SHIPPED:
        return []
    module, _, attr = SHIPPED[kernel].partition(":")
    try:
        tree = _module_tree(module)
    except (OSError, SyntaxError):
        return []
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == attr for t in node.targets)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
        ):
            return _class_presets(module, node.value.func.id)
    return []


def _class_presets(module: str, class_name: str) -> list[str]:
    """The keys of ``presets = {...}`` in the class, else in its bases (as Python looks them up)."""
    tree = _module_tree(module)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        origin = _imported_from(tree, class_name)
        return _class_presets(origin, class_name) if origin is not None else []
    for node in cls.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        if isinstance(target, ast.Name) and target.id == "presets":
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if not isinstance(value, ast.Dict):
                return []
            return [k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id != "Template":
            found = _class_presets(module, base.id)
            if found:
                return found
    return []


def _imported_from(tree: ast.Module, name: str) -> str | None:
    """The shipped template module that ``from tunesvc.templates.<module> import name`` names."""
    for node in tree.body:
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith(_KERNELS_PACKAGE + ".")
            and any(alias.name == name and alias.asname is None for alias in node.names)
        ):
            return (node.module or "").removeprefix(_KERNELS_PACKAGE + ".")
    return None


@functools.cache
def _module_tree(module: str) -> ast.Module:
    spec = importlib.util.find_spec(_KERNELS_PACKAGE)  # imports tunesvc (light), not the templates
    if spec is None or not spec.submodule_search_locations:
        raise OSError(f"{_KERNELS_PACKAGE} is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / f"{module}.py"
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
