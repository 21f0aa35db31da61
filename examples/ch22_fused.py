"""Chapter 22: the fused residual add + RMSNorm, the fused q/k norm + rotary embedding and the
exponential-race sampler against the torch formulas they replace, the page table filled by one
scatter, and the attention metadata's rows padded to 16-byte boundaries.

The Triton kernels run on a CPU in interpreter mode (TRITON_INTERPRET=1 must be set before
triton is imported).
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import collections  # noqa: E402

import torch  # noqa: E402

from minisgl.attention.triton_backend import TritonAttnBackend  # noqa: E402
from minisgl.core import Batch, Req, SamplingParams  # noqa: E402
from minisgl.engine.fused_sampler import FusedSampler  # noqa: E402
from minisgl.engine.sample import BatchSamplingArgs  # noqa: E402
from minisgl.kernel.fused_norm import add_rms_norm  # noqa: E402
from minisgl.kernel.fused_rope import qk_norm_rope  # noqa: E402
from minisgl.kernel.fused_sample import race_sample  # noqa: E402
from minisgl.kvcache import create_prefix_cache  # noqa: E402
from minisgl.layers.norm import add_then_rms_norm, rms_norm  # noqa: E402
from minisgl.layers.rotary import RotaryEmbedding  # noqa: E402
from minisgl.models.config import ModelConfig  # noqa: E402
from minisgl.scheduler.cache import CacheManager  # noqa: E402

# ---- residual add + RMSNorm in one kernel
gen = torch.Generator().manual_seed(0)
x, residual = torch.randn(5, 300, generator=gen), torch.randn(5, 300, generator=gen)
weight = 1.0 + 0.5 * torch.randn(300, generator=gen)
for dtype in (torch.float32, torch.bfloat16):
    a, r, w = x.to(dtype), residual.to(dtype), weight.to(dtype)
    want_out, want_sum = add_then_rms_norm(a, r, w, 1e-6)
    out, new_sum = add_rms_norm(a, r.clone(), w, 1e-6)  # writes the sum into its residual
    name, step = str(dtype)[6:], torch.finfo(dtype).eps  # step: the dtype's relative spacing
    sum_close = torch.allclose(new_sum.float(), want_sum.float(), rtol=step, atol=0.0)
    # the output against torch's norm of the kernel's own sum, so that one step off in the sum
    # does not count twice
    norm_of_sum = add_then_rms_norm(new_sum, None, w, 1e-6)[0]
    out_close = torch.allclose(out.float(), norm_of_sum.float(), rtol=2 * step, atol=0.0)
    print(
        f"add + RMSNorm [5, 300] {name}: the sum equal to torch's: "
        f"{torch.equal(new_sum, want_sum)}, within 1 step ({step:.1e}): {sum_close}; "
        f"the output within 2 steps: {out_close}"
    )

# ---- q/k norm + rotary embedding in one kernel, in place in the qkv GEMM's output
tokens, q_heads, kv_heads, head_dim = 5, 4, 2, 80  # half of 80 is not a power of two
sizes = [q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
qkv = torch.randn(tokens, sum(sizes), generator=gen)
q_weight, k_weight = (1.0 + 0.5 * torch.randn(head_dim, generator=gen) for _ in range(2))
rope = RotaryEmbedding(head_dim, 64, 10000.0)
positions = torch.tensor([63, 0, 17, 2, 32])
for with_norm in (False, True):
    q, k, v = (t.unflatten(-1, (-1, head_dim)) for t in qkv.clone().split(sizes, dim=-1))
    want_q, want_k = q, k  # torch's path: rms_norm (Qwen3), then _rotate
    if with_norm:
        want_q, want_k = rms_norm(q, q_weight, 1e-6), rms_norm(k, k_weight, 1e-6)
    want_q, want_k = rope.forward(positions, want_q, want_k)
    v_before = v.clone()
    weights = (q_weight, k_weight) if with_norm else (None, None)
    qk_norm_rope(positions, q, k, rope._cos_sin_cache, *weights, eps=1e-6)  # q, k in place
    if with_norm:  # the norm's sum of squares adds in another order than torch's mean
        largest = max(
            float((q - want_q).abs().max() / want_q.abs().max()),
            float((k - want_k).abs().max() / want_k.abs().max()),
        )
        verdict = f"within 1e-6 of torch's (of the largest value): {largest < 1e-6}"
    else:
        verdict = f"equal to torch's: {torch.equal(q, want_q) and torch.equal(k, want_k)}"
    print(
        f"{'q/k norm + ' if with_norm else ''}rotary [5, 4 + 2 heads, 80] float32 in place: "
        f"{verdict}; v untouched: {torch.equal(v, v_before)}"
    )

# ---- sampling by the exponential race
logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0, -2.0])
n = 300  # each draw is a row: the interpreter takes about 25 ms a row
params = [SamplingParams(temperature=1.0)] * n
args = BatchSamplingArgs.from_params(params)
args.row_seeds = [None] * n
tokens = FusedSampler(seed=0).sample(logits.expand(n, -1), args)
freq = torch.bincount(tokens, minlength=6).double() / n
print("softmax(logits):     ", [f"{p:.3f}" for p in torch.softmax(logits, 0).tolist()])
print(f"race, {n} draws at T=1:", [f"{p:.3f}" for p in freq.tolist()])

flat = 0.1 * torch.randn(6, 500, generator=torch.Generator().manual_seed(7))  # near-uniform rows
seeds = torch.tensor([11, 22, 33, 44, 55, 66])
temps, no_greedy = torch.ones(6), torch.zeros(6, dtype=torch.bool)
first = race_sample(flat, temps, no_greedy, seeds)
order = [5, 2, 0, 4, 1, 3]
shuffled = race_sample(flat[order], temps, no_greedy, seeds[order])
print("seeded rows' tokens:", first.tolist())
print(
    "the rows shuffled, put back:",
    torch.empty_like(shuffled).scatter_(0, torch.tensor(order), shuffled).tolist(),
)
greedy_rows = torch.tensor([True, False, True, False, True, False])
mixed = race_sample(flat, temps, greedy_rows, seeds)
print(
    "greedy rows take the argmax:",
    torch.equal(mixed[greedy_rows], flat.argmax(-1)[greedy_rows]),
    "| the sampled rows keep their draws:",
    torch.equal(mixed[~greedy_rows], first[~greedy_rows]),
)

# ---- the page table: a step's pages in one scatter
size, num_pages = 4, 11
table = torch.full((6, 20), -1, dtype=torch.int32)
cache = CacheManager(num_pages, size, table, create_prefix_cache("naive", size))
queue = collections.deque(range(num_pages))  # the free pages, in the order they are handed out
# (row, cached_len, device_len): a prefill of two pages, decodes across a boundary and not, a
# chunk that starts mid-page and crosses two
spans = [(0, 0, 6), (1, 8, 9), (2, 5, 6), (3, 3, 4), (4, 12, 13), (5, 6, 17)]
reqs = [
    Req(i, list(range(end)), SamplingParams(max_tokens=1), table_idx=row, cached_len=start)
    for i, (row, start, end) in enumerate(spans)
]
expected = [[-1] * 20 for _ in range(6)]
for row, start, end in spans:  # the literal loop: request by request, page by page
    for page_index in range(-(-start // size), -(-end // size)):
        page = queue.popleft()
        expected[row][page_index * size : (page_index + 1) * size] = range(
            page * size, (page + 1) * size
        )
cache.allocate(reqs)
for row, start, end in spans:
    first, last = -(-start // size), -(-end // size)  # the row's new pages: first .. last - 1
    pages = (table[row, first * size : last * size : size] // size).tolist()
    print(
        f"row {row}, positions [{start}, {end}): new pages {pages}"
        + ("" if pages else f" (position {start} lies in a page the row holds)")
    )
print(
    "one scatter equals the loop:",
    table.tolist() == expected,
    f"| pages left: {cache.num_free_pages} of {num_pages}",
)

# ---- the attention metadata's rows: 16-byte aligned
config = ModelConfig.from_dict(
    {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 64,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "max_position_embeddings": 128,
    }
)
backend = TritonAttnBackend(config, "cpu")
print("decode batch size: the byte where each of its five length rows starts, mod 16,")
print("                   unpadded (rows of B int32) -> padded to a multiple of 4 entries")
for batch_size in range(1, 8):
    reqs = [Req(i, [1, 2, 3], SamplingParams(), table_idx=i) for i in range(batch_size)]
    for req in reqs:
        req.complete_forward()
        req.append(7)
    batch = Batch(reqs, "decode")
    backend.prepare_metadata(batch)
    meta = batch.attn_metadata
    rows = [meta.rows, meta.cached_lens, meta.extend_lens, meta.seq_lens, meta.q_starts]
    unpadded = [4 * batch_size * k % 16 for k in range(5)]  # row k starts 4 * B * k bytes in
    padded = [(t.data_ptr() - meta.rows.data_ptr()) % 16 for t in rows]
    print(f"  {batch_size}: {unpadded} -> {padded}; seq_lens {meta.seq_lens.tolist()}")
