"""Breaks: the blend is (1 - smooth) * inv_freq / factor + smooth * inv_freq."""

from __future__ import annotations

import math


def rope_inv_freq(head_dim: int, base: float, rope_scaling: dict | None) -> list[float]:
    """The head_dim // 2 inverse frequencies of rotary embedding: default or llama3-scaled."""
    inv_freq = [1.0 / base ** (2 * i / head_dim) for i in range(head_dim // 2)]
    kind = "default" if rope_scaling is None else rope_scaling["rope_type"]
    if kind == "default":
        return inv_freq
    if kind != "llama3":
        raise ValueError(f"unsupported rope_type {kind!r}")
    s = rope_scaling
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    out = []
    for f in inv_freq:
        wavelen = 2 * math.pi / f
        if wavelen < old_len / high:
            out.append(f)  # fast: many turns within the old context, kept
        elif wavelen > old_len / low:
            out.append(f / factor)  # slow: interpolated
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append(smooth * f / factor + (1 - smooth) * f)
    return out
