"""Chapter 4's figure: top_k_top_p.svg, the tokens top_k_top_p_filter keeps of tiny llama3's
next-token distribution.
"""

from __future__ import annotations

import tempfile

import matplotlib.pyplot as plt

from .common import COLORS, GREY, figure, tiny_model


@figure("ch04", "top_k_top_p")
def top_k_top_p() -> plt.Figure:
    """Tiny llama3's next-token distribution after the ch04 main's prompt, sorted, and the set
    that top_k_top_p_filter keeps for the main's two sampled requests and a tighter top-p."""
    import torch
    from transformers import AutoTokenizer

    from minisgl.engine.sample import top_k_top_p_filter
    from minisgl.models import load_model, sequence_logits

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
        ax.set_title(
            f"temperature {temperature}, {what}: keeps {n_kept} of {len(order)} "
            f"tokens, {mass:.0%} of the probability",
            loc="left",
        )
        ax.axvline(n_kept - 0.5, color=COLORS[3], linestyle="--")
        ax.set_ylabel("probability")
        mass_line = ax.twinx()  # where the running total crosses top_p
        mass_line.step(
            range(shown),
            sorted_probs.cumsum(0)[:shown],
            where="mid",
            color="#333333",
            linewidth=1.2,
        )
        if p < 1.0:
            mass_line.axhline(p, color="#333333", linestyle=":")
            mass_line.text(shown - 0.5, p - 0.03, f"top_p {p}", ha="right", va="top")
        mass_line.set_ylim(0, 1.05)
        mass_line.set_ylabel("running total")
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1].set_xlabel(
        f"tokens by decreasing probability (the first {shown}); "
        "blue: kept, grey: zeroed before the draw; line: running total"
    )
    fig.tight_layout()
    return fig
