"""tunesvc.autotune as an exact drop-in for triton.autotune, and tunesvc.capture() over it.

Each kernel below is written once, with the features library kernels use on triton.autotune:
keys on bool, float, None, 0 and dtypes; @triton.heuristics above and below the autotuner;
reset_to_zero on an atomic-add kernel; restore_value on an in-place kernel; prune_configs_by
with early_config_prune, perf_model and top_k; a per-config pre_hook; keyword launches; a key
argument after a tuned meta-parameter; one listed config. ``build(autotune)`` makes them with a
given decorator, so the same source runs (a) under plain triton.autotune, (b) with the decorator
swapped for tunesvc.autotune and (c) under tunesvc.capture(): (b) and (c) must launch what (a)
computes, and every candidate they measured must be stored ok (a candidate checked on inputs
that an earlier candidate had already accumulated into would read wrong_result).
"""

from __future__ import annotations

import types
from collections import Counter

import pytest
import torch
import triton
import triton.language as tl
from _capture import autotuner_of
from _capture import base_function
from _capture import captured_name
from _capture import config_dict
from _capture import trials_by_kernel
from _capture import wall_clock_bench

import tunesvc
from tunesvc.bench import relative_error as _rel

#: triton.autotune's own benchmarker on a GPU; a wall-clock one in the interpreter (no driver)
BENCH = None if torch.cuda.is_available() else wall_clock_bench


def _zero_out(nargs):
    nargs["out_ptr"].zero_()


def build(autotune) -> types.SimpleNamespace:
    """The test kernels, decorated with ``autotune`` (triton.autotune or tunesvc.autotune)."""

    @triton.heuristics({"HAS_BETA": lambda args: args["beta"] is not None})
    @autotune(
        configs=[
            triton.Config({"BLOCK": 16}),
            triton.Config({"BLOCK": 32}),
            triton.Config({"BLOCK": 64}, num_warps=2),
        ],
        key=["n", "alpha", "beta", "offset", "FLIP"],
        do_bench=BENCH,
    )
    @triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
    @triton.jit
    def scaled_add(
        x_ptr,
        out_ptr,
        n,
        alpha,
        beta,
        offset,
        BLOCK: tl.constexpr,
        FLIP: tl.constexpr,  # a key argument after the tuned BLOCK: always passed by name
        HAS_BETA: tl.constexpr,
        EVEN: tl.constexpr,
    ):
        """out = alpha * x (reversed when FLIP) + offset (+ beta when given)."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        src = n - 1 - offs if FLIP else offs
        if EVEN:
            x = tl.load(x_ptr + src)
        else:
            x = tl.load(x_ptr + src, mask=offs < n, other=0.0)
        y = alpha * x + offset
        if HAS_BETA:
            y += beta
        if EVEN:
            tl.store(out_ptr + offs, y)
        else:
            tl.store(out_ptr + offs, y, mask=offs < n)

    @autotune(
        configs=[triton.Config({"BLOCK": b}) for b in (8, 16, 32)],
        key=["n"],
        reset_to_zero=["out_ptr"],
        do_bench=BENCH,
    )
    @triton.jit
    def atomic_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        """out[0] += sum(x): every program adds its block's sum."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.atomic_add(out_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0)))

    @autotune(
        configs=[triton.Config({"BLOCK": b}) for b in (8, 16, 32)],
        key=["n"],
        restore_value=["y_ptr"],
        do_bench=BENCH,
    )
    @triton.jit
    def inplace_axpy(y_ptr, x_ptr, n, alpha, BLOCK: tl.constexpr):
        """y += alpha * x, in place."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, y + alpha * tl.load(x_ptr + offs, mask=mask), mask=mask)

    def early_prune(configs, named_args, **kwargs):
        return [c for c in configs if c.kwargs["BLOCK"] <= max(16, triton.next_power_of_2(named_args["n"]))]

    def perf_model(n, BLOCK, **kwargs):
        return abs(BLOCK - 32)

    @autotune(
        configs=[triton.Config({"BLOCK": b}) for b in (8, 16, 32, 64, 128, 256)],
        key=["n"],
        prune_configs_by={"early_config_prune": early_prune, "perf_model": perf_model, "top_k": 2},
        do_bench=BENCH,
    )
    @triton.jit
    def pruned_double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        """out = 2 * x."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

    @autotune(
        configs=[triton.Config({"BLOCK_N": b}, pre_hook=_zero_out) for b in (8, 16, 32)],
        key=["m", "n"],
        do_bench=BENCH,
    )
    @triton.jit
    def row_sums(x_ptr, out_ptr, m, n, BLOCK_N: tl.constexpr):
        """out[i] = sum of row i of an m x n matrix, accumulated by atomics (zeroed by the pre_hook)."""
        row = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.atomic_add(out_ptr + row, tl.sum(tl.load(x_ptr + row * n + offs, mask=offs < n, other=0.0)))

    @autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=2)], key=["n"], do_bench=BENCH)
    @triton.jit
    def one_config(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        """out = x + 1."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    return types.SimpleNamespace(
        scaled_add=scaled_add,
        atomic_sum=atomic_sum,
        inplace_axpy=inplace_axpy,
        pruned_double=pruned_double,
        row_sums=row_sums,
        one_config=one_config,
    )


#: trials each kernel stores when run_all tunes it: configs surviving pruning x keys
EXPECTED_TRIALS = {
    "scaled_add": 3 * 3,  # three keys: a None/0 key, a float/bool key, the first key in float64
    "atomic_sum": 3,
    "inplace_axpy": 3,
    "pruned_double": 2,  # early_config_prune keeps 4 of 6 for n=45, top_k keeps 2
    "row_sums": 3,
}

#: the scaled_add calls: (n, alpha, beta, offset, FLIP, dtype); n=64 makes EVEN true for every BLOCK
SCALED_ADD_CALLS = [
    (37, 0.5, None, 0, False, torch.float32),
    (64, 2.0, 1.5, 3, True, torch.float64),
    (37, 0.5, None, 0, False, torch.float64),
]


def _grid(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


def run_all(k: types.SimpleNamespace) -> dict[str, torch.Tensor]:
    """Every kernel launched on fixed random inputs (odd sizes), as library code launches them;
    the outputs by name. Inputs a launch must not change are checked here."""
    gen = torch.Generator().manual_seed(0)
    outs: dict[str, torch.Tensor] = {}
    for i, (n, alpha, beta, offset, flip, dtype) in enumerate(SCALED_ADD_CALLS):
        x = torch.randn(n, generator=gen).to(dtype)
        x_before = x.clone()
        out = torch.full_like(x, float("nan"))
        if i == 1:  # every argument by name
            k.scaled_add[_grid(n)](x_ptr=x, out_ptr=out, n=n, alpha=alpha, beta=beta, offset=offset, FLIP=flip)
        else:
            k.scaled_add[_grid(n)](x, out, n, alpha, beta, offset, FLIP=flip)
        assert torch.equal(x, x_before), "a launch changed its input"
        outs[f"scaled_add{i}"] = out

    x = torch.randn(101, generator=gen, dtype=torch.float64)
    total = torch.zeros(1, dtype=torch.float64)
    k.atomic_sum[_grid(101)](x, total, 101)
    outs["atomic_sum"] = total

    y = torch.randn(53, generator=gen)
    x = torch.randn(53, generator=gen)
    k.inplace_axpy[_grid(53)](y, x, 53, 0.25)
    outs["inplace_axpy"] = y

    x = torch.randn(45, generator=gen)
    out = torch.empty_like(x)
    k.pruned_double.run(x, out, 45, grid=_grid(45), warmup=False)  # how some libraries launch
    outs["pruned_double"] = out

    x = torch.randn(5, 41, generator=gen)
    sums = torch.full((5,), 7.0)  # garbage the per-config pre_hook must clear before every launch
    k.row_sums[lambda meta: (5, triton.cdiv(41, meta["BLOCK_N"]))](x, sums, 5, 41)
    outs["row_sums"] = sums

    x = torch.randn(45, generator=gen)
    out = torch.empty_like(x)
    k.one_config[_grid(45)](x_ptr=x, out_ptr=out, n=45)
    outs["one_config"] = out
    return outs


def references() -> dict[str, torch.Tensor]:
    """What run_all's launches compute, in float64 torch on the same inputs."""
    gen = torch.Generator().manual_seed(0)
    refs: dict[str, torch.Tensor] = {}
    for i, (n, alpha, beta, offset, flip, dtype) in enumerate(SCALED_ADD_CALLS):
        x = torch.randn(n, generator=gen).to(dtype).double()
        refs[f"scaled_add{i}"] = alpha * (x.flip(0) if flip else x) + offset + (beta or 0.0)
    refs["atomic_sum"] = torch.randn(101, generator=gen, dtype=torch.float64).sum().reshape(1)
    y, x = torch.randn(53, generator=gen), torch.randn(53, generator=gen)
    refs["inplace_axpy"] = y.double() + 0.25 * x.double()
    refs["pruned_double"] = 2 * torch.randn(45, generator=gen).double()
    refs["row_sums"] = torch.randn(5, 41, generator=gen).double().sum(1)
    refs["one_config"] = torch.randn(45, generator=gen).double() + 1
    return refs


def _assert_close(outs: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], tol: float) -> None:
    assert outs.keys() == expected.keys()
    for name, out in outs.items():
        assert out.dtype == outs[name].dtype
        err = _rel(out, expected[name])
        assert err <= tol, f"{name}: relative error {err:.3g} > {tol:g}"


def _assert_all_trials_ok(db: str, k: types.SimpleNamespace) -> None:
    """Every kernel's trials stored under its module:qualname, all ok, configs x keys of them."""
    stored = trials_by_kernel(db)
    expected = {captured_name(getattr(k, name)): Counter(ok=n) for name, n in EXPECTED_TRIALS.items()}
    assert stored == expected


def test_plain_triton_autotune_computes_the_references():
    """(a): the kernels themselves are right under Triton's own autotuner."""
    _assert_close(run_all(build(triton.autotune)), references(), 1e-6)


def test_one_word_swap_to_tunesvc_autotune(tmp_db, monkeypatch):
    """(b): the same kernels with the decorator swapped launch what (a) computes, tuned into the
    store; launched again, they measure nothing more."""
    plain = run_all(build(triton.autotune))
    monkeypatch.setenv("TUNESVC_DB", tmp_db)
    k = build(tunesvc.autotune)
    _assert_close(run_all(k), plain, 1e-6)
    _assert_all_trials_ok(tmp_db, k)
    _assert_close(run_all(k), plain, 1e-6)
    _assert_all_trials_ok(tmp_db, k)


def test_capture_routes_plain_triton_autotune_kernels(tmp_db):
    """(c): under tunesvc.capture(), kernels decorated with triton.autotune before and after it
    starts launch what (a) computes; the second set finds the first set's winners stored."""
    plain = run_all(build(triton.autotune))
    before = build(triton.autotune)
    with tunesvc.capture(db=tmp_db):
        after = build(triton.autotune)
        _assert_close(run_all(after), plain, 1e-6)
        _assert_all_trials_ok(tmp_db, after)
        _assert_close(run_all(before), plain, 1e-6)
        _assert_all_trials_ok(tmp_db, before)


def test_capture_as_a_plain_call_and_mode_off(tmp_db):
    """tunesvc.capture() as a plain call stays on until its handle is closed; in mode 'off' the
    kernels are Triton's again: tuned by Triton, nothing stored."""
    plain = run_all(build(triton.autotune))
    handle = tunesvc.capture(db=tmp_db)
    try:
        _assert_close(run_all(build(triton.autotune)), plain, 1e-6)
    finally:
        handle.close()
    stored = trials_by_kernel(tmp_db)
    assert sum(stored.values(), Counter()) == Counter(ok=sum(EXPECTED_TRIALS.values()))
    _assert_close(run_all(build(triton.autotune)), plain, 1e-6)
    with tunesvc.capture(mode="off", db=tmp_db):
        _assert_close(run_all(build(triton.autotune)), plain, 1e-6)
    assert trials_by_kernel(tmp_db) == stored


WAYS = ["triton", "tunesvc", "capture"]


@pytest.fixture
def launched(request, tmp_db, monkeypatch):
    """(plain kernels after run_all, kernels made the way under test after run_all)."""
    plain = build(triton.autotune)
    run_all(plain)
    if request.param == "triton":
        k = build(triton.autotune)
        run_all(k)
        yield plain, k
    elif request.param == "tunesvc":
        monkeypatch.setenv("TUNESVC_DB", tmp_db)
        k = build(tunesvc.autotune)
        run_all(k)
        yield plain, k
    else:
        with tunesvc.capture(db=tmp_db):
            k = build(triton.autotune)
            run_all(k)
            yield plain, k


@pytest.mark.parametrize("launched", WAYS, indirect=True)
def test_attributes_library_code_reads(launched):
    """fn, base_fn, configs, keys, cache, best_config, arg_names, run, warmup and prune_configs,
    as triton.autotune has them, after the same launches."""
    plain, k = launched
    assert base_function(k.scaled_add).__name__ == "scaled_add"  # the wrapper's walk down .fn
    tuner, reference = autotuner_of(k.scaled_add), autotuner_of(plain.scaled_add)
    assert tuner.base_fn is base_function(k.scaled_add)
    assert tuner.fn.fn.arg_names == tuner.arg_names == reference.arg_names
    assert tuner.keys == ["n", "alpha", "beta", "offset", "FLIP"]
    assert [config_dict(c) for c in tuner.configs] == [config_dict(c) for c in reference.configs]
    assert set(tuner.cache) == set(reference.cache)  # one entry per key, keyed as Triton keys them
    assert all(c in tuner.configs for c in tuner.cache.values())
    assert tuner.best_config in tuner.configs
    assert [config_dict(c) for c in tuner.prune_configs({})] == [config_dict(c) for c in tuner.configs]
    assert callable(tuner.run) and callable(tuner.warmup)

    x = torch.randn(45)
    warmed = k.pruned_double.warmup(x, torch.empty_like(x), 45, grid=(1,))
    assert len(warmed) == 2  # one per config that survives pruning, as Triton's warmup

    one = autotuner_of(k.one_config)
    assert config_dict(one.best_config) == {"BLOCK": 32, "num_warps": 2, "num_stages": 3}


def test_one_config_runs_untuned(tmp_db, monkeypatch):
    """A kernel with one listed config launches it with nothing measured or stored."""
    monkeypatch.setenv("TUNESVC_DB", tmp_db)
    with tunesvc.capture(db=tmp_db):
        k = build(triton.autotune)
        x = torch.randn(45)
        out = torch.empty_like(x)
        k.one_config[_grid(45)](x, out, 45)
    assert torch.equal(out, x + 1)
    assert captured_name(k.one_config) not in trials_by_kernel(tmp_db)


@pytest.mark.parametrize("launched", WAYS, indirect=True)
def test_reset_to_zero_arguments_as_triton_leaves_them(launched):
    """triton.autotune zeroes the reset_to_zero arguments after a key's first resolution, so that
    launch starts from zero whatever the caller passed; a later launch of the key does not."""
    _, k = launched
    x = torch.randn(77, dtype=torch.float64)
    found = []
    for _ in range(2):
        total = torch.full((1,), 5.0, dtype=torch.float64)
        k.atomic_sum[_grid(77)](x, total, 77)  # n=77: a key run_all did not meet
        found.append(total.item())
    assert found == pytest.approx([x.sum().item(), 5.0 + x.sum().item()], rel=1e-12)
