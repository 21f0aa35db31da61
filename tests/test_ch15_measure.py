"""Chapter 15: measure first. The workload's exact statistics, random weights made where they are
asked for with no checkpoint read, the step timer (its phases summed, and off by default), the
bandwidth floor against a hand computation, the latency percentiles, and upstream's option
names."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from ch15_measure import (
    SHAPES,
    decode_context_tokens,
    decode_floor_s,
    decode_weight_params,
    kv_bytes_per_token,
    nano_vllm_workload,
    percentile,
    request_latencies,
    weight_bytes,
    write_shape,
)
from helpers import DENSE, greedy

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.models import ModelConfig, create_model, load_model
from minisgl.utils.torch_utils import StepTimer


def _llm(path, **options):
    """helpers.build_llm's small CPU options, and more."""
    return LLM(
        str(path),
        **{
            "device": "cpu",
            "page_size": 4,
            "num_pages": 256,
            "max_running_req": 8,
            "max_extend_tokens": 256,
            **options,
        },
    )


def test_workload_is_nano_vllms():
    prompts, params = nano_vllm_workload()
    assert len(prompts) == len(params) == 256
    assert sum(len(p) for p in prompts) == 142_827
    assert sum(p.max_tokens for p in params) == 133_966
    assert all(
        100 <= len(p) <= 1024 and 100 <= s.max_tokens <= 1024 for p, s in zip(prompts, params)
    )
    assert all(0 <= t <= 10000 for p in prompts for t in p)
    assert all(s.temperature == 0.6 and s.ignore_eos for s in params)
    first, _ = nano_vllm_workload(32)
    assert first == prompts[:32]


def _config_only(tiny_models, family, tmp_path):
    """A model directory with the family's config.json and nothing else."""
    shutil.copy(tiny_models[family] / "config.json", tmp_path / "config.json")
    return tmp_path


def test_dummy_weights_need_no_checkpoint(tiny_models, tmp_path):
    path = _config_only(tiny_models, "qwen3", tmp_path)
    with pytest.raises(FileNotFoundError):
        load_model(path)  # no safetensors: a real load fails
    model = load_model(path, "cpu", torch.bfloat16, dummy=True)
    weights = model.state_dict()
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert {t.device.type for t in weights.values()} == {"cpu"}
    w = weights["model.layers.0.mlp.down_proj.weight"].float()
    assert 0.015 < w.std().item() < 0.025 and abs(w.mean().item()) < 0.005
    again = load_model(path, "cpu", torch.bfloat16, dummy=True).state_dict()
    assert all(torch.equal(weights[k], again[k]) for k in weights)  # seeded
    q, k = (
        weights["model.layers.0.self_attn.q_norm.weight"],
        weights["model.layers.0.self_attn.k_norm.weight"],
    )
    assert not torch.equal(q, k)  # each tensor draws its own values


def test_dummy_weights_made_on_the_device(tiny_models, tmp_path, monkeypatch):
    """Every tensor is created on the asked-for device and filled there: the meta device stands
    for a GPU (a host copy would fail on it), and no safetensors file is opened."""
    import minisgl.models as models

    monkeypatch.setattr(models, "load_weights", lambda *a: pytest.fail("read the checkpoint"))
    path = _config_only(tiny_models, "llama3", tmp_path)
    fills = []
    monkeypatch.setattr(
        torch.Tensor, "normal_", lambda self, *a, **k: fills.append(self.device.type) or self
    )
    monkeypatch.setattr(torch, "Generator", lambda device: _FakeGenerator(device))
    model = load_model(path, "meta", torch.float16, dummy=True)
    weights = model.state_dict()
    assert {t.device.type for t in weights.values()} == {"meta"}
    assert {t.dtype for t in weights.values()} == {torch.float16}
    assert fills and set(fills) == {"meta"} and len(fills) == len(weights)


class _FakeGenerator:
    def __init__(self, device):
        self.device = device

    def manual_seed(self, seed):
        return self


def test_llm_on_config_json_alone_with_upstreams_names(tiny_models, tmp_path):
    path = _config_only(tiny_models, "qwen3", tmp_path)
    llm = LLM(
        str(path),
        device="cpu",
        use_dummy_weight=True,
        max_seq_len_override=96,
        num_page_override=40,
        page_size=4,
        max_extend_tokens=32,
    )
    engine = llm.scheduler.engine
    assert (engine.max_seq_len, engine.num_pages, engine.config.page_size) == (96, 40, 4)
    assert engine.config.dummy_weights and llm.scheduler.config.max_extend_tokens == 32
    out = llm.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=3, ignore_eos=True))
    assert [len(o["token_ids"]) for o in out] == [3, 3]
    assert out[0]["text"] is None  # no tokenizer files: token ids only
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate(["hello"], greedy(2))
    llm.shutdown()
    with pytest.raises(TypeError, match="not both"):
        LLM(str(path), device="cpu", dummy_weights=True, use_dummy_weight=True)


def test_upstream_names_mean_ours(tiny_models):
    """The same run under upstream's names and ours gives the same tokens."""
    path = tiny_models["llama3"]
    small = {"device": "cpu", "page_size": 4, "max_running_req": 8, "max_extend_tokens": 256}
    ours = LLM(str(path), max_seq_len=80, num_pages=30, **small)
    theirs = LLM(str(path), max_seq_len_override=80, num_page_override=30, **small)
    for llm in (ours, theirs):
        assert (llm.scheduler.engine.max_seq_len, llm.scheduler.engine.num_pages) == (80, 30)
    prompts = ["Hello world", "The quick brown fox"]
    assert [o["token_ids"] for o in ours.generate(prompts, greedy(6))] == [
        o["token_ids"] for o in theirs.generate(prompts, greedy(6))
    ]


def test_timer_sums_phases():
    timer = StepTimer(enabled=True)
    clock = iter([1.0, 1.5, 2.0, 2.25, 3.0, 4.0])
    import minisgl.utils.torch_utils as tu

    real = tu.time.perf_counter
    tu.time.perf_counter = lambda: next(clock)
    try:
        for name in ("forward", "sample", "forward"):
            with timer.phase(name):
                pass
    finally:
        tu.time.perf_counter = real
    assert timer.seconds == {"forward": 0.5 + 1.0, "sample": 0.25}
    assert timer.counts == {"forward": 2, "sample": 1}
    with pytest.raises(RuntimeError), timer.phase("sample"):  # a phase that raises still counts
        raise RuntimeError
    assert timer.counts["sample"] == 2
    timer.reset()
    assert timer.seconds == {} and timer.counts == {}


def test_timer_off_costs_nothing(monkeypatch):
    """Off (the default), a phase neither synchronizes nor reads the clock; on a CUDA device it
    synchronizes at both edges of every phase."""
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    cuda = torch.device("cuda")
    off = StepTimer(device=cuda)
    assert not off.enabled and not off.nvtx
    with off.phase("forward"):
        pass
    assert syncs == [] and off.counts == {}
    assert off.phase("forward") is off.phase("sample")  # one shared do-nothing context
    on = StepTimer(enabled=True, device=cuda)
    with on.phase("forward"):
        pass
    assert syncs == [cuda, cuda] and on.counts == {"forward": 1}


def test_nvtx_ranges_without_timing(monkeypatch):
    """nvtx alone names each phase for Nsight Systems, and neither synchronizes nor times."""
    syncs, ranges = [], []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    monkeypatch.setattr(torch.cuda.nvtx, "range", lambda name: ranges.append(name) or _null())
    timer = StepTimer(device=torch.device("cuda"), nvtx=True)
    for name in ("schedule", "forward decode"):
        with timer.phase(name):
            pass
    assert ranges == ["schedule", "forward decode"] and syncs == [] and timer.counts == {}
    assert not StepTimer(device=torch.device("cpu"), nvtx=True).nvtx  # CUDA only


def _null():
    import contextlib

    return contextlib.nullcontext()


def test_engine_phases_per_step(tiny_models):
    """profile_steps times every phase of every step; off by default, nothing is recorded."""
    path = tiny_models["qwen3"]
    llm = _llm(path, profile_steps=True, max_extend_tokens=8)
    llm.generate([list(range(1, 7)), list(range(1, 10))], greedy(4))
    counts = llm.scheduler.engine.timer.counts
    # 8 tokens a prefill: 6 + a chunk of 2, then the other 7; then the two decode 3 steps
    prefills, decodes = 2, 3
    steps = prefills + decodes
    assert counts == {
        "schedule": steps + 1,
        "prepare": steps,
        "forward prefill": prefills,
        "sample": steps,
        "process": steps,
        "forward decode": decodes,
    }
    plain = _llm(path)
    assert not plain.scheduler.engine.timer.enabled
    plain.generate(["Hello world"], greedy(4))
    assert plain.scheduler.engine.timer.counts == {}


@pytest.mark.parametrize("family", DENSE)
def test_decode_weight_params_count_the_model(tiny_models, family):
    """The floor's weight count against the model's own tensors: all of them, once, less an
    untied input embedding."""
    config = json.loads((tiny_models[family] / "config.json").read_text())
    c = ModelConfig.from_dict(config)
    with torch.device("meta"):
        model = create_model(c)
    tensors = {id(t): t.numel() for t in model.state_dict().values()}
    embed = 0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size
    assert decode_weight_params(c) == sum(tensors.values()) - embed


def test_decode_weight_params_moe_against_transformers(tiny_models):
    from transformers import AutoConfig, AutoModelForCausalLM

    path = tiny_models["qwen3moe"]
    hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    c = ModelConfig.from_dict(json.loads((path / "config.json").read_text()))
    embed = c.vocab_size * c.hidden_size
    assert not c.tie_word_embeddings
    assert decode_weight_params(c) == hf.num_parameters() - embed


def test_roofline_by_hand():
    """Qwen3-0.6B in bf16 on an H200, worked by hand: 596,049,920 parameters a step reads
    (28 layers of 6,291,456 q/k/v/o + 256 q/k norm + 2,048 norm + 9,437,184 MLP weights, the
    final norm, the tied 151,936 x 1,024 head), and 2 x 28 x 8 x 128 x 2 = 114,688 KV bytes a
    token. 64 sequences at 1,000 tokens: (1,192,099,840 + 114,688 x 64,000) / 4.8e12 s."""
    config = SHAPES["qwen3-0.6b"]
    per_layer = 6_291_456 + 256 + 2_048 + 9_437_184
    assert (
        decode_weight_params(ModelConfig.from_dict(config))
        == 28 * per_layer + 1_024 + 151_936 * 1_024
        == 596_049_920
    )
    assert weight_bytes(config) == 1_192_099_840
    assert weight_bytes(config, torch.float32) == 2 * 1_192_099_840
    assert kv_bytes_per_token(config) == 114_688
    floor = decode_floor_s(weight_bytes(config), 114_688, 64 * 1_000, 4.8e12)
    assert floor == pytest.approx((1_192_099_840 + 7_340_032_000) / 4.8e12)
    assert floor == pytest.approx(1.7776e-3, rel=1e-4)


def test_decode_context_tokens_against_a_literal_loop():
    ins, outs = [5, 100, 1], [1, 4, 30]
    literal = sum(i + k for i, o in zip(ins, outs) for k in range(1, o))
    assert decode_context_tokens(ins, outs) == literal == 0 + 306 + 464


def test_percentiles_match_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        values = rng.exponential(size=n).tolist()
        for q in (0, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert percentile([4, 1, 3, 2], 50) == 2.5 and percentile([1, 2, 3, 4], 90) == pytest.approx(
        3.7
    )
    with pytest.raises(ValueError):
        percentile([], 50)


def test_request_latencies():
    got = request_latencies(10.0, 10.3, 10.7, 4)  # tokens at 10.3, ..., 10.7: 3 gaps
    assert got == pytest.approx({"ttft": 0.3, "tpot": 0.4 / 3, "e2e": 0.7})
    assert request_latencies(0.0, 0.2, 0.2, 1) == pytest.approx(
        {"ttft": 0.2, "tpot": 0.0, "e2e": 0.2}
    )


def test_shapes_load_as_configs(tmp_path):
    for name in SHAPES:
        c = ModelConfig.from_dict(
            json.loads(write_shape(name, tmp_path).joinpath("config.json").read_text())
        )
        assert c.vocab_size > 10000  # the workload's ids fit every shape
        assert c.dtype == (torch.float32 if name == "tiny" else torch.bfloat16)


def test_sampling_sorts_only_when_a_row_filters(monkeypatch) -> None:
    """The sort behind top-k / top-p costs most of a sampling step on a GPU (this chapter's
    breakdown): a batch where no row asks for either never runs it; one row asking runs it."""
    import torch

    from minisgl.core import SamplingParams
    from minisgl.engine import sample

    calls = []
    real = sample.top_k_top_p_filter
    monkeypatch.setattr(sample, "top_k_top_p_filter", lambda *a: calls.append(1) or real(*a))  # type: ignore[func-returns-value]
    sampler = sample.Sampler(seed=0)
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    plain = [SamplingParams(temperature=0.7), SamplingParams(), SamplingParams(temperature=1.3)]
    args = sample.BatchSamplingArgs.from_params(plain)
    assert not args.any_filter
    sampler.sample(logits, args)
    assert calls == []
    args = sample.BatchSamplingArgs.from_params(plain[:2] + [SamplingParams(top_p=0.9)])
    assert args.any_filter and args.top_p.dtype == torch.float32 and args.top_k.dtype == torch.int64
    sampler.sample(logits, args)
    assert calls == [1]
