"""Chapter 7: continuous batching.

The scheduler admits waiting requests when there is a row of the page table for them and pages
for everything they may still generate; each step runs a prefill of the newly admitted requests
or a decode step of all running ones. A finished request leaves at once, and its row and pages
serve the next. Requests arrive while others run; those that do not fit wait, none is dropped.
"""

from __future__ import annotations

import tempfile

import tiny_models
import torch
from transformers import AutoTokenizer
from transformers.utils import logging

from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig

torch.set_num_threads(1)
logging.set_verbosity_error()

FIRST = [
    ("Hello world", 3),
    ("The quick brown fox", 6),
    ("Once upon a time", 4),
    ("The weather today is", 5),
]
LATER = [("A language model reads", 4), ("1 2 3", 2)]  # they arrive at step 3

with tempfile.TemporaryDirectory() as tmp:
    path = str(tiny_models.make_tiny_model("llama3", f"{tmp}/llama3"))
    tok = AutoTokenizer.from_pretrained(path)
    config = SchedulerConfig(path, device="cpu", page_size=2, num_pages=12, max_running_req=3)
    scheduler = Scheduler(config)
    cache = scheduler.cache_manager
    print(
        f"{config.num_pages} pages of {config.page_size} tokens, {config.max_running_req} rows "
        "in the page table"
    )

    def add(prompt: str, max_tokens: int):
        ids = tok.encode(prompt)
        req = scheduler.add_req(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        pages = -(-(len(ids) + max_tokens - 1) // config.page_size)
        print(
            f"  request {req.uid} arrives: {len(ids)} prompt tokens + {max_tokens} new, "
            f"needs {pages} pages"
        )
        return req

    reqs = [add(p, n) for p, n in FIRST]
    print("\nstep  batch                          pages used/free  waiting  finished")
    step = 0
    while not scheduler.idle:
        if step == 3:
            reqs += [add(p, n) for p, n in LATER]
        out = scheduler.step()
        assert out is not None
        batch = " ".join(f"{u}:{n}" for u, n in zip(out.uids, out.extend_lens))
        used = config.num_pages - cache.num_free_pages
        waiting = [r.uid for r in scheduler.waiting]
        done = [r.uid for r in out.finished]
        print(
            f"{step:4d}  {out.phase:7s} {batch:22s} {used:4d} / {cache.num_free_pages:<4d}"
            f"       {str(waiting):8s} {done or ''}"
        )
        step += 1
    print("(a batch entry uid:n means request uid ran n tokens)")
    cache.check_integrity()
    print(
        f"\nall done: {cache.num_free_pages} of {config.num_pages} pages free again, "
        f"{scheduler.table_manager.available_size} rows free"
    )
    for req in reqs:
        print(f"  request {req.uid}: {req.output_ids} {tok.decode(req.output_ids)!r}")
