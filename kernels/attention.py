"""Flash attention, forward and backward: O = softmax(Q K^T * sm_scale [+ causal mask]) V.

Q, K, V and O are (B, H, S, D), float16 or bfloat16, D in {64, 128}; any strides.

Forward (FlashAttention-2, Dao 2023; Triton tutorial 06): each program owns BLOCK_M query rows
of one (batch, head), keeps them in registers, and walks K and V in BLOCK_N steps with an
online softmax: running row max m_i, running sum l_i, and an fp32 accumulator rescaled by
exp2(m_old - m_new) whenever the max grows. Scores are scaled by sm_scale / ln 2 so the
exponentials are exp2. Causal attention splits the key loop in two: the off-band blocks left of
the diagonal block need no mask at all; only the on-band (diagonal) block is masked. The
forward also saves the natural log-sum-exp of each score row, LSE = m + ln l, for the backward.
Two tuned choices follow tutorial 06's Hopper path (Triton 3.4+): ``TMA`` loads Q, K, V and
stores O through on-device tensor descriptors, one per (batch, head), whose bounds replace the
masks; ``WS`` warp-specialises the unmasked key loop (``tl.range(..., warp_specialize=True)``).

Backward (tutorial 06's scheme): a preprocess kernel computes Delta = rowsum(O * dO); then, with
P = exp(S - LSE) recomputed from the saved LSE and dS = P * (dO V^T - Delta),
dV = P^T dO, dK = sm_scale dS^T Q (programs that own a K/V block walk the queries) and
dQ = sm_scale dS K (programs that own a Q block walk the keys). One launch holds both kinds of
programs, so neither needs atomics. ``TMA`` (tuned) streams the walked blocks (Q and dO, or K and
V) through on-device tensor descriptors, as the forward does.

Any S: when S is not a multiple of the largest block, a constexpr flag turns on masked loads and
the key mask; sequence lengths that are multiples pay for neither.

FLOPs: forward 4 B H S^2 D (two matmuls), half that when causal; backward 2.5x the forward
(five matmuls, one of them the recomputed Q K^T). Minimum bytes: forward reads Q, K, V and
writes O and LSE; backward reads Q, K, V, O, dO, LSE and writes dQ, dK, dV.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from tunesvc.device import interpreting
from tunesvc.kernels.matmul import _use_torch_allocator
from tunesvc.serving.launch import direct_launch
from tunesvc.serving.ops import kernel_op
from tunesvc.serving.ops import replayed
from tunesvc.serving.runtime import default_runtime
from tunesvc.space import LAUNCH_OPTIONS
from tunesvc.space import Config

# the template (torch-free, in tunesvc.templates) and its names, importable from here as before
from tunesvc.templates.attention import BWD_TEMPLATE as BWD_TEMPLATE
from tunesvc.templates.attention import HEAD_DIMS as HEAD_DIMS
from tunesvc.templates.attention import TEMPLATE as TEMPLATE
from tunesvc.templates.attention import AttentionBwdInputs as AttentionBwdInputs
from tunesvc.templates.attention import AttentionBwdTemplate as AttentionBwdTemplate
from tunesvc.templates.attention import AttentionInputs as AttentionInputs
from tunesvc.templates.attention import AttentionTemplate as AttentionTemplate

# Block rows of the backward's preprocess (Delta = rowsum(O * dO)): a bandwidth-bound pass
# far cheaper than the main kernel, so it is not part of the tuned space.
_PRE_BLOCK = 64


@triton.jit
def _attn_fwd_step(
    acc, l_i, m_i, q, k_src, v_src,
    stride_kn, stride_vn,
    start_n, qk_scale, S, offs_m, offs_n,
    MASK: tl.constexpr,  # 0: none, 1: causal (on-band block), 2: keys past S
    EVEN: tl.constexpr,  # every key of the block lies inside S: unmasked pointer loads
    TMA: tl.constexpr,  # k_src and v_src are tensor descriptors, else K^T and V pointer blocks
):  # fmt: skip
    """One BLOCK_N step of the online softmax over keys [start_n, start_n + BLOCK_N)."""
    if TMA:
        kT = k_src.load([start_n, 0]).T
    elif EVEN:
        kT = tl.load(k_src + start_n * stride_kn)
    else:
        kT = tl.load(k_src + start_n * stride_kn, mask=(start_n + offs_n)[None, :] < S, other=0.0)
    qk = tl.dot(q, kT.to(q.dtype))
    if MASK == 1:
        keep = offs_m[:, None] >= (start_n + offs_n[None, :])
        qk = qk * qk_scale + tl.where(keep, 0, -1.0e6)
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        qk -= m_ij[:, None]
    elif MASK == 2:
        keep = (start_n + offs_n[None, :]) < S
        qk = qk * qk_scale + tl.where(keep, 0, -1.0e6)
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        qk -= m_ij[:, None]
    else:
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_ij[:, None]
    p = tl.math.exp2(qk)
    alpha = tl.math.exp2(m_i - m_ij)
    l_ij = tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if TMA:
        v = v_src.load([start_n, 0])
    elif EVEN:
        v = tl.load(v_src + start_n * stride_vn)
    else:
        v = tl.load(v_src + start_n * stride_vn, mask=(start_n + offs_n)[:, None] < S, other=0.0)
    acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc)
    # l_i last, as tutorial 06 does: fewer values live across the second dot
    l_i = l_i * alpha + l_ij
    return acc, l_i, m_ij


@triton.jit
def _attn_fwd_inner(
    acc, l_i, m_i, q, k_src, v_src,
    stride_kn, stride_vn,
    lo, hi, qk_scale, S, offs_m, offs_n,
    BLOCK_N: tl.constexpr, MASK: tl.constexpr, EVEN: tl.constexpr, TMA: tl.constexpr,
    WS: tl.constexpr,  # warp-specialise the loop: producer warps issue the TMA loads
):  # fmt: skip
    if WS:
        # only compiled where tl.range takes the flag (the space's has_ws)
        for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=True):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            acc, l_i, m_i = _attn_fwd_step(
                acc, l_i, m_i, q, k_src, v_src,
                stride_kn, stride_vn,
                start_n, qk_scale, S, offs_m, offs_n,
                MASK, EVEN, TMA,
            )  # fmt: skip
    else:
        for start_n in range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            acc, l_i, m_i = _attn_fwd_step(
                acc, l_i, m_i, q, k_src, v_src,
                stride_kn, stride_vn,
                start_n, qk_scale, S, offs_m, offs_n,
                MASK, EVEN, TMA,
            )  # fmt: skip
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, O, LSE, sm_scale,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_oz, stride_oh, stride_om, stride_od,
    H, S,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, EVEN_S: tl.constexpr,
    TMA: tl.constexpr, WS: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):  # fmt: skip
    start_m = tl.program_id(0)
    if CAUSAL:
        # later query blocks have the most keys to walk: start them first, for load balance
        start_m = tl.num_programs(0) - 1 - start_m
    off_hz = tl.program_id(1)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    Q += off_z * stride_qz + off_h * stride_qh
    K += off_z * stride_kz + off_h * stride_kh
    V += off_z * stride_vz + off_h * stride_vh
    O += off_z * stride_oz + off_h * stride_oh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    if TMA:
        # One descriptor per (batch, head), built on the device (tutorial 06's Hopper path): the
        # TMA engine zero-fills rows past S on loads and drops them on stores, so no masks.
        q_desc = tl.make_tensor_descriptor(
            Q, shape=[S, HEAD_DIM], strides=[stride_qm, 1], block_shape=[BLOCK_M, HEAD_DIM]
        )
        k_src = tl.make_tensor_descriptor(
            K, shape=[S, HEAD_DIM], strides=[stride_kn, 1], block_shape=[BLOCK_N, HEAD_DIM]
        )
        v_src = tl.make_tensor_descriptor(
            V, shape=[S, HEAD_DIM], strides=[stride_vn, 1], block_shape=[BLOCK_N, HEAD_DIM]
        )
        o_desc = tl.make_tensor_descriptor(
            O, shape=[S, HEAD_DIM], strides=[stride_om, 1], block_shape=[BLOCK_M, HEAD_DIM]
        )
        q = q_desc.load([start_m * BLOCK_M, 0])
    else:
        q_ptrs = Q + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
        k_src = K + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd  # K^T block
        v_src = V + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
        if EVEN_S:
            q = tl.load(q_ptrs)
        else:
            q = tl.load(q_ptrs, mask=offs_m[:, None] < S, other=0.0)
    if DOT_IN_FP32:
        # Triton's CPU interpreter computes bf16 dots wrongly (seen with Triton 3.9);
        # only the interpreter sets this flag. Every other operand follows q's type.
        q = q.to(tl.float32)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504  # 1 / ln 2: exp(x) = exp2(x / ln 2)

    if CAUSAL:
        # off-band: key blocks wholly left of the diagonal, all inside S, never masked
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_src, v_src,
            stride_kn, stride_vn,
            0, start_m * BLOCK_M, qk_scale, S, offs_m, offs_n,
            BLOCK_N, 0, True, TMA, WS,
        )  # fmt: skip
        # on-band: the diagonal block, causally masked
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_src, v_src,
            stride_kn, stride_vn,
            start_m * BLOCK_M, (start_m + 1) * BLOCK_M, qk_scale, S, offs_m, offs_n,
            BLOCK_N, 1, EVEN_S, TMA, False,
        )  # fmt: skip
    elif EVEN_S:
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_src, v_src,
            stride_kn, stride_vn,
            0, S, qk_scale, S, offs_m, offs_n,
            BLOCK_N, 0, True, TMA, WS,
        )  # fmt: skip
    else:
        # whole key blocks unmasked, then the ragged last block (if any) with the key mask
        full = (S // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_src, v_src,
            stride_kn, stride_vn,
            0, full, qk_scale, S, offs_m, offs_n,
            BLOCK_N, 0, True, TMA, WS,
        )  # fmt: skip
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_src, v_src,
            stride_kn, stride_vn,
            full, S, qk_scale, S, offs_m, offs_n,
            BLOCK_N, 2, False, TMA, False,
        )  # fmt: skip

    m_i += tl.math.log2(l_i)
    acc = acc / l_i[:, None]
    lse_ptrs = LSE + off_hz * S + offs_m
    lse = m_i * 0.6931471805599453  # back to natural log: ln 2 * log2
    if EVEN_S:
        tl.store(lse_ptrs, lse)
    else:
        tl.store(lse_ptrs, lse, mask=offs_m < S)
    if TMA:
        o_desc.store([start_m * BLOCK_M, 0], acc.to(O.dtype.element_ty))
    elif EVEN_S:
        tl.store(O + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, acc.to(O.dtype.element_ty))
    else:
        o_ptrs = O + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
        tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=offs_m[:, None] < S)


def _split(config: Config) -> tuple[dict[str, int], dict[str, int]]:
    # the attention spaces hold integers only
    meta = {k: int(v) for k, v in config.items() if k not in LAUNCH_OPTIONS}
    options = {k: int(v) for k, v in config.items() if k in LAUNCH_OPTIONS}
    return meta, options


def _tma_ready(t: torch.Tensor) -> bool:
    """TMA needs unit stride along D and 16-byte aligned base, (batch, head) and row strides."""
    size = t.element_size()
    return t.stride(3) == 1 and all(s * size % 16 == 0 for s in t.stride()[:3]) and t.data_ptr() % 16 == 0


def launch_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    config: Config,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel with one explicit config: (O, LSE), LSE float32 of shape (B, H, S).

    A config with TMA=1 falls back to pointer loads with the same tiles when a tensor's rows are
    not 16-byte aligned (a sliced or padded layout); configs stored before TMA/WS are TMA=WS=0.
    """
    B, H, S, D = q.shape
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    o = torch.empty_like(q)
    lse = torch.empty((B, H, S), device=q.device, dtype=torch.float32)
    meta, options = _split(config)
    meta = {"TMA": 0, "WS": 0, **meta}
    if meta["TMA"] and not all(_tma_ready(t) for t in (q, k, v, o)):
        meta["TMA"] = meta["WS"] = 0
    if meta["TMA"] and q.is_cuda:
        _use_torch_allocator()
    # Query blocks on axis 0 run side by side and share their head's K and V in L2 (at S=4096,
    # D=128, 132 SMs hold the blocks of ~4 heads: 8 MiB of K and V); heads on axis 0 would put
    # all B * H heads' K and V (256 MiB at B=4, H=32) in flight, far past the 50 MB L2.
    grid = (triton.cdiv(S, meta["BLOCK_M"]), B * H)
    _attn_fwd_kernel[grid](
        q, k, v, o, lse, sm_scale,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, S,
        HEAD_DIM=D, **meta, CAUSAL=causal,
        EVEN_S=S % max(meta["BLOCK_M"], meta["BLOCK_N"]) == 0,
        DOT_IN_FP32=interpreting() and q.dtype == torch.bfloat16, **options,
    )  # fmt: skip
    return o, lse


@triton.jit
def _attn_bwd_preprocess(
    O, DO, Delta,
    stride_oz, stride_oh, stride_om, stride_od,
    stride_dz, stride_dh, stride_dm, stride_dd,
    H, S,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    off_hz = tl.program_id(1)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < S
    o = tl.load(
        O + off_z * stride_oz + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
        mask=rows,
        other=0.0,
    )
    do = tl.load(
        DO + off_z * stride_dz + off_h * stride_dh + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd,
        mask=rows,
        other=0.0,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(Delta + off_hz * S + offs_m, delta, mask=offs_m < S)


@triton.jit
def _attn_bwd_dkdv(
    dk, dv, k, v, Q, DO, LSE, Delta,
    stride_qm, stride_qd,
    stride_dm, stride_dd,
    S, qk_scale, start_n, start_m, num_steps,
    BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, HEAD_DIM: tl.constexpr,
    MASK: tl.constexpr,  # causal mask (the diagonal blocks)
    EVEN: tl.constexpr,  # every query block lies inside S: unmasked loads
    TMA: tl.constexpr,  # Q and DO are tensor descriptors (rows past S read as zeros)
):  # fmt: skip
    offs_n = start_n + tl.arange(0, BLOCK_N1)
    offs_d = tl.arange(0, HEAD_DIM)
    curr_m = start_m
    for _ in range(num_steps):
        offs_m = curr_m + tl.arange(0, BLOCK_M1)
        if TMA:
            qT = Q.load([curr_m, 0]).T
            do = DO.load([curr_m, 0])
        elif EVEN:
            qT = tl.load(Q + offs_m[None, :] * stride_qm + offs_d[:, None] * stride_qd)
            do = tl.load(DO + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd)
        else:
            # rows past S: zero Q and dO (and below LSE = +inf, so that their P is exactly 0)
            in_s = offs_m < S
            qT = tl.load(Q + offs_m[None, :] * stride_qm + offs_d[:, None] * stride_qd, mask=in_s[None, :], other=0.0)
            do = tl.load(DO + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd, mask=in_s[:, None], other=0.0)
        if EVEN:
            lse = tl.load(LSE + offs_m)
            Di = tl.load(Delta + offs_m)
        else:
            in_s = offs_m < S
            lse = tl.load(LSE + offs_m, mask=in_s, other=float("inf"))
            Di = tl.load(Delta + offs_m, mask=in_s, other=0.0)
        qT = qT.to(k.dtype)
        do = do.to(k.dtype)
        qkT = tl.dot(k, qT)
        pT = tl.math.exp2(qkT * qk_scale - lse[None, :] * 1.4426950408889634)
        if MASK:
            pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        dv += tl.dot(pT.to(k.dtype), do)
        dpT = tl.dot(v, tl.trans(do))
        dsT = pT * (dpT - Di[None, :])
        dk += tl.dot(dsT.to(k.dtype), tl.trans(qT))
        curr_m += BLOCK_M1
    return dk, dv


@triton.jit
def _attn_bwd_dq(
    dq, q, do, lse2, Di, K, V,
    stride_kn, stride_kd,
    stride_vn, stride_vd,
    S, qk_scale, start_m, start_n, num_steps,
    BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, HEAD_DIM: tl.constexpr,
    MASK: tl.constexpr,  # 0: none, 1: causal (the diagonal blocks), 2: keys past S
    EVEN: tl.constexpr,  # every key block lies inside S: unmasked loads
    TMA: tl.constexpr,  # K and V are tensor descriptors (rows past S read as zeros)
):  # fmt: skip
    offs_m = start_m + tl.arange(0, BLOCK_M2)
    offs_d = tl.arange(0, HEAD_DIM)
    curr_n = start_n
    for _ in range(num_steps):
        offs_n = curr_n + tl.arange(0, BLOCK_N2)
        if TMA:
            kT = K.load([curr_n, 0]).T
            vT = V.load([curr_n, 0]).T
        elif EVEN:
            kT = tl.load(K + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd)
            vT = tl.load(V + offs_n[None, :] * stride_vn + offs_d[:, None] * stride_vd)
        else:
            kT = tl.load(
                K + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd, mask=offs_n[None, :] < S, other=0.0
            )
            vT = tl.load(
                V + offs_n[None, :] * stride_vn + offs_d[:, None] * stride_vd, mask=offs_n[None, :] < S, other=0.0
            )
        kT = kT.to(q.dtype)
        vT = vT.to(q.dtype)
        qk = tl.dot(q, kT)
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASK == 1:
            p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        elif MASK == 2:
            p = tl.where(offs_n[None, :] < S, p, 0.0)
        dp = tl.dot(do, vT)
        ds = p * (dp - Di[:, None])
        dq += tl.dot(ds.to(q.dtype), tl.trans(kT))
        curr_n += BLOCK_N2
    return dq


@triton.jit
def _attn_bwd_kernel(
    Q, K, V, DO, DQ, DK, DV, LSE, Delta, sm_scale,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_dz, stride_dh, stride_dm, stride_dd,
    stride_gz, stride_gh, stride_gm, stride_gd,  # dQ, dK and dV share one layout
    H, S,
    HEAD_DIM: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_M2: tl.constexpr,
    BLOCK_N2: tl.constexpr, CAUSAL: tl.constexpr, EVEN_S: tl.constexpr, TMA: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    Q += off_z * stride_qz + off_h * stride_qh
    K += off_z * stride_kz + off_h * stride_kh
    V += off_z * stride_vz + off_h * stride_vh
    DO += off_z * stride_dz + off_h * stride_dh
    grad_offset = off_z * stride_gz + off_h * stride_gh
    LSE += off_hz * S
    Delta += off_hz * S
    qk_scale = sm_scale * 1.4426950408889634  # 1 / ln 2
    offs_d = tl.arange(0, HEAD_DIM)
    num_kv_blocks = tl.cdiv(S, BLOCK_N1)

    if pid < num_kv_blocks:
        # this program owns keys [start_n, start_n + BLOCK_N1): dK and dV, walking the queries
        start_n = pid * BLOCK_N1
        offs_n = start_n + tl.arange(0, BLOCK_N1)
        k_ptrs = K + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
        v_ptrs = V + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
        if EVEN_S:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        else:
            k = tl.load(k_ptrs, mask=offs_n[:, None] < S, other=0.0)
            v = tl.load(v_ptrs, mask=offs_n[:, None] < S, other=0.0)
        if DOT_IN_FP32:
            # Triton's CPU interpreter computes bf16 dots wrongly (seen with Triton 3.9);
            # only the interpreter sets this flag. Every other operand follows k's type.
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        dk = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
        if TMA:
            # the streamed Q and dO blocks through descriptors, as the forward streams K and V
            q_src = tl.make_tensor_descriptor(
                Q, shape=[S, HEAD_DIM], strides=[stride_qm, 1], block_shape=[BLOCK_M1, HEAD_DIM]
            )
            do_src = tl.make_tensor_descriptor(
                DO, shape=[S, HEAD_DIM], strides=[stride_dm, 1], block_shape=[BLOCK_M1, HEAD_DIM]
            )
        else:
            q_src = Q
            do_src = DO
        if CAUSAL:
            # queries before start_n see none of these keys; the diagonal blocks are masked
            dk, dv = _attn_bwd_dkdv(
                dk, dv, k, v, q_src, do_src, LSE, Delta,
                stride_qm, stride_qd,
                stride_dm, stride_dd,
                S, qk_scale, start_n, start_n, BLOCK_N1 // BLOCK_M1,
                BLOCK_M1, BLOCK_N1, HEAD_DIM, True, EVEN_S, TMA,
            )  # fmt: skip
            start_m = start_n + BLOCK_N1
            dk, dv = _attn_bwd_dkdv(
                dk, dv, k, v, q_src, do_src, LSE, Delta,
                stride_qm, stride_qd,
                stride_dm, stride_dd,
                S, qk_scale, start_n, start_m, tl.cdiv(S - start_m, BLOCK_M1),
                BLOCK_M1, BLOCK_N1, HEAD_DIM, False, EVEN_S, TMA,
            )  # fmt: skip
        else:
            dk, dv = _attn_bwd_dkdv(
                dk, dv, k, v, q_src, do_src, LSE, Delta,
                stride_qm, stride_qd,
                stride_dm, stride_dd,
                S, qk_scale, start_n, 0, tl.cdiv(S, BLOCK_M1),
                BLOCK_M1, BLOCK_N1, HEAD_DIM, False, EVEN_S, TMA,
            )  # fmt: skip
        dk *= sm_scale
        dk_ptrs = DK + grad_offset + offs_n[:, None] * stride_gm + offs_d[None, :] * stride_gd
        dv_ptrs = DV + grad_offset + offs_n[:, None] * stride_gm + offs_d[None, :] * stride_gd
        if EVEN_S:
            tl.store(dk_ptrs, dk.to(DK.dtype.element_ty))
            tl.store(dv_ptrs, dv.to(DV.dtype.element_ty))
        else:
            tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=offs_n[:, None] < S)
            tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=offs_n[:, None] < S)
    else:
        # this program owns queries [start_m, start_m + BLOCK_M2): dQ, walking the keys
        start_m = (pid - num_kv_blocks) * BLOCK_M2
        offs_m = start_m + tl.arange(0, BLOCK_M2)
        q_ptrs = Q + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
        do_ptrs = DO + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd
        if EVEN_S:
            q = tl.load(q_ptrs)
            do = tl.load(do_ptrs)
            lse = tl.load(LSE + offs_m)
            Di = tl.load(Delta + offs_m)
        else:
            in_s = offs_m < S
            q = tl.load(q_ptrs, mask=in_s[:, None], other=0.0)
            do = tl.load(do_ptrs, mask=in_s[:, None], other=0.0)
            lse = tl.load(LSE + offs_m, mask=in_s, other=float("inf"))
            Di = tl.load(Delta + offs_m, mask=in_s, other=0.0)
        if DOT_IN_FP32:
            q = q.to(tl.float32)
        do = do.to(q.dtype)
        lse2 = lse * 1.4426950408889634  # in log2 units, like the exponent
        dq = tl.zeros([BLOCK_M2, HEAD_DIM], dtype=tl.float32)
        if TMA:
            k_src = tl.make_tensor_descriptor(
                K, shape=[S, HEAD_DIM], strides=[stride_kn, 1], block_shape=[BLOCK_N2, HEAD_DIM]
            )
            v_src = tl.make_tensor_descriptor(
                V, shape=[S, HEAD_DIM], strides=[stride_vn, 1], block_shape=[BLOCK_N2, HEAD_DIM]
            )
        else:
            k_src = K
            v_src = V
        if CAUSAL:
            # the diagonal blocks, masked; then every key block left of them, unmasked
            dq = _attn_bwd_dq(
                dq, q, do, lse2, Di, k_src, v_src,
                stride_kn, stride_kd,
                stride_vn, stride_vd,
                S, qk_scale, start_m, start_m, BLOCK_M2 // BLOCK_N2,
                BLOCK_M2, BLOCK_N2, HEAD_DIM, 1, EVEN_S, TMA,
            )  # fmt: skip
            dq = _attn_bwd_dq(
                dq, q, do, lse2, Di, k_src, v_src,
                stride_kn, stride_kd,
                stride_vn, stride_vd,
                S, qk_scale, start_m, 0, start_m // BLOCK_N2,
                BLOCK_M2, BLOCK_N2, HEAD_DIM, 0, True, TMA,
            )  # fmt: skip
        else:
            if EVEN_S:
                dq = _attn_bwd_dq(
                    dq, q, do, lse2, Di, k_src, v_src,
                    stride_kn, stride_kd,
                    stride_vn, stride_vd,
                    S, qk_scale, start_m, 0, tl.cdiv(S, BLOCK_N2),
                    BLOCK_M2, BLOCK_N2, HEAD_DIM, 0, True, TMA,
                )  # fmt: skip
            else:
                dq = _attn_bwd_dq(
                    dq, q, do, lse2, Di, k_src, v_src,
                    stride_kn, stride_kd,
                    stride_vn, stride_vd,
                    S, qk_scale, start_m, 0, tl.cdiv(S, BLOCK_N2),
                    BLOCK_M2, BLOCK_N2, HEAD_DIM, 2, False, TMA,
                )  # fmt: skip
        dq *= sm_scale
        dq_ptrs = DQ + grad_offset + offs_m[:, None] * stride_gm + offs_d[None, :] * stride_gd
        if EVEN_S:
            tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty))
        else:
            tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=offs_m[:, None] < S)


def launch_attention_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    config: Config,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Run the backward with one explicit config: dQ, dK, dV stacked in one (3, B, H, S, D) tensor.

    ``lse`` is the forward's log-sum-exp (float32, (B, H, S), contiguous). A config with TMA=1
    falls back to pointer loads where a tensor's rows are not 16-byte aligned; configs stored
    before TMA existed are TMA=0.
    """
    B, H, S, D = q.shape
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    grads = torch.empty((3, B, H, S, D), device=q.device, dtype=q.dtype)
    delta = torch.empty_like(lse)
    _attn_bwd_preprocess[(triton.cdiv(S, _PRE_BLOCK), B * H)](
        o, do, delta,
        *o.stride(), *do.stride(),
        H, S,
        HEAD_DIM=D, BLOCK_M=_PRE_BLOCK,
    )  # fmt: skip
    meta, options = _split(config)
    meta = {"TMA": 0, **meta}
    if meta["TMA"] and not all(_tma_ready(t) for t in (q, k, v, do)):
        meta["TMA"] = 0
    if meta["TMA"] and q.is_cuda:
        _use_torch_allocator()
    grid = (triton.cdiv(S, meta["BLOCK_N1"]) + triton.cdiv(S, meta["BLOCK_M2"]), B * H)
    _attn_bwd_kernel[grid](
        q, k, v, do, grads[0], grads[1], grads[2], lse, delta, sm_scale,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *grads[0].stride(),
        H, S,
        HEAD_DIM=D, **meta, CAUSAL=causal,
        EVEN_S=S % max(meta["BLOCK_N1"], meta["BLOCK_M2"]) == 0,
        DOT_IN_FP32=interpreting() and q.dtype == torch.bfloat16, **options,
    )  # fmt: skip
    return grads


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    do: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """Float32 attention by its definition: (O, LSE), or (dQ, dK, dV) by autograd when ``do`` is given.

    A few heads of one batch element at a time, so that the S x S score matrices stay near
    ``_REFERENCE_BYTES`` (at S=7000 one head's are 196 MB; all 64 heads' with autograd's saved
    copies held over 50 GiB, which with the timed inputs beside them ran an H200 out of memory).
    """
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    B, H, S, _ = q.shape
    heads = max(1, _REFERENCE_BYTES // (4 * S * S))
    above = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1) if causal else None
    results: list[tuple[torch.Tensor, ...]] = []
    for b in range(B):
        parts: list[tuple[torch.Tensor, ...]] = []
        for h in range(0, H, heads):
            with torch.enable_grad():
                qb, kb, vb = (t[b, h : h + heads].float().requires_grad_(do is not None) for t in (q, k, v))
                scores = (qb @ kb.transpose(-1, -2)) * sm_scale
                if above is not None:
                    scores = scores.masked_fill(above, float("-inf"))
                lse = torch.logsumexp(scores, dim=-1)
                out = torch.softmax(scores, dim=-1) @ vb
                if do is None:
                    parts.append((out.detach(), lse.detach()))
                else:
                    parts.append(torch.autograd.grad(out, (qb, kb, vb), do[b, h : h + heads].float()))
        results.append(tuple(torch.cat(p) for p in zip(*parts)))
    return tuple(torch.stack(p) for p in zip(*results))


#: score bytes (float32) the reference computes at once, per step over heads
_REFERENCE_BYTES = 1 << 30


# a hit launches the compiled kernel directly (tunesvc.serving.launch); the templates hash the same sources
_attn_fwd_kernel = direct_launch(_attn_fwd_kernel)
_attn_bwd_preprocess = direct_launch(_attn_bwd_preprocess)
_attn_bwd_kernel = direct_launch(_attn_bwd_kernel)


def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op tunesvc::attention: O and LSE with the tuned config."""
    runtime = default_runtime()
    key = (TEMPLATE, q.shape, causal, q.dtype, index := q.get_device())
    config = runtime.launch_configs.get(key)
    if config is None:
        B, H, S, D = q.shape
        config = runtime.tuned(key, index, TEMPLATE, B=B, H=H, S=S, D=D, causal=causal, dtype=q.dtype)
    return launch_attention(q, k, v, config, causal=causal, sm_scale=sm_scale)


def _attention_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    causal: bool,
    sm_scale: float,
) -> torch.Tensor:
    """The op tunesvc::attention_bwd: dQ, dK, dV stacked in one (3, B, H, S, D) tensor."""
    runtime = default_runtime()
    key = (BWD_TEMPLATE, q.shape, causal, q.dtype, index := q.get_device())
    config = runtime.launch_configs.get(key)
    if config is None:
        B, H, S, D = q.shape
        config = runtime.tuned(key, index, BWD_TEMPLATE, B=B, H=H, S=S, D=D, causal=causal, dtype=q.dtype)
    return launch_attention_bwd(q, k, v, o, lse, do, config, causal=causal, sm_scale=sm_scale)


def _attention_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, k, v, ctx.causal, ctx.sm_scale = inputs
    ctx.save_for_backward(q, k, v, *output)
    # LSE is for the backward, not the caller: no gradient flows into it
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _attention_backward(ctx: Any, do: torch.Tensor, *_: Any) -> tuple[torch.Tensor | None, ...]:
    q, k, v, o, lse = ctx.saved_tensors
    grads = _attention_bwd_op.call(q, k, v, o, lse, do, ctx.causal, ctx.sm_scale)
    return grads[0], grads[1], grads[2], None, None


def _attention_fake(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


_attention_op = kernel_op("attention", _attention, _attention_fake)
_attention_bwd_op = kernel_op(
    "attention_bwd",
    _attention_bwd,
    lambda q, k, v, o, lse, do, causal, sm_scale: q.new_empty((3, *q.shape)),
)
_attention_op.register_autograd(_attention_backward, _attention_setup)


@replayed
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """softmax(Q K^T * sm_scale) V with the tuned configs for this device and shape; differentiable.

    Q, K, V are (B, H, S, D) of one dtype (float16 or bfloat16) on one device, D 64 or 128, any
    strides. ``causal`` masks keys after each query; ``sm_scale`` defaults to 1 / sqrt(D).
    """
    if q.ndim != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            f"attention needs Q, K and V of one shape (B, H, S, D); got {tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"attention needs Q, K and V of one dtype; got {q.dtype}, {k.dtype} and {v.dtype}")
    index = q.get_device()  # an int (-1 off CUDA): no torch.device made per call on the GPU
    if not index == k.get_device() == v.get_device() or (index < 0 and not q.device == k.device == v.device):
        raise ValueError(f"attention needs Q, K and V on one device; got {q.device}, {k.device} and {v.device}")
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    o, _ = _attention_op.call(q, k, v, bool(causal), sm_scale, grad_inputs=(q, k, v))
    return o
