"""Chapter 14's figures: turns.svg, the session of the chapter's main step by step, both of its
shells (the real Shell over ``LockstepChat``, a ChatClient without sockets): each turn's prompt
tokens and how many of them the prefix cache served, the reply pieces, the pages; and ctrl_c.svg,
the main's Ctrl-C from the signal to the pages given back, in the four processes it reaches.
"""

from __future__ import annotations

import inspect
import itertools
import signal
import tempfile
from functools import partial
from unittest import mock

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from .common import COLORS, GREY, arrow, diagram, figure, tiny_model


class LockstepChat:
    """chapter 14's ``ChatClient`` without the sockets: ``stream`` has its interface and runs
    the real TokenizerServer and SchedulerLoop in this process, one scheduler step per reply
    piece, so the figure has no timing in it. ``log`` gets a row per step (the gauges, as
    ``/stats`` reads them) and a row per prefill: the prompt tokens it computed (the others
    came from the prefix cache)."""

    def __init__(self, args, stats):
        from transformers import AutoTokenizer

        from minisgl.scheduler import Scheduler
        from minisgl.scheduler.io import SchedulerLoop
        from minisgl.tokenizer.server import TokenizerServer

        self.tokenizer = TokenizerServer(AutoTokenizer.from_pretrained(args.model_path))
        scheduler = Scheduler(args.scheduler_config())  # as the scheduler process builds it
        self.loop = SchedulerLoop(scheduler)
        self.stats, self.log, self.turn = stats, [], 0
        self._uids = itertools.count()  # numbered as ChatClient numbers them: the first is 0
        self.stats.publish(scheduler)
        real_step = scheduler.step

        def step():  # the step's own output says how many prompt tokens a prefill ran
            out = real_step()
            if out is not None and out.phase == "prefill":
                self.log.append(
                    {"turn": self.turn, "event": "prefill", "computed": sum(out.extend_lens)}
                )
            return out

        scheduler.step = step

    def send(self, msgs: list, source: str) -> list:
        """``msgs`` from ``source`` (the shell or the scheduler) through the tokenizer worker;
        each message that crosses a socket is logged with its sender and receiver."""
        for msg in msgs:
            self.message(source, "tokenizer", msg)
        to_backend, replies = self.tokenizer.handle(msgs)
        for msg in to_backend:
            self.message("tokenizer", "scheduler", msg)
            if type(msg).__name__ == "UserMsg":
                self.log.append(
                    {"turn": self.turn, "event": "prompt", "tokens": len(msg.input_ids)}
                )
            self.loop.handle(msg)
        for msg in replies:
            self.message("tokenizer", "shell", msg)
        return replies

    def message(self, source: str, dest: str, msg: object) -> None:
        row = {"turn": self.turn, "event": "message", "from": source, "to": dest, "msg": msg}
        self.log.append(row)

    def record(self, event: str, piece: str = "") -> None:
        s = self.stats.read()
        in_use = s["kv_pages_total"] - s["kv_pages_free"] - s["kv_pages_cached"]
        self.log.append(
            {
                "turn": self.turn,
                "event": event,
                "piece": piece,
                "in_use": in_use,
                "cached": s["kv_pages_cached"],
                "running": s["num_running_reqs"],
            }
        )

    def stream(self, messages: list, params):
        from minisgl.message import AbortMsg, TokenizeMsg

        self.turn, uid = self.turn + 1, next(self._uids)
        self.log.append(
            {
                "turn": self.turn,
                "event": "messages",
                "count": len(messages),
                "line": messages[-1]["content"],
            }
        )
        replies = self.send([TokenizeMsg(uid, messages, params)], "shell")
        finished = False
        try:
            while not finished:
                replies = self.send(self.loop.step(), "scheduler")
                self.stats.publish(self.loop.scheduler)
                for reply in replies:
                    finished = reply.finished
                    self.record("piece", reply.incremental_output)
                    yield reply
        finally:
            if not finished:
                self.send([AbortMsg(uid)], "shell")
                self.stats.publish(self.loop.scheduler)
                self.record("abort")
            else:
                self.record("done")


class ShellOut:
    """The shell's output, kept in ``text`` (the log has the pieces). With ``ctrl_c``, the first
    reply piece with a visible character raises KeyboardInterrupt once printed, as the Ctrl-C
    that the main's second shell gets once ``expect(r"\\S")`` has seen that character; in
    lockstep the scheduler makes no other token before the abort lands."""

    def __init__(self, ctrl_c: bool = False):
        self.ctrl_c, self.text = ctrl_c, ""

    def write(self, text: str) -> None:
        self.text += text
        if self.ctrl_c and text.strip() and not text.startswith("\n"):  # not the shell's lines
            self.ctrl_c = False  # one Ctrl-C
            raise KeyboardInterrupt

    def flush(self) -> None:
        pass


def one_shell(model: str, max_tokens: int, lines: list[str], ctrl_c: bool = False) -> dict:
    """One shell of the main, built as ``minisgl.shell.run_shell`` builds it: the main's
    command line (FLAGS), its ``MINISGL_SHELL_*`` settings read by the shell's own
    ``shell_sampling_params``; ``lines`` typed in. The log, the reply length, the page size."""
    import ch14_shell
    from transformers import AutoTokenizer

    from minisgl.server.args import parse_args
    from minisgl.server.launch import SchedulerStats
    from minisgl.shell import Shell, context_length, prompt_length, shell_sampling_params

    args = parse_args(["--model", model, "--shell", *ch14_shell.FLAGS])
    chat = LockstepChat(args, SchedulerStats())
    context = context_length(args, chat.stats)
    with mock.patch.dict("os.environ", ch14_shell.shell_settings(max_tokens)):
        params = shell_sampling_params(context)
    count_tokens = partial(prompt_length, AutoTokenizer.from_pretrained(model))
    out, stats = ShellOut(ctrl_c), ReadCounter(chat.stats)
    shell = Shell(chat, params, stats, count_tokens, context, out=out)
    for line in lines:
        shell.handle(line)
    chat.loop.scheduler.shutdown()
    return {
        "log": chat.log,
        "max_tokens": params.max_tokens,
        "page_size": args.page_size,
        "printed": out.text,
        "shell_reads": stats.reads,
    }


class ReadCounter:
    """The shell's view of the gauges, each read kept: the shell reads them only for /stats and
    in ``_wait_idle`` after a Ctrl-C."""

    def __init__(self, stats):
        self.stats, self.reads = stats, []

    def read(self) -> dict:
        self.reads.append(self.stats.read())
        return self.reads[-1]


def main_session(model: str) -> list[dict]:
    """The ch14 main's two shells, each a fresh scheduler (an empty prefix cache): the first
    with replies of MAX_TOKENS (two turns, /reset, the follow-up again), the second with
    replies that only the context cuts, its line stopped by Ctrl-C as its reply starts."""
    import ch14_shell as m

    return [
        one_shell(model, m.MAX_TOKENS, [m.QUESTION, m.FOLLOW_UP, "/reset", m.FOLLOW_UP]),
        one_shell(model, m.LONG_REPLY, [m.LONG_LINE], ctrl_c=True),
    ]


def steps_of(shell: dict) -> list[dict]:
    return [row for row in shell["log"] if "in_use" in row]


def turn_facts(shell: dict, turn: int) -> dict:
    """A turn's line, messages, prompt tokens, those its prefill computed and those that came
    from the prefix cache (tokens and pages), and its reply pieces."""
    rows = [r for r in shell["log"] if r["turn"] == turn and "in_use" not in r]
    first = {r["event"]: r for r in reversed(rows)}
    tokens = first["prompt"]["tokens"]
    computed = sum(r["computed"] for r in rows if r["event"] == "prefill")  # every chunk
    pieces = sum(r["event"] == "piece" for r in steps_of(shell) if r["turn"] == turn)
    return {
        "line": first["messages"]["line"],
        "count": first["messages"]["count"],
        "tokens": tokens,
        "computed": computed,
        "cached": tokens - computed,
        "cached_pages": (tokens - computed) // shell["page_size"],
        "pieces": pieces,
    }


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def turn_label(f: dict, name: str, narrow: bool) -> str:
    what = [
        f"{name}:",
        f'"{f["line"]}"',
        f"{plural(f['count'], 'message')}, {f['tokens']} prompt tokens:",
        f"{f['cached']} from the prefix cache,",
        f"{f['computed']} computed; {plural(f['pieces'], 'piece')}",
    ]
    if narrow:
        return "\n".join(what)
    return f"{what[0]} {what[1]}, {what[2]}\n{what[3]} {what[4]}"


def draw_turns(ax: Axes, shell: dict, names: list[str], narrow: bool = False) -> None:
    """A row a turn: its steps as a band, a tick per reply piece; what it sent written above
    (to the band's left end, or to its right end once it starts past the middle), or below
    the band in a ``narrow`` panel."""
    steps = steps_of(shell)
    for turn in sorted({row["turn"] for row in steps}):
        xs = [i for i, row in enumerate(steps) if row["turn"] == turn]
        color = COLORS[turn - 1]
        ax.broken_barh(
            [(xs[0] - 0.4, xs[-1] - xs[0] + 0.8)], (turn - 0.25, 0.5), facecolors=color, alpha=0.25
        )
        pieces = [i for i in xs if steps[i]["event"] == "piece"]
        ax.plot(pieces, [turn] * len(pieces), "|", color=color, markersize=10)
        label = turn_label(turn_facts(shell, turn), names[turn - 1], narrow)
        if narrow:
            ax.text(xs[0] - 0.4, turn + 0.32, label, fontsize=9, va="top")
        elif xs[0] < len(steps) / 2:
            ax.text(xs[0] - 0.4, turn - 0.3, label, fontsize=9, va="bottom")
        else:
            ax.text(xs[-1] + 0.4, turn - 0.3, label, fontsize=9, va="bottom", ha="right")
    ax.set_yticks([])
    ax.set_xlim(-1, len(steps))


def draw_pages(ax: Axes, shell: dict) -> None:
    steps = steps_of(shell)
    x = range(len(steps))
    ax.step(
        x,
        [row["in_use"] for row in steps],
        where="mid",
        color=COLORS[0],
        label="pages held by the running request",
    )
    ax.step(
        x,
        [row["cached"] for row in steps],
        where="mid",
        color=COLORS[2],
        label="pages held only by the prefix cache",
    )
    ax.set_xlim(-1, len(steps))
    ax.grid(alpha=0.3)


def note_turn_2(ax: Axes, shell: dict) -> None:
    """Where turn 2 takes turn 1's cached pages: the green line's drop."""
    steps = steps_of(shell)
    start = next(i for i, row in enumerate(steps) if row["turn"] == 2)
    before, f = steps[start - 1]["cached"], turn_facts(shell, 2)
    ax.annotate(
        f"turn 2's prompt takes {f['cached_pages']} of the {before} cached pages\n"
        f"({f['cached']} tokens); the prefill computes the other {f['computed']}",
        (start, steps[start]["cached"]),
        (start + 4, before * 2.4),
        fontsize=9,
        color=COLORS[2],
        arrowprops=dict(arrowstyle="-|>", color=COLORS[2], relpos=(0, 0)),
    )


def note_abort(ax: Axes, shell: dict) -> None:
    steps = steps_of(shell)
    end = len(steps) - 1
    held, kept = steps[end - 1]["in_use"], steps[end]["cached"]
    ax.annotate(
        f"Ctrl-C: AbortMsg; {kept} of\nthe request's {held} pages\n(the prompt's whole "
        "ones)\nstay in the prefix cache",
        (end, kept),
        (end - 1.6, kept + 14),
        fontsize=9,
        color=COLORS[3],
        arrowprops=dict(arrowstyle="-|>", color=COLORS[3]),
    )


@figure("ch14", "turns")
def turns_figure() -> plt.Figure:
    with tempfile.TemporaryDirectory() as tmp:
        first, second = main_session(tiny_model("qwen3", tmp))
    fig, axes = plt.subplots(
        2,
        2,
        figsize=(12, 7),
        height_ratios=[1.3, 1],
        width_ratios=[4.5, 1.3],
        sharex="col",
        sharey="row",
        layout="constrained",
    )
    fig.suptitle("The main's session, one scheduler step at a time: two shells")
    (turns, turns_2), (pages, pages_2) = axes
    draw_turns(turns, first, ["turn 1", "turn 2, after turn 1", "turn 3, after /reset"])
    turns.set_ylim(3.55, 0.3)
    turns.set_title(
        f"the first shell, replies of up to {first['max_tokens']} tokens: each tick "
        "is a reply piece that the shell prints",
        fontsize=10,
    )
    draw_turns(turns_2, second, ["turn 1"], narrow=True)
    turns_2.set_title("the second shell (a new\nprocess), stopped by Ctrl-C", fontsize=10)
    draw_pages(pages, first)
    note_turn_2(pages, first)
    pages.set_ylabel(f"KV pages ({first['page_size']} tokens each)")
    pages.set_xlabel("scheduler step of the first shell (and each turn's end)")
    pages.legend(loc="upper left", fontsize=9)
    draw_pages(pages_2, second)
    note_abort(pages_2, second)
    pages_2.set_xlabel("its steps")
    return fig


# ------------------------------------------------------------------------------- the Ctrl-C path
def sigint_handlers() -> dict[str, str]:
    """What SIGINT does in each process, from the code that sets it: a worker's first frame
    (``_worker_main``, run here with a target that only looks at the handler it left), and the
    line of ``run_shell`` that gives the shell its own once the workers are up."""
    from minisgl.shell import run_shell
    from minisgl.utils import mp

    seen = []
    old = signal.getsignal(signal.SIGINT)
    try:
        look = lambda ready: seen.append(signal.getsignal(signal.SIGINT))  # noqa: E731
        mp._worker_main("tokenizer", look, {}, None)
    finally:
        signal.signal(signal.SIGINT, old)
    source = inspect.getsource(run_shell).splitlines()
    line = next(row.split("#")[0].strip() for row in source if "signal.SIGINT" in row)
    return {"worker": signal.Handlers(seen[0]).name, "shell": line}


def ctrl_c_path(shell: dict) -> dict:
    """The Ctrl-C of the main's second shell, from its log: the messages sent from the Ctrl-C
    on, the gauges at the last reply piece and after the abort, the shell's reads of them."""
    log = shell["log"]
    start = next(
        i
        for i, r in enumerate(log)
        if r["event"] == "message" and type(r["msg"]).__name__ == "AbortMsg"
    )
    before = [r for r in log[:start] if r["event"] == "piece"][-1]
    after = next(r for r in log[start:] if r["event"] == "abort")
    messages = [r for r in log[start:] if r["event"] == "message"]
    return {
        "messages": [(r["from"], r["to"], message_text(r["msg"])) for r in messages],
        "before": before,
        "after": after,
        "reads": shell["shell_reads"],
        "printed": shell["printed"].strip().splitlines()[-1],
    }


def message_text(msg: object) -> str:
    fields = ", ".join(f"{k}={v!r}" for k, v in vars(msg).items() if k in ("uid",))
    return f"{type(msg).__name__}({fields})"


@figure("ch14", "ctrl_c")
def ctrl_c_figure() -> plt.Figure:
    import ch14_shell as m

    with tempfile.TemporaryDirectory() as tmp:
        shell = one_shell(tiny_model("qwen3", tmp), m.LONG_REPLY, [m.LONG_LINE], ctrl_c=True)
    path, handlers = ctrl_c_path(shell), sigint_handlers()
    before, after = path["before"], path["after"]
    lanes = {"terminal": 0.9, "shell": 4.2, "tokenizer": 9.0, "scheduler": 13.2}
    names = {
        "terminal": "the terminal\n(its process group)",
        "shell": "main process:\nthe shell",
        "tokenizer": "tokenizer worker",
        "scheduler": "scheduler process",
    }
    note = dict(fontsize=8.5, va="center", bbox=dict(facecolor="white", edgecolor="none", pad=1))
    rows = 10.4 + 0.8 * len(path["messages"])
    fig, ax = plt.subplots(figsize=(13, 0.55 * rows + 1.2), layout="constrained")
    fig.suptitle(
        f'Ctrl-C as the reply to "{m.LONG_LINE}" starts (the main\'s second shell, its '
        "scheduler run in lockstep)"
    )
    diagram(ax, 17.5, rows + 0.6)
    for lane, x in lanes.items():
        ax.text(x, 0.1, names[lane], ha="center", va="center", fontsize=10, weight="bold")
        ax.plot([x, x], [0.7, rows + 0.4], color=GREY, linewidth=1, zorder=0)
    y = 1.3
    for lane, what in [
        ("shell", f"{handlers['shell']}:\nKeyboardInterrupt in Shell.turn"),
        ("tokenizer", f"{handlers['worker']} (_worker_main): ignored"),
        ("scheduler", f"{handlers['worker']}: ignored"),
    ]:
        arrow(ax, (lanes["terminal"], y), (lanes[lane], y), color=COLORS[3])
        ax.text(lanes["terminal"] + 0.15, y - 0.18, "SIGINT", fontsize=8.5, color=COLORS[3])
        ax.text(lanes[lane] + 0.15, y + 0.22, what, **{**note, "va": "top"})
        y += 1.25
    ax.text(
        lanes["shell"] + 0.15,
        y,
        "closing(stream) closes the reply's generator;\nits finally sends the abort",
        **note,
    )
    y += 0.9
    for source, dest, what in path["messages"]:
        arrow(ax, (lanes[source], y), (lanes[dest], y), color=COLORS[0])
        ax.text(min(lanes[source], lanes[dest]) + 0.15, y - 0.15, what, fontsize=9)
        y += 0.8
    ax.text(
        lanes["scheduler"] + 0.15,
        y + 0.55,
        "SchedulerLoop.abort:\ncache_req(finished=True),\ntable_manager.free;\n"
        f"KV pages in use {before['in_use']} → {after['in_use']},\n"
        f"cached {before['cached']} → {after['cached']} (the prompt's\nwhole pages); "
        f"running {before['running']} → {after['running']}",
        **note,
    )
    y += 1.9
    arrow(ax, (lanes["scheduler"], y), (lanes["shell"], y), color=COLORS[2], linestyle="--")
    ax.text(
        lanes["shell"] + 0.15,
        y - 0.15,
        "SchedulerStats.publish: the gauges in shared memory (num_running_reqs "
        f"{after['running']})",
        fontsize=9,
    )
    reads = path["reads"]
    ax.text(
        lanes["shell"] + 0.15,
        y + 0.75,
        f"{path['printed']}; Shell._wait_idle reads the gauges until no request runs\n"
        f"({len(reads)} read{'s' * (len(reads) != 1)} here, in lockstep), then the next prompt",
        **note,
    )
    ax.text(
        lanes["shell"] + 0.15,
        y + 1.75,
        "pieces of the request already on their way are dropped by ChatClient._replies",
        color="#555555",
        **note,
    )
    return fig
