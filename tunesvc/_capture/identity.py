"""What names a captured kernel and its keys in the store; it imports neither torch nor Triton.

A kernel is ``module:qualname`` of its Python function (:func:`kernel_name`, also the path to
import it); its version (:func:`kernel_version`) hashes its source's syntax tree, those of the
``@triton.jit`` functions it calls, the ``tl.constexpr`` globals they read, its config list and the
Triton version. A shape key is Triton's key tuple as readable text (:func:`key_text`), a
config is stored as :func:`config_dict` writes it. :class:`CapturedTemplate`, :class:`CapturedKey`
and :class:`ListedConfigs` are a captured kernel as the store, the runtime's one chain and
`tune lookup` see it (the CLI reads them without importing torch).
"""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from tunesvc.settings import TUNE
from tunesvc.space import LAUNCH_OPTIONS
from tunesvc.space import config_hash
from tunesvc.template import ShapeKey
from tunesvc.template import Template
from tunesvc.template import source_version

if TYPE_CHECKING:
    from tunesvc.device import Device
    from tunesvc.space import Config as ConfigDict


def config_dict(config: Any) -> ConfigDict:
    """A triton.Config as the store keeps it: meta-parameters and every launch option that is set
    (``all_kwargs()``: whatever options the installed Triton's Config carries, ``ir_override`` too).

    Values other than whole numbers and text (bools, floats, None) are written as their text
    (``True``, ``0.5``): stored configs and bundles hold ints and strings only, and a stored
    config only names one of the listed configs (by :func:`~tunesvc.space.config_hash`), which
    is what launches, with its own values and pre_hook.
    """
    return {k: _stored_value(v) for k, v in config.all_kwargs().items()}


def _stored_value(value: Any) -> int | str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return repr(value) if isinstance(value, float) else str(value)
    return value


def kernel_name(fn: Any) -> str:
    """``module:qualname`` of the Python function under any stack of JIT/heuristics wrappers."""
    base = fn
    while not inspect.isfunction(base):
        base = base.fn
    return f"{base.__module__}:{base.__qualname__}"


def _base_function(fn: Any) -> Callable[..., Any]:
    while not inspect.isfunction(fn):
        fn = fn.fn
    return fn


def kernel_version(fn: Any, configs: list[Any]) -> str:
    """Hash of the kernel's syntax tree, its config list and the Triton version, and of what
    Triton's own cache key follows besides (:func:`_dependencies`): the syntax tree of every
    ``@triton.jit`` function it calls and the value of every ``tl.constexpr`` global it reads."""
    import triton

    listing = repr([sorted(config_dict(c).items()) for c in configs])
    base = _base_function(fn)
    sources = [_source_of(base), listing, repr(triton.__version__)]
    helpers, values = _dependencies(base)
    if helpers or values:  # a kernel that reaches none keeps the version it always had
        sources += [_source_of(helper) for _, helper in helpers]
        sources.append(repr([helper.__qualname__ for _, helper in helpers] + values))
    return source_version(*sources)


def _source_of(fn: Callable[..., Any]) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):  # no source file (exec'd code): the name stands in
        return f"# {fn.__module__}:{fn.__qualname__}"


def _jit_base(value: Any) -> Callable[..., Any] | None:
    """The Python function under a ``@triton.jit`` object (a JITFunction, the interpreter's
    InterpretedFunction, a ``constexpr_function``), found as Triton's own wrappers are: ``.fn``."""
    if not type(value).__module__.startswith("triton.") or inspect.isfunction(value):
        return None
    for _ in range(8):  # a short chain of wrappers; a value whose fn never ends is no kernel
        value = getattr(value, "fn", None)
        if value is None:
            return None
        if inspect.isfunction(value):
            return value
    return None


def _dependencies(fn: Callable[..., Any]) -> tuple[list[tuple[str, Callable[..., Any]]], list[str]]:
    """What Triton's cache key (``JITFunction.cache_key``, its ``DependenciesFinder``) follows
    beyond a kernel's own source: every ``@triton.jit`` function it reaches by a global or closure
    name or a module attribute, transitively (Triton's own, versioned with Triton, left out), and
    the ``tl.constexpr`` globals each reads (``function:name=value``), in a fixed order. Module
    names are left out, as Triton's key leaves them: the same code moved keeps its version.

    Walked here rather than read from ``cache_key``: that hash also covers each function's line
    number and comments (a line added above a kernel would drop its winners), and Triton's
    interpreter has none."""
    helpers: dict[str, Callable[..., Any]] = {}
    values: set[str] = set()
    todo = [fn]
    seen = {fn}
    while todo:
        current = todo.pop()
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(current)))
        except (OSError, TypeError, SyntaxError):  # no source to walk: its name stands in above
            continue
        closure = dict(zip(current.__code__.co_freevars, (c.cell_contents for c in current.__closure__ or ())))
        scope = {**current.__globals__, **closure}
        for node in ast.walk(tree):
            path = _name_path(node)
            if not path or path[0] not in scope:
                continue
            value = scope[path[0]]
            for attr in path[1:]:
                if not isinstance(value, types.ModuleType):
                    break
                value = getattr(value, attr, None)
            else:
                base = _jit_base(value)
                if base is not None:
                    if not base.__module__.startswith("triton.") and base not in seen:
                        seen.add(base)
                        todo.append(base)
                        helpers[f"{base.__module__}:{base.__qualname__}"] = base
                elif type(value).__name__ == "constexpr" and type(value).__module__.startswith("triton."):
                    values.add(f"{current.__qualname__}:{'.'.join(path)}={getattr(value, 'value', value)!r}")
    return sorted(helpers.items(), key=lambda item: (item[1].__qualname__, item[0])), sorted(values)


def _name_path(node: ast.AST) -> list[str] | None:
    """``a.b.c`` read in code as ``["a", "b", "c"]`` (None: not a name, nor attributes of one)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load):
        return None
    return [node.id, *reversed(parts)]


def value_text(value: Any) -> str:
    if value is None or isinstance(value, (bool, int)):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return str(value).replace(",", ";").replace("=", ":")


def key_text(names: list[str], key: tuple, dtype_names: list[str]) -> str:
    """Triton's key tuple as stable, readable text: ``n=1000,flag=True,x.dtype=float16``."""
    values = len(key) - len(dtype_names)
    parts = [f"{n}={value_text(v)}" for n, v in zip(names[:values], key[:values])]
    parts += [f"{n}.dtype={str(d).removeprefix('torch.')}" for n, d in zip(dtype_names, key[values:])]
    return ",".join(parts)


class CapturedTemplate(Template):
    """A captured kernel as the store and the runtime see it: a name, a version, and a space that
    is its config list (a stored config is accepted where it names only parameters the list sets:
    which config it is, listed or built by the kernel's pruner for a call, is matched at launch).

    Its problem is a shape key's text (``{"key": "n=1000,x.dtype=float16"}``), so the runtime's
    one chain (exact, predicted, nearest, transferred, heuristic) answers a captured kernel as it
    does a shipped one; its heuristic is its first listed config (capture launches the first
    config Triton's pruning keeps for the call where the chain ends there)."""

    dims = ()

    def __init__(self, name: str, version: str, configs: list[Any]) -> None:
        self.name = name  # type: ignore[misc]
        self.__dict__["version"] = version  # shadows Template's cached_properties
        self.__dict__["space"] = ListedConfigs(configs)
        self._first: ConfigDict = config_dict(configs[0]) if configs else {}
        self.tune_hint = f"tune it with `tune misses --tune --kernel {name}`, or run in mode '{TUNE}'"

    def problem(self, **kwargs: Any) -> dict[str, Any]:
        return {"key": str(kwargs["key"])}

    def problem_of_key(self, key: str) -> dict[str, Any]:
        return {"key": key}

    def key(self, problem: dict[str, Any]) -> ShapeKey:
        return CapturedKey.of(problem["key"])

    def heuristic(self, problem: dict[str, Any], device: Device) -> ConfigDict:
        return dict(self._first)

    def violations(self, config: Any, problem: dict[str, Any], device: Device) -> list[str]:
        return []  # whether a stored config fits the call is Triton's pruning's to say, at launch

    def key_distance(self, a: ShapeKey, b: ShapeKey) -> float:
        """Distance in log2 space over the integer fields (|n| + 1: a key value may be 0);
        infinite when any other field differs."""
        if not a.comparable(b):
            return math.inf
        return math.sqrt(
            sum((math.log2(abs(x) + 1) - math.log2(abs(y) + 1)) ** 2 for (_, x), (_, y) in zip(a.dims, b.dims))
        )


@dataclass(frozen=True)
class CapturedKey(ShapeKey):
    """A captured kernel's shape key: parsed like any (integer dims, other fields), written as
    Triton's key text exactly as stored (its fields in the kernel's own order)."""

    text: str = ""

    @classmethod
    def of(cls, text: str) -> CapturedKey:
        parsed = ShapeKey.parse(text)
        return cls(parsed.dims, parsed.fields, text)

    def __str__(self) -> str:
        return self.text


class ListedConfigs:
    """What the runtime asks of a captured kernel's space: whether a stored config may be one of
    its configs (listed, or built by an ``early_config_prune`` or ``perf_model`` for some call)."""

    def __init__(self, configs: list[Any]) -> None:
        self.hashes = {config_hash(config_dict(c)) for c in configs}
        self.names = {name for c in configs for name in config_dict(c)} | set(LAUNCH_OPTIONS)

    def stored_config(self, config: Any) -> ConfigDict | str:
        if not isinstance(config, dict) or not config:
            return "not a config"
        if config_hash(config) in self.hashes or config.keys() <= self.names:
            return config
        return "names parameters the kernel's configs do not have"
