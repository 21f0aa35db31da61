"""What tensor parallelism costs on a CPU over gloo at the tiny Llama 3's shape: a decode step at
one rank and at two, and one step's collectives alone.

    PYTHONPATH=python python benchmark/bench_tp_cpu.py [--batch 16] [--tokens 33] [--rounds 3]

Step: ``LLM(tiny llama3, tp_size=N)`` (one process per rank, gloo between them, one torch thread
a rank) generates ``--tokens`` greedy tokens for each of ``--batch`` prompts; a decode step is
(time of that run - time of a 1-token run) / (tokens - 1). N = 1 and N = 2 take turns,
``--rounds`` times. Collectives: two ranks joined by chapter 19's ``init_distributed`` time what
one decode step of that model exchanges: 5 all-reduces of [batch, 64] (the embedding's, then two
a layer in its 2 layers), one all-gather of [batch, 225] (the LM head's half of the 450-token
vocabulary) and the broadcast of the step's message list (empty), ``--steps`` steps a round, by
rank 0's clock. It prints every round and the medians. Run it in a chapter's tree from 19 on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import List

os.environ["OMP_NUM_THREADS"] = "1"  # one thread a rank: read by every process torch starts
import torch  # noqa: E402
import torch.multiprocessing as tmp  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "examples")]

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.distributed import (  # noqa: E402
    DistributedCommunicator,
    broadcast_objects,
    destroy_distributed,
    init_distributed,
)
from minisgl.llm import LLM  # noqa: E402

HIDDEN, VOCAB_PER_RANK, ALL_REDUCES = 64, 225, 5  # the tiny Llama 3 at two ranks


def step_ms(path: str, tp_size: int, batch: int, tokens: int) -> float:
    """One decode step's milliseconds at ``tp_size`` ranks: a run of ``tokens`` less a run of 1."""
    llm = LLM(path, device="cpu", page_size=4, tp_size=tp_size)
    prompts = [[(7 * i + j) % 400 + 10 for j in range(24)] for i in range(batch)]

    def run(n: int) -> float:
        start = time.perf_counter()
        llm.generate(prompts, SamplingParams(max_tokens=n, ignore_eos=True))
        return time.perf_counter() - start

    try:
        run(2)  # warm-up
        one, many = run(1), run(tokens)
    finally:
        llm.shutdown()
    return 1000 * (many - one) / (tokens - 1)


def _collectives(rank: int, addr: str, batch: int, steps: int, out: "tmp.SimpleQueue") -> None:
    torch.set_num_threads(1)
    init_distributed(rank, 2, addr, "cpu")
    comm = DistributedCommunicator()
    try:
        x, logits = torch.randn(batch, HIDDEN), torch.randn(batch, VOCAB_PER_RANK)
        for _ in range(20):  # warm-up
            comm.all_reduce(x)
        start = time.perf_counter()
        for _ in range(steps):
            broadcast_objects([] if rank == 0 else None)
            for _ in range(ALL_REDUCES):
                comm.all_reduce(x)
            comm.all_gather(logits)
        if rank == 0:
            out.put(1000 * (time.perf_counter() - start) / steps)
    finally:
        destroy_distributed()


def collectives_ms(batch: int, steps: int) -> float:
    """One decode step's collectives between two gloo ranks, in ms (rank 0's clock)."""
    ctx = tmp.get_context("spawn")
    out = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as d:
        addr = f"file://{d}/meet"
        procs = [
            ctx.Process(target=_collectives, args=(r, addr, batch, steps, out)) for r in range(2)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        return out.get()


def main() -> None:
    import tiny_models

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--tokens", type=int, default=33)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=200, help="decode steps' collectives a round")
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"{os.cpu_count()} CPUs; load average before: {os.getloadavg()[0]:.2f}", flush=True)
    runs: dict[str, List[float]] = {"tp 1": [], "tp 2": [], "collectives": []}
    with tempfile.TemporaryDirectory() as d:
        path = str(tiny_models.make_tiny_model("llama3", d))
        for r in range(args.rounds):
            runs["tp 1"].append(step_ms(path, 1, args.batch, args.tokens))
            runs["tp 2"].append(step_ms(path, 2, args.batch, args.tokens))
            runs["collectives"].append(collectives_ms(args.batch, args.steps))
            line = ", ".join(f"{k} {v[-1]:.2f} ms" for k, v in runs.items())
            print(f"round {r + 1}: {line} (load {os.getloadavg()[0]:.2f})", flush=True)
    print(f"\nbatch {args.batch}, a decode step, medians of {args.rounds} rounds:")
    for name, values in runs.items():
        spread = (max(values) - min(values)) / statistics.median(values)
        print(f"  {name:12s} {statistics.median(values):7.2f} ms  (spread {100 * spread:.0f}%)")


if __name__ == "__main__":
    main()
