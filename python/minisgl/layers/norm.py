from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.env import disable_fused_kernels

from .base import BaseOP


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim, computed in float32 as HF does."""
    if x.is_cuda:  # two launches (torch's norm, float32 inside, then the weight) for seven
        return weight * F.rms_norm(x, x.shape[-1:], eps=eps)
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


class RMSNorm(BaseOP):
    """RMS normalization with a learned scale. weight: [size]; x: [..., size] -> same shape."""

    def __init__(self, size: int, eps: float = 1e-6):
        self.eps = eps
        self.weight = torch.empty(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class RMSNormFused(RMSNorm):
    """The residual add of a decoder layer fused with the RMSNorm that follows it.

    ``forward(x, residual)`` returns ``(norm(x + residual), x + residual)``: the normalized input
    of the next block and the new residual stream. The first layer has no residual yet
    (``residual=None``): then it returns ``(norm(x), x)``. x, residual: [T, size].
    On a GPU the add and the norm are one Triton kernel that writes the sum into
    ``residual`` and returns that tensor.
    """

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None and x.is_cuda and not disable_fused_kernels():
            from minisgl.kernel.fused_norm import add_rms_norm  # imports Triton

            return add_rms_norm(x, residual, self.weight, self.eps)  # residual: the sum, in place
        return add_then_rms_norm(x, residual, self.weight, self.eps)


def add_then_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch formula of ``RMSNormFused.forward``: ``(norm(x + residual), x + residual)``."""
    if residual is not None:
        x = x + residual  # in the model's dtype, as HF adds it
    return rms_norm(x, weight, eps), x
