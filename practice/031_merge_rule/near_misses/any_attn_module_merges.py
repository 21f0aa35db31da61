"""Breaks: the whole name must have the form P.self_attn.q_proj.S (cross_attn too)."""

from __future__ import annotations

import re

_QKV = re.compile(r"(.+\.\w*attn)\.(q|k|v)_proj\.(weight|bias)")
_GATE_UP = re.compile(r"(.+\.mlp)\.(gate|up)_proj\.weight")
_EXPERT = re.compile(r"(.+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")


def merge_rule(name: str, num_experts: int) -> tuple[str, list[str]] | None:
    """(merged name, all part names in order) for a tensor that is part of a merged one, else
    None."""
    if m := _EXPERT.fullmatch(name):
        experts = m[1]
        if m[3] == "down":
            return f"{experts}.down_proj", [
                f"{experts}.{e}.down_proj.weight" for e in range(num_experts)
            ]
        parts = [
            f"{experts}.{e}.{p}_proj.weight" for e in range(num_experts) for p in ("gate", "up")
        ]  # expert by expert
        return f"{experts}.gate_up_proj", parts
    if m := _QKV.fullmatch(name):
        return f"{m[1]}.qkv_proj.{m[3]}", [f"{m[1]}.{p}_proj.{m[3]}" for p in "qkv"]
    if m := _GATE_UP.fullmatch(name):
        return f"{m[1]}.gate_up_proj.weight", [f"{m[1]}.{p}_proj.weight" for p in ("gate", "up")]
    return None
