"""Chapter 16: the Triton kernels (KV store, paged decode and extend attention) against torch.

On a CPU they run in Triton's interpreter on small shapes; on CUDA also at Qwen3-0.6B's shapes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Tuple

if not Path("/dev/nvidia0").exists():  # no GPU: interpret; it must be chosen before triton loads
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from minisgl.attention.utils import attend  # noqa: E402
from minisgl.kernel import decode_attention, extend_attention, store_kv  # noqa: E402
from minisgl.kernel.attention import DECODE_TILES  # noqa: E402

CUDA = torch.cuda.is_available()
on_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")
DEVICE = "cuda" if CUDA else "cpu"  # the small shapes run on the GPU too where there is one


def kv_pool(
    num_slots: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str,
    gen: torch.Generator,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Random K and V caches, [num_slots, Hkv, D] each, interleaved in one buffer so that a slot's
    stride is twice its size: a kernel that assumes contiguous slots reads the wrong ones."""
    buffer = torch.randn(num_slots, 2, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    return buffer[:, 0], buffer[:, 1]


def page_table_for(
    lens: List[int], page_size: int, num_pages: int, gen: torch.Generator, device: str
) -> Tuple[torch.Tensor, torch.Tensor]:
    """A page table whose requests own pages scattered at random in the pool, in rows picked at
    random among 2 * B -> (page_table [2 * B, width] int32, rows [B] int32)."""
    width = max(lens) + 5
    pages = torch.randperm(num_pages, generator=gen).tolist()
    table = torch.full((2 * len(lens), width), -1, dtype=torch.int32)
    rows = torch.randperm(2 * len(lens), generator=gen)[: len(lens)]
    for row, length in zip(rows.tolist(), lens):
        owned = [pages.pop() for _ in range(-(-length // page_size))]
        pos = torch.arange(length)
        table[row, :length] = torch.tensor(owned)[pos // page_size] * page_size + pos % page_size
    return table.to(device), rows.to(torch.int32).to(device)


# Each page size and each grouping of query heads (1, 2 and 4 per KV head), once each: a kernel
# reads K and V through the table's slot numbers, so how the pages lie and how the heads group
# never meet in its code, and the whole cross product only multiplies the interpreter's time.
PAGES_AND_HEADS = [(1, (4, 2)), (3, (8, 2)), (16, (2, 2))]


def reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    rows: torch.Tensor,
    cached: List[int],
    extend: List[int],
) -> torch.Tensor:
    """Each request's new tokens by ``attend`` over the K and V gathered through its row."""
    outs = []
    for q_req, row, c, e in zip(q.split(extend), rows.tolist(), cached, extend):
        slots = table[row, : c + e].long()
        outs.append(attend(q_req, k_cache[slots], v_cache[slots], c))
    return torch.cat(outs)


def run_decode(
    lens: List[int],
    heads: Tuple[int, int],
    head_dim: int,
    page_size: int,
    splits: int | None,
    dtype: torch.dtype = torch.float32,
    device: str = DEVICE,
    seed: int = 0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    num_pages = sum(-(-n // page_size) for n in lens) + 7
    k_cache, v_cache = kv_pool(num_pages * page_size, heads[1], head_dim, dtype, device, gen)
    table, rows = page_table_for(lens, page_size, num_pages, gen, device)
    q = torch.randn(len(lens), heads[0], head_dim, generator=gen).to(device, dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    out = decode_attention(
        q, k_cache, v_cache, table, rows, seq_lens, head_dim**-0.5, num_kv_splits=splits
    )
    ref = reference(q, k_cache, v_cache, table, rows, [n - 1 for n in lens], [1] * len(lens))
    return out, ref


def run_extend(
    cached: List[int],
    extend: List[int],
    heads: Tuple[int, int],
    head_dim: int,
    page_size: int,
    dtype: torch.dtype = torch.float32,
    device: str = DEVICE,
    seed: int = 0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lens = [c + e for c, e in zip(cached, extend)]
    num_pages = sum(-(-n // page_size) for n in lens) + 7
    k_cache, v_cache = kv_pool(num_pages * page_size, heads[1], head_dim, dtype, device, gen)
    table, rows = page_table_for(lens, page_size, num_pages, gen, device)
    # q as the model makes it: a strided view of a wider projection
    qkv = torch.randn(sum(extend), heads[0] + 3, head_dim, generator=gen).to(device, dtype)
    q = qkv[:, : heads[0]]
    as_tensor = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    starts = torch.tensor([0] + extend[:-1]).cumsum(0).tolist()
    out = extend_attention(
        q,
        k_cache,
        v_cache,
        table,
        rows,
        as_tensor(cached),
        as_tensor(extend),
        as_tensor(starts),
        max(extend),
        head_dim**-0.5,
    )
    return out, reference(q, k_cache, v_cache, table, rows, cached, extend)


# ---------------------------------------------------------------- store_kv


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_store_kv_writes_exactly_the_given_slots(index_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    k_cache, v_cache = kv_pool(40, 2, 24, torch.float32, DEVICE, gen)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    qkv = torch.randn(6, 4 + 2 + 2, 24, generator=gen).to(DEVICE)  # k, v strided: from qkv
    k, v = qkv[:, 4:6], qkv[:, 6:8]
    out_loc = torch.tensor([37, 0, 5, 22, 23, 11], dtype=index_dtype, device=DEVICE)
    store_kv(k_cache, v_cache, out_loc, k, v)
    before_k[out_loc.long()], before_v[out_loc.long()] = k, v
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)


def test_store_kv_with_no_tokens_is_a_no_op() -> None:
    k_cache, v_cache = kv_pool(8, 1, 16, torch.float32, DEVICE, torch.Generator().manual_seed(0))
    before = k_cache.clone()
    empty = torch.empty(0, 1, 16, device=DEVICE)
    store_kv(k_cache, v_cache, torch.empty(0, dtype=torch.int32, device=DEVICE), empty, empty)
    assert torch.equal(k_cache, before)


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("page_size, heads", PAGES_AND_HEADS)
def test_decode_matches_reference(page_size: int, heads: Tuple[int, int]) -> None:
    # length 1, a few keys, several blocks; 8 splits leave the short requests' later splits empty
    out, ref = run_decode([1, 6, 70, 33], heads, 16, page_size, splits=8)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_decode_many_pages_and_odd_head_dim() -> None:
    out, ref = run_decode([300, 2, 129], (4, 1), 80, page_size=3, splits=4)  # 100 pages of 3
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_a_head_of_8_is_padded_to_tl_dots_16_and_still_exact() -> None:
    from minisgl.kernel.attention import head_block

    assert [head_block(d) for d in (8, 16, 80, 96, 128, 256)] == [16, 16, 128, 128, 128, 256]
    out, ref = run_decode([5, 40], (6, 2), 8, page_size=4, splits=2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    out, ref = run_extend([9, 0], [3, 20], (6, 2), 8, page_size=4)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_decode_lengths_ending_on_a_split_boundary() -> None:
    """Each split holds one block here, so the first empty split starts exactly at seq_len: the
    combine must not read it (its buffer row is never written)."""
    block = DECODE_TILES["float32"]["BLOCK_N"]
    out, ref = run_decode([2 * block, block, 3 * block], (4, 2), 16, page_size=4, splits=4)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_decode_default_splits() -> None:
    out, ref = run_decode([77, 1], (2, 1), 16, page_size=2, splits=None)  # splits from the batch
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("splits", [1, 2, 64])
def test_decode_any_number_of_splits(splits: int) -> None:
    out, ref = run_decode([45, 1, 97], (4, 2), 32, page_size=5, splits=splits, seed=3)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- extend


@pytest.mark.parametrize("page_size, heads", PAGES_AND_HEADS)
def test_extend_matches_reference(page_size: int, heads: Tuple[int, int]) -> None:
    # a prefill, prefix hits (one of them decode-like), and a request spanning three query blocks
    out, ref = run_extend([0, 7, 40, 0, 65], [70, 20, 1, 2, 33], heads, 16, page_size)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_extend_many_pages_and_odd_head_dim() -> None:
    out, ref = run_extend([150, 0], [40, 64], (4, 1), 96, page_size=3, seed=5)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_extend_of_one_token_equals_decode() -> None:
    """A decode step is an extend of one token over the cached prefix: both kernels agree."""
    gen = torch.Generator().manual_seed(7)
    lens, heads, dim = [1, 19, 50], (4, 2), 16
    k_cache, v_cache = kv_pool(80, heads[1], dim, torch.float32, DEVICE, gen)
    table, rows = page_table_for(lens, 4, 20, gen, DEVICE)
    q = torch.randn(len(lens), heads[0], dim, generator=gen).to(DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    ones = torch.ones(len(lens), dtype=torch.int32, device=DEVICE)
    dec = decode_attention(q, k_cache, v_cache, table, rows, seq_lens, 0.3, num_kv_splits=3)
    ext = extend_attention(
        q,
        k_cache,
        v_cache,
        table,
        rows,
        seq_lens - 1,
        ones,
        torch.arange(len(lens), dtype=torch.int32, device=DEVICE),
        1,
        0.3,
    )
    torch.testing.assert_close(dec, ext, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- CUDA, real shapes

REAL_HEADS, REAL_DIM = (16, 8), 128  # Qwen3-0.6B


def _tolerance(dtype: torch.dtype) -> dict:
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


@on_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_decode_real_shapes(dtype: torch.dtype) -> None:
    lens = torch.randint(1, 4097, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    lens[:3] = [1, 4096, 17]
    out, ref = run_decode(lens, REAL_HEADS, REAL_DIM, 16, splits=16, dtype=dtype, device="cuda")
    torch.testing.assert_close(out, ref, **_tolerance(dtype))


@on_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_extend_real_shapes(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    cached = torch.randint(0, 2048, (16,), generator=gen).tolist()
    extend = torch.randint(1, 1025, (16,), generator=gen).tolist()
    cached[:3], extend[:3] = [0, 0, 3000], [4096, 1, 1]
    out, ref = run_extend(cached, extend, REAL_HEADS, REAL_DIM, 16, dtype=dtype, device="cuda")
    torch.testing.assert_close(out, ref, **_tolerance(dtype))


@on_cuda
@pytest.mark.parametrize("head_dim", [8, 16, 32, 64, 80, 96, 128, 256])
@pytest.mark.parametrize("heads", [(4, 4), (3, 1), (10, 2), (16, 2), (16, 1)])  # GQA 1 to 16
def test_cuda_other_head_dims(head_dim: int, heads: Tuple[int, int]) -> None:
    out, ref = run_decode(
        [1, 700, 2049], heads, head_dim, 16, splits=None, dtype=torch.bfloat16, device="cuda"
    )
    torch.testing.assert_close(out, ref, **_tolerance(torch.bfloat16))
    out, ref = run_extend(
        [0, 300], [1000, 129], heads, head_dim, 16, dtype=torch.bfloat16, device="cuda"
    )
    torch.testing.assert_close(out, ref, **_tolerance(torch.bfloat16))


@on_cuda
def test_cuda_store_kv_real_shapes() -> None:
    gen = torch.Generator().manual_seed(2)
    k_cache, v_cache = kv_pool(8192, 8, 128, torch.bfloat16, "cuda", gen)
    before_k = k_cache.clone()
    out_loc = torch.randperm(8192, generator=gen)[:1000].cuda()
    k = torch.randn(1000, 8, 128, generator=gen).to("cuda", torch.bfloat16)
    store_kv(k_cache, v_cache, out_loc, k, k + 1)
    before_k[out_loc] = k
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache[out_loc], k + 1)


@on_cuda
def test_cuda_decode_in_a_cuda_graph() -> None:
    """Captured once, replayed with other lengths: no host sync, and the splits follow seq_lens."""
    gen = torch.Generator().manual_seed(3)
    lens = [900, 3, 2000, 64]
    k_cache, v_cache = kv_pool(4096, 8, 128, torch.bfloat16, "cuda", gen)
    table, rows = page_table_for(lens, 16, 4096 // 16, gen, "cuda")
    q = torch.randn(4, 16, 128, generator=gen).to("cuda", torch.bfloat16)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    args = (q, k_cache, v_cache, table, rows, seq_lens, 128**-0.5)
    decode_attention(*args)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(*args)
    seq_lens.copy_(torch.tensor([1, 3, 1000, 64]))
    graph.replay()
    torch.testing.assert_close(out, decode_attention(*args), atol=0, rtol=0)
    ref = reference(q, k_cache, v_cache, table, rows, [0, 2, 999, 63], [1] * 4)
    torch.testing.assert_close(out, ref, **_tolerance(torch.bfloat16))


# ---------------------------------------------------------------- the engine with the kernels


def _generate(path, backend: str, prompts, n: int, device: str = DEVICE, **options):
    from helpers import greedy

    from minisgl.llm import LLM

    llm = LLM(
        str(path),
        device=device,
        page_size=3,
        num_pages=64,
        max_running_req=4,
        attention_backend=backend,
        **options,
    )
    return [out["token_ids"] for out in llm.generate(prompts, greedy(n))], llm


def test_engine_with_triton_equals_the_reference(tiny_models) -> None:
    """Prefills split in chunks of 8 tokens beside decode steps, and a prompt whose prefix is
    cached: every batch shape the scheduler makes, through the kernels, gives torch's tokens."""
    shared = list(range(40, 52))
    prompts = [shared + [7, 8], [3, 1, 4, 1, 5], shared + [9]]
    options = {"max_extend_tokens": 8}
    ours, llm = _generate(tiny_models["qwen3"], "triton", prompts, 3, **options)
    ref, _ = _generate(tiny_models["qwen3"], "torch", prompts, 3, **options)
    assert ours == ref
    assert llm.scheduler.cache_manager.prefix_cache.size_info.total_size > 0  # the hit happened


def _tiny_config(path: Path):  # type: ignore[no-untyped-def]
    from minisgl.models.config import ModelConfig
    from minisgl.utils.hf import read_hf_config

    return ModelConfig.from_dict(read_hf_config(path))


def test_hybrid_routes_each_batch_by_its_phase(tiny_models) -> None:
    from minisgl.attention import HybridAttnBackend, create_attention_backend
    from minisgl.attention.base import BaseAttnBackend
    from minisgl.core import Batch, Req, SamplingParams

    class Spy(BaseAttnBackend):
        def __init__(self) -> None:
            self.seen: List[str] = []

        def prepare_metadata(self, batch: Batch) -> None:
            self.seen.append(f"prepare {batch.phase}")

        def forward(self, q, k, v, layer_id, batch):  # type: ignore[no-untyped-def]
            self.seen.append(f"forward {batch.phase}")
            return q

    prefill, decode = Spy(), Spy()
    hybrid = HybridAttnBackend(prefill, decode)
    req = Req(0, [1, 2], SamplingParams())
    for phase in ("prefill", "decode", "prefill"):
        batch = Batch([req], phase)  # type: ignore[arg-type]
        hybrid.prepare_metadata(batch)
        hybrid.forward(torch.zeros(1), torch.zeros(1), torch.zeros(1), 0, batch)
    assert prefill.seen == ["prepare prefill", "forward prefill"] * 2
    assert decode.seen == ["prepare decode", "forward decode"]

    made = create_attention_backend("triton,torch", _tiny_config(tiny_models["qwen3"]), "cpu")
    assert type(made.prefill).__name__ == "TritonAttnBackend"  # type: ignore[attr-defined]
    assert type(made.decode).__name__ == "TorchAttnBackend"  # type: ignore[attr-defined]


def test_backend_names(tiny_models) -> None:
    from minisgl.attention import auto_backend, create_attention_backend

    assert auto_backend(torch.device("cpu")) == "torch"
    for bad in ("flash", "triton,torch,torch", "triton,"):
        with pytest.raises(ValueError, match="attention backend"):
            create_attention_backend(bad, _tiny_config(tiny_models["qwen3"]), "cpu")


def test_lm_head_sees_only_the_sampled_rows(tiny_models) -> None:
    """A prefill of 7 + 3 + 32 tokens computes 3 rows of logits; a decode step one per request;
    the whole-sequence entry point (chapters 2-4) still gets every row."""
    from helpers import greedy, hf_greedy, hf_logits

    from minisgl.models import load_model, sequence_logits

    _, llm = _generate(tiny_models["qwen3"], "torch", [[1] * 3], 1)
    head = llm.scheduler.engine.model.lm_head
    rows_seen: List[int] = []
    forward = head.forward
    head.forward = lambda x: rows_seen.append(x.shape[0]) or forward(x)  # type: ignore
    prompts = [[5] * 7, [6] * 3, list(range(32))]
    outputs = llm.generate(prompts, greedy(2))
    assert rows_seen == [3, 3]
    # the rows are each request's last token's: a row off by one samples another position
    assert [out["token_ids"] for out in outputs] == hf_greedy(tiny_models["qwen3"], prompts, 2)
    model = load_model(tiny_models["qwen3"])
    ids = list(range(20, 29))
    torch.testing.assert_close(
        sequence_logits(model, ids), hf_logits(tiny_models["qwen3"], ids), atol=1e-4, rtol=1e-4
    )


@on_cuda
@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3", "mistral", "qwen2bytes"])
def test_cuda_greedy_equals_transformers(tiny_models, family: str) -> None:
    """float32 on the GPU, through the kernels (Triton dots in IEEE precision): transformers'
    tokens exactly."""
    from helpers import hf_greedy

    prompts = [[1, 5, 9, 200, 17, 3, 8], [4, 4, 4], list(range(30, 130))]
    ours, _ = _generate(tiny_models[family], "triton", prompts, 12, device="cuda")
    assert ours == hf_greedy(tiny_models[family], prompts, 12)
