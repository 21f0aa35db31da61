"""Chapter 9: chunked prefill. Every chunk size, from one token up to the whole prompt, gives the
same tokens; no prefill forward takes more than the budget; chunks follow a prefix-cache hit."""

from __future__ import annotations

import os

import pytest
from helpers import encode, hf_greedy
from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig

LONG = "Once upon a time there was a small robot who lived in a library. Every night"
OTHERS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "1 2 3"]


def make(path, **options) -> Scheduler:
    options = {"device": "cpu", "page_size": 4, "num_pages": 128, "max_running_req": 4,
               **options}
    return Scheduler(SchedulerConfig(str(path), **options))


def run(s: Scheduler, prompts: list[list[int]], n: int) -> tuple[list[list[int]], list]:
    """Generate greedily; the tokens and the (phase, extend_lens) of every step."""
    reqs = [s.add_req(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p in prompts]
    steps = []
    while (out := s.step()) is not None:
        steps.append((out.phase, out.extend_lens))
    return [r.output_ids for r in reqs], steps


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_every_chunk_size_gives_the_same_tokens(tiny_models, family):
    path = tiny_models[family]
    prompt = encode(path, LONG)
    expected = hf_greedy(path, [prompt], 6)
    s = make(path, cache_type="naive")
    for budget in range(1, len(prompt) + 1):
        s.config.max_extend_tokens = budget
        tokens, steps = run(s, [prompt], 6)
        assert tokens == expected, budget
        chunks = [lens[0] for phase, lens in steps if phase == "prefill"]
        full, rest = divmod(len(prompt), budget)
        assert chunks == [budget] * full + ([rest] if rest else [])
    s.cache_manager.check_integrity()


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_no_prefill_takes_more_than_the_budget(tiny_models, page_size):
    path = tiny_models["mistral"]
    prompts = [encode(path, p) for p in [LONG] + OTHERS]
    s = make(path, page_size=page_size, num_pages=512 // page_size, max_extend_tokens=7)
    tokens, steps = run(s, prompts, 5)
    assert tokens == hf_greedy(path, prompts, 5)
    prefills = [lens for phase, lens in steps if phase == "prefill"]
    assert all(sum(lens) <= 7 for lens in prefills)
    assert sum(map(sum, prefills)) == sum(map(len, prompts))  # every prompt token, once
    s.cache_manager.check_integrity()
    assert s.cache_manager.num_free_pages + s.cache_manager.prefix_cache.size_info.total_size \
        // page_size == s.engine.num_pages


def test_chunks_after_a_prefix_hit_and_requests_arriving_meanwhile(tiny_models):
    path = tiny_models["qwen2"]
    first, second = encode(path, LONG), encode(path, LONG + " the robot read one book")
    s = make(path, page_size=2, max_extend_tokens=5)
    assert run(s, [first], 4)[0] == hf_greedy(path, [first], 4)
    reqs = [s.add_req(second, SamplingParams(max_tokens=4, ignore_eos=True))]
    out = s.step()
    assert out is not None and out.extend_lens == [5]
    common = len(os.path.commonprefix([first, second]))
    assert common >= 2  # the second prompt starts as the first did
    hit = common // 2 * 2  # the cache matches whole pages of 2 tokens
    assert reqs[0].cached_len == hit + 5  # the cached prefix, then the first chunk
    reqs.append(s.add_req(encode(path, OTHERS[1]), SamplingParams(max_tokens=4,
                                                                    ignore_eos=True)))
    s.run_until_idle()
    assert [r.output_ids for r in reqs] == hf_greedy(path, [second, encode(path, OTHERS[1])], 4)
