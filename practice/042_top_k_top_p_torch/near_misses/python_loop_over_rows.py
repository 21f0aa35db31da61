"""Breaks: for the whole batch at once, without a Python loop over rows or tokens."""

from __future__ import annotations

import torch


def top_k_top_p_filter(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """probs: [B, V]; top_k, top_p: [B] -> [B, V], one row at a time."""
    return torch.stack(
        [_filter_row(row, int(k), float(p)) for row, k, p in zip(probs, top_k, top_p)]
    )


def _filter_row(row: torch.Tensor, k: int, p: float) -> torch.Tensor:
    sorted_probs, order = row.sort(descending=True)
    rank = torch.arange(row.shape[0])
    mass_before = sorted_probs.cumsum(dim=0) - sorted_probs
    drop = rank >= (k if k > 0 else row.shape[0])
    if p < 1.0:
        drop |= mass_before >= p
    return torch.zeros_like(row).scatter(0, order, sorted_probs.masked_fill(drop, 0.0))
