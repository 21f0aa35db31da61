"""Chapter 5: the paged KV pool, the reference attention backend over it, and decoding token by
token from the cache, equal to recomputation and to transformers."""

from __future__ import annotations

import pytest
import torch
from helpers import DENSE, encode, hf_greedy

from minisgl.attention import create_attention_backend
from minisgl.attention.utils import attend
from minisgl.core import Batch, Context, Req, SamplingParams, use_global_ctx
from minisgl.kvcache import create_kvcache_pool
from minisgl.models import generate_greedy_recompute, load_model

PROMPTS = ["Once upon a time", "The quick brown fox jumps over the lazy dog.", "1 2 3"]


def make_context(model, page_size: int, num_pages: int, rows: int = 1) -> Context:
    ctx = Context(page_size=page_size)
    ctx.kv_cache = create_kvcache_pool(model.config, num_pages, page_size, torch.float32, "cpu")
    ctx.page_table = torch.zeros(rows, num_pages * page_size, dtype=torch.int32)
    ctx.attn_backend = create_attention_backend("torch", model.config, "cpu")
    return ctx


def give_slots(ctx: Context, req: Req, pages: list[int]) -> None:
    """Slots for positions [cached_len, device_len): a new page from ``pages`` at each boundary."""
    for pos in range(req.cached_len, req.device_len):
        if pos % ctx.page_size == 0:
            page = pages.pop(0)
            start = page * ctx.page_size
            ctx.page_table[req.table_idx, pos : pos + ctx.page_size] = torch.arange(
                start, start + ctx.page_size
            )[: ctx.page_table.shape[1] - pos]


def run(model, ctx: Context, reqs: list[Req]) -> torch.Tensor:
    """One forward of the requests' new tokens; the last token's logits of each: [B, V]."""
    positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
    ids = torch.tensor([t for r in reqs for t in r.all_ids[r.cached_len : r.device_len]])
    rows = torch.tensor([r.table_idx for r in reqs]).repeat_interleave(
        torch.tensor([r.extend_len for r in reqs])
    )
    batch = Batch(
        reqs, input_ids=ids, positions=positions, out_loc=ctx.page_table[rows, positions].long()
    )
    with use_global_ctx(ctx), ctx.forward_batch(batch):
        ctx.attn_backend.prepare_metadata(batch)
        logits = model.forward(ids, positions)
    last = torch.tensor([r.extend_len for r in reqs]).cumsum(0) - 1
    for r in reqs:
        r.complete_forward()
    return logits[last]


def cached_greedy(model, ids: list[int], n: int, page_size: int, pages: list[int]) -> list[int]:
    ctx = make_context(model, page_size, num_pages=max(pages) + 1)
    req = Req(0, ids, SamplingParams(max_tokens=n), table_idx=0)
    while len(req.output_ids) < n:
        give_slots(ctx, req, pages)
        req.append(int(run(model, ctx, [req])[0].argmax()))
    return req.output_ids


def test_pool_layout_and_slots():
    from minisgl.kvcache.mha_pool import MHAKVCachePool

    pool = MHAKVCachePool(
        num_layers=3,
        num_kv_heads=2,
        head_dim=4,
        num_pages=5,
        page_size=4,
        dtype=torch.float32,
        device="cpu",
    )
    assert pool.buffer.shape == (2, 3, 5, 4, 2, 4)
    k, v = torch.randn(2, 2, 4), torch.randn(2, 2, 4)
    pool.store_kv(k, v, torch.tensor([9, 18]), layer_id=1)
    # slot 9 is page 2, offset 1; slot 18 is page 4, offset 2
    for index, (name, stored, read) in enumerate([("K", k, pool.k_cache), ("V", v, pool.v_cache)]):
        for token, (slot, page, offset) in enumerate([(9, 2, 1), (18, 4, 2)]):
            where = f"token {token}'s {name} [2, 4] (slot {slot}, layer 1)"
            assert torch.equal(pool.buffer[index, 1, page, offset], stored[token]), (
                f"{where} is not at buffer[{index}, 1, {page}, {offset}]: {name} is at index "
                f"{index} of the buffer's first dimension"
            )
            assert torch.equal(read(1)[slot], stored[token]), f"{where}: {name.lower()}_cache(1)"
    assert pool.buffer[:, [0, 2]].abs().sum() == 0, "store_kv wrote to layers 0 or 2"
    assert pool.bytes_per_page == 2 * 3 * 4 * 2 * 4 * 4


def reference_attention(q, k, v):
    """Literal loops: query t of head h over keys 0..t of its KV head."""
    out = torch.zeros_like(q)
    group = q.shape[1] // k.shape[1]
    for t in range(q.shape[0]):
        for h in range(q.shape[1]):
            keys, values = k[: t + 1, h // group], v[: t + 1, h // group]
            w = torch.softmax(keys @ q[t, h] / q.shape[2] ** 0.5, dim=0)
            out[t, h] = w @ values
    return out


@pytest.mark.parametrize("num_cached", [0, 1, 5, 8])
def test_attend_equals_the_literal_loop(num_cached):
    torch.manual_seed(num_cached)
    q, k, v = torch.randn(9, 4, 8), torch.randn(9, 2, 8), torch.randn(9, 2, 8)
    full = reference_attention(q, k, v)
    ours = attend(q[num_cached:], k, v, num_cached)
    case = f"q [{9 - num_cached}, 4, 8] over k, v [9, 2, 8], {num_cached} of them cached"
    torch.testing.assert_close(
        ours, full[num_cached:], atol=1e-5, rtol=1e-5, msg=lambda m: f"{case}: {m}"
    )


def test_the_backend_attends_over_the_k_and_v_it_stored(tiny_models):
    """The torch backend stores a request's K and V in scattered slots and reads them back
    through its page-table row: its output must be `attend` over those K and V themselves."""
    model = load_model(tiny_models["llama3"])
    hq, hkv, d = model.config.num_qo_heads, model.config.num_kv_heads, model.config.head_dim
    ctx = make_context(model, page_size=2, num_pages=8)
    req = Req(0, list(range(7)), SamplingParams(max_tokens=2), table_idx=0)
    torch.manual_seed(0)
    q, k, v = torch.randn(8, hq, d), torch.randn(8, hkv, d), torch.randn(8, hkv, d)
    pages = [5, 2, 7, 0, 3]
    for step, start, end in [("prefill", 0, 7), ("decode", 7, 8)]:
        if step == "decode":
            req.append(0)
        give_slots(ctx, req, pages)
        positions = torch.arange(start, end)
        batch = Batch(
            [req],
            input_ids=torch.zeros(end - start, dtype=torch.long),
            positions=positions,
            out_loc=ctx.page_table[0, positions].long(),
        )
        with use_global_ctx(ctx), ctx.forward_batch(batch):
            ctx.attn_backend.prepare_metadata(batch)
            out = ctx.attn_backend.forward(q[start:end], k[start:end], v[start:end], 1, batch)
        req.complete_forward()
        case = f"{step}: q [{end - start}, {hq}, {d}] over the K and V [{end}, {hkv}, {d}] stored"
        torch.testing.assert_close(
            out, attend(q[start:end], k[:end], v[:end], start), msg=lambda m: f"{case}: {m}"
        )


@pytest.mark.parametrize("family", DENSE)
def test_cached_decoding_equals_recompute_and_transformers(tiny_models, family):
    path = tiny_models[family]
    model = load_model(path)
    prompts = [encode(path, p) for p in PROMPTS]
    ref = hf_greedy(path, prompts, 12)
    for text, prompt, expected in zip(PROMPTS, prompts, ref):
        case = f"{family}, prompt {text!r} ({len(prompt)} tokens), 12 new tokens"
        recomputed = generate_greedy_recompute(model, prompt, 12)
        assert recomputed == expected, f"{case}: recomputation against transformers"
        pages = [7, 3, 11, 0, 5, 9, 1, 14, 2, 8, 4, 12, 6, 10, 13, 15]  # scattered on purpose
        cached = cached_greedy(model, prompt, 12, page_size=4, pages=list(pages))
        assert cached == expected, f"{case}: the cache (pages of 4, scattered) against transformers"


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_two_requests_in_one_forward_equal_each_alone(tiny_models, page_size):
    path = tiny_models["qwen3"]
    model = load_model(path)
    a, b = encode(path, PROMPTS[0]), encode(path, PROMPTS[1])
    num_pages = 256 // page_size
    alone = [cached_greedy(model, p, 6, page_size, list(range(num_pages))) for p in (a, b)]
    ctx = make_context(model, page_size, num_pages, rows=2)
    reqs = [
        Req(0, a, SamplingParams(max_tokens=6), table_idx=0),
        Req(1, b, SamplingParams(max_tokens=6), table_idx=1),
    ]
    free = list(range(num_pages))[::-1]
    while len(reqs[0].output_ids) < 6:
        for r in reqs:
            give_slots(ctx, r, free)
        for r, token in zip(reqs, run(model, ctx, reqs).argmax(-1).tolist()):
            r.append(token)
    assert [r.output_ids for r in reqs] == alone


def test_sequence_logits_leaves_the_global_context_alone(tiny_models):
    from minisgl.core import get_global_ctx, set_global_ctx
    from minisgl.models import sequence_logits

    model = load_model(tiny_models["llama3"])
    mine = Context(page_size=8)
    set_global_ctx(mine)
    logits = sequence_logits(model, [1, 2, 3])
    assert logits.shape[0] == 3 and get_global_ctx() is mine
