"""Chapter 7: the scheduler. Continuous batching gives every request the tokens transformers
gives it alone, whatever arrives when; requests that do not fit wait and finish; max_tokens and
EOS stop a request; every page and row comes back; bad requests are refused by name."""

from __future__ import annotations

import pytest
from helpers import DENSE, assert_pages_all_back, encode, hf_greedy

from minisgl import kvcache
from minisgl.core import Req, SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.utils import pages_to_finish

PROMPTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time",
    "1 2 3 4 5",
    "def add(a, b): return a + b",
    "The weather today is sunny",
]
# The prefix caches this tree has: chapter 8 adds the radix cache, which these tests must hold too.
CACHES = ["naive"] + (["radix"] if hasattr(kvcache, "RadixPrefixCache") else [])


def make(path, **options) -> Scheduler:
    options = {
        "device": "cpu",
        "page_size": 4,
        "num_pages": 64,
        "max_running_req": 4,
        "cache_type": "naive",
        **options,
    }
    return Scheduler(SchedulerConfig(str(path), **options))


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


@pytest.mark.parametrize(
    "family, cache_type", [(f, "naive") for f in DENSE] + [("qwen3", c) for c in CACHES[1:]]
)  # the radix cache on one
def test_more_requests_than_rows_equal_transformers(tiny_models, family, cache_type):
    path = tiny_models[family]
    s = make(path, max_running_req=2, cache_type=cache_type)
    reqs = [s.add_req(encode(path, p), greedy(8)) for p in PROMPTS]
    s.run_until_idle()
    assert [r.output_ids for r in reqs] == hf_greedy(path, PROMPTS, 8)
    assert_pages_all_back(s)


@pytest.mark.parametrize("cache_type", CACHES)
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_requests_arriving_mid_run(tiny_models, page_size, cache_type):
    path = tiny_models["qwen3"]
    s = make(path, page_size=page_size, num_pages=512 // page_size, cache_type=cache_type)
    lengths = [9, 3, 7, 5, 11, 4]
    reqs, joined_running = [], 0
    for step in range(40):
        if step % 3 == 0 and len(reqs) < len(PROMPTS):  # a new request every third step
            i = len(reqs)
            reqs.append(s.add_req(encode(path, PROMPTS[i]), greedy(lengths[i])))
        decoding = len(s.decode_manager.running_reqs)
        out = s.step()
        joined_running += bool(out and out.phase == "prefill" and decoding)
    assert s.idle and joined_running >= 3  # admitted while others were decoding
    for req, prompt, n in zip(reqs, PROMPTS, lengths):
        assert req.output_ids == hf_greedy(path, [prompt], n)[0]
    assert_pages_all_back(s)


@pytest.mark.parametrize("cache_type", CACHES)
def test_a_pool_too_small_for_all_at_once(tiny_models, cache_type):
    path = tiny_models["llama3"]
    s = make(
        path,
        page_size=4,
        num_pages=10,
        max_running_req=8,  # 40 token slots
        cache_type=cache_type,
    )
    reqs = [s.add_req(encode(path, p), greedy(12)) for p in PROMPTS]
    most_running, waited = 0, False
    while s.step() is not None:
        most_running = max(most_running, len(s.decode_manager.running_reqs))
        waited |= bool(s.waiting) and s.table_manager.available_size > 0  # for pages, not rows
    assert most_running < len(PROMPTS) and waited
    assert [r.output_ids for r in reqs] == hf_greedy(path, PROMPTS, 12)
    assert_pages_all_back(s)


@pytest.mark.parametrize("cache_type", CACHES)
def test_max_tokens_and_eos_stop_a_request(tiny_models, cache_type):
    path = tiny_models["mistral"]
    ref = hf_greedy(path, PROMPTS[:2], 10)
    s = make(path, cache_type=cache_type)
    s.eos_token_ids = (ref[0][4],)  # pretend the 5th token of request 0 is the end of sequence
    stop = s.add_req(encode(path, PROMPTS[0]), SamplingParams(max_tokens=10))
    ignore = s.add_req(encode(path, PROMPTS[0]), greedy(10))
    short = s.add_req(encode(path, PROMPTS[1]), greedy(3))
    finished = s.run_until_idle()
    first_eos = ref[0].index(ref[0][4])
    assert stop.output_ids == ref[0][: first_eos + 1]  # stops right after producing it
    assert ignore.output_ids == ref[0] and short.output_ids == ref[1][:3]
    assert list(finished).index(short) < list(finished).index(ignore)
    assert (finished[stop], finished[ignore], finished[short]) == ("eos", "length", "length")
    assert_pages_all_back(s)


def test_max_tokens_cut_to_the_context(tiny_models):
    path = tiny_models["qwen2"]
    s = make(path, max_seq_len=24)
    prompt = encode(path, " ".join(PROMPTS))[:20]
    req = s.add_req(prompt, greedy(50))
    s.run_until_idle()
    assert len(req.output_ids) == 4 and req.output_ids == hf_greedy(path, [prompt], 4)[0]
    assert_pages_all_back(s)


@pytest.mark.parametrize("cache_type", CACHES)
def test_bad_requests_are_refused_and_the_others_still_finish(tiny_models, cache_type):
    path = tiny_models["llama3"]
    s = make(path, max_seq_len=64, cache_type=cache_type)
    good = [s.add_req(encode(path, p), greedy(6)) for p in PROMPTS[:3]]
    s.step()
    s.step()
    zero, hot = SamplingParams(), SamplingParams()
    zero.max_tokens, hot.temperature = 0, -0.5  # changed after construction, past its checks
    bad = [
        ([], greedy(3), "prompt"),
        (list(range(64)), greedy(3), "max_seq_len"),
        ([1, 2], zero, "max_tokens"),
        ([1, 2], hot, "temperature"),
        ([1, 100000], greedy(3), "input_ids"),
    ]
    for ids, params, field in bad:
        with pytest.raises(ValueError, match=field):
            s.add_req(ids, params)
    late = s.add_req(encode(path, PROMPTS[3]), greedy(6))
    s.run_until_idle()
    assert [r.output_ids for r in good + [late]] == hf_greedy(path, PROMPTS[:4], 6)
    assert_pages_all_back(s)


def test_pages_to_finish_at_page_boundaries():
    """The pages a request may still take: those of positions [0, max_len - 1) (its last token
    is sampled, never run), less those of [0, cached_len) it holds, counted one by one."""
    for page_size in (1, 2, 4):
        for prompt_len in range(1, 10):
            for max_tokens in range(1, 10):
                req = Req(0, [7] * prompt_len, SamplingParams(max_tokens=max_tokens))
                for req.cached_len in range(req.max_len):
                    needed = {p // page_size for p in range(req.max_len - 1)}
                    held = {p // page_size for p in range(req.cached_len)}
                    assert pages_to_finish(req, page_size) == len(needed - held), (
                        page_size,
                        prompt_len,
                        max_tokens,
                        req.cached_len,
                    )


@pytest.mark.parametrize("cache_type", CACHES)
@pytest.mark.parametrize("prompt_len, max_tokens", [(6, 7), (5, 5)])  # 12, 9 positions: 3 pages
@pytest.mark.parametrize("spare", [0, -1])
def test_two_requests_that_exactly_fill_the_pool_start_together(
    tiny_models, cache_type, prompt_len, max_tokens, spare
):
    """Each may take 3 pages of 4: a pool of 6 admits both at once, one of 5 only the first
    (the second waits for its pages and still finishes)."""
    path = tiny_models["llama3"]
    prompts = [list(range(20, 20 + prompt_len)), list(range(60, 60 + prompt_len))]
    s = make(path, num_pages=6 + spare, cache_type=cache_type)
    reqs = [s.add_req(p, greedy(max_tokens)) for p in prompts]
    out = s.step()
    assert out is not None and out.uids == [r.uid for r in reqs[: 2 + spare]]
    s.run_until_idle()
    assert [r.output_ids for r in reqs] == hf_greedy(path, prompts, max_tokens)
    assert_pages_all_back(s)


def _run_alone(cache, req, row: int) -> list:
    """A request's pages, taken for its whole prompt and given back when it finishes: the
    cache manager's side of one request's life, with no model."""
    req.table_idx, req.cache_handle = row, cache.match_req(req)
    cache.lock(req.cache_handle)
    cache.allocate([req])
    req.complete_forward()
    pages = cache.page_table[row, : req.cached_len : cache.page_size] // cache.page_size
    return pages.tolist()


def _cache_manager(num_pages: int, page_size: int, rows: int = 4):
    import torch

    from minisgl.kvcache import create_prefix_cache
    from minisgl.scheduler.cache import CacheManager

    table = torch.zeros(rows, 64, dtype=torch.int32)
    return CacheManager(num_pages, page_size, table, create_prefix_cache("naive", page_size))


@pytest.mark.parametrize("num_pages", [7, 10**8])
def test_free_pages_come_back_in_order_however_big_the_pool(num_pages):
    """Pages leave the free queue at its head and come back at its tail (first in, first out),
    around the ring again and again; at 10^8 pages as at 7, none lost, none given twice."""
    from collections import deque

    cache = _cache_manager(num_pages, page_size=4)
    model = deque(range(min(num_pages, 40)))  # the literal queue (its first 40 pages suffice)
    lengths = [9, 4, 1, 12, 5, 8, 3, 16, 2, 7, 11, 6]  # tokens: 3, 1, 1, 3, 2, 2, 1, 4, ... pages
    live = []
    for i, n in enumerate(lengths):
        req = Req(i, list(range(n)), SamplingParams(max_tokens=1))
        pages = _run_alone(cache, req, row=i % 4)
        assert pages == [model.popleft() for _ in range(len(pages))]
        live.append((req, pages))
        if len(live) == 2:  # the older one finishes; its pages go to the tail of the queue
            done, done_pages = live.pop(0)
            cache.cache_req(done, finished=True)
            model.extend(done_pages)
    for req, pages in live:
        cache.cache_req(req, finished=True)
    assert cache.num_free_pages == num_pages
    cache.check_integrity(exhaustive=num_pages < 1000)


def test_a_pool_runs_dry_with_a_clear_error():
    cache = _cache_manager(num_pages=3, page_size=2)
    _run_alone(cache, Req(0, list(range(5)), SamplingParams(max_tokens=1)), row=0)
    with pytest.raises(RuntimeError, match="out of KV pages: 2 needed, 0 free and 0 evictable"):
        _run_alone(cache, Req(1, list(range(3)), SamplingParams(max_tokens=1)), row=1)


# ---- values read from the model's files ------------------------------------------------------


def _model_with_eos(src, dst, config_eos, generation_eos):
    """A copy of a tiny model whose config.json names ``config_eos`` and whose
    generation_config.json names ``generation_eos`` (None: the copy has no such file)."""
    import json
    import shutil

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "eos_token_id": config_eos}))
    generation = dst / "generation_config.json"
    if generation_eos is None:
        generation.unlink()
    else:
        values = json.loads(generation.read_text())
        generation.write_text(json.dumps({**values, "eos_token_id": generation_eos}))
    return dst


def _hf_generate_to_eos(path, prompts, n: int) -> list:
    """transformers' greedy generate, one prompt at a time, with the EOS ids it reads itself."""
    import torch
    from helpers import hf_model

    out = []
    for prompt in prompts:
        ids = torch.tensor([encode(path, prompt)])
        new = hf_model(path).generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
        )
        out.append(new[0, ids.shape[1] :].tolist())
    return out


@pytest.mark.parametrize("where", ["generation_config.json", "config.json"])
def test_requests_stop_at_each_eos_id_the_model_files_name(tiny_models, tmp_path, where):
    """Llama 3 Instruct names three EOS ids, Qwen3 two: a request stops at any of them, and
    generation_config.json's ids win over config.json's, as in transformers' generate."""
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[4]]
    ref = hf_greedy(tiny_models["llama3"], prompts, 10)
    stops = [4, 5, 6]  # request i is to end with its stops[i]-th token
    eos = [r[n - 1] for r, n in zip(ref, stops)]
    assert not any(e in r[: n - 1] for r, n in zip(ref, stops) for e in eos)  # none earlier
    overridden = ref[0][1]  # config.json's id, which would stop request 0 after 2 tokens
    assert overridden not in eos
    if where == "generation_config.json":
        path = _model_with_eos(tiny_models["llama3"], tmp_path / "m", overridden, eos)
    else:  # no generation_config.json: config.json's list
        path = _model_with_eos(tiny_models["llama3"], tmp_path / "m", eos, None)
    s = make(path)
    reqs = [s.add_req(encode(path, p), SamplingParams(max_tokens=10)) for p in prompts]
    ignoring = s.add_req(encode(path, prompts[0]), greedy(10))
    s.run_until_idle()
    expected = [r[:n] for r, n in zip(ref, stops)]
    assert [r.output_ids for r in reqs] == expected
    assert expected == _hf_generate_to_eos(path, prompts, 10)  # transformers agrees
    assert ignoring.output_ids == ref[0]  # ignore_eos: past every one of them
    assert_pages_all_back(s)


def test_token_ids_outside_the_vocabulary_are_refused(tiny_models):
    path = tiny_models["qwen3"]
    s = make(path)
    vocab_size = s.engine.model_config.vocab_size
    bad = [
        ([5, vocab_size], r"input_ids\[1\] is 450"),
        ([-1, 5], r"input_ids\[0\] is -1"),
        ([5, True], r"input_ids\[1\] is True"),
        ([5, 7.0], r"input_ids\[1\] is 7.0"),
    ]
    for ids, message in bad:
        with pytest.raises(ValueError, match=message):
            s.add_req(ids, greedy(2))
    assert s.idle  # nothing queued
    edge = s.add_req([0, vocab_size - 1], greedy(3))  # the first and the last id are fine
    s.run_until_idle()
    assert edge.output_ids == hf_greedy(path, [[0, vocab_size - 1]], 3)[0]
    assert_pages_all_back(s)


def test_the_naive_cache_matches_keeps_and_evicts_nothing():
    """Chapter 7's prefix cache: no hit, nothing kept (so the caller frees every slot), nothing
    locked or evictable; ``evict(0)`` is a no-op and anything more an error."""
    import torch

    from minisgl.kvcache.naive_cache import NaivePrefixCache

    cache = NaivePrefixCache(page_size=4)
    hit = cache.match_prefix([1, 2, 3, 4, 5])
    assert hit.cached_len == 0 and hit.get_matched_indices().shape == (0,)
    kept = cache.insert_prefix([1, 2, 3, 4], torch.arange(4, dtype=torch.int32))
    assert kept.cached_len == 0 and kept.handle.cached_len == 0
    assert kept.handle.get_matched_indices().shape == (0,)
    cache.lock_handle(hit)
    cache.lock_handle(hit, unlock=True)
    assert cache.size_info == (0, 0)
    nothing = cache.evict(0)
    assert nothing.shape == (0,) and nothing.dtype == torch.int32
    with pytest.raises(RuntimeError, match="cannot evict 1 tokens"):
        cache.evict(1)
    cache.check_integrity()


def test_a_row_lists_every_slot_of_its_pages_in_order():
    """Token j of a request sits in slot ``page * page_size + j % page_size`` of its page: the
    row holds every slot of each page it was given, in order, none outside the pool."""
    cache = _cache_manager(num_pages=6, page_size=4)
    req = Req(0, list(range(10)), SamplingParams(max_tokens=1))
    pages = _run_alone(cache, req, row=1)
    assert len(pages) == 3
    assert cache.page_table[1, :12].tolist() == [p * 4 + i for p in pages for i in range(4)]


def test_the_idle_check_counts_and_the_exhaustive_one_finds_a_page_free_twice():
    """The check the scheduler runs whenever it falls idle only counts pages (its cost does not
    grow with the pool); ``exhaustive=True`` also finds a page that is free twice."""
    cache = _cache_manager(num_pages=4, page_size=2)
    req = Req(0, [1, 2, 3], SamplingParams(max_tokens=1))
    _run_alone(cache, req, row=0)
    cache.page_table[0, 2:4] = cache.page_table[0, 0:2]  # its second page now names its first
    cache.cache_req(req, finished=True)  # so its first page is freed twice, its second never
    assert cache.num_free_pages == 4
    cache.check_integrity()  # the counts add up
    with pytest.raises(RuntimeError, match="a page is free twice"):
        cache.check_integrity(exhaustive=True)


def test_scheduler_options_are_checked_with_the_engine_ones():
    """SchedulerConfig checks its own option and, through EngineConfig, the engine's (no model
    is loaded to check them)."""
    SchedulerConfig("any", max_extend_tokens=1)  # one token a forward is a budget
    with pytest.raises(ValueError, match="max_extend_tokens must be >= 1, got 0"):
        SchedulerConfig("any", max_extend_tokens=0)
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        SchedulerConfig("any", page_size=0)


def test_one_queued_request_keeps_the_scheduler_busy(tiny_models):
    s = make(tiny_models["qwen2"])
    assert s.idle
    req = s.add_req([1, 2, 3], greedy(2))
    assert not s.idle and s.waiting == [req]
    assert list(s.run_until_idle()) == [req] and s.idle
    assert_pages_all_back(s)


@pytest.mark.parametrize("rows", [1, 3])
def test_every_row_is_used(tiny_models, rows):
    """With pages to spare, the first step admits a request into every row, the last one too."""
    s = make(tiny_models["qwen2"], max_running_req=rows)
    reqs = [s.add_req([1, 2, 3 + i], greedy(2)) for i in range(rows + 1)]
    out = s.step()
    assert out is not None and out.uids == [r.uid for r in reqs[:rows]]
    assert s.table_manager.available_size == 0 and s.waiting == reqs[rows:]
    s.run_until_idle()
    assert all(len(r.output_ids) == 2 for r in reqs)
    assert_pages_all_back(s)


@pytest.mark.parametrize("cache_type", CACHES)
def test_a_request_refused_for_pages_holds_nothing_while_it_waits(tiny_models, cache_type):
    """Admission that fails for pages leaves the request as it came: no row and no cached
    tokens (the radix cache's matched prefix was counted, then given back)."""
    path = tiny_models["qwen2"]
    s = make(path, num_pages=10, cache_type=cache_type)
    shared = list(range(50, 58))  # two pages, which the radix cache keeps
    s.add_req(shared, greedy(1))
    s.run_until_idle()
    big = s.add_req(list(range(200, 216)), greedy(9))  # 24 positions: 6 of the 10 pages
    late = s.add_req(shared + [60, 61, 62, 63], greedy(6))  # does not fit beside it
    s.step()
    assert big.table_idx >= 0 and late.table_idx < 0 and late.cached_len == 0
    s.run_until_idle()
    assert late.output_ids == hf_greedy(path, [late.input_ids], 6)[0]
    assert_pages_all_back(s)


def test_requests_are_numbered_in_order_of_arrival(tiny_models):
    s = make(tiny_models["qwen2"])
    assert [s.add_req([1, 2, 3], greedy(1)).uid for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError):
        s.add_req([], greedy(1))  # refused: it takes no number
    assert s.add_req([4], greedy(1)).uid == 3
    s.run_until_idle()


def test_falling_idle_checks_that_every_page_came_back(tiny_models):
    s = make(tiny_models["qwen2"])  # 64 pages of 4 tokens
    stray = Req(-1, [1, 2, 3], SamplingParams(max_tokens=1), table_idx=0)
    s.cache_manager.allocate([stray])  # a page taken outside any request the scheduler runs
    with pytest.raises(RuntimeError, match="pages lost: 63 free"):
        s.run_until_idle()


def test_a_model_that_names_no_eos_runs_to_max_tokens(tiny_models, tmp_path):
    path = _model_with_eos(tiny_models["qwen2"], tmp_path / "m", None, None)
    s = make(path)
    assert s.eos_token_ids == ()  # no id at all, as a tuple like several
    req = s.add_req([1, 2, 3], SamplingParams(max_tokens=5))
    s.run_until_idle()
    assert len(req.output_ids) == 5


def test_check_request_names_the_longest_prompt_and_rechecks_the_params():
    from minisgl.scheduler.utils import check_request

    with pytest.raises(ValueError, match="so a prompt has at most 7$"):
        check_request(list(range(8)), SamplingParams(), max_seq_len=8, vocab_size=450)
    params = SamplingParams()
    params.temperature = -1.0  # changed after it was made (and checked)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        check_request([1], params, max_seq_len=8, vocab_size=450)
    assert check_request(list(range(7)), SamplingParams(max_tokens=5), 8, 450).max_tokens == 1
