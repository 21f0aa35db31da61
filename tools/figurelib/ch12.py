"""Chapter 12's figure: messages.svg, one request's messages between the three processes (the
workers run in lockstep here, ``run_lockstep``).
"""

from __future__ import annotations

import runpy
import tempfile

import matplotlib.pyplot as plt

from . import common
from .common import COLORS, GREY, arrow, diagram, figure, tiny_model


def run_lockstep(requests: list) -> list[tuple[str, str, object]]:
    """The ch12 main's worker classes, TokenizerServer and SchedulerLoop, run in this process in
    lockstep (no sockets, so no timing): every message (sender, receiver, message) in order."""
    from transformers import AutoTokenizer

    from minisgl.scheduler import Scheduler, SchedulerConfig
    from minisgl.scheduler.io import SchedulerLoop
    from minisgl.tokenizer.server import TokenizerServer

    main = runpy.run_path(str(common.TREE / "examples" / "ch12_processes.py"), run_name="figure")
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

    request = TokenizeMsg(
        1, "Hello world", SamplingParams(max_tokens=10, ignore_eos=True), stop=["lazy"]
    )
    events = run_lockstep([request])
    lanes = {"frontend": 0.0, "tokenizer": 5.0, "scheduler": 10.0}
    titles = [
        "frontend (main process)\nbinds …/frontend",
        "tokenizer worker\nbinds …/tokenizer",
        "scheduler\nbinds …/scheduler",
    ]
    rows = len(events)
    fig, ax = plt.subplots(figsize=(13, 0.42 * rows + 1.6), layout="constrained")
    fig.suptitle("One request's messages (ch12 main, request 1: 'Hello world', stop ['lazy'])")
    diagram(ax, 13.2, rows + 1.2)
    for x, title in zip(lanes.values(), titles):
        ax.plot([x, x], [0.6, rows + 1], color=GREY, linewidth=2, zorder=0)
        ax.text(x, 0.4, title, ha="center", va="bottom", fontsize=10, fontweight="bold")
    steps = 0
    for y, (sender, receiver, msg) in enumerate(events, start=1):
        if receiver == "step":
            steps += 1
            ax.text(
                lanes["scheduler"] + 0.2,
                y + 0.5,
                f"step {steps}: {msg}",
                va="center",
                fontsize=9,
                color=COLORS[3],
            )
            continue
        start, end = lanes[sender], lanes[receiver]
        color = COLORS[0] if end > start else COLORS[2]
        arrow(ax, (start, y + 0.5), (end, y + 0.5), color=color)
        ax.text(
            (start + end) / 2,
            y + 0.42,
            message_label(msg),
            ha="center",
            va="bottom",
            fontsize=8.5,
            family="DejaVu Sans Mono",
        )
    return fig
