"""Chapter 14's figure: turns.svg, a shell session step by step (the real Shell over
``LockstepChat``, a ChatClient without sockets).
"""

from __future__ import annotations

import tempfile

import matplotlib.pyplot as plt

from .common import COLORS, figure, tiny_model


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
