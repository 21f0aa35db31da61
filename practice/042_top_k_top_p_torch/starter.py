from __future__ import annotations

import torch


def top_k_top_p_filter(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """probs: [B, V]; top_k, top_p: [B] -> [B, V], the tokens each row leaves out set to 0."""
    raise NotImplementedError
