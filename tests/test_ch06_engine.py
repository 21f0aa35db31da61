"""Chapter 6: the engine runs one forward for a batch of requests of different lengths; each gets
exactly the tokens it gets alone, for every page size; the KV cache is sized from a budget."""

from __future__ import annotations

import pytest
import torch
from helpers import DENSE, encode, hf_greedy

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine.config import EngineConfig
from minisgl.engine.engine import Engine

PROMPTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a small robot who lived in a library.",
    "1",
]


def give_pages(engine: Engine, free: list[int], req: Req) -> None:
    size = engine.config.page_size
    for pos in range(req.cached_len, req.device_len):
        if pos % size == 0:
            page = free.pop(0)
            engine.page_table[req.table_idx, pos : pos + size] = torch.arange(
                page * size, (page + 1) * size
            )[: engine.max_seq_len - pos]


def generate(
    engine: Engine, prompts: list[list[int]], params: list[SamplingParams], free: list[int]
) -> list[list[int]]:
    """Every request prefilled in one forward, then decoded together until each is done."""
    reqs = [Req(i, p, sp, table_idx=i) for i, (p, sp) in enumerate(zip(prompts, params))]
    running = reqs
    while running:
        for req in running:
            give_pages(engine, free, req)
        for req, token in zip(running, engine.forward_batch(Batch(running)).tolist()):
            req.append(token)
        running = [r for r in running if not r.is_finished(None)]
    return [r.output_ids for r in reqs]


def make_engine(path, page_size: int, num_pages: int = 64, seed: int = 0) -> Engine:
    return Engine(
        EngineConfig(
            str(path),
            device="cpu",
            page_size=page_size,
            num_pages=num_pages,
            max_running_req=8,
            seed=seed,
        )
    )


@pytest.mark.parametrize("family", DENSE)
def test_batched_greedy_equals_transformers(tiny_models, family):
    path = tiny_models[family]
    engine = make_engine(path, page_size=4)
    prompts = [encode(path, p) for p in PROMPTS]
    out = generate(engine, prompts, [SamplingParams(max_tokens=10)] * 4, list(range(64)))
    assert out == hf_greedy(path, prompts, 10)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_a_batch_gives_each_request_its_tokens_alone(tiny_models, page_size):
    path = tiny_models["llama3"]
    engine = make_engine(path, page_size, num_pages=512 // page_size)
    prompts = [encode(path, p) for p in PROMPTS]
    lengths = [3, 9, 5, 12]  # they also finish at different steps
    params = [SamplingParams(max_tokens=n) for n in lengths]
    pages = list(range(engine.num_pages))[::-1]  # pages in a scrambled order
    together = generate(engine, prompts, params, pages)
    alone = [
        generate(engine, [p], [sp], list(range(engine.num_pages)))[0]
        for p, sp in zip(prompts, params)
    ]
    assert together == alone and [len(t) for t in together] == lengths


def test_prefill_and_decode_in_the_same_forward(tiny_models):
    path = tiny_models["mistral"]
    engine = make_engine(path, page_size=4)
    a, b = encode(path, PROMPTS[1]), encode(path, PROMPTS[2])
    free = list(range(64))
    first = Req(0, a, SamplingParams(max_tokens=6), table_idx=0)
    give_pages(engine, free, first)
    first.append(int(engine.forward_batch(Batch([first], "prefill"))[0]))
    second = Req(1, b, SamplingParams(max_tokens=5), table_idx=1)
    reqs = [first, second]  # one decodes a token while the other runs its whole prompt
    while not all(r.is_finished(None) for r in reqs):
        live = [r for r in reqs if not r.is_finished(None)]
        for r in live:
            give_pages(engine, free, r)
        for r, t in zip(live, engine.forward_batch(Batch(live)).tolist()):
            r.append(t)
    assert [r.output_ids for r in reqs] == hf_greedy(path, [a, b], 6)[:1] + hf_greedy(path, [b], 5)


def test_seeded_sampling_is_reproducible(tiny_models):
    path = tiny_models["qwen2"]
    prompts = [encode(path, p) for p in PROMPTS[:3]]
    params = [
        SamplingParams(temperature=1.0, max_tokens=12),
        SamplingParams(max_tokens=12),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_tokens=12),
    ]
    runs = [
        generate(make_engine(path, 4, seed=s), prompts, params, list(range(64))) for s in (3, 3, 4)
    ]
    assert runs[0] == runs[1] and runs[0][0] != runs[2][0]
    assert runs[0][1] == runs[2][1] == hf_greedy(path, prompts[1:2], 12)[0]


def test_kv_cache_sized_from_the_budget(tiny_models):
    path = tiny_models["llama3"]
    engine = Engine(
        EngineConfig(str(path), device="cpu", page_size=16, cpu_kv_bytes=1 << 20, max_running_req=8)
    )  # 8 rows of 512 tokens: 256 pages, > budget
    per_page = 2 * 2 * 16 * 2 * 16 * 4  # K and V, layers, page_size, kv heads, head_dim, float32
    assert engine.bytes_per_page() == per_page
    assert engine.num_pages == (1 << 20) // per_page
    assert engine.kv_cache.buffer.shape[2] == engine.num_pages + 1  # the dummy page
    dummy_slot = engine.num_pages * 16
    assert (engine.page_table[engine.dummy_req.table_idx] == dummy_slot).all()
    assert engine.max_seq_len == min(512, engine.num_pages * 16)


@pytest.mark.parametrize(
    "page_size, max_seq_len, rows, pages",
    [
        (16, None, 2, 2 * 512 // 16),  # two rows of the model's 512 positions
        (16, 100, 3, 3 * 7),  # 100 tokens need 7 pages of 16 (rounded up, not down)
        (1, 100, 3, 300),
    ],
)
def test_kv_cache_no_bigger_than_the_rows_can_fill(
    tiny_models, page_size, max_seq_len, rows, pages
):
    """A budget that holds more than every row filled to max_seq_len gets only that many."""
    engine = Engine(
        EngineConfig(
            str(tiny_models["llama3"]),
            device="cpu",
            page_size=page_size,
            cpu_kv_bytes=64 << 20,
            max_running_req=rows,
            max_seq_len=max_seq_len,
        )
    )
    assert engine.num_pages == pages
    assert engine.max_seq_len == (max_seq_len or 512)


def test_bad_engine_options_name_the_field(tiny_models):
    for field, value in [("page_size", 0), ("num_pages", 0), ("max_running_req", 0)]:
        with pytest.raises(ValueError, match=field):
            EngineConfig(str(tiny_models["llama3"]), **{field: value})


@pytest.mark.parametrize(
    "page_size, num_pages, budget_pages, max_seq_len, expected",
    [
        (4, 10, None, None, 40),  # the model's 512 positions, but 10 pages of 4 tokens
        (4, 10, None, 100, 40),  # asked for 100, still 40
        (16, None, 3, None, 48),  # a budget of 3 pages of 16 tokens
        (4, 200, None, 100, 100),  # a pool larger than asked for: as asked
    ],
)
def test_max_seq_len_is_capped_by_the_pool(
    tiny_models, page_size, num_pages, budget_pages, max_seq_len, expected
):
    """No request can outgrow the pool: the context is what the pool holds, if that is less."""
    per_page = 2 * 2 * page_size * 2 * 16 * 4  # as in test_kv_cache_sized_from_the_budget
    engine = Engine(
        EngineConfig(
            str(tiny_models["llama3"]),
            device="cpu",
            page_size=page_size,
            num_pages=num_pages,
            cpu_kv_bytes=(budget_pages or 1) * per_page,
            max_running_req=8,
            max_seq_len=max_seq_len,
        )
    )
    assert engine.max_seq_len == expected
    assert engine.page_table.shape == (9, expected)  # 8 rows and the dummy's, whole pages


@pytest.mark.parametrize("page_size", [4, 16])
def test_a_context_not_a_multiple_of_the_page_size(tiny_models, page_size):
    """max_seq_len 30: the rows still hold whole pages (32 slots), so a request that reaches
    position 29 gets its last page whole, as the scheduler gives pages, and its tokens."""
    path = tiny_models["qwen3"]
    engine = Engine(
        EngineConfig(
            str(path),
            device="cpu",
            page_size=page_size,
            num_pages=16,
            max_running_req=2,
            max_seq_len=30,
        )
    )
    assert engine.max_seq_len == 30
    assert engine.page_table.shape == (3, 32)
    prompt = encode(path, " ".join(PROMPTS))[:26]
    req = Req(0, prompt, SamplingParams(max_tokens=4), table_idx=1)  # 26 + 4 = 30 tokens
    next_page = 0
    while not req.is_finished(None):
        for pos in range(req.cached_len, req.device_len):
            if pos % page_size == 0:  # a whole page, as CacheManager.allocate writes it
                engine.page_table[1, pos : pos + page_size] = torch.arange(
                    next_page * page_size, (next_page + 1) * page_size
                )
                next_page += 1
        req.append(int(engine.forward_batch(Batch([req]))[0]))
    assert req.output_ids == hf_greedy(path, [prompt], 4)[0]


def test_the_smallest_engine_options_are_allowed(tiny_models):
    """One page, one row, one token a page; a budget of exactly one page is one page, and a byte
    less is none (refused)."""
    path = str(tiny_models["llama3"])
    EngineConfig(path, page_size=1, num_pages=1, max_running_req=1)
    per_page = 2 * 2 * 4 * 2 * 16 * 4  # as in test_kv_cache_sized_from_the_budget, pages of 4
    engine = Engine(
        EngineConfig(path, device="cpu", page_size=4, cpu_kv_bytes=per_page, max_running_req=1)
    )
    assert engine.num_pages == 1 and engine.max_seq_len == 4
    with pytest.raises(ValueError, match="no memory left for the KV cache"):
        Engine(EngineConfig(path, device="cpu", page_size=4, cpu_kv_bytes=per_page - 1))


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_the_kv_cache_takes_the_engine_dtype(tiny_models, dtype):
    """dtype None: the checkpoint's (float32 for the tiny models); else the one asked for."""
    engine = Engine(
        EngineConfig(str(tiny_models["llama3"]), device="cpu", num_pages=4, dtype=dtype)
    )
    expected = dtype or torch.float32
    assert engine.dtype == expected and engine.kv_cache.buffer.dtype == expected


def test_a_prompt_run_in_parts_ends_on_the_token_of_one_forward(tiny_models):
    """The engine runs whatever range [cached_len, device_len) a request brings: a prompt in
    three parts, the last beside another request's whole prompt, then two decode steps."""
    path = tiny_models["qwen2"]
    engine = make_engine(path, page_size=4)
    prompt, other_prompt = encode(path, PROMPTS[1]), encode(path, PROMPTS[2])
    free = list(range(64))
    req = Req(0, prompt, SamplingParams(max_tokens=3), table_idx=0)
    for end in (5, 8):  # a part that ends inside a page of 4, one that ends on its boundary
        req.device_len = end
        give_pages(engine, free, req)
        engine.forward_batch(Batch([req]))  # no token: the prompt is not done
        assert req.cached_len == end
    req.device_len = len(prompt)
    other = Req(1, other_prompt, SamplingParams(max_tokens=3), table_idx=1)
    reqs = [req, other]
    while not all(r.is_finished(None) for r in reqs):
        for r in reqs:
            give_pages(engine, free, r)
        for r, t in zip(reqs, engine.forward_batch(Batch(reqs)).tolist()):
            r.append(t)
    assert [r.output_ids for r in reqs] == hf_greedy(path, [prompt, other_prompt], 3)


def test_the_gpu_budget_is_the_memory_ratio_less_the_weights(monkeypatch):
    """The GPU arithmetic, its memory faked: 10 GiB of 80 in use before the model (another
    process's), the weights take 6; half of the 70 left is 35, less the weights: 29 GiB."""
    import types

    import minisgl.engine.engine as engine_module

    gib, free = 1 << 30, [70 << 30]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free[0], 80 * gib))
    monkeypatch.setattr(engine_module, "free_memory", lambda device: free[0])
    gpu = types.SimpleNamespace(
        device=torch.device("cuda"), config=EngineConfig("any", memory_ratio=0.5)
    )
    used_before = Engine._used_memory(gpu)
    assert used_before == 10 * gib
    free[0] = 64 << 30  # the weights are loaded
    assert Engine._kv_budget(gpu, used_before) == 29 * gib
    cpu = types.SimpleNamespace(device=torch.device("cpu"), config=EngineConfig("any"))
    assert Engine._used_memory(cpu) == 0 and Engine._kv_budget(cpu, 0) == 256 << 20


@pytest.mark.parametrize("cuda, expected", [(False, "cpu"), (True, "cuda")])
def test_the_auto_device_is_the_gpu_when_there_is_one(monkeypatch, cuda, expected):
    from minisgl.utils.torch_utils import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert resolve_device("auto") == torch.device(expected)
    assert resolve_device("cpu") == torch.device("cpu")


def test_an_engine_with_every_default_on_a_cpu(tiny_models):
    """All defaults: a row for each request in flight (max_running_req: 64 here, 256 from
    chapter 22 on) of the model's 512 positions, in pages of one token (at most 131,072 pages:
    256 MiB holds more), and the sampler seeded with 0."""
    from minisgl.engine.sample import BatchSamplingArgs, Sampler

    config = EngineConfig(str(tiny_models["llama3"]), device="cpu")
    assert config.max_running_req in (64, 256)  # this chapter's default, or chapter 22's
    engine = Engine(config)
    rows = config.max_running_req
    assert engine.num_pages == rows * 512 and engine.page_table.shape == (rows + 1, 512)
    torch.manual_seed(0)
    logits = torch.randn(16, 450)
    args = BatchSamplingArgs.from_params([SamplingParams(temperature=1.0)] * 16)
    assert torch.equal(engine.sampler.sample(logits, args), Sampler(seed=0).sample(logits, args))


def test_building_an_engine_leaves_the_global_context_alone(tiny_models):
    """An engine makes its context the global one only while it runs a batch: two engines, or a
    draft model beside its target, never find the other's context in place."""
    from minisgl.core import Context, get_global_ctx, use_global_ctx

    path = tiny_models["llama3"]
    mine = Context()
    with use_global_ctx(mine):
        engine, other = make_engine(path, page_size=4), make_engine(path, page_size=1)
        assert get_global_ctx() is mine
        prompt = encode(path, PROMPTS[1])
        out = generate(engine, [prompt], [SamplingParams(max_tokens=4)], list(range(64)))
        assert get_global_ctx() is mine
        assert generate(other, [prompt], [SamplingParams(max_tokens=4)], list(range(64))) == out
