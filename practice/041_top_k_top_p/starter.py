from __future__ import annotations


def top_k_top_p_filter(
    probs: list[list[float]], top_k: list[int], top_p: list[float]
) -> list[list[float]]:
    """Each row with the tokens its top-k / top-p leaves out set to 0.0 (not renormalized)."""
    raise NotImplementedError
