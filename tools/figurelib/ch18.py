"""Chapter 18's figure: timeline.svg, host and device without and with overlap scheduling.
"""

from __future__ import annotations

import tempfile

import matplotlib.pyplot as plt

from .common import COLORS, GREY, figure, tiny_model


def scheduler_events(path: str, overlap: bool) -> list[tuple[str, int, str]]:
    """What the scheduler did, in order, on three requests like the main's: ("launch", k,
    batch) and ("process", k, batch) for the k-th batch, recorded around its own _launch_next
    and _process."""
    from minisgl.core import SamplingParams
    from minisgl.scheduler import Scheduler, SchedulerConfig

    s = Scheduler(SchedulerConfig(path, device="cpu", overlap_scheduling=overlap))
    events: list[tuple[str, int, str]] = []
    launch, process = s._launch_next, s._process
    batches: list = []  # the k-th launched, kept alive so that no two share an id

    def name(batch) -> str:
        return f"{batch.phase[0].upper()}{[r.uid for r in batch.reqs]}"

    def logged_launch():
        launched = launch()
        if launched is not None:
            batches.append(launched.batch)
            events.append(("launch", len(batches) - 1, name(launched.batch)))
        return launched

    def logged_process(done):
        k = next(i for i, b in enumerate(batches) if b is done.batch)
        events.append(("process", k, name(done.batch)))
        return process(done)

    s._launch_next, s._process = logged_launch, logged_process
    params = [SamplingParams(max_tokens=4, ignore_eos=True), SamplingParams(max_tokens=3,
              ignore_eos=True), SamplingParams(max_tokens=1)]
    for prompt, sp in zip([[3, 1, 4, 1, 5], [2, 7, 1, 8], [6] * 6], params):
        s.add_req(prompt, sp)
    s.run_until_idle()
    return events


def replay_timeline(events: list[tuple[str, int, str]], host: float, forward: float) -> dict:
    """Times for the recorded order under assumed costs: each launch and each process takes
    ``host`` on the host, a forward ``forward`` on the device, one batch at a time; the host
    waits for a batch's end before it processes it."""
    t_host, t_device, ends = 0.0, 0.0, {}
    spans: dict = {"host": [], "device": [], "wait": []}
    for kind, k, batch in events:
        if kind == "launch":
            spans["host"].append((t_host, host, "schedule " + batch))
            t_host += host
            start = max(t_host, t_device)
            spans["device"].append((start, forward, batch))
            t_device = ends[k] = start + forward
        else:
            if ends[k] > t_host:
                spans["wait"].append((t_host, ends[k] - t_host))
                t_host = ends[k]
            spans["host"].append((t_host, host, "process " + batch))
            t_host += host
    spans["end"] = max(t_host, t_device)
    return spans


@figure("ch18", "timeline")
def overlap_timeline() -> plt.Figure:
    """Host and device over the main's requests, without and with overlap: the order of the
    launches and the processing is the scheduler's own (recorded on a CPU); the durations are
    assumed (host work 1 unit per launch or process, a forward 2 units)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_model("llama3", tmp)
        runs = {overlap: replay_timeline(scheduler_events(path, overlap), 1.0, 2.0)
                for overlap in (False, True)}
    fig, axes = plt.subplots(2, 1, figsize=(12, 5.2), layout="constrained", sharex=True)
    fig.suptitle("Overlap scheduling: batch k+1 is launched before batch k's tokens are processed")
    for ax, overlap in zip(axes, (False, True)):
        spans = runs[overlap]
        for start, width, label in spans["host"]:
            colour = COLORS[0] if label.startswith("schedule") else COLORS[1]
            ax.broken_barh([(start, width)], (1.1, 0.8), facecolors=colour, edgecolor="white")
            ax.text(start + width / 2, 1.5, label.split(" ", 1)[1], ha="center", va="center",
                    fontsize=7, color="white")
        for start, width in spans["wait"]:
            ax.broken_barh([(start, width)], (1.4, 0.2), facecolors=GREY)
        for start, width, label in spans["device"]:
            ax.broken_barh([(start, width)], (0.1, 0.8), facecolors=COLORS[2], edgecolor="white")
            ax.text(start + width / 2, 0.5, label, ha="center", va="center", fontsize=8,
                    color="white")
        busy = sum(w for _, w, _ in spans["device"])
        ax.set_yticks([0.5, 1.5], ["device", "host"])
        ax.set_title(f"overlap_scheduling={overlap}: {spans['end']:.0f} units, the device busy "
                     f"{100 * busy / spans['end']:.0f}% of them", fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    axes[1].set_xlabel("time, in assumed units (host: blue schedule and launch, orange "
                       "process, grey waiting; device: green forward)")
    return fig
