"""The fused MoE's two grouped GEMMs over the pairs sorted by expert (kernel/moe_routing.py).

``gate_up_silu``: h[slot] = silu(x[t] @ gate[e].T) * (x[t] @ up[e].T) for the pair in each
sorted slot; the [pairs, 2I] product is never written. ``down``: y[pair] = weight * h[slot] @
w2[e].T. Both launch a grid for the worst case and let the programs past the used tiles return,
so no size is read on the host. Tile sizes come per call (moe/configs.py). With TAIL_SPLIT 2
a tile whose pairs all lie in its first half (an expert's last tile) computes only that half;
with 4 also a tile whose pairs all lie in its first quarter computes only that quarter. Both
kernels hold a path for each height. ``sum_choices`` adds up each token's k rows of y.

The weight blocks, and the down GEMM's rows of h (contiguous in slot order), are read through
tensor descriptors: on Hopper one thread asks the TMA unit for a whole [rows, BLOCK_K] block, so
no registers hold addresses and masks for it, and reads past an edge come back as zeros. The
interpreter, and Triton on GPUs without TMA, get the same blocks from ordinary loads. Only x's
rows, one per pair's token and scattered, are gathered with pointers.
"""

from __future__ import annotations

from typing import Any, Dict

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

# The k-sum's tile (tokens, columns) and warps, chosen with benchmark/sweep_moe_launches.py.
SUM_BLOCK_T, SUM_BLOCK_H, SUM_WARPS = 1, 1024, 8


@triton.jit
def _tile_of(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Program pid's (tile row, tile column), GROUP_M rows at a time: programs that run together
    read the same few tile rows and, where an expert spans several tiles, the same weight
    columns, so more of their loads hit the L2 cache."""
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    return first_m + (pid % in_group) % group_rows, (pid % in_group) // group_rows


@triton.jit
def _gate_up_rows(
    x_ptr,
    w1_desc,
    h_ptr,
    sorted_ids_ptr,
    first,
    expert,
    pid_n,
    num_pairs,
    inter,
    hidden,
    stride_xm,
    stride_hm,
    TOP_K: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """h for the ROWS slots from ``first`` (all of one expert) and BLOCK_N columns: each step
    gathers ROWS token rows of x and takes the expert's gate and up blocks [BLOCK_N, BLOCK_K]
    from w1's descriptor (rows e * 2I + n and e * 2I + I + n), two products, one store."""
    slots = first + tl.arange(0, ROWS)
    pairs = tl.load(sorted_ids_ptr + slots)
    real = pairs < num_pairs  # padding slots compute zeros from masked loads
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + (pairs // TOP_K)[:, None] * stride_xm + offs_k[None, :]
    gate_row = (expert * 2 * inter + pid_n * BLOCK_N).to(tl.int32)
    gate = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for k in range(0, hidden, BLOCK_K):
        a = tl.load(x_ptrs, mask=real[:, None] & (offs_k < hidden - k)[None, :], other=0.0)
        gate = tl.dot(a, w1_desc.load([gate_row, k]).T, gate)
        up = tl.dot(a, w1_desc.load([gate_row + inter, k]).T, up)
        x_ptrs += BLOCK_K
    h = gate / (1.0 + tl.exp(-gate)) * up
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    h_ptrs = h_ptr + slots[:, None] * stride_hm + offs_n[None, :]
    tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=offs_n[None, :] < inter)


@triton.jit
def _padding_from(sorted_ids_ptr, slot, num_pairs, CHECK: tl.constexpr):
    """Whether the tile's slots from ``slot`` on are all padding (if CHECK): padding follows an
    expert's pairs in its last tile, so the slot's own content tells."""
    if CHECK:
        return tl.load(sorted_ids_ptr + slot) >= num_pairs
    return False


@triton.jit
def _gate_up_silu_kernel(
    x_ptr,
    w1_desc,
    h_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    num_pairs,
    inter,
    hidden,
    num_pid_m,
    stride_xm,
    stride_hm,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    TAIL_SPLIT: tl.constexpr,
):
    """h[slot, n] = silu(gate) * up for BLOCK_M sorted slots and BLOCK_N intermediate columns.
    A tile whose pairs fit in its first quarter (TAIL_SPLIT 4) or half (2 or 4) computes those
    rows only."""
    pid_m, pid_n = _tile_of(tl.program_id(0), num_pid_m, tl.cdiv(inter, BLOCK_N), GROUP_M)
    first = pid_m * BLOCK_M
    if first >= tl.load(num_padded_ptr):
        return  # a tile the worst case needed and this routing did not
    expert = tl.load(expert_ids_ptr + pid_m)
    if _padding_from(sorted_ids_ptr, first + BLOCK_M // 4, num_pairs, TAIL_SPLIT >= 4):
        _gate_up_rows(
            x_ptr,
            w1_desc,
            h_ptr,
            sorted_ids_ptr,
            first,
            expert,
            pid_n,
            num_pairs,
            inter,
            hidden,
            stride_xm,
            stride_hm,
            TOP_K,
            BLOCK_M // 4,
            BLOCK_N,
            BLOCK_K,
        )
    elif _padding_from(sorted_ids_ptr, first + BLOCK_M // 2, num_pairs, TAIL_SPLIT >= 2):
        _gate_up_rows(
            x_ptr,
            w1_desc,
            h_ptr,
            sorted_ids_ptr,
            first,
            expert,
            pid_n,
            num_pairs,
            inter,
            hidden,
            stride_xm,
            stride_hm,
            TOP_K,
            BLOCK_M // 2,
            BLOCK_N,
            BLOCK_K,
        )
    else:
        _gate_up_rows(
            x_ptr,
            w1_desc,
            h_ptr,
            sorted_ids_ptr,
            first,
            expert,
            pid_n,
            num_pairs,
            inter,
            hidden,
            stride_xm,
            stride_hm,
            TOP_K,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )


@triton.jit
def _down_rows(
    h_desc,
    w2_desc,
    y_ptr,
    weights_ptr,
    sorted_ids_ptr,
    first,
    expert,
    pid_n,
    num_pairs,
    hidden,
    inter,
    stride_ym,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """y for the pairs of the ROWS slots from ``first`` and BLOCK_N columns: h's rows are
    contiguous, so both operands come through descriptors."""
    # the pairs are loaded before the loop, so the load's latency hides behind the products
    # (loaded after it, the kernel took 12% longer at 4,096 tokens on the H200)
    pairs = tl.load(sorted_ids_ptr + first + tl.arange(0, ROWS))
    real = pairs < num_pairs
    w_row = (expert * hidden + pid_n * BLOCK_N).to(tl.int32)
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for k in range(0, inter, BLOCK_K):
        acc = tl.dot(h_desc.load([first, k]), w2_desc.load([w_row, k]).T, acc)
    acc *= tl.load(weights_ptr + pairs, mask=real, other=0.0)[:, None]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    y_ptrs = y_ptr + pairs[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=real[:, None] & (offs_n < hidden))


@triton.jit
def _down_kernel(
    h_desc,
    h_half_desc,
    h_quarter_desc,
    w2_desc,
    y_ptr,
    weights_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    num_pairs,
    hidden,
    inter,
    num_pid_m,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    TAIL_SPLIT: tl.constexpr,
):
    """y[pair, n] = weight[pair] * h[slot] @ w2[expert, n]: h's rows are read in slot order,
    the result goes back to the pair's own row. TAIL_SPLIT as above, with h's blocks of
    BLOCK_M / 2 and / 4 rows from their own descriptors."""
    pid_m, pid_n = _tile_of(tl.program_id(0), num_pid_m, tl.cdiv(hidden, BLOCK_N), GROUP_M)
    first = pid_m * BLOCK_M
    if first >= tl.load(num_padded_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m)
    if _padding_from(sorted_ids_ptr, first + BLOCK_M // 4, num_pairs, TAIL_SPLIT >= 4):
        _down_rows(
            h_quarter_desc,
            w2_desc,
            y_ptr,
            weights_ptr,
            sorted_ids_ptr,
            first,
            expert,
            pid_n,
            num_pairs,
            hidden,
            inter,
            stride_ym,
            BLOCK_M // 4,
            BLOCK_N,
            BLOCK_K,
        )
    elif _padding_from(sorted_ids_ptr, first + BLOCK_M // 2, num_pairs, TAIL_SPLIT >= 2):
        _down_rows(
            h_half_desc,
            w2_desc,
            y_ptr,
            weights_ptr,
            sorted_ids_ptr,
            first,
            expert,
            pid_n,
            num_pairs,
            hidden,
            inter,
            stride_ym,
            BLOCK_M // 2,
            BLOCK_N,
            BLOCK_K,
        )
    else:
        _down_rows(
            h_desc,
            w2_desc,
            y_ptr,
            weights_ptr,
            sorted_ids_ptr,
            first,
            expert,
            pid_n,
            num_pairs,
            hidden,
            inter,
            stride_ym,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )


@triton.jit
def _sum_choices_kernel(
    y_ptr,
    out_ptr,
    num_tokens,
    hidden,
    TOP_K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """out[t, n] = sum over j of y[t * k + j, n] for BLOCK_T tokens and BLOCK_H columns: the
    k loads are independent, so all are in flight at once."""
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = (tokens < num_tokens)[:, None] & (cols < hidden)[None, :]
    acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        rows = tokens * TOP_K + j
        acc += tl.load(y_ptr + rows[:, None] * hidden + cols[None, :], mask=ok).to(tl.float32)
    tl.store(
        out_ptr + tokens[:, None] * hidden + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=ok,
    )


def _launch_options(
    config: Dict[str, int], sorted_ids: torch.Tensor, expert_ids: torch.Tensor
) -> Dict[str, Any]:
    """The kernel's tile sizes: BLOCK_M is the alignment's (slots per tile), the rest config's.
    TAIL_SPLIT (optional: 1, the default, 2 or 4) needs BLOCK_M / TAIL_SPLIT of at least 16,
    tl.dot's fewest rows."""
    block_m, split = sorted_ids.numel() // expert_ids.numel(), config.get("TAIL_SPLIT", 1)
    if split not in (1, 2, 4) or (split > 1 and block_m // split < 16):
        raise ValueError(
            f"TAIL_SPLIT is 1, 2 or 4, with BLOCK_M / TAIL_SPLIT >= 16 (tl.dot's "
            f"fewest rows); got {split} with BLOCK_M {block_m}"
        )
    return dict(
        BLOCK_M=block_m,
        BLOCK_N=config["BLOCK_N"],
        BLOCK_K=config["BLOCK_K"],
        GROUP_M=config["GROUP_M"],
        TAIL_SPLIT=split,
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )


def _blocks_of(t: torch.Tensor, block_rows: int, block_k: int) -> TensorDescriptor:
    """A descriptor of t viewed as 2-D rows of its last dimension (contiguous: w1 [E, 2I, H] as
    [E * 2I, H]), read in blocks of [block_rows, block_k]; reads past an edge give zeros."""
    cols = t.shape[-1]
    if not t.is_contiguous() or (cols * t.element_size()) % 16:
        raise ValueError(
            f"a descriptor needs contiguous rows of a multiple of 16 bytes; got "
            f"{cols} {t.dtype} values"
        )
    return TensorDescriptor(t, [t.numel() // cols, cols], [cols, 1], [block_rows, block_k])


def gate_up_silu(
    x: torch.Tensor,
    w1: torch.Tensor,
    h: torch.Tensor,
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_padded: torch.Tensor,
    topk: int,
    config: Dict[str, int],
) -> None:
    """h [slots, I] = silu(x @ gate.T) * (x @ up.T), each slot's token and expert; x [T, H],
    w1 [E, 2I, H] (gate rows, then up rows); all contiguous. config: BLOCK_N, BLOCK_K, GROUP_M,
    num_warps, num_stages and optionally TAIL_SPLIT."""
    two_inter, hidden = w1.shape[1:]
    num_pid_m = expert_ids.numel()
    w1_desc = _blocks_of(w1, config["BLOCK_N"], config["BLOCK_K"])
    grid = (num_pid_m * triton.cdiv(two_inter // 2, config["BLOCK_N"]),)
    _gate_up_silu_kernel[grid](
        x,
        w1_desc,
        h,
        sorted_ids,
        expert_ids,
        num_padded,
        x.shape[0] * topk,
        two_inter // 2,
        hidden,
        num_pid_m,
        x.stride(0),
        h.stride(0),
        TOP_K=topk,
        **_launch_options(config, sorted_ids, expert_ids),
    )


def down(
    h: torch.Tensor,
    w2: torch.Tensor,
    y: torch.Tensor,
    weights: torch.Tensor,
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_padded: torch.Tensor,
    config: Dict[str, int],
) -> None:
    """y [pairs, H] = weight * h[slot] @ w2[expert].T for every pair; h [slots, I], w2 [E, H, I]
    contiguous, weights [pairs] fp32."""
    hidden, inter = w2.shape[1:]
    num_pid_m = expert_ids.numel()
    options = _launch_options(config, sorted_ids, expert_ids)
    block_m, block_k = options["BLOCK_M"], options["BLOCK_K"]
    grid = (num_pid_m * triton.cdiv(hidden, config["BLOCK_N"]),)
    _down_kernel[grid](
        _blocks_of(h, block_m, block_k),
        _blocks_of(h, max(block_m // 2, 1), block_k),
        _blocks_of(h, max(block_m // 4, 1), block_k),
        _blocks_of(w2, config["BLOCK_N"], block_k),
        y,
        weights,
        sorted_ids,
        expert_ids,
        num_padded,
        y.shape[0],
        hidden,
        inter,
        num_pid_m,
        y.stride(0),
        **options,
    )


def sum_choices(y: torch.Tensor, topk: int) -> torch.Tensor:
    """[T, H]: each token's k rows of y [T * k, H] (contiguous) added up, in fp32, in one pass
    over y (torch's sum over the middle dimension of [T, k, H] reads it more slowly)."""
    num_tokens, hidden = y.shape[0] // topk, y.shape[1]
    out = y.new_empty(num_tokens, hidden)
    grid = (triton.cdiv(num_tokens, SUM_BLOCK_T), triton.cdiv(hidden, SUM_BLOCK_H))
    _sum_choices_kernel[grid](
        y,
        out,
        num_tokens,
        hidden,
        TOP_K=topk,
        BLOCK_T=SUM_BLOCK_T,
        BLOCK_H=SUM_BLOCK_H,
        num_warps=SUM_WARPS,
    )
    return out
