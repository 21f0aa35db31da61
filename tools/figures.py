"""The chapters' figures, drawn from what minisgl's own code computes.

    python tools/figures.py [chNN ...] [--png DIR]   # every chapter's figures by default

Each function below runs minisgl, as it stands in ``python/``, on small inputs or on a tiny
random-weight model from ``examples/tiny_models.py`` (mostly the scenario of the chapter's main),
and draws what the code produced with matplotlib: no number in a figure is typed in by hand. It
writes ``chapters/<id>_<slug>/figures/<name>.svg``, which the chapter's text shows with an
ordinary image link. The SVGs are byte-for-byte reproducible (a fixed hash salt, no date, text
kept as text in DejaVu Sans), so running the command again changes a file only when the code's
results change. ``--png DIR`` also writes a PNG of each figure into DIR, to look at.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import runpy
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT  # the chapter's own tree, written by `steps.py checkout`, while its figures are drawn

plt.rcParams.update({
    "svg.hashsalt": "minisgl-figures",  # fixed ids inside the SVG
    "svg.fonttype": "none",  # text stays text: small files, searchable
    "font.family": "DejaVu Sans",
    "font.size": 11,
    "axes.titlesize": 12,
    "figure.titlesize": 14,
    "figure.titleweight": "bold",
})
# one colour per request / rank / part, in this order
COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
          "#8C8C8C", "#CCB974", "#64B5CD"]
GREY, LIGHT = "#B0B0B0", "#EEEEEE"

FIGURES: dict[str, list[tuple[str, Callable[[], plt.Figure]]]] = {}


def figure(chapter: str, name: str):
    """Register a function that returns a matplotlib figure as ``chapter``'s ``name``.svg."""
    def register(draw: Callable[[], plt.Figure]) -> Callable[[], plt.Figure]:
        FIGURES.setdefault(chapter, []).append((name, draw))
        return draw
    return register


def quietly(fn: Callable, *args, **kwargs):
    """Call fn with its prints and the libraries' log lines swallowed."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return fn(*args, **kwargs)


def tiny_model(family: str, tmp: str) -> str:
    import tiny_models
    from transformers.utils import logging

    logging.set_verbosity_error()
    return str(tiny_models.make_tiny_model(family, f"{tmp}/{family}"))


def box(ax: Axes, x: float, y: float, w: float, h: float, fill: str, text: str = "",
        **text_args) -> None:
    """A filled rectangle with centred text (y grows downwards in the diagrams)."""
    ax.add_patch(Rectangle((x, y), w, h, facecolor=fill, edgecolor="white", linewidth=1.5))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", **text_args)


def arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], **style) -> None:
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14,
                                 color=style.pop("color", "#444444"), linewidth=1.3, **style))


def diagram(ax: Axes, width: float, height: float) -> None:
    """Data coordinates (0, 0) top left to (width, height), no axes drawn."""
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")


# ---------------------------------------------------------------------------------------- ch01
@figure("ch01", "tp_split")
def tp_split() -> plt.Figure:
    """The MLP's gate_up (column parallel) and down (row parallel) weights on two ranks, with
    the local shapes minisgl's linear layers take when get_tp_info says size 2."""
    import minisgl.layers.linear as linear
    from minisgl.utils.misc import TPInfo

    main = run_main("ch01_layers.py")
    H, FFN, TP = main["H"], main["FFN"], 2  # the main's hidden and intermediate sizes
    real = linear.get_tp_info
    linear.get_tp_info = lambda: TPInfo(rank=0, size=TP)  # what chapter 19 will return
    try:
        gate_up = linear.LinearColParallelMerged(H, [FFN, FFN])
        down = linear.LinearRowParallel(FFN, H)
    finally:
        linear.get_tp_info = real
    local_i = gate_up.output_sizes[0]  # each rank's slice of gate, and of up
    down_in = down.weight.shape[1]  # each rank's slice of down's input features

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.6), width_ratios=[1, 1.2],
                                      layout="constrained")
    fig.suptitle(f"Tensor parallelism over {TP} ranks: the MLP of a {H}-wide model")
    W = 80  # drawn width of a weight (the H input columns)
    diagram(left, 330, 2 * FFN + 40)
    left.set_title(f"gate_up_proj, column parallel: full weight [{2 * FFN}, {H}]")
    for part, name in enumerate(("gate", "up")):
        for rank in range(TP):
            y = part * FFN + rank * local_i
            box(left, 0, y, W, local_i, COLORS[rank],
                f"{name}\nrows {rank * local_i}–{(rank + 1) * local_i - 1}", color="white",
                fontsize=10)
    for rank in range(TP):
        y0 = rank * (FFN + 20)
        shape = list(gate_up.weight.shape)
        box(left, 190, y0, W, local_i, COLORS[rank], "gate", color="white")
        box(left, 190, y0 + local_i, W, local_i, COLORS[rank], "up", color="white")
        left.text(190 + W + 8, y0 + local_i, f"rank {rank}\nholds\n{shape}", va="center")
        for part in range(2):
            src = part * FFN + rank * local_i + local_i / 2
            arrow(left, (W + 4, src), (186, y0 + part * local_i + local_i / 2),
                  color=COLORS[rank])
    left.text(0, 2 * FFN + 30, "each rank: silu(gate) * up on its own slice, no communication",
              fontsize=10)

    diagram(right, 420, 2 * FFN + 40)
    right.set_title(f"down_proj, row parallel: full weight [{H}, {FFN}]")
    for rank in range(TP):
        box(right, rank * 1.4 * down_in, 0, 1.4 * down_in, H, COLORS[rank],
            f"rank {rank}\ncolumns\n{rank * down_in}–{(rank + 1) * down_in - 1}",
            color="white", fontsize=10)
    right.text(2.8 * down_in + 10, H / 2, f"each rank holds\n{list(down.weight.shape)}",
               va="center")
    for rank in range(TP):
        y = 105 + rank * 40
        right.text(0, y, f"rank {rank}:  h{rank} [T, {down_in}] @ W{rank}ᵀ  →  partial y{rank}",
                   va="center", color=COLORS[rank])
        arrow(right, (300, y), (328, 125))
    right.text(332, 125, "all-reduce\ny = y0 + y1\n[T, {H}]".replace("{H}", str(H)),
               va="center", fontweight="bold")
    right.text(0, 215, "One all-reduce per MLP (and one per attention block, after o_proj):\n"
               "the partial sums are added across the ranks (chapter 19).", fontsize=10)
    return fig


# ---------------------------------------------------------------------------------------- ch02
@figure("ch02", "rope")
def rope() -> plt.Figure:
    """Left: RotaryEmbedding turning one q pair per position. Right: rope_frequencies'
    wavelengths for plain RoPE and Llama 3.1's scaling (its published rope settings)."""
    import math

    import torch
    from minisgl.layers.rotary import RotaryEmbedding, rope_frequencies

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.4), width_ratios=[1, 1.35],
                                      layout="constrained")
    fig.suptitle("Rotary position embeddings")
    D, base, positions = 16, 10000.0, torch.arange(8)
    rotary = RotaryEmbedding(D, max_position=8, base=base)
    for pair in range(3):  # dim `pair` and dim `pair + D/2` turn together (neox layout)
        q = torch.zeros(len(positions), 1, D)
        q[:, 0, pair] = 1.0 - 0.25 * pair  # one radius per pair, so the spirals do not overlap
        rotated, _ = rotary.forward(positions, q, q.clone())
        x, y = rotated[:, 0, pair], rotated[:, 0, pair + D // 2]
        left.plot(x, y, "o-", color=COLORS[pair], label=f"pair {pair}: dims ({pair}, "
                  f"{pair + D // 2})")
        left.annotate("pos 7", (x[-1], y[-1]), textcoords="offset points", xytext=(6, 4),
                      fontsize=9, color=COLORS[pair])
        circle = torch.linspace(0, 2 * math.pi, 100)
        radius = float(x[0])
        left.plot(radius * circle.cos(), radius * circle.sin(), color=LIGHT, zorder=0)
    left.annotate("pos 0 (all pairs)", (1.0, 0.0), textcoords="offset points", xytext=(-40, 10),
                  fontsize=9)
    left.set_aspect("equal")
    left.set_title(f"one q vector at positions 0–7\n(head_dim {D}, base {base:g})")
    left.set_xlabel("dim i")
    left.set_ylabel("dim i + D/2")
    left.legend(loc="lower left", fontsize=9)
    left.grid(alpha=0.3)

    # Llama 3.1 8B's config.json: head_dim 128, rope_theta 500000, rope_scaling as below
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    old_len = scaling["original_max_position_embeddings"]
    for label, rope_scaling, color in (("plain RoPE", None, GREY),
                                       ("llama3 scaling", scaling, COLORS[0])):
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
    short = {"embed_tokens": "embed", "input_layernorm": "input\nnorm",
             "post_attention_layernorm": "post-attn\nnorm", "self_attn": "attention",
             "lm_head": "LM head"}
    fig, ax = plt.subplots(figsize=(13, 4.2), layout="constrained")
    diagram(ax, len(calls) * 1.2, 4.4)
    fig.suptitle("The decoder's data flow, traced from tiny llama3's forward (T = 5 tokens)")
    ax.text(0, 3.75, "residual stream", color=COLORS[3], fontweight="bold", va="center")
    norms = [i for i, c in enumerate(calls) if "norm" in c[0]]
    ax.plot([norms[0] * 1.2 + 0.55, norms[-1] * 1.2 + 0.55], [3.2, 3.2],
            color=COLORS[3], linewidth=2)
    for i, (name, residual, shape) in enumerate(calls):
        x = i * 1.2
        layer, _, op = name.rpartition(".")
        color = COLORS[1] if "norm" in op else COLORS[0]
        box(ax, x, 0.6, 1.1, 1.3, color, f"{layer.replace('layers.', 'layer ')}\n"
            f"{short.get(op, op)}\n{shape}", color="white", fontsize=9)
        if i:
            arrow(ax, (x - 0.1, 1.25), (x + 0.02, 1.25))
        if "norm" in op:
            ax.text(x + 0.55, 3.2, "+" if residual else "=", ha="center", va="center",
                    fontsize=12, color="white", fontweight="bold",
                    bbox=dict(boxstyle="circle", facecolor=COLORS[3], edgecolor="none"))
            arrow(ax, (x + 0.55, 2.95), (x + 0.55, 1.95), color=COLORS[3])
            ax.text(x + 0.62, 2.45, "x + residual" if residual else "residual = x",
                    fontsize=8, color=COLORS[3])
    ax.text(0, 0.25, "blue: ops that compute x; orange: RMSNormFused, which adds x to the "
            "stream, keeps the sum as the new residual and normalizes it", fontsize=10)
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


# ---------------------------------------------------------------------------------------- ch03
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
        stored = {k[len(pre):]: v for k, v in iter_checkpoint(path) if k.startswith(pre)}
        merged = {k[len(pre):]: v for k, v in load_weights(path, config) if k.startswith(pre)}
        return stored, merged

    def placed(stored: dict, tensor: torch.Tensor) -> list[tuple[int, int, str]]:
        """(first row, rows, checkpoint name) for every stored tensor found in `tensor`."""
        rows = tensor.reshape(-1, tensor.shape[-1])
        found = []
        for name, part in stored.items():
            if part.dim() != 2 or part.shape[1] != rows.shape[1]:
                continue
            for start in range(0, rows.shape[0] - part.shape[0] + 1, part.shape[0]):
                if torch.equal(rows[start:start + part.shape[0]], part):
                    found.append((start, part.shape[0], name))
        return sorted(found)

    with tempfile.TemporaryDirectory() as tmp:
        dense, moe = layer0(tiny_model("llama3", tmp)), layer0(tiny_model("qwen3moe", tmp))
    bars = [("self_attn.qkv_proj.weight", dense), ("mlp.gate_up_proj.weight", dense),
            ("mlp.experts.gate_up_proj", moe), ("mlp.experts.down_proj", moe)]
    fig, axes = plt.subplots(len(bars), 1, figsize=(12, 6.4))
    fig.suptitle("What load_weights merges (layer 0 of tiny llama3 and tiny qwen3moe)")
    for ax, (name, (stored, merged)) in zip(axes, bars):
        tensor = merged[name]
        total = tensor.reshape(-1, tensor.shape[-1]).shape[0]
        for start, n, part in placed(stored, tensor):
            short = part.replace("self_attn.", "").replace("mlp.experts.", "").replace(
                "mlp.", "").replace("_proj.weight", "").replace("_proj.bias", "")
            kind = short.split(".")[-1]
            color = COLORS[["q", "k", "v", "gate", "up", "down"].index(kind)]
            ax.barh(0, n, left=start, color=color, edgecolor="white")
            ax.text(start + n / 2, 0, short.replace(".", " "), ha="center", va="center",
                    color="white", fontsize=10 if n >= 32 else 8)
        ax.set_xlim(0, total)
        ax.set_yticks([])
        ax.set_title(f"{name}  {list(tensor.shape)}", loc="left", fontsize=11)
        ax.spines[["top", "right", "left"]].set_visible(False)
    axes[-1].set_xlabel("rows of the merged tensor (the expert dimension flattened)")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------- ch04
@figure("ch04", "top_k_top_p")
def top_k_top_p() -> plt.Figure:
    """Tiny llama3's next-token distribution after the ch04 main's prompt, sorted, and the set
    that top_k_top_p_filter keeps for the main's two sampled requests and a tighter top-p."""
    import torch
    from minisgl.engine.sample import top_k_top_p_filter
    from minisgl.models import load_model, sequence_logits
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_model("llama3", tmp)
        model, tok = load_model(path), AutoTokenizer.from_pretrained(path)
        with torch.no_grad():
            logits = sequence_logits(model, tok.encode("Once upon a time"))[-1]
    settings = [(0.8, 20, 1.0), (1.0, -1, 0.9), (1.0, -1, 0.5)]
    shown = 40
    fig, axes = plt.subplots(len(settings), 1, figsize=(12, 7.5), sharex=True)
    fig.suptitle("Top-k and top-p on tiny llama3's next token after 'Once upon a time'")
    for ax, (temperature, k, p) in zip(axes, settings):
        probs = torch.softmax(logits[None].float() / temperature, dim=-1)
        kept = top_k_top_p_filter(probs, torch.tensor([k]), torch.tensor([p]))[0]
        order = probs[0].argsort(descending=True)
        sorted_probs, sorted_kept = probs[0][order], kept[order] > 0
        colors = [COLORS[0] if keep else GREY for keep in sorted_kept[:shown]]
        ax.bar(range(shown), sorted_probs[:shown], width=0.85, color=colors)
        n_kept = int(sorted_kept.sum())
        mass = float(sorted_probs[sorted_kept].sum())
        what = f"top_k {k}" if k > 0 else f"top_p {p}"
        ax.set_title(f"temperature {temperature}, {what}: keeps {n_kept} of {len(order)} "
                     f"tokens, {mass:.0%} of the probability", loc="left")
        ax.axvline(n_kept - 0.5, color=COLORS[3], linestyle="--")
        ax.set_ylabel("probability")
        mass_line = ax.twinx()  # where the running total crosses top_p
        mass_line.step(range(shown), sorted_probs.cumsum(0)[:shown], where="mid",
                       color="#333333", linewidth=1.2)
        if p < 1.0:
            mass_line.axhline(p, color="#333333", linestyle=":")
            mass_line.text(shown - 0.5, p - 0.03, f"top_p {p}", ha="right", va="top")
        mass_line.set_ylim(0, 1.05)
        mass_line.set_ylabel("running total")
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1].set_xlabel(f"tokens by decreasing probability (the first {shown}); "
                        "blue: kept, grey: zeroed before the draw; line: running total")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ running a chapter's main
@dataclass
class Step:
    """What one Scheduler.step did, as a chapter's main ran it."""

    phase: str
    ran: dict[int, int]  # uid -> tokens run in this step's batch
    sampled: list[int]  # uids that got a token
    finished: list[int]
    waiting: list[int]  # uids still waiting once the step was done
    pages_used: int  # once the step's finished requests gave their pages back
    budget: int  # the prompt tokens a prefill may run (max_extend_tokens)


def run_main(main: str, steps: list[list[Step]] | None = None) -> dict:
    """Run examples/<main> as it is, quietly; its globals. With ``steps``, every run of the
    scheduler (from a step to the step that returns None) is recorded there."""
    if steps is None:
        return quietly(runpy.run_path, str(TREE / "examples" / main), run_name="__main__")
    from minisgl.scheduler import Scheduler

    real_add, real_step = Scheduler.add_req, Scheduler.step
    reqs = []

    def add_req(self, *args, **kwargs):
        reqs.append(real_add(self, *args, **kwargs))
        return reqs[-1]

    def step(self):
        before = {r.uid: len(r.output_ids) for r in reqs}
        out = real_step(self)
        if out is None:
            steps.append([])
            return out
        sampled = [r.uid for r in reqs if len(r.output_ids) > before.get(r.uid, 0)]
        used = self.engine.num_pages - self.cache_manager.num_free_pages
        steps[-1].append(Step(out.phase, dict(zip(out.uids, out.extend_lens)), sampled,
                              [r.uid for r in out.finished], [r.uid for r in self.waiting], used,
                              self.config.max_extend_tokens))
        return out

    steps.append([])
    Scheduler.add_req, Scheduler.step = add_req, step
    try:
        return quietly(runpy.run_path, str(TREE / "examples" / main), run_name="__main__")
    finally:
        Scheduler.add_req, Scheduler.step = real_add, real_step


# ---------------------------------------------------------------------------------------- ch05
@figure("ch05", "page_table")
def page_table() -> plt.Figure:
    """The ch05 main's request at its end: each position's slot (its page-table row) and where
    that slot sits in the pool of pages."""
    main = run_main("ch05_kvcache.py")
    size, num_pages, req = main["PAGE_SIZE"], main["NUM_PAGES"], main["req"]
    slots = main["ctx"].page_table[req.table_idx, : req.cached_len].tolist()
    prompt_len = len(req.input_ids)
    total = num_pages * size
    fig, ax = plt.subplots(figsize=(12, 4.6), layout="constrained")
    diagram(ax, total + 1, 9.2)
    fig.suptitle("The paged KV cache at the end of the chapter 5 main")
    offset = (total - len(slots)) / 2  # the request's positions, centred above the pool
    ax.text(offset - 0.3, 0.5, "position", ha="right", va="center")
    ax.text(offset - 0.3, 1.5, "page table\nrow 0 (slot)", ha="right", va="center")
    holder = {}  # physical page -> the request's page index (its positions // size)
    for pos, slot in enumerate(slots):
        color = COLORS[pos // size]  # one colour per page of the request
        holder[slot // size] = pos // size
        box(ax, offset + pos, 0, 1, 1, color, str(pos), color="white")
        box(ax, offset + pos, 1, 1, 1, LIGHT, str(slot), fontsize=9)
        if pos % size == 0:
            arrow(ax, (offset + pos + size / 2, 2.1), (slot + size / 2, 5.9), color=color)
    ax.text(offset, -0.4, f"prompt: positions 0–{prompt_len - 1}, then one decoded token a "
            f"step, up to {len(slots) - 1}", fontsize=10)
    used = {slot: pos for pos, slot in enumerate(slots)}
    ax.text(-0.2, 5.9, "KV pool", ha="left", va="bottom", fontweight="bold")
    for page in range(num_pages):
        held = page in holder
        color = COLORS[holder[page]] if held else GREY
        ax.text(page * size + size / 2, 7.9, f"page {page}" + ("" if held else " (free)"),
                ha="center", va="top", fontsize=10)
        for slot in range(page * size, (page + 1) * size):
            box(ax, slot, 6, 1, 1, color if slot in used else LIGHT,
                f"p{used[slot]}" if slot in used else "", color="white", fontsize=8)
            ax.text(slot + 0.5, 7.3, str(slot), ha="center", va="center", fontsize=7,
                    color="#666666")
    ax.text(total / 2, 8.8, f"slot = page × {size} + offset; the pages came from a shuffled "
            "free list, so they are not next to each other", ha="center", fontsize=10)
    return fig


# ---------------------------------------------------------------------------------------- ch06
@figure("ch06", "batch_layout")
def batch_layout() -> plt.Figure:
    """The first two batches Engine.prepare_batch laid out in the ch06 main: each request's
    new tokens one after another, with their positions and KV slots (out_loc)."""
    import torch
    from minisgl.engine.engine import Engine

    batches = []
    real = Engine.prepare_batch

    def prepare_batch(self, batch):
        real(self, batch)
        ends = torch.tensor([r.extend_len for r in batch.reqs]).cumsum(0).tolist()
        batches.append((batch.phase, [r.uid for r in batch.reqs for _ in range(r.extend_len)],
                        batch.input_ids.tolist(), batch.positions.tolist(),
                        batch.out_loc.tolist(), [e - 1 for e in ends]))

    Engine.prepare_batch = prepare_batch
    try:
        run_main("ch06_engine.py")
    finally:
        Engine.prepare_batch = real
    shown = batches[:2]
    width = max(len(b[1]) for b in shown)
    fig, ax = plt.subplots(figsize=(12, 5.2), layout="constrained")
    diagram(ax, width + 3, 10.5)
    fig.suptitle("One batch, one flat row of tokens: the chapter 6 main's first two forwards")
    for number, (phase, uids, ids, positions, out_loc, last) in enumerate(shown):
        top = number * 5.5
        ax.text(0, top + 0.3, f"step {number}: {phase}, T = {len(uids)} tokens", va="center",
                fontweight="bold")
        for row, (label, values) in enumerate((("input_ids", ids), ("positions", positions),
                                               ("out_loc", out_loc))):
            y = top + 1 + row
            ax.text(2.9, y + 0.5, label, ha="right", va="center")
            for i, (uid, value) in enumerate(zip(uids, values)):
                box(ax, 3 + i, y, 1, 1, COLORS[uid] if row else LIGHT, str(value),
                    color="white" if row else "black", fontsize=8)
        for i in last:
            ax.text(3 + i + 0.5, top + 4.3, "▲", ha="center", color=COLORS[uids[i]])
        ax.text(2.9, top + 4.4, "sampled", ha="right", va="center", fontsize=10)
    for uid in sorted(set(shown[0][1])):
        box(ax, 3 + 5 * uid, 10.8 - 0.6, 0.8, 0.6, COLORS[uid])
        ax.text(3.9 + 5 * uid, 10.5, f"request {uid}", va="center", fontsize=10)
    return fig


# ------------------------------------------------------------------------------- ch07 / ch10
PHASE_COLORS = {"prefill": COLORS[0], "decode": COLORS[2]}


def timeline(ax: Axes, steps: list[Step]) -> None:
    """Requests down, steps across: P prefill (n tokens run), D decode, * the last token,
    w waiting, . running but not in this step's batch."""
    uids = sorted({u for s in steps for u in [*s.ran, *s.waiting]})
    done: set[int] = set()
    started: set[int] = set()
    for x, step in enumerate(steps):
        for row, uid in enumerate(uids):
            if uid in step.ran:
                letter = "P" if step.phase == "prefill" else "D"
                if step.phase == "prefill" and len({*step.ran, *step.waiting}) > 0:
                    letter = f"P{step.ran[uid]}"
                letter += "*" if uid in step.finished else ""
                box(ax, x, row, 1, 1, PHASE_COLORS[step.phase], letter, color="white",
                    fontsize=9)
                started.add(uid)
            elif uid in step.waiting:
                box(ax, x, row, 1, 1, LIGHT, "w", color="#666666", fontsize=9)
            elif uid in started and uid not in done:
                box(ax, x, row, 1, 1, "#F8F8F8", "·", color="#666666")
        done.update(step.finished)
    ax.set_xlim(0, len(steps))
    ax.set_ylim(len(uids), 0)
    ax.set_xticks([x + 0.5 for x in range(len(steps))], range(len(steps)))
    ax.set_yticks([r + 0.5 for r in range(len(uids))], [f"request {u}" for u in uids])
    ax.tick_params(length=0)
    ax.spines[:].set_visible(False)


@figure("ch07", "schedule")
def schedule() -> plt.Figure:
    """The ch07 main's run: which request each step ran, and the pages in use after it."""
    steps: list[list[Step]] = []
    main = run_main("ch07_scheduler.py", steps)
    run, num_pages = steps[0], main["config"].num_pages
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 6.4), height_ratios=[2.2, 1],
                                      sharex=True, layout="constrained")
    fig.suptitle("Continuous batching in the chapter 7 main: 6 requests, 3 rows, "
                 f"{num_pages} pages")
    timeline(top, run)
    top.set_title("P prefill (tokens run), D decode, * last token, w waiting, · running but "
                  "not in the batch", loc="left", fontsize=10)
    colors = [PHASE_COLORS[s.phase] for s in run]
    bottom.bar([x + 0.5 for x in range(len(run))], [s.pages_used for s in run], width=0.7,
               color=colors)
    bottom.axhline(num_pages, color=COLORS[3], linestyle="--")
    bottom.text(0.05, num_pages, f"the pool: {num_pages} pages", va="bottom", color=COLORS[3])
    bottom.set_ylim(0, num_pages + 3)
    bottom.set_ylabel("pages used\nafter the step")
    bottom.set_xlabel("step")
    bottom.spines[["top", "right"]].set_visible(False)
    return fig


# ---------------------------------------------------------------------------------------- ch08
def draw_tree(ax: Axes, cache, decode: Callable[[list[int]], str], title: str) -> None:
    """The radix tree left to right, one box per node: its tokens, slots and references."""
    rows: list[tuple[int, object]] = []  # (depth, node) in drawing order

    def walk(node, depth: int) -> None:
        for child in node.children.values():
            rows.append((depth, child))
            walk(child, depth + 1)

    walk(cache.root, 0)
    where = {}
    ax.text(0, 0.5, "root", va="center", fontweight="bold")
    for row, (depth, node) in enumerate(rows, 1):
        x, y = 0.6 + depth * 4.2, row
        slots = node.value.tolist()
        text = f"{decode(node.key)!r}\nslots {slots[0]}–{slots[-1]}, ref {node.ref_count}"
        color = COLORS[3] if node.ref_count else COLORS[0]
        ax.text(x, y + 0.45, text, va="center", fontsize=9, color="white",
                bbox=dict(boxstyle="round", facecolor=color, edgecolor="none"))
        parent = where.get(id(node.parent), (0.2, 0.75))
        ax.plot([parent[0], parent[0], x - 0.1], [parent[1], y + 0.45, y + 0.45],
                color="#666666", linewidth=1)
        where[id(node)] = (x + 0.3, y + 0.85)
    ax.set_xlim(0, 12)
    ax.set_ylim(max(len(rows), 3) + 0.6, 0)
    ax.axis("off")
    ax.set_title(title, loc="left", fontsize=11)


@figure("ch08", "radix_split")
def radix_split() -> plt.Figure:
    """The ch08 main's tree, rebuilt with RadixPrefixCache: one sentence, then the match that
    splits its edge, then the second sentence inserted below the split."""
    import copy

    import torch
    from minisgl.kvcache.radix_cache import RadixPrefixCache
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tok = AutoTokenizer.from_pretrained(tiny_model("llama3", tmp))
    cache = RadixPrefixCache(page_size=1)
    fox = tok.encode("The quick brown fox jumps over the lazy dog.")
    cat = tok.encode("The quick brown cat sleeps.")
    cache.insert_prefix(fox, torch.arange(len(fox), dtype=torch.int32))
    states = [("1. insert 'The quick brown fox jumps\nover the lazy dog.': one edge",
               copy.deepcopy(cache))]
    hit = cache.match_prefix(cat)
    states.append((f"2. match 'The quick brown cat sleeps.':\n{hit.cached_len} tokens hit, "
                   "the edge splits there", copy.deepcopy(cache)))
    cache.insert_prefix(cat, torch.arange(len(fox), len(fox) + len(cat), dtype=torch.int32))
    states.append(("3. insert it: the tokens not cached yet\nbecome a second child", cache))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), layout="constrained")
    fig.suptitle("The radix tree before and after a split (page size 1; ref: the locks held)")
    for ax, (title, state) in zip(axes, states):
        draw_tree(ax, state, tok.decode, title)
    return fig


# ---------------------------------------------------------------------------------------- ch09
@figure("ch09", "chunks")
def chunks() -> plt.Figure:
    """The ch09 main's first run: the prompt tokens each request ran in each step, under its
    budget a prefill."""
    steps: list[list[Step]] = []
    main = run_main("ch09_chunked.py", steps)
    run = steps[0]
    budget = run[0].budget
    prompts = [len(p) for p in main["prompts"]]
    fig, ax = plt.subplots(figsize=(12, 4.8), layout="constrained")
    fig.suptitle(f"Chunked prefill in the chapter 9 main: prompts of {prompts} tokens, "
                 f"a budget of {budget} a prefill")
    for x, step in enumerate(run):
        bottom = 0
        for uid, n in step.ran.items():
            ax.bar(x, n, bottom=bottom, color=COLORS[uid], edgecolor="white",
                   hatch="" if step.phase == "prefill" else "//")
            ax.text(x, bottom + n / 2, f"{n}", ha="center", va="center", color="white")
            bottom += n
        for i, uid in enumerate(step.sampled):
            ax.text(x, bottom + 0.3 + 0.6 * i, f"token → {uid}", ha="center", fontsize=8,
                    color=COLORS[uid])
    ax.axhline(budget, color=COLORS[3], linestyle="--")
    ax.text(len(run) - 0.5, budget + 0.1, f"budget {budget}", ha="right", va="bottom",
            color=COLORS[3])
    ax.set_xticks(range(len(run)), [f"{x}\n{s.phase}" for x, s in enumerate(run)])
    ax.set_ylabel("tokens run in the step")
    ax.set_ylim(0, budget + 3)
    handles = [Rectangle((0, 0), 1, 1, color=COLORS[u]) for u in range(len(prompts))]
    ax.legend(handles, [f"request {u} ({n} prompt tokens)" for u, n in enumerate(prompts)],
              loc="upper right")
    ax.spines[["top", "right"]].set_visible(False)
    return fig


# ---------------------------------------------------------------------------------------- ch10
@figure("ch10", "lifetimes")
def lifetimes() -> plt.Figure:
    """The steps of the ch10 main's first LLM.generate call, as the scheduler reported them."""
    steps: list[list[Step]] = []
    main = run_main("ch10_llm.py", steps)
    run = steps[0]
    config = main["llm"].scheduler.config
    fig, ax = plt.subplots(figsize=(12, 3.6), layout="constrained")
    fig.suptitle(f"One LLM.generate call in the chapter 10 main: {len(main['PROMPTS'])} "
                 f"prompts, budget {config.max_extend_tokens} prompt tokens a prefill")
    timeline(ax, run)
    ax.set_title("P n: a prefill of n prompt tokens, D decode, * last token, w waiting "
                 "(admitted or not)", loc="left", fontsize=10)
    ax.set_xlabel("step")
    return fig



# ---------------------------------------------------------------------------------------- ch11
def draw_offsets(ax: Axes, tok, ids: list[int], stop: list[str],
                 title: str) -> list[tuple[str, str]]:
    """One row per step of a stream: each id as final (before surr_offset), context (surr to
    read), not final yet (after read_offset) or not arrived; on the right, the piece sent.
    Returns the legend's entries."""
    from minisgl.tokenizer import DecodeState, detokenize

    state = DecodeState(stop=stop)
    kinds = [("final: in the text, never decoded again", GREY),
             ("surr_offset..read_offset: decoded again as context", COLORS[0]),
             ("read_offset..: decoded, not final (inside a character)", COLORS[1]),
             ("ignored: after the stop string", LIGHT)]
    n = len(ids)
    diagram(ax, n + 7.5, n + 1.6)
    ax.set_title(title, loc="left", fontsize=11)
    for j, token in enumerate(ids):
        ax.text(j + 0.5, 0.8, token_label(tok, token), ha="center", va="center", fontsize=8)
    for step in range(n):
        piece = detokenize(tok, [state], [[ids[step]]], [step == n - 1])[0]
        y = step + 1.1
        ax.text(-0.2, y + 0.4, f"step {step}", ha="right", va="center", fontsize=9)
        for j in range(step + 1):
            if state.finish_reason == "stop" and j >= len(state.ids):
                kind = 3
            else:
                kind = 0 if j < state.surr_offset else 1 if j < state.read_offset else 2
            box(ax, j, y, 1, 0.8, kinds[kind][1])
        sent = f"sent {piece!r}" if piece else "sent nothing"
        if state.finish_reason and not piece:
            sent += f"  (finish_reason={state.finish_reason!r})"
        ax.text(n + 0.3, y + 0.4, f"{sent}   surr {state.surr_offset}, read "
                f"{state.read_offset}, sent {state.sent_offset} chars", va="center", fontsize=9)
    return kinds


def token_label(tok, token: int) -> str:
    """A token's bytes, ASCII as itself, others in hex: 'f c3a9'."""
    table = {ch: b for b, ch in enumerate(byte_level_alphabet())}
    raw = bytes(table[c] for c in tok.convert_ids_to_tokens(token))
    return "\n".join(chr(b) if 32 < b < 127 else f"{b:02x}" for b in raw)


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: the character that stands for each byte 0..255 in a token."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    others = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(others)) for b in range(256)]


@figure("ch11", "offsets")
def offsets() -> plt.Figure:
    """The ch11 main's reply streamed one token at a time, with and without its stop string."""
    main = run_main("ch11_tokenizer.py")
    tok, ids = main["tok"], main["reply_ids"]
    fig, axes = plt.subplots(2, 1, figsize=(12, 9.5), layout="constrained")
    fig.suptitle(f"Incremental detokenization of {main['reply']!r} ({len(ids)} byte-level "
                 "tokens, bytes shown above each)")
    draw_offsets(axes[0], tok, ids, [], "no stop string: every piece as soon as it is final")
    kinds = draw_offsets(axes[1], tok, ids, ["很好"], "stop=['很好']: 很 waits as the start of "
                         "the stop string, then the stop string is cut")
    handles = [Rectangle((0, 0), 1, 1, color=c) for _, c in kinds]
    fig.legend(handles, [k for k, _ in kinds], loc="outside lower center", ncols=2,
               frameon=False)
    return fig


# ---------------------------------------------------------------------------------------- ch12
def run_lockstep(requests: list) -> list[tuple[str, str, object]]:
    """The ch12 main's worker classes, TokenizerServer and SchedulerLoop, run in this process in
    lockstep (no sockets, so no timing): every message (sender, receiver, message) in order."""
    from minisgl.scheduler import Scheduler, SchedulerConfig
    from minisgl.scheduler.io import SchedulerLoop
    from minisgl.tokenizer.server import TokenizerServer
    from transformers import AutoTokenizer

    main = runpy.run_path(str(TREE / "examples" / "ch12_processes.py"), run_name="figure")
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_model("qwen3", tmp)
        server = TokenizerServer(AutoTokenizer.from_pretrained(path))
        loop = SchedulerLoop(Scheduler(SchedulerConfig(path, **main["OPTIONS"])))
        events: list[tuple[str, str, object]] = [("frontend", "tokenizer", r) for r in requests]
        inbox = list(requests)
        while inbox:
            to_backend, replies = server.handle(inbox)
            events += [("tokenizer", "scheduler", m) for m in to_backend]
            events += [("tokenizer", "frontend", m) for m in replies]
            inbox = [out for m in to_backend for out in loop.handle(m)]
            phase = loop.scheduler.prefill_manager.runnable and "prefill" or "decode"
            step = loop.step()
            if step:
                events.append(("scheduler", "step", phase))
            events += [("scheduler", "tokenizer", m) for m in step]
            inbox += step
    return events


def message_label(msg: object) -> str:
    """A message as the figure writes it: its class and the fields that matter here."""
    name = type(msg).__name__
    if name == "TokenizeMsg":
        return f"TokenizeMsg(uid={msg.uid}, {msg.text!r}, stop={msg.stop})"
    if name == "UserMsg":
        return f"UserMsg(uid={msg.uid}, input_ids={msg.input_ids.tolist()} {msg.input_ids.dtype})"
    if name == "DetokenizeMsg":
        end = f", finished, {msg.finish_reason!r}" if msg.finished else ""
        return f"DetokenizeMsg(uid={msg.uid}, next_token={msg.next_token}{end})"
    if name == "UserReply":
        end = f", finished, {msg.finish_reason!r}" if msg.finished else ""
        return f"UserReply(uid={msg.uid}, {msg.incremental_output!r}, {msg.token_ids}{end})"
    return f"{name}(uid={msg.uid})"


@figure("ch12", "messages")
def messages() -> plt.Figure:
    """One request of the ch12 main (the one with a stop string), message by message between the
    three processes: the frontend, the tokenizer worker and the scheduler."""
    from minisgl.core import SamplingParams
    from minisgl.message import TokenizeMsg

    request = TokenizeMsg(1, "Hello world", SamplingParams(max_tokens=10, ignore_eos=True),
                          stop=["lazy"])
    events = run_lockstep([request])
    lanes = {"frontend": 0.0, "tokenizer": 5.0, "scheduler": 10.0}
    titles = ["frontend (main process)\nbinds …/frontend", "tokenizer worker\nbinds …/tokenizer",
              "scheduler\nbinds …/scheduler"]
    rows = len(events)
    fig, ax = plt.subplots(figsize=(13, 0.42 * rows + 1.6), layout="constrained")
    fig.suptitle("One request's messages (ch12 main, request 1: 'Hello world', stop ['lazy'])")
    diagram(ax, 13.2, rows + 1.2)
    for (x, title) in zip(lanes.values(), titles):
        ax.plot([x, x], [0.6, rows + 1], color=GREY, linewidth=2, zorder=0)
        ax.text(x, 0.4, title, ha="center", va="bottom", fontsize=10, fontweight="bold")
    steps = 0
    for y, (sender, receiver, msg) in enumerate(events, start=1):
        if receiver == "step":
            steps += 1
            ax.text(lanes["scheduler"] + 0.2, y + 0.5, f"step {steps}: {msg}", va="center",
                    fontsize=9, color=COLORS[3])
            continue
        start, end = lanes[sender], lanes[receiver]
        color = COLORS[0] if end > start else COLORS[2]
        arrow(ax, (start, y + 0.5), (end, y + 0.5), color=color)
        ax.text((start + end) / 2, y + 0.42, message_label(msg), ha="center", va="bottom",
                fontsize=8.5, family="DejaVu Sans Mono")
    return fig

# ---------------------------------------------------------------------------------------- ch13
def request_messages(model: str) -> list[tuple[str, str, str]]:
    """One streamed request of the ch13 main ("Hello world", stop=["lazy"]) through the real
    TokenizerServer, SchedulerLoop and the API server's ReplyFormat, driven in this process one
    scheduler step at a time: (from, to, what) for every message, in order."""
    from minisgl.core import SamplingParams
    from minisgl.message import TokenizeMsg, UserMsg
    from minisgl.scheduler import Scheduler, SchedulerConfig
    from minisgl.scheduler.io import SchedulerLoop
    from minisgl.server.api_server import ReplyFormat
    from minisgl.tokenizer.server import TokenizerServer
    from transformers import AutoTokenizer

    tokenizer = TokenizerServer(AutoTokenizer.from_pretrained(model))
    loop = SchedulerLoop(Scheduler(SchedulerConfig(model, device="cpu", page_size=4,
                                                   num_pages=128)))
    fmt = ReplyFormat(chat=False, model="qwen3")
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    log = [("client", "api", 'POST /v1/completions {"prompt": "Hello world", "stop": '
            '["lazy"], "stream": true}'),
           ("api", "tokenizer", 'TokenizeMsg(uid=0, text="Hello world", stop=["lazy"])')]
    to_backend, replies = tokenizer.handle([TokenizeMsg(0, "Hello world", params, ["lazy"])])
    finished = False
    while not finished:
        for msg in to_backend:
            what = (f"UserMsg(uid=0, input_ids={msg.input_ids.tolist()})"
                    if isinstance(msg, UserMsg) else f"{type(msg).__name__}(uid={msg.uid})")
            log.append(("tokenizer", "scheduler", what))
            loop.handle(msg)
        for reply in replies:
            log.append(("tokenizer", "api", f"UserReply({reply.incremental_output!r}, "
                        f"token_ids={reply.token_ids}, finished={reply.finished})"))
            chunk = fmt.chunk(reply.incremental_output, reply.finish_reason or None)["choices"]
            text, reason = chunk[0]["text"], chunk[0]["finish_reason"]
            if text or reply.finished:
                log.append(("api", "client", f'data: {{"text": {text!r}, "finish_reason": '
                            f'{reason!r}, ...}}'.replace("'", '"').replace("None", "null")))
            finished |= reply.finished
        if finished:
            break
        msgs = loop.step()
        for msg in msgs:
            log.append(("scheduler", "tokenizer", f"DetokenizeMsg(uid=0, next_token="
                        f"{msg.next_token}, finished={msg.finished})"))
        to_backend, replies = tokenizer.handle(msgs)
    log.append(("api", "client", "data: [DONE]"))
    loop.scheduler.shutdown()
    return log


@figure("ch13", "request_messages")
def request_messages_figure() -> plt.Figure:
    with tempfile.TemporaryDirectory() as tmp:
        log = request_messages(tiny_model("qwen3", tmp))
    lanes = {"client": 0, "api": 1, "tokenizer": 2, "scheduler": 3}
    names = ["HTTP client", "API server (main process)", "tokenizer / detokenizer worker",
             "scheduler process"]
    xs = [1.2, 5.2, 9.2, 13.2]
    fig, ax = plt.subplots(figsize=(13, 0.42 * len(log) + 1.6), layout="constrained")
    fig.suptitle("One streamed request's messages, in order (the ch13 main's stop=['lazy'] "
                 "request, one scheduler step at a time)")
    diagram(ax, 14.4, len(log) + 1.2)
    for x, name in zip(xs, names):
        ax.text(x, 0.2, name, ha="center", va="center", fontsize=10, weight="bold")
        ax.plot([x, x], [0.5, len(log) + 1], color=GREY, linewidth=1)
    for i, (src, dst, what) in enumerate(log):
        y = i + 1.0
        a, b = xs[lanes[src]], xs[lanes[dst]]
        color = COLORS[{"client": 3, "api": 0, "tokenizer": 1, "scheduler": 2}[src]]
        arrow(ax, (a, y), (b, y), color=color)
        left = min(a, b) if abs(b - a) > 4.5 else min(a, b) - 0.1
        ax.text(left + 0.1, y - 0.12, what, va="bottom", fontsize=7.5, color="#222222",
                clip_on=False)
    return fig


# ---------------------------------------------------------------------------------------- ch14
class LockstepChat:
    """chapter 14's ``ChatClient`` without the sockets: ``stream`` has its interface and runs
    the real TokenizerServer and SchedulerLoop in this process, one scheduler step per reply
    piece, so the figure has no timing in it. ``log`` gets one row per step."""

    def __init__(self, model: str, stats):
        from minisgl.scheduler import Scheduler, SchedulerConfig
        from minisgl.scheduler.io import SchedulerLoop
        from minisgl.tokenizer.server import TokenizerServer
        from transformers import AutoTokenizer

        self.tokenizer = TokenizerServer(AutoTokenizer.from_pretrained(model))
        self.loop = SchedulerLoop(Scheduler(SchedulerConfig(model, device="cpu", page_size=4,
                                                            num_pages=128)))
        self.stats, self.log, self.turn, self.uid = stats, [], 0, 0
        self.stats.publish(self.loop.scheduler)

    def send(self, msgs: list) -> list:
        to_backend, replies = self.tokenizer.handle(msgs)
        for msg in to_backend:
            if type(msg).__name__ == "UserMsg":
                self.log.append({"turn": self.turn, "event": "prompt",
                                 "tokens": len(msg.input_ids)})
            self.loop.handle(msg)
        return replies

    def record(self, event: str, piece: str = "") -> None:
        s = self.stats.read()
        in_use = s["kv_pages_total"] - s["kv_pages_free"] - s["kv_pages_cached"]
        self.log.append({"turn": self.turn, "event": event, "piece": piece, "in_use": in_use,
                         "cached": s["kv_pages_cached"], "running": s["num_running_reqs"]})

    def stream(self, messages: list, params):
        from minisgl.message import AbortMsg, TokenizeMsg

        self.turn, self.uid = self.turn + 1, self.uid + 1
        self.log.append({"turn": self.turn, "event": "messages", "count": len(messages)})
        replies, finished = self.send([TokenizeMsg(self.uid, messages, params)]), False
        try:
            while not finished:
                replies = self.send(self.loop.step())
                self.stats.publish(self.loop.scheduler)
                for reply in replies:
                    finished = reply.finished
                    self.record("piece", reply.incremental_output)
                    yield reply.incremental_output
        finally:
            if not finished:
                self.send([AbortMsg(self.uid)])
                self.stats.publish(self.loop.scheduler)
                self.record("abort")
            else:
                self.record("done")


class CtrlCAfter:
    """The shell's output: raises KeyboardInterrupt (as Ctrl-C would) once ``turn``'s reply has
    printed ``pieces`` pieces."""

    def __init__(self, chat: LockstepChat, turn: int, pieces: int):
        self.chat, self.turn, self.pieces, self.seen = chat, turn, pieces, 0

    def write(self, text: str) -> None:
        if self.chat.turn == self.turn and text and not text.startswith("\n"):
            self.seen += 1
            if self.seen > self.pieces:
                raise KeyboardInterrupt

    def flush(self) -> None:
        pass


def shell_session(model: str) -> list[dict]:
    """The ch14 main's session through the real ``Shell``: two turns, /reset, a long reply
    stopped after 6 pieces; every scheduler step's pages."""
    from functools import partial

    from minisgl.core import SamplingParams
    from minisgl.server.launch import SchedulerStats
    from minisgl.shell import Shell, prompt_length
    from transformers import AutoTokenizer

    chat = LockstepChat(model, SchedulerStats())
    count_tokens = partial(prompt_length, AutoTokenizer.from_pretrained(model))
    context = 128 * 4  # LockstepChat's pool: 128 pages of 4 tokens
    shell = Shell(chat, SamplingParams(max_tokens=16), chat.stats, count_tokens, context,
                  out=CtrlCAfter(chat, 3, 6))
    for line in ["What is the weather today?", "And tomorrow?", "/reset"]:
        shell.handle(line)
    shell.params = SamplingParams(max_tokens=64)
    shell.handle("Tell me a long story")
    chat.loop.scheduler.shutdown()
    return chat.log


@figure("ch14", "turns")
def turns_figure() -> plt.Figure:
    with tempfile.TemporaryDirectory() as tmp:
        log = shell_session(tiny_model("qwen3", tmp))
    steps = [row for row in log if "in_use" in row]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 6), sharex=True, height_ratios=[1, 1.3],
                                      layout="constrained")
    fig.suptitle("A shell session, one scheduler step at a time: three turns, the third "
                 "stopped by Ctrl-C")
    x = range(len(steps))
    for turn in sorted({row["turn"] for row in steps}):
        xs = [i for i, row in enumerate(steps) if row["turn"] == turn]
        count = next(r["count"] for r in log if r["turn"] == turn and r["event"] == "messages")
        tokens = next(r["tokens"] for r in log if r["turn"] == turn and r["event"] == "prompt")
        color = COLORS[turn - 1]
        top.broken_barh([(xs[0] - 0.4, xs[-1] - xs[0] + 0.8)], (turn - 0.35, 0.7),
                        facecolors=color, alpha=0.25)
        pieces = [i for i in xs if steps[i]["event"] == "piece"]
        top.plot(pieces, [turn] * len(pieces), "|", color=color, markersize=14)
        label = (f"turn {turn}: {count} message{'s' if count > 1 else ''} through the "
                 f"template, {tokens} prompt tokens, {len(pieces)} pieces")
        top.text(xs[0], turn - 0.45, label, fontsize=9, va="bottom")
        if steps[xs[-1]]["event"] == "abort":
            top.annotate("Ctrl-C: AbortMsg, the\nscheduler drops it", (xs[-1], turn),
                         (xs[-1] + 1.5, turn + 0.25), fontsize=9, color=COLORS[3],
                         arrowprops=dict(arrowstyle="-|>", color=COLORS[3]))
    top.set_ylim(3.7, 0.3)
    top.set_xlim(-1, len(steps) + 12)  # room for the last turn's labels
    top.set_yticks([1, 2, 3], ["turn 1", "turn 2\n(after turn 1)", "turn 3\n(after /reset)"])
    top.set_title("each tick is a reply piece that the shell prints", fontsize=10)
    bottom.step(x, [row["in_use"] for row in steps], where="mid", color=COLORS[0],
                label="pages held by the running request")
    bottom.step(x, [row["cached"] for row in steps], where="mid", color=COLORS[2],
                label="pages held only by the prefix cache")
    bottom.set_ylabel("KV pages (4 tokens each)")
    bottom.set_xlabel("scheduler step (and each turn's end)")
    bottom.legend(loc="upper left", fontsize=9)
    bottom.grid(alpha=0.3)
    return fig


# ---------------------------------------------------------------------------------------- ch15
@figure("ch15", "workload_floor")
def workload_floor() -> plt.Figure:
    """nano-vllm's workload as ch15's main draws it, and the bandwidth floor of a decode step of
    Qwen3-0.6B in bf16 on an H200 (4,800 GB/s) by batch size, from the main's arithmetic."""
    from ch15_measure import (
        SHAPES,
        decode_floor_s,
        kv_bytes_per_token,
        nano_vllm_workload,
        weight_bytes,
    )

    prompts, params = nano_vllm_workload()
    ins, outs = [len(p) for p in prompts], [p.max_tokens for p in params]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    fig.suptitle("The benchmark's workload, and the fastest a decode step can be")
    bins = list(range(100, 1025, 50)) + [1025]
    left.hist([ins, outs], bins=bins, color=COLORS[:2],
              label=[f"input: {sum(ins):,} tokens", f"output: {sum(outs):,} tokens"])
    left.set_xlabel("tokens per sequence")
    left.set_ylabel("sequences")
    left.set_title("nano-vllm's 256 sequences (random.seed(0)):\nlengths uniform in 100..1024",
                   fontsize=10)
    left.legend(fontsize=9)
    config = SHAPES["qwen3-0.6b"]
    weights, kv = weight_bytes(config), kv_bytes_per_token(config)
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    for color, context in zip(COLORS[2:], (256, 1024, 2048)):
        rates = [b / decode_floor_s(weights, kv, b * context, 4.8e12) for b in batches]
        right.plot(batches, rates, "o-", color=color, label=f"every sequence at {context:,} "
                   "tokens of context")
    weights_only = [b / decode_floor_s(weights, kv, 0, 4.8e12) for b in batches]
    right.plot(batches, weights_only, "--", color=GREY, label="weights alone (no KV read)")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xticks(batches, [str(b) for b in batches])
    right.set_xlabel("sequences decoded together (batch size)")
    right.set_ylabel("output tokens/s at the floor")
    right.set_title(f"Qwen3-0.6B in bf16 ({weights / 1e9:.2f} GB of weights, "
                    f"{kv / 1024:.0f} KiB of KV a token),\nan H200 reading 4,800 GB/s",
                    fontsize=10)
    right.legend(fontsize=9)
    right.grid(alpha=0.3, which="both")
    return fig


H200_RESULTS = ROOT / "benchmark/results/h200_2026-12-01.json"  # measured, not computed here


@figure("ch15", "throughput_by_chapter")
def throughput_by_chapter() -> plt.Figure:
    """The H200 runs recorded in benchmark/results: output tokens/s of each chapter's engine and
    of transformers on nano-vllm's workload, under the bandwidth floor of ch15's main."""
    import json
    import textwrap

    record = json.loads(H200_RESULTS.read_text(encoding="utf-8"))
    runs = sorted(record["runs"], key=lambda r: r["chapter"] or 99)  # transformers last
    floor = record["floor_tokens_per_s"]
    rates = [r["tokens_per_s"] for r in runs]
    partial = [not r["scope"].startswith("whole workload") for r in runs]
    colors = [COLORS[i] if r["chapter"] else GREY for i, r in enumerate(runs)]
    fig, ax = plt.subplots(figsize=(10, 5.6), layout="constrained")
    fig.suptitle(f"Output tokens/s on an H200, chapter by chapter ({record['date']})")
    x = range(len(runs))
    bars = ax.bar(x, rates, color=colors, width=0.6)
    for bar, cut in zip(bars, partial):
        if cut:  # another slice of the workload: drawn hatched and footnoted
            bar.set_hatch("//")
            bar.set_edgecolor("white")
    for i, rate, cut in zip(x, rates, partial):
        ax.text(i, rate * 1.12, f"{rate:,}" + (" *" if cut else ""), ha="center", fontsize=10)
    ax.axhline(floor, color=COLORS[3], linestyle="--",
               label=f"bandwidth floor: {floor:,} (ch15's main, 4,800 GB/s)")
    ax.set_yscale("log")
    ax.set_ylim(50, floor * 2.5)
    ax.set_xticks(list(x), [textwrap.fill(r["label"], 20) for r in runs], fontsize=9)
    ax.set_ylabel("output tokens/s (log scale)")
    best = max(r for r, run in zip(rates, runs) if run["chapter"])
    baseline = next(r for r, run in zip(rates, runs) if not run["chapter"])
    ax.set_title(f"{record['model']}; nano-vllm's workload\nthe fastest, {best:,}, is "
                 f"{best / baseline:.0f}x transformers and {100 * best / floor:.0f}% of the floor",
                 fontsize=10)
    notes = [f"* {r['scope']}" for r, cut in zip(runs, partial) if cut]
    ax.text(0.01, 0.97, "\n".join(notes), transform=ax.transAxes, va="top", fontsize=9)
    ax.legend(loc="upper right", fontsize=9)
    ax.grid(alpha=0.3, axis="y", which="both")
    return fig


# ---------------------------------------------------------------------------------------- ch16
def split_ranges(seq_len: int, num_splits: int, block_n: int) -> list[tuple[int, int]]:
    """(start, end) of each split's keys, as decode's two stages compute them (``_split_len``):
    an even share rounded up to whole blocks; a split starting at or past seq_len is empty."""
    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    split_len = cdiv(cdiv(seq_len, num_splits), block_n) * block_n
    return [(s * split_len, min((s + 1) * split_len, seq_len)) for s in range(num_splits)]


@figure("ch16", "split_k")
def split_k() -> plt.Figure:
    """Split-K decode at Qwen3-0.6B's shape (8 KV heads, bf16 tiles): the kernel's own
    default_num_kv_splits by batch size, and the keys each split of a 4-request batch reads
    (the workload's first four sequences at their 300th decode step)."""
    from ch15_measure import SHAPES, nano_vllm_workload
    from minisgl.kernel.attention import DECODE_TILES, default_num_kv_splits

    kv_heads = SHAPES["qwen3-0.6b"]["num_key_value_heads"]
    block_n = DECODE_TILES["16bit"]["BLOCK_N"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5), width_ratios=[1, 1.25],
                                      layout="constrained")
    fig.suptitle("Split-K decode: how a batch's keys are divided among the kernel's programs")
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    splits = [default_num_kv_splits(b, kv_heads) for b in batches]
    programs = [b * kv_heads * s for b, s in zip(batches, splits)]
    x = range(len(batches))
    left.bar(x, splits, color=COLORS[0], label="splits per request (left axis)")
    for i, s in zip(x, splits):
        left.text(i, s + 0.4, str(s), ha="center", fontsize=9)
    left.set_xticks(list(x), [str(b) for b in batches])
    left.set_xlabel("requests in the decode batch")
    left.set_ylabel("num_kv_splits")
    left.set_ylim(0, 44)  # the legend above the bars
    left.set_title(f"default_num_kv_splits, {kv_heads} KV heads: aim at ~1,024 programs",
                   fontsize=10)
    count = left.twinx()
    count.plot(x, programs, "o-", color=COLORS[1], label="stage-1 programs: B x KV heads x splits")
    count.axhline(132, color=GREY, linestyle="--", label="an H200's 132 SMs")
    count.set_yscale("log", base=2)
    count.set_ylim(2**6, 2**15)  # the legend above the curve
    count.set_ylabel("stage-1 programs (right axis)")
    handles = left.get_legend_handles_labels()[0] + count.get_legend_handles_labels()[0]
    left.legend(handles=handles, loc="upper right", fontsize=9)

    prompts, _ = nano_vllm_workload(4)
    lens = [len(p) + 300 for p in prompts]  # context at decode step 300, the new token included
    num_splits = default_num_kv_splits(len(lens), kv_heads)
    for row, seq_len in enumerate(lens):
        ranges = split_ranges(seq_len, num_splits, block_n)
        full = [(a, b - a) for a, b in ranges if a < b]
        for i, (start, width) in enumerate(full):
            right.broken_barh([(start, width)], (row - 0.35, 0.7),
                              facecolors=COLORS[i % 2], edgecolor="white")
        right.text(seq_len + 30, row, f"{seq_len:,} keys: {len(full)} splits of "
                   f"{ranges[0][1]}, {num_splits - len(full)} empty", va="center", fontsize=9)
    right.set_yticks(range(len(lens)), [f"request {i}" for i in range(len(lens))])
    right.set_ylim(len(lens) - 0.4, -0.6)
    right.set_xlim(0, max(lens) * 1.6)
    right.set_xlabel("key position (each split a bar; its keys read through the page table)")
    right.set_title(f"a batch of {len(lens)}: {num_splits} splits each, an even share rounded "
                    f"up to whole {block_n}-key blocks", fontsize=10)
    right.grid(alpha=0.3, axis="x")
    return fig


# ---------------------------------------------------------------------------------------- ch17
@figure("ch17", "padding")
def graph_padding() -> plt.Figure:
    """The captured sizes up to 256 and, for every decode batch of 1..256, the graph it runs
    and the dummy rows that pads it, from graph_batch_sizes and padded_size."""
    from minisgl.engine.graph import graph_batch_sizes, padded_size

    sizes = graph_batch_sizes(256)
    batches = list(range(1, 257))
    padded = [padded_size(sizes, b) or 0 for b in batches]
    dummy = [p - b for p, b in zip(padded, batches)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    fig.suptitle(f"{len(sizes)} CUDA graphs serve every decode batch of 1 to 256")
    near = [b for b in batches if b <= 40]
    left.step(near, padded[: len(near)], ".-", where="post", color=COLORS[0],
              label="the graph it replays (padded size)")
    left.plot(near, near, "--", color=GREY, label="the batch itself")
    captured = [s for s in sizes if s <= 40]
    first = ", ".join(map(str, captured[:5]))
    left.plot(captured, captured, "o", color=COLORS[1], label=f"captured sizes: {first} ...")
    left.set_xlabel("decode batch size")
    left.set_ylabel("rows run")
    left.set_title("Batches 1 to 40: a batch runs the smallest captured size that holds it",
                   fontsize=10)
    left.legend(fontsize=9, loc="upper left")
    left.grid(alpha=0.3)
    share = 100 * sum(dummy) / sum(padded)
    right.bar(batches, dummy, width=1.0, color=COLORS[3])
    right.set_xlabel("decode batch size")
    right.set_ylabel("dummy rows")
    right.set_xticks([1, 32, 64, 96, 128, 160, 192, 224, 256])
    right.set_title(f"Dummy rows: at most {max(dummy)}, {sum(dummy) / len(batches):.2f} on "
                    f"average;\n{share:.1f}% of all rows run over batches 1..256", fontsize=10)
    right.grid(alpha=0.3, axis="y")
    return fig


# ---------------------------------------------------------------------------------------- ch18
def scheduler_events(path: str, overlap: bool) -> list[tuple[str, int, str]]:
    """What the scheduler did, in order, on three requests like the main's: ("launch", k,
    batch) and ("process", k, batch) for the k-th batch, recorded around its own _launch_next
    and _process."""
    from minisgl.core import SamplingParams
    from minisgl.scheduler import Scheduler, SchedulerConfig

    s = Scheduler(SchedulerConfig(path, device="cpu", overlap_scheduling=overlap))
    events: list[tuple[str, int, str]] = []
    launch, process = s._launch_next, s._process
    batches: list = []  # the k-th launched, kept alive so that no two share an id

    def name(batch) -> str:
        return f"{batch.phase[0].upper()}{[r.uid for r in batch.reqs]}"

    def logged_launch():
        launched = launch()
        if launched is not None:
            batches.append(launched.batch)
            events.append(("launch", len(batches) - 1, name(launched.batch)))
        return launched

    def logged_process(done):
        k = next(i for i, b in enumerate(batches) if b is done.batch)
        events.append(("process", k, name(done.batch)))
        return process(done)

    s._launch_next, s._process = logged_launch, logged_process
    params = [SamplingParams(max_tokens=4, ignore_eos=True), SamplingParams(max_tokens=3,
              ignore_eos=True), SamplingParams(max_tokens=1)]
    for prompt, sp in zip([[3, 1, 4, 1, 5], [2, 7, 1, 8], [6] * 6], params):
        s.add_req(prompt, sp)
    s.run_until_idle()
    return events


def replay_timeline(events: list[tuple[str, int, str]], host: float, forward: float) -> dict:
    """Times for the recorded order under assumed costs: each launch and each process takes
    ``host`` on the host, a forward ``forward`` on the device, one batch at a time; the host
    waits for a batch's end before it processes it."""
    t_host, t_device, ends = 0.0, 0.0, {}
    spans: dict = {"host": [], "device": [], "wait": []}
    for kind, k, batch in events:
        if kind == "launch":
            spans["host"].append((t_host, host, "schedule " + batch))
            t_host += host
            start = max(t_host, t_device)
            spans["device"].append((start, forward, batch))
            t_device = ends[k] = start + forward
        else:
            if ends[k] > t_host:
                spans["wait"].append((t_host, ends[k] - t_host))
                t_host = ends[k]
            spans["host"].append((t_host, host, "process " + batch))
            t_host += host
    spans["end"] = max(t_host, t_device)
    return spans


@figure("ch18", "timeline")
def overlap_timeline() -> plt.Figure:
    """Host and device over the main's requests, without and with overlap: the order of the
    launches and the processing is the scheduler's own (recorded on a CPU); the durations are
    assumed (host work 1 unit per launch or process, a forward 2 units)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_model("llama3", tmp)
        runs = {overlap: replay_timeline(scheduler_events(path, overlap), 1.0, 2.0)
                for overlap in (False, True)}
    fig, axes = plt.subplots(2, 1, figsize=(12, 5.2), layout="constrained", sharex=True)
    fig.suptitle("Overlap scheduling: batch k+1 is launched before batch k's tokens are processed")
    for ax, overlap in zip(axes, (False, True)):
        spans = runs[overlap]
        for start, width, label in spans["host"]:
            colour = COLORS[0] if label.startswith("schedule") else COLORS[1]
            ax.broken_barh([(start, width)], (1.1, 0.8), facecolors=colour, edgecolor="white")
            ax.text(start + width / 2, 1.5, label.split(" ", 1)[1], ha="center", va="center",
                    fontsize=7, color="white")
        for start, width in spans["wait"]:
            ax.broken_barh([(start, width)], (1.4, 0.2), facecolors=GREY)
        for start, width, label in spans["device"]:
            ax.broken_barh([(start, width)], (0.1, 0.8), facecolors=COLORS[2], edgecolor="white")
            ax.text(start + width / 2, 0.5, label, ha="center", va="center", fontsize=8,
                    color="white")
        busy = sum(w for _, w, _ in spans["device"])
        ax.set_yticks([0.5, 1.5], ["device", "host"])
        ax.set_title(f"overlap_scheduling={overlap}: {spans['end']:.0f} units, the device busy "
                     f"{100 * busy / spans['end']:.0f}% of them", fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    axes[1].set_xlabel("time, in assumed units (host: blue schedule and launch, orange "
                       "process, grey waiting; device: green forward)")
    return fig


# ---------------------------------------------------------------------------------------- ch19
def rank_state(path: str, rank: int, size: int) -> dict:
    """The weights rank ``rank`` of ``size`` loads (no process group needed to load)."""
    from minisgl.distributed import set_tp_info
    from minisgl.models import load_model

    set_tp_info(rank, size)
    try:
        return load_model(path).state_dict()
    finally:
        set_tp_info(0, 1)


@figure("ch19", "shards")
def tp_shards() -> plt.Figure:
    """Left: what each of two ranks holds of the tiny Llama 3's weights, loaded with the
    chapter's shard(). Right: one forward's path on a rank, with its shapes and collectives."""
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_model("llama3", tmp)
        whole = rank_state(path, 0, 1)
        ranks = [rank_state(path, r, 2) for r in range(2)]
    names = ["embed_tokens", "qkv_proj", "o_proj", "gate_up_proj", "down_proj",
             "input_layernorm", "lm_head"]
    keys = [next(k for k in whole if name in k) for name in names]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.4), width_ratios=[1.1, 1],
                                      layout="constrained")
    total = sum(t.numel() for t in whole.values())
    held = sum(t.numel() for t in ranks[0].values())
    fig.suptitle(f"Two ranks: each holds {100 * held / total:.1f}% of the tiny Llama 3's "
                 f"{total:,} weights (the norms whole on both)")
    for y, (name, key) in enumerate(zip(names, keys)):
        full = whole[key].numel()
        parts = [r[key].numel() for r in ranks]
        split = sum(parts) == full
        left.barh(y, parts[0], color=COLORS[0], label="rank 0" if y == 0 else None)
        left.barh(y, parts[1], left=parts[0] if split else 0, color=COLORS[1] if split else GREY,
                  alpha=1 if split else 0.6,
                  label="rank 1" if y == 0 else ("both: a whole copy" if not split else None))
        shape = f"{list(whole[key].shape)} → {list(ranks[0][key].shape)} each"
        left.text(full * 1.02, y, shape, va="center", fontsize=9)
    left.set_yticks(range(len(names)), names)
    left.invert_yaxis()
    left.set_xlim(0, max(t.numel() for t in whole.values()) * 2.5)
    left.set_xlabel("elements")
    left.set_title("Layer 0's weights and the vocabulary, cut by shard()", fontsize=10)
    left.legend(fontsize=9, loc="center right")

    r0 = ranks[0]
    steps = [("embedding: this rank's rows", f"[T, {r0[keys[0]].shape[1]}] partial", True),
             ("qkv_proj (column parallel)", f"[T, {r0[keys[1]].shape[0]}]: its heads", False),
             ("attention on its own heads", f"[T, {r0[keys[2]].shape[1]}]", False),
             ("o_proj (row parallel)", f"[T, {r0[keys[2]].shape[0]}] partial", True),
             ("gate_up_proj (column parallel)", f"[T, {r0[keys[3]].shape[0]}]", False),
             ("silu(gate) * up", f"[T, {r0[keys[4]].shape[1]}]", False),
             ("down_proj (row parallel)", f"[T, {r0[keys[4]].shape[0]}] partial", True),
             ("lm_head: its vocabulary rows", f"[T, {r0[keys[6]].shape[0]}] → gather", None)]
    diagram(right, 100, len(steps) * 10 + 4)
    right.set_title("One forward on rank 0 (the layer's steps run once per layer)", fontsize=10)
    for i, (op, shape, reduce) in enumerate(steps):
        box(right, 0, i * 10, 52, 8, LIGHT, op, fontsize=9)
        right.text(54, i * 10 + 4, shape, va="center", fontsize=9)
        if reduce:
            right.text(80, i * 10 + 4, "all-reduce", va="center", color=COLORS[3],
                       fontweight="bold", fontsize=9)
        elif reduce is None:
            right.text(80, i * 10 + 4, "all-gather", va="center", color=COLORS[2],
                       fontweight="bold", fontsize=9)
    return fig


# ---------------------------------------------------------------------------------------- ch20
def moe_padding_share(tokens: int, num_experts: int, topk: int, block_m: int) -> float:
    """The share of the padded rows that are placeholders, for random routing of ``tokens``."""
    import torch
    from minisgl.moe.base import select_experts
    from minisgl.moe.fused import moe_align_block_size

    gen = torch.Generator().manual_seed(tokens)
    _, ids = select_experts(torch.randn(tokens, num_experts, generator=gen), topk, True)
    sorted_ids, _ = moe_align_block_size(ids, block_m, num_experts)
    return 1.0 - ids.numel() / sorted_ids.numel()


@figure("ch20", "sort_and_pad")
def sort_and_pad() -> plt.Figure:
    """The main's 5 tokens x top-2 sorted by expert and padded to tiles of 4 (from
    moe_align_block_size), and the placeholder share at Qwen3-30B-A3B's 128 experts, top-8."""
    import torch
    from minisgl.moe.base import select_experts
    from minisgl.moe.fused import moe_align_block_size

    torch.manual_seed(0)
    torch.randn(5, 64)  # the main's x: the gating below is then the main's
    _, ids = select_experts(torch.randn(5, 8), 2, True)
    sorted_ids, expert_ids = moe_align_block_size(ids, 4, 8)
    flat, num_pairs = ids.flatten().tolist(), ids.numel()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7.6), layout="constrained",
                                      height_ratios=[1, 1.5])
    fig.suptitle("Fused MoE: the (token, expert) pairs sorted by expert, each run padded to "
                 "whole tiles")
    diagram(top, 24.5, 4.2)
    for i, e in enumerate(flat):
        box(top, 0.5 + i, 0.3, 1, 1, COLORS[e], f"{i}", color="white", fontsize=10)
        top.text(1 + i, 1.6, f"t{i // 2}", ha="center", fontsize=8)
    top.text(11, 0.8, "pairs in token order (pair i is token i // 2); the colour is its expert",
             va="center", fontsize=9)
    for i, pair in enumerate(sorted_ids.tolist()):
        pad = pair == num_pairs
        box(top, 0.5 + i, 2.3, 1, 1, LIGHT if pad else COLORS[flat[pair]], str(pair),
            color="#777777" if pad else "white", fontsize=10)
    for tile, e in enumerate(expert_ids.tolist()):
        top.plot([0.5 + 4 * tile] * 2, [2.1, 3.5], color="#444444", linewidth=1.2)
        top.text(2.5 + 4 * tile, 3.9, f"tile {tile}: expert {e}", ha="center", fontsize=9)
    top.set_title(f"The main's 5 tokens, top-2 of 8 experts, BLOCK_M = 4: {num_pairs} pairs "
                  f"become {sorted_ids.numel()} rows ({num_pairs}, pale, marks a placeholder)",
                  fontsize=10)
    tokens = [2 ** p for p in range(14)]
    for k, block_m in enumerate([16, 64]):
        share = [100 * moe_padding_share(t, 128, 8, block_m) for t in tokens]
        bottom.plot(tokens, share, "o-", color=COLORS[k], label=f"BLOCK_M = {block_m}")
    bottom.set_xscale("log", base=2)
    bottom.set_xticks(tokens, [str(t) for t in tokens])
    bottom.set_xlabel("tokens in the batch (random routing)")
    bottom.set_ylabel("placeholder rows (%)")
    bottom.set_ylim(0, 100)
    bottom.set_title("Qwen3-30B-A3B's MoE layer (128 experts, top-8): the share of the rows the "
                     "two GEMMs run that are padding", fontsize=10)
    bottom.legend(fontsize=9)
    bottom.grid(alpha=0.3)
    return fig


# ---------------------------------------------------------------------------------------- ch21
MOE_RESULTS = ROOT / "benchmark/results/moe_h200_2026-12-01.json"  # measured, not computed here


@figure("ch21", "moe_layer_time")
def moe_layer_time() -> plt.Figure:
    """bench_moe.py's H200 run: the whole MoE layer's time per token count for chapter 20's
    backend, the tuned baseline, chapter 21's and the roofline; and each over the roofline."""
    import json

    record = json.loads(MOE_RESULTS.read_text(encoding="utf-8"))
    tokens, ms = record["tokens"], record["ms"]
    styles = {"ch20 fused": (GREY, "s-"), "tuned baseline": (COLORS[1], "^-"),
              "ch21 fast": (COLORS[0], "o-"), "roofline": (COLORS[3], "--")}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5), layout="constrained")
    shape = record["shape"]
    fig.suptitle(f"Qwen3-30B-A3B's MoE layer on an {record['device']} "
                 f"(E={shape['experts']}, top-{shape['topk']}, H={shape['hidden']}, "
                 f"I={shape['inter']}, bf16), {record['date'][:10]}")
    for name, (color, style) in styles.items():
        left.plot(tokens, ms[name], style, color=color, label=name, markersize=4)
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("tokens in the batch")
    left.set_ylabel("ms per whole layer (8 layers a CUDA graph; ch20 eager)")
    left.set_title("time per layer", fontsize=10)
    left.legend(fontsize=9)
    left.grid(alpha=0.3, which="both")
    for name in ("tuned baseline", "ch21 fast"):
        color, style = styles[name]
        over = [t / r for t, r in zip(ms[name], ms["roofline"])]
        right.plot(tokens, over, style, color=color, label=name, markersize=4)
    right.axhline(1.5, color=COLORS[3], linestyle=":",
                  label="1.5x the roofline (the aim, T <= 512)")
    right.set_xscale("log", base=2)
    right.set_ylim(1, 5)
    right.set_xlabel("tokens in the batch")
    right.set_ylabel("time / roofline")
    ceil = record["ceilings"]
    right.set_title(f"over the roofline: max(weights touched / {ceil['copy_tbps']:.2f} TB/s, "
                    f"FLOPs / {ceil['peak_tflops']:.0f} TFLOP/s)", fontsize=10)
    right.legend(fontsize=9)
    right.grid(alpha=0.3, which="both")
    return fig


DECODE_PROFILE = ROOT / "benchmark/results/profile_decode_h200_2026-12-02.json"  # measured
FUSED_PROFILE = ROOT / "benchmark/results/profile_decode_fused_h200_2026-12-02.json"


@figure("ch22", "decode_step_kernels")
def decode_step_kernels() -> plt.Figure:
    """profile_decode.py's H200 runs before and after chapter 22's kernels: one decode step's
    kernels grouped by kind, their time (with the share of the step's kernel time), their number."""
    import json

    runs = [("torch's norms and sampler", json.loads(DECODE_PROFILE.read_text("utf-8"))),
            ("chapter 22's fused kernels", json.loads(FUSED_PROFILE.read_text("utf-8")))]
    kinds = sorted({r["kind"] for _, run in runs for r in run["rows"]},
                   key=lambda kind: _kind_row(runs[0][1], kind)["us"])  # the largest on top
    first = runs[0][1]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.2), layout="constrained",
                                      sharey=True)
    fig.suptitle(f"One decode step of {first['shape']} at batch {first['batch']}, "
                 f"{first['context']} cached tokens each, on an {first['gpu']}, {first['date']}")
    height, ys = 0.4, range(len(kinds))
    for n, (label, run) in enumerate(runs):
        rows = [_kind_row(run, kind) for kind in kinds]
        at = [y + (0.5 - n) * height for y in ys]
        left.barh(at, [r["us"] for r in rows], height, color=COLORS[n],
                  label=f"{label}: {run['kernel_us']:,.0f} us in a {run['step_us'] / 1e3:.1f} ms "
                        "step")
        right.barh(at, [r["kernels"] for r in rows], height, color=COLORS[n],
                   label=f"{label}: {run['kernels']:,} kernels")
        for y, r in zip(at, rows):
            left.text(r["us"] + 60, y, f"{r['us']:,.0f} us ({r['share']:.1%})", va="center",
                      fontsize=8)
            right.text(r["kernels"] + 8, y, f"{r['kernels']:,}", va="center", fontsize=8)
    left.set_yticks(list(ys), kinds)
    left.set_xlim(0, max(r["us"] for _, run in runs for r in run["rows"]) * 1.45)
    right.set_xlim(0, max(r["kernels"] for _, run in runs for r in run["rows"]) * 1.25)
    left.set_xlabel("kernel time in the step (us)")
    right.set_xlabel("kernels launched in the step")
    for ax in (left, right):
        ax.grid(alpha=0.3, axis="x")
        ax.legend(loc="lower right", fontsize=9)
    return fig


def _kind_row(run: dict, kind: str) -> dict:
    """The run's row for `kind`; none when no kernel of that kind ran."""
    return next((r for r in run["rows"] if r["kind"] == kind),
                {"kind": kind, "kernels": 0, "us": 0.0, "share": 0.0})


def draw_in_tree(chapter: str, tree: Path, png: Path | None) -> list[Path]:
    """Draw one chapter's figures with the code of its tree; the files written."""
    global TREE
    TREE = tree
    sys.path[:0] = [str(tree / "python"), str(tree / "examples")]
    import torch

    torch.set_num_threads(1)
    folder = next(p for p in (ROOT / "chapters").iterdir() if p.name.startswith(chapter + "_"))
    written = []
    for name, draw in FIGURES[chapter]:
        fig = quietly(draw)
        out = folder / "figures" / f"{name}.svg"
        out.parent.mkdir(exist_ok=True)
        fig.savefig(out, format="svg", metadata={"Date": None})
        if png is not None:
            png.mkdir(parents=True, exist_ok=True)
            fig.savefig(png / f"{chapter}_{name}.png", dpi=80)
        plt.close(fig)
        written.append(out)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="chapter ids, e.g. ch05 (default: all)")
    parser.add_argument("--png", type=Path, help="also write a PNG of each figure here")
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)  # one chapter, in its tree
    args = parser.parse_args()
    unknown = sorted(set(args.chapters) - set(FIGURES))
    if unknown:
        parser.error(f"no figures for {', '.join(unknown)}; known: {', '.join(FIGURES)}")
    png = args.png.resolve() if args.png else None
    if args.tree:
        for path in draw_in_tree(args.chapters[0], args.tree, png):
            print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")
        return
    sys.path.insert(0, str(ROOT / "tools"))
    from stepslib.book import load_book
    from stepslib.tree import tree_at, write_tree

    book = load_book(ROOT)
    for chapter in args.chapters or list(FIGURES):
        # a fresh process on the chapter's tree: the figure shows the code the text shows
        with tempfile.TemporaryDirectory() as tmp:
            write_tree(tree_at(book, book.chapter(int(chapter[2:]))), Path(tmp))
            command = [sys.executable, __file__, chapter, "--tree", tmp]
            command += ["--png", str(png)] if png else []
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            if subprocess.run(command, env=env).returncode != 0:
                sys.exit(f"the figures of {chapter} failed on its tree (above)")


if __name__ == "__main__":
    main()
