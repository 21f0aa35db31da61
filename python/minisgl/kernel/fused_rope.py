"""Qwen3's per-head RMSNorm of q and k and the rotary embedding, in one Triton kernel that rotates
q and k in place where the qkv GEMM wrote them: one launch a layer, where torch launches about
19 kernels for the rotation and two for the norms.

The formulas are the torch path's, rounding included: the norm (``layers/norm.py``, ``rms_norm``)
normalizes in float32, rounds to the model's dtype and scales by the weight in that dtype; the
rotation (``layers/rotary.py``, ``_rotate``) works in float32 and rounds once at the end.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_halves(x1, x2, weight, cols, half, eps):
    """RMSNorm of heads held as two halves, x1 = dims [0, D/2) and x2 = dims [D/2, D), each
    [BLOCK_H, BLOCK_HALF]; weight: [D]. Returns the halves normed and scaled, in x's dtype."""
    dtype = x1.dtype
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    mean_square = (tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)) / (2 * half)  # padding adds 0
    rstd = tl.rsqrt(mean_square + eps)[:, None]
    w1 = tl.load(weight + cols, mask=cols < half, other=0.0).to(tl.float32)
    w2 = tl.load(weight + half + cols, mask=cols < half, other=0.0).to(tl.float32)
    n1 = (a * rstd).to(dtype).to(tl.float32)  # rounded before the weight, as torch's path does
    n2 = (b * rstd).to(dtype).to(tl.float32)
    return (n1 * w1[None, :]).to(dtype), (n2 * w2[None, :]).to(dtype)


@triton.jit
def _norm_rotate_heads(
    x,
    token,
    stride_tok,
    stride_head,
    num_heads,
    weight,
    cos,
    sin,
    cols,
    half,
    eps,
    HAS_NORM: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Token ``token``'s heads of x ([T, heads, D], last dim contiguous), normed if HAS_NORM,
    then rotated in the neox layout (dim i pairs with dim i + D/2) and stored back in place.
    cos, sin: [BLOCK_HALF] float32, this token's angles."""
    heads = tl.arange(0, BLOCK_H)
    mask = (heads[:, None] < num_heads) & (cols[None, :] < half)
    first = x + token * stride_tok + heads[:, None] * stride_head + cols[None, :]  # [0, D/2)
    x1 = tl.load(first, mask=mask, other=0.0)
    x2 = tl.load(first + half, mask=mask, other=0.0)
    if HAS_NORM:
        x1, x2 = _rms_norm_halves(x1, x2, weight, cols, half, eps)
    dtype = x1.dtype
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(first, (a * cos[None, :] - b * sin[None, :]).to(dtype), mask=mask)
    tl.store(first + half, (b * cos[None, :] + a * sin[None, :]).to(dtype), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(
    q,
    k,
    positions,
    cos_sin_cache,
    q_weight,
    k_weight,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_cache,
    num_q_heads,
    num_k_heads,
    half,
    eps,
    HAS_NORM: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """One program handles one token: every head of q, then every head of k. cos_sin_cache:
    [max_position, D] float32, cos in the first half, sin in the second. BLOCK_HALF is D/2
    rounded up to a power of two (D = 80 or 96 leaves padding); the masks keep it out."""
    token = tl.program_id(0).to(tl.int64)  # int64: token * stride overflows int32 in prefills
    position = tl.load(positions + token).to(tl.int64)
    cols = tl.arange(0, BLOCK_HALF)
    angles = cos_sin_cache + position * stride_cache + cols
    cos = tl.load(angles, mask=cols < half, other=0.0)
    sin = tl.load(angles + half, mask=cols < half, other=0.0)
    _norm_rotate_heads(
        q,
        token,
        stride_q_tok,
        stride_q_head,
        num_q_heads,
        q_weight,
        cos,
        sin,
        cols,
        half,
        eps,
        HAS_NORM,
        BLOCK_HQ,
    )
    _norm_rotate_heads(
        k,
        token,
        stride_k_tok,
        stride_k_head,
        num_k_heads,
        k_weight,
        cos,
        sin,
        cols,
        half,
        eps,
        HAS_NORM,
        BLOCK_HK,
    )


def qk_norm_rope(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    eps: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k rotated by RoPE at ``positions``, in place, after the per-head RMSNorm by q_weight
    and k_weight when they are given (Qwen3). Returns q and k, the same tensors.

    positions: [T] int; q: [T, Hq, D]; k: [T, Hkv, D], views of one qkv tensor are fine (any
    token and head strides, the last dim contiguous); cos_sin_cache: [max_position, D] float32;
    q_weight, k_weight: [D] in q's dtype.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_k_heads = k.shape[1]
    assert k.shape == (num_tokens, num_k_heads, head_dim) and k.dtype == q.dtype
    assert positions.shape == (num_tokens,) and head_dim % 2 == 0
    assert cos_sin_cache.shape[1] == head_dim and cos_sin_cache.dtype == torch.float32
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1
    has_norm = q_weight is not None and k_weight is not None
    if num_tokens == 0:
        return q, k
    _qk_norm_rope_kernel[(num_tokens,)](
        q,
        k,
        positions,
        cos_sin_cache,
        q_weight if has_norm else q,
        k_weight if has_norm else k,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos_sin_cache.stride(0),
        num_q_heads,
        num_k_heads,
        head_dim // 2,
        eps,
        HAS_NORM=has_norm,
        BLOCK_HQ=triton.next_power_of_2(num_q_heads),
        BLOCK_HK=triton.next_power_of_2(num_k_heads),
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
        enable_fp_fusion=False,  # a * cos - b * sin rounds each product, as torch's kernels do
    )
    return q, k
