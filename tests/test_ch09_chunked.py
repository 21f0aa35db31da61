"""Chapter 9: chunked prefill. Every chunk size, from one token up to the whole prompt, gives the
same tokens; no prefill forward takes more than the budget; chunks follow a prefix-cache hit."""

from __future__ import annotations

import os

import pytest
from helpers import assert_pages_all_back, encode, hf_greedy

from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig

LONG = "Once upon a time there was a small robot who lived in a library. Every night"
OTHERS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "1 2 3"]


def make(path, **options) -> Scheduler:
    options = {"device": "cpu", "page_size": 4, "num_pages": 128, "max_running_req": 4, **options}
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
    assert_pages_all_back(s)


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
    assert_pages_all_back(s)


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
    reqs.append(s.add_req(encode(path, OTHERS[1]), SamplingParams(max_tokens=4, ignore_eos=True)))
    s.run_until_idle()
    assert [r.output_ids for r in reqs] == hf_greedy(path, [second, encode(path, OTHERS[1])], 4)
    assert_pages_all_back(s)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


@pytest.mark.parametrize("cache_type", ["naive", "radix"])
def test_a_budget_used_up_exactly_leaves_the_next_request_out(tiny_models, cache_type):
    """The first prompt takes the whole budget: the second is neither admitted nor put in the
    batch with a chunk of 0 tokens."""
    path = tiny_models["llama3"]
    prompts = [list(range(20, 27)), list(range(40, 45))]  # 7 and 5 tokens
    s = make(path, max_extend_tokens=7, cache_type=cache_type)
    reqs = [s.add_req(p, greedy(3)) for p in prompts]
    out = s.step()
    assert out is not None and out.uids == [reqs[0].uid] and out.extend_lens == [7]
    assert reqs[1].table_idx < 0  # no row, no pages reserved for it yet
    while (out := s.step()) is not None:
        assert all(n > 0 for n in out.extend_lens), out
    assert [r.output_ids for r in reqs] == hf_greedy(path, prompts, 3)
    assert_pages_all_back(s)


@pytest.mark.parametrize("cache_type", ["naive", "radix"])
@pytest.mark.parametrize("num_pages, admitted", [(7, True), (6, False)])
def test_a_prompt_halfway_through_its_chunks_keeps_its_pages_reserved(
    tiny_models, cache_type, num_pages, admitted
):
    """Pages of 4, a budget of 8. The long prompt (18 tokens, 3 to generate: 20 positions, 5
    pages) runs in chunks of 8, 8 and 2; before its last chunk it holds 4 pages and may still
    take 1, counted once. The short one (4 tokens and 5 to generate: 2 pages) comes in beside
    that last chunk only if 4 + 1 + 2 pages fit."""
    path = tiny_models["qwen3"]
    prompts = [list(range(100, 118)), list(range(300, 304))]
    s = make(path, num_pages=num_pages, max_extend_tokens=8, cache_type=cache_type)
    long, short = s.add_req(prompts[0], greedy(3)), s.add_req(prompts[1], greedy(5))
    steps = [s.step() for _ in range(3)]
    assert [out.uids[0] for out in steps] == [long.uid] * 3
    assert [out.extend_lens[0] for out in steps] == [8, 8, 2]
    assert steps[2].uids == ([long.uid, short.uid] if admitted else [long.uid])
    s.run_until_idle()
    assert [long.output_ids, short.output_ids] == [
        hf_greedy(path, [prompts[0]], 3)[0],
        hf_greedy(path, [prompts[1]], 5)[0],
    ]
    assert_pages_all_back(s)
