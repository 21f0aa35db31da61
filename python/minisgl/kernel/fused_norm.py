"""The residual add and the RMSNorm after it, in one Triton kernel: one read of each row, one
write of the sum and one of the normalized row, where torch launches an add, a norm and a scale.

The formula is HF's, rounding included: the sum is rounded to the model's dtype (HF adds in that
dtype), normalized in float32, rounded to the dtype again, then scaled by the weight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(
    x,
    residual,
    weight,
    out,
    stride_x,
    stride_r,
    stride_o,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program normalizes one row. With HAS_RESIDUAL: s = x + residual, written back into
    residual, and out = norm(s) * weight; without: out = norm(x) * weight. BLOCK is the hidden
    size rounded up to a power of two; the mask keeps the padding out of loads, stores and sums."""
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride overflows int32 in long prefills
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    s = tl.load(x + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual + row * stride_r + cols, mask=mask, other=0.0)
        s = (s.to(tl.float32) + r.to(tl.float32)).to(r.dtype)  # rounded, as torch's add is
        tl.store(residual + row * stride_r + cols, s, mask=mask)  # the new residual stream
    s = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(s * s, axis=0) / hidden + eps)  # padding adds zeros to the sum
    w = tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)
    normed = (s * rstd).to(out.dtype.element_ty).to(tl.float32)  # rounded where HF rounds it
    tl.store(out + row * stride_o + cols, (normed * w).to(out.dtype.element_ty), mask=mask)


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """x, residual: [T, H] with contiguous rows; weight: [H] -> out [T, H], x's dtype."""
    num_rows, hidden = x.shape
    assert weight.shape == (hidden,) and x.stride(-1) == 1
    out = torch.empty_like(x)
    if num_rows == 0:
        return out
    block = triton.next_power_of_2(hidden)
    _add_rms_norm_kernel[(num_rows,)](
        x,
        x if residual is None else residual,
        weight,
        out,
        x.stride(0),
        0 if residual is None else residual.stride(0),
        out.stride(0),
        hidden,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=min(max(block // 256, 1), 16),  # about 8 elements a thread
    )
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim. x: [..., H]; weight: [H]."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return _launch(rows, None, weight, eps).view(x.shape)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The contract of ``RMSNormFused.forward(x, residual)``: returns ``(norm(x + residual),
    x + residual)``. The sum is written into ``residual`` in place, and that tensor is returned
    as the new residual stream. x, residual: [T, H] of one dtype, rows contiguous; weight: [H]."""
    assert residual.shape == x.shape and residual.dtype == x.dtype
    assert residual.stride(-1) == 1
    return _launch(x, residual, weight, eps), residual
