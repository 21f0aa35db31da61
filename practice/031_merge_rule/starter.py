from __future__ import annotations


def merge_rule(name: str, num_experts: int) -> tuple[str, list[str]] | None:
    """(merged name, all part names in order) for a tensor that is part of a merged one, else
    None."""
    raise NotImplementedError
