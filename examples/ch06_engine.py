"""Chapter 6: the engine runs one forward for a whole batch.

Three requests of different lengths are prefilled together in one forward (their tokens laid one
after another), then decoded together, one token each per forward. Pages are handed out here by
hand from a free list; chapter 7's scheduler does it for real.
"""

from __future__ import annotations

import tempfile

import tiny_models
import torch
from transformers import AutoTokenizer
from transformers.utils import logging

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine.config import EngineConfig
from minisgl.engine.engine import Engine

torch.set_num_threads(1)
logging.set_verbosity_error()


def give_pages(engine: Engine, free: list[int], req: Req) -> None:
    """Pages for the request's positions [cached_len, device_len), written into its row."""
    size = engine.config.page_size
    for pos in range(req.cached_len, req.device_len):
        if pos % size == 0:
            page = free.pop(0)
            engine.page_table[req.table_idx, pos : pos + size] = torch.arange(
                page * size, (page + 1) * size
            )


def generate(engine: Engine, prompts: list[list[int]], n: int, show: bool) -> list[list[int]]:
    free = list(range(engine.num_pages))
    reqs = [Req(i, p, SamplingParams(max_tokens=n), table_idx=i) for i, p in enumerate(prompts)]
    for step in range(n):
        batch = Batch(reqs, "prefill" if step == 0 else "decode")
        for req in reqs:
            give_pages(engine, free, req)
        if show and step < 2:
            lens = [r.extend_len for r in reqs]
            print(
                f"  step {step}: {batch.phase:7s} new tokens per request {lens}, "
                f"{sum(lens)} in the forward"
            )
        for req, token in zip(reqs, engine.forward_batch(batch).tolist()):
            req.append(token)
    if show:
        print(f"  ... {n} steps; pages used {engine.num_pages - len(free)}, free {len(free)}")
        for r in reqs:
            pages = engine.page_table[r.table_idx, : r.cached_len : engine.config.page_size]
            print(f"  request {r.uid}: pages {(pages // engine.config.page_size).tolist()}")
    return [r.output_ids for r in reqs]


with tempfile.TemporaryDirectory() as tmp:
    path = str(tiny_models.make_tiny_model("qwen3", f"{tmp}/qwen3"))
    tok = AutoTokenizer.from_pretrained(path)
    engine = Engine(EngineConfig(path, device="cpu", page_size=4, num_pages=24, max_running_req=4))
    print(
        f"engine: {engine.num_pages} pages of {engine.config.page_size} tokens "
        f"(+1 dummy page), page table {list(engine.page_table.shape)}, "
        f"max_seq_len {engine.max_seq_len}"
    )
    print(
        f"the dummy request's row points at slot {engine.page_table[4, 0].item()} "
        f"(page {engine.num_pages}) everywhere"
    )
    prompts = [
        tok.encode(p)
        for p in (
            "Hello world",
            "The quick brown fox jumps over",
            "Once upon a time there was a small robot who",
        )
    ]
    print(f"\nthree prompts of {[len(p) for p in prompts]} tokens, 8 new tokens each:")
    together = generate(engine, prompts, 8, show=True)
    alone = [generate(engine, [p], 8, show=False)[0] for p in prompts]
    for ids, solo in zip(together, alone):
        print(f"  {ids} {tok.decode(ids)!r}")
    print("each request gets exactly the tokens it gets alone:", together == alone)

    budget = Engine(EngineConfig(path, device="cpu", page_size=16, cpu_kv_bytes=1 << 20))
    print(
        f"\na 1 MiB KV budget at {budget.bytes_per_page()} bytes a page of 16 tokens: "
        f"{budget.num_pages} pages"
    )
