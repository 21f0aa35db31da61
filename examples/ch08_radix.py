"""Chapter 8: the radix prefix cache.

Finished requests leave their tokens' K and V in a radix tree, so a later request that starts the
same way skips that part of its prefill. A match that ends inside an edge splits it; requests
lock the paths they use; when pages run short, unlocked leaves go, least recently used first.
"""

from __future__ import annotations

import os
import tempfile

import tiny_models
import torch
from transformers import AutoTokenizer
from transformers.utils import logging

from minisgl.core import SamplingParams
from minisgl.kvcache.radix_cache import RadixPrefixCache
from minisgl.scheduler import Scheduler, SchedulerConfig

torch.set_num_threads(1)
logging.set_verbosity_error()

SYSTEM = "A language model reads a sequence of tokens and predicts the next one. "
QUESTIONS = ["Hello world", "The quick brown fox", "Once upon a time", "The weather today is"]

with tempfile.TemporaryDirectory() as tmp:
    path = str(tiny_models.make_tiny_model("llama3", f"{tmp}/llama3"))
    tok = AutoTokenizer.from_pretrained(path)

    def show(ids: list[int]) -> str:
        return repr(tok.decode(ids))

    cache = RadixPrefixCache(page_size=1)
    next_slot = 0

    def insert(text: str):
        global next_slot
        ids = tok.encode(text)
        slots = torch.arange(next_slot, next_slot + len(ids), dtype=torch.int32)
        next_slot += len(ids)
        result = cache.insert_prefix(ids, slots)
        print(f"insert {text!r}: {len(ids)} tokens, {result.cached_len} of them cached already")
        return result.handle

    fox = insert("The quick brown fox jumps over the lazy dog.")
    print(cache.format_tree(show))
    cat = tok.encode("The quick brown cat sleeps.")
    hit = cache.match_prefix(cat)
    print(
        f"\nmatch 'The quick brown cat sleeps.': {hit.cached_len} of {len(cat)} tokens hit, "
        f"slots {hit.get_matched_indices().tolist()}; the edge is split where the match ends:"
    )
    print(cache.format_tree(show))
    insert("The quick brown cat sleeps.")
    insert("Once upon a time")
    print(cache.format_tree(show))

    cache.lock_handle(fox)  # a request is using the fox sentence
    print(
        f"\nlock the fox path: evictable {cache.size_info.evictable_size} tokens, "
        f"protected {cache.size_info.protected_size}"
    )
    print(cache.format_tree(show))
    for _ in range(2):
        evicted = cache.evict(1)
        print(f"evict(1) takes the least recently used unlocked leaf: slots {evicted.tolist()}")
    print(cache.format_tree(show))
    cache.lock_handle(fox, unlock=True)  # the request is done with it
    print(f"\nunlock the fox path: evictable {cache.size_info.evictable_size} tokens")
    evicted = cache.evict(1)
    print(f"evict(1) takes the leaf: slots {evicted.tolist()}; its parent is now a leaf")
    print(cache.format_tree(show))
    evicted = cache.evict(1)
    print(f"evict(1) takes the parent: slots {evicted.tolist()}")
    print(cache.format_tree(show))
    cache.check_integrity()

    prompts = [tok.encode(SYSTEM + q) for q in QUESTIONS]
    shared = min(len(os.path.commonprefix([prompts[0], ids])) for ids in prompts[1:])
    print(
        f"\nfour requests start with one system prompt ({len(tok.encode(SYSTEM))} tokens alone; "
        f"{shared} tokens common to all four), one after another:"
    )
    outputs = {}
    for kind in ("naive", "radix"):
        scheduler = Scheduler(
            SchedulerConfig(
                path, device="cpu", page_size=4, num_pages=64, max_running_req=4, cache_type=kind
            )
        )
        computed, outputs[kind] = [], []
        for ids in prompts:
            req = scheduler.add_req(ids, SamplingParams(max_tokens=6, ignore_eos=True))
            out = scheduler.step()  # the prefill
            assert out is not None
            computed.append(out.extend_lens[0])
            scheduler.run_until_idle()
            outputs[kind].append(req.output_ids)
        hits = [len(ids) - n for ids, n in zip(prompts, computed)]
        print(
            f"  {kind}: prompt tokens {[len(p) for p in prompts]}, hit {hits}, "
            f"computed {computed} ({sum(computed)} in all)"
        )
        scheduler.cache_manager.check_integrity()
    print("the same tokens with and without the radix cache:", outputs["naive"] == outputs["radix"])
    for ids in outputs["radix"]:
        print(f"  {ids} {tok.decode(ids)!r}")
