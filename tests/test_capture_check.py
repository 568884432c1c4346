"""Capture's check of a candidate against the first valid config (tunesvc._capture.bench): scratch
tensors of per-program partials, whose used slots depend on the config, are compared by their
sums over the slot axes; every other output as before."""

from __future__ import annotations

import html
import json
import re

import pytest
import torch
import triton
import triton.language as tl
from sqlalchemy import select
from typer.testing import CliRunner

import tunesvc
from tunesvc.cli import app
from tunesvc.store import Store
from tunesvc.store.models import KernelVersion
from tunesvc.store.models import Trial
from tunesvc.store.models import Winner

M, N = 100, 5
KERNEL = f"{__name__}:_column_partials"
BLOCKS = (8, 16, 32, 64)


@triton.jit
def _column_partials(
    x_ptr, partial_ptr, out_ptr,  #
    M, N, stride_slot, stride_col,  #
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WRONG: tl.constexpr, WRONG_OUT: tl.constexpr,
):  # fmt: skip
    """partial[pid, :] = the column sums of rows pid * BLOCK_M ... of x: one slot per program, so
    BLOCK_M sets how many slots are used; out = 2 * x, a normal output. WRONG drops the last row
    of every block (a wrong partial); WRONG_OUT writes 3 * x (a wrong normal output)."""
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    keep = offs_m < M
    if WRONG:
        keep = keep & (tl.arange(0, BLOCK_M) < BLOCK_M - 1)
    mask = keep[:, None] & (offs_n[None, :] < N)
    x = tl.load(x_ptr + offs_m[:, None] * N + offs_n[None, :], mask=mask, other=0.0)
    tl.store(partial_ptr + pid * stride_slot + offs_n * stride_col, tl.sum(x, axis=0), mask=offs_n < N)
    scale = 3.0 if WRONG_OUT else 2.0
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], x * scale, mask=mask)


@triton.jit
def _copy(x_ptr, out_ptr, n, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    """out[i + SHIFT] = x[i]: with SHIFT 1, a config that writes its results one place off."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs + SHIFT, tl.load(x_ptr + offs, mask=mask), mask=mask)


def _config(block: int, wrong: bool = False, wrong_out: bool = False) -> triton.Config:
    return triton.Config({"BLOCK_M": block, "WRONG": wrong, "WRONG_OUT": wrong_out})


def _trials(db: str) -> list:
    store = Store(db, readonly=True)
    try:
        with store.session() as session:
            return list(
                session.execute(
                    select(Trial.config, Trial.status, Trial.time_ms, Trial.message, Trial.id).order_by(Trial.id)
                ).all()
            )
    finally:
        store.close()


def _winner(db: str, name: str) -> dict:
    store = Store(db, readonly=True)
    try:
        with store.session() as session:
            [config] = session.scalars(
                select(Winner.config)
                .join(KernelVersion, Winner.kernel_version_id == KernelVersion.id)
                .where(KernelVersion.kernel.endswith(name))
            ).all()
            return dict(config)
    finally:
        store.close()


def _column_sums(db: str, configs: list[triton.Config], slots_last: bool = False):
    """Launch the autotuned partials kernel once, then sum its partials as its program does."""
    kernel = tunesvc.autotune(configs=configs, key=["M", "N"], reset_to_zero=["partial_ptr"], db=db)(_column_partials)
    x = torch.randn(M, N)
    out = torch.empty(M, N)
    slots = triton.cdiv(M, min(BLOCKS))
    # garbage from an earlier step: reset_to_zero zeroes it before every trial and the launch
    partial = torch.full((N, slots) if slots_last else (slots, N), 7.0)
    stride_slot, stride_col = (1, slots) if slots_last else (N, 1)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]),)
    kernel[grid](x, partial, out, M, N, stride_slot, stride_col, BLOCK_N=triton.next_power_of_2(N))
    return kernel, x, out, partial.sum(dim=1 if slots_last else 0)


@pytest.mark.parametrize("slots_last", [False, True], ids=["slots-first", "slots-last"])
def test_every_config_of_per_program_partials_is_accepted_and_the_fastest_stored(tmp_db, slots_last):
    kernel, x, out, sums = _column_sums(tmp_db, [_config(b) for b in BLOCKS], slots_last)
    torch.testing.assert_close(sums, x.sum(dim=0))
    torch.testing.assert_close(out, 2 * x)
    rows = _trials(tmp_db)
    assert [r.status for r in rows] == ["ok"] * len(BLOCKS), [(r.config, r.status, r.message) for r in rows]
    # the first config is the reference; every other one wrote fewer slots, and says how it was compared
    axis = 1 if slots_last else 0
    how = "timed: interpreter, wall clock of its one run"
    assert rows[0].message == how
    said = f"tensor argument 1 (partial_ptr) compared by its sums over axis {axis} (the configs wrote different slots of it)"
    assert [r.message for r in rows[1:]] == [f"{how}; {said}"] * (len(BLOCKS) - 1)
    # the fastest, or a config tied with it (within its 1% noise floor: the tie rule's pick)
    fastest = min(r.time_ms for r in rows)
    stored = _winner(tmp_db, ":_column_partials")
    assert next(r.time_ms for r in rows if dict(r.config) == stored) <= fastest * 1.01
    assert kernel.best_config.kwargs["BLOCK_M"] == stored["BLOCK_M"]


def test_a_config_computing_a_wrong_partial_is_rejected_and_says_why(tmp_db):
    configs = [_config(8), _config(16, wrong=True), _config(32)]
    _, x, _, sums = _column_sums(tmp_db, configs)
    torch.testing.assert_close(sums, x.sum(dim=0))  # the winner is a right one
    rows = _trials(tmp_db)
    assert [r.status for r in rows] == ["ok", "wrong_result", "ok"]
    assert rows[1].message.startswith(
        "tensor argument 1 (partial_ptr), by its sums over axis 0 (the configs wrote different slots of it): "
        "relative error "
    )
    assert _winner(tmp_db, ":_column_partials")["BLOCK_M"] != 16


def test_a_normal_output_beside_the_partials_is_checked_element_by_element(tmp_db):
    configs = [_config(8), _config(16, wrong_out=True), _config(32)]
    _, x, out, _ = _column_sums(tmp_db, configs)
    torch.testing.assert_close(out, 2 * x)
    rows = _trials(tmp_db)
    assert [r.status for r in rows] == ["ok", "wrong_result", "ok"]
    assert rows[1].message.startswith("tensor argument 2 (out_ptr): relative error ")


def test_a_zeroed_true_output_written_one_place_off_is_still_rejected(tmp_db):
    # out (one element of padding) starts all zero, by the program's torch.zeros, not the
    # autotuner's: the shifted config leaves out[0] zero and writes out[n], so its sum is the
    # right one's, but its slots are no subset of theirs (nor theirs of its)
    n = 200
    configs = [triton.Config({"SHIFT": s, "BLOCK": b}) for s, b in ((0, 16), (1, 32), (0, 64))]
    kernel = tunesvc.autotune(configs=configs, key=["n"], db=tmp_db)(_copy)
    x, out = torch.rand(n) + 1.0, torch.zeros(n + 1)
    kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
    torch.testing.assert_close(out, torch.cat([x, torch.zeros(1)]))
    rows = _trials(tmp_db)
    assert [r.status for r in rows] == ["ok", "wrong_result", "ok"]
    assert rows[1].message.startswith("tensor argument 1 (out_ptr): relative error ")


def test_show_and_the_report_say_how_many_candidates_were_rejected_as_wrong_and_why(tmp_db, tmp_path):
    configs = [_config(8), _config(16, wrong=True), _config(32), _config(64, wrong_out=True)]
    _column_sums(tmp_db, configs)
    why = "tensor argument 1 (partial_ptr), by its sums over axis 0 (the configs wrote different slots of it)"
    runner = CliRunner()
    shown = runner.invoke(app, ["show", "--db", tmp_db, "--kernel", KERNEL])
    assert shown.exit_code == 0, shown.output
    said = " ".join(shown.stdout.split())  # the line as words, however the terminal wraps it
    assert f"2 of 4 candidates rejected as wrong results: 1 for {why} (most often '{why}: relative error " in said
    assert "; 1 for tensor argument 2 (out_ptr) (most often 'tensor argument 2 (out_ptr): relative error " in said
    data = json.loads(runner.invoke(app, ["show", "--db", tmp_db, "--json"]).stdout)
    [rejected] = data["rejected"]
    assert rejected["kernel"] == KERNEL and (rejected["trials"], rejected["wrong_result"]) == (4, 2)
    assert sorted(r["reason"] for r in rejected["reasons"]) == [why, "tensor argument 2 (out_ptr)"]
    assert all(r["trials"] == 1 and r["example"].startswith(r["reason"] + ": ") for r in rejected["reasons"])

    out = tmp_path / "report"
    made = runner.invoke(app, ["report", "--db", tmp_db, "--out", str(out)])
    assert made.exit_code == 0, made.output
    page = html.unescape(re.sub(r"<[^>]+>", "", (out / "report.html").read_text()))
    assert f"2 of 4 candidates rejected as wrong results (never eligible to win): 1 for {why}" in page
    assert "1 for tensor argument 2 (out_ptr)" in page


def test_a_check_of_slots_that_fails_inside_tunesvc_leaves_the_element_by_element_check(tmp_db, monkeypatch):
    from tunesvc._capture import bench

    def refused(t):
        raise RuntimeError("an op a library replaced refused")

    monkeypatch.setattr(bench, "_is_zero", refused)
    _, x, out, sums = _column_sums(tmp_db, [_config(8), _config(16), _config(8, wrong_out=True)])
    torch.testing.assert_close(sums, x.sum(dim=0))  # the program runs as it would
    torch.testing.assert_close(out, 2 * x)
    # as before the slot sums: another block size differs element by element, a wrong output still so
    assert [r.status for r in _trials(tmp_db)] == ["ok", "wrong_result", "wrong_result"]
