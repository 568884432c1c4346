"""Templates: problem validation, shape parsing, keys, cost, version, loading, heuristics."""

from __future__ import annotations

import json
import math
import re
import sys
import textwrap

import pytest
import torch

import tunesvc
from tunesvc import ShapeKey
from tunesvc import Template
from tunesvc import TunesvcError
from tunesvc.template import pow2_bucket


# -- problem() ---------------------------------------------------------------------------------
def test_problem_normalises(template):
    assert template.problem(M=37, N=45, K=29) == {"M": 37, "N": 45, "K": 29, "dtype": "float16"}
    assert template.problem(M=1, N=2, K=3, dtype="bfloat16")["dtype"] == "bfloat16"
    assert template.problem(M=1, N=2, K=3, dtype=torch.float32)["dtype"] == "float32"
    assert template.problem(M=1, N=2, K=3, dtype="torch.float16")["dtype"] == "float16"


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"N": 4, "K": 4}, "needs M"),
        ({"M": 4, "N": 4}, "needs K"),
        ({"M": 0, "N": 4, "K": 4}, "M=0 is impossible"),
        ({"M": 4, "N": -3, "K": 4}, "N=-3 is impossible"),
        ({"M": 4, "N": 4, "K": 2.5}, "K=2.5 is impossible"),
        ({"M": "4", "N": 4, "K": 4}, "M='4' is impossible"),
        ({"M": True, "N": 4, "K": 4}, "M=True is impossible"),
        ({"M": 4, "N": 4, "K": 4, "L": 4}, "not L"),
        ({"M": 4, "N": 4, "K": 4, "dtype": "int8"}, "dtype 'int8' is not supported"),
        ({"M": 4, "N": 4, "K": 4, "dtype": torch.float64}, "dtype 'float64' is not supported"),
    ],
)
def test_problem_rejects(template, kwargs, pattern):
    with pytest.raises(TunesvcError, match=re.escape(pattern)):
        template.problem(**kwargs)


# -- parse_shape() -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text", ["37x45x29", " 37x45x29 ", "37×45×29", "37*45*29", "M=37,N=45,K=29", "K=29, N=45, M=37"]
)
def test_parse_shape(template, text):
    assert template.parse_shape(text) == {"M": 37, "N": 45, "K": 29, "dtype": "float16"}


def test_parse_shape_dtype(template):
    assert template.parse_shape("4x5x6", "float32")["dtype"] == "float32"
    assert template.parse_shape("M=4,N=5,K=6,dtype=bfloat16")["dtype"] == "bfloat16"


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("37x45", "has 2 dims but matmul takes 3"),
        ("37x45x29x3", "has 4 dims"),
        ("12x", "has 2 dims"),
        ("37xAx29", "N=A is not an integer"),
        ("37x4.5x29", "N=4.5 is not an integer"),
        ("M=37,N=45", "needs K"),
        ("M=37,N=x,K=3", "N=x is not an integer"),
        ("0x4x4", "M=0 is impossible"),
        ("M=37,N=45,K=29,Q=1", "not Q"),
    ],
)
def test_parse_shape_rejects(template, text, pattern):
    with pytest.raises(TunesvcError, match=re.escape(pattern)):
        template.parse_shape(text)


@pytest.mark.parametrize("text", ["M=37,N45,K=29", "M=37,,K=29"])
def test_parse_shape_rejects_malformed_pairs_with_tunesvc_error(template, text):
    """A pair without '=' (or an empty one) is a one-sentence TunesvcError, not a bare ValueError."""
    with pytest.raises(TunesvcError):
        template.parse_shape(text)


# -- keys ----------------------------------------------------------------------------------------
def test_pow2_bucket():
    assert [pow2_bucket(x) for x in (0, 1, 2, 3, 4, 5, 1000, 1024, 1025)] == [1, 1, 2, 4, 4, 8, 1024, 1024, 2048]


def test_key_buckets_m_and_keeps_n_k_exact(template):
    key = template.key(template.problem(M=1000, N=3000, K=777, dtype="bfloat16"))
    assert dict(key.dims) == {"M": 1024, "N": 3000, "K": 777}
    assert dict(key.fields) == {"dtype": "bfloat16"}
    assert str(key) == "M=1024,N=3000,K=777,dtype=bfloat16"
    # same bucket, same key; other N, other key
    assert template.key(template.problem(M=513, N=3000, K=777, dtype="bfloat16")) == key
    assert template.key(template.problem(M=1000, N=3001, K=777, dtype="bfloat16")) != key
    assert template.key(template.problem(M=1000, N=3000, K=777, dtype="float16")) != key


def test_shape_key_round_trip():
    key = ShapeKey.make({"M": 64, "N": 45, "K": 29}, {"dtype": "float16", "layout": "nt"})
    text = str(key)
    assert text == "M=64,N=45,K=29,dtype=float16,layout=nt"
    assert ShapeKey.parse(text) == key
    assert str(ShapeKey.parse(text)) == text


def test_shape_key_distance():
    a = ShapeKey.make({"M": 64, "N": 256, "K": 32}, {"dtype": "float16"})
    b = ShapeKey.make({"M": 256, "N": 256, "K": 32}, {"dtype": "float16"})
    c = ShapeKey.make({"M": 128, "N": 512, "K": 64}, {"dtype": "float16"})
    assert a.distance(a) == 0.0
    assert a.distance(b) == pytest.approx(2.0)
    assert b.distance(a) == pytest.approx(2.0)
    assert a.distance(c) == pytest.approx(math.sqrt(3))
    other_dtype = ShapeKey.make({"M": 64, "N": 256, "K": 32}, {"dtype": "bfloat16"})
    assert a.distance(other_dtype) == math.inf
    other_dims = ShapeKey.make({"M": 64, "N": 256}, {"dtype": "float16"})
    assert a.distance(other_dims) == math.inf


def test_a_template_measures_key_distance_as_shape_key_does_unless_it_says_otherwise():
    matmul, decode = tunesvc.get_template("matmul"), tunesvc.get_template("decode")
    a = ShapeKey.make({"M": 64, "N": 256, "K": 32}, {"dtype": "float16"})
    c = ShapeKey.make({"M": 128, "N": 512, "K": 64}, {"dtype": "float16"})
    assert matmul.key_distance(a, c) == a.distance(c)
    # decode: programs per split (B x HKV), context, query heads per KV head, head dim
    fields = {"dtype": "bfloat16", "paged": "False"}
    two_by_four = ShapeKey.make({"B": 2, "HQ": 16, "HKV": 4, "S": 1024, "D": 128}, fields)
    four_by_two = ShapeKey.make({"B": 4, "HQ": 8, "HKV": 2, "S": 1024, "D": 128}, fields)
    assert decode.key_distance(two_by_four, four_by_two) == 0.0  # the same grid and group
    assert two_by_four.distance(four_by_two) == pytest.approx(math.sqrt(3))
    longer = ShapeKey.make({"B": 2, "HQ": 16, "HKV": 4, "S": 4096, "D": 128}, fields)
    assert decode.key_distance(two_by_four, longer) == pytest.approx(2.0)
    wider_group = ShapeKey.make({"B": 2, "HQ": 64, "HKV": 4, "S": 1024, "D": 128}, fields)
    assert decode.key_distance(two_by_four, wider_group) == pytest.approx(2.0)
    paged = ShapeKey.make({"B": 2, "HQ": 16, "HKV": 4, "S": 1024, "D": 128}, {**fields, "paged": "True"})
    assert decode.key_distance(two_by_four, paged) == math.inf


# -- cost, version -------------------------------------------------------------------------------
@pytest.mark.parametrize(("dtype", "size"), [("float16", 2), ("bfloat16", 2), ("float32", 4)])
def test_cost(template, dtype, size):
    cost = template.cost(template.problem(M=37, N=45, K=29, dtype=dtype))
    assert cost.flops == 2 * 37 * 45 * 29
    assert cost.bytes == (37 * 29 + 29 * 45 + 37 * 45) * size


def test_version_is_stable_12_hex(template):
    version = template.version
    assert re.fullmatch(r"[0-9a-f]{12}", version)
    assert template.version == version
    assert tunesvc.get_template("matmul").version == version
    assert type(template)().version == version


def test_tolerance_per_dtype(template):
    assert template.tolerance(template.problem(M=1, N=1, K=1, dtype="float16")) == 5e-3
    assert template.tolerance(template.problem(M=1, N=1, K=1, dtype="bfloat16")) == 2e-2
    assert template.tolerance(template.problem(M=1, N=1, K=1, dtype="float32")) == 1e-2


# -- get_template ----------------------------------------------------------------------------------
def test_get_template_shipped(template):
    assert template.name == "matmul"
    assert template.dims == ("M", "N", "K")
    assert isinstance(template, Template)
    from tunesvc.kernels.matmul import TEMPLATE

    assert template is TEMPLATE


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("conv2d", "Unknown kernel 'conv2d'"),
        ("no_such_module_xyz:T", "Cannot load template 'no_such_module_xyz:T'"),
        ("tunesvc.kernels.matmul:NOPE", "Cannot load template"),
        ("os:path", "is not a tunesvc Template"),
        ("tunesvc.kernels.matmul:launch_matmul", "is not a tunesvc Template"),
    ],
)
def test_get_template_errors(name, pattern):
    with pytest.raises(TunesvcError, match=re.escape(pattern)):
        tunesvc.get_template(name)


USER_MODULE = '''
from pathlib import Path

import torch

import tunesvc
from tunesvc.template import ShapeKey


class Scale(tunesvc.Template):
    """y = x * 2, a user template with its own space file beside the module."""

    name = "scale"
    dims = ("N",)

    @property
    def space_path(self):
        return Path(__file__).parent / "scale_space.toml"

    def key(self, problem):
        return ShapeKey.make({"N": problem["N"]}, {"dtype": problem["dtype"]})

    def make_inputs(self, problem, device):
        return torch.randn(problem["N"], dtype=getattr(torch, problem["dtype"]))

    def launch(self, x, config):
        return x * 2

    def reference(self, x):
        return x.float() * 2

    def heuristic(self, problem, device):
        return {"BLOCK": 64}

    def cost(self, problem):
        return tunesvc.Cost(flops=problem["N"], bytes=4 * problem["N"])


INSTANCE = Scale()
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_templates.py").write_text(textwrap.dedent(USER_MODULE))
    (tmp_path / "scale_space.toml").write_text(
        '[params]\nBLOCK = [32, 64, 128]\n\n[constraints]\nfit = "BLOCK <= max(32, next_pow2(N))"\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_templates"
    import sys

    sys.modules.pop("my_templates", None)


@pytest.mark.parametrize("attr", ["Scale", "INSTANCE"])
def test_get_template_module_attr(user_module, attr, device):
    tpl = tunesvc.get_template(f"{user_module}:{attr}")
    assert isinstance(tpl, Template)
    assert tpl.name == "scale"
    assert tpl.space.size == 3
    assert re.fullmatch(r"[0-9a-f]{12}", tpl.version)
    assert tpl.version != tunesvc.get_template("matmul").version
    problem = tpl.parse_shape("40")
    assert problem == {"N": 40, "dtype": "float16"}
    assert [c["BLOCK"] for c in tpl.feasible(problem, device)] == [32, 64]
    bench = tunesvc.Bench(tpl, problem, device)
    assert bench.measure({"BLOCK": 32}).status is tunesvc.Status.OK
    assert bench.measure({"BLOCK": 128}).status is tunesvc.Status.INVALID


# -- heuristic ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape",
    [
        (1, 1, 1),
        (1, 33, 17),
        (16, 64, 128),
        (37, 45, 29),
        (64, 64, 64),
        (70, 19, 65),
        (100, 4096, 4096),
        (1000, 3000, 777),
        (4096, 4096, 4096),
    ],
)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_heuristic_is_feasible(template, device, shape, dtype):
    M, N, K = shape
    problem = template.problem(M=M, N=N, K=K, dtype=dtype)
    config = template.heuristic(problem, device)
    template.space.validate(config)
    assert template.violations(config, problem, device) == []


def test_warm_start_begins_with_the_heuristic(template, device):
    problem = template.problem(M=37, N=45, K=29)
    start = template.warm_start(problem, device)
    assert start[0] == template.heuristic(problem, device)
    for config in start:
        template.space.validate(config)


@pytest.mark.parametrize("M", [17, 32, 33, 64, 128])
def test_heuristic_uses_its_own_tiles_for_large_n_and_k(template, device, M):
    # The heuristic's tiles must satisfy the space's constraints by themselves (one tile-row
    # means GROUP_M=1; no tile taller than the problem), not fall back to the smallest tile.
    problem = template.problem(M=M, N=4096, K=4096)
    config = template.heuristic(problem, device)
    assert template.violations(config, problem, device) == []
    assert config["BLOCK_M"] == max(16, 1 << (M - 1).bit_length()), f"heuristic fell back to {config}"
    assert config["BLOCK_N"] >= 64


class _WithOptions(tunesvc.Template):
    name = "with_options"
    dims = ("N",)
    options = {"causal": (False, True), "mode": ("fast", "exact")}
    dtypes = ("float16", "bfloat16")


def test_problem_options_default_parse_and_reject():
    t = _WithOptions()
    assert t.problem(N=4) == {"N": 4, "causal": False, "mode": "fast", "dtype": "float16"}
    p = t.parse_shape("N=4,causal=1,mode=exact", "bfloat16")
    assert p == {"N": 4, "causal": True, "mode": "exact", "dtype": "bfloat16"}
    assert t.problem_vars(p)["causal"] == 1
    with pytest.raises(tunesvc.TunesvcError, match="causal='maybe' is not allowed"):
        t.problem(N=4, causal="maybe")
    with pytest.raises(tunesvc.TunesvcError, match="dtype 'float32' is not supported"):
        t.problem(N=4, dtype="float32")
    with pytest.raises(tunesvc.TunesvcError, match="takes N, causal, mode, dtype"):
        t.problem(N=4, K=3)


def test_problem_of_key_round_trips_the_key(template):
    problem = template.problem(M=1000, N=3000, K=777, dtype="bfloat16")
    key = str(template.key(problem))
    assert key == "M=1024,N=3000,K=777,dtype=bfloat16"
    assert template.problem_of_key(key) == {"M": 1024, "N": 3000, "K": 777, "dtype": "bfloat16"}
    attention = tunesvc.get_template("attention")
    causal = attention.problem_of_key("B=4,H=32,S=4096,D=128,causal=True,dtype=bfloat16")
    assert causal["causal"] is True and str(attention.key(causal)) == "B=4,H=32,S=4096,D=128,causal=True,dtype=bfloat16"


def test_source_version_ignores_layout_comments_and_docstrings_but_not_code():
    from tunesvc.template import source_version

    base = source_version("def f(x):\n    '''Doc.'''\n    return x + 1\n")
    assert source_version("def f( x ):  # why\n\n    return (x +\n        1)\n") == base
    assert source_version("    def f(x):\n        return x + 1\n") == base  # indented, as inspect gives methods
    assert source_version("def f(x):\n    return x + 2\n") != base
    assert source_version("def f(y):\n    return y + 1\n") != base


def test_shipped_versions_read_from_the_sources_are_the_hashes_of_the_imported_kernel_functions():
    """A shipped template names its kernel functions; the version read from their files is the
    hash of what inspect gives for the imported functions (as for a user's template of objects).
    In a fresh interpreter: a test that wraps a kernel function must not change what is compared."""
    import subprocess
    import sys

    code = """
import importlib, inspect, json
import tunesvc
from tunesvc.template import SHIPPED, get_template, source_version
out = {}
for name in SHIPPED:
    template = get_template(name)
    module = importlib.import_module(f"tunesvc.kernels.{template.kernel_module}")
    objects = [getattr(module, source) for source in template.kernel_sources]
    out[name] = [template.version, source_version(*(inspect.getsource(getattr(o, "fn", o)) for o in objects))]
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    versions = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(versions) == sorted(tunesvc.template.SHIPPED)
    for name, (static, imported) in versions.items():
        assert static == imported == tunesvc.template.shipped_version(name), name


def test_named_sources_version_follows_imports_and_refuses_a_missing_name(tmp_path, monkeypatch):
    from tunesvc import template as templates
    from tunesvc.template import named_sources_version
    from tunesvc.template import source_version

    (tmp_path / "base.py").write_text("@deco\ndef k(x):\n    return x\n")
    (tmp_path / "mod.py").write_text(
        "from tunesvc.kernels.base import k as k\n\ndef launch(x):\n    return k(x)\n\nlaunch = wrap(launch)\n"
    )
    monkeypatch.setattr(templates, "_kernels_folder", lambda: tmp_path)
    launch = "def launch(x):\n    return k(x)\n"
    assert named_sources_version("mod", ["k", "launch"]) == source_version("@deco\ndef k(x):\n    return x\n", launch)
    with pytest.raises(TunesvcError, match="'other', which tunesvc.kernels.mod does not define"):
        named_sources_version("mod", ["other"])
    assert tunesvc.template.shipped_version("not-shipped") is None


def test_tune_show_does_not_import_torch():
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).parents[1] / "tune.db.example"
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['tune', 'show', '--db', {str(example)!r}]\n"
        "try:\n    runpy.run_module('tunesvc', run_name='__main__')\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "print('torch' in sys.modules, file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "False"
    assert "current version, used by lookups" in result.stdout


def test_a_space_with_no_config_for_a_shape_is_one_sentence(tmp_path, monkeypatch):
    """Every config breaks a constraint at this shape: `tune space --shape` says so (a template's
    heuristic would have nothing to pick from)."""
    from typer.testing import CliRunner

    from tunesvc.cli import app

    (tmp_path / "tight_templates.py").write_text(
        textwrap.dedent(USER_MODULE).replace("scale_space.toml", "tight_space.toml")
    )
    (tmp_path / "tight_space.toml").write_text('[params]\nBLOCK = [32, 64]\n\n[constraints]\nfit = "BLOCK <= N"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        result = CliRunner().invoke(app, ["space", "tight_templates:Scale", "--shape", "8"])
    finally:
        sys.modules.pop("tight_templates", None)
    assert result.exit_code == 1
    assert "every one breaks a constraint" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("layernorm_bwd", {"M": 37, "N": 100, "dtype": "float32"}),
        ("rmsnorm_bwd", {"M": 37, "N": 100, "dtype": "float32"}),
        ("bias_act_residual_bwd", {"M": 37, "N": 100, "act": "gelu", "dtype": "float32"}),
        ("attention_bwd", {"B": 1, "H": 2, "S": 70, "D": 64, "causal": True, "dtype": "bfloat16"}),
    ],
)
def test_a_backward_peer_gives_autograds_gradients_and_runs_its_forward_once_per_stream(name, problem):
    """Each backward template's torch peer (tunesvc.template.backward_peer): the gradients the
    reference gives, its forward run at the first call on a stream and not again."""
    import torch

    from tunesvc.device import current_device

    template = tunesvc.get_template(name)
    problem = template.problem(**problem)
    inputs = template.make_inputs(problem, current_device())
    peer = template.peer(inputs)
    assert peer is not None
    forwards = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: forwards.append(1) or t, lambda t: t):
        first = peer()
        second = peer()
    assert forwards  # the forward ran under the first call (it saved tensors for its backward)
    saved = len(forwards)
    third = peer()
    assert len(forwards) == saved  # and never again on this stream
    assert all(torch.equal(a, b) for a, b in zip(first, second)) and all(
        torch.equal(a, b) for a, b in zip(first, third)
    )
    from tunesvc.bench import relative_error

    # each reference is the same gradients, in float64, flattened one after another
    flat = torch.cat([g.flatten() for g in first])
    assert relative_error(flat, template.reference(inputs).flatten()) < (1e-4 if flat.dtype == torch.float32 else 3e-2)
