"""Chapter 23's figure: allowed_tokens.svg, how many tokens each constraint of the main allows
at each step of its greedy output (the real grammars, compiled against the tiny Qwen3's
tokenizer, followed along the engine's own tokens)."""

from __future__ import annotations

import tempfile

import matplotlib.pyplot as plt

from .common import COLORS, figure, quietly, tiny_model


@figure("ch23", "allowed_tokens")
def allowed_tokens() -> plt.Figure:
    """One panel per constraint: a bar per output token, its height the tokens the grammar
    allowed before it (log scale), the token itself under it."""
    import ch23_structured as m

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM
    from minisgl.structured import Constraint

    with tempfile.TemporaryDirectory() as tmp:
        llm = quietly(LLM, tiny_model("qwen3", tmp), device="cpu", page_size=4, num_pages=256)
        vocab = llm.scheduler.engine.model_config.vocab_size
        runs = []
        for kind, text in m.CONSTRAINTS:
            params = SamplingParams(max_tokens=80, **{kind: text})
            ids = llm.generate([m.PROMPT], [params])[0]["token_ids"]
            counts = m.allowed_at_each_step(llm, Constraint(kind, text), ids)
            pieces = [
                llm.tokenizer.decode([t]) if t not in llm.scheduler.eos_token_ids else "EOS"
                for t in ids
            ]
            runs.append((kind, pieces, counts))
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 8.5), layout="constrained")
    fig.suptitle(
        f"Tokens each grammar allows before each output token (tiny Qwen3, {vocab} "
        f"tokens, greedy, prompt {m.PROMPT!r})",
        fontsize=11,
    )
    for ax, (kind, pieces, counts), color in zip(axes, runs, COLORS):
        steps = range(len(counts))
        ax.bar(steps, counts, color=[color if c > 1 else "#BBBBBB" for c in counts])
        ax.set_yscale("log")
        ax.set_ylim(0.7, vocab * 1.6)
        ax.axhline(vocab, color="#444444", linewidth=0.8, linestyle=":")
        labels = [repr(p)[1:-1].replace(" ", "\u2423") for p in pieces]  # a space shows as ␣
        ax.set_xticks(list(steps), labels, rotation=90, fontsize=8, family="monospace")
        ax.text(
            len(counts) - 0.4,
            vocab * 1.1,
            f"the whole vocabulary, {vocab}",
            ha="right",
            va="bottom",
            fontsize=8,
            color="#444444",
        )
        ax.set_xlim(-0.7, len(counts) - 0.3)
        forced = sum(c == 1 for c in counts)
        ax.set_title(
            f"{kind}: {len(counts)} tokens, {forced} of them the only one allowed (grey)",
            fontsize=10,
            loc="left",
        )
        ax.set_ylabel("tokens allowed")
        ax.grid(alpha=0.3, axis="y")
    return fig
