"""Chapter 13's figure: disconnect.svg, what happens when a streaming client leaves: the abort
from the API server through the tokenizer worker to the scheduler, the late token dropped on the
way, and the pages back in the pool.
"""

from __future__ import annotations

import tempfile

import matplotlib.pyplot as plt

from .common import COLORS, GREY, arrow, diagram, figure, tiny_model

LANES = {"client": 0, "api": 1, "tokenizer": 2, "scheduler": 3}
EVENTS = 3  # the client leaves after this many events


def disconnect_messages(model: str) -> list[tuple[str, str, str, str]]:
    """A streamed request of 400 tokens whose client leaves after three events, through the real
    TokenizerServer, SchedulerLoop and the API server's ReplyFormat, driven in this process one
    scheduler step at a time: (from, to, what, the pool after it) for every message, in order.
    A row whose from and to are the same process is something that process does."""
    from transformers import AutoTokenizer

    from minisgl.core import SamplingParams
    from minisgl.message import AbortBackendMsg, AbortMsg, TokenizeMsg, UserMsg
    from minisgl.scheduler import Scheduler, SchedulerConfig
    from minisgl.scheduler.io import SchedulerLoop
    from minisgl.server.api_server import ReplyFormat
    from minisgl.tokenizer.server import TokenizerServer

    tokenizer = TokenizerServer(AutoTokenizer.from_pretrained(model))
    loop = SchedulerLoop(Scheduler(SchedulerConfig(model, device="cpu", page_size=4, num_pages=64)))
    cache = loop.scheduler.cache_manager
    fmt = ReplyFormat(chat=False, model="qwen3")
    params = SamplingParams(max_tokens=400, ignore_eos=True)

    def pool() -> str:
        cached = cache.prefix_cache.size_info.evictable_size // cache.page_size
        used = cache.num_pages - cache.num_free_pages - cached
        return f"{used} used, {cached} cached, {cache.num_free_pages} free"

    log = [
        (
            "client",
            "api",
            'POST /v1/completions {"prompt": "Hello world", "max_tokens": 400, "stream": true}',
            "",
        ),
        ("api", "tokenizer", 'TokenizeMsg(uid=0, text="Hello world")', ""),
    ]
    to_backend, _ = tokenizer.handle([TokenizeMsg(0, "Hello world", params)])
    for msg in to_backend:
        assert isinstance(msg, UserMsg)
        log.append(
            ("tokenizer", "scheduler", f"UserMsg(uid=0, input_ids={msg.input_ids.tolist()})", "")
        )
        loop.handle(msg)
    events = 0
    while events < EVENTS:
        for msg in loop.step():
            log.append(
                (
                    "scheduler",
                    "tokenizer",
                    f"DetokenizeMsg(uid=0, next_token={msg.next_token})",
                    pool(),
                )
            )
            _, replies = tokenizer.handle([msg])
            for reply in replies:
                log.append(("tokenizer", "api", f"UserReply({reply.incremental_output!r})", ""))
                text = fmt.chunk(reply.incremental_output, None)["choices"][0]["text"]
                log.append(("api", "client", f'data: {{"text": "{text}", ...}}', ""))
                events += 1
    log += [
        ("client", "client", "closes the connection", ""),
        ("api", "api", "Starlette cancels the stream; generate's finally: abort", ""),
        ("api", "tokenizer", "AbortMsg(uid=0)", ""),
    ]
    to_backend, _ = tokenizer.handle([AbortMsg(0)])
    (abort,) = to_backend
    assert isinstance(abort, AbortBackendMsg)
    log.append(("tokenizer", "scheduler", f"AbortBackendMsg(uid={abort.uid})", ""))
    # the scheduler runs the step it was in before it reads its socket again
    late = loop.step()
    for msg in late:
        log.append(
            ("scheduler", "tokenizer", f"DetokenizeMsg(uid=0, next_token={msg.next_token})", pool())
        )
    dropped, replies = tokenizer.handle(late)
    assert dropped == [] and replies == [], (dropped, replies)
    log.append(("tokenizer", "tokenizer", "uid 0 is forgotten: the late token is dropped", ""))
    loop.handle(abort)
    assert loop.scheduler.idle
    log.append(("scheduler", "scheduler", "SchedulerLoop.abort: row and pages back", pool()))
    loop.scheduler.shutdown()
    return log


@figure("ch13", "disconnect")
def disconnect_figure() -> plt.Figure:
    with tempfile.TemporaryDirectory() as tmp:
        log = disconnect_messages(tiny_model("qwen3", tmp))
    names = [
        "HTTP client",
        "API server (main process)",
        "tokenizer / detokenizer worker",
        "scheduler process",
    ]
    xs = [1.2, 5.2, 9.2, 13.2]
    fig, ax = plt.subplots(figsize=(15, 0.42 * len(log) + 1.6), layout="constrained")
    fig.suptitle(
        f"A streaming client that leaves after {EVENTS} events: the abort's way to the "
        "scheduler, and its pages (a pool of 64 pages of 4 tokens)"
    )
    diagram(ax, 17.6, len(log) + 1.2)
    for x, name in zip(xs, names):
        ax.text(x, 0.2, name, ha="center", va="center", fontsize=10, weight="bold")
        ax.plot([x, x], [0.5, len(log) + 1], color=GREY, linewidth=1)
    ax.text(16.0, 0.2, "the pool, after", ha="center", va="center", fontsize=10, weight="bold")
    colors = {"client": 3, "api": 0, "tokenizer": 1, "scheduler": 2}
    for i, (src, dst, what, pool) in enumerate(log):
        y = i + 1.0
        color = COLORS[colors[src]]
        a, b = xs[LANES[src]], xs[LANES[dst]]
        if src == dst:  # something the process does: a mark on its lane
            ax.plot([a], [y], marker="X" if src == "client" else "o", color=color, markersize=8)
            right = src == "scheduler"  # the pool's column is to its right: write leftwards
            x, align = (a - 0.2, "right") if right else (a + 0.2, "left")
            ax.text(x, y, what, ha=align, va="center", fontsize=8, color=color, weight="bold")
        else:
            arrow(ax, (a, y), (b, y), color=color)
            left = min(a, b) if abs(b - a) > 4.5 else min(a, b) - 0.1
            ax.text(left + 0.1, y - 0.12, what, va="bottom", fontsize=8, color="#222222")
        if pool:
            ax.text(16.0, y, pool, ha="center", va="center", fontsize=8, color="#222222")
    return fig
