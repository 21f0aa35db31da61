"""Chapter 17: CUDA graphs for decode: the captured sizes, the padding with the dummy request,
and that padded rows never change a real request's tokens (on a CPU the padded batch runs as an
ordinary forward; on CUDA as a graph replay, checked against running without graphs)."""

from __future__ import annotations

from typing import Any, List

import pytest
import torch
from helpers import assert_pages_all_back, greedy, hf_greedy

CUDA = torch.cuda.is_available()
on_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")

PROMPTS = [[3, 1, 4, 1, 5], [2, 7, 1, 8], list(range(30, 45)), [6] * 9, [9, 9], [5, 4, 3]]
LENGTHS = [6, 2, 9, 4, 7, 1]  # requests leave at different steps, so the batch shrinks


def _llm(path: Any, device: str = "cpu", **options: Any) -> Any:
    from minisgl.llm import LLM

    return LLM(str(path), device=device, page_size=4, num_pages=128, max_running_req=8, **options)


def _generate(llm: Any, sampling: Any = None) -> List[List[int]]:
    from minisgl.core import SamplingParams

    params = sampling or [SamplingParams(max_tokens=n, ignore_eos=True) for n in LENGTHS]
    return [out["token_ids"] for out in llm.generate(PROMPTS, params)]


def test_captured_sizes() -> None:
    from minisgl.engine.graph import graph_batch_sizes

    assert graph_batch_sizes(0) == []
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(3) == [1, 2]
    assert graph_batch_sizes(8) == [1, 2, 4, 8]
    assert graph_batch_sizes(23) == [1, 2, 4, 8, 16]
    sizes = graph_batch_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256 and len(sizes) == 35
    assert all(b - a == 8 for a, b in zip(sizes[3:], sizes[4:]))


@pytest.mark.parametrize("max_bs", [1, 4, 8, 24])
def test_padded_size_is_the_smallest_that_holds_the_batch(max_bs: int) -> None:
    from minisgl.engine.graph import graph_batch_sizes, padded_size

    sizes = graph_batch_sizes(max_bs)
    for bs in range(1, max_bs + 10):
        fits = [s for s in sizes if s >= bs]
        assert padded_size(sizes, bs) == (min(fits) if fits else None)


def test_pad_appends_the_dummy_request(tiny_models) -> None:
    from minisgl.core import Batch, Req, SamplingParams

    llm = _llm(tiny_models["llama3"], cuda_graph_max_bs=8)
    engine = llm.scheduler.engine
    runner = engine.graph_runner
    reqs = [Req(i, [1, 2, 3], SamplingParams()) for i in range(5)]
    padded = runner.pad(Batch(reqs, "decode"))
    assert padded.reqs[:5] == reqs and padded.reqs[5:] == [engine.dummy_req] * 3
    assert runner.can_run(Batch(reqs[:1], "decode"))
    assert not runner.can_run(Batch(reqs, "prefill"))  # prefills never run as graphs
    assert not runner.can_run(Batch(reqs * 2, "decode"))  # 10 > 8: an ordinary forward
    dummy = engine.page_table[engine.dummy_req.table_idx]
    assert torch.all(dummy == engine.num_pages * engine.config.page_size)  # the dummy page


@pytest.mark.parametrize("max_bs", [1, 2, 4, 8])
def test_padding_never_changes_a_token(tiny_models, max_bs: int) -> None:
    """Every mix of padded (3->4, 5->8) and unpadded steps gives the unpadded run's tokens, and
    the dummy rows never hold a page: afterwards every page is back."""
    ref = _generate(_llm(tiny_models["llama3"]))
    llm = _llm(tiny_models["llama3"], cuda_graph_max_bs=max_bs)
    assert _generate(llm) == ref
    assert_pages_all_back(llm.scheduler)


def test_padding_with_sampling_keeps_each_rows_draw(tiny_models) -> None:
    """Seeded sampling: a row's draw depends on its request and step, not on the padded rows."""
    from minisgl.core import SamplingParams

    params = [
        SamplingParams(temperature=0.8, top_k=20, max_tokens=n, ignore_eos=True, seed=i)
        for i, n in enumerate(LENGTHS)
    ]
    ref = _generate(_llm(tiny_models["qwen3"]), params)
    assert _generate(_llm(tiny_models["qwen3"], cuda_graph_max_bs=8), params) == ref


def test_dummy_rows_write_only_the_dummy_page(tiny_models) -> None:
    """One padded decode step (3 -> 4): the KV slots that change are the real requests' new
    tokens' and the dummy page's, nothing else."""
    from minisgl.core import Batch

    llm = _llm(tiny_models["llama3"], cuda_graph_max_bs=4)
    scheduler, engine = llm.scheduler, llm.scheduler.engine
    for prompt in PROMPTS[:3]:
        scheduler.add_req(prompt, greedy(5))
    scheduler.step()  # the prefill of all three
    batch = scheduler.decode_manager.schedule_next_batch()
    assert isinstance(batch, Batch) and batch.size == 3
    scheduler.cache_manager.allocate(batch.reqs)
    before = engine.kv_cache.buffer.clone()
    new_slots = [int(engine.page_table[r.table_idx, r.device_len - 1]) for r in batch.reqs]
    engine.forward_batch(batch)
    by_slot = (engine.kv_cache.buffer != before).flatten(2, 3)  # [2, layers, slots, heads, D]
    changed = by_slot.flatten(3).any(-1).any(0).any(0)  # [slots]
    changed_slots = set(torch.nonzero(changed).flatten().tolist())
    dummy = engine.num_pages * engine.config.page_size
    assert changed_slots - set(new_slots) <= set(range(dummy, dummy + engine.config.page_size))
    assert dummy in changed_slots and set(new_slots) <= changed_slots


def test_graph_max_bs_is_capped_and_checked(tiny_models) -> None:
    from minisgl.engine.config import EngineConfig
    from minisgl.llm import LLM

    assert _llm(tiny_models["llama3"]).scheduler.engine.graph_runner.sizes == []  # CPU default
    runner = _llm(tiny_models["llama3"], cuda_graph_max_bs=100).scheduler.engine.graph_runner
    assert runner.max_bs == 8  # no batch is larger than max_running_req
    for max_running_req, max_bs in [(6, 8), (13, 16), (3, 4), (1, 1)]:  # a full batch pads
        llm = LLM(
            str(tiny_models["llama3"]),
            device="cpu",
            page_size=4,
            num_pages=128,
            max_running_req=max_running_req,
            cuda_graph_max_bs=100,
        )
        assert llm.scheduler.engine.graph_runner.max_bs == max_bs, max_running_req
    small = _llm(tiny_models["llama3"], cuda_graph_max_bs=6)  # below max_running_req: as asked
    assert small.scheduler.engine.graph_runner.max_bs == 4
    with pytest.raises(ValueError, match="cuda_graph_max_bs"):
        EngineConfig("x", cuda_graph_max_bs=-1)


def test_triton_backend_keeps_decode_metadata_in_the_graph_buffers(tiny_models) -> None:
    """After init_graph_buffers a decode batch's lengths are written where a captured graph reads
    them (one buffer, whatever the batch); a prefill's are not."""
    from minisgl.attention import create_attention_backend
    from minisgl.core import Batch, Req, SamplingParams
    from minisgl.models.config import ModelConfig
    from minisgl.utils.hf import read_hf_config

    config = ModelConfig.from_dict(read_hf_config(tiny_models["llama3"]))
    backend = create_attention_backend("triton", config, "cpu")
    backend.init_graph_buffers(8)
    reqs = [Req(i, [1] * (i + 2), SamplingParams(), table_idx=i) for i in range(3)]
    for r in reqs:
        r.complete_forward()
        r.append(7)  # one new token each: a decode step
    decode = Batch(reqs, "decode")
    backend.prepare_metadata(decode)
    meta = decode.attn_metadata
    buffers = backend._graph_lens
    assert meta.rows.data_ptr() == buffers[0].data_ptr()
    assert meta.seq_lens.data_ptr() == buffers[3].data_ptr()
    assert buffers[3, :3].tolist() == [3, 4, 5] and buffers[0, :3].tolist() == [0, 1, 2]
    prefill = Batch([Req(9, [1, 2, 3], SamplingParams(), table_idx=4)], "prefill")
    backend.prepare_metadata(prefill)
    assert prefill.attn_metadata.rows.data_ptr() != buffers[0].data_ptr()
    assert buffers[3, :3].tolist() == [3, 4, 5]  # untouched by the prefill


@on_cuda
@pytest.mark.parametrize("family", ["llama3", "qwen3", "qwen2bytes"])
def test_cuda_graphs_give_the_same_tokens(tiny_models, family: str) -> None:
    """float32 on the GPU: graphs on equal graphs off equal transformers."""
    llm = _llm(tiny_models[family], device="cuda")
    assert llm.scheduler.engine.graph_runner.graphs  # captured
    ours = _generate(llm, [greedy(12)] * len(PROMPTS))
    assert ours == _generate(
        _llm(tiny_models[family], device="cuda", cuda_graph_max_bs=0), [greedy(12)] * len(PROMPTS)
    )
    assert ours == hf_greedy(tiny_models[family], PROMPTS, 12)


def test_every_padded_step_runs_a_full_batch(tiny_models) -> None:
    """Every step the runner gets holds its padded size in tokens, the dummy rows at position 0
    writing the dummy slot, and the engine hands back one token per real request; the dummy
    request is never advanced (on a CPU a lost padding row would not change the tokens)."""
    from minisgl.engine.graph import padded_size

    llm = _llm(tiny_models["llama3"], cuda_graph_max_bs=8)
    engine, runner = llm.scheduler.engine, llm.scheduler.engine.graph_runner
    dummy_slot = engine.num_pages * engine.config.page_size
    seen: List[tuple] = []
    runner_forward, forward_batch = runner.forward, engine.forward_batch

    def checked(batch: Any) -> Any:
        n = sum(r is not engine.dummy_req for r in batch.reqs)
        assert batch.size == padded_size(runner.sizes, n) == batch.input_ids.shape[0]
        assert batch.positions[n:].tolist() == [0] * (batch.size - n)
        assert batch.out_loc[n:].tolist() == [dummy_slot] * (batch.size - n)
        seen.append((n, batch.size))
        return runner_forward(batch)

    def counted(batch: Any, *rest: Any) -> Any:  # rest: a later chapter's arguments
        tokens = forward_batch(batch, *rest)
        assert tokens.shape == (batch.size,)  # the padded rows' logits were cut off
        return tokens

    runner.forward, engine.forward_batch = checked, counted
    _generate(llm)
    assert sum(n < size for n, size in seen) >= 2  # several padded steps, not only the first
    assert (engine.dummy_req.cached_len, engine.dummy_req.device_len) == (0, 1)


@on_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_rms_norm_is_the_formula(dtype: torch.dtype) -> None:
    """On CUDA rms_norm is one fused kernel of torch's; it computes the CPU formula (float32
    inside, rounded to the model's dtype before the weight), strided q heads included."""
    from minisgl.layers.norm import rms_norm

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, 6, 64, generator=gen).to(dtype)[:, 1:5]  # heads of a wider tensor
    weight = (1 + torch.randn(64, generator=gen) / 4).to(dtype)
    ref = rms_norm(x, weight, 1e-6)
    out = rms_norm(x.cuda(), weight.cuda(), 1e-6).cpu()
    tol = {"atol": 1e-6, "rtol": 1e-6} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 1e-2}
    torch.testing.assert_close(out, ref, **tol)
