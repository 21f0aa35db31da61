"""Chapter 8: the radix prefix cache. Hit lengths, splitting an edge, locks, LRU eviction, its
integrity under random operations, and the scheduler sharing prefixes with unchanged tokens."""

from __future__ import annotations

import pytest
import torch
from helpers import encode, hf_greedy
from hypothesis import given, settings
from hypothesis import strategies as st
from minisgl.core import SamplingParams
from minisgl.kvcache.radix_cache import RadixPrefixCache
from minisgl.scheduler import Scheduler, SchedulerConfig


class Slots:
    """Fresh, never reused slot numbers for inserts."""

    def __init__(self):
        self.next = 0

    def take(self, n: int) -> torch.Tensor:
        self.next += n
        return torch.arange(self.next - n, self.next, dtype=torch.int32)


def test_hit_lengths_of_shared_prefixes():
    cache, slots = RadixPrefixCache(page_size=1), Slots()
    a = cache.insert_prefix([1, 2, 3, 4, 5, 6], slots.take(6))
    assert a.cached_len == 0 and a.handle.cached_len == 6
    assert cache.match_prefix([1, 2, 3, 9]).cached_len == 3
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7]).cached_len == 6
    assert cache.match_prefix([2, 3]).cached_len == 0
    hit = cache.match_prefix([1, 2, 3, 4, 8])
    assert hit.get_matched_indices().tolist() == [0, 1, 2, 3]
    b = cache.insert_prefix([1, 2, 3, 4, 8, 9], torch.tensor([50, 51, 52, 53, 54, 55]))
    assert b.cached_len == 4 and b.handle.get_matched_indices().tolist() == [0, 1, 2, 3, 54, 55]
    assert cache.size_info.evictable_size == 8
    cache.check_integrity()


def test_pages_are_matched_whole():
    cache, slots = RadixPrefixCache(page_size=4), Slots()
    res = cache.insert_prefix(list(range(10)), slots.take(10))  # 2 whole pages kept, 2 left
    assert res.handle.cached_len == 8 and cache.size_info.evictable_size == 8
    assert cache.match_prefix(list(range(7)) + [99]).cached_len == 4
    assert cache.match_prefix([0, 1, 2]).cached_len == 0
    cache.check_integrity()


def test_a_split_in_the_middle_of_an_edge():
    cache, slots = RadixPrefixCache(page_size=1), Slots()
    cache.insert_prefix([1, 2, 3, 4, 5, 6], slots.take(6))
    assert cache.format_tree() == "(root)\n├── [1, 2, 3, 4, 5, 6]  (6 tokens, ref 0)"
    handle = cache.match_prefix([1, 2, 3, 7])
    assert handle.cached_len == 3 and handle.node.key == [1, 2, 3]
    assert [c.key for c in handle.node.children.values()] == [[4, 5, 6]]
    cache.insert_prefix([1, 2, 3, 7, 8], slots.take(5))
    assert cache.format_tree() == "\n".join([
        "(root)", "├── [1, 2, 3]  (3 tokens, ref 0)", "│   ├── [4, 5, 6]  (3 tokens, ref 0)",
        "│   ├── [7, 8]  (2 tokens, ref 0)"])
    assert cache.match_prefix([1, 2, 3, 7, 8]).get_matched_indices().tolist() == [0, 1, 2, 9, 10]
    cache.check_integrity()


def test_locked_nodes_are_never_evicted():
    cache, slots = RadixPrefixCache(page_size=1), Slots()
    held = cache.insert_prefix([1, 2, 3, 4], slots.take(4)).handle
    cache.insert_prefix([1, 2, 9, 9], slots.take(4))
    cache.insert_prefix([5, 6], slots.take(2))
    cache.lock_handle(held)
    assert cache.size_info == (4, 4)  # [1, 2, 9, 9]'s own [9, 9] and [5, 6] are evictable
    evicted = cache.evict(4)
    assert sorted(evicted.tolist()) == [6, 7, 8, 9]
    with pytest.raises(RuntimeError):
        cache.evict(1)
    assert cache.match_prefix([1, 2, 3, 4]).cached_len == 4
    cache.lock_handle(held, unlock=True)
    assert cache.size_info == (4, 0)
    assert sorted(cache.evict(4).tolist()) == [0, 1, 2, 3]
    cache.check_integrity()


def test_eviction_takes_the_least_recently_used_leaf_first():
    cache, slots = RadixPrefixCache(page_size=1), Slots()
    for seq in ([1, 1], [2, 2], [3, 3]):
        cache.insert_prefix(seq, slots.take(2))
    cache.match_prefix([1, 1])  # used again: now the newest
    assert cache.evict(2).tolist() == [2, 3]  # [2, 2]
    assert cache.evict(2).tolist() == [4, 5]  # [3, 3]
    assert cache.evict(1).tolist() == [0, 1]  # a whole leaf goes, even for less
    # a parent left without children becomes a leaf and can go in turn
    cache.insert_prefix([7, 7, 7], slots.take(3))
    cache.insert_prefix([7, 7, 8], slots.take(3))
    assert cache.evict(3).tolist() == [8, 11, 6, 7]  # [7], then [8], then [7, 7]
    cache.check_integrity()


OPS = st.lists(st.tuples(st.sampled_from(["insert", "match", "lock", "unlock", "evict"]),
                         st.lists(st.integers(0, 3), min_size=1, max_size=9)),
               max_size=40)


@settings(max_examples=150, deadline=None, derandomize=True)  # the same examples every run
@given(ops=OPS, page_size=st.sampled_from([1, 2]))
def test_integrity_under_random_operations(ops, page_size):
    """Against a literal model: the cached prefixes, page by page, and their pages' slots."""
    cache, slots = RadixPrefixCache(page_size), Slots()
    cached: dict[tuple[int, ...], list[int]] = {}  # prefix of whole pages -> its last page's slots
    locked: list = []

    def expected_slots(ids: list[int], n: int) -> list[int]:
        return [x for end in range(page_size, n + 1, page_size) for x in cached[tuple(ids[:end])]]

    for op, ids in ops:
        whole = len(ids) // page_size * page_size
        if op == "insert":
            new = slots.take(len(ids))
            res = cache.insert_prefix(ids, new)
            for end in range(page_size, whole + 1, page_size):
                cached.setdefault(tuple(ids[:end]), new[end - page_size : end].tolist())
            assert res.handle.cached_len == whole
            assert res.handle.get_matched_indices().tolist() == expected_slots(ids, whole)
        elif op in ("match", "lock"):
            handle = cache.match_prefix(ids)
            expect = 0
            while expect < whole and tuple(ids[: expect + page_size]) in cached:
                expect += page_size
            assert handle.cached_len == expect
            assert handle.get_matched_indices().tolist() == expected_slots(ids, expect)
            if op == "lock" and expect:
                cache.lock_handle(handle)
                locked.append((handle, ids[:expect]))
        elif op == "unlock" and locked:
            cache.lock_handle(locked.pop(0)[0], unlock=True)
        elif op == "evict":
            evictable = cache.size_info.evictable_size  # ids[0] == 0: evict all it may
            size = evictable if ids[0] == 0 else min(len(ids), evictable)
            gone = set(cache.evict(size).tolist())
            assert len(gone) >= size
            for prefix in [p for p, page in cached.items() if set(page) <= gone]:
                del cached[prefix]
        cache.check_integrity()
        assert cache.size_info.total_size == len(cached) * page_size
        for handle, ids in locked:  # a locked prefix is still whole, in the same slots
            assert handle.get_matched_indices().tolist() == expected_slots(ids, len(ids))
        for prefix in cached:  # prefix-closed: eviction takes leaves first
            assert len(prefix) == page_size or prefix[:-page_size] in cached


SYSTEM = "A language model reads a sequence of tokens and predicts the next one. "
QUESTIONS = ["Hello world", "The quick brown fox", "Once upon a time", "1 2 3"]


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_scheduler_shares_prefixes_with_the_same_tokens(tiny_models, page_size):
    path = tiny_models["qwen2"]
    prompts = [SYSTEM + q for q in QUESTIONS]
    s = Scheduler(SchedulerConfig(str(path), device="cpu", page_size=page_size,
                                  num_pages=256 // page_size, max_running_req=4))
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    first = s.add_req(encode(path, prompts[0]), params)
    s.run_until_idle()
    reqs = [first] + [s.add_req(encode(path, p), params) for p in prompts[1:]]
    out = s.step()
    assert out is not None and out.phase == "prefill"
    shared = len(encode(path, SYSTEM)) - 1
    hits = [len(r.input_ids) - n for r, n in zip(reqs[1:], out.extend_lens)]
    assert all(h >= shared // page_size * page_size for h in hits), hits
    s.run_until_idle()
    assert [r.output_ids for r in reqs] == hf_greedy(path, prompts, 6)
    s.cache_manager.check_integrity()
    assert s.cache_manager.prefix_cache.size_info.protected_size == 0


def test_eviction_under_memory_pressure_keeps_tokens_right(tiny_models):
    path = tiny_models["llama3"]
    prompts = [SYSTEM + q for q in QUESTIONS] + QUESTIONS
    s = Scheduler(SchedulerConfig(str(path), device="cpu", page_size=2, num_pages=40,
                                  max_running_req=3))
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    reqs = [s.add_req(encode(path, p), params) for p in prompts]
    s.run_until_idle()
    again = [s.add_req(encode(path, p), params) for p in prompts[:2]]
    s.run_until_idle()
    ref = hf_greedy(path, prompts, 8)
    assert [r.output_ids for r in reqs] == ref and [r.output_ids for r in again] == ref[:2]
    cache = s.cache_manager
    cache.check_integrity()
    assert cache.num_free_pages + cache.prefix_cache.size_info.total_size // 2 == 40


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_same_prompt_twice_in_one_batch(tiny_models, page_size):
    """Both compute the prompt; the second to be cached finds it in the tree already, points
    its row at the tree's slots and gives its own pages back: none lost, none freed twice."""
    path = tiny_models["llama3"]
    s = Scheduler(SchedulerConfig(str(path), device="cpu", page_size=page_size,
                                  num_pages=256 // page_size, max_running_req=4))
    prompt = encode(path, SYSTEM)
    reqs = [s.add_req(prompt, SamplingParams(max_tokens=n, ignore_eos=True)) for n in (9, 5)]
    out = s.step()
    assert out is not None and out.extend_lens == [len(prompt)] * 2
    rows = [s.engine.page_table[r.table_idx, : len(prompt) // page_size * page_size].tolist()
            for r in reqs]
    assert rows[0] == rows[1]  # one copy of the prompt's pages, shared
    s.run_until_idle()
    ref = hf_greedy(path, [prompt], 9)[0]
    assert reqs[0].output_ids == ref and reqs[1].output_ids == ref[:5]
    cache = s.cache_manager
    cache.check_integrity()
    used = cache.prefix_cache.size_info.total_size // page_size
    assert cache.num_free_pages + used == cache.num_pages
