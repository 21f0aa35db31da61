"""Chapter 2's figures: rope.svg (RotaryEmbedding and rope_frequencies) and decoder_flow.svg
(the ops tiny llama3's forward calls, traced, and the residual stream).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

from .common import COLORS, GREY, LIGHT, arrow, box, diagram, figure, tiny_model


@figure("ch02", "rope")
def rope() -> plt.Figure:
    """Left: RotaryEmbedding turning one q pair per position. Right: rope_frequencies'
    wavelengths for plain RoPE and Llama 3.1's scaling (its published rope settings)."""
    import math

    import torch

    from minisgl.layers.rotary import RotaryEmbedding, rope_frequencies

    fig, (left, right) = plt.subplots(
        1, 2, figsize=(12, 5.4), width_ratios=[1, 1.35], layout="constrained"
    )
    fig.suptitle("Rotary position embeddings")
    D, base, positions = 16, 10000.0, torch.arange(8)
    rotary = RotaryEmbedding(D, max_position=8, base=base)
    for pair in range(3):  # dim `pair` and dim `pair + D/2` turn together (neox layout)
        q = torch.zeros(len(positions), 1, D)
        q[:, 0, pair] = 1.0 - 0.25 * pair  # one radius per pair, so the spirals do not overlap
        rotated, _ = rotary.forward(positions, q, q.clone())
        x, y = rotated[:, 0, pair], rotated[:, 0, pair + D // 2]
        left.plot(
            x, y, "o-", color=COLORS[pair], label=f"pair {pair}: dims ({pair}, {pair + D // 2})"
        )
        left.annotate(
            "pos 7",
            (x[-1], y[-1]),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=9,
            color=COLORS[pair],
        )
        circle = torch.linspace(0, 2 * math.pi, 100)
        radius = float(x[0])
        left.plot(radius * circle.cos(), radius * circle.sin(), color=LIGHT, zorder=0)
    left.annotate(
        "pos 0 (all pairs)", (1.0, 0.0), textcoords="offset points", xytext=(-40, 10), fontsize=9
    )
    left.set_aspect("equal")
    left.set_title(f"one q vector at positions 0–7\n(head_dim {D}, base {base:g})")
    left.set_xlabel("dim i")
    left.set_ylabel("dim i + D/2")
    left.legend(loc="lower left", fontsize=9)
    left.grid(alpha=0.3)

    # Llama 3.1 8B's config.json: head_dim 128, rope_theta 500000, rope_scaling as below
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    old_len = scaling["original_max_position_embeddings"]
    for label, rope_scaling, color in (
        ("plain RoPE", None, GREY),
        ("llama3 scaling", scaling, COLORS[0]),
    ):
        inv_freq, _ = rope_frequencies(128, 500000.0, rope_scaling)
        right.plot(2 * math.pi / inv_freq, ".-", color=color, label=label)
    short, long = old_len / scaling["high_freq_factor"], old_len / scaling["low_freq_factor"]
    right.axhspan(1, short, color=COLORS[2], alpha=0.08)
    right.axhspan(short, long, color=COLORS[1], alpha=0.12)
    right.axhspan(long, 1e7, color=COLORS[3], alpha=0.08)
    right.text(30, 250, "wavelength < 8192 / 4: kept", color=COLORS[2])
    right.text(1, 4000, "blended", color=COLORS[1])
    right.text(1, 1e6, "wavelength > 8192: divided by factor 8", color=COLORS[3])
    right.set_yscale("log")
    right.set_ylim(3, 1e7)
    right.set_xlabel("pair i (of head_dim / 2 = 64)")
    right.set_ylabel("wavelength 2π / θ_i (positions per turn)")
    right.set_title("rope_frequencies for Llama 3.1 8B\n(base 500000, original context 8192)")
    right.legend(loc="lower right")
    right.grid(alpha=0.3, which="major")
    return fig


@figure("ch02", "decoder_flow")
def decoder_flow() -> plt.Figure:
    """The ops tiny llama3's forward really calls, in order (traced), and the residual stream:
    each RMSNormFused call after the first adds the stream in before it normalizes."""
    import json
    import re

    import torch

    from minisgl.layers.base import BaseOP
    from minisgl.models import ModelConfig, create_model

    with tempfile.TemporaryDirectory() as tmp:
        config = json.loads((Path(tiny_model("llama3", tmp)) / "config.json").read_text())
    model = create_model(ModelConfig.from_dict(config))  # the weights do not matter here
    names: dict[int, str] = {}  # id(op) -> its name, for the ops drawn

    def find(obj: BaseOP, prefix: str) -> None:
        for key, value in vars(obj).items():
            for i, op in enumerate(value if isinstance(value, list) else [value]):
                if isinstance(op, BaseOP) and not key.startswith("_"):
                    name = prefix + key + (f".{i}" if isinstance(value, list) else "")
                    if re.fullmatch(r"(model\.)?(layers\.\d+\.\w+|\w+)", name):
                        names[id(op)] = name.removeprefix("model.")
                    find(op, name + ".")

    find(model, "")
    calls: list[tuple[str, bool, list[int]]] = []  # (op, residual given, output shape)
    patched = {type(op) for op in (o for o in _all_ops(model) if id(o) in names)}
    real = {cls: cls.forward for cls in patched}

    def traced(cls):
        def forward(self, *args):
            out = real[cls](self, *args)
            if id(self) in names and names[id(self)] != "layers":
                residual = len(args) > 1 and isinstance(args[1], torch.Tensor)
                first = out[0] if isinstance(out, tuple) else out
                calls.append((names[id(self)], residual, list(first.shape)))
            return out

        return forward

    for cls in patched:
        cls.forward = traced(cls)
    try:
        with torch.no_grad():
            model.forward(torch.arange(5), torch.arange(5))
    finally:
        for cls, forward in real.items():
            cls.forward = forward
    calls = [c for c in calls if not re.fullmatch(r"model|layers\.\d+", c[0])]
    short = {
        "embed_tokens": "embed",
        "input_layernorm": "input\nnorm",
        "post_attention_layernorm": "post-attn\nnorm",
        "self_attn": "attention",
        "lm_head": "LM head",
    }
    fig, ax = plt.subplots(figsize=(13, 4.2), layout="constrained")
    diagram(ax, len(calls) * 1.2, 4.4)
    fig.suptitle("The decoder's data flow, traced from tiny llama3's forward (T = 5 tokens)")
    ax.text(0, 3.75, "residual stream", color=COLORS[3], fontweight="bold", va="center")
    norms = [i for i, c in enumerate(calls) if "norm" in c[0]]
    ax.plot(
        [norms[0] * 1.2 + 0.55, norms[-1] * 1.2 + 0.55], [3.2, 3.2], color=COLORS[3], linewidth=2
    )
    previous = 0.0  # the x of the last sum drawn
    for i, (name, residual, shape) in enumerate(calls):
        x = i * 1.2
        layer, _, op = name.rpartition(".")
        color = COLORS[1] if "norm" in op else COLORS[0]
        box(
            ax,
            x,
            0.6,
            1.1,
            1.3,
            color,
            f"{layer.replace('layers.', 'layer ')}\n{short.get(op, op)}\n{shape}",
            color="white",
            fontsize=9,
        )
        if i:
            arrow(ax, (x - 0.1, 1.25), (x + 0.02, 1.25))
        if "norm" in op:
            ax.text(
                x + 0.55,
                3.2,
                "+" if residual else "=",
                ha="center",
                va="center",
                fontsize=12,
                color="white",
                fontweight="bold",
                bbox=dict(boxstyle="circle", facecolor=COLORS[3], edgecolor="none"),
            )
            arrow(ax, (x + 0.55, 2.95), (x + 0.55, 1.95), color=COLORS[3])
            ax.text(
                x + 0.62,
                2.45,
                "x + residual" if residual else "residual = x",
                fontsize=8,
                color=COLORS[3],
            )
            if i:  # x, the previous op's output, goes into the sum
                arrow(ax, (x - 0.65, 1.95), (x + 0.33, 3.05))
            if residual:  # and so does the stream, from the sum before
                arrow(ax, (previous + 0.8, 3.2), (x + 0.3, 3.2), color=COLORS[3])
            previous = x
    ax.text(
        0,
        0.25,
        "blue: ops that compute x; orange: RMSNormFused, which adds x to the "
        "stream, keeps the sum as the new residual and normalizes it",
        fontsize=10,
    )
    return fig


def _all_ops(obj, seen=None):
    """Every BaseOP reachable from obj's attributes (lists included)."""
    from minisgl.layers.base import BaseOP

    seen = set() if seen is None else seen
    for value in vars(obj).values():
        for op in value if isinstance(value, list) else [value]:
            if isinstance(op, BaseOP) and id(op) not in seen:
                seen.add(id(op))
                yield op
                yield from _all_ops(op, seen)
