"""Breaks: top_p >= 1.0 means no limit (the cut is applied at 1.0 too)."""

from __future__ import annotations

import torch


def top_k_top_p_filter(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """probs: [B, V]; top_k, top_p: [B] -> [B, V], the tokens each row leaves out set to 0."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[-1], device=probs.device)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    k = torch.where(top_k > 0, top_k, probs.shape[-1])[:, None]
    p = top_p[:, None]
    drop = (rank >= k) | (mass_before >= p)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
