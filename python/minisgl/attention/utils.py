from __future__ import annotations

import torch


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cached: int) -> torch.Tensor:
    """Softmax attention of one request's new tokens over all its tokens, computed in float32.

    q: [E, Hq, D], the tokens at positions num_cached .. num_cached + E - 1; k, v: [S, Hkv, D]
    with S = num_cached + E, key j at position j -> [E, Hq, D]. Query i sees keys 0 .. num_cached
    + i (causal). With grouped-query attention every Hq / Hkv query heads read one KV head.
    """
    extend_len, num_qo_heads, head_dim = q.shape
    group = num_qo_heads // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * head_dim**-0.5
    query_pos = torch.arange(num_cached, num_cached + extend_len, device=q.device)
    future = torch.arange(k.shape[0], device=q.device)[None, :] > query_pos[:, None]  # [E, S]
    probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)  # [Hq, E, S]
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)
