"""What a constrained decode step costs beside a free one (chapter 23), on a CPU or a GPU.

    PYTHONPATH=python python benchmark/bench_structured.py [--model PATH | --shape NAME]
        [--batches 1,16,256] [--steps 16] [--device auto] [--overlap on|off|both]

By default the real small model of the book (SmolLM2-135M-Instruct, ``examples/real_model.py``)
on the CPU, or ``--shape`` (``examples/ch15_measure.py``'s shapes, random weights, a word-level
tokenizer as ``benchmark/make_checkpoint.py`` writes it). Each batch size runs twice: every row
free, then every row under a regular expression that never ends (``[a-z ]+``; with ``--shape``
``[a-z0-9 ]+``, which its word-level tokens t0, t1, ... match), both for exactly
``--steps`` tokens a row (ignore_eos). A step is the run's wall time over its tokens a row (the
prefill of 32-token prompts included, new ones each run so that the prefix cache serves none);
each figure is the median of three pairs of runs, the order within a pair alternating. Beside
it the decode step alone: the wall time of the scheduler's steps that launched only decode
batches, over their number (the prefill's step left out). Beside the steps, the host's time per
step in the mask (waiting for its rows, applying it) and in accepting each row's new token into
its matcher. Then one more run of each kind with the engine's ``StepTimer`` on, for the host's
time per decode step in each phase: schedule, prepare, forward, sample (the mask's wait and
apply inside it), process, and the mask's own work (catching the matchers up and filling the
bitmask, where it runs). On a GPU that timer waits for the device at every phase's edges, so its
figures are the phases' own and the run is not overlapped; the steps above are from the
untimed runs. With overlap scheduling (the default on a GPU) the mask is filled while the
device runs the forward, so a step costs more only by what the mask's host work exceeds the
forward by.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "examples"), str(ROOT / "benchmark")]

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402

NEVER_ENDS = "[a-z ]+"
NEVER_ENDS_SHAPE = "[a-z0-9 ]+"  # make_checkpoint.py's word-level tokens: none is all letters


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", help="a checkpoint (default: the real small model)")
    which.add_argument("--shape", help="random weights of this shape, with a tokenizer")
    p.add_argument("--batches", default="1,16,256")
    p.add_argument("--steps", type=int, default=16, help="tokens a row")
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--overlap",
        choices=("on", "off", "both"),
        help="overlap scheduling (default: the engine's, on for a GPU)",
    )
    p.add_argument(
        "--regex",
        help="the constraint (default: %r; with --shape, %r, since the "
        "shapes' tokens are t0, t1, ...)" % (NEVER_ENDS, NEVER_ENDS_SHAPE),
    )
    return p.parse_args()


def _timed(seconds: Dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, adding the seconds each call takes to ``seconds[name]``."""

    def run(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start

    return run


@contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` inside the block, and what it was again after it."""
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


@contextmanager
def grammar_clock(llm: LLM) -> Iterator[Dict[str, float]]:
    """Inside the block, the scheduler's mask callbacks and its end-of-grammar checks (which
    advance the matchers by the tokens the host received) are timed, and so is the mask's own
    work, where it runs: catching the matchers up and filling the bitmask. The seconds each
    took, in total, land in the dict yielded."""
    from minisgl.scheduler import constraints

    grammars, seconds = llm.scheduler.grammars, {"mask": 0.0, "accept": 0.0}
    mask_for = grammars.mask_for

    def timed_mask_for(batch: Any, pending: Any) -> Any:
        mask = mask_for(batch, pending)
        return None if mask is None else _timed(seconds, "mask", mask)

    with ExitStack() as stack:
        stack.enter_context(patched(grammars, "mask_for", timed_mask_for))
        stack.enter_context(
            patched(grammars, "is_done", _timed(seconds, "accept", grammars.is_done))
        )
        for name in MASK_WORK:  # module functions, looked up at each call
            if hasattr(constraints, name):
                timed = _timed(seconds, MASK_WORK[name], getattr(constraints, name))
                stack.enter_context(patched(constraints, name, timed))
        yield seconds


MASK_WORK = {"catch_up_all": "catch up", "fill_bitmask": "fill"}  # constraints.py's names


@contextmanager
def step_clock(llm: LLM) -> Iterator[List[Tuple[float, bool]]]:
    """Inside the block, every scheduler step's wall time, and whether every batch it launched
    was a decode batch (a step that launches none, the overlap's last, counts as not), land in
    the list yielded."""
    scheduler, engine = llm.scheduler, llm.scheduler.engine
    steps: List[Tuple[float, bool]] = []
    phases: List[str] = []
    step, forward_batch = scheduler.step, engine.forward_batch

    def timed_step() -> Any:
        phases.clear()
        start = time.perf_counter()
        out = step()
        steps.append((time.perf_counter() - start, bool(phases) and set(phases) == {"decode"}))
        return out

    def noted_forward(batch: Any, *args: Any) -> Any:
        phases.append(batch.phase)
        return forward_batch(batch, *args)

    with patched(scheduler, "step", timed_step), patched(engine, "forward_batch", noted_forward):
        yield steps


def run_ms(
    llm: LLM, batch: int, steps: int, regex: str | None, run: int, profile: bool = False
) -> Dict[str, float]:
    """One generate of ``batch`` rows for ``steps`` tokens each: its wall time per step (ms),
    the decode steps' alone (``decode``), and the mask's and the accepts' host time per step.
    ``profile``: the engine's phases too, per decode step. ``run`` picks prompts no earlier run
    had, so that the prefix cache serves none of them."""
    extra = {"regex": regex} if regex else {}
    params = [
        SamplingParams(max_tokens=steps, ignore_eos=True, temperature=1.0, seed=i, **extra)
        for i in range(batch)
    ]
    span = min(llm.scheduler.engine.model_config.vocab_size, 10010) - 10  # ids 10 .. 10009
    prompts = [[(7 * i + j + 9973 * run) % span + 10 for j in range(32)] for i in range(batch)]
    timer = llm.scheduler.engine.timer
    timer.reset()
    timer.enabled = profile
    try:
        with grammar_clock(llm) as seconds, step_clock(llm) as step_times:
            start = time.perf_counter()
            llm.generate(prompts, params)
            wall = time.perf_counter() - start
    finally:
        timer.enabled = False
    decode = [t for t, only_decode in step_times if only_decode]
    result = {k: v / steps * 1e3 for k, v in seconds.items()}
    result.update(step=wall / steps * 1e3, decode=sum(decode) / max(len(decode), 1) * 1e3)
    if profile:  # per decode step: the prefill's phases are few beside them
        result.update({k: v / steps * 1e3 for k, v in timer.seconds.items()})
    return result


def compare(llm: LLM, batch: int, steps: int, regex: str, repeats: int) -> Dict[str, float]:
    """Free and constrained runs in turn, ``repeats`` times, each pair in the other order than
    the last: the median of each figure, by ``free ``/``constrained `` and its name."""
    runs: Dict[str, List[float]] = {}
    for repeat in range(repeats):
        for constrained in (False, True) if repeat % 2 == 0 else (True, False):
            result = run_ms(
                llm, batch, steps, regex if constrained else None, run=2 * repeat + constrained
            )
            kind = "constrained" if constrained else "free"
            for name, value in result.items():
                runs.setdefault(f"{kind} {name}", []).append(value)
    return {name: statistics.median(values) for name, values in runs.items()}


def profile(llm: LLM, batch: int, steps: int, regex: str) -> Dict[str, Dict[str, float]]:
    """One run of each kind with the engine's phases timed: host ms per decode step by phase."""
    return {
        kind: run_ms(llm, batch, steps, regex if kind == "constrained" else None, 100 + i, True)
        for i, kind in enumerate(("free", "constrained"))
    }


def model_path(args: argparse.Namespace, tmp: str) -> str:
    if args.model:
        return args.model
    if args.shape:
        from make_checkpoint import make_checkpoint

        device = "cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu"
        return str(make_checkpoint(args.shape, Path(tmp) / args.shape, device))
    from real_model import cached_real_model

    return str(cached_real_model())


PHASES = ("schedule", "prepare", "forward decode", "sample", "mask", "catch up", "fill")
PHASES += ("process", "accept")


def report(llm: LLM, args: argparse.Namespace, batches: List[int], regex: str) -> None:
    """Both tables for one engine (one overlap setting)."""
    print(
        f"{'batch':>5} {'free ms':>9} {'constrained ms':>15} {'+%':>6} {'decode free':>12} "
        f"{'decode constr':>14} {'+%':>6} {'mask ms':>8} {'accept ms':>10}   "
        "(ms a step; medians of 3)"
    )
    phases: Dict[int, Dict[str, Dict[str, float]]] = {}
    for batch in batches:
        r = compare(llm, batch, args.steps, regex, repeats=3)
        free, tied = r["free step"], r["constrained step"]
        free_decode, tied_decode = r["free decode"], r["constrained decode"]
        more, more_decode = (tied / free - 1) * 100, (tied_decode / free_decode - 1) * 100
        print(
            f"{batch:>5} {free:9.2f} {tied:15.2f} {more:+6.1f} "
            f"{free_decode:12.2f} {tied_decode:14.2f} {more_decode:+6.1f} "
            f"{r['constrained mask']:8.2f} {r['constrained accept']:10.2f}"
        )
        phases[batch] = profile(llm, batch, args.steps, regex)
    print("host ms per decode step by phase (one timed run each):")
    print(f"{'batch':>5} {'kind':>11} " + " ".join(f"{name:>8}" for name in PHASES))
    for batch, kinds in phases.items():
        for kind, p in kinds.items():
            cells = " ".join(f"{p.get(name, 0.0):8.2f}" for name in PHASES)
            print(f"{batch:>5} {kind:>11} {cells}")


def main() -> None:
    args = parse_args()
    batches: List[int] = [int(b) for b in args.batches.split(",")]
    overlaps = {None: [None], "on": [True], "off": [False], "both": [False, True]}[args.overlap]
    with tempfile.TemporaryDirectory() as tmp:
        path = model_path(args, tmp)
        regex = args.regex or (NEVER_ENDS_SHAPE if args.shape else NEVER_ENDS)
        for overlap in overlaps:
            options = {} if overlap is None else {"overlap_scheduling": overlap}
            llm = LLM(path, device=args.device, max_running_req=max(batches), **options)
            engine = llm.scheduler.engine
            llm.generate([[11, 12, 13]], [SamplingParams(max_tokens=4, regex=regex)])  # warm
            where = torch.cuda.get_device_name() if engine.device.type == "cuda" else "CPU"
            print(
                f"{Path(path).name} on {where}, torch {torch.__version__}, "
                f"{torch.get_num_threads()} threads; {args.steps} tokens a row, regex {regex!r}; "
                f"overlap scheduling {'on' if llm.scheduler.overlap else 'off'}"
            )
            report(llm, args, batches, regex)
            llm.shutdown()


if __name__ == "__main__":
    main()
