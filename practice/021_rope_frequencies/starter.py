from __future__ import annotations


def rope_inv_freq(head_dim: int, base: float, rope_scaling: dict | None) -> list[float]:
    """The head_dim // 2 inverse frequencies of rotary embedding: default or llama3-scaled."""
    raise NotImplementedError
