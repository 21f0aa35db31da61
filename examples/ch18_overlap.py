"""Chapter 18: overlap scheduling.

Each step launches the next batch before it processes the last one's tokens, so on a GPU the
host's work (scheduling, appending tokens, finishing requests) hides behind the forward. On a
CPU the forward runs at once, but the order of the steps is the same, so the lag shows here:
what each step processes and what it leaves in flight, a request that ends at EOS while the
next batch already holds it, the tokens (the same with overlap on and off), and a long prompt
that runs in chunks, each launched before the one before it is processed.
"""

from __future__ import annotations

import os
import tempfile

import tiny_models
import torch

from minisgl.core import Batch, SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig

torch.set_num_threads(1)


def show(batch: Batch | None) -> str:
    return "-" if batch is None else f"{batch.phase} {[r.uid for r in batch.reqs]}"


def timeline(path: str, overlap: bool, eos: tuple) -> list:
    s = Scheduler(SchedulerConfig(path, device="cpu", overlap_scheduling=overlap))
    s.eos_token_ids = eos  # chosen so that request 0 stops at EOS after 3 tokens
    reqs = [s.add_req(p, sp) for p, sp in zip(PROMPTS, PARAMS)]
    print(f"overlap_scheduling={overlap}")
    step, before = 0, None
    while (out := s.step()) is not None:
        step += 1
        done = f"{out.phase} {out.uids}"
        dropped = [r.uid for r in before.reqs if r.uid not in out.uids] if before else []
        done += f", dropped {dropped}" if dropped else ""  # finished after it was launched
        done += f", finished {[r.uid for r in out.finished]}" if out.finished else ""
        print(f"  step {step}: processed {done:40s} in flight: {show(s.in_flight)}")
        before = s.in_flight
    cache = s.cache_manager
    cached = cache.prefix_cache.size_info.total_size // cache.page_size
    print(
        f"  idle: {cache.num_free_pages} free pages + {cached} cached = {cache.num_pages}, "
        f"{s.table_manager.available_size} of {s.config.max_running_req} rows free"
    )
    return [r.output_ids for r in reqs]


def chunked(path: str, overlap: bool) -> list:
    """Request 0 beside a 20-token prompt, at most 8 prompt tokens a forward: what each step
    processes, how much of request 1's prompt has been launched and what the host has of it."""
    config = SchedulerConfig(path, device="cpu", overlap_scheduling=overlap, max_extend_tokens=8)
    s = Scheduler(config)
    reqs = [s.add_req(p, SamplingParams(max_tokens=n)) for p, n in ((PROMPTS[0], 4), (LONG, 3))]
    print(f"overlap_scheduling={overlap}, max_extend_tokens=8")
    step = 0
    while (out := s.step()) is not None:
        step += 1
        done = f"{out.phase} {out.uids}: {'+'.join(map(str, out.extend_lens))}"
        launched = min(reqs[1].cached_len, len(LONG))  # its prompt tokens given to a forward
        print(
            f"  step {step}: processed {done:20s} in flight: {show(s.in_flight):14s} "
            f"request 1: {launched:2d}/{len(LONG)}, {reqs[1].output_ids}"
        )
    return [r.output_ids for r in reqs]


PROMPTS = [[3, 1, 4, 1, 5], [2, 7, 1, 8], [6, 6, 6, 6, 6, 6]]
LONG = list(range(10, 30))  # 20 tokens: chunks of 3 (beside request 0's 5), 8, 8 and 1
PARAMS = [
    SamplingParams(max_tokens=6),  # greedy; EOS stops it
    SamplingParams(temperature=0.8, top_k=20, max_tokens=4, seed=7),  # seeded
    SamplingParams(max_tokens=1),
]  # done at its prefill

with tempfile.TemporaryDirectory() as tmp:
    path = str(tiny_models.make_tiny_model("llama3", f"{tmp}/llama3"))
    s = Scheduler(SchedulerConfig(path, device="cpu", overlap_scheduling=False))
    first = s.add_req(PROMPTS[0], SamplingParams(max_tokens=6, ignore_eos=True))
    s.run_until_idle()
    eos = (first.output_ids[2],)
    print(f"request 0 alone, EOS ignored: {first.output_ids}; EOS is now {eos[0]}")
    print()
    outs = {overlap: timeline(path, overlap, eos) for overlap in (False, True)}
    print()
    for uid, out in enumerate(outs[True]):
        print(f"request {uid}: {out}")
    print(f"same tokens with overlap on and off: {outs[True] == outs[False]}")
    print()
    print("request 1 now a 20-token prompt: by step, the tokens each request ran, and how many")
    print("of request 1's prompt tokens were launched and which of its tokens the host has")
    long_outs = {overlap: chunked(path, overlap) for overlap in (False, True)}
    print(f"same tokens with overlap on and off: {long_outs[True] == long_outs[False]}")
    os.environ["MINISGL_DISABLE_OVERLAP_SCHEDULING"] = "1"
    s = Scheduler(SchedulerConfig(path, device="cpu", overlap_scheduling=True))
    print(f"MINISGL_DISABLE_OVERLAP_SCHEDULING=1, overlap_scheduling=True: overlap {s.overlap}")
