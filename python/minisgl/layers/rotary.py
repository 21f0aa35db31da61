from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from .base import BaseOP


def _default_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    """Pair i of a head's dims turns at ``base ** (-2i / D)`` radians per position. [D / 2]"""
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def _llama3_inv_freq(head_dim: int, base: float, s: Mapping[str, Any]) -> torch.Tensor:
    """Llama 3.1's long-context scaling: slow the low frequencies down by ``factor``.

    Pairs whose wavelength is short next to the original context are kept, those whose wavelength
    is long are divided by ``factor``, and those between are blended smoothly.
    """
    inv_freq = _default_inv_freq(head_dim, base)
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)  # 0 at the long end, 1 at the short end
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, blended)
    return torch.where(wavelen < old_len / high, inv_freq, scaled)


def _yarn_inv_freq(head_dim: int, base: float, s: Mapping[str, Any]) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate the slow pairs by ``factor``, keep the fast ones, ramp in between, and
    scale cos / sin by ``0.1 * ln(factor) + 1`` (so q . k by its square) unless
    ``attention_factor`` is given. Returns (inv_freq [D / 2], attention factor)."""
    factor = s["factor"]
    old_len = s["original_max_position_embeddings"]
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        # the dim whose pair turns num_rotations times over the original context
        return head_dim * math.log(old_len / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # no division by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # how much of each pair keeps its original frequency (1 for the fast pairs)
    inv_freq = interpolated * (1 - keep) + extrapolated * keep
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv_freq, attention_factor


def rope_frequencies(
    head_dim: int, base: float, rope_scaling: Mapping[str, Any] | None
) -> tuple[torch.Tensor, float]:
    """The inverse frequencies [D / 2] of a rope type, and the factor cos / sin are scaled by."""
    rope_type = "default" if rope_scaling is None else rope_scaling["rope_type"]
    if rope_type == "default":
        return _default_inv_freq(head_dim, base), 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(head_dim, base, rope_scaling), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(head_dim, base, rope_scaling)
    raise ValueError(f"unsupported rope_type {rope_type!r}; supported: default, llama3, yarn")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox layout: dim i pairs with dim i + D / 2. x: [T, heads, D]; cos, sin: [T, D / 2]."""
    x1, x2 = x.float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class RotaryEmbedding(BaseOP):
    """Rotary position embedding with a cos / sin table for every position, computed once.

    _cos_sin_cache: [max_position, D], cos in the first half, sin in the second (float32; private,
    so it is not a weight).
    """

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        base: float,
        rope_scaling: Mapping[str, Any] | None = None,
    ):
        inv_freq, scale = rope_frequencies(head_dim, base, rope_scaling)
        angles = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        self._cos_sin_cache = torch.cat([angles.cos() * scale, angles.sin() * scale], dim=-1)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T]; q: [T, Hq, D]; k: [T, Hkv, D] -> q, k rotated, same shapes."""
        cos, sin = self._cos_sin_cache[positions].chunk(2, dim=-1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)
