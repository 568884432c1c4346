"""GEMM: C = A @ B, in five variants the search chooses between per shape (``VARIANT``).

- ``grouped``: one program per BLOCK_M x BLOCK_N tile of C, walking K in BLOCK_K steps with a
  float32 accumulator. Programs are numbered so that GROUP_M consecutive tile-rows are swept
  column by column: the A and B tiles a group needs stay in L2 instead of being re-read from
  device memory (Triton tutorial 03, "L2 cache optimizations"). Configs stored before
  VARIANT existed are this kernel.
- ``persistent``: one program per SM, each walking tiles in the same grouped order (Triton
  tutorial 09): no tail wave of half-empty launches when the tile count is not a multiple of
  the SM count.
- ``tma``: persistent, loading A and B through tensor descriptors (Hopper's TMA engine, Triton
  3.4+ ``tl.make_tensor_descriptor``). TMA needs 16-byte aligned rows; an operand without them
  (e.g. A with K=777 in bf16) is first copied into a row-padded buffer, which costs one pass
  over it but turns every later load into an aligned bulk copy. FLATTEN = 1 compiles its tile
  and K loops as one software pipeline, overlapping each tile's epilogue with the next one's
  first loads; SUBTILE = 1 stores C in two halves (tutorial 09's epilogue subtiling).
- ``splitk``: for small M and large K, where the tiles alone leave most SMs idle: SPLIT_K
  programs per tile each sum one slice of K into a float32 workspace and count their arrival
  on the tile's counter; the last to arrive adds the slices in a fixed order (s = 0, 1, ...)
  and writes C. One launch (a second, reducing kernel cost a Triton launch of host time and a
  kernel's latency on the GPU), and the result is the same whichever program finishes last.
- ``splittail``: the TMA kernel where the tiles leave a partial last wave (e.g. 192 tiles on
  132 SMs: two waves, the second half empty): the tiles of the last one or two waves run as
  slices of K, summed as split-K sums them, so that all programs end at about the same time.

Masks make any M, N, K valid. The pointer kernels (grouped, persistent, split-K) load a tile as
pipelined vectors only where Triton can tell its rows are 16-element aligned: with M > 64, an
operand whose strides or sizes do not allow it is first copied into padded rows (_pointer_operands).
FLOPs = 2 M N K; minimum bytes = (M K + K N + M N) * element size.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tunesvc.device import current_device
from tunesvc.device import interpreting
from tunesvc.errors import TunesvcError
from tunesvc.serving import runtime as _runtime
from tunesvc.serving.launch import direct_launch
from tunesvc.serving.launch import use_torch_allocator
from tunesvc.serving.ops import config_arg
from tunesvc.serving.ops import config_of
from tunesvc.serving.ops import kernel_op
from tunesvc.serving.ops import replayed
from tunesvc.space import LAUNCH_OPTIONS
from tunesvc.space import Config

# the template (torch-free, in tunesvc.templates) and its names, importable from here as before
from tunesvc.templates.matmul import TEMPLATE as TEMPLATE
from tunesvc.templates.matmul import MatmulTemplate as MatmulTemplate
from tunesvc.templates.matmul import tail_split as tail_split

VARIANTS = ("grouped", "persistent", "tma", "splitk", "splittail")
#: the TMA kernel's loop options (see _matmul_tma_kernel); 0, their first choice, where a config lacks them
_TMA_LOOP = ("FLATTEN", "SUBTILE")


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of a tile number in grouped order (GROUP_M tile-rows per column sweep)."""
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _dot_step(a, b, acc, DOT_IN_FP32: tl.constexpr):
    if DOT_IN_FP32:
        # Triton's CPU interpreter computes bf16 dots wrongly (seen with Triton 3.9);
        # only the interpreter sets this flag.
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc)


@triton.jit
def _tile_dot(
    a_ptr, b_ptr,
    pid_m, pid_n, M, NB, k_start, k_end,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, TAIL_ONLY: tl.constexpr,
):  # fmt: skip
    """float32 sum over k in [k_start, k_end) of A[tile rows, k] * B[k, tile columns].

    Tile loads are pipelined vector loads only where Triton can tell they are contiguous and
    aligned (see _loadable): the contiguous dimension's index neither masked nor wrapped
    modulo a size it cannot divide by 16. So B's columns wrap modulo ``NB``: N, or the width
    of the padded copy _pointer_operands made of B (columns past N are loaded, never stored);
    and when the range is not whole BLOCK_K steps (EVEN_K False), operands that are loadable
    (TAIL_ONLY) are masked along K in the last step alone, others in every step (the last
    step alone made skinny GEMMs of unaligned operands up to 2x slower on an H100).
    """
    # Rows/columns past the edge wrap (modulo) so loads stay in bounds without a mask on M/N;
    # the store is masked, so the wrapped values are never written.
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % NB
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + (k_start + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + (k_start + offs_k)[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if EVEN_K or TAIL_ONLY:
        # a split-K slice past the end of K is empty (k_start > k_end): no step at all
        k_whole = k_end if EVEN_K else k_start + max(k_end - k_start, 0) // BLOCK_K * BLOCK_K
        for k in range(k_start, k_whole, BLOCK_K):  # noqa: B007 (the count is the loop)
            acc = _dot_step(tl.load(a_ptrs), tl.load(b_ptrs), acc, DOT_IN_FP32)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        if not EVEN_K:  # noqa: SIM102 (a constexpr branch: Triton compiles the runtime test only where it is needed)
            if k_whole < k_end:
                k_remaining = k_end - k_whole
                a = tl.load(a_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
                b = tl.load(b_ptrs, mask=offs_k[:, None] < k_remaining, other=0.0)
                acc = _dot_step(a, b, acc, DOT_IN_FP32)
    else:
        for k in range(k_start, k_end, BLOCK_K):
            k_remaining = k_end - k
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_remaining, other=0.0)
            acc = _dot_step(a, b, acc, DOT_IN_FP32)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def _store_tile(c_ptr, c, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=mask)


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K, NB,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, EVEN_K: tl.constexpr = False, TAIL_ONLY: tl.constexpr = False,
):  # fmt: skip
    pid_m, pid_n = _tile_coords(tl.program_id(axis=0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    acc = _tile_dot(
        a_ptr, b_ptr,
        pid_m, pid_n, M, NB, 0, K,
        stride_am, stride_ak,
        stride_bk, stride_bn,
        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, DOT_IN_FP32, TAIL_ONLY,
    )  # fmt: skip
    _store_tile(c_ptr, acc.to(c_ptr.dtype.element_ty), pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)


@triton.jit
def _matmul_persistent_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K, NB,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, EVEN_K: tl.constexpr = False, TAIL_ONLY: tl.constexpr = False,
):  # fmt: skip
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile_id in range(tl.program_id(axis=0), num_pid_m * num_pid_n, NUM_SMS):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        acc = _tile_dot(
            a_ptr, b_ptr,
            pid_m, pid_n, M, NB, 0, K,
            stride_am, stride_ak,
            stride_bk, stride_bn,
            BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, DOT_IN_FP32, TAIL_ONLY,
        )  # fmt: skip
        _store_tile(c_ptr, acc.to(c_ptr.dtype.element_ty), pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)


@triton.jit
def _tma_tile(
    a_desc, b_desc, c_desc, c_ptr,
    tile_id, tile_id_c, num_pid_m, num_pid_n, k_tiles, M, N,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    C_DESCRIPTOR: tl.constexpr, SUBTILE: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):  # fmt: skip
    """One tile of C: tile ``tile_id``'s sum over K, stored at tile ``tile_id_c``'s place (the same
    tile, counted apart so that a flattened loop's epilogue does not depend on its prologue)."""
    pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, k_tiles):
        a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        b = b_desc.load([k * BLOCK_K, pid_n * BLOCK_N])
        acc = _dot_step(a, b, acc, DOT_IN_FP32)
    pid_m, pid_n = _tile_coords(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
    if C_DESCRIPTOR:
        if SUBTILE:
            # the tile stored as two halves of BLOCK_N / 2 columns: half the shared memory staged
            # for the store, which the pipeline can spend on a stage more (Triton tutorial 09)
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], left.to(c_ptr.dtype.element_ty))
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2], right.to(c_ptr.dtype.element_ty))
        else:
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))
    else:
        _store_tile(c_ptr, acc.to(c_ptr.dtype.element_ty), pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)


@triton.jit
def _matmul_tma_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_bk,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
    C_DESCRIPTOR: tl.constexpr, DOT_IN_FP32: tl.constexpr, FLATTEN: tl.constexpr = 0, SUBTILE: tl.constexpr = 0,
):  # fmt: skip
    """Persistent: program p walks tiles p, p + NUM_SMS, ... in grouped order. FLATTEN: the tile
    loop and the K loop are one software pipeline (tl.range(..., flatten=True), Triton 3.3+), so
    the next tile's first loads are in flight during this one's epilogue (tutorial 09); SUBTILE:
    C is stored in two halves (see _tma_tile)."""
    # Descriptors know the true extents: loads past M, N or K are zero-filled by the hardware
    # and stores past them are dropped, so no masks are needed.
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1], block_shape=[BLOCK_K, BLOCK_N])
    c_desc = b_desc  # unused unless C_DESCRIPTOR (a value Triton can type in both branches)
    if C_DESCRIPTOR:
        c_desc = tl.make_tensor_descriptor(
            c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N // (1 + SUBTILE)]
        )
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles = num_pid_m * num_pid_n
    pid = tl.program_id(axis=0)
    if FLATTEN:
        tile_id_c = pid - NUM_SMS
        for tile_id in tl.range(pid, tiles, NUM_SMS, flatten=True):
            tile_id_c += NUM_SMS
            _tma_tile(
                a_desc, b_desc, c_desc, c_ptr, tile_id, tile_id_c, num_pid_m, num_pid_n, k_tiles, M, N,
                stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, C_DESCRIPTOR, SUBTILE, DOT_IN_FP32,
            )  # fmt: skip
    else:
        for tile_id in range(pid, tiles, NUM_SMS):
            _tma_tile(
                a_desc, b_desc, c_desc, c_ptr, tile_id, tile_id, num_pid_m, num_pid_n, k_tiles, M, N,
                stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, C_DESCRIPTOR, SUBTILE, DOT_IN_FP32,
            )  # fmt: skip


@triton.jit
def _matmul_splitk_kernel(
    a_ptr, b_ptr, c_ptr, partial_ptr, arrivals_ptr,
    M, N, K, NB,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, EVEN_K: tl.constexpr = False, TAIL_ONLY: tl.constexpr = False,
):  # fmt: skip
    """Program (tile, s) writes partial[s] = A[tile rows, slice s of K] @ B[slice s of K, tile
    columns]; the tile's last program to arrive writes C = sum over s of partial[s], in order.

    The arrival counter is the only communication between programs: each program's partial is
    stored before its arrival is counted (release), and the last program reads the partials
    after it has seen every arrival (acquire), bypassing L1 (``.cg``), which is not coherent
    between SMs. No program waits for another, so any launch order is safe. The last program
    also sets the counter back to 0 (no other program of this launch touches it again), so the
    next launch on the same buffer finds it zeroed without a memset.
    """
    tile = tl.program_id(axis=0)
    pid_m, pid_n = _tile_coords(tile, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    split = tl.program_id(axis=1)
    # slices are whole BLOCK_K steps, so only the last slice meets the edge of K
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_start = split * k_per_split
    k_end = min(K, k_start + k_per_split)
    acc = _tile_dot(
        a_ptr, b_ptr,
        pid_m, pid_n, M, NB, k_start, k_end,
        stride_am, stride_ak,
        stride_bk, stride_bn,
        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, DOT_IN_FP32, TAIL_ONLY,
    )  # fmt: skip
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tile_offs = offs_m[:, None] * N + offs_n[None, :]
    tl.store(partial_ptr + split * M * N + tile_offs, acc, mask=mask)
    tl.debug_barrier()  # every thread's stores, before the one thread that counts the arrival
    if tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel") == SPLIT_K - 1:
        tl.store(arrivals_ptr + tile, 0)
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            total += tl.load(partial_ptr + s * M * N + tile_offs, mask=mask, other=0.0, cache_modifier=".cg")
        _store_tile(c_ptr, total.to(c_ptr.dtype.element_ty), pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)


@triton.jit
def _matmul_splittail_kernel(
    a_ptr, b_ptr, c_ptr, partial_ptr, arrivals_ptr,
    M, N, K,
    stride_am, stride_bk,
    stride_cm, stride_cn,
    WHOLE_TILES, SLICES,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    C_DESCRIPTOR: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):  # fmt: skip
    """The TMA kernel's first ``WHOLE_TILES`` tiles (grouped order), one per program in turn;
    then each remaining tile as ``SLICES`` slices of K, one per program in turn, summed as
    split-K sums its slices: each slice goes to the tile's slot in ``partial``, its arrival is
    counted on the tile's counter, and the last to arrive adds the slices in order, writes C
    (so the result does not depend on which finishes first) and zeroes the counter.

    The slices are handed out slice-major: programs that run at once walk the same range of K
    of neighbouring tiles and share their A and B blocks in L2, as the whole tiles do. (Equal
    contiguous shares of all the steps, stream-K's, put each program at another K and ran the
    tail 1.5-2x slower on an H100: every block came from device memory.)
    """
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1], block_shape=[BLOCK_K, BLOCK_N])
    if C_DESCRIPTOR:
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    pid = tl.program_id(axis=0)
    programs = tl.num_programs(axis=0)
    for tile_id in range(pid, WHOLE_TILES, programs):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
            b = b_desc.load([k * BLOCK_K, pid_n * BLOCK_N])
            if DOT_IN_FP32:
                # the interpreter's bf16 dot is wrong (see _tile_dot)
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc)
        c = acc.to(c_ptr.dtype.element_ty)
        if C_DESCRIPTOR:
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], c)
        else:
            _store_tile(c_ptr, c, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
    split = tiles - WHOLE_TILES
    per_slice = tl.cdiv(k_tiles, SLICES)
    piece = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    for unit in range(pid, split * SLICES, programs):
        s = unit // split
        t = unit - s * split
        tile_id = WHOLE_TILES + t
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(s * per_slice, min(k_tiles, (s + 1) * per_slice)):
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
            b = b_desc.load([k * BLOCK_K, pid_n * BLOCK_N])
            if DOT_IN_FP32:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc)
        tl.store(partial_ptr + (t * SLICES + s) * BLOCK_M * BLOCK_N + piece, acc)
        tl.debug_barrier()  # every thread's stores, before the one thread that counts the arrival
        if tl.atomic_add(arrivals_ptr + t, 1, sem="acq_rel") == SLICES - 1:
            tl.store(arrivals_ptr + t, 0)
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for j in range(0, SLICES):
                total += tl.load(partial_ptr + (t * SLICES + j) * BLOCK_M * BLOCK_N + piece, cache_modifier=".cg")
            c = total.to(c_ptr.dtype.element_ty)
            if C_DESCRIPTOR:
                c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], c)
            else:
                _store_tile(c_ptr, c, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)


#: On-device tensor descriptors need global scratch memory, which Triton asks the host for, in
#: every thread that launches (the autograd engine runs backwards on its own): see tunesvc.serving.launch
_use_torch_allocator = use_torch_allocator


def _tma_ready(t: torch.Tensor) -> bool:
    """TMA needs unit stride along rows, and 16-byte aligned row starts and base address."""
    return t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0


def _aligned_copy(t: torch.Tensor) -> torch.Tensor:
    """t copied into a buffer whose rows are padded to 16 bytes (the padding is never read)."""
    rows, cols = t.shape
    per_16_bytes = 16 // t.element_size()
    padded = torch.empty(rows, triton.cdiv(cols, per_16_bytes) * per_16_bytes, device=t.device, dtype=t.dtype)
    view = padded[:, :cols]
    view.copy_(t)
    return view


# Split-K's arrival counters, one buffer per (device, stream), zeroed once: the kernel leaves
# them zeroed, so a call costs no memset (on the GPU a kernel's latency, in a CUDA graph a node).
# Per stream because launches in flight at once must not share counters (a bounded set: torch
# hands out streams round-robin from a fixed pool per device); buffers outgrown are kept, never
# freed, since a CUDA graph captured with one still addresses it.
_ARRIVALS: dict[tuple[torch.device, int], list[torch.Tensor]] = {}


def _arrivals(device: torch.device, tiles: int) -> torch.Tensor:
    """A zeroed int32 counter per tile, reused by every split-K launch on the current stream."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    buffers = _ARRIVALS.setdefault((device, stream), [])
    if not buffers or buffers[-1].numel() < tiles:
        # under graph capture the zeroing is captured too (it runs at each replay of that graph)
        buffers.append(torch.zeros(max(tiles, 1024), device=device, dtype=torch.int32))
    return buffers[-1]


def _loadable(t: torch.Tensor, wrapped: int) -> bool:
    """Whether the pointer kernels load ``t`` as pipelined vectors: one unit stride, the other a
    multiple of 16 elements (what Triton specialises on), a 16-byte aligned start, and, where the
    contiguous dimension is the one that wraps modulo its size (``wrapped``: 0 for A's rows, 1 for
    B's columns), that size a multiple of 16. On an H100, a GEMM whose operand missed one of
    these ran 3-11x slower (1024x3072x1024 bf16: 14-15 us; with A's rows 1032 apart, or N=3000: 45-170 us)."""
    if t.data_ptr() % 16:
        return False
    for contiguous, other in ((1, 0), (0, 1)):
        if t.stride(contiguous) == 1 and t.stride(other) % 16 == 0:
            return contiguous != wrapped or t.shape[contiguous] % 16 == 0
    return False


def _padded_copy(t: torch.Tensor, zero: bool) -> torch.Tensor:
    """t copied row-major into a buffer whose rows are a multiple of 16 elements (a view of its
    first columns); ``zero``: the padding is zeroed (B's is loaded, then dropped: never garbage)."""
    rows, cols = t.shape
    padded = torch.empty(rows, triton.cdiv(cols, 16) * 16, device=t.device, dtype=t.dtype)
    padded[:, :cols].copy_(t)
    if zero:
        padded[:, cols:].zero_()
    return padded[:, :cols]


def _pointer_operands(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int, bool]:
    """A and B as the pointer kernels load them, B's width as loaded, and whether both are
    loadable (see _loadable: then K is masked in the last step alone).

    With M > 64 an operand that is not loadable is copied (one pass over it), but for B with
    unit-stride columns (a transposed weight whose K is not a multiple of 16) only from M = 512:
    its loads are vectors of a few elements and cost it 2-4x, not 10x, and on an H100 the copy
    took longer than that at 200x3000x1000 and less at 777x3000x1000. A is copied only where B
    ends up loadable: else K is masked in every step, and A's loads along K are not vectors
    anyway. With M <= 64 the GEMM streams B once and is memory-bound: a copy of B would triple
    its traffic, and one of A costs more in launches than its loads (1x50257x4096 bf16 took
    twice as long with B copied, 1x3000x1000 1.7x as long with A copied).
    B's copy keeps its padding columns in the load width, so that its columns wrap modulo a
    multiple of 16."""
    nb = b.shape[1]
    b_loadable = _loadable(b, 1)
    if not b_loadable and a.shape[0] > (511 if b.stride(0) == 1 else 64):
        b = _padded_copy(b, zero=True)
        nb, b_loadable = b.stride(0), True
    if a.shape[0] > 64 and b_loadable and not _loadable(a, 0):
        a = _padded_copy(a, zero=False)
    return a, b, nb, b_loadable and _loadable(a, 0)


def launch_matmul(a: torch.Tensor, b: torch.Tensor, config: Config, out: torch.Tensor | None = None) -> torch.Tensor:
    """Run the kernel of ``config["VARIANT"]`` (grouped when absent) with one explicit config (no lookup)."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype) if out is None else out
    variant = config.get("VARIANT", "grouped")
    blocks = {
        k: v for k, v in config.items() if k not in LAUNCH_OPTIONS and k not in ("VARIANT", "SPLIT_K", *_TMA_LOOP)
    }
    options = {k: v for k, v in config.items() if k in LAUNCH_OPTIONS}
    dot_in_fp32 = interpreting() and a.dtype == torch.bfloat16
    tiles = triton.cdiv(M, blocks["BLOCK_M"]) * triton.cdiv(N, blocks["BLOCK_N"])
    # split-K slices are whole BLOCK_K steps too, so K alone decides
    even_k = K % blocks["BLOCK_K"] == 0  # type: ignore[operator]
    nb, tail_only = N, False
    if variant in ("grouped", "persistent", "splitk"):
        a, b, nb, tail_only = _pointer_operands(a, b)
    if variant == "grouped":
        _matmul_kernel[(tiles,)](
            a, b, c, M, N, K, nb,
            a.stride(0), a.stride(1),
            b.stride(0), b.stride(1),
            c.stride(0), c.stride(1),
            **blocks, DOT_IN_FP32=dot_in_fp32, EVEN_K=even_k, TAIL_ONLY=tail_only, **options,
        )  # fmt: skip
    elif variant == "persistent":
        num_sms = current_device().sm_count
        _matmul_persistent_kernel[(min(num_sms, tiles),)](
            a, b, c, M, N, K, nb,
            a.stride(0), a.stride(1),
            b.stride(0), b.stride(1),
            c.stride(0), c.stride(1),
            **blocks, NUM_SMS=num_sms, DOT_IN_FP32=dot_in_fp32, EVEN_K=even_k, TAIL_ONLY=tail_only, **options,
        )  # fmt: skip
    elif variant == "tma":
        if a.is_cuda:
            _use_torch_allocator()
        a_tma = a if _tma_ready(a) else _aligned_copy(a)
        b_tma = b if _tma_ready(b) else _aligned_copy(b)
        num_sms = current_device().sm_count
        _matmul_tma_kernel[(min(num_sms, tiles),)](
            a_tma, b_tma, c, M, N, K,
            a_tma.stride(0), b_tma.stride(0),
            c.stride(0), c.stride(1),
            **blocks, NUM_SMS=num_sms, C_DESCRIPTOR=_tma_ready(c), DOT_IN_FP32=dot_in_fp32,
            **{name: config.get(name, 0) for name in _TMA_LOOP}, **options,
        )  # fmt: skip
    elif variant == "splitk":
        split_k = config["SPLIT_K"]
        partial = torch.empty((split_k, M, N), device=a.device, dtype=torch.float32)  # type: ignore[arg-type]
        arrivals = _arrivals(a.device, tiles)
        _matmul_splitk_kernel[(tiles, split_k)](
            a, b, c, partial, arrivals, M, N, K, nb,
            a.stride(0), a.stride(1),
            b.stride(0), b.stride(1),
            c.stride(0), c.stride(1),
            **blocks, SPLIT_K=split_k, DOT_IN_FP32=dot_in_fp32, EVEN_K=even_k, TAIL_ONLY=tail_only, **options,
        )  # fmt: skip
    elif variant == "splittail":
        if a.is_cuda:
            _use_torch_allocator()
        a_tma = a if _tma_ready(a) else _aligned_copy(a)
        b_tma = b if _tma_ready(b) else _aligned_copy(b)
        num_sms = current_device().sm_count
        whole, slices = tail_split(tiles, triton.cdiv(K, blocks["BLOCK_K"]), blocks["BLOCK_K"], num_sms)  # type: ignore[arg-type]
        split = tiles - whole
        partial = torch.empty(
            (split * slices, blocks["BLOCK_M"] * blocks["BLOCK_N"]),  # type: ignore[arg-type, operator]
            device=a.device,
            dtype=torch.float32,
        )
        _matmul_splittail_kernel[(min(num_sms, max(whole, split * slices)),)](
            a_tma, b_tma, c, partial, _arrivals(a.device, split), M, N, K,
            a_tma.stride(0), b_tma.stride(0),
            c.stride(0), c.stride(1),
            whole, slices,
            **blocks, C_DESCRIPTOR=_tma_ready(c), DOT_IN_FP32=dot_in_fp32, **options,
        )  # fmt: skip
    else:
        raise TunesvcError(f"matmul config has VARIANT={variant!r}; use one of {', '.join(VARIANTS)}.")
    return c


# a hit launches the compiled kernel directly (tunesvc.serving.launch); the templates hash the same sources
_matmul_kernel = direct_launch(_matmul_kernel)
_matmul_persistent_kernel = direct_launch(_matmul_persistent_kernel)
_matmul_tma_kernel = direct_launch(_matmul_tma_kernel)
_matmul_splitk_kernel = direct_launch(_matmul_splitk_kernel)
_matmul_splittail_kernel = direct_launch(_matmul_splittail_kernel)


@replayed
def matmul(a: torch.Tensor, b: torch.Tensor, *, config: Config | None = None) -> torch.Tensor:
    """C = A @ B with the tuned config for this device and shape (see :func:`tunesvc.lookup`).

    A is (M, K), B is (K, N), both float16, bfloat16 or float32 on the same device; any strides.
    """
    if not _is_compiling():
        # eager (no backward: the op's dispatcher would only add host time): a hit replays the
        # launch of the first call with these operands' shapes, strides and dtypes
        if config is not None:
            _check_operands(a, b)
        return _matmul_op.eager(a, b, config_arg(config))
    _check_operands(a, b)
    return _matmul_op.op(a, b, config_arg(config))  # torch.compile sees the op tunesvc::matmul (no graph break)


_is_compiling = torch.compiler.is_compiling


def _check_operands(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul needs A (M, K) and B (K, N); got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise ValueError(f"matmul needs A and B of one dtype; got {a.dtype} and {b.dtype}")


def _remember(runtime: _runtime.Runtime, a: torch.Tensor, b: torch.Tensor) -> Config:
    """First call with these shapes and dtypes: check the operands, look the config up, keep it."""
    _check_operands(a, b)
    key = (TEMPLATE, a.shape, b.shape, a.dtype, b.dtype, index := a.get_device())
    return runtime.tuned(key, index, TEMPLATE, M=a.shape[0], N=b.shape[1], K=a.shape[1], dtype=a.dtype)


def _matmul(a: torch.Tensor, b: torch.Tensor, config: str) -> torch.Tensor:
    """The op tunesvc::matmul: the tuned config (config "", one dict get on a hit) or the given one."""
    explicit = config_of(config)
    if explicit is None:
        runtime = _runtime.default_runtime()
        explicit = runtime.launch_configs.get(
            (TEMPLATE, a.shape, b.shape, a.dtype, b.dtype, a.get_device())
        ) or _remember(runtime, a, b)
    return launch_matmul(a, b, explicit)


_matmul_op = kernel_op("matmul", _matmul, lambda a, b, config: a.new_empty((a.shape[0], b.shape[1])))
