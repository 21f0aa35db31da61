"""Chapter 23's figures: allowed_tokens.svg, how many tokens each constraint of the main allows
at each step of its greedy output (the real grammars, compiled against the tiny Qwen3's
tokenizer, followed along the engine's own tokens); constrained_step.svg, the order of the
host's work in the first steps of constrained requests under overlap scheduling, recorded from
the scheduler as it runs."""

from __future__ import annotations

import contextlib
import tempfile
from typing import Iterator, List, Tuple

import matplotlib.pyplot as plt

from .common import COLORS, LIGHT, box, diagram, figure, quietly, tiny_model


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


Event = Tuple[str, int]  # (what the host did, the batch it did it for)


def _record_constrained_run() -> List[Event]:
    """The host's work, in order, while two constrained requests run under overlap scheduling:
    the engine's phases, the mask callback's parts and which batch each belongs to."""
    import minisgl.scheduler.constraints as constraints
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM
    from minisgl.scheduler.scheduler import Scheduler

    events: List[Event] = []
    numbers: dict[int, int] = {}  # id(Launched) -> the batch's number, in launch order
    launching = [0]  # the number the batch being launched will get

    real_launch, real_process, real_pending, real_step = (
        Scheduler._launch_next,
        Scheduler._process,
        Scheduler._pending,
        Scheduler.step,
    )
    real_parts = {n: getattr(constraints, n) for n in ("catch_up_all", "fill_bitmask")}

    def launch(self):
        launching[0] = len(numbers) + 1
        out = real_launch(self)
        if out is not None:
            numbers[id(out)] = launching[0]
            events.append(("queue sampling", launching[0]))
        return out

    def process(self, done):
        events.append(("process", numbers[id(done)]))
        return real_process(self, done)

    def pending(self):
        read, in_flight = real_pending(self), numbers.get(id(self._in_flight), 0)

        def wait():
            events.append(("wait for tokens", in_flight))
            return read()

        return wait

    def step(self):
        events.append(("step", sum(e[0] == "step" for e in events) + 1))
        return real_step(self)

    def part(name):
        def run(*args, **kwargs):
            events.append((name, launching[0]))
            return real_parts[name](*args, **kwargs)

        return run

    with tempfile.TemporaryDirectory() as tmp:
        llm = quietly(
            LLM,
            tiny_model("qwen3", tmp),
            device="cpu",
            page_size=4,
            num_pages=64,
            overlap_scheduling=True,
        )
        timer = llm.scheduler.engine.timer
        real_phase = timer.phase

        @contextlib.contextmanager
        def phase(name: str) -> Iterator[None]:
            if name in ("schedule", "prepare") or name.startswith("forward"):
                events.append(
                    (
                        "queue forward" if name.startswith("forward") else name,
                        launching[0] if name != "schedule" else len(numbers) + 1,
                    )
                )
            with real_phase(name):
                yield

        timer.phase = phase
        Scheduler._launch_next, Scheduler._process, Scheduler._pending = launch, process, pending
        Scheduler.step = step
        for name in real_parts:
            setattr(constraints, name, part(name))
        try:
            params = SamplingParams(max_tokens=3, regex=r"[0-9]{4}-[0-9]{2}")
            llm.generate(["The date is", "Today is"], [params, params])
        finally:
            Scheduler._launch_next, Scheduler._process = real_launch, real_process
            Scheduler._pending, Scheduler.step = real_pending, real_step
            for name, real in real_parts.items():
                setattr(constraints, name, real)
    return events


LABELS = {
    "schedule": "schedule\n{n}",
    "prepare": "prepare\n{n}",
    "queue forward": "queue\nforward {n}",
    "wait for tokens": "wait for\n{n}'s tokens",
    "catch_up_all": "catch up\nmatchers",
    "fill_bitmask": "fill\nbitmask",
    "queue sampling": "mask,\nsample {n}",
    "process": "process\n{n}",
}
HOST_COLORS = {"wait for tokens": "#B0B0B0", "catch_up_all": COLORS[1], "fill_bitmask": COLORS[1]}


@figure("ch23", "constrained_step")
def constrained_step() -> plt.Figure:
    """Host lane: the recorded events of the first steps (up to the second batch processed),
    one box each, in order. Device lane: what the host has queued, as a GPU would run it: a
    batch's forward from the moment it is queued until its mask and sampling are queued."""
    events = _record_constrained_run()
    end = next(i for i, e in enumerate(events) if e == ("process", 2)) + 1
    steps = [(i, n) for i, (what, n) in enumerate(events[:end]) if what == "step"]
    events = [e for e in events[:end] if e[0] != "step"]
    fig, ax = plt.subplots(figsize=(17, 4.6), layout="constrained")
    diagram(ax, len(events) + 1.6, 4.2)
    ax.text(0, 0.35, "host", fontsize=10, va="center", weight="bold")
    ax.text(0, 2.65, "device\n(a GPU)", fontsize=10, va="center", weight="bold")
    x0 = 1.6
    for i, (what, n) in enumerate(events):
        if what == "wait for tokens" and n == 0:
            label, fill = "nothing\nin flight", LIGHT
        else:
            label = LABELS[what].format(n=n)
            fill = HOST_COLORS.get(what, COLORS[0] if what != "process" else COLORS[2])
        box(ax, x0 + i, 0.8, 1, 1.1, fill, label, fontsize=8.8, color="black")
    for k, (i, n) in enumerate(steps):  # a step's events begin where its marker was
        left = x0 + i - k
        right = x0 + (steps[k + 1][0] - k - 1 if k + 1 < len(steps) else len(events))
        ax.plot([left + 0.05, right - 0.05], [0.62, 0.62], color="#444444", linewidth=1)
        ax.text((left + right) / 2, 0.5, f"Scheduler.step {n}", ha="center", fontsize=9)
    queued = {n: x0 + i for i, (what, n) in enumerate(events) if what == "queue forward"}
    sampled = {n: x0 + i for i, (what, n) in enumerate(events) if what == "queue sampling"}
    for n, start in queued.items():
        stop = sampled.get(n)
        if stop is None:
            continue
        box(
            ax,
            start + 0.5,
            2.2,
            stop - start,
            0.9,
            COLORS[0],
            f"forward {n}",
            fontsize=9,
            color="white",
        )
        box(
            ax,
            stop + 0.5,
            2.2,
            0.9,
            0.9,
            COLORS[3],
            f"mask +\nsample {n}",
            fontsize=8.8,
            color="white",
        )
    ax.text(
        x0,
        3.75,
        "The mask of batch k+1 needs batch k's tokens: the host queues k+1's forward first, "
        "then waits for k's tokens, catches the matchers up and fills the bitmask while the "
        "device runs the forward; the sampling of k+1 is queued after the mask, and only then "
        "does the host process k. On the first step batch 1 is in flight before batch 2 is "
        "launched, so batch 2's mask waits for batch 1's tokens.",
        fontsize=9,
        wrap=True,
        va="top",
    )
    ax.set_title(
        "The host's work in order, two requests under a regular expression with overlap "
        "scheduling (recorded from the scheduler; widths are order, not time)",
        fontsize=10,
        loc="left",
    )
    return fig
