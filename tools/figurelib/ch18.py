"""Chapter 18's figures: timeline.svg, the main's run without and with overlap scheduling: host
and device, each request's tokens, the lagged EOS step, its dropped token and the release that
waits for the batch in flight; chunked.svg, the main's long prompt in chunks, each chunk launched
before the one before it is processed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from .common import COLORS, GREY, LIGHT, figure, run_main

HOST, DEVICE, REQ0 = 0, 1, 2  # the lanes, top down: host, device, then one a request
WAITS = COLORS[3]  # a release deferred: finished, its row and pages not given back yet


@dataclass
class Event:
    """One thing a scheduler did, in order: "step" (a Scheduler.step began), "launch" and
    "process" of the batch-th batch, "release" (Scheduler._release, deferred or not) and
    "cache" (Scheduler._cache: the pages and, for a finished request, the row given back)."""

    kind: str
    batch: int = -1
    label: str = ""  # the batch as the main prints it: "decode [0, 1]"
    lens: list[int] = field(default_factory=list)  # launch: the tokens each request runs
    uid: int = -1
    finished: bool = False  # release, cache: the request is done (its row goes back too)
    deferred: bool = False  # release: _release did not give it back at once (it waits)
    tokens: dict[int, int] = field(default_factory=dict)  # process: uid -> token appended
    dropped: dict[int, int] = field(default_factory=dict)  # process: uid -> token dropped


@cache
def record_main() -> tuple[dict, dict[tuple[str, bool], list[Event]]]:
    """Run examples/ch18_overlap.py as it is, with its scheduler's methods wrapped; the main's
    globals and the events of its timeline runs (the schedulers with the main's EOS: "eos") and
    of its chunked runs (max_extend_tokens 8: "chunked"), by part and overlap on or off."""
    from minisgl.scheduler import Scheduler

    real = {
        name: getattr(Scheduler, name)
        for name in ("step", "_launch_next", "_process", "_release", "_cache")
    }
    events: dict[Scheduler, list[Event]] = {}
    batches: dict[Scheduler, list] = {}  # the k-th launched, kept alive: no two share an id

    def show(batch) -> str:
        return f"{batch.phase} {[r.uid for r in batch.reqs]}"

    def step(self):
        events.setdefault(self, []).append(Event("step"))
        return real["step"](self)

    def launch_next(self):
        launched = real["_launch_next"](self)
        if launched is not None:
            batches.setdefault(self, []).append(launched.batch)
            k, label = len(batches[self]) - 1, show(launched.batch)
            events[self].append(Event("launch", k, label, lens=list(launched.extend_lens)))
        return launched

    def process(self, done):
        k = next(i for i, b in enumerate(batches[self]) if b is done.batch)
        event = Event("process", k, show(done.batch))
        events[self].append(event)  # before what it calls: the releases it runs come after
        out = real["_process"](self, done)
        for req, token, got_token in zip(done.batch.reqs, done.tokens.tolist(), done.sampled):
            if req.uid not in out.uids:
                event.dropped[req.uid] = token
            elif got_token:
                event.tokens[req.uid] = token
        return out

    def release(self, req, *, finished: bool):
        event = Event("release", uid=req.uid, finished=finished)
        events[self].append(event)
        n = len(events[self])
        real["_release"](self, req, finished=finished)
        event.deferred = not any(e.kind == "cache" for e in events[self][n:])  # not given back

    def cache(self, req, finished: bool):
        events[self].append(Event("cache", uid=req.uid, finished=finished))
        return real["_cache"](self, req, finished)

    before = os.environ.get("MINISGL_DISABLE_OVERLAP_SCHEDULING")
    for name, wrapper in zip(real, (step, launch_next, process, release, cache)):
        setattr(Scheduler, name, wrapper)
    try:
        main = run_main("ch18_overlap.py")
    finally:
        for name, method in real.items():
            setattr(Scheduler, name, method)
        if before is None:  # the main sets it for its last line
            os.environ.pop("MINISGL_DISABLE_OVERLAP_SCHEDULING", None)
        else:
            os.environ["MINISGL_DISABLE_OVERLAP_SCHEDULING"] = before
    runs = {}
    for s, run in events.items():
        if s.eos_token_ids == main["eos"]:
            runs["eos", s.overlap] = run
        elif s.config.max_extend_tokens == 8:
            runs["chunked", s.overlap] = run
    printed = {"eos": main["outs"], "chunked": main["long_outs"]}
    for (part, overlap), run in runs.items():  # what was recorded is what the main printed
        tokens: dict[int, list[int]] = {}
        for event in run:
            for uid, token in event.tokens.items():
                tokens.setdefault(uid, []).append(token)
        assert [tokens[uid] for uid in sorted(tokens)] == printed[part][overlap], (part, overlap)
    assert len(runs) == 4, sorted(runs)
    return main, runs


@dataclass
class Replay:
    """A recorded run's events laid out in time under assumed costs."""

    host: list = field(default_factory=list)  # (start, width, "launch" | "process", batch)
    device: list = field(default_factory=list)  # (start, width, batch, label)
    wait: list = field(default_factory=list)  # (start, width): the host waits for a batch
    steps: list = field(default_factory=list)  # when each Scheduler.step began
    tokens: list = field(default_factory=list)  # (time, uid, token, "token" | "eos" | "dropped")
    held: dict = field(default_factory=dict)  # uid -> (admitted, released): row and pages held
    waits: dict = field(default_factory=dict)  # uid -> (finished, released): deferred
    lagged: list = field(default_factory=list)  # (batch, uid): ran uid after its last token
    end: float = 0.0


def replay(run: list[Event], eos: tuple, host: float, forward: float) -> Replay:
    """Each launch and each process takes ``host`` on the host, a forward ``forward`` on the
    device, one batch at a time; the host waits for a batch's end before it processes it. A
    deferred release runs at the start of the next process (after its wait), one made at once
    at the end of the process that made it."""
    r = Replay()
    t_host, t_device, ends = 0.0, 0.0, {}
    for event in run:
        if event.kind == "step":  # the last one finds nothing to do: not drawn
            r.steps.append(t_host)
        elif event.kind == "launch":
            r.host.append((t_host, host, "launch", event.batch))
            for uid in (u for u in _uids(event.label) if u not in r.held):
                r.held[uid] = (t_host, None)  # its row and pages are given at its launch
            t_host += host
            start = max(t_host, t_device)
            r.device.append((start, forward, event.batch, event.label))
            t_device = ends[event.batch] = start + forward
        elif event.kind == "process":
            if ends[event.batch] > t_host:
                r.wait.append((t_host, ends[event.batch] - t_host))
                t_host = ends[event.batch]
            r.host.append((t_host, host, "process", event.batch))
            mid = t_host + host / 2
            r.tokens += [
                (mid, u, t, "eos" if t in eos else "token") for u, t in event.tokens.items()
            ]
            r.tokens += [(mid, u, t, "dropped") for u, t in event.dropped.items()]
            r.lagged += [(event.batch, u) for u in event.dropped]
            process_start, t_host = t_host, t_host + host
        elif event.kind == "release" and event.finished:
            if event.deferred:
                r.waits[event.uid] = (t_host, None)
        elif event.kind == "cache" and event.finished:
            when = process_start if event.uid in r.waits else t_host
            r.held[event.uid] = (r.held[event.uid][0], when)
            if event.uid in r.waits:
                r.waits[event.uid] = (r.waits[event.uid][0], when)
    r.end = max(t_host, t_device)
    if run[-1].kind == "step":
        r.steps.pop()
    return r


def _uids(label: str) -> list[int]:
    inside = label.split("[", 1)[1].split("]", 1)[0]  # "decode [0, 1]" or "prefill [1]: 8"
    return [int(u) for u in inside.split(",") if u.strip()]


def draw_run(ax: plt.Axes, r: Replay, overlap: bool, uids: list[int]) -> None:
    for start, width, kind, k in r.host:
        colour = COLORS[0] if kind == "launch" else COLORS[1]
        ax.broken_barh([(start, width)], (HOST - 0.4, 0.8), facecolors=colour, edgecolor="white")
        ax.text(
            start + width / 2,
            HOST,
            f"{kind}\nbatch {k}",
            ha="center",
            va="center",
            fontsize=9,
            color="white",
            linespacing=1.1,
        )
    for start, width in r.wait:
        ax.broken_barh([(start, width)], (HOST - 0.08, 0.16), facecolors=GREY)
    lagged = {k for k, _ in r.lagged}
    for start, width, k, label in r.device:
        ax.broken_barh(
            [(start, width)],
            (DEVICE - 0.4, 0.8),
            facecolors=COLORS[2],
            edgecolor=WAITS if k in lagged else "white",
            linewidth=2.5 if k in lagged else 1,
        )
        ax.text(
            start + width / 2,
            DEVICE,
            f"batch {k}\n{label}",
            ha="center",
            va="center",
            fontsize=9,
            color="white",
            linespacing=1.1,
        )
    for uid in uids:
        y = REQ0 + uid
        start, end = r.held[uid]
        ax.broken_barh([(start, end - start)], (y - 0.3, 0.6), facecolors=LIGHT)
        if uid in r.waits:
            w_start, w_end = r.waits[uid]
            ax.broken_barh(
                [(w_start, w_end - w_start)],
                (y - 0.3, 0.6),
                facecolors="white",
                edgecolor=WAITS,
                hatch="///",
                linewidth=1,
            )
        ax.plot([end, end], [y - 0.3, y + 0.3], color="#555555", linewidth=2)
        after = max([end] + [t + 0.6 for t, u, _, kind in r.tokens if u == uid and t > end])
        ax.text(
            after + 0.08,
            y,
            "row and\npages back",
            ha="left",
            va="center",
            fontsize=9,
            color="#555555",
            linespacing=1.0,
        )
    for time, uid, token, kind in r.tokens:
        text = {"token": f"{token}", "eos": f"{token} EOS", "dropped": f"{token} dropped"}[kind]
        ax.text(
            time,
            REQ0 + uid,
            text,
            ha="center",
            va="center",
            fontsize=9,
            color=WAITS if kind == "dropped" else "black",
            fontweight="bold" if kind != "token" else "normal",
            bbox={"facecolor": "white", "edgecolor": WAITS, "pad": 1.5}
            if kind == "dropped"
            else None,
        )
    for n, time in enumerate(r.steps, 1):
        ax.axvline(time, color="#888888", linestyle=":", linewidth=1, zorder=0)
        ax.text(
            time + 0.05,
            HOST - 0.48,
            f"step {n}",
            ha="left",
            va="bottom",
            fontsize=9,
            color="#555555",
        )
    busy = sum(width for _, width, _, _ in r.device)
    ax.set_title(
        f"overlap_scheduling={overlap}: {r.end:.0f} units, the device busy "
        f"{100 * busy / r.end:.0f}% of them",
        fontsize=11,
        loc="left",
    )
    lanes = ["host", "device"] + [f"request {u}" for u in uids]
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_ylim(len(lanes) - 0.5, HOST - 0.75)
    ax.tick_params(axis="y", length=0)
    ax.spines[["top", "right", "left"]].set_visible(False)
    ax.grid(alpha=0.3, axis="x")


@figure("ch18", "timeline")
def overlap_timeline() -> plt.Figure:
    """The ch18 main's two runs (request 0 stops at EOS): the order of the launches, the
    processing, the tokens and the releases is the scheduler's own, recorded as the main runs
    on a CPU; the durations are assumed (host work 1 unit per launch or process, a forward 2)."""
    main, runs = record_main()
    eos = main["eos"]
    replays = {overlap: replay(runs["eos", overlap], eos, 1.0, 2.0) for overlap in (False, True)}
    fig, axes = _without_and_with(
        replays,
        13,
        "The ch18 main without and with overlap: batch k+1 is launched before batch "
        "k's tokens are processed",
    )
    r = replays[True]
    ((k, uid),) = r.lagged  # the main's one lagged request
    assert uid in r.waits, "the lagged request's release was not deferred"
    dropped = next(t for _, u, t, kind in r.tokens if u == uid and kind == "dropped")
    axes[1].text(
        r.end + 1.6,
        REQ0 + 1.5,
        f"Batch {k} was launched before the host saw\n"
        f"request {uid}'s EOS ({eos[0]}): it runs request {uid} once\n"
        f"more, and that token, {dropped}, is dropped.\n"
        f"Request {uid}'s release waits (hatched) until\n"
        f"batch {k} is processed: till then batch {k}\n"
        f"reads request {uid}'s row and pages.",
        ha="left",
        va="center",
        fontsize=10,
        linespacing=1.3,
        bbox={"facecolor": "white", "edgecolor": WAITS, "pad": 5},
    )
    axes[1].set_xlim(-0.2, replays[False].end + 1.3)  # room for the last "pages back"
    axes[1].set_xlabel("time, in assumed units: a launch or a process 1, a forward 2")
    after_eos = Patch(
        facecolor=COLORS[2],
        edgecolor=WAITS,
        linewidth=2.5,
        label="a forward that runs a request after its EOS",
    )
    handles = _legend("forward on the device", after_eos)
    fig.legend(handles=handles, loc="outside lower center", ncols=4, fontsize=9, frameon=False)
    return fig


@figure("ch18", "chunked")
def chunked_prefill() -> plt.Figure:
    """The ch18 main's long prompt (request 1, 20 tokens, at most 8 prompt tokens a forward)
    beside request 0, without and with overlap: the order is the scheduler's own, recorded as
    the main runs on a CPU; the durations are assumed as in timeline.svg."""
    main, runs = record_main()
    replays = {}
    for overlap in (False, True):
        run = [  # each batch labelled with the tokens its requests run: "prefill [1]\n8 tokens"
            replace(e, label=f"{e.label}\n{'+'.join(map(str, e.lens))} tokens") if e.lens else e
            for e in runs["chunked", overlap]
        ]
        replays[overlap] = replay(run, (), 1.0, 2.0)
    fig, axes = _without_and_with(
        replays,
        17.2,
        "Chunked prefill under the lag: each chunk is launched before the one before it is "
        "processed",
    )
    r = replays[True]
    chunks = [(k, label) for _, _, k, label in r.device if label.startswith("prefill [1]")]
    (first_decode,) = [
        k for _, _, k, label in r.device if label.startswith("decode") and 1 in _uids(label)
    ][:1]
    assert chunks[-1][0] + 1 == first_decode, "request 1's decode is not the next launch"
    axes[1].text(
        r.end + 1.6,
        REQ0 + 0.5,
        f"A chunk counts as run once it is launched\n"
        f"(cached_len moves at launch), so request 1's\n"
        f"next chunk is scheduled at once: batches\n"
        f"{chunks[0][0]} to {chunks[-1][0]} each go out before the batch before\n"
        f"them is processed. Processing a chunk appends\n"
        f"nothing: it samples no token. Batch {chunks[-1][0]}, the last\n"
        f"chunk, samples request 1's first token on the\n"
        f"device; batch {first_decode}, launched before the host has\n"
        f"that token, reads it from last_tokens.",
        ha="left",
        va="center",
        fontsize=10,
        linespacing=1.3,
        bbox={"facecolor": "white", "edgecolor": COLORS[2], "pad": 5},
    )
    axes[1].set_xlim(-0.2, replays[False].end + 1.3)
    axes[1].set_xlabel("time, in assumed units: a launch or a process 1, a forward 2")
    handles = _legend("forward on the device: its requests and their tokens")
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=9, frameon=False)
    return fig


def _legend(forward: str, *extra: Patch) -> list[Patch]:
    """The timelines' legend: host phases, the device's forward (labelled ``forward``), then
    ``extra`` entries, then the rows and pages a request holds."""
    return [
        Patch(color=COLORS[0], label="launch (schedule, forward queued)"),
        Patch(color=COLORS[1], label="process (tokens appended, requests finished)"),
        Patch(color=GREY, label="host waits for the batch"),
        Patch(color=COLORS[2], label=forward),
        *extra,
        Patch(color=LIGHT, label="a request holds a row and pages (| given back)"),
        Patch(
            facecolor="white",
            edgecolor=WAITS,
            hatch="///",
            label="finished, release deferred while a batch is in flight",
        ),
    ]


def _without_and_with(replays: dict, width: float, title: str) -> tuple[plt.Figure, Any]:
    """Two panels, the run without overlap above the run with it, on one time axis."""
    uids = sorted(replays[False].held)
    fig, axes = plt.subplots(2, 1, figsize=(width, 8.4), layout="constrained", sharex=True)
    fig.suptitle(title)
    for ax, overlap in zip(axes, (False, True)):
        draw_run(ax, replays[overlap], overlap, uids)
    return fig, axes
