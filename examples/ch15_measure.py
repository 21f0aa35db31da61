"""Chapter 15: measure first. The workload every GPU figure of the book uses, the bandwidth floor
of a decode step, the latencies an online client sees, and where a step's time goes.

The functions here are the chapter's arithmetic; benchmark/offline.py and benchmark/online.py
import them, so the book's figures and its tests rest on the same lines.
"""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import torch

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.models import ModelConfig

_QWEN3 = dict(
    architectures=["Qwen3ForCausalLM"],
    model_type="qwen3",
    hidden_act="silu",
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    max_position_embeddings=40960,
    attention_bias=False,
    bos_token_id=151643,
    eos_token_id=151645,
    torch_dtype="bfloat16",
)
# a model's shape is its config.json: these are the real models' (their weights are not needed)
SHAPES: Dict[str, Dict[str, Any]] = {
    "qwen3-0.6b": {
        **_QWEN3,
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
    },
    "qwen3-30b-a3b": {
        **_QWEN3,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "tie_word_embeddings": False,
    },
    "llama3-8b": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        hidden_act="silu",
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        attention_bias=False,
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_id=128001,
        torch_dtype="bfloat16",
    ),
    # Qwen3's layout at a size a CPU runs in seconds; its vocabulary holds the workload's ids
    "tiny": {
        **_QWEN3,
        "vocab_size": 10240,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    },
}


def write_shape(name: str, directory: str | Path) -> Path:
    """A model directory holding only the config.json of shape ``name``."""
    path = Path(directory) / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(SHAPES[name], indent=2))
    return path


def nano_vllm_workload(num_seqs: int = 256) -> Tuple[List[List[int]], List[SamplingParams]]:
    """nano-vllm's bench.py, draw for draw: 256 prompts of 100..1024 random ids in 0..10000, then
    256 output lengths in 100..1024, sampled at temperature 0.6 past EOS. The first ``num_seqs``."""
    random.seed(0)  # the global generator, as bench.py seeds it: the same draws in the same order
    prompts = [
        [random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(256)
    ]
    params = [
        SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=random.randint(100, 1024))
        for _ in range(256)
    ]
    return prompts[:num_seqs], params[:num_seqs]


def decode_weight_params(c: ModelConfig) -> int:
    """Parameters one decode step reads: every layer's, the final norm and the LM head, but not
    an untied input embedding, of which a step reads only its batch's rows (a tied one is the LM
    head itself). An MoE layer counts every expert: a large batch touches them all."""
    h, d = c.hidden_size, c.head_dim
    qkv = (c.num_qo_heads + 2 * c.num_kv_heads) * d
    attn = h * qkv + c.num_qo_heads * d * h  # q, k, v and o
    attn += qkv * c.attention_bias + h * c.o_proj_bias + 2 * d * c.qk_norm
    dense = 3 * h * c.intermediate_size  # gate, up, down
    moe = c.num_experts * 3 * h * c.moe_intermediate_size + h * c.num_experts  # and the router
    layers = sum(attn + 2 * h + (moe if c.is_moe_layer(i) else dense) for i in range(c.num_layers))
    return layers + h + c.vocab_size * h


def weight_bytes(config: Dict[str, Any], dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of the weights one decode step reads, in ``dtype``."""
    return decode_weight_params(ModelConfig.from_dict(config)) * _element_size(dtype)


def kv_bytes_per_token(config: Dict[str, Any], dtype: torch.dtype = torch.bfloat16) -> int:
    """K and V of one token in every layer."""
    c = ModelConfig.from_dict(config)
    return 2 * c.num_layers * c.num_kv_heads * c.head_dim * _element_size(dtype)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def decode_context_tokens(input_lens: Sequence[int], output_lens: Sequence[int]) -> int:
    """KV entries that all decode steps of a workload read, whatever the batching: the prefill
    gives a request its first token, then its k-th decode step (k = 1 .. out - 1) attends over
    its prompt and k generated tokens."""
    return sum((o - 1) * i + (o - 1) * o // 2 for i, o in zip(input_lens, output_lens))


def decode_floor_s(
    weights: int, kv_per_token: int, context_tokens: float, hbm_bytes_per_s: float
) -> float:
    """The bandwidth floor of one decode step: it reads every weight once and the K and V of
    ``context_tokens`` tokens (the batch's contexts, summed), no faster than the memory allows."""
    return (weights + kv_per_token * context_tokens) / hbm_bytes_per_s


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), interpolated linearly between the two nearest ranks (numpy's
    default): of [1, 2, 3, 4], p50 is 2.5 and p90 is 3.7."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def request_latencies(sent: float, first: float, last: float, num_tokens: int) -> Dict[str, float]:
    """What a streaming client sees of one request sent at ``sent``, whose first token arrived at
    ``first`` and its last (the ``num_tokens``-th) at ``last``: TTFT, the time to the first token;
    TPOT, the mean time per output token after it (0 for one token); E2E, the whole request."""
    tpot = (last - first) / (num_tokens - 1) if num_tokens > 1 else 0.0
    return {"ttft": first - sent, "tpot": tpot, "e2e": last - sent}


def show_workload() -> None:
    prompts, params = nano_vllm_workload()
    ins = [len(p) for p in prompts]
    outs = [p.max_tokens for p in params]
    print(
        f"nano-vllm's workload: {len(prompts)} sequences, {sum(ins):,} input and "
        f"{sum(outs):,} output tokens"
    )
    print(
        f"  input lengths {min(ins)}..{max(ins)} (mean {sum(ins) / len(ins):.1f}), "
        f"output lengths {min(outs)}..{max(outs)} (mean {sum(outs) / len(outs):.1f})"
    )
    print(f"  first prompt: {ins[0]} ids starting {prompts[0][:5]}, max_tokens {outs[0]}")
    print(f"  decode steps read {decode_context_tokens(ins, outs):,} cached tokens in all")


@dataclass
class Floor:
    """The bandwidth floor of a workload's mean decode step, with every sequence running at once
    from the start: ``steps`` decode steps of ``sequences`` sequences and ``context`` cached
    tokens on average, each reading every weight and that many tokens' K and V."""

    weights: int  # bytes a step reads of the weights
    kv_per_token: int  # bytes of K and V a cached token adds to a step's reads
    steps: int
    sequences: float
    context: float
    step_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.sequences / self.step_s


def workload_floor(config: Dict[str, Any], hbm_gbps: float = 4800.0) -> Floor:
    """The floor of nano-vllm's workload for a model of this shape, in bf16: the one method every
    floor of the book uses (an MoE shape counts every expert: at these batches a step touches
    nearly all of them)."""
    prompts, params = nano_vllm_workload()
    weights, kv = weight_bytes(config), kv_bytes_per_token(config)
    ins, outs = [len(p) for p in prompts], [p.max_tokens for p in params]
    steps = max(outs) - 1  # decode steps when all 256 run together from the start
    context = decode_context_tokens(ins, outs) / steps
    return Floor(
        weights,
        kv,
        steps,
        (sum(outs) - len(outs)) / steps,
        context,
        decode_floor_s(weights, kv, context, hbm_gbps * 1e9),
    )


def show_floor(hbm_gbps: float = 4800.0) -> None:
    """The floor for Qwen3-0.6B on an H200 with every sequence running at once: the mean decode
    step of the workload, if all 256 decoded together through their longest output."""
    f = workload_floor(SHAPES["qwen3-0.6b"], hbm_gbps)
    print(
        f"\nqwen3-0.6b in bf16: {f.weights / 1e9:.3f} GB of weights, {f.kv_per_token:,} bytes "
        "of KV a token"
    )
    print(
        f"  all 256 together: {f.steps} decode steps, {f.sequences:.1f} sequences and "
        f"{f.context:,.0f} cached tokens a step on average"
    )
    print(
        f"  floor of the mean step at {hbm_gbps:,.0f} GB/s: {f.step_s * 1e3:.3f} ms, "
        f"{f.tokens_per_s:,.0f} output tokens/s"
    )


def show_latencies() -> None:
    sent, arrivals = 0.0, [0.25, 0.30, 0.36, 0.40, 0.45]  # seconds: one request's five tokens
    one = request_latencies(sent, arrivals[0], arrivals[-1], len(arrivals))
    print("\none streamed request:", {k: round(v, 4) for k, v in one.items()})
    ttfts = [0.12, 0.08, 0.30, 0.11, 0.09, 0.10, 0.95, 0.13, 0.10, 0.12]
    print(
        "TTFT of ten requests: p50",
        round(percentile(ttfts, 50), 4),
        "p90",
        round(percentile(ttfts, 90), 4),
        "p99",
        round(percentile(ttfts, 99), 4),
    )


def show_breakdown(directory: str) -> None:
    """A profiled run of the tiny shape on the CPU: which phases were timed, and how often."""
    llm = LLM(
        str(write_shape("tiny", directory)),
        device="cpu",
        dummy_weights=True,
        page_size=16,
        num_pages=256,
        max_extend_tokens=1024,
        profile_steps=True,
    )
    prompts, params = nano_vllm_workload(4)
    short = [
        SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=p.max_tokens // 32)
        for p in params
    ]  # the first 4 sequences, outputs cut to a 32nd
    out = llm.generate(prompts, short)
    timer = llm.scheduler.engine.timer
    print(
        f"\nthe tiny shape, 4 sequences ({[len(p) for p in prompts]} prompt tokens, "
        f"{[len(o['token_ids']) for o in out]} output tokens), profile_steps=True:"
    )
    for name, count in timer.counts.items():
        print(f"  {name:16s} timed {count:3d} times")
    print("  text without a tokenizer:", out[0]["text"])
    llm.shutdown()


def main() -> None:
    show_workload()
    show_floor()
    show_latencies()
    with tempfile.TemporaryDirectory() as tmp:
        show_breakdown(tmp)


if __name__ == "__main__":
    main()
