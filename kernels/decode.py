"""Decode attention: one query token per sequence against a KV cache (flash-decoding).

For each sequence b of length L_b and query head h, with kv head g(h) = h // (HQ / HKV)
(grouped-query attention, torch's ``enable_gqa`` convention):

    out[b, h] = softmax(q[b, h] . K[b, :L_b, g(h)]^T * sm_scale) @ V[b, :L_b, g(h)]

A query of length 1 gives each (sequence, kv head) pair one row of work, far too few programs
to fill a GPU at small batch. So the sequence is cut into NUM_SPLITS chunks, each its own
program, which writes a partial result (the chunk's normalised output and its log-sum-exp);
a second kernel combines the chunks: out = sum_s 2^(lse_s - max) o_s / sum_s 2^(lse_s - max)
(Dao et al., "Flash-Decoding for long-context inference", 2023). Each program loads a KV tile
once for all HQ / HKV query heads of its group, so GQA reads the cache once, not HQ / HKV times.
With NUM_SPLITS = 1 the first kernel writes the output itself and the combine is skipped.

The cache is either contiguous, (B, S_max, HKV, D), or paged, (num_pages, page_size, HKV, D)
with a (B, pages_per_seq) block table giving each sequence's pages in order (vLLM's layout).
Paged is a problem option rather than a second template: the same kernel with a constexpr
address path, tuned under its own keys.

FLOPs = 4 HQ D sum(L_b); minimum bytes = K and V read once (2 HKV D sum(L_b) elements) plus
q and out (2 B HQ D elements).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from tunesvc.device import interpreting
from tunesvc.serving.launch import direct_launch
from tunesvc.serving.ops import config_arg
from tunesvc.serving.ops import config_of
from tunesvc.serving.ops import kernel_op
from tunesvc.serving.ops import replayed
from tunesvc.serving.runtime import default_runtime
from tunesvc.space import LAUNCH_OPTIONS
from tunesvc.space import Config

# the template (torch-free, in tunesvc.templates) and its names, importable from here as before
from tunesvc.templates.decode import PAGE_SIZE as PAGE_SIZE
from tunesvc.templates.decode import TEMPLATE as TEMPLATE
from tunesvc.templates.decode import DecodeTemplate as DecodeTemplate


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, seq_lens_ptr, block_table_ptr, out_ptr, mid_o_ptr, mid_lse_ptr,
    qk_scale, HKV,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_bt,  # the block table's rows (paged caches)
    stride_ob, stride_oh, stride_od,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    PAGE: tl.constexpr, DOT_IN_FP32: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
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
        mask=mask_g[:, None],
        other=0.0,
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
    if PAGE > 0:
        # each tile's pages are read one tile ahead: the K and V loads then never wait on the
        # block table's load in the same step
        pages_of = block_table_ptr + b * stride_bt
        offs_next = start + tl.arange(0, BLOCK_N)
        next_page = tl.load(pages_of + offs_next // PAGE, mask=offs_next < end, other=0)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        if PAGE > 0:
            page = next_page.to(tl.int64)
            offs_next = offs_n + BLOCK_N
            next_page = tl.load(pages_of + offs_next // PAGE, mask=offs_next < end, other=0)
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
    mid_o_ptr, mid_lse_ptr, out_ptr, HQ,
    stride_ob, stride_oh, stride_od,
    D: tl.constexpr, NUM_SPLITS: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
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
    if num_splits > 1:  # type: ignore[operator]
        mid_o = torch.empty((B * HQ, num_splits, D), device=q.device, dtype=torch.float32)  # type: ignore[arg-type]
        mid_lse = torch.empty((B * HQ, num_splits), device=q.device, dtype=torch.float32)  # type: ignore[arg-type]
    else:
        mid_o = mid_lse = out  # never touched when the first kernel writes the output
    paged = block_table is not None
    pdl = num_splits > 1 and q.is_cuda and _pdl_available(q.device.index)  # type: ignore[operator]
    _decode_split_kernel[(B * HKV, num_splits)](
        q, k_cache, v_cache, seq_lens, block_table if paged else seq_lens, out, mid_o, mid_lse,
        scale, HKV,
        q.stride(0), q.stride(1), q.stride(2),
        *k_cache.stride(), *v_cache.stride(),
        block_table.stride(0) if paged else 0,  # type: ignore[union-attr]
        out.stride(0), out.stride(1), out.stride(2),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), D=D, BLOCK_N=meta["BLOCK_N"],
        NUM_SPLITS=num_splits, PAGE=k_cache.shape[1] if paged else 0,
        DOT_IN_FP32=interpreting() and q.dtype == torch.bfloat16, USE_PDL=pdl, **options,
    )  # fmt: skip
    if num_splits > 1:  # type: ignore[operator]
        # a tiny pass (NUM_SPLITS x D floats per program): the tuned launch options are the first kernel's
        _decode_combine_kernel[(B * HQ,)](
            mid_o, mid_lse, out, HQ,
            out.stride(0), out.stride(1), out.stride(2),
            D=D, NUM_SPLITS=num_splits, USE_PDL=pdl, num_warps=4,
            **({"launch_pdl": True} if pdl else {}),
        )  # fmt: skip
    return out


# a hit launches the compiled kernel directly (tunesvc.serving.launch); the templates hash the same sources
_decode_split_kernel = direct_launch(_decode_split_kernel)
_decode_combine_kernel = direct_launch(_decode_combine_kernel)


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


def decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor | None = None,
    *,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """The float32 torch answer, on a dense (B, S, HKV, D) view of the cache with padding masked."""
    B, HQ, D = q.shape
    if block_table is not None:
        k_cache = k_cache[block_table.long()].flatten(1, 2)
        v_cache = v_cache[block_table.long()].flatten(1, 2)
    HKV, S = k_cache.shape[2], k_cache.shape[1]
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    qg = q.float().view(B, HKV, HQ // HKV, D)
    scores = torch.einsum("bkgd,bskd->bkgs", qg, k_cache.float()) * scale
    padding = torch.arange(S, device=q.device)[None, :] >= seq_lens[:, None].to(q.device)
    scores = scores.masked_fill(padding[:, None, None, :], float("-inf"))
    out = torch.einsum("bkgs,bskd->bkgd", scores.softmax(-1), v_cache.float())
    return out.reshape(B, HQ, D)


@replayed
def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    block_table: torch.Tensor | None = None,
    sm_scale: float | None = None,
    config: Config | None = None,
) -> torch.Tensor:
    """Attention of one new query token per sequence over its KV cache, with the tuned config.

    q is (B, HQ, D); k_cache and v_cache are (B, S_max, HKV, D), any strides, or with
    ``block_table`` ((B, pages_per_seq) integers) paged as (num_pages, page_size, HKV, D);
    seq_lens (B integers) gives each sequence's length, from 1 to its capacity (not checked:
    that would synchronise with the GPU). HQ must be a multiple of HKV (grouped-query attention); sm_scale defaults to
    1/sqrt(D). Returns (B, HQ, D) in q's dtype.
    """
    if q.ndim != 3 or k_cache.ndim != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"decode_attention needs q (B, HQ, D) and k_cache, v_cache of one 4-d shape; "
            f"got {tuple(q.shape)}, {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    B, HQ, D = q.shape
    HKV = k_cache.shape[2]
    if k_cache.shape[3] != D or HQ % HKV:
        raise ValueError(
            f"decode_attention needs the caches' head dim to be q's ({D}) and HQ ({HQ}) a multiple of "
            f"their KV heads ({HKV}); got caches of {tuple(k_cache.shape)}"
        )
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(
            f"decode_attention needs q, k_cache and v_cache of one dtype; "
            f"got {q.dtype}, {k_cache.dtype} and {v_cache.dtype}"
        )
    if seq_lens.shape != (B,) or seq_lens.dtype.is_floating_point or seq_lens.dtype == torch.bool:
        raise ValueError(
            f"decode_attention needs seq_lens as B={B} integers; got {seq_lens.dtype} of shape {tuple(seq_lens.shape)}"
        )
    if block_table is None:
        if k_cache.shape[0] != B:
            raise ValueError(
                f"decode_attention needs a contiguous cache of B={B} sequences; got {k_cache.shape[0]} "
                "(paged caches need block_table)"
            )
    elif block_table.ndim != 2 or block_table.shape[0] != B or block_table.dtype.is_floating_point:
        raise ValueError(
            f"decode_attention needs block_table as integers of shape (B={B}, pages_per_seq); "
            f"got {block_table.dtype} of shape {tuple(block_table.shape)}"
        )
    tensors = (q, k_cache, v_cache, seq_lens) if block_table is None else (q, k_cache, v_cache, seq_lens, block_table)
    index = q.get_device()  # an int (-1 off CUDA): no torch.device made per call on the GPU
    if not all(t.get_device() == index for t in tensors) or (index < 0 and len({t.device for t in tensors}) != 1):
        devices = ", ".join(str(t.device) for t in tensors)
        raise ValueError(f"decode_attention needs every tensor on one device; got {devices}")
    return _decode_op.call(q, k_cache, v_cache, seq_lens, block_table, sm_scale, config_arg(config))


def _decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor | None,
    sm_scale: float | None,
    config: str,
) -> torch.Tensor:
    """The op tunesvc::decode: the tuned config (config "") or the given one, launched."""
    explicit = config_of(config)
    if explicit is None:
        runtime = default_runtime()
        paged = block_table is not None
        pages = block_table.shape[1] if block_table is not None else 0
        key = (TEMPLATE, q.shape, k_cache.shape, pages, q.dtype, index := q.get_device())
        explicit = runtime.launch_configs.get(key)
        if explicit is None:
            B, HQ, D = q.shape
            # the key takes the cache's capacity, not max(seq_lens), which would synchronise with the GPU
            capacity = k_cache.shape[1] * (pages if paged else 1)
            explicit = runtime.tuned(
                key, index, TEMPLATE, B=B, HQ=HQ, HKV=k_cache.shape[2], S=capacity, D=D, paged=paged, dtype=q.dtype
            )
    return launch_decode(q, k_cache, v_cache, seq_lens, block_table, explicit, sm_scale=sm_scale)


_decode_op = kernel_op(
    "decode",
    _decode,
    lambda q, k_cache, v_cache, seq_lens, block_table, sm_scale, config: torch.empty_like(q),
)
