"""Chapter 18: overlap scheduling. Tokens (greedy and seeded) and the prefix cache's contents are
the same with overlap on and off, through chunked prefill, radix hits, EOS in the lagged step,
max_tokens 1 and aborts; a request finished or aborted while a later batch is launched is given
back exactly once; no row or page is handed out while a launched batch still reads it (the
tests upstream's illegal-memory-access bugs #58, #67, #89, #102 and PR #111 called for); the
offline LLM, the scheduler's loop and the server's scheduler process work either way."""

from __future__ import annotations

import collections
import random
from typing import Dict, List, Set

import pytest
import torch
from helpers import assert_pages_all_back, greedy, hf_greedy

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.message import (
    AbortBackendMsg,
    BaseFrontendMsg,
    BaseTokenizerMsg,
    BatchFrontendMsg,
    BatchTokenizerMsg,
    ExitMsg,
    TokenizeMsg,
    UserMsg,
)
from minisgl.scheduler import Scheduler, SchedulerConfig

ENV = "MINISGL_DISABLE_OVERLAP_SCHEDULING"
TIGHT = dict(page_size=4, num_pages=40, max_running_req=3, max_extend_tokens=16)  # reuse early
SETTINGS = {
    "roomy": dict(page_size=1),
    "tight": TIGHT,
    "naive": dict(TIGHT, cache_type="naive", num_pages=48),
}


@pytest.fixture(autouse=True)
def _overlap_not_disabled(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)


def make(path, overlap: bool, **options) -> Scheduler:
    options.setdefault("device", "cpu")
    return Scheduler(SchedulerConfig(str(path), overlap_scheduling=overlap, **options))


def workload(seed: int = 0, n: int = 9):
    """Prompts sharing prefixes (radix hits), long ones (chunks), greedy and seeded rows, and
    max_tokens from 1 up."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, 300) for _ in range(10)]
    prompts, params = [], []
    for i in range(n):
        ids = [rng.randrange(3, 300) for _ in range(rng.randrange(1, 40))]
        prompts.append(shared + ids if i % 3 == 0 else ids)
        seeded = SamplingParams(temperature=0.9, top_k=20, max_tokens=1, seed=100 + i)
        params.append(seeded if i % 2 else SamplingParams(max_tokens=1))  # greedy, EOS stops
        params[-1].max_tokens = 1 if i == 4 else rng.randrange(2, 14)
    return prompts, params


def run(s: Scheduler, prompts, params, eos=None) -> List[List[int]]:
    """Every request to the end, checking each finishes once and none is seen after that."""
    if eos is not None:
        s.eos_token_ids = eos
    reqs = [s.add_req(p, sp) for p, sp in zip(prompts, params)]
    finished: List[int] = []
    while (out := s.step()) is not None:
        assert not set(out.uids) & set(finished), "a finished request came back"
        finished += [r.uid for r in out.finished]
    assert sorted(finished) == [r.uid for r in reqs]  # each exactly once
    assert_pages_all_back(s)
    return [r.output_ids for r in reqs]


def eos_midway(path, prompts, params, **options):
    """EOS ids that stop several requests halfway: the third token of every other request."""
    outs = run(make(path, False, **options), prompts, params)
    return tuple({o[2] for o in outs[::2] if len(o) > 3})


@pytest.mark.parametrize("setting", SETTINGS)
def test_tokens_and_cache_identical_with_overlap_on_and_off(tiny_models, setting):
    path = tiny_models["llama3"]
    prompts, params = workload()
    eos = eos_midway(path, prompts, params, **SETTINGS[setting])
    runs = {}
    for overlap in (False, True):
        s = make(path, overlap, **SETTINGS[setting])
        assert s.overlap is overlap
        runs[overlap] = (run(s, prompts, params, eos), s.cache_manager.prefix_cache.size_info)
    assert runs[True][0] == runs[False][0]
    if setting == "roomy":  # no eviction: the cache holds the same tokens (tight: evicted later)
        assert runs[True][1] == runs[False][1]
    outs = runs[True][0]
    assert any(len(o) < sp.max_tokens for o, sp in zip(outs, params))  # some stopped at EOS
    assert all(o[-1] in eos or len(o) == sp.max_tokens for o, sp in zip(outs, params))


def test_overlap_greedy_equals_transformers(tiny_models):
    path = tiny_models["qwen3"]
    prompts, _ = workload(seed=1, n=5)
    s = make(path, True, **TIGHT)
    assert run(s, prompts, [greedy(9)] * 5) == hf_greedy(path, prompts, 9)


class Watch:
    """Records what each launched batch reads (its rows, and the pages of those rows up to
    device_len) until the scheduler processes it, and fails when a row or a page is handed out
    meanwhile: on a GPU that batch may still be running (the hazard of upstream's #89). Fails
    too when a request is launched with all its tokens sampled already."""

    def __init__(self, s: Scheduler):
        self.s, self.launched = s, {}
        self.handed_out = 0
        forward, take, allocate, process = (
            s.engine.forward_batch,
            s.cache_manager._take,
            s.table_manager.allocate,
            s._process,
        )

        def forward_batch(batch, *rest):  # rest: a later chapter's arguments (the mask, ch23)
            # a request past max_tokens would sample a token too many, its slot unreserved
            assert all(r.can_decode for r in batch.reqs), "a request launched at max_tokens"
            page_table, size = s.engine.page_table, s.page_size
            pages = {
                int(p) // size for r in batch.reqs for p in page_table[r.table_idx, : r.device_len]
            }
            self.launched[id(batch)] = (pages, {r.table_idx for r in batch.reqs})
            return forward(batch, *rest)

        def take_pages(n):
            pages = take(n)
            self._check(set(pages.tolist()), 0, "page")
            return pages

        def allocate_row():
            row = allocate()
            self._check({row}, 1, "row")
            return row

        def process_batch(done):
            out = process(done)
            del self.launched[id(done.batch)]
            return out

        s.engine.forward_batch, s.cache_manager._take = forward_batch, take_pages
        s.table_manager.allocate, s._process = allocate_row, process_batch

    def _check(self, given: Set[int], kind: int, name: str) -> None:
        for reads in self.launched.values():
            assert not given & reads[kind], (
                f"{name} {given & reads[kind]} handed out while a launched batch reads it"
            )
        self.handed_out += len(given)


@pytest.mark.parametrize("overlap", [False, True])
def test_no_row_or_page_handed_out_while_a_launched_batch_reads_it(tiny_models, overlap):
    path = tiny_models["llama3"]
    prompts, params = workload(seed=2, n=12)
    eos = eos_midway(path, prompts, params, **TIGHT)
    s = make(path, overlap, **TIGHT)
    watch = Watch(s)
    run(s, prompts, params, eos)
    assert watch.launched == {} and watch.handed_out > s.cache_manager.num_pages  # reused


def test_duplicate_pages_freed_under_a_launched_batch_are_not_handed_out_while_it_runs(tiny_models):
    """Two requests with one prefix, admitted in one batch: neither finds it cached. When the
    second's prompt is cached, the first's is in the tree already, so its own pages of the prefix
    are duplicates: its row is pointed at the tree's and they are freed, while the batch launched
    meanwhile still reads them (the request is in it). They must not be handed out before that
    batch is processed. (A free list that hands out the newest pages first fails here, and
    passes the workload above.)"""
    shared = list(range(10, 18))  # two whole pages of 4
    prompts = [shared + [40, 41], shared + [50, 51], [60, 61, 62]]
    params = [SamplingParams(max_tokens=10, ignore_eos=True) for _ in prompts]
    s = make(
        tiny_models["llama3"],
        True,
        page_size=4,
        num_pages=12,
        max_running_req=3,
        max_extend_tokens=64,
    )
    watch, cm = Watch(s), s.cache_manager
    free, freed_while_read = cm._free, []

    def free_pages(slots):
        pages = {int(p) // cm.page_size for p in slots}
        freed_while_read.extend(pages & reads[0] for reads in watch.launched.values())
        free(slots)

    cm._free = free_pages
    run(s, prompts, params)
    # the case occurred: the second request's two pages of the prefix, freed while read
    assert len(set().union(*freed_while_read)) == 2, freed_while_read


def test_a_request_finished_in_the_lagged_step_is_given_back_once(tiny_models):
    """EOS at batch k is known only after batch k+1 has been launched with the request in it:
    its extra token is dropped, its row and pages are given back once, after batch k+1."""
    path = tiny_models["llama3"]
    prompt = [5, 6, 7, 8]
    params = SamplingParams(max_tokens=8)  # greedy, and EOS stops it
    ref = run(make(path, False, **TIGHT), [prompt], [params])[0]
    assert ref[2] not in ref[:2]
    s = make(path, True, **TIGHT)
    given_back: Dict[int, int] = collections.Counter()
    cache_req = s.cache_manager.cache_req

    def counted(req, *, finished):
        given_back[req.uid] += finished
        cache_req(req, finished=finished)

    s.cache_manager.cache_req = counted
    req = s.add_req(prompt, params)
    s.eos_token_ids = (ref[2],)
    phases = []
    while (out := s.step()) is not None:
        phases.append((out.phase, out.uids, [r.uid for r in out.finished]))
        if out.finished:  # the batch launched after EOS holds the request still
            assert s._in_flight is not None and req in s._in_flight.batch.reqs
            assert given_back[req.uid] == 0 and req.table_idx >= 0  # not yet: it may read them
    assert req.output_ids == ref[:3] and given_back == {req.uid: 1} and req.table_idx == -1
    assert phases == [
        ("prefill", [0], []),
        ("decode", [0], []),
        ("decode", [0], [0]),
        ("decode", [], []),
    ]  # the lagged batch: its token dropped
    assert_pages_all_back(s)


def test_a_chunked_prompt_advances_a_chunk_a_launch(tiny_models):
    """A chunk counts as run once launched, so with overlap each chunk is launched before the
    one before it is processed, and the decode after the last chunk runs the request before the
    host has its first token (read from last_tokens). The batches processed, with the tokens
    each request ran, are those of overlap off, and so are the tokens."""
    path = tiny_models["llama3"]
    prompts = [[3, 1, 4, 1, 5], list(range(10, 30))]  # the second in chunks of 3, 8, 8 and 1
    params = [SamplingParams(max_tokens=4), SamplingParams(max_tokens=3)]
    batches, launches, outs = {}, {}, {}
    for overlap in (False, True):
        s = make(path, overlap, max_extend_tokens=8)
        reqs = [s.add_req(p, sp) for p, sp in zip(prompts, params)]
        done, seen = batches.setdefault(overlap, []), launches.setdefault(overlap, [])

        def watched(
            batch, *more, forward=s.engine.forward_batch, done=done, seen=seen, long=reqs[1]
        ):
            if long in batch.reqs:  # what the host has of the long request at each launch
                seen.append((batch.phase, long.cached_len, len(long.output_ids), len(done)))
            return forward(batch, *more)  # later chapters pass more (chapter 23: a mask)

        s.engine.forward_batch = watched
        while (out := s.step()) is not None:
            done.append((out.phase, out.uids, out.extend_lens))
        outs[overlap] = [r.output_ids for r in reqs]
    assert batches[True] == batches[False] and outs[True] == outs[False]
    assert [lens for phase, _, lens in batches[True] if phase == "prefill"] == [
        [5, 3],
        [8],
        [8],
        [1],
    ]
    # at each launch holding the long request: its phase, the prompt tokens launched before,
    # the tokens the host has of it, and how many batches the host has processed
    assert launches[False][:5] == [
        ("prefill", 0, 0, 0),
        ("prefill", 3, 0, 1),
        ("prefill", 11, 0, 2),
        ("prefill", 19, 0, 3),
        ("decode", 20, 1, 4),
    ]
    assert launches[True][:5] == [
        ("prefill", 0, 0, 0),
        ("prefill", 3, 0, 0),  # the second chunk before the first is processed
        ("prefill", 11, 0, 1),
        ("prefill", 19, 0, 2),
        ("decode", 20, 0, 3),  # before the host has its first token
    ]


def test_env_var_disables_overlap_as_upstreams_does(tiny_models, monkeypatch):
    path = tiny_models["llama3"]
    assert make(path, True).overlap and not make(path, False).overlap
    assert not Scheduler(SchedulerConfig(str(path), device="cpu")).overlap  # CPU default: off
    for value in ("1", "true", "YES"):
        monkeypatch.setenv(ENV, value)
        assert not make(path, True).overlap
    monkeypatch.setenv(ENV, "0")
    assert make(path, True).overlap


def loop_run(path, overlap: bool, abort_at: Dict[int, int]):
    """The server's scheduler loop without sockets: requests in, an abort of request u when
    it has ``abort_at[u]`` tokens out; every message each request got."""
    pytest.importorskip("zmq")  # the server's packages: not on every GPU image
    from minisgl.scheduler.io import SchedulerLoop

    s = make(path, overlap, **TIGHT)
    loop = SchedulerLoop(s)
    prompts, params = workload(seed=3, n=6)
    for uid, (p, sp) in enumerate(zip(prompts, params)):
        sp.max_tokens, sp.ignore_eos = max(sp.max_tokens, 6), True  # lengths known ahead
        loop.handle(UserMsg(uid, torch.tensor(p, dtype=torch.int32), sp))
    got: Dict[int, List] = collections.defaultdict(list)
    aborted: Set[int] = set()
    while not s.idle:
        for m in loop.step():
            assert m.uid not in aborted, "a token after the abort"
            got[m.uid].append(m)
        for uid, n in abort_at.items():
            if len(got[uid]) >= n and uid not in aborted:
                assert loop.handle(AbortBackendMsg(uid)) == []
                aborted.add(uid)
    assert_pages_all_back(s)
    return got


def test_aborts_in_the_scheduler_loop_with_overlap(tiny_models):
    """An abort while the request's next batch is launched: that batch's token is dropped, its
    row and pages are given back once (upstream's PR #111), the others are not disturbed.
    Request 1 is aborted with its last token in flight (it would finish in that batch)."""
    path = tiny_models["llama3"]
    ref = loop_run(path, False, {})
    last = len(ref[1]) - 1
    got = loop_run(path, True, {0: 2, 1: last, 3: 0})
    assert [m.next_token for m in got[0]] == [m.next_token for m in ref[0]][:2]
    assert [m.next_token for m in got[1]] == [m.next_token for m in ref[1]][:last]
    assert not any(m.finished for u in (0, 1) for m in got[u])
    for uid in (2, 4, 5):
        assert [(m.next_token, m.finished, m.finish_reason) for m in got[uid]] == [
            (m.next_token, m.finished, m.finish_reason) for m in ref[uid]
        ]


def test_llm_generate_with_overlap_on_and_off(tiny_models):
    path = tiny_models["qwen2"]
    prompts, params = workload(seed=4, n=7)
    outs = {}
    for overlap in (False, True):
        llm = LLM(str(path), device="cpu", overlap_scheduling=overlap, **TIGHT)
        outs[overlap] = [o["token_ids"] for o in llm.generate(prompts, params)]
        llm.shutdown()
    assert outs[True] == outs[False]


@pytest.mark.parametrize("overlap", [False, True])
def test_the_server_scheduler_process_with_overlap_on_and_off(tiny_models, overlap):
    pytest.importorskip("zmq")  # the server's packages: not on every GPU image
    from minisgl.scheduler.io import run_scheduler
    from minisgl.tokenizer.server import tokenizer_worker
    from minisgl.utils.mp import Workers, ZmqPullQueue, ZmqPushQueue

    path = tiny_models["qwen3"]
    prompts = ["Hello world", "The quick brown fox", "one two three four five"]
    params = [greedy(6), greedy(1), SamplingParams(temperature=0.8, max_tokens=5, seed=3)]
    llm = LLM(str(path), device="cpu")
    ref = llm.generate(prompts, params)
    llm.shutdown()
    with Workers() as workers:
        recv = ZmqPullQueue(workers.addr("frontend"), create=True, decoder=BaseFrontendMsg.decoder)
        workers.start(
            "scheduler",
            run_scheduler,
            config=SchedulerConfig(str(path), device="cpu", overlap_scheduling=overlap),
            backend_addr=workers.addr("scheduler"),
            detokenizer_addr=workers.addr("tokenizer"),
        )
        workers.start(
            "tokenizer",
            tokenizer_worker,
            model_path=str(path),
            inbox_addr=workers.addr("tokenizer"),
            backend_addr=workers.addr("scheduler"),
            frontend_addr=workers.addr("frontend"),
        )
        workers.wait_ready(timeout=60)
        send = ZmqPushQueue(
            workers.addr("tokenizer"), create=False, encoder=BaseTokenizerMsg.encoder
        )
        try:
            send.put(
                BatchTokenizerMsg(
                    [TokenizeMsg(i, p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]
                )
            )
            tokens: Dict[int, List[int]] = collections.defaultdict(list)
            open_uids = {0, 1, 2}
            while open_uids:
                msg = recv.get(timeout=20.0, watch=workers.sentinels)
                assert msg is not None, "no reply within 20 s"
                for reply in msg.data if isinstance(msg, BatchFrontendMsg) else [msg]:
                    tokens[reply.uid] += reply.token_ids
                    open_uids.discard(reply.uid) if reply.finished else None
            workers.stop(send_exit=lambda: send.put(ExitMsg()), grace=20.0)
            assert [p.exitcode for p in workers.procs.values()] == [0, 0]
        finally:
            send.close()
            recv.close()
    assert [tokens[i] for i in range(3)] == [o["token_ids"] for o in ref]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_overlap_with_graphs_gives_the_tokens_of_overlap_off(tiny_models):
    """On a GPU: pinned copies behind an event, CUDA graphs replayed for the lagged decode
    batches, the tight pool; the same tokens as without overlap, every page back."""
    path = tiny_models["llama3"]
    prompts, params = workload()
    eos = eos_midway(path, prompts, params, **TIGHT)
    outs = {}
    for overlap in (False, True):
        s = make(path, overlap, device="cuda", **TIGHT)
        assert s.engine.graph_runner.graphs  # decode batches replay graphs
        assert s.engine.start_copy_to_host(torch.ones(2, device="cuda")).copied is not None
        outs[overlap] = run(s, prompts, params, eos)
        s.shutdown()
    assert outs[True] == outs[False]
