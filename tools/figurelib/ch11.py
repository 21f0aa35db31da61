"""Chapter 11's figure: offsets.svg, incremental detokenization's offsets token by token, with
and without a stop string.
"""

from __future__ import annotations

from functools import cache

import matplotlib.pyplot as plt
from matplotlib import font_manager
from matplotlib.axes import Axes
from matplotlib.ft2font import FT2Font
from matplotlib.patches import Rectangle

from .common import COLORS, GREY, LIGHT, box, diagram, figure, run_main


def draw_offsets(
    ax: Axes, tok, ids: list[int], stop: list[str], title: str
) -> list[tuple[str, str]]:
    """One row per step of a stream: each id as final (before surr_offset), context (surr to
    read), not final yet (after read_offset) or not arrived; on the right, the piece sent.
    Returns the legend's entries."""
    from minisgl.tokenizer import DecodeState, detokenize

    state = DecodeState(stop=stop)
    kinds = [
        ("final: in the text, never decoded again", GREY),
        ("surr_offset..read_offset: decoded again as context", COLORS[0]),
        ("read_offset..: decoded, not final (inside a character)", COLORS[1]),
        ("ignored: after the stop string", LIGHT),
    ]
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
        sent = f"sent {shown(piece)}" if piece else "sent nothing"
        if state.finish_reason and not piece:
            sent += f"  (finish_reason={state.finish_reason!r})"
        ax.text(
            n + 0.3,
            y + 0.4,
            f"{sent}   surr {state.surr_offset}, read "
            f"{state.read_offset}, sent {state.sent_offset} chars",
            va="center",
            fontsize=9,
        )
    return kinds


def shown(text: str) -> str:
    """``text`` in quotes, each character that the figures' font has no glyph for (CJK here)
    written as its escape, ``\\u5f88``: a viewer without a CJK font would draw boxes."""
    glyphs = font_glyphs()
    return "'" + "".join(c if ord(c) in glyphs else f"\\u{ord(c):04x}" for c in text) + "'"


@cache
def font_glyphs() -> frozenset[int]:
    """The code points the figures' font (``font.family``) draws."""
    path = font_manager.findfont(plt.rcParams["font.family"][0])
    return frozenset(FT2Font(path).get_charmap())


def token_label(tok, token: int) -> str:
    """A token's bytes, ASCII as itself, others in hex: 'f c3a9'."""
    table = {ch: b for b, ch in enumerate(byte_level_alphabet())}
    raw = bytes(table[c] for c in tok.convert_ids_to_tokens(token))
    return "\n".join(chr(b) if 32 < b < 127 else f"{b:02x}" for b in raw)


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: the character that stands for each byte 0..255 in a token."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    others = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(others)) for b in range(256)]


@figure("ch11", "offsets")
def offsets() -> plt.Figure:
    """The ch11 main's reply streamed one token at a time, with and without its stop string."""
    main = run_main("ch11_tokenizer.py")
    tok, ids = main["tok"], main["reply_ids"]
    fig, axes = plt.subplots(2, 1, figsize=(12, 9.5), layout="constrained")
    fig.suptitle(
        f"Incremental detokenization of {shown(main['reply'])} ({len(ids)} byte-level "
        "tokens, bytes shown above each)"
    )
    draw_offsets(axes[0], tok, ids, [], "no stop string: every piece as soon as it is final")
    kinds = draw_offsets(
        axes[1],
        tok,
        ids,
        ["很好"],
        f"stop=[{shown('很好')}]: {shown('很')} waits as the start of the stop string, then the "
        "stop string is cut",
    )
    handles = [Rectangle((0, 0), 1, 1, color=c) for _, c in kinds]
    fig.legend(handles, [k for k, _ in kinds], loc="outside lower center", ncols=2, frameon=False)
    return fig
