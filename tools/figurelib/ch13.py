"""Chapter 13's figure: request_messages.svg, one streamed request's messages from the HTTP
client to the scheduler and back.
"""

from __future__ import annotations

import tempfile

import matplotlib.pyplot as plt

from .common import COLORS, GREY, arrow, diagram, figure, tiny_model


def request_messages(model: str) -> list[tuple[str, str, str]]:
    """One streamed request of the ch13 main ("Hello world", stop=["lazy"]) through the real
    TokenizerServer, SchedulerLoop and the API server's ReplyFormat, driven in this process one
    scheduler step at a time: (from, to, what) for every message, in order."""
    from transformers import AutoTokenizer

    from minisgl.core import SamplingParams
    from minisgl.message import TokenizeMsg, UserMsg
    from minisgl.scheduler import Scheduler, SchedulerConfig
    from minisgl.scheduler.io import SchedulerLoop
    from minisgl.server.api_server import ReplyFormat
    from minisgl.tokenizer.server import TokenizerServer

    tokenizer = TokenizerServer(AutoTokenizer.from_pretrained(model))
    loop = SchedulerLoop(
        Scheduler(SchedulerConfig(model, device="cpu", page_size=4, num_pages=128))
    )
    fmt = ReplyFormat(chat=False, model="qwen3")
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    log = [
        (
            "client",
            "api",
            'POST /v1/completions {"prompt": "Hello world", "stop": ["lazy"], "stream": true}',
        ),
        ("api", "tokenizer", 'TokenizeMsg(uid=0, text="Hello world", stop=["lazy"])'),
    ]
    to_backend, replies = tokenizer.handle([TokenizeMsg(0, "Hello world", params, ["lazy"])])
    finished = False
    while not finished:
        for msg in to_backend:
            what = (
                f"UserMsg(uid=0, input_ids={msg.input_ids.tolist()})"
                if isinstance(msg, UserMsg)
                else f"{type(msg).__name__}(uid={msg.uid})"
            )
            log.append(("tokenizer", "scheduler", what))
            loop.handle(msg)
        for reply in replies:
            log.append(
                (
                    "tokenizer",
                    "api",
                    f"UserReply({reply.incremental_output!r}, "
                    f"token_ids={reply.token_ids}, finished={reply.finished})",
                )
            )
            chunk = fmt.chunk(reply.incremental_output, reply.finish_reason or None)["choices"]
            text, reason = chunk[0]["text"], chunk[0]["finish_reason"]
            if text or reply.finished:
                log.append(
                    (
                        "api",
                        "client",
                        f'data: {{"text": {text!r}, "finish_reason": {reason!r}, ...}}'.replace(
                            "'", '"'
                        ).replace("None", "null"),
                    )
                )
            finished |= reply.finished
        if finished:
            break
        msgs = loop.step()
        for msg in msgs:
            log.append(
                (
                    "scheduler",
                    "tokenizer",
                    f"DetokenizeMsg(uid=0, next_token={msg.next_token}, finished={msg.finished})",
                )
            )
        to_backend, replies = tokenizer.handle(msgs)
    log.append(("api", "client", "data: [DONE]"))
    loop.scheduler.shutdown()
    return log


@figure("ch13", "request_messages")
def request_messages_figure() -> plt.Figure:
    with tempfile.TemporaryDirectory() as tmp:
        log = request_messages(tiny_model("qwen3", tmp))
    lanes = {"client": 0, "api": 1, "tokenizer": 2, "scheduler": 3}
    names = [
        "HTTP client",
        "API server (main process)",
        "tokenizer / detokenizer worker",
        "scheduler process",
    ]
    xs = [1.2, 5.2, 9.2, 13.2]
    fig, ax = plt.subplots(figsize=(13, 0.42 * len(log) + 1.6), layout="constrained")
    fig.suptitle(
        "One streamed request's messages, in order (the ch13 main's stop=['lazy'] "
        "request, one scheduler step at a time)"
    )
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
        ax.text(
            left + 0.1, y - 0.12, what, va="bottom", fontsize=7.5, color="#222222", clip_on=False
        )
    return fig
