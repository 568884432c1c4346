"""Templates: one Triton kernel family, everything tunesvc needs to tune and launch it.

A template subclasses :class:`Template` and sets ``name``. The life cycle of one problem:

1. ``problem(**kwargs)`` normalises and validates what the user gave (shape, dtype);
2. ``key(problem)`` is the part of it the best config depends on (a :class:`ShapeKey`);
3. ``make_inputs(problem, device)`` makes fresh random inputs, ``reference(inputs)`` the
   float32/float64 torch answer, ``launch(inputs, config)`` runs the kernel with one config;
4. ``heuristic(problem, device)`` is the config used when nothing is tuned;
5. ``cost(problem)`` gives FLOPs and the fewest bytes moved, for roofline fractions;
6. ``peer(inputs)``, optional, runs torch's own op (``peer_name``) on the same inputs: a sweep
   times it once, so the report can show the tuned kernel against what torch users already have.

The space lives in ``search_spaces/<name>.toml`` beside the kernels folder (or wherever
``space_path`` points). The version is a hash of the template's module source, so an edited
kernel never reuses configs tuned for the old one.

Shipped templates are found by name in :data:`SHIPPED` (modules of :mod:`tunesvc.templates`); users' own templates load by
``module:attribute`` or through the ``tunesvc.templates`` entry point group.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib
import inspect
import math
import os
import re
import sys
import textwrap
from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING
from typing import Any
from typing import ClassVar

from tunesvc import settings
from tunesvc._processes import remake_cached_property_locks
from tunesvc.errors import TunesvcError
from tunesvc.space import Config
from tunesvc.space import Space

if TYPE_CHECKING:
    from tunesvc.device import Device

Problem = dict[str, Any]

DTYPES = ("float16", "bfloat16", "float32")
#: bytes per element of each dtype a problem may name (torch's ``itemsize``, known without importing torch)
ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float


@dataclass(frozen=True)
class ShapeKey:
    """What the best config depends on: bucketed integer dims plus exact categorical fields."""

    dims: tuple[tuple[str, int], ...]
    fields: tuple[tuple[str, str], ...]

    @classmethod
    def make(cls, dims: dict[str, int], fields: dict[str, str]) -> ShapeKey:
        return cls(tuple(dims.items()), tuple(sorted(fields.items())))

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in (*self.dims, *self.fields))

    @classmethod
    def parse(cls, text: str) -> ShapeKey:
        dims, fields = {}, {}
        for part in text.split(","):
            name, _, value = part.partition("=")
            if value.isascii() and value.isdigit():  # str.isdigit alone accepts '²', which int() refuses
                dims[name] = int(value)
            else:
                fields[name] = value
        return cls(tuple(dims.items()), tuple(sorted(fields.items())))

    def comparable(self, other: ShapeKey) -> bool:
        """Whether the two keys have the same categorical fields and name the same dims."""
        return self.fields == other.fields and [k for k, _ in self.dims] == [k for k, _ in other.dims]

    def distance(self, other: ShapeKey) -> float:
        """Distance in log2 space over dims; infinite when a categorical field differs or a dim
        is 0 (a key from a database or bundle may say M=0, which has no logarithm)."""
        if not self.comparable(other) or not all(v > 0 for _, v in (*self.dims, *other.dims)):
            return math.inf
        return math.sqrt(sum((math.log2(a) - math.log2(b)) ** 2 for (_, a), (_, b) in zip(self.dims, other.dims)))


def pow2_bucket(x: int) -> int:
    """Round up to a power of two: dims that vary at run time (batch, tokens) share configs."""
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def element_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (a torch dtype's name): from :data:`ELEMENT_BYTES`, else torch's."""
    if dtype in ELEMENT_BYTES:
        return ELEMENT_BYTES[dtype]
    import torch  # a dtype outside the table (a user's template): torch knows it

    return getattr(torch, dtype).itemsize


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` of integers, as ``triton.cdiv`` (which a template's shape logic need not import)."""
    return -(-a // b)


def backward_peer(forward: Callable[..., Any], inputs: tuple[Any, ...], grad: Any) -> Callable[[], tuple[Any, ...]]:
    """A backward template's torch peer: autograd's gradients of ``forward(*leaves)`` at leaves
    holding ``inputs``, given the output's ``grad``, only the backward timed. The forward runs once
    per CUDA stream the peer is called on (once on the CPU), on leaves of its own: autograd runs
    each backward op on its forward op's stream and each leaf's gradient accumulator on the stream
    the leaf first met autograd on, so a forward on another stream than a CUDA graph's capture
    made the capture fail ("operation would make the legacy stream depend on a capturing blocking
    stream", seen on an H200 after a first call on the default stream), and the peer was timed
    without a graph."""
    import torch  # heavy: imported where tensors are made or compared

    runs: dict[int | None, tuple[Any, tuple[Any, ...]]] = {}

    def run() -> tuple[Any, ...]:
        stream = torch.cuda.current_stream().cuda_stream if grad.is_cuda else None
        if stream not in runs:
            leaves = tuple(t.detach().requires_grad_() for t in inputs)
            with torch.enable_grad():
                runs[stream] = (forward(*leaves), leaves)
        output, leaves = runs[stream]
        return torch.autograd.grad(output, leaves, grad, retain_graph=True)

    return run


def source_version(*sources: str) -> str:
    """A 12-hex-digit hash of Python sources' syntax trees, docstrings left out.

    Hashing the tree rather than the text keeps a kernel's version (and so its tuned configs)
    across reformatting and edits of comments or docstrings, and changes it with any edit of code.
    """
    trees = []
    for source in sources:
        tree = ast.parse(textwrap.dedent(source))
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (
                isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
        trees.append(_tree_text(tree))
    return hashlib.sha256("\n".join(trees).encode()).hexdigest()[:12]


def _tree_text(node: Any) -> str:
    """A syntax tree as text that reads the same on every Python version.

    ``ast.dump`` does not: 3.12 added ``type_params=[]`` to every function and 3.13 hides empty
    fields, so empty and ``None`` fields are left out here and only node names and values remain.
    """
    if isinstance(node, ast.AST):
        fields = []
        for name, value in ast.iter_fields(node):
            if value is None or value == []:
                continue
            fields.append(f"{name}={_tree_text(value)}")
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return "[" + ",".join(_tree_text(item) for item in node) + "]"
    return repr(node)


class Template:
    """Base class of every kernel template; see the module docstring for the protocol."""

    name: ClassVar[str]
    #: the problem's integer dims in the order a shape string "AxBxC" gives them
    dims: ClassVar[tuple[str, ...]]
    #: named problem sets for sweeps: preset name -> list of problems (dicts)
    presets: ClassVar[dict[str, list[Problem]]] = {}
    #: categorical problem fields besides the dims: name -> allowed values, the first the default
    #: (e.g. {"causal": (False, True)}); they reach the shape key and space constraints
    options: ClassVar[dict[str, tuple[Any, ...]]] = {}
    #: element types the kernel supports
    dtypes: ClassVar[tuple[str, ...]] = DTYPES

    #: what ``peer`` runs, for the report (e.g. "cuBLAS (torch.matmul)"); empty: no peer
    peer_name: ClassVar[str] = ""

    #: what decides the kernel's speed: its @triton.jit functions and launch code; empty means
    #: the template's whole module. Heuristics, presets and docs may change without re-tuning.
    #: Names (strings) instead of objects: functions of ``kernel_module``, hashed from its file.
    kernel_sources: ClassVar[tuple[Any, ...]] = ()
    #: the module of :mod:`tunesvc.kernels` whose functions ``kernel_sources`` names as strings:
    #: the version is read from its source without importing it, for it imports torch and Triton
    #: (seconds), which `tune kernels`, `tune space` and `tune lookup` do without
    kernel_module: ClassVar[str] = ""

    # -- identity -----------------------------------------------------------------------
    @cached_property
    def version(self) -> str:
        """Hash of the kernel's source: an edited kernel never reuses the old one's configs."""
        if self.kernel_module:
            return named_sources_version(self.kernel_module, self.kernel_sources)
        objects = self.kernel_sources or (inspect.getmodule(type(self)),)
        # a JITFunction keeps the Python function it wraps in .fn; its source is the file's text
        return source_version(*(inspect.getsource(getattr(obj, "fn", obj)) for obj in objects))

    @property
    def space_path(self) -> Path:
        module_file = Path(inspect.getfile(type(self)))
        return module_file.parent.parent / "search_spaces" / f"{self.name}.toml"

    @cached_property
    def space(self) -> Space:
        return Space.from_toml(self.space_path, problem_vars=tuple(self.problem_vars_names()))

    # -- problems -----------------------------------------------------------------------
    def problem(self, **kwargs: Any) -> Problem:
        """Normalise and validate a problem; one clear error when it is impossible."""
        unknown = set(kwargs) - set(self.dims) - set(self.options) - {"dtype"}
        if unknown:
            takes = ", ".join([*self.dims, *self.options, "dtype"])
            raise TunesvcError(f"{self.name} takes {takes}, not {', '.join(sorted(unknown))}.")
        problem: Problem = {}
        for dim in self.dims:
            value = kwargs.get(dim)
            if value is None:
                raise TunesvcError(f"{self.name} needs {dim}; give every one of {', '.join(self.dims)}.")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TunesvcError(f"{self.name}: {dim}={value!r} is impossible; dims are positive integers.")
            problem[dim] = value
        for name, allowed in self.options.items():
            problem[name] = _option_value(self.name, name, kwargs.get(name, allowed[0]), allowed)
        dtype = str(kwargs.get("dtype", "float16")).removeprefix("torch.")
        if dtype not in self.dtypes:
            raise TunesvcError(f"{self.name}: dtype {dtype!r} is not supported; use one of {', '.join(self.dtypes)}.")
        problem["dtype"] = dtype
        self.check(problem)
        return problem

    def check(self, problem: Problem) -> None:
        """Raise TunesvcError (one sentence) when dims and options contradict each other."""

    def parse_shape(self, text: str, dtype: str = "float16") -> Problem:
        """'4096x4096x4096' (dims in order) or 'M=4096,N=4096,K=4096' -> a problem."""
        text = text.strip()
        if "=" in text:
            pairs = [p.split("=", 1) for p in text.split(",")]
            if any(len(pair) != 2 or not pair[0].strip() for pair in pairs):
                raise TunesvcError(
                    f"Shape '{text}' is malformed; write e.g. {','.join(f'{d}=128' for d in self.dims)}."
                )
            values: dict[str, Any] = {k.strip(): v.strip() for k, v in pairs}
        else:
            parts = re.split(r"[x×*]", text)
            if len(parts) != len(self.dims):
                raise TunesvcError(
                    f"Shape '{text}' has {len(parts)} dims but {self.name} takes "
                    f"{len(self.dims)} ({'x'.join(self.dims)}); write e.g. {'x'.join(['128'] * len(self.dims))}."
                )
            values = dict(zip(self.dims, parts))
        values.setdefault("dtype", dtype)
        for dim in self.dims:
            if dim in values:
                try:
                    values[dim] = int(values[dim])
                except ValueError:
                    raise TunesvcError(f"Shape '{text}': {dim}={values[dim]} is not an integer.") from None
        return self.problem(**values)

    def problem_of_key(self, key: str) -> Problem:
        """A problem with this shape key: the key's dims (bucket representatives) and fields."""
        parsed = ShapeKey.parse(key)
        return self.problem(**dict(parsed.dims), **dict(parsed.fields))

    def problem_vars_names(self) -> list[str]:
        return [*self.dims, *self.options, "elem_bytes"]

    def problem_vars(self, problem: Problem) -> dict[str, Any]:
        """The names a space constraint may use about the problem (options as ints where bool)."""
        return {
            **{d: problem[d] for d in self.dims},
            **{o: int(v) if isinstance(v, bool) else v for o, v in ((o, problem[o]) for o in self.options)},
            "elem_bytes": element_bytes(problem["dtype"]),
        }

    # -- the protocol each template implements ------------------------------------------
    def key(self, problem: Problem) -> ShapeKey:
        raise NotImplementedError

    def make_inputs(self, problem: Problem, device: Device) -> Any:
        raise NotImplementedError

    def launch(self, inputs: Any, config: Config) -> Any:
        raise NotImplementedError

    def reference(self, inputs: Any) -> Any:
        raise NotImplementedError

    def heuristic(self, problem: Problem, device: Device) -> Config:
        raise NotImplementedError

    def cost(self, problem: Problem) -> Cost:
        raise NotImplementedError

    def peer(self, inputs: Any) -> Callable[[], Any] | None:
        """A zero-argument callable running the torch equivalent on ``inputs``, timed like a
        candidate; None (the default) when there is none. Set-up that a torch user would do once
        (a dense copy of a paged cache, an autograd graph) belongs here, outside the callable.
        Not part of ``kernel_sources``: a new peer never invalidates tuned configs."""
        return None

    def selector_features(self, problem: Problem, device: Device) -> dict[str, float]:
        """Numbers a selector (:mod:`tunesvc.serving.selector`) may split on to pick a config for ``problem``.

        The default: log2 of each dim; log2 of the FLOPs, the fewest bytes and their ratio (the
        arithmetic intensity) where ``cost`` is defined; 1.0 for each categorical field of the
        shape key (``dtype=float16``), so one tree serves every dtype. A template whose speed
        turns on its launch grid adds e.g. tiles per SM (see the matmul template).
        """
        features = {f"log2_{dim}": math.log2(problem[dim]) for dim in self.dims}
        try:
            cost = self.cost(problem)
        except NotImplementedError:
            cost = None
        if cost is not None and cost.flops > 0 and cost.bytes > 0:
            features.update(
                log2_flops=math.log2(cost.flops),
                log2_bytes=math.log2(cost.bytes),
                log2_intensity=math.log2(cost.flops / cost.bytes),
            )
        for name, value in self.key(problem).fields:
            features[f"{name}={value}"] = 1.0
        return features

    def key_distance(self, a: ShapeKey, b: ShapeKey) -> float:
        """How far apart two shape keys of this template are, for the runtime's nearest rule, a
        neighbours selector and a sweep's warm start; infinite where they are not comparable.
        The default: :meth:`ShapeKey.distance` (log2 over the key's dims). A template whose speed
        turns on a product of dims says so here (see the decode template)."""
        return a.distance(b)

    def wave_fill(self, config: Config, problem: Problem, device: Device) -> float:
        """The fraction of the launch's waves of programs that has work: 1.0 where its programs
        fill every SM in each wave, 0.55 where a last wave holds 10% of a full one after one
        full wave. A neighbours selector (:mod:`tunesvc.serving.selector`) corrects a config's time at a
        tuned shape by it when it judges the config at another shape. The default says nothing
        (1.0 everywhere); a template whose grid is its tiles says more (see the matmul template)."""
        return 1.0

    def tolerance(self, problem: Problem) -> float:
        """Largest accepted ||out - ref|| / ||ref|| for this problem's dtype."""
        return settings.REFERENCE_TOLERANCE[problem["dtype"]]

    #: how a key the runtime has no winner for gets one, as its warning says
    tune_hint: str = "tune it with `tune sweep`, or run in mode 'tune'"

    #: configs known to do well elsewhere (e.g. a tutorial's autotune list), tried first
    known_good: ClassVar[tuple[Config, ...]] = ()

    def warm_start(self, problem: Problem, device: Device) -> list[Config]:
        """Configs a search should measure first: the heuristic, then the known-good ones."""
        return [self.heuristic(problem, device), *self.known_good]

    def feasible(self, problem: Problem, device: Device) -> list[Config]:
        return self.space.feasible(self.problem_vars(problem), device.limits())

    def violations(self, config: Config, problem: Problem, device: Device) -> list[str]:
        return self.space.violations(config, self.problem_vars(problem), device.limits())

    def nearest_feasible(self, config: Config, problem: Problem, device: Device) -> Config | None:
        """The feasible config for ``problem`` on ``device`` nearest ``config`` (the space's
        :meth:`~tunesvc.space.Space.distance`: a tile halved is one step, another variant one
        step), or None where none is near: what a selector launches when its pick does not fit."""
        return self.space.nearest(config, self.problem_vars(problem), device.limits())


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    # a thread reading a template's version or space at a fork would leave it unreadable in the child
    os.register_at_fork(after_in_child=functools.partial(remake_cached_property_locks, Template))


#: shipped template name -> module of tunesvc.templates that defines it (as a module attribute
#: named by the value after the colon); its Triton code is in the tunesvc.kernels module of that name
SHIPPED = {
    "matmul": "matmul:TEMPLATE",
    "attention": "attention:TEMPLATE",
    "attention_bwd": "attention:BWD_TEMPLATE",
    "softmax": "softmax:TEMPLATE",
    "softmax_bwd": "softmax:BWD_TEMPLATE",
    "bias_act_residual": "pointwise:TEMPLATE",
    "bias_act_residual_bwd": "pointwise:BWD_TEMPLATE",
    "dropout": "dropout:TEMPLATE",
    "decode": "decode:TEMPLATE",
    "layernorm": "layernorm:TEMPLATE",
    "layernorm_bwd": "layernorm:BWD_TEMPLATE",
    "rmsnorm": "rmsnorm:TEMPLATE",
    "rmsnorm_bwd": "rmsnorm:BWD_TEMPLATE",
}

#: the names of the library's functions (``tunesvc.kernels.layer_norm``) for the shipped templates
#: named otherwise, accepted wherever a kernel is named; stored data keeps the template's name
ALIASES = {
    "layer_norm": "layernorm",
    "layer_norm_bwd": "layernorm_bwd",
    "rms_norm": "rmsnorm",
    "rms_norm_bwd": "rmsnorm_bwd",
    "decode_attention": "decode",
}


def canonical_name(name: str) -> str:
    """The template name a kernel is stored under: ``layer_norm`` -> ``layernorm``; others as given."""
    return ALIASES.get(name, name)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """ " (did you mean 'layernorm'?)" for the closest of ``known`` names, or "" when none is close."""
    import difflib  # here: only a miss needs it

    close = difflib.get_close_matches(name, list(dict.fromkeys(known)), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def import_user_module(module_name: str) -> ModuleType:
    """A module a user named on the command line (``mykern`` of ``mykern:scaled_add``), found as
    ``python -m`` finds it: on ``sys.path``, else in the current folder. The ``tune`` script's
    ``sys.path`` starts at the script's own folder, not the working one; the folder is appended,
    never put first, so that a file there never shadows an installed package.

    TunesvcError, in one sentence with the fix, when the module is in neither place.
    """
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.partition(".")[0]
        here = os.getcwd()
        if exc.name != top:  # the module was found, and something it imports is missing
            raise
        if here not in sys.path and "" not in sys.path:
            sys.path.append(here)
            importlib.invalidate_caches()
            try:
                return importlib.import_module(module_name)
            except ModuleNotFoundError as again:
                if again.name != top:
                    raise
                sys.path.remove(here)
        raise TunesvcError(
            f"No module named '{top}' on the Python path or in the current folder {here}; run the command "
            f"from the folder that holds {top}.py (or {top}/), or add that folder to PYTHONPATH."
        ) from None


def get_template(name: str) -> Template:
    """A template by shipped name, entry point name, or ``package.module:attribute``.

    Only for names a user gives (command line, code): a name read from a database, bundle or
    job row goes through :func:`template_named_by_data`, which never imports a module it names.
    """
    if ":" in name:
        module_name, _, attr = name.partition(":")
        if not module_name or not attr:
            raise TunesvcError(f"'{name}' is not a template path; write it as package.module:attribute.")
        try:
            obj = getattr(import_user_module(module_name), attr)
        except TunesvcError as exc:  # no such module: its sentence says where it was looked for
            raise TunesvcError(f"Cannot load template '{name}': {str(exc)[:1].lower()}{str(exc)[1:]}") from None
        except (ImportError, AttributeError, ValueError, TypeError) as exc:
            raise TunesvcError(f"Cannot load template '{name}' ({exc}); check the module path.") from None
        return _instantiate(obj, name)
    name = canonical_name(name)
    if name in SHIPPED:
        module_name, _, attr = SHIPPED[name].partition(":")
        # through the loader the package root sets: this module never imports a template, which subclasses its Template
        from tunesvc.shipped import template_module

        return _instantiate(getattr(template_module(module_name), attr), name)
    from importlib.metadata import entry_points  # here, not at the top: every `tune` start would pay for it

    points = list(entry_points(group="tunesvc.templates"))
    for ep in points:
        if ep.name == name:
            return _instantiate(ep.load(), name)
    hint = did_you_mean(name, [*SHIPPED, *ALIASES, *(ep.name for ep in points)])
    raise TunesvcError(
        f"Unknown kernel '{name}'{hint}; run `tune kernels` to list them, or pass a template as module:attribute."
    )


def shipped_version(name: str) -> str | None:
    """A shipped template's version (None for another name). Its template module imports neither
    torch nor Triton, and the version is read from its kernel module's source (:func:`named_sources_version`)."""
    return get_template(name).version if canonical_name(name) in SHIPPED else None


def named_sources_version(module: str, names: Iterable[str]) -> str:
    """The version of the functions ``names`` of ``tunesvc.kernels.<module>``, read from the source
    files without importing them: the text ``inspect.getsource`` gives for each (its decorators
    included), following ``from tunesvc.kernels.X import name`` and ``from tunesvc.templates.X
    import name`` to the module that defines it, hashed as :attr:`Template.version` hashes it."""
    segments = []
    for name in names:
        segment = _def_source(_kernels_folder() / f"{module}.py", name)
        if segment is None:
            raise TunesvcError(f"kernel_sources names {name!r}, which tunesvc.kernels.{module} does not define.")
        segments.append(segment)
    return source_version(*segments)


@functools.cache
def _kernels_folder() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("tunesvc.kernels")  # finds the package without running it (torch)
    if spec is None or not spec.submodule_search_locations:
        raise TunesvcError("tunesvc.kernels is not installed; reinstall tunesvc.")
    return Path(next(iter(spec.submodule_search_locations)))


def _def_source(path: Path, name: str) -> str | None:
    """The source ``inspect.getsource`` gives for the function ``name`` of a module file (its
    decorators included), following ``from tunesvc.kernels.<module> import name`` (and
    ``tunesvc.templates``) to the file that defines it."""
    text, tree = _parsed(path)
    for node in reversed(tree.body):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            return "".join(text.splitlines(keepends=True)[first - 1 : node.end_lineno])
        if (
            isinstance(node, ast.ImportFrom)
            and node.module is not None
            and node.module.startswith(("tunesvc.kernels.", "tunesvc.templates."))
            and any(alias.name == name and alias.asname in (None, name) for alias in node.names)
        ):
            package, _, module = node.module.rpartition(".")
            folder = _kernels_folder() if package == "tunesvc.kernels" else Path(__file__).parent / "templates"
            return _def_source(folder / f"{module}.py", name)
    return None


@functools.lru_cache(maxsize=32)
def _parsed(path: Path) -> tuple[str, ast.Module]:
    text = path.read_text(encoding="utf-8")
    return text, ast.parse(text)


def template_named_by_data(name: str, allowed: tuple[str | None, ...] = ()) -> Template:
    """The template of a kernel name read from stored data: a shipped one or a registered entry
    point, or one of ``allowed`` (names the user gave on the command line). Data never chooses
    a module to import: a shared database could name any module on the reader's path.
    """
    from importlib.metadata import entry_points  # here, not at the top: every `tune` start would pay for it

    if name in allowed or name in SHIPPED or any(ep.name == name for ep in entry_points(group="tunesvc.templates")):
        return get_template(name)
    raise TunesvcError(
        f"Kernel '{name}' in the stored data is neither shipped nor a registered tunesvc.templates entry "
        "point, so it is not imported; name it on the command line (--kernel module:attribute) to use it."
    )


def list_templates() -> list[Template]:
    from importlib.metadata import entry_points  # here, not at the top: every `tune` start would pay for it

    names = list(SHIPPED) + [ep.name for ep in entry_points(group="tunesvc.templates") if ep.name not in SHIPPED]
    return [get_template(n) for n in names]


def _instantiate(obj: Any, name: str) -> Template:
    if isinstance(obj, type) and issubclass(obj, Template):
        obj = obj()
    if not isinstance(obj, Template):
        raise TunesvcError(f"'{name}' is not a tunesvc Template; subclass tunesvc.Template.")
    return obj


def _option_value(kernel: str, name: str, value: Any, allowed: tuple[Any, ...]) -> Any:
    """A problem option as one of its allowed values; text from the CLI ('1', 'true') is parsed."""
    if isinstance(allowed[0], bool) and isinstance(value, str):
        value = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}.get(
            value.lower(), value
        )
    elif isinstance(value, str) and not isinstance(allowed[0], str):
        with contextlib.suppress(ValueError):
            value = type(allowed[0])(value)
    for candidate in allowed:
        if value == candidate and type(value) is type(candidate):
            return candidate
    raise TunesvcError(f"{kernel}: {name}={value!r} is not allowed; use one of {', '.join(map(str, allowed))}.")
