"""Offline throughput of minisgl on a CPU, and where a decode step's time goes.

    PYTHONPATH=python python benchmark/bench_offline_cpu.py [--requests 64] [--threads 1]

64 requests of mixed lengths (half of them share a system prompt) run through ``LLM.generate``
on a tiny random-weight model, with page sizes 1 and 16 and the radix cache on and off; it
reports output tokens per second. Then, for one run, it splits each decode step's wall time into
the model's forward and everything else (scheduling, page allocation, batch preparation,
attention metadata, sampling, bookkeeping), measured with time.perf_counter around the parts.
The figures depend on the machine; the tiny model computes so little that the overhead shows.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "python"))

import tiny_models  # noqa: E402

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402

SYSTEM = (
    "A language model reads a sequence of tokens and predicts the next one. To write a "
    "long answer it predicts one token, appends it to the sequence, and predicts again. "
)


def make_requests(n: int, seed: int = 0) -> tuple[List[str], List[SamplingParams]]:
    rng = random.Random(seed)
    words = tiny_models.TEXT.split()
    prompts, params = [], []
    for i in range(n):
        start = rng.randrange(len(words) - 40)
        body = " ".join(words[start : start + rng.randint(4, 40)])
        prompts.append(SYSTEM + body if i % 2 == 0 else body)
        params.append(SamplingParams(max_tokens=rng.randint(16, 64), ignore_eos=True))
    return prompts, params


class Timer:
    """Total seconds spent inside the wrapped callables, by name."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

        return timed

    def take(self) -> Dict[str, float]:
        out, self.seconds = self.seconds, {}
        return out


def throughput(path: str, page_size: int, cache_type: str, prompts, params, repeat: int) -> str:
    """The best of ``repeat`` runs, each on a fresh LLM (so the radix cache starts empty)."""
    best = float("inf")
    for _ in range(repeat):
        llm = LLM(
            path,
            device="cpu",
            page_size=page_size,
            num_pages=8192 // page_size,
            max_running_req=64,
            max_extend_tokens=2048,
            cache_type=cache_type,
        )
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))  # warm up
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        best = min(best, time.perf_counter() - start)
        tokens = sum(len(o["token_ids"]) for o in outputs)
        llm.shutdown()
    return (
        f"page_size {page_size:2d}  cache {cache_type:5s}  {tokens} output tokens in "
        f"{best:6.2f} s  = {tokens / best:7.1f} tokens/s"
    )


def decode_breakdown(path: str, prompts, params) -> None:
    llm = LLM(
        path, device="cpu", page_size=16, num_pages=512, max_running_req=64, max_extend_tokens=2048
    )
    s, engine, timer = llm.scheduler, llm.scheduler.engine, Timer()
    engine.model.forward = timer.wrap("model forward", engine.model.forward)
    engine.attn_backend.forward = timer.wrap("attention", engine.attn_backend.forward)
    engine.prepare_batch = timer.wrap("prepare batch + attention metadata", engine.prepare_batch)
    engine.sampler.sample = timer.wrap("sampling", engine.sampler.sample)
    s.cache_manager.allocate = timer.wrap("page allocation", s.cache_manager.allocate)
    for p, sp in zip(prompts, params):
        s.add_req(llm.tokenizer.encode(p), sp)
    steps: List[tuple[str, int, float, Dict[str, float]]] = []
    while True:
        start = time.perf_counter()
        out = s.step()
        wall = time.perf_counter() - start
        if out is None:
            break
        steps.append((out.phase, len(out.uids), wall, timer.take()))
    decode = [x for x in steps if x[0] == "decode"]
    wall = sum(x[2] for x in decode)
    parts: Dict[str, float] = {}
    for *_, t in decode:
        for k, v in t.items():
            parts[k] = parts.get(k, 0.0) + v
    n = len(decode)
    print(
        f"\n{n} decode steps, {sum(x[1] for x in decode) / n:.1f} requests a step on average;"
        f" per step (page_size 16, radix):"
    )
    print(f"  {'wall time':38s} {1e3 * wall / n:7.2f} ms")
    attention = parts.pop("attention", 0.0)  # inside the model forward: not counted twice
    for k, v in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {k:38s} {1e3 * v / n:7.2f} ms  ({100 * v / wall:4.1f} %)")
        if k == "model forward":
            print(
                f"    {'of which the attention backend':36s} {1e3 * attention / n:7.2f} ms  "
                f"({100 * attention / wall:4.1f} %)"
            )
    rest = wall - sum(parts.values())
    print(
        f"  {'other scheduler/engine bookkeeping':38s} {1e3 * rest / n:7.2f} ms  "
        f"({100 * rest / wall:4.1f} %)"
    )
    overhead = wall - parts.get("model forward", 0.0)
    print(
        f"  CPU overhead outside the model forward: {1e3 * overhead / n:.2f} ms a step, "
        f"{100 * overhead / wall:.1f} % of the step"
    )
    llm.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="runs per setting; the best")
    parser.add_argument("--family", default="llama3", choices=tiny_models.FAMILIES[:4])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    prompts, params = make_requests(args.requests)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(tiny_models.make_tiny_model(args.family, f"{tmp}/{args.family}"))
        print(f"tiny {args.family}, {args.requests} requests, {args.threads} thread(s)")
        for page_size in (1, 16):
            for cache_type in ("naive", "radix"):
                print(throughput(path, page_size, cache_type, prompts, params, args.repeat))
        decode_breakdown(path, prompts, params)


if __name__ == "__main__":
    main()
