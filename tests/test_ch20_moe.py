"""Chapter 20: MoE routing, sorting and padding by expert, the reference backend against a literal
loop and against transformers' MoE block, the Triton fused MoE against the reference (Triton's
interpreter on a CPU; on CUDA at Qwen3-30B-A3B's shape), and tiny Qwen3-MoE models through
``LLM`` token for token equal to transformers (``norm_topk_prob`` true and false)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from typing import Any, List

import pytest
import torch
import torch.nn.functional as F
from helpers import ROOT, build_llm, encode, greedy, hf_greedy, hf_model

CUDA = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # conftest sets it on a machine w/o GPU


def _version(package: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", importlib.metadata.version(package)).groups()
    return int(major), int(minor)


def _why_the_interpreter_fails() -> str:
    """Why Triton's interpreter here cannot run the kernel ('' where it can). Up to 3.6 it makes
    a loop bound (``range(tl.cdiv(K, BLOCK_K))``) an int by int() of a one-element array, which
    NumPy 2.4 refuses (a TypeError). On CUDA the kernel is compiled and this does not matter."""
    if not HAS_TRITON or _version("triton") >= (3, 7) or _version("numpy") < (2, 4):
        return ""
    return (f"Triton {importlib.metadata.version('triton')}'s interpreter cannot run the kernel "
            f"with NumPy {importlib.metadata.version('numpy')} (it takes int() of a one-element "
            "array, which NumPy 2.4 refuses): the CPU path needs Triton >= 3.7 (pyproject.toml)")


INTERPRETER_FAILS = _why_the_interpreter_fails()
# in this process the fused kernel runs on a CPU only in the interpreter, on a GPU only compiled
_NOT_HERE = ("needs Triton: compiled on CUDA or interpreted on a CPU"
             if not HAS_TRITON or not (CUDA or INTERPRETED)
             else INTERPRETER_FAILS if INTERPRETED else "")
_NOT_ON_CPU = ("runs on the CPU: needs Triton's interpreter" if not (HAS_TRITON and INTERPRETED)
               else INTERPRETER_FAILS)
fused_here = pytest.mark.skipif(bool(_NOT_HERE), reason=_NOT_HERE)
interpreted = pytest.mark.skipif(bool(_NOT_ON_CPU), reason=_NOT_ON_CPU)
on_cuda = pytest.mark.skipif(not (CUDA and HAS_TRITON), reason="needs CUDA and Triton")
DEVICE = "cuda" if CUDA else "cpu"


def _weights(num_experts: int, hidden: int, inter: int, device: str = "cpu",
             dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Random expert weights w1 [E, 2I, H], w2 [E, H, I], scaled so activations stay near 1."""
    w1 = torch.randn(num_experts, 2 * inter, hidden, device=device) / hidden ** 0.5
    w2 = torch.randn(num_experts, hidden, inter, device=device) / inter ** 0.5
    return w1.to(dtype), w2.to(dtype)


def _literal_moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, gating: torch.Tensor,
                 topk: int, renormalize: bool) -> torch.Tensor:
    """Token by token, expert by expert, straight from the definition."""
    inter = w2.shape[2]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        probs = torch.softmax(gating[t].double(), dim=-1)
        chosen = sorted(range(len(probs)), key=lambda e: -probs[e].item())[:topk]
        total = sum(probs[e].item() for e in chosen)
        for e in chosen:
            weight = probs[e].item() / (total if renormalize else 1.0)
            gate, up = w1[e, :inter] @ x[t], w1[e, inter:] @ x[t]
            out[t] += weight * (w2[e] @ (F.silu(gate) * up))
    return out


# ---- routing --------------------------------------------------------------------------------


@pytest.mark.parametrize("renormalize", [True, False])
def test_select_experts_softmax_then_topk(renormalize: bool) -> None:
    from minisgl.moe.base import select_experts

    torch.manual_seed(1)
    gating = torch.randn(9, 8, dtype=torch.bfloat16)
    weights, ids = select_experts(gating, 3, renormalize)
    assert weights.dtype == torch.float32 and ids.shape == (9, 3)
    probs = torch.softmax(gating.float(), dim=-1)
    for t in range(9):
        order = sorted(range(8), key=lambda e: -probs[t, e].item())
        assert ids[t].tolist() == order[:3]  # the largest first
        expected = probs[t, order[:3]]
        if renormalize:
            expected = expected / expected.sum()
        torch.testing.assert_close(weights[t], expected)
    sums = weights.sum(dim=-1)
    assert torch.allclose(sums, torch.ones(9)) == renormalize


# ---- sorting and padding --------------------------------------------------------------------


def test_moe_align_block_size_the_pages_example() -> None:
    from minisgl.moe.fused import moe_align_block_size

    ids = torch.tensor([[4, 3], [6, 1], [1, 7], [6, 4], [5, 4]])
    sorted_ids, expert_ids = moe_align_block_size(ids, block_m=4, num_experts=8)
    assert sorted_ids.tolist() == [3, 4, 10, 10, 1, 10, 10, 10, 0, 7, 9, 10, 8, 10, 10, 10,
                                   2, 6, 10, 10, 5, 10, 10, 10]
    assert expert_ids.tolist() == [1, 3, 4, 5, 6, 7]
    assert sorted_ids.dtype == expert_ids.dtype == torch.int32


def _literal_align(flat: List[int], block_m: int, num_experts: int) -> tuple[list, list]:
    sorted_ids: list[int] = []
    expert_ids: list[int] = []
    for e in range(num_experts):
        pairs = [i for i, x in enumerate(flat) if x == e]
        tiles = -(-len(pairs) // block_m)
        sorted_ids += pairs + [len(flat)] * (tiles * block_m - len(pairs))
        expert_ids += [e] * tiles
    return sorted_ids, expert_ids


@pytest.mark.parametrize("tokens, topk, num_experts, block_m", [
    (1, 1, 8, 16), (3, 2, 8, 4), (17, 2, 8, 16), (64, 8, 128, 16), (40, 4, 6, 1)])
def test_moe_align_block_size_against_a_literal_loop(tokens, topk, num_experts, block_m) -> None:
    from minisgl.moe.base import select_experts
    from minisgl.moe.fused import moe_align_block_size

    torch.manual_seed(tokens)
    _, ids = select_experts(torch.randn(tokens, num_experts), topk, True)
    sorted_ids, expert_ids = moe_align_block_size(ids, block_m, num_experts)
    assert (sorted_ids.tolist(), expert_ids.tolist()) == _literal_align(
        ids.flatten().tolist(), block_m, num_experts)


# ---- the reference backend ------------------------------------------------------------------


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("topk", [1, 2, 3])
def test_reference_backend_against_a_literal_loop(topk: int, renormalize: bool) -> None:
    from minisgl.moe.torch_backend import TorchMoeBackend

    torch.manual_seed(topk)
    x, gating = torch.randn(11, 24), torch.randn(11, 6)
    w1, w2 = _weights(6, 24, 10)
    out = TorchMoeBackend().forward(x, w1, w2, gating, topk, renormalize)
    torch.testing.assert_close(out, _literal_moe(x, w1, w2, gating, topk, renormalize))


def _moe_mlp_and_hf_block(path: Any, layer: int) -> tuple[Any, Any]:
    from minisgl.models import load_model

    return load_model(path).model.layers[layer].mlp, hf_model(path).model.layers[layer].mlp


@pytest.mark.parametrize("family, layer", [("qwen3moe", 0), ("qwen3moe_nonorm", 1)])
@pytest.mark.parametrize("backend", ["torch", pytest.param("fused", marks=interpreted)])
def test_moe_mlp_matches_transformers_block(tiny_models, family, layer, backend) -> None:
    """MoEMLP (router + MoELayer) with either backend against transformers' sparse MoE block:
    norm_topk_prob true and false, the weights as the loader packed them."""
    from minisgl.core import Context, use_global_ctx
    from minisgl.models.utils import MoEMLP
    from minisgl.moe import create_moe_backend

    ours, theirs = _moe_mlp_and_hf_block(tiny_models[family], layer)
    assert isinstance(ours, MoEMLP)
    assert ours.experts.renormalize is (family == "qwen3moe")
    torch.manual_seed(0)
    x = torch.randn(13, 64)
    with torch.inference_mode():
        expected = theirs(x[None])
        expected = (expected[0] if isinstance(expected, tuple) else expected)[0]
        with use_global_ctx(Context(moe_backend=create_moe_backend("cpu", backend))):
            got = ours.forward(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_moe_mlp_weights_and_which_layers_have_experts(tiny_models) -> None:
    from minisgl.models import load_model
    from minisgl.models.utils import GatedMLP, MoEMLP

    model = load_model(tiny_models["qwen3moe_nonorm"])  # mlp_only_layers=[0]
    dense, moe = (layer.mlp for layer in model.model.layers)
    assert isinstance(dense, GatedMLP) and isinstance(moe, MoEMLP)
    shapes = {k: tuple(v.shape) for k, v in moe.state_dict().items()}
    assert shapes == {"experts.gate_up_proj": (8, 64, 64), "experts.down_proj": (8, 64, 32),
                      "gate.weight": (8, 64)}  # no _comm: underscored names are not weights
    assert (moe.experts.top_k, moe.experts.num_experts, moe.experts.tp_size) == (2, 8, 1)


def test_engine_creates_the_moe_backend(tiny_models) -> None:
    from minisgl.moe import MOE_BACKENDS, TorchMoeBackend, create_moe_backend

    sync_free = importlib.util.find_spec("minisgl.moe.sync_free") is not None  # a later one
    names = ["fused", "sync_free", "torch"] if sync_free else ["fused", "torch"]
    assert isinstance(create_moe_backend("cpu"), TorchMoeBackend)
    assert MOE_BACKENDS.names() == names
    known = ", ".join(names)
    with pytest.raises(ValueError, match=f"unknown MoE backend 'grouped'; known: {known}"):
        create_moe_backend("cpu", "grouped")
    if HAS_TRITON:
        from minisgl.moe.fused import FusedMoeBackend

        assert isinstance(create_moe_backend("cuda", "fused"), FusedMoeBackend)
        auto = type(create_moe_backend("cuda")).__name__  # the best one on a GPU
        assert auto == ("SyncFreeMoeBackend" if sync_free else "FusedMoeBackend")
    llm = build_llm(tiny_models["qwen3moe"])
    assert isinstance(llm.scheduler.engine.ctx.moe_backend, TorchMoeBackend)
    llm.shutdown()


# ---- the fused backend ----------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="Triton is not installed (there is no Triton package for macOS)")
@pytest.mark.skipif(bool(INTERPRETER_FAILS), reason=INTERPRETER_FAILS or "-")
def test_fused_triton_moe_in_interpreter():
    code = """
import torch
from minisgl.moe.fused import FusedMoeBackend, moe_align_block_size
from minisgl.moe.torch_backend import TorchMoeBackend
torch.manual_seed(0)
x, g = torch.randn(37, 64), torch.randn(37, 8)
w1, w2 = torch.randn(8, 96, 64) * 0.1, torch.randn(8, 64, 48) * 0.1
a = FusedMoeBackend().forward(x, w1, w2, g, 2, True)
b = TorchMoeBackend().forward(x, w1, w2, g, 2, True)
print((a - b).abs().max().item())
"""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout.strip()) < 1e-5


@fused_here
@pytest.mark.parametrize("tokens, topk, block_m, renormalize", [
    (1, 1, 16, True), (3, 2, 16, False), (17, 2, 4, True), (17, 1, 16, False), (33, 2, 16, True)])
def test_fused_matches_the_reference(tokens, topk, block_m, renormalize) -> None:
    """Odd token counts, top-1 and top-2 of 8 experts, H=40 and 2I=40 (not multiples of the
    32-wide tiles), experts with no token; fp32 on the CPU, so within rounding."""
    from minisgl.moe.fused import FusedMoeBackend
    from minisgl.moe.torch_backend import TorchMoeBackend

    torch.manual_seed(tokens * 10 + topk)
    x, gating = torch.randn(tokens, 40, device=DEVICE), torch.randn(tokens, 8, device=DEVICE)
    w1, w2 = _weights(8, 40, 20, DEVICE)
    got = FusedMoeBackend(block_m).forward(x, w1, w2, gating, topk, renormalize)
    want = TorchMoeBackend().forward(x, w1, w2, gating, topk, renormalize)
    tol = 1e-5 if not CUDA else 2e-2  # on a GPU tl.dot's fp32 inputs go through TF32
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@on_cuda
@pytest.mark.parametrize("tokens", [1, 2, 7, 64, 129, 1000, 4096, 8192])
def test_fused_at_qwen3_30b_a3b_shape(tokens: int) -> None:
    """E=128, top-8, H=2048, I=768 in bf16, against the reference in fp32 on the same values."""
    from minisgl.moe.fused import FusedMoeBackend
    from minisgl.moe.torch_backend import TorchMoeBackend

    torch.manual_seed(tokens)
    w1, w2 = _weights(128, 2048, 768, "cuda", torch.bfloat16)
    x = torch.randn(tokens, 2048, device="cuda", dtype=torch.bfloat16)
    gating = torch.randn(tokens, 128, device="cuda")
    got = FusedMoeBackend().forward(x, w1, w2, gating, 8, True)
    want = TorchMoeBackend().forward(x.float(), w1.float(), w2.float(), gating, 8, True)
    assert got.dtype == torch.bfloat16 and got.shape == (tokens, 2048)
    err = (got.float() - want).abs().max().item() / want.abs().max().item()
    assert err < 2e-2, f"max error {err:.2e} of the largest output"


# ---- end to end -----------------------------------------------------------------------------


def test_tiny_qwen3_moe_matches_hf(tiny_models):
    path = tiny_models["qwen3moe"]
    llm = build_llm(path)
    prompts = ["hello world", "The quick brown fox"]
    out = llm.generate(prompts, greedy(10))
    assert [o["token_ids"] for o in out] == hf_greedy(path, prompts, 10)
    llm.shutdown()


def test_tiny_qwen3_moe_without_renormalization_matches_hf(tiny_models) -> None:
    """norm_topk_prob=False (the Hugging Face default) and a dense first layer."""
    path = tiny_models["qwen3moe_nonorm"]
    llm = build_llm(path)
    prompts = ["Once upon a time", "hello world", [5, 9, 2, 6, 5, 3, 5]]
    out = llm.generate(prompts, greedy(12))
    assert [o["token_ids"] for o in out] == hf_greedy(path, prompts, 12)
    llm.shutdown()


@interpreted
def test_tiny_qwen3_moe_with_the_fused_backend_matches_hf(tiny_models) -> None:
    """The engine with the fused backend in place of the reference (Triton's interpreter)."""
    from minisgl.moe.fused import FusedMoeBackend

    path = tiny_models["qwen3moe"]
    llm = build_llm(path)
    llm.scheduler.engine.ctx.moe_backend = FusedMoeBackend()
    prompts = ["The quick brown fox", [7, 7, 1, 2]]
    out = llm.generate(prompts, greedy(6))
    assert [o["token_ids"] for o in out] == hf_greedy(path, prompts, 6)
    llm.shutdown()


def test_llama3_long_context_rope_matches_hf(tiny_models) -> None:
    """Chapter 2's Llama 3 rope scaling through the whole engine (paged KV cache, chunked
    prefill, the decode path), past the tiny model's original 64 positions."""
    path = tiny_models["llama3"]
    prompt = encode(path, "The quick brown fox jumps over the lazy dog. " * 8)
    assert len(prompt) > 64
    llm = build_llm(path)
    out = llm.generate([prompt], greedy(8))
    assert [o["token_ids"] for o in out] == hf_greedy(path, [prompt], 8)
    llm.shutdown()


def test_tp2_qwen3_moe_matches_hf(tiny_models) -> None:
    """Two ranks over gloo: each holds half of every expert's intermediate dimension and the
    whole router; the all-reduce at the end of each MoE layer adds the halves. The model without
    renormalization has a dense layer too, so both kinds of MLP run split."""
    from minisgl.llm import LLM

    path = tiny_models["qwen3moe_nonorm"]
    prompts = ["The quick brown fox", [3, 1, 4, 1, 5, 9, 2, 6], "hello world"]
    llm = LLM(str(path), tp_size=2, device="cpu", page_size=4, num_pages=128,
              max_running_req=4, max_extend_tokens=16)
    try:
        out = llm.generate(prompts, greedy(8))
    finally:
        llm.shutdown()
    assert [o["token_ids"] for o in out] == hf_greedy(path, prompts, 8)
