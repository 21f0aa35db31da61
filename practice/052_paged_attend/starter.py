from __future__ import annotations


def attend(q: list, k: list, v: list, num_cached: int) -> list:
    """Causal softmax attention of E new tokens ([E][Hq][D]) over S = num_cached + E keys and
    values ([S][Hkv][D]) -> [E][Hq][D]."""
    raise NotImplementedError
