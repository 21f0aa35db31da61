"""What chapter 25's request fields cost beside plain sampling, on a CPU or a GPU.

    PYTHONPATH=python python benchmark/bench_api.py [--model PATH | --shape NAME]
        [--batches 1,64] [--steps 16] [--device auto]

By default the real small model of the book (SmolLM2-135M-Instruct, ``examples/real_model.py``)
on the CPU, or ``--shape`` (``examples/ch15_measure.py``'s shapes, random weights, as
``benchmark/make_checkpoint.py`` writes them). Each batch size runs these decodes, every row
asking the same, each for exactly ``--steps`` tokens a row (ignore_eos, temperature 1, a seed a
row, 32-token prompts no earlier run had, so that the prefix cache serves none):

- ``plain``: nothing more, the fused sampler's path;
- ``logprobs 5``: each new token's log-probability and the 5 most likely (OpenAI's
  ``top_logprobs: 5``, what guidance asks on every call);
- ``penalties``: presence 0.5, frequency 0.5 and repetition 1.1;
- ``logit_bias``: -100 on 10 tokens (a "never say these" list).

A decode step is the time a run of ``--steps`` tokens takes beyond a run of one token (its
prefill, on other prompts of the same length), over ``--steps`` - 1. Then one prefill against
another: the 32-token prompts with ``max_tokens`` 1, plain and with every prompt token's
log-probability (``echo`` and ``logprobs: 1``, lm-evaluation-harness's loglikelihood request).
Each figure is the median of three runs, the variants taken in a rotating order.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "examples"), str(ROOT / "benchmark")]

from bench_structured import model_path  # noqa: E402  (--model, --shape or the real model)

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402

PROMPT_LEN = 32
DECODES: Dict[str, dict] = {
    "plain": {},
    "logprobs 5": {"logprobs": 5},
    "penalties": {"presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1},
    "logit_bias": {"logit_bias": {token: -100.0 for token in range(100, 110)}},
}
PREFILLS: Dict[str, dict] = {"prefill": {}, "prefill + prompt logprobs": {"prompt_logprobs": 1}}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", help="a checkpoint (default: the real small model)")
    which.add_argument("--shape", help="random weights of this shape, with a tokenizer")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--steps", type=int, default=16, help="tokens a row (at least 2)")
    p.add_argument("--device", default="auto")
    return p.parse_args()


class Prompts:
    """Fresh token-id prompts for every run, so that no run is served from the prefix cache."""

    def __init__(self, vocab_size: int) -> None:
        self.span = min(vocab_size, 10010) - 10  # ids 10 .. 10009: ordinary tokens
        self.runs = 0

    def next(self, batch: int) -> List[List[int]]:
        self.runs += 1
        offset = 9973 * self.runs
        return [
            [(7 * i + j + offset) % self.span + 10 for j in range(PROMPT_LEN)] for i in range(batch)
        ]


def run_ms(llm: LLM, prompts: List[List[int]], steps: int, extra: dict) -> float:
    """One generate of the prompts for ``steps`` tokens each: its wall time (ms)."""
    params = [
        SamplingParams(max_tokens=steps, ignore_eos=True, temperature=1.0, seed=i, **extra)
        for i in range(len(prompts))
    ]
    start = time.perf_counter()
    llm.generate(prompts, params)
    return (time.perf_counter() - start) * 1e3


def decode_ms(llm: LLM, prompts: Prompts, batch: int, steps: int, extra: dict) -> float:
    """A decode step: a run of ``steps`` tokens less a run of one, over ``steps`` - 1."""
    one = run_ms(llm, prompts.next(batch), 1, extra)
    return (run_ms(llm, prompts.next(batch), steps, extra) - one) / (steps - 1)


def compare(
    llm: LLM, prompts: Prompts, batch: int, steps: int, variants: Dict[str, dict]
) -> Dict[str, float]:
    """Every variant three times, the order rotated each round: the median of each (a decode
    step's ms, or with ``steps`` 1 a prefill's)."""
    names, times = list(variants), {name: [] for name in variants}
    for round_ in range(3):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            if steps == 1:
                times[name].append(run_ms(llm, prompts.next(batch), 1, variants[name]))
            else:
                times[name].append(decode_ms(llm, prompts, batch, steps, variants[name]))
    return {name: statistics.median(t) for name, t in times.items()}


def table(title: str, results: Dict[int, Dict[str, float]], base: str) -> None:
    names = list(next(iter(results.values())))
    print(f"\n{title} (ms; medians of 3; + % against {base})")
    print(f"{'batch':>5} " + " ".join(f"{name:>26}" for name in names))
    for batch, r in results.items():
        cells = [
            f"{r[name]:9.2f}" + (f" ({r[name] / r[base] - 1:+6.1%})" if name != base else "")
            for name in names
        ]
        print(f"{batch:>5} " + " ".join(f"{cell:>26}" for cell in cells))


def main() -> None:
    args = parse_args()
    batches: List[int] = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path = model_path(args, tmp)
        llm = LLM(path, device=args.device, max_running_req=max(batches))
        engine = llm.scheduler.engine
        prompts = Prompts(engine.model_config.vocab_size)
        for extra in [*DECODES.values(), *PREFILLS.values()]:  # warm every path once
            run_ms(llm, prompts.next(2), 2, extra)
        where = torch.cuda.get_device_name() if engine.device.type == "cuda" else "CPU"
        print(
            f"{Path(path).name} on {where}, torch {torch.__version__}, {torch.get_num_threads()}"
            f" threads; {PROMPT_LEN}-token prompts, {args.steps} tokens a row"
        )
        decode = {b: compare(llm, prompts, b, args.steps, DECODES) for b in batches}
        table("A decode step", decode, "plain")
        prefill = {b: compare(llm, prompts, b, 1, PREFILLS) for b in batches}
        table("A prefill of the batch, max_tokens 1", prefill, "prefill")
        llm.shutdown()


if __name__ == "__main__":
    main()
