"""kernels/decode.py's split and combine kernels and launch_decode as they were before the fifth
session (commit c3c0ded): the block table read in the same step as the K and V loads. Kept for
decode_paged_ab.py, which times them against the current ones."""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from tunesvc.device import interpreting
from tunesvc.space import LAUNCH_OPTIONS
from tunesvc.space import Config


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, seq_lens_ptr, block_table_ptr, out_ptr, mid_o_ptr, mid_lse_ptr,
    qk_scale,
    HKV,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_bt,
    stride_ob, stride_oh, stride_od,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    PAGE: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, USE_PDL: tl.constexpr,
):
    """One (sequence, kv head, split): online softmax over the split's chunk of the sequence.

    PAGE = 0: the cache is contiguous and stride_kb/stride_kn step sequences/tokens; PAGE > 0:
    they step pages/tokens in a page, and token n of sequence b lives in page
    block_table[b, n // PAGE] at row n % PAGE. qk_scale = sm_scale * log2(e): exp2 is cheaper.
    """
    if USE_PDL:
        # the combine kernel may be scheduled now; it waits for this grid to finish (gdc_wait)
        tl.extra.cuda.gdc_launch_dependents()
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = pid_bh // HKV
    kv_head = pid_bh % HKV
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    # chunks are whole tiles, so only a sequence's last tile is ragged
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D)
    heads = kv_head * GROUP + offs_g
    mask_g = offs_g < GROUP
    q = tl.load(
        q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=mask_g[:, None], other=0.0,
    )
    if DOT_IN_FP32:
        # Triton's CPU interpreter computes bf16 dots wrongly (seen with Triton 3.9);
        # only the interpreter sets this flag.
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, D], dtype=tl.float32)
    k_head = k_ptr + kv_head * stride_kh + offs_d[None, :] * stride_kd
    v_head = v_ptr + kv_head * stride_vh + offs_d[None, :] * stride_vd
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        if PAGE > 0:
            page = tl.load(block_table_ptr + b * stride_bt + offs_n // PAGE, mask=mask_n, other=0).to(tl.int64)
            k_rows = page * stride_kb + (offs_n % PAGE) * stride_kn
            v_rows = page * stride_vb + (offs_n % PAGE) * stride_vn
        else:
            k_rows = b.to(tl.int64) * stride_kb + offs_n * stride_kn
            v_rows = b.to(tl.int64) * stride_vb + offs_n * stride_vn
        k = tl.load(k_head + k_rows[:, None], mask=mask_n[:, None], other=0.0)
        v = tl.load(v_head + v_rows[:, None], mask=mask_n[:, None], other=0.0)
        if DOT_IN_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    # l_i >= 1 once any key was seen (the running maximum contributes 2^0), so max(l_i, 1)
    # only changes an empty split: its output is 0 and its lse -inf instead of 0/0 and log(0)
    l_i = tl.maximum(l_i, 1.0)
    o = acc / l_i[:, None]
    if NUM_SPLITS == 1:
        out_ptrs = out_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + offs_d[None, :] * stride_od
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=mask_g[:, None])
    else:
        # partials are (B * HQ, NUM_SPLITS, D) and (B * HQ, NUM_SPLITS), contiguous float32
        rows = (b.to(tl.int64) * HKV * GROUP + heads) * NUM_SPLITS + split
        tl.store(mid_o_ptr + rows[:, None] * D + offs_d[None, :], o, mask=mask_g[:, None])
        tl.store(mid_lse_ptr + rows, m_i + tl.log2(l_i), mask=mask_g)


@triton.jit
def _decode_combine_kernel(
    mid_o_ptr, mid_lse_ptr, out_ptr,
    HQ,
    stride_ob, stride_oh, stride_od,
    D: tl.constexpr, NUM_SPLITS: tl.constexpr, USE_PDL: tl.constexpr,
):
    """One (sequence, query head): the splits' partial outputs weighted by 2^lse."""
    if USE_PDL:
        # launched early (programmatic dependent launch): wait until the split kernel's
        # partials are all written and visible
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0)
    b = row // HQ
    head = row % HQ
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, D)
    lse = tl.load(mid_lse_ptr + row.to(tl.int64) * NUM_SPLITS + offs_s)
    m = tl.max(lse, 0)
    # an empty sequence has every lse = -inf: its weights become 0 and its output 0
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    o = tl.load(mid_o_ptr + (row.to(tl.int64) * NUM_SPLITS + offs_s)[:, None] * D + offs_d[None, :])
    # the largest weight is 2^0 = 1 unless the sequence is empty
    out = tl.sum(w[:, None] * o, 0) / tl.maximum(tl.sum(w, 0), 1.0)
    out_ptrs = out_ptr + b.to(tl.int64) * stride_ob + head * stride_oh + offs_d * stride_od
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty))


def launch_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor | None,
    config: Config,
    sm_scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run both kernels with one explicit config (no lookup); shapes as in :func:`decode_attention`."""
    B, HQ, D = q.shape
    HKV = k_cache.shape[2]
    group = HQ // HKV
    meta = {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS}
    options = {k: v for k, v in config.items() if k in LAUNCH_OPTIONS}
    num_splits = meta["NUM_SPLITS"]
    scale = (1.0 / math.sqrt(D) if sm_scale is None else sm_scale) * math.log2(math.e)
    out = torch.empty_like(q) if out is None else out
    if num_splits > 1:
        mid_o = torch.empty((B * HQ, num_splits, D), device=q.device, dtype=torch.float32)
        mid_lse = torch.empty((B * HQ, num_splits), device=q.device, dtype=torch.float32)
    else:
        mid_o = mid_lse = out  # never touched when the first kernel writes the output
    paged = block_table is not None
    pdl = num_splits > 1 and q.is_cuda and _pdl_available(q.device.index)
    _decode_split_kernel[(B * HKV, num_splits)](
        q, k_cache, v_cache, seq_lens, block_table if paged else seq_lens, out, mid_o, mid_lse,
        scale, HKV,
        q.stride(0), q.stride(1), q.stride(2),
        *k_cache.stride(), *v_cache.stride(),
        block_table.stride(0) if paged else 0,
        out.stride(0), out.stride(1), out.stride(2),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), D=D,
        BLOCK_N=meta["BLOCK_N"], NUM_SPLITS=num_splits,
        PAGE=k_cache.shape[1] if paged else 0,
        DOT_IN_FP32=interpreting() and q.dtype == torch.bfloat16, USE_PDL=pdl,
        **options,
    )
    if num_splits > 1:
        # a tiny pass (NUM_SPLITS x D floats per program): the tuned launch options are the first kernel's
        _decode_combine_kernel[(B * HQ,)](
            mid_o, mid_lse, out, HQ, out.stride(0), out.stride(1), out.stride(2),
            D=D, NUM_SPLITS=num_splits, USE_PDL=pdl, num_warps=4, **({"launch_pdl": True} if pdl else {}),
        )
    return out


@functools.cache
def _pdl_available(device_index: int | None) -> bool:
    """Whether the combine kernel can start while the split kernel runs: programmatic dependent
    launch needs Hopper or newer and a Triton with ``launch_pdl`` and ``tl.extra.cuda.gdc_wait``."""
    if interpreting():
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    triton_has_it = "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {}) and hasattr(
        getattr(tl.extra, "cuda", None), "gdc_wait"
    )
    index = torch.cuda.current_device() if device_index is None else device_index
    return triton_has_it and torch.cuda.get_device_capability(index)[0] >= 9
