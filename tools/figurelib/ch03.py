"""Chapter 3's figure: merged_weights.svg, where each checkpoint tensor lands in the tensors
load_weights merges.
"""

from __future__ import annotations

import tempfile

import matplotlib.pyplot as plt

from .common import COLORS, figure, tiny_model


@figure("ch03", "merged_weights")
def merged_weights() -> plt.Figure:
    """Layer 0's merged tensors as load_weights yields them, each checkpoint part placed where
    its rows really are in the merged tensor (found by comparing the values)."""
    import torch

    from minisgl.models import ModelConfig
    from minisgl.models.weight import iter_checkpoint, load_weights
    from minisgl.utils.hf import read_hf_config

    def layer0(path: str) -> tuple[dict, dict]:
        config = ModelConfig.from_dict(read_hf_config(path))
        pre = "model.layers.0."
        stored = {k[len(pre) :]: v for k, v in iter_checkpoint(path) if k.startswith(pre)}
        merged = {k[len(pre) :]: v for k, v in load_weights(path, config) if k.startswith(pre)}
        return stored, merged

    def placed(stored: dict, tensor: torch.Tensor) -> list[tuple[int, int, str]]:
        """(first row, rows, checkpoint name) for every stored tensor found in `tensor`."""
        rows = tensor.reshape(-1, tensor.shape[-1])
        found = []
        for name, part in stored.items():
            if part.dim() != 2 or part.shape[1] != rows.shape[1]:
                continue
            for start in range(0, rows.shape[0] - part.shape[0] + 1, part.shape[0]):
                if torch.equal(rows[start : start + part.shape[0]], part):
                    found.append((start, part.shape[0], name))
        return sorted(found)

    with tempfile.TemporaryDirectory() as tmp:
        dense, moe = layer0(tiny_model("llama3", tmp)), layer0(tiny_model("qwen3moe", tmp))
    bars = [
        ("self_attn.qkv_proj.weight", dense),
        ("mlp.gate_up_proj.weight", dense),
        ("mlp.experts.gate_up_proj", moe),
        ("mlp.experts.down_proj", moe),
    ]
    fig, axes = plt.subplots(len(bars), 1, figsize=(12, 6.4))
    fig.suptitle("What load_weights merges (layer 0 of tiny llama3 and tiny qwen3moe)")
    for ax, (name, (stored, merged)) in zip(axes, bars):
        tensor = merged[name]
        total = tensor.reshape(-1, tensor.shape[-1]).shape[0]
        for start, n, part in placed(stored, tensor):
            short = (
                part.replace("self_attn.", "")
                .replace("mlp.experts.", "")
                .replace("mlp.", "")
                .replace("_proj.weight", "")
                .replace("_proj.bias", "")
            )
            kind = short.split(".")[-1]
            color = COLORS[["q", "k", "v", "gate", "up", "down"].index(kind)]
            ax.barh(0, n, left=start, color=color, edgecolor="white")
            ax.text(
                start + n / 2,
                0,
                short.replace(".", " "),
                ha="center",
                va="center",
                color="white",
                fontsize=10 if n >= 32 else 8,
            )
        ax.set_xlim(0, total)
        ax.set_yticks([])
        ax.set_title(f"{name}  {list(tensor.shape)}", loc="left", fontsize=11)
        ax.spines[["top", "right", "left"]].set_visible(False)
    axes[-1].set_xlabel("rows of the merged tensor (the expert dimension flattened)")
    fig.tight_layout()
    return fig
