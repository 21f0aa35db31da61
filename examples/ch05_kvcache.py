"""Chapter 5: the paged KV cache and the reference attention backend.

The K and V of every token a request has seen go into a pool of fixed-size pages. A request's
row of the page table says where each of its tokens sits (slot = page * page_size + offset), so
its pages need not be next to each other. The prompt runs once (prefill); every later step runs
only the newest token (decode), attending over the cache.

The tokens are held against two references. Recomputation runs the whole sequence every step,
through the same pool and backend on a fresh cache, so it checks the bookkeeping (pages, slots,
positions) but would make any mistake of storing or reading K and V along with the cache.
transformers' `generate` on the same checkpoint shares no code with minisgl, so it checks it all.
"""

from __future__ import annotations

import tempfile

import tiny_models
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging

from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, Req, SamplingParams, use_global_ctx
from minisgl.kvcache import create_kvcache_pool
from minisgl.models import generate_greedy_recompute, load_model

torch.set_num_threads(1)
logging.set_verbosity_error()

PAGE_SIZE, NUM_PAGES = 4, 8


def forward(model, ctx: Context, req: Req) -> int:
    """Run the request's tokens [cached_len, device_len) through the model; the greedy token."""
    positions = torch.arange(req.cached_len, req.device_len)
    ids = torch.tensor(req.all_ids[req.cached_len : req.device_len])
    batch = Batch(
        [req],
        "prefill" if req.cached_len == 0 else "decode",
        input_ids=ids,
        positions=positions,
        out_loc=ctx.page_table[req.table_idx, positions].long(),
    )
    with ctx.forward_batch(batch):
        ctx.attn_backend.prepare_metadata(batch)
        logits = model.forward(ids, positions)
    req.complete_forward()
    return int(logits[-1].argmax())


with tempfile.TemporaryDirectory() as tmp:
    path = tiny_models.make_tiny_model("llama3", f"{tmp}/llama3")
    model = load_model(path)
    tok = AutoTokenizer.from_pretrained(path)

    ctx = Context(page_size=PAGE_SIZE)
    ctx.kv_cache = create_kvcache_pool(model.config, NUM_PAGES, PAGE_SIZE, torch.float32, "cpu")
    ctx.page_table = torch.zeros(1, NUM_PAGES * PAGE_SIZE, dtype=torch.int32)
    ctx.attn_backend = create_attention_backend("torch", model.config, "cpu")
    print(
        f"KV pool buffer [2, layers, pages, page_size, kv_heads, head_dim] = "
        f"{list(ctx.kv_cache.buffer.shape)}, {ctx.kv_cache.bytes_per_page} bytes a page"
    )

    free_pages = [5, 2, 7, 0, 3, 6, 1, 4]  # handed out in this order: not next to each other
    prompt = tok.encode("Once upon a time there was a robot")
    req = Req(0, prompt, SamplingParams(max_tokens=8), table_idx=0)

    def give_pages(req: Req) -> None:
        """Enough pages for tokens [0, device_len), their slots written into the page table."""
        held = -(-req.cached_len // PAGE_SIZE)
        needed = -(-req.device_len // PAGE_SIZE)
        for page_index in range(held, needed):
            page = free_pages.pop(0)
            slots = torch.arange(page * PAGE_SIZE, (page + 1) * PAGE_SIZE, dtype=torch.int32)
            ctx.page_table[req.table_idx, page_index * PAGE_SIZE :][:PAGE_SIZE] = slots
            print(
                f"    page {page} for positions {page_index * PAGE_SIZE}.."
                f"{(page_index + 1) * PAGE_SIZE - 1}"
            )

    print(f"\nprompt 'Once upon a time there was a robot': {len(prompt)} tokens {prompt}")
    with use_global_ctx(ctx):
        while not req.is_finished(tok.eos_token_id):
            step = "prefill" if req.cached_len == 0 else "decode "
            where = (
                f"positions {req.cached_len}..{req.device_len - 1}"
                if req.extend_len > 1
                else f"position {req.cached_len}"
            )
            print(f"  {step} runs {req.extend_len} token(s) at {where}")
            give_pages(req)
            req.append(forward(model, ctx, req))
    row = ctx.page_table[0, : req.cached_len].tolist()
    print(f"\n{req.cached_len} tokens cached; their slots (page table row 0): {row}")
    print(f"pages used {NUM_PAGES - len(free_pages)}, free {len(free_pages)}")
    print(f"generated {req.output_ids}: {tok.decode(req.output_ids)!r}")
    n = len(req.output_ids)
    again = generate_greedy_recompute(model, prompt, n)
    recomputed = sum(len(prompt) + i for i in range(n))  # step i runs the whole sequence again
    print(
        f"recomputation ({recomputed} token positions, the cache ran {req.cached_len}) gives the "
        f"same tokens: {again == req.output_ids}"
    )
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        ids = torch.tensor([prompt])
        ref = hf.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
        )
    print(
        "transformers' generate on the same checkpoint gives the same tokens:",
        ref[0, len(prompt) :].tolist() == req.output_ids,
    )
