"""Reading a checkpoint: safetensors streamed one tensor at a time, renamed into minisgl's layout.

Checkpoints store q, k and v apart, gate and up apart, and every expert apart; our layers hold
them merged (one matmul each). ``load_weights`` buffers the parts of a merged tensor until the
last one arrives, then yields the merged tensor and lets the parts go.

Under tensor parallelism each rank keeps only its shard of every tensor, cut as the
tensor arrives, before any merging: a rank never holds more than one whole tensor at a time.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

import torch
from safetensors import safe_open

from minisgl.distributed import get_tp_info
from minisgl.layers.embedding import vocab_range
from minisgl.utils.hf import safetensors_files
from minisgl.utils.misc import div_even

from .config import ModelConfig

_QKV = re.compile(r"(.+\.self_attn)\.(q|k|v)_proj\.(weight|bias)")
_GATE_UP = re.compile(r"(.+\.mlp)\.(gate|up)_proj\.weight")
_EXPERT = re.compile(r"(.+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")

# sharded by rows (column parallel: output features) and by columns (row parallel: input features)
_BY_ROWS = re.compile(
    r".+\.(self_attn\.[qkv]_proj\.(weight|bias)"
    r"|mlp\.(experts\.\d+\.)?(gate|up)_proj\.weight)"
)
_BY_COLS = re.compile(r".+\.(self_attn\.o_proj|mlp\.(experts\.\d+\.)?down_proj)\.weight")
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")

Combine = Callable[[List[torch.Tensor]], torch.Tensor]


def _cat(parts: List[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts, dim=0)


def _pack_gate_up(parts: List[torch.Tensor]) -> torch.Tensor:
    """[gate_0, up_0, gate_1, up_1, ...], each [I, H] -> [E, 2 * I, H], expert e's gate rows
    first, then its up rows."""
    return torch.stack([torch.cat(pair) for pair in zip(parts[0::2], parts[1::2])])


def _merge_rule(name: str, num_experts: int) -> Tuple[str, List[str], Combine] | None:
    """For a checkpoint tensor that is part of a merged one: (the merged name, the names of all
    its parts in order, how to combine them). None for a tensor kept as it is."""
    if m := _EXPERT.fullmatch(name):
        experts = m[1]
        if m[3] == "down":  # [E, H, I]; no ".weight": a 3-D tensor, not a linear layer's weight
            parts = [f"{experts}.{e}.down_proj.weight" for e in range(num_experts)]
            return f"{experts}.down_proj", parts, torch.stack
        parts = [
            f"{experts}.{e}.{p}_proj.weight" for e in range(num_experts) for p in ("gate", "up")
        ]
        return f"{experts}.gate_up_proj", parts, _pack_gate_up
    if m := _QKV.fullmatch(name):
        parts = [f"{m[1]}.{p}_proj.{m[3]}" for p in "qkv"]
        return f"{m[1]}.qkv_proj.{m[3]}", parts, _cat
    if m := _GATE_UP.fullmatch(name):
        parts = [f"{m[1]}.{p}_proj.weight" for p in ("gate", "up")]
        return f"{m[1]}.gate_up_proj.weight", parts, _cat
    return None


def shard(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a checkpoint tensor, as its layer holds it: q/k/v (by heads), gate and
    up (dense, or each expert's) split along their output rows; o_proj and down (each expert's
    too) along their input columns; the vocabulary by rows, padded to an equal share. Norms, the
    MoE router and row-parallel biases stay whole."""
    tp = get_tp_info()
    if tp.size == 1:
        return tensor
    if name in _VOCAB:
        start, end, rows = vocab_range(tensor.shape[0])
        part = tensor.new_zeros(rows, *tensor.shape[1:])
        part[: end - start] = tensor[start:end]
        return part
    dim = 0 if _BY_ROWS.fullmatch(name) else 1 if _BY_COLS.fullmatch(name) else None
    if dim is None:
        return tensor
    size = div_even(tensor.shape[dim], tp.size)
    return tensor.narrow(dim, tp.rank * size, size).clone()  # the whole tensor can go now


def iter_checkpoint(model_dir: str | Path) -> Iterator[Tuple[str, torch.Tensor]]:
    """Every tensor of every shard, read one at a time (never a whole file at once)."""
    for file in safetensors_files(model_dir):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_weights(model_dir: str | Path, config: ModelConfig) -> Iterator[Tuple[str, torch.Tensor]]:
    """The checkpoint's weights under minisgl's names, merged:

        q_proj, k_proj, v_proj            -> self_attn.qkv_proj    [(Hq + 2 Hkv) * D, H]
        gate_proj, up_proj                -> mlp.gate_up_proj      [2 * I, H]
        experts.{e}.gate_proj, .up_proj   -> mlp.experts.gate_up_proj  [E, 2 * I, H]
        experts.{e}.down_proj             -> mlp.experts.down_proj     [E, H, I]

    Under tensor parallelism each size above that depends on Hq, Hkv, I or the vocabulary is
    this rank's share (``shard``). The MoE router stays ``mlp.gate.weight``. A tied model
    without ``lm_head.weight`` gets the embedding's tensor (this rank's rows) under that name.
    """
    # merged name -> (the names of all its parts, the parts read so far)
    pending: Dict[str, Tuple[List[str], Dict[str, torch.Tensor]]] = {}
    embedding, has_lm_head = None, False
    for name, tensor in iter_checkpoint(model_dir):
        tensor = shard(name, tensor)  # this rank's part only, before merging
        if name == "model.embed_tokens.weight":
            embedding = tensor
        has_lm_head = has_lm_head or name == "lm_head.weight"
        rule = _merge_rule(name, config.num_experts)
        if rule is None:
            yield name, tensor
            continue
        merged, parts, combine = rule
        if name not in parts:  # an expert index past config.num_experts
            raise ValueError(f"checkpoint tensor {name!r} does not fit the config's {merged!r}")
        found = pending.setdefault(merged, (parts, {}))[1]
        found[name] = tensor
        if len(found) == len(parts):
            del pending[merged]
            yield merged, combine([found[p] for p in parts])
    for merged, (parts, found) in pending.items():
        missing = next(p for p in parts if p not in found)
        raise ValueError(
            f"checkpoint {str(model_dir)!r} has no tensor {missing!r} (a part of {merged!r})"
        )
    if config.tie_word_embeddings and not has_lm_head and embedding is not None:
        yield "lm_head.weight", embedding
