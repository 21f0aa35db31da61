"""Chapter 1: ops without nn.Module, each held against its torch / transformers counterpart."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from minisgl.layers.base import BaseOP
from minisgl.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from minisgl.layers.linear import (
    LinearColParallel,
    LinearColParallelMerged,
    LinearQKVMerged,
    LinearReplicated,
    LinearRowParallel,
)
from minisgl.layers.norm import RMSNorm, RMSNormFused
from minisgl.utils.misc import div_ceil, div_even


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-6) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=tol, atol=tol)


# ---- utils ----------------------------------------------------------------------------------


def test_div_even_and_div_ceil():
    assert div_even(12, 4) == 3 and div_even(0, 3) == 0
    with pytest.raises(ValueError, match="10 is not evenly divisible by 4"):
        div_even(10, 4)
    with pytest.raises(ValueError):
        div_even(4, 0)
    assert [div_ceil(a, 4) for a in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


# ---- BaseOP ---------------------------------------------------------------------------------


class _Leaf(BaseOP):
    def __init__(self, n: int):  # no super().__init__(): BaseOP does not need it
        self.weight = torch.empty(n, 2)
        self.bias = None  # an absent weight: ignored
        self.size = n  # not a tensor: ignored


class _Tree(BaseOP):
    def __init__(self):
        self.embed = _Leaf(3)
        self.layers = [_Leaf(4), _Leaf(5)]
        self.scale = torch.empty(1)
        self._cache = torch.empty(7)  # private: never saved or loaded


def test_state_dict_walks_attributes():
    tree = _Tree()
    sd = tree.state_dict()
    assert list(sd) == ["embed.weight", "layers.0.weight", "layers.1.weight", "scale"]
    assert sd["layers.1.weight"] is tree.layers[1].weight  # the op's own tensors, not copies
    assert list(tree.state_dict("model")) == ["model." + k for k in sd]


def test_load_state_dict_copies_in_place_and_converts_dtype():
    tree = _Tree()
    state = {k: torch.randn(v.shape, dtype=torch.float64) for k, v in tree.state_dict().items()}
    before = tree.layers[0].weight
    tree.load_state_dict(state)
    assert tree.layers[0].weight is before  # filled in place
    for key, tensor in tree.state_dict().items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, state[key].float())
    streamed = ((k, v + 1) for k, v in state.items())  # a checkpoint arrives as a stream
    tree.load_state_dict(streamed)
    assert torch.equal(tree.layers[1].weight, (state["layers.1.weight"] + 1).float())
    prefixed = {f"m.{k}": v * 2 for k, v in state.items()}
    tree.load_state_dict(prefixed, prefix="m")
    assert torch.equal(tree.scale, (state["scale"] * 2).float())


def test_load_state_dict_errors_name_the_problem():
    tree = _Tree()
    state = {k: torch.zeros(v.shape) for k, v in tree.state_dict().items()}
    missing = {k: v for k, v in state.items() if k != "layers.1.weight"}
    with pytest.raises(ValueError, match=r"missing weights.*'layers\.1\.weight'"):
        tree.load_state_dict(missing)
    with pytest.raises(ValueError, match=r"unexpected weights.*'layers\.2\.weight'"):
        tree.load_state_dict({**state, "layers.2.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"unexpected weights.*'_cache'"):
        tree.load_state_dict({**state, "_cache": torch.zeros(7)})
    bad = {**state, "embed.weight": torch.zeros(2, 3)}
    with pytest.raises(ValueError, match=r"shape mismatch for 'embed\.weight'.*\(3, 2\).*\(2, 3\)"):
        tree.load_state_dict(bad)


# ---- linear layers --------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [LinearReplicated, LinearColParallel, LinearRowParallel])
@pytest.mark.parametrize("has_bias", [False, True])
def test_linear_matches_nn_linear(cls, has_bias):
    torch.manual_seed(0)
    ref = torch.nn.Linear(48, 24, bias=has_bias)
    op = cls(48, 24, has_bias=has_bias)
    op.load_state_dict(ref.state_dict())
    x = torch.randn(7, 48)
    assert _close(op.forward(x), ref(x).detach())


@settings(max_examples=25, deadline=None, derandomize=True)  # the same examples every run
@given(
    hidden=st.sampled_from([16, 32, 64]),
    head_dim=st.sampled_from([4, 8, 16]),
    kv_heads=st.integers(1, 4),
    group=st.integers(1, 4),
    has_bias=st.booleans(),
    tokens=st.integers(1, 9),
)
def test_qkv_merged_equals_three_projections(hidden, head_dim, kv_heads, group, has_bias, tokens):
    gen = torch.Generator().manual_seed(hidden + head_dim + kv_heads + group + tokens)
    qo_heads = kv_heads * group
    q = torch.nn.Linear(hidden, qo_heads * head_dim, bias=has_bias)
    k = torch.nn.Linear(hidden, kv_heads * head_dim, bias=has_bias)
    v = torch.nn.Linear(hidden, kv_heads * head_dim, bias=has_bias)
    op = LinearQKVMerged(hidden, head_dim, qo_heads, kv_heads, has_bias=has_bias)
    assert op.weight.shape == ((qo_heads + 2 * kv_heads) * head_dim, hidden)
    state = {"weight": torch.cat([q.weight, k.weight, v.weight])}
    if has_bias:
        state["bias"] = torch.cat([q.bias, k.bias, v.bias])
    op.load_state_dict(state)
    x = torch.randn(tokens, hidden, generator=gen)
    oq, ok, ov = op.split(op.forward(x))
    assert _close(oq, q(x).detach(), 1e-5)
    assert _close(ok, k(x).detach(), 1e-5)
    assert _close(ov, v(x).detach(), 1e-5)


def test_gate_up_merged_equals_two_projections():
    torch.manual_seed(1)
    gate, up = torch.nn.Linear(32, 80, bias=False), torch.nn.Linear(32, 80, bias=False)
    op = LinearColParallelMerged(32, [80, 80])
    assert op.weight.shape == (160, 32) and op.output_sizes == [80, 80]
    op.load_state_dict({"weight": torch.cat([gate.weight, up.weight])})
    x = torch.randn(5, 32)
    y = op.forward(x)
    assert _close(y[:, :80], gate(x).detach()) and _close(y[:, 80:], up(x).detach())


# ---- embedding and LM head ------------------------------------------------------------------


def test_embedding_and_lm_head():
    torch.manual_seed(2)
    ref = torch.nn.Embedding(100, 16)
    emb = VocabParallelEmbedding(100, 16)
    emb.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 100, (11,))
    assert torch.equal(emb.forward(ids), ref(ids).detach())

    head = ParallelLMHead(100, 16)
    w = torch.randn(100, 16)
    head.load_state_dict({"weight": w})
    x = torch.randn(4, 16)
    assert _close(head.forward(x), x @ w.T, 1e-5)


def test_tied_lm_head_shares_the_embedding():
    emb = VocabParallelEmbedding(50, 8)
    head = ParallelLMHead(50, 8, tie_to=emb)
    w = torch.randn(50, 8)
    emb.load_state_dict({"weight": w})
    assert head.weight.data_ptr() == emb.weight.data_ptr()  # one storage
    x = torch.randn(3, 8)
    assert _close(head.forward(x), x @ w.T, 1e-5)


# ---- RMSNorm --------------------------------------------------------------------------------


def _hf_norm(weight: torch.Tensor, eps: float) -> LlamaRMSNorm:
    ref = LlamaRMSNorm(weight.shape[0], eps=eps)
    ref.weight.data.copy_(weight)
    return ref


@pytest.mark.parametrize("scale", [1e-3, 1.0, 50.0])
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_rmsnorm_matches_transformers(scale, eps):
    torch.manual_seed(3)
    w = 1 + 0.1 * torch.randn(64)
    norm = RMSNorm(64, eps=eps)
    norm.load_state_dict({"weight": w})
    x = scale * torch.randn(9, 64)
    assert _close(norm.forward(x), _hf_norm(w, eps)(x).detach(), 1e-5)


def test_rmsnorm_epsilon_is_seen_by_the_test_inputs():
    """At small activations a wrong epsilon is far outside the tolerance used above."""
    torch.manual_seed(3)
    w = torch.ones(64)
    norm = RMSNorm(64, eps=1e-5)
    norm.load_state_dict({"weight": w})
    x = 1e-3 * torch.randn(9, 64)
    assert not _close(norm.forward(x), _hf_norm(w, 1e-6)(x).detach(), 1e-3)


def test_rmsnorm_computes_in_float32_for_bfloat16_inputs():
    torch.manual_seed(4)
    w = (1 + 0.1 * torch.randn(64)).bfloat16()
    norm = RMSNorm(64, eps=1e-6)
    norm.weight = norm.weight.bfloat16()
    norm.load_state_dict({"weight": w})
    x = (3 * torch.randn(9, 64)).bfloat16()
    ref = _hf_norm(w.float(), 1e-6).bfloat16()
    out = norm.forward(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, ref(x).detach())


def test_fused_add_rmsnorm():
    torch.manual_seed(5)
    w = 1 + 0.1 * torch.randn(32)
    norm = RMSNormFused(32, eps=1e-6)
    norm.load_state_dict({"weight": w})
    ref = _hf_norm(w, 1e-6)
    x, r = torch.randn(6, 32), torch.randn(6, 32)
    y, new_r = norm.forward(x, r)
    assert torch.equal(new_r, x + r)
    assert _close(y, ref(x + r).detach(), 1e-5)
    y0, r0 = norm.forward(x)  # the first layer: no residual yet
    assert r0 is x and _close(y0, ref(x).detach(), 1e-5)
