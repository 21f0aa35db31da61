"""What a constrained decode step costs beside a free one (chapter 23), on a CPU or a GPU.

    PYTHONPATH=python python benchmark/bench_structured.py [--model PATH | --shape NAME]
        [--batches 1,16,256] [--steps 16] [--device auto]

By default the real small model of the book (SmolLM2-135M-Instruct, ``examples/real_model.py``)
on the CPU, or ``--shape`` (``examples/ch15_measure.py``'s shapes, random weights, a word-level
tokenizer as ``benchmark/make_checkpoint.py`` writes it). Each batch size runs twice: every row
free, then every row under a regular expression that never ends (``[a-z ]+``; with ``--shape``
``[a-z0-9 ]+``, which its word-level tokens t0, t1, ... match), both for exactly
``--steps`` tokens a row (ignore_eos). A step is the run's wall time over its tokens a row (the
prefill of 32-token prompts included, new ones each run so that the prefix cache serves none);
each figure is the median of three pairs of runs, the order within a pair alternating. Beside
the steps, the host's time per step in the mask (filling the bitmask, applying it) and in
accepting each row's new token into its matcher. With overlap scheduling (the default on a
GPU) the mask is filled while the device runs the forward, so a step costs more only by what
the mask's host work exceeds the forward by.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

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
        "--regex",
        help="the constraint (default: %r; with --shape, %r, since the "
        "shapes' tokens are t0, t1, ...)" % (NEVER_ENDS, NEVER_ENDS_SHAPE),
    )
    return p.parse_args()


@contextmanager
def grammar_clock(llm: LLM) -> Iterator[Dict[str, float]]:
    """Inside the block, the scheduler's mask callbacks and its end-of-grammar checks (which
    advance the matchers by the tokens the host received) are timed: the seconds each took, in
    total, land in the dict yielded. Both are put back on leaving."""
    grammars, seconds = llm.scheduler.grammars, {"mask": 0.0, "accept": 0.0}
    mask_for, is_done = grammars.mask_for, grammars.is_done

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                seconds[name] += time.perf_counter() - start

        return run

    def timed_mask_for(batch: Any, pending: Any) -> Any:
        mask = mask_for(batch, pending)
        return None if mask is None else timed("mask", mask)

    grammars.mask_for, grammars.is_done = timed_mask_for, timed("accept", is_done)
    try:
        yield seconds
    finally:
        grammars.mask_for, grammars.is_done = mask_for, is_done


def run_ms(llm: LLM, batch: int, steps: int, regex: str | None, run: int) -> Dict[str, float]:
    """One generate of ``batch`` rows for ``steps`` tokens each: its wall time per step (ms)
    and the mask's and the accepts' host time per step. ``run`` picks prompts no earlier run
    had, so that the prefix cache serves none of them."""
    extra = {"regex": regex} if regex else {}
    params = [
        SamplingParams(max_tokens=steps, ignore_eos=True, temperature=1.0, seed=i, **extra)
        for i in range(batch)
    ]
    span = min(llm.scheduler.engine.model_config.vocab_size, 10010) - 10  # ids 10 .. 10009
    prompts = [[(7 * i + j + 9973 * run) % span + 10 for j in range(32)] for i in range(batch)]
    with grammar_clock(llm) as seconds:
        start = time.perf_counter()
        llm.generate(prompts, params)
        wall = time.perf_counter() - start
    return {
        "step": wall / steps * 1e3,
        "mask": seconds["mask"] / steps * 1e3,
        "accept": seconds["accept"] / steps * 1e3,
    }


def compare(llm: LLM, batch: int, steps: int, regex: str, repeats: int) -> Dict[str, float]:
    """Free and constrained runs in turn, ``repeats`` times, each pair in the other order than
    the last: the median of each."""
    free, tied, mask, accept = [], [], [], []
    for repeat in range(repeats):
        for constrained in (False, True) if repeat % 2 == 0 else (True, False):
            result = run_ms(
                llm, batch, steps, regex if constrained else None, run=2 * repeat + constrained
            )
            (tied if constrained else free).append(result["step"])
            if constrained:
                mask.append(result["mask"])
                accept.append(result["accept"])
    return {
        "free": statistics.median(free),
        "constrained": statistics.median(tied),
        "mask": statistics.median(mask),
        "accept": statistics.median(accept),
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


def main() -> None:
    args = parse_args()
    batches: List[int] = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path = model_path(args, tmp)
        llm = LLM(path, device=args.device, max_running_req=max(batches))
        engine = llm.scheduler.engine
        regex = args.regex or (NEVER_ENDS_SHAPE if args.shape else NEVER_ENDS)
        llm.generate([[11, 12, 13]], [SamplingParams(max_tokens=4, regex=regex)])  # warm
        where = torch.cuda.get_device_name() if engine.device.type == "cuda" else "CPU"
        print(
            f"{Path(path).name} on {where}, torch {torch.__version__}, {torch.get_num_threads()}"
            f" threads; {args.steps} tokens a row, regex {regex!r}"
        )
        print(
            f"{'batch':>5} {'free ms':>9} {'constrained ms':>15} {'+%':>6} {'mask ms':>8} "
            f"{'accept ms':>10}   (ms a step; medians of 3)"
        )
        for batch in batches:
            r = compare(llm, batch, args.steps, regex, repeats=3)
            print(
                f"{batch:>5} {r['free']:9.2f} {r['constrained']:15.2f} "
                f"{(r['constrained'] / r['free'] - 1) * 100:+6.1f} {r['mask']:8.2f} "
                f"{r['accept']:10.2f}"
            )
        llm.shutdown()


if __name__ == "__main__":
    main()
