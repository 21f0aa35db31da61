from __future__ import annotations

import math


def attend(q: list, k: list, v: list, num_cached: int) -> list:
    """Causal softmax attention of E new tokens ([E][Hq][D]) over S = num_cached + E keys and
    values ([S][Hkv][D]) -> [E][Hq][D]."""
    if not q:
        return []
    head_dim = len(q[0][0])
    group = len(q[0]) // len(k[0])  # query heads per KV head
    out = []
    for i, token in enumerate(q):
        visible = num_cached + i + 1  # keys 0 .. its own position
        out.append(
            [
                _head(
                    query,
                    [k[j][h // group] for j in range(visible)],
                    [v[j][h // group] for j in range(visible)],
                    head_dim,
                )
                for h, query in enumerate(token)
            ]
        )
    return out


def _head(query: list, keys: list, values: list, head_dim: int) -> list:
    scores = [sum(a * b for a, b in zip(query, key)) / math.sqrt(head_dim) for key in keys]
    top = max(scores)  # subtracted for a stable softmax
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return [sum(w * value[d] for w, value in zip(weights, values)) / total for d in range(head_dim)]
