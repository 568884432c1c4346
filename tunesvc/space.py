"""Config spaces: declared in TOML, enumerated for a grid, sampled through Optuna, hashed.

A space file looks like::

    [params]                    # kernel meta-parameters (tl.constexpr)
    BLOCK_M = [32, 64, 128]     # an explicit list of choices
    BLOCK_K = { pow2 = [16, 128] }   # every power of two in [16, 128]
    VARIANT = ["grouped", "splitk"]  # strings name code paths; constraints compare them

    [launch]                    # launch options: num_warps, num_stages, ...
    num_warps = [4, 8]

    [constraints]               # name = boolean expression over params, launch options,
    smem = "(BLOCK_M + BLOCK_N) * BLOCK_K * elem_bytes * num_stages <= max_shared_memory"

Constraint expressions see the config's names, the template's problem variables (e.g. M, N,
K, elem_bytes) and the device's limits (max_shared_memory, sm_count, max_num_regs, has_tma,
has_ws). They are parsed with :mod:`ast` and evaluated by a small whitelist interpreter, never
``eval`` of the file's text: a space file may come from anyone on the team. Once checked, an
expression is compiled into a Python function (it holds only whitelisted nodes, so it can do
nothing the interpreter cannot), which is what configs are checked with. Strings may appear only compared with
a name (``VARIANT == 'tma'``), and only as one of that parameter's choices.

A config that lacks a parameter is checked as if it held the parameter's first choice, so
configs stored before a parameter was added keep their meaning (e.g. matmul winners from
before VARIANT existed are the "grouped" kernel).
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import heapq
import itertools
import json
import math
import operator
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import cast

from tunesvc.errors import TunesvcError
from tunesvc.files import read_regular

if TYPE_CHECKING:
    import optuna

Config = dict[str, int | str]

LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
DEVICE_VARS = ("max_shared_memory", "sm_count", "max_num_regs", "has_tma", "has_ws")


def config_hash(config: Config) -> str:
    """Canonical hash of a config: the same names and values give the same hash in any order."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _ordered(choices: tuple[int, ...] | tuple[str, ...]) -> bool:
    """Whether a parameter's choices are sizes (positive ints), compared by ratio."""
    return all(type(c) is int and c > 0 for c in choices)


def _gap(choices: tuple[int, ...] | tuple[str, ...], a: int | str, b: int | str) -> float:
    """How far apart two choices of one parameter are: the doublings between two sizes
    (|log2 a - log2 b|) where its choices are sizes, else 1 where they differ."""
    if a == b:
        return 0.0
    return abs(math.log2(cast(int, a) / cast(int, b))) if _ordered(choices) else 1.0


def _steps(choices: tuple[int, ...] | tuple[str, ...]) -> list[list[tuple[int, float]]]:
    """Per choice index, the (choice index, _gap) one step away: the next smaller and larger
    size where the choices are sizes, every other choice otherwise."""
    if _ordered(choices):
        by_size = sorted(range(len(choices)), key=lambda i: choices[i])
        out: list[list[tuple[int, float]]] = [[] for _ in choices]
        for lo, hi in itertools.pairwise(by_size):
            cost = _gap(choices, choices[lo], choices[hi])
            out[lo].append((hi, cost))
            out[hi].append((lo, cost))
        return out
    return [[(j, 1.0) for j in range(len(choices)) if j != i] for i in range(len(choices))]


def _next_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


#: bounds on a constraint expression, checked at load: a space file may come from anyone, and
#: each bound stops an expression from hanging or crashing the loader (``9**9**9``, a sum of
#: thousands of terms, parentheses nested thousands deep)
MAX_EXPRESSION_CHARS = 1000
MAX_EXPRESSION_OPERATORS = 100
MAX_EXPRESSION_DEPTH = 32
MAX_CONSTANT = 2**64
MAX_EXPONENT = 64
#: bounds on a space file: its size, its parameters' choices and values, and its configs
MAX_FILE_BYTES = 1 << 20
MAX_CHOICES = 256
MAX_CHOICE_VALUE = 2**31 - 1
MAX_TEXT_CHOICE = 64
MAX_SPACE_SIZE = 1_000_000


def _pow(base: Any, exponent: Any) -> Any:
    """``base ** exponent`` with the exponent bounded: a problem size as exponent must not hang a sweep."""
    if not -MAX_EXPONENT <= exponent <= MAX_EXPONENT:
        raise OverflowError(f"exponent {exponent} is beyond +-{MAX_EXPONENT}")
    return base**exponent


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _pow,
}
_CMPOPS = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_FUNCS: dict[str, Callable[..., Any]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "next_pow2": _next_pow2,
    "cdiv": lambda a, b: -(-a // b),
}
#: (fewest, most) arguments of each function; None: no upper bound
_ARITY = {"min": (2, None), "max": (2, None), "abs": (1, 1), "next_pow2": (1, 1), "cdiv": (2, 2)}


def _check_size(source: str) -> None:
    if len(source) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"is {len(source)} characters long; keep an expression under {MAX_EXPRESSION_CHARS}")
    operators = sum(source.count(c) for c in "+-*/%<>=,") + len(re.findall(r"\b(?:and|or|not|if)\b", source))
    if operators > MAX_EXPRESSION_OPERATORS:
        raise ValueError(
            f"has about {operators} operators; keep it under {MAX_EXPRESSION_OPERATORS} or split it into several constraints"
        )
    depth = deepest = 0
    for c in source:
        depth += (c in "([{") - (c in ")]}")
        deepest = max(deepest, depth)
    if deepest > MAX_EXPRESSION_DEPTH:
        raise ValueError(f"nests parentheses {deepest} deep; keep it under {MAX_EXPRESSION_DEPTH}")


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and not isinstance(node.value, str) and node.value == 0


def _small_exponent(node: ast.AST) -> bool:
    """A name (bounded when evaluated, see _pow) or a literal whole number from 0 to MAX_EXPONENT."""
    if isinstance(node, ast.Name):
        return True
    return isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= MAX_EXPONENT


def _is_text(node: ast.AST, text_names: set[str]) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)) or (
        isinstance(node, ast.Name) and node.id in text_names
    )


class Expression:
    """A constraint expression, checked at load time against a whitelist of AST nodes.

    Written by hand because the grammar is a dozen AST node types; a dependency would be
    larger than this class. :meth:`interpret` is the reference semantics; calling the
    expression runs the same tree compiled once, about ten times faster per config.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        _check_size(source)  # before ast.parse, whose own recursion a long or deep text can exhaust
        try:
            self._tree = ast.parse(source, mode="eval").body
        except (SyntaxError, ValueError) as exc:  # ValueError: a NUL character
            raise ValueError(f"is not a valid expression ({getattr(exc, 'msg', exc)})") from None
        self.names: set[str] = set()
        #: (name, text) for each comparison of a name with a string literal, e.g. VARIANT == 'tma'
        self.string_comparisons: set[tuple[str, str]] = set()
        self._check(self._tree)
        self._arg_names = tuple(sorted(self.names))
        self._function = _compile(self._tree, self._arg_names, source)

    def _check(self, node: ast.AST, depth: int = 0) -> None:
        if depth > MAX_EXPRESSION_DEPTH:
            raise ValueError(f"nests deeper than {MAX_EXPRESSION_DEPTH} levels; split it into several constraints")
        depth += 1
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float, bool)):
                raise ValueError(
                    f"uses the literal {node.value!r}; only numbers are allowed, and strings compared with a name"
                )
            if not (abs(node.value) <= MAX_CONSTANT):  # also refuses nan
                raise ValueError(f"uses the number {node.value!r}; numbers must lie within +-2**64")
        elif isinstance(node, ast.Name):
            self.names.add(node.id)
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            if isinstance(node.op, ast.Pow) and not _small_exponent(node.right):
                raise ValueError(
                    f"raises to '{ast.unparse(node.right)}'; an exponent must be a name or a whole number "
                    f"from 0 to {MAX_EXPONENT}"
                )
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and _is_zero(node.right):
                raise ValueError(f"divides by zero in '{ast.unparse(node)}'")
            self._check(node.left, depth)
            self._check(node.right, depth)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
            self._check(node.operand, depth)
        elif isinstance(node, ast.Compare) and all(type(op) in _CMPOPS for op in node.ops):
            operands = [node.left, *node.comparators]
            for i, operand in enumerate(operands):
                if not (isinstance(operand, ast.Constant) and isinstance(operand.value, str)):
                    self._check(operand, depth)
                    continue
                names = [o.id for o in operands[max(i - 1, 0) : i + 2] if isinstance(o, ast.Name)]
                if not names:
                    raise ValueError(f"uses the literal {operand.value!r}; compare strings with a name only")
                self.string_comparisons.update((name, operand.value) for name in names)
        elif isinstance(node, ast.BoolOp):
            for value in node.values:
                self._check(value, depth)
        elif isinstance(node, ast.IfExp):
            for part in (node.test, node.body, node.orelse):
                self._check(part, depth)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCS
            and not node.keywords
            and not any(isinstance(arg, ast.Starred) for arg in node.args)
        ):
            fewest, most = _ARITY[node.func.id]
            if len(node.args) < fewest or (most is not None and len(node.args) > most):
                wanted = f"{fewest}" if fewest == most else f"at least {fewest}"
                raise ValueError(
                    f"calls {node.func.id} with {len(node.args)} argument(s) in '{ast.unparse(node)}'; "
                    f"it takes {wanted}"
                )
            if node.func.id == "cdiv" and _is_zero(node.args[1]):
                raise ValueError(f"divides by zero in '{ast.unparse(node)}'")
            for arg in node.args:
                self._check(arg, depth)
        else:
            allowed = ", ".join(sorted(_FUNCS))
            raise ValueError(
                f"uses '{ast.unparse(node)}', which is not allowed "
                f"(arithmetic, comparisons, and/or/not, and {allowed} only)"
            )

    def check_types(self, text_names: set[str]) -> None:
        """Refuse a use of a text parameter (e.g. VARIANT) other than comparing it with text:
        ``VARIANT + 1`` or ``VARIANT < 4`` would fail at every config, not at load."""
        for node in ast.walk(self._tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                for left, op, right in zip(operands, node.ops, operands[1:]):
                    kinds = {_is_text(left, text_names), _is_text(right, text_names)}
                    if len(kinds) == 2 and not isinstance(op, (ast.Eq, ast.NotEq)):
                        raise ValueError(f"compares text with a number in '{ast.unparse(node)}'")
                continue
            children = list(ast.iter_child_nodes(node))
            for child in children:
                if isinstance(child, ast.Name) and child.id in text_names and not isinstance(node, ast.Compare):
                    raise ValueError(
                        f"uses the text parameter {child.id} in '{ast.unparse(node)}'; compare it with one of its "
                        f"choices instead, e.g. {child.id} == '...'"
                    )

    def __reduce__(self) -> tuple[type[Expression], tuple[str]]:
        # a compiled lambda does not pickle (templates go to compile workers): rebuild from the text
        return Expression, (self.source,)

    def __call__(self, env: dict[str, Any]) -> Any:
        try:
            args = [env[name] for name in self._arg_names]
        except KeyError:
            # the interpreter looks names up lazily: it fails, or not, where the reference does
            return self.interpret(env)
        return self._function(*args)

    def interpret(self, env: dict[str, Any]) -> Any:
        """The value by walking the tree: the reference that the compiled form must match."""
        return self._eval(self._tree, env)

    def _eval(self, node: ast.AST, env: dict[str, Any]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return env[node.id]
        if isinstance(node, ast.BinOp):
            return _BINOPS[type(node.op)](self._eval(node.left, env), self._eval(node.right, env))
        if isinstance(node, ast.UnaryOp):
            value = self._eval(node.operand, env)
            return -value if isinstance(node.op, ast.USub) else not value
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, env)
            for op, comparator in zip(node.ops, node.comparators):
                right = self._eval(comparator, env)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.BoolOp):
            values = (self._eval(v, env) for v in node.values)
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.IfExp):
            branch = node.body if self._eval(node.test, env) else node.orelse
            return self._eval(branch, env)
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        return _FUNCS[node.func.id](*(self._eval(arg, env) for arg in node.args))


class _Lower(ast.NodeTransformer):
    """A checked tree as the body of ``lambda v0, v1, ...``: variables become positional
    arguments (so no config name can shadow min, cdiv, ...), and/or give a bool as in
    :meth:`Expression.interpret` (``all``/``any``), not the deciding operand."""

    def __init__(self, arg_names: tuple[str, ...]) -> None:
        self.index = {name: i for i, name in enumerate(arg_names)}

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(id=f"v{self.index[node.id]}", ctx=ast.Load()), node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        node.args = [self.visit(arg) for arg in node.args]  # node.func names a whitelisted function
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.generic_visit(node)
        return ast.copy_location(ast.UnaryOp(ast.Not(), ast.UnaryOp(ast.Not(), node)), node)

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if not isinstance(node.op, ast.Pow):
            return node
        return ast.copy_location(ast.Call(ast.Name("_pow", ast.Load()), [node.left, node.right], []), node)


def _compile(tree: ast.AST, arg_names: tuple[str, ...], source: str) -> Any:
    body = _Lower(arg_names).visit(copy.deepcopy(tree))
    params = ast.arguments(
        posonlyargs=[],
        args=[ast.arg(f"v{i}") for i in range(len(arg_names))],
        kwonlyargs=[],
        kw_defaults=[],
        defaults=[],
    )
    lambda_tree = ast.fix_missing_locations(ast.Expression(ast.Lambda(params, body)))
    code = compile(lambda_tree, f"<constraint {source!r}>", "eval")
    # safe: Expression._check admitted only arithmetic, comparisons, and/or/not, if-else and _FUNCS
    return eval(code, {"__builtins__": {}, **_FUNCS, "_pow": _pow})


@dataclass(frozen=True)
class Parameter:
    name: str
    choices: tuple[int, ...] | tuple[str, ...]
    is_launch_option: bool = False


@dataclass
class Space:
    """The configs a template can be launched with, and the rules that prune them."""

    parameters: dict[str, Parameter]
    constraints: dict[str, Expression] = field(default_factory=dict)
    source: str = "<memory>"
    #: (problem env, device env) -> its feasible configs; see feasible()
    _feasible: dict[tuple, list[Config]] = field(default_factory=dict, init=False, repr=False, compare=False)
    #: (config, problem env, device env, bounds) -> nearest(); a selector's fit asks each often
    _nearest: dict[tuple, Config | None] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def names(self) -> list[str]:
        return list(self.parameters)

    @property
    def size(self) -> int:
        return math.prod(len(p.choices) for p in self.parameters.values())

    @classmethod
    def from_toml(cls, path: str | Path, problem_vars: tuple[str, ...] = ()) -> Space:
        """Load and validate a space file; any problem is one line naming the file and key.

        The file is checked against a schema (:func:`_validate_file`) and bounded (its size, its
        choices, its number of configs, each constraint's size and depth) before anything else.
        """
        path = Path(path)
        try:
            if path.is_dir():
                raise TunesvcError(f"{path} is a folder; pass a space file (.toml).")
            raw = read_regular(path, MAX_FILE_BYTES, "a space file (.toml)")  # a FIFO is refused, not waited on
        except FileNotFoundError:
            raise TunesvcError(f"{path}: space file not found; check the path.") from None
        except OSError as exc:
            raise TunesvcError(f"{path}: cannot read the space file ({exc.strerror or exc}); check the path.") from None
        if len(raw) > MAX_FILE_BYTES:
            raise TunesvcError(f"{path}: the space file is over {MAX_FILE_BYTES >> 20} MiB; a space file is a few KiB.")
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise TunesvcError(f"{path}: not UTF-8 text (byte {exc.start}); save the space file as UTF-8.") from None
        except tomllib.TOMLDecodeError as exc:
            raise TunesvcError(f"{path}: not valid TOML ({exc}); fix the syntax.") from None
        except RecursionError:
            raise TunesvcError(f"{path}: not valid TOML (nested too deeply); fix the syntax.") from None
        _validate_file(data, str(path))
        space = cls.from_dict(data, source=str(path), problem_vars=problem_vars)
        if space.size > MAX_SPACE_SIZE:
            raise TunesvcError(
                f"{path}: [params] spans {space.size:,} configs, over the {MAX_SPACE_SIZE:,} a sweep can enumerate; "
                "list fewer choices."
            )
        return space

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<memory>", problem_vars: tuple[str, ...] = ()) -> Space:
        def fail(key: str, problem: str) -> TunesvcError:
            return TunesvcError(f"{source}: [{key}] {problem}.")

        unknown = set(data) - {"params", "launch", "constraints"}
        if unknown:
            raise fail(sorted(unknown)[0], "is not a known section; use [params], [launch] or [constraints]")
        parameters: dict[str, Parameter] = {}
        for section in ("params", "launch"):
            table = data.get(section, {})
            if not isinstance(table, dict):
                raise fail(section, "must be a table of name = choices")
            for name, spec in table.items():
                key = f"{section}.{name}"
                if section == "launch" and name not in LAUNCH_OPTIONS:
                    raise fail(key, f"is not a launch option; use one of {', '.join(LAUNCH_OPTIONS)}")
                if section == "params" and name in LAUNCH_OPTIONS:
                    raise fail(key, "is a launch option; declare it under [launch]")
                if name in parameters:
                    raise fail(key, "is declared twice")
                parameters[name] = Parameter(
                    name, _parse_choices(spec, lambda p, k=key: fail(k, p)), section == "launch"
                )
        if not parameters:
            raise fail("params", "declares no parameters; a space needs at least one")
        known = set(parameters) | set(problem_vars) | set(DEVICE_VARS)
        constraints: dict[str, Expression] = {}
        table = data.get("constraints", {})
        if not isinstance(table, dict):
            raise fail("constraints", 'must be a table of name = "expression"')
        for name, text in table.items():
            key = f"constraints.{name}"
            if not isinstance(text, str):
                raise fail(key, 'must be an expression in a string, e.g. "BLOCK_M <= 128"')
            try:
                expr = Expression(text)
                expr.check_types({n for n, p in parameters.items() if isinstance(p.choices[0], str)})
            except ValueError as exc:
                raise fail(key, str(exc)) from None
            missing = sorted(expr.names - known)
            if missing:
                raise fail(key, f"uses unknown name '{missing[0]}'; known names are {', '.join(sorted(known))}")
            for compared, text in sorted(expr.string_comparisons):
                # a typo ('splitK') or an int parameter compared with text would silently be False
                if compared not in parameters or text not in parameters[compared].choices:
                    raise fail(key, f"compares {compared} with '{text}', which is not one of its choices")
            constraints[name] = expr
        return cls(parameters, constraints, source)

    def violations(self, config: Config, problem_env: dict[str, Any], device_env: dict[str, Any]) -> list[str]:
        """Names of the constraints this config breaks (empty when it is feasible)."""
        env = {**device_env, **problem_env, **self.with_defaults(config)}
        return [name for name, expr in self.constraints.items() if not self._holds(name, expr, env)]

    def _holds(self, name: str, expr: Expression, env: dict[str, Any]) -> bool:
        """The constraint's value, or one line naming it where it cannot be evaluated (``M // 0``)."""
        try:
            return bool(expr(env))
        except (ArithmeticError, TypeError, ValueError, KeyError, RecursionError) as exc:
            shown = {n: env[n] for n in sorted(expr.names) if n in env}
            raise TunesvcError(
                f"{self.source}: [constraints.{name}] cannot be evaluated for {shown} "
                f"({type(exc).__name__}: {exc}); fix the expression."
            ) from None

    def __getstate__(self) -> dict[str, Any]:
        # templates travel to compile and measuring workers with their space: not with this cache
        return {**self.__dict__, "_feasible": {}, "_nearest": {}}

    def with_defaults(self, config: Config) -> Config:
        """The config with every parameter it lacks set to that parameter's first choice."""
        return {**{n: p.choices[0] for n, p in self.parameters.items()}, **config}

    def stored_config(self, config: Any) -> Config | str:
        """A config read from a database or bundle with its missing parameters at their first
        choice, or why it does not belong to this space (no parameter, an unknown one, a value
        outside the choices): a file from anyone must not reach a kernel launch unchecked."""
        if not isinstance(config, dict) or not config:
            return "the config names no parameter"
        for name, value in config.items():
            parameter = self.parameters.get(name)
            if parameter is None:
                return f"unknown parameter {str(name)[:64]!r}"
            if type(value) not in (int, str) or value not in parameter.choices:
                return f"{name}={str(value)[:40]} is not one of its choices"
        return self.with_defaults(config)

    def validate(self, config: Config) -> None:
        """Raise a one-line error if a config names unknown parameters or values outside the space."""
        for name, value in config.items():
            if name not in self.parameters:
                raise TunesvcError(f"Unknown parameter '{name}' in config; this space has {', '.join(self.names)}.")
            if value not in self.parameters[name].choices:
                choices = ", ".join(map(str, self.parameters[name].choices))
                raise TunesvcError(f"{name}={value} is outside the space; choose one of {choices}.")
        missing = [n for n in self.parameters if n not in config]
        if missing:
            raise TunesvcError(f"Config lacks {', '.join(missing)}; give a value for every parameter.")

    def enumerate(self) -> list[Config]:
        """Every config in the space, constraints not applied, in a stable order."""
        names = self.names
        choices: list[tuple[int | str, ...]] = [self.parameters[n].choices for n in names]
        return [dict(zip(names, values)) for values in itertools.product(*choices)]

    def feasible(self, problem_env: dict[str, Any], device_env: dict[str, Any]) -> list[Config]:
        """The configs of :meth:`enumerate` that break no constraint, in the same order.

        Kept per problem and device (handed out as copies): a sweep and its heuristic ask for
        the same list several times. Built one parameter at a time, each constraint checked as
        soon as the parameters it names are set, so a prefix that breaks one is never extended.
        Constraints are pure, so the list is the one :meth:`violations` would keep; only a
        constraint that raises (a bug in the space) may go unnoticed on configs that an earlier
        check pruned.
        """
        key = (tuple(sorted(problem_env.items())), tuple(sorted(device_env.items())))
        configs = self._feasible.get(key)
        if configs is None:
            if len(self._feasible) >= 256:
                self._feasible.clear()  # a bound for long-lived processes that see many shapes
            configs = self._feasible[key] = self._build_feasible(problem_env, device_env)
        return [dict(c) for c in configs]

    def _build_feasible(self, problem_env: dict[str, Any], device_env: dict[str, Any]) -> list[Config]:
        names = self.names
        depth = {name: i + 1 for i, name in enumerate(names)}
        levels: list[list[tuple[str, Expression]]] = [[] for _ in range(len(names) + 1)]  # 0: no parameter
        for cname, expr in self.constraints.items():
            levels[max((depth[n] for n in expr.names if n in depth), default=0)].append((cname, expr))
        base = {**device_env, **problem_env}
        try:
            envs = [base] if all(expr(base) for _, expr in levels[0]) else []
            for name, checks in zip(names, levels[1:]):
                choices = self.parameters[name].choices
                extended = ({**env, name: value} for env in envs for value in choices)
                envs = [env for env in extended if all(expr(env) for _, expr in checks)]
        except (ArithmeticError, TypeError, ValueError, KeyError, RecursionError):
            # rare (a bug in the space): walk again, checking one by one, to name the constraint
            self._name_the_failure(levels, base)
            raise
        return [{name: env[name] for name in names} for env in envs]

    def _name_the_failure(self, levels: list[list[tuple[str, Expression]]], base: dict[str, Any]) -> None:
        envs = [base]
        for name, checks in zip([None, *self.names], levels):
            if name is not None:
                envs = [{**env, name: value} for env in envs for value in self.parameters[name].choices]
            envs = [env for env in envs if all(self._holds(cname, expr, env) for cname, expr in checks)]

    def distance(self, a: Config, b: Config) -> float:
        """How far apart two configs of this space are: the sum over parameters of :func:`_gap`
        (the walk of :meth:`nearest` adds the same gaps one step at a time)."""
        a, b = self.with_defaults(a), self.with_defaults(b)
        return sum(_gap(p.choices, a[name], b[name]) for name, p in self.parameters.items())

    def nearest(
        self,
        config: Config,
        problem_env: dict[str, Any],
        device_env: dict[str, Any],
        *,
        within: float = 4.0,
        limit: int = 256,
    ) -> Config | None:
        """The feasible config nearest ``config`` (:meth:`distance`) that differs from it only
        where a broken constraint asks: None where none is found within ``within`` doublings
        (a 128-row tile may shrink to 16 rows and halve its width, no further) and ``limit``
        configs tried.

        A walk outward from ``config``, nearest first (Dijkstra's), that from each config tried
        steps only along the parameters its broken constraints name: a GEMM tile taller than
        the problem shrinks its rows and keeps its width, depth, variant and pipeline, where the
        nearest config over every parameter may trade any of them. Of equally near ones, the
        first reached in the space's choice order. A walk, not a scan of the space: the runtime
        asks this on a shape's first lookup, where checking a whole GEMM space took 0.15 s.
        """
        key = (config_hash(config), *(tuple(sorted(e.items())) for e in (problem_env, device_env)), within, limit)
        if key in self._nearest:
            found = self._nearest.get(key)
        else:
            found = self._walk(config, problem_env, device_env, within, limit)
            if len(self._nearest) >= 4096:
                self._nearest.clear()  # a bound for long-lived processes that see many shapes
            self._nearest[key] = found
        return None if found is None else dict(found)

    def _walk(
        self, config: Config, problem_env: dict[str, Any], device_env: dict[str, Any], within: float, limit: int
    ) -> Config | None:
        names = self.names
        full = self.with_defaults(config)
        if any(full[n] not in self.parameters[n].choices for n in names):
            return None
        base = {**device_env, **problem_env}
        steps = {n: _steps(self.parameters[n].choices) for n in names}
        axis_of = {n: i for i, n in enumerate(names)}
        start = tuple(self.parameters[n].choices.index(full[n]) for n in names)
        queue: list[tuple[float, tuple[int, ...]]] = [(0.0, start)]
        done: set[tuple[int, ...]] = set()
        while queue and len(done) < limit:
            distance, at = heapq.heappop(queue)
            if distance > within:
                break
            if at in done:
                continue
            done.add(at)
            candidate = {n: self.parameters[n].choices[i] for n, i in zip(names, at)}
            env = {**base, **candidate}
            broken = [expr for name, expr in self.constraints.items() if not self._holds(name, expr, env)]
            if not broken:
                return candidate
            for n in sorted({n for expr in broken for n in expr.names if n in axis_of}, key=axis_of.__getitem__):
                axis = axis_of[n]
                for j, cost in steps[n][at[axis]]:
                    after = (*at[:axis], j, *at[axis + 1 :])
                    if after not in done:
                        heapq.heappush(queue, (distance + cost, after))
        return None

    def suggest(self, trial: optuna.Trial) -> Config:
        """Draw a config through an Optuna trial (one categorical per parameter)."""
        # every choice is an int or a str, so that is what the trial returns
        return {
            name: cast(int | str, trial.suggest_categorical(name, list(p.choices)))
            for name, p in self.parameters.items()
        }

    def distributions(self, candidates: list[Config] | None = None) -> dict[str, Any]:
        """Optuna distributions of the parameters; with ``candidates``, only the values they use."""
        import optuna

        def choices(name: str) -> list[int | str]:
            if candidates is None:
                return list(self.parameters[name].choices)
            return [v for v in self.parameters[name].choices if any(c[name] == v for c in candidates)]

        return {name: optuna.distributions.CategoricalDistribution(choices(name)) for name in self.parameters}


def _parse_choices(spec: Any, fail) -> tuple[int, ...] | tuple[str, ...]:
    if isinstance(spec, list):
        if not spec:
            raise fail("has no choices; list at least one value")
        all_ints = all(isinstance(v, int) and not isinstance(v, bool) for v in spec)
        if not all_ints and not all(isinstance(v, str) and v for v in spec):
            raise fail("must list integers only, or non-empty strings only")
        if len(set(spec)) != len(spec):
            raise fail("lists a value twice")
        return tuple(spec)
    if isinstance(spec, dict) and set(spec) == {"pow2"}:
        bounds = spec["pow2"]
        if (
            not isinstance(bounds, list)
            or len(bounds) != 2
            or not all(isinstance(v, int) and v > 0 and v & (v - 1) == 0 for v in bounds)
            or bounds[0] > bounds[1]
        ):
            raise fail("pow2 must be [low, high], two powers of two with low <= high")
        low, high = bounds
        return tuple(1 << e for e in range(low.bit_length() - 1, high.bit_length()))
    raise fail("must be a list of integers, a list of strings, or { pow2 = [low, high] }")


def _validate_file(data: dict[str, Any], source: str) -> None:
    """Check a parsed space file against its schema; the first problem is one line naming its
    ``[section.key]``. pydantic checks the shape (sections, tables, strings, choices' types and
    bounds); :meth:`Space.from_dict` then checks the meaning (launch options, constraint names)."""
    from pydantic import ValidationError

    try:
        _space_schema().validate_python(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = [str(part) for part in error["loc"] if part != "[key]"][:2]
        where = ".".join(loc) or "file"
        message = _SCHEMA_MESSAGES.get((error["type"], len(loc)), error["msg"].removeprefix("Value error, "))
        raise TunesvcError(f"{source}: [{where}] {message}.") from None
    except RecursionError:
        raise TunesvcError(f"{source}: nests tables too deeply; a space file has three flat tables.") from None


_SCHEMA_MESSAGES = {
    ("extra_forbidden", 1): "is not a known section; use [params], [launch] or [constraints]",
    ("dict_type", 1): 'must be a table of name = choices (or name = "expression" under [constraints])',
    ("string_type", 2): 'must be an expression in a string, e.g. "BLOCK_M <= 128"',
    ("string_pattern_mismatch", 2): "is not a valid name; use letters, digits and _, not starting with a digit",
    ("string_too_long", 2): f"is over {MAX_EXPRESSION_CHARS} characters; split it into several constraints",
}


def _check_choices(spec: Any) -> Any:
    """The schema's check of one parameter's choices: their types and bounds (not yet expanded)."""

    def fail(problem: str) -> ValueError:
        return ValueError(problem)

    choices = _parse_choices(spec, fail)
    if len(choices) > MAX_CHOICES:
        raise ValueError(f"has {len(choices)} choices; list at most {MAX_CHOICES}")
    for value in choices:
        if isinstance(value, str) and len(value) > MAX_TEXT_CHOICE:
            raise ValueError(f"has a choice over {MAX_TEXT_CHOICE} characters")
        if isinstance(value, int) and not -MAX_CHOICE_VALUE <= value <= MAX_CHOICE_VALUE:
            raise ValueError(f"has the choice {value}, beyond +-(2**31 - 1) that a kernel launch takes")
    return spec


@functools.cache
def _space_schema() -> Any:
    """The pydantic schema of a space file (built on first use: the runtime rarely loads one)."""
    from typing import Annotated

    from pydantic import BaseModel
    from pydantic import BeforeValidator
    from pydantic import ConfigDict
    from pydantic import StringConstraints
    from pydantic import TypeAdapter

    Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=64)]
    Choices = Annotated[Any, BeforeValidator(_check_choices)]
    Text = Annotated[str, StringConstraints(max_length=MAX_EXPRESSION_CHARS)]

    class SpaceFile(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        params: dict[Name, Choices] = {}
        launch: dict[Name, Choices] = {}
        constraints: dict[Name, Text] = {}

    return TypeAdapter(SpaceFile)
