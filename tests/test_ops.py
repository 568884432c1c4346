"""Every kernel family launches through its torch.library custom op: torch.compile(fullgraph=True)
traces forward and backward, and the ops pass torch's own consistency checks (opcheck)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tunesvc.kernels
from tunesvc.kernels import attention
from tunesvc.kernels import bias_act_residual
from tunesvc.kernels import decode_attention
from tunesvc.kernels import dropout
from tunesvc.kernels import layer_norm
from tunesvc.kernels import matmul
from tunesvc.kernels import rms_norm
from tunesvc.kernels import softmax
from tunesvc.serving.ops import config_arg
from tunesvc.serving.ops import config_of


def _rows(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, device=device)


def _decode_inputs(device: str = "cpu") -> tuple[torch.Tensor, ...]:
    q = _rows(2, 4, 64, dtype=torch.float16, device=device)
    k, v = (_rows(2, 37, 2, 64, dtype=torch.float16, device=device) for _ in range(2))
    return q, k, v, torch.tensor([37, 5], dtype=torch.int32, device=device)


#: family -> (the user-facing call, fresh inputs on a device (small, odd sizes), which inputs take gradients)
FAMILIES: dict[str, tuple[Callable[..., torch.Tensor], Callable[[str], tuple], tuple[int, ...]]] = {
    "matmul": (matmul, lambda d: (_rows(37, 29, device=d), _rows(29, 45, device=d)), ()),
    "softmax": (softmax, lambda d: (_rows(5, 37, device=d),), (0,)),
    "bias_act_residual": (
        lambda x, b, r: bias_act_residual(x, b, r, "gelu"),
        lambda d: (_rows(5, 37, device=d), _rows(37, device=d), _rows(5, 37, device=d)),
        (0, 1, 2),
    ),
    "dropout": (lambda x: dropout(x, 0.3, 1234), lambda d: (_rows(5, 37, device=d),), (0,)),
    "layer_norm": (
        layer_norm,
        lambda d: (_rows(3, 5, 37, device=d), _rows(37, device=d), _rows(37, device=d)),
        (0, 1, 2),
    ),
    "rms_norm": (rms_norm, lambda d: (_rows(5, 37, device=d), _rows(37, device=d)), (0, 1)),
    "attention": (
        lambda q, k, v: attention(q, k, v, causal=True),
        lambda d: tuple(_rows(1, 2, 37, 64, dtype=torch.float16, device=d) for _ in range(3)),
        (0, 1, 2),
    ),
    "decode_attention": (decode_attention, _decode_inputs, ()),
}


def _run(fn: Callable[..., torch.Tensor], inputs: tuple, grad: tuple[int, ...]) -> list[torch.Tensor]:
    """The output, and the gradients of (output * a fixed weight).sum() in the grad inputs."""
    leaves = [t.clone().requires_grad_(i in grad) if t.is_floating_point() else t for i, t in enumerate(inputs)]
    out = fn(*leaves)
    if not grad:
        return [out.detach()]
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view(out.shape)
    (out * weight).sum().backward()
    return [out.detach(), *(leaves[i].grad for i in grad)]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_compiles_as_one_graph_with_its_backward(family):
    fn, make_inputs, grad = FAMILIES[family]
    inputs = make_inputs("cpu")
    torch._dynamo.reset()
    # aot_eager traces the ops (fake implementations) and the backward as torch.compile does,
    # without Inductor's C++ build of the surrounding graph (a minute on the CPU)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    expected, got = _run(fn, inputs, grad), _run(compiled, inputs, grad)
    assert len(got) == len(expected) == 1 + len(grad)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e)


@pytest.mark.gpu
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_compiles_with_inductor_on_the_gpu(family):
    """The default backend: Inductor builds the graph around the ops, forward and backward."""
    fn, make_inputs, grad = FAMILIES[family]
    inputs = make_inputs("cuda")
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    expected, got = _run(fn, inputs, grad), _run(compiled, inputs, grad)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e)


def test_an_explicit_config_compiles_too():
    config = {"BLOCK_M": 2, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1}
    x = _rows(5, 37)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda x: softmax(x, config=config, bwd_config=config), fullgraph=True, backend="aot_eager"
    )
    expected = _run(lambda x: softmax(x, config=config, bwd_config=config), (x,), (0,))
    for e, g in zip(expected, _run(compiled, (x,), (0,))):
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(expected[0], torch.softmax(x, -1))


class _RecordOps(TorchDispatchMode):
    """The ops that reach the dispatcher's Python mode."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def _dispatched(fn: Callable[[], object]) -> list[str]:
    with _RecordOps() as recorder:
        fn()
    return [name for name in recorder.names if name.startswith("tunesvc.")]


def test_eager_calls_skip_the_dispatcher_and_autograd_still_records_them():
    """Outside torch.compile an entry calls the op's function (inside the same setup and
    backward as the op's when autograd records): the dispatcher only adds host time there."""
    x = _rows(5, 37)
    assert _dispatched(lambda: softmax(x)) == []
    x.requires_grad_()
    with torch.no_grad():
        assert _dispatched(lambda: softmax(x)) == []
        assert softmax(x).grad_fn is None
    dy = torch.randn(5, 37)
    y = softmax(x)
    assert _dispatched(lambda: softmax(x)) == [] and y.grad_fn is not None
    assert _dispatched(lambda: y.backward(dy)) == []
    x64 = x.detach().double().requires_grad_()
    torch.softmax(x64, -1).backward(dy.double())
    torch.testing.assert_close(x.grad, x64.grad.float())


def test_config_argument_round_trips():
    config = {"VARIANT": "splitk", "BLOCK_M": 64, "SPLIT_K": 4, "num_warps": 8}
    assert config_of(config_arg(config)) == config
    assert list(config_of(config_arg(config))) == list(config)
    assert config_arg(None) == "" and config_of("") is None
    first = config_of(config_arg(config))
    first["BLOCK_M"] = 1  # each call gets its own dict
    assert config_of(config_arg(config)) == config


#: the ops, each with a function that makes its arguments (at test time: on a GPU machine, where
#: CPU tensors cannot reach Triton, collecting the tests must launch nothing)
OPS = (
    "matmul", "softmax", "softmax_bwd", "bias_act_residual", "bias_act_residual_bwd", "dropout", "layernorm",
    "layernorm_bwd", "rmsnorm", "rmsnorm_bwd", "attention", "attention_bwd", "decode",
)  # fmt: skip


def _op_args(name: str) -> tuple:
    return dict(_op_cases())[name]


def _op_cases() -> list[tuple[str, tuple]]:
    x, w, b = _rows(5, 37), _rows(37), _rows(37)
    rstd = torch.rand(5) + 0.5
    q, k, v = (_rows(1, 2, 37, 64, dtype=torch.float16) for _ in range(3))
    o, lse = torch.ops.tunesvc.attention(q, k, v, False, 0.125)
    return [
        ("matmul", (_rows(37, 29), _rows(29, 45), "")),
        ("softmax", (x, "", "")),
        ("softmax_bwd", (torch.softmax(x, -1), _rows(5, 37), "")),
        ("bias_act_residual", (x, b, _rows(5, 37), "silu", "", "")),
        ("bias_act_residual_bwd", (x, b, _rows(5, 37), "silu", "")),
        ("dropout", (x, 0.25, 99, "")),
        ("layernorm", (x, w, b, 1e-5)),
        ("layernorm_bwd", (x, w, _rows(5, 37), x.mean(1), rstd)),
        ("rmsnorm", (x, w, 1e-6)),
        ("rmsnorm_bwd", (x, w, _rows(5, 37), rstd)),
        ("attention", (q, k, v, True, 0.125)),
        ("attention_bwd", (q, k, v, o, lse, torch.randn_like(o), False, 0.125)),
        ("decode", (*_decode_inputs(), None, None, "")),
    ]


@pytest.mark.parametrize("name", OPS)
def test_op_passes_torch_opcheck(name):
    """Schema, fake implementation (shapes, strides, dtypes) and autograd registration agree with
    what the op really does (torch.library.opcheck)."""
    op = getattr(torch.ops.tunesvc, name).default
    args = _op_args(name)
    # requires_grad on a float input makes opcheck check the registered backward as well
    args = tuple(
        a.clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args
    )
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_every_family_is_an_op():
    assert set(FAMILIES) == set(tunesvc.kernels.__all__)
    assert [name for name, _ in _op_cases()] == list(OPS)
    for name in OPS:
        assert isinstance(getattr(torch.ops.tunesvc, name).default, torch._ops.OpOverload)
