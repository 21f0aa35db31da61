"""Tile sizes for the fast MoE, by batch size: the tuned file for this shape and device when
there is one (``benchmark/tune_moe.py`` writes it), a heuristic otherwise.

A config picks a path. {"path": "aligned", "BLOCK_M": m, "gate_up": {...}, "down": {...}}: the
pairs sorted and padded to tiles of m (kernel/moe_routing.py), then two grouped GEMMs
(kernel/fused_moe.py), each with its own BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages,
and optionally TAIL_SPLIT (absent or 1: whole tiles; 2: a tile whose pairs fit in its first
half computes that half; 4: the same, and a quarter when they fit in its first quarter).
{"path": "decode", "gate_up": {...}, "down": {...}}: a few tokens in three launches
(kernel/moe_decode.py), each with BLOCK_N, BLOCK_K, num_warps, num_stages.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Dict

import torch

CONFIG_DIR = Path(__file__).with_name("configs")
MoeConfig = Dict[str, Any]
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
DECODE_MAX_TOKENS = 16  # the decode path's tokens: its routing is one program's


def config_file_name(num_experts: int, inter: int, dtype: torch.dtype, device_name: str) -> str:
    """E=128,N=768,dtype=bf16,device=NVIDIA_H200.json: N is the intermediate size I."""
    device = device_name.replace(" ", "_")
    return f"E={num_experts},N={inter},dtype={DTYPE_NAMES[dtype]},device={device}.json"


@functools.lru_cache(maxsize=None)
def load_tuned(file_name: str) -> Dict[int, MoeConfig] | None:
    """The tuned configs of one shape and device, keyed by token count; None without a file."""
    path = CONFIG_DIR / file_name
    if not path.exists():
        return None
    table = json.loads(path.read_text(encoding="utf-8"))["configs"]
    return {int(tokens): config for tokens, config in table.items()}


def _gemm(block_n: int, block_k: int, group_m: int, warps: int, stages: int) -> Dict[str, int]:
    return dict(
        BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m, num_warps=warps, num_stages=stages
    )


def default_config(num_tokens: int, topk: int, num_experts: int) -> MoeConfig:
    """By pairs per expert: a few tokens take the decode path; few pairs
    per expert waste most of a tall tile, so small batches take 16-row tiles and wide K steps
    (the weights are the cost); large ones take 128-row tiles (the arithmetic is)."""
    if num_tokens <= DECODE_MAX_TOKENS:
        return dict(path="decode", gate_up=_gemm(32, 128, 1, 4, 3), down=_gemm(8, 128, 1, 4, 3))
    per_expert = num_tokens * topk / num_experts
    if per_expert <= 4:
        return dict(
            path="aligned",
            BLOCK_M=16,
            gate_up=_gemm(64, 128, 1, 4, 4),
            down=_gemm(64, 128, 1, 4, 4),
        )
    if per_expert <= 48:
        return dict(
            path="aligned", BLOCK_M=64, gate_up=_gemm(64, 64, 8, 4, 4), down=_gemm(64, 64, 8, 4, 4)
        )
    return dict(
        path="aligned", BLOCK_M=128, gate_up=_gemm(128, 64, 8, 8, 3), down=_gemm(256, 64, 8, 8, 3)
    )


def get_config(
    num_tokens: int,
    topk: int,
    num_experts: int,
    inter: int,
    dtype: torch.dtype,
    device: torch.device,
) -> MoeConfig:
    """The tuned config of the nearest token count when a file fits, else the heuristic's."""
    if device.type == "cuda" and dtype in DTYPE_NAMES:
        name = config_file_name(num_experts, inter, dtype, torch.cuda.get_device_name(device))
        tuned = load_tuned(name)
        if tuned:
            return nearest(tuned, num_tokens)
    return default_config(num_tokens, topk, num_experts)


def nearest(tuned: Dict[int, MoeConfig], num_tokens: int) -> MoeConfig:
    """The config tuned for the token count nearest num_tokens (the smaller on a tie), among
    those of num_tokens' path: the decode path is for at most DECODE_MAX_TOKENS tokens."""
    path = "decode" if num_tokens <= DECODE_MAX_TOKENS else "aligned"
    same_path = {tokens: c for tokens, c in tuned.items() if c["path"] == path} or tuned
    return same_path[min(same_path, key=lambda tokens: (abs(tokens - num_tokens), tokens))]
