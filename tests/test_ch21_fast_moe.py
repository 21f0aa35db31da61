"""Chapter 21: the fast fused MoE. Routing in one kernel and alignment without a host sync against
chapter 20's ``select_experts`` and ``moe_align_block_size``; the gate_up GEMM with SiLU fused and
the down GEMM against torch on the same sorted pairs; the backend's two paths (aligned, decode)
against the reference and a literal loop; the configs per batch size and the tuned file; the
registry; the tiny Qwen3-MoE through ``LLM`` with the sync-free backend equal to transformers.
All in Triton's interpreter on a CPU, on small shapes with edge cases (experts with no token, all
tokens to one expert, T=1, T not a multiple of a block). On CUDA: Qwen3-30B-A3B's shape, CUDA
graphs."""

from __future__ import annotations

import importlib.util
import json
import os
from types import SimpleNamespace
from typing import Any, Callable, Dict, List

import pytest
import torch
import torch.nn.functional as F
from helpers import encode, greedy, hf_greedy
from test_ch20_moe import _literal_moe, _weights  # chapter 20's: in this tree too

CUDA = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # conftest sets it on a machine w/o GPU
interpreted = pytest.mark.skipif(
    not (HAS_TRITON and INTERPRETED), reason="runs on the CPU: needs Triton's interpreter"
)
on_cuda = pytest.mark.skipif(not (CUDA and HAS_TRITON), reason="needs CUDA and Triton")
TOL = dict(rtol=1e-5, atol=1e-6)  # fp32 in the interpreter: numpy's products, ~1e-7 apart


def _gemm(block_n: int, block_k: int, group_m: int = 1) -> Dict[str, int]:
    return dict(BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m, num_warps=4, num_stages=2)


def _aligned(block_m: int, group_m: int = 1) -> Dict[str, Any]:
    """Small tiles, so that H=40 and I=20 are not multiples of them and each GEMM has several."""
    return dict(
        path="aligned", BLOCK_M=block_m, gate_up=_gemm(16, 16, group_m), down=_gemm(16, 16, group_m)
    )


DECODE = dict(path="decode", gate_up=_gemm(16, 16), down=_gemm(16, 16))


def _tail_split(config: Dict[str, Any], split: int) -> Dict[str, Any]:
    return dict(
        config,
        gate_up=dict(config["gate_up"], TAIL_SPLIT=split),
        down=dict(config["down"], TAIL_SPLIT=split),
    )


def _gating(tokens: int, num_experts: int, hot: int | None = None) -> torch.Tensor:
    """Router logits; with ``hot``, that expert's column is far the largest for every token."""
    gating = torch.randn(tokens, num_experts)
    if hot is not None:
        gating[:, hot] += 30.0
    return gating


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


# ---- routing ----------------------------------------------------------------------------------


ROUTE_CASES = [  # tokens, experts, k: T=1, T past a routing block of 16, E not a power of 2,
    (1, 8, 2),
    (16, 8, 2),
    (17, 6, 2),
    (37, 5, 1),
    (33, 6, 6),
    (9, 3, 3),
    (40, 128, 8),
]


@interpreted
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("tokens, num_experts, topk", ROUTE_CASES)
def test_route_matches_select_experts(tokens, num_experts, topk, renormalize) -> None:
    from minisgl.kernel.moe_routing import ROUTE_BLOCK_T, route
    from minisgl.moe.base import select_experts

    torch.manual_seed(tokens * 100 + num_experts)
    gating = _gating(tokens, num_experts)
    weights, ids, block_counts = route(gating, topk, renormalize)
    want_weights, want_ids = select_experts(gating, topk, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert ids.tolist() == want_ids.tolist()
    torch.testing.assert_close(weights, want_weights, rtol=0, atol=1e-6)
    blocks = -(-tokens // ROUTE_BLOCK_T)
    assert block_counts.shape == (blocks, _next_power_of_2(num_experts))
    for b in range(blocks):  # each block's pairs per expert; none for the columns past E
        block_ids = ids[b * ROUTE_BLOCK_T : (b + 1) * ROUTE_BLOCK_T].flatten().long()
        want = torch.bincount(block_ids, minlength=block_counts.shape[1])
        assert block_counts[b].tolist() == want.tolist()


@interpreted
@pytest.mark.parametrize("decode", [False, True])
def test_route_of_large_logits_is_a_stable_softmax(decode: bool) -> None:
    """Logits near 100, as a router can give: exp(100) overflows nothing but exp(200) would, so
    the softmax must subtract each row's largest logit before exp (both routing blocks)."""
    from minisgl.kernel.moe_routing import route
    from minisgl.moe.base import select_experts

    torch.manual_seed(3)
    gating = 100.0 + 5.0 * _gating(20 if not decode else 3, 8)
    weights, ids, _ = route(gating, 2, False, count=not decode)
    want_weights, want_ids = select_experts(gating, 2, False)
    assert ids.tolist() == want_ids.tolist()
    torch.testing.assert_close(weights, want_weights, rtol=0, atol=1e-6)


@interpreted
def test_route_breaks_ties_by_the_lowest_expert_and_handles_a_hot_expert() -> None:
    """Equal logits: the lowest expert first, as a stable sort of the probabilities (torch.topk
    promises no order among ties: on a CPU it gives [2, 4, 1] for the first row); one column far
    the largest: every token's first choice, weight ~1."""
    from minisgl.kernel.moe_routing import route

    gating = torch.tensor(
        [[1.0, 2.0, 2.0, 0.5, 2.0], [0.0, 0.0, 0.0, 0.0, 0.0], [3.0, -1.0, 3.0, 3.0, -1.0]]
    )
    _, ids, _ = route(gating, 3, True)
    assert ids.tolist() == [[1, 2, 4], [0, 1, 2], [0, 2, 3]]
    torch.manual_seed(0)
    weights, ids, block_counts = route(_gating(20, 6, hot=4), 2, False)
    assert (ids[:, 0] == 4).all() and (weights[:, 0] > 0.999).all()
    assert block_counts[0, 4] == 16 and block_counts[1, 4] == 4


# ---- alignment --------------------------------------------------------------------------------


def _check_alignment(
    ids: torch.Tensor,
    num_experts: int,
    block_m: int,
    aligned: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    """Chapter 21's alignment against chapter 20's: the same slots and tiles; the buffers sized
    for the worst case; -1 for every tile past the used ones."""
    from minisgl.kernel.moe_routing import max_tiles
    from minisgl.moe.fused import moe_align_block_size

    sorted_ids, expert_ids, num_padded = aligned
    want_sorted, want_experts = moe_align_block_size(ids, block_m, num_experts)
    used, num_pairs = int(num_padded.item()), ids.numel()
    capacity = max_tiles(num_pairs, num_experts, block_m)
    assert used == want_sorted.numel() and used % block_m == 0
    assert sorted_ids.dtype == expert_ids.dtype == torch.int32
    assert sorted_ids.numel() == capacity * block_m and expert_ids.numel() == capacity
    assert used <= sorted_ids.numel()  # the worst case was large enough
    assert sorted_ids[:used].tolist() == want_sorted.tolist()  # num_pairs in every padding slot
    tiles = used // block_m
    assert expert_ids[:tiles].tolist() == want_experts.tolist()
    assert (expert_ids[tiles:] == -1).all()


def _align_ids(
    ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``align`` for expert ids given here rather than routed by ``route``: each block of
    ROUTE_BLOCK_T tokens' pair count per expert, as ``route`` counts them, then ``align``."""
    import triton

    from minisgl.kernel.moe_routing import ROUTE_BLOCK_T, align

    ids = ids.to(torch.int32).contiguous()
    num_tokens, topk = ids.shape
    block_e = triton.next_power_of_2(num_experts)
    blocks = triton.cdiv(num_tokens, ROUTE_BLOCK_T)
    padded = torch.full((blocks * ROUTE_BLOCK_T, topk), -1, dtype=torch.int32)
    padded[:num_tokens] = ids
    onehot = padded.view(blocks, -1, 1) == torch.arange(block_e)
    return align(ids, onehot.sum(dim=1, dtype=torch.int32), num_experts, block_m)


ALIGN_CASES = {  # name: (ids [T, k], experts, block_m)
    "T=1": ([[3, 1]], 8, 16),
    "all to one expert": ([[2]] * 37, 6, 16),
    "all to one expert, exact tiles": ([[5]] * 32, 6, 16),
    "experts with no token": ([[0, 7], [7, 0], [0, 7]] * 7, 8, 4),
    "every expert one pair": ([[0, 1, 2], [3, 4, 5], [6, 7, 8]], 9, 16),
    "T not a multiple of block_m": ([[t % 5, (t + 2) % 5] for t in range(19)], 5, 8),
    "block_m 1": ([[t % 3, 3] for t in range(17)], 4, 1),
}


@interpreted
@pytest.mark.parametrize("case", ALIGN_CASES)
def test_align_edge_cases_match_chapter_20(case: str) -> None:
    rows, num_experts, block_m = ALIGN_CASES[case]
    ids = torch.tensor(rows)  # int64, as select_experts gives them
    _check_alignment(ids, num_experts, block_m, _align_ids(ids, num_experts, block_m))


@interpreted
@pytest.mark.parametrize(
    "tokens, num_experts, topk, block_m",
    [
        (1, 8, 2, 16),
        (17, 6, 2, 16),
        (40, 128, 8, 16),
        (50, 5, 3, 64),
        (33, 8, 1, 4),
        (600, 6, 2, 16),
    ],
)
def test_route_then_align_matches_chapter_20(tokens, num_experts, topk, block_m) -> None:
    from minisgl.kernel.moe_routing import align, route

    torch.manual_seed(tokens)
    _, ids, block_counts = route(_gating(tokens, num_experts), topk, True)
    _check_alignment(ids, num_experts, block_m, align(ids, block_counts, num_experts, block_m))


@interpreted
@pytest.mark.parametrize("chunk_b, tile_chunk", [(4, 8), (8, 16), (64, 256)])
def test_the_plan_split_over_programs_matches_chapter_20(chunk_b, tile_chunk, monkeypatch) -> None:
    """600 tokens are 38 blocks of 16: in chunks of 4 that is 10 chunks, read by the plan 4 a
    step (the last step part-filled), and 80 tiles, 8 a program; every program's share must
    land where one program would put it."""
    from minisgl.kernel import moe_routing
    from minisgl.kernel.moe_routing import align, route

    monkeypatch.setattr(moe_routing, "PLAN_CHUNK_B", chunk_b)
    monkeypatch.setattr(moe_routing, "PLAN_TILE_CHUNK", tile_chunk)
    torch.manual_seed(1)
    for tokens, num_experts, topk, block_m in ((600, 6, 2, 16), (600, 40, 4, 4)):
        _, ids, block_counts = route(_gating(tokens, num_experts), topk, True)
        _check_alignment(ids, num_experts, block_m, align(ids, block_counts, num_experts, block_m))


def _routings() -> Any:
    """Random routings, and adversarial ones: few experts hot, or every pair a different expert
    (each of them a partly empty tile, the worst case of max_tiles)."""
    from hypothesis import strategies as st

    @st.composite
    def routing(draw: Callable) -> tuple[List[List[int]], int, int]:
        num_experts = draw(st.integers(1, 40))
        topk = draw(st.integers(1, min(num_experts, 4)))
        tokens = draw(st.integers(1, 40))
        block_m = draw(st.sampled_from([1, 2, 4, 16]))
        kind = draw(st.sampled_from(["random", "hot", "spread"]))
        if kind == "spread":  # pair i to expert i mod E
            rows = [[(t * topk + j) % num_experts for j in range(topk)] for t in range(tokens)]
        else:
            top = num_experts if kind == "random" else min(num_experts, 2)
            expert = st.integers(0, top - 1)
            rows = draw(
                st.lists(
                    st.lists(expert, min_size=topk, max_size=topk), min_size=tokens, max_size=tokens
                )
            )
        return rows, num_experts, block_m

    return routing()


@interpreted
def test_alignment_never_needs_more_than_max_tiles() -> None:
    from hypothesis import HealthCheck, given, settings

    from minisgl.kernel.moe_routing import max_tiles
    from minisgl.moe.fused import moe_align_block_size

    @settings(
        max_examples=40,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(_routings())
    def check(case: tuple[List[List[int]], int, int]) -> None:
        rows, num_experts, block_m = case
        ids = torch.tensor(rows, dtype=torch.int32)
        needed = moe_align_block_size(ids, block_m, num_experts)[1].numel()  # chapter 20's tiles
        assert needed <= max_tiles(ids.numel(), num_experts, block_m)  # before a kernel writes
        _check_alignment(ids, num_experts, block_m, _align_ids(ids, num_experts, block_m))

    check()


def test_max_tiles_is_the_worst_case() -> None:
    from minisgl.kernel.moe_routing import max_tiles

    assert max_tiles(1, 128, 16) == 1
    assert max_tiles(8, 128, 16) == 8  # 8 experts, a tile each
    assert max_tiles(16 * 8, 128, 16) == 128  # 128 experts, one pair each
    assert max_tiles(4096 * 8, 128, 64) == 128 + (4096 * 8 - 128) // 64
    assert max_tiles(0, 8, 16) == 1
    for pairs in range(1, 60):  # the worst routing: one pair on each expert but one, the rest
        for experts, block_m in ((1, 4), (3, 1), (5, 4), (8, 16), (128, 16)):  # on that one
            used = min(experts, pairs)
            counts = [1] * (used - 1) + [pairs - used + 1]
            worst = sum(-(-c // block_m) for c in counts)
            assert max_tiles(pairs, experts, block_m) == worst, (pairs, experts, block_m)


# ---- the two GEMMs ----------------------------------------------------------------------------


def _sorted_pairs(
    tokens: int, num_experts: int, topk: int, block_m: int, hot: int | None = None
) -> tuple[torch.Tensor, ...]:
    """A routing (weights [T*k]) and its alignment, and for every used slot its pair and expert
    (the pair is num_pairs in the padding)."""
    from minisgl.kernel.moe_routing import align, route

    weights, ids, block_counts = route(_gating(tokens, num_experts, hot), topk, True)
    sorted_ids, expert_ids, num_padded = align(ids, block_counts, num_experts, block_m)
    used = int(num_padded.item())
    slot_expert = expert_ids.repeat_interleave(block_m)[:used].long()
    return (
        weights.view(-1),
        sorted_ids,
        expert_ids,
        num_padded,
        sorted_ids[:used].long(),
        slot_expert,
    )


GEMM_CASES = [  # tokens, experts, k, block_m, group_m, hot expert
    (1, 8, 2, 16, 1, None),
    (19, 6, 2, 16, 4, None),
    (37, 5, 3, 16, 2, None),
    (21, 6, 2, 4, 3, 2),
    (70, 8, 2, 64, 1, None),
    (150, 4, 2, 32, 2, 1),  # tails of every
    (300, 6, 2, 64, 3, None),
]  # size: of 64 rows, last tiles of 14 to 24 pairs, and 32 to 39
TAIL_SPLITS = [1, 2, 4]  # 2, 4: a last tile computes the half or quarter that holds its pairs


def _gemm_config(group_m: int, block_m: int, split: int) -> Dict[str, Any]:
    if block_m // split < 16 and split > 1:
        pytest.skip("a tile's parts need 16 rows or more (tl.dot's fewest)")
    return dict(_gemm(16, 16, group_m), TAIL_SPLIT=split)


@interpreted
@pytest.mark.parametrize("split", TAIL_SPLITS)
@pytest.mark.parametrize("tokens, num_experts, topk, block_m, group_m, hot", GEMM_CASES)
def test_gate_up_silu_matches_torch(
    tokens, num_experts, topk, block_m, group_m, hot, split
) -> None:
    """Every used slot: silu(x @ gate.T) * (x @ up.T) of its pair's token and its tile's expert;
    zeros in the padding that is computed (a split tail's padding part is not).
    GROUP_M > 1 swizzles the tiles: each must still be computed once."""
    from minisgl.kernel.fused_moe import gate_up_silu

    torch.manual_seed(tokens)
    x = torch.randn(tokens, 40)
    w1, _ = _weights(num_experts, 40, 20)
    _, sorted_ids, expert_ids, num_padded, pairs, experts = _sorted_pairs(
        tokens, num_experts, topk, block_m, hot
    )
    h = torch.full((sorted_ids.numel(), 20), float("nan"))
    config = _gemm_config(group_m, block_m, split)
    gate_up_silu(x, w1, h, sorted_ids, expert_ids, num_padded, topk, config)
    real = pairs < tokens * topk
    rows = x[pairs.clamp(max=tokens * topk - 1) // topk]
    gate = torch.einsum("sh,sih->si", rows, w1[experts, :20])
    up = torch.einsum("sh,sih->si", rows, w1[experts, 20:])
    want = torch.where(real[:, None], F.silu(gate) * up, 0.0)
    written = _computed_slots(pairs, block_m, tokens * topk, split)
    torch.testing.assert_close(h[: pairs.numel()][written], want[written], **TOL)
    assert written[real].all()
    assert h[: pairs.numel()][~written].isnan().all()  # the halves skipped were never computed


def _computed_slots(pairs: torch.Tensor, block_m: int, num_pairs: int, split: int) -> torch.Tensor:
    """Per used slot: whether its tile computes it. A tile whose pairs number at most
    block_m / 4 (split 4) or / 2 (split 2 or 4) computes that many rows, others all."""
    in_tile = (pairs < num_pairs).view(-1, block_m).sum(dim=1)
    rows = torch.full_like(in_tile, block_m)
    for part in [p for p in (2, 4) if p <= split]:
        rows = torch.where(in_tile <= block_m // part, block_m // part, rows)
    return (torch.arange(block_m)[None, :] < rows[:, None]).view(-1)


@interpreted
@pytest.mark.parametrize("split", TAIL_SPLITS)
@pytest.mark.parametrize("tokens, num_experts, topk, block_m, group_m, hot", GEMM_CASES)
def test_down_matches_torch(tokens, num_experts, topk, block_m, group_m, hot, split) -> None:
    """Every pair's row: its routing weight times h[its slot] @ w2[its expert].T."""
    from minisgl.kernel.fused_moe import down

    torch.manual_seed(tokens + 1)
    _, w2 = _weights(num_experts, 40, 20)
    weights, sorted_ids, expert_ids, num_padded, pairs, experts = _sorted_pairs(
        tokens, num_experts, topk, block_m, hot
    )
    h = torch.randn(sorted_ids.numel(), 20)
    y = torch.full((tokens * topk, 40), float("nan"))
    down(
        h, w2, y, weights, sorted_ids, expert_ids, num_padded, _gemm_config(group_m, block_m, split)
    )
    real = pairs < tokens * topk
    want = torch.empty_like(y)
    slots = real.nonzero().squeeze(1)
    rows = torch.einsum("si,shi->sh", h[slots], w2[experts[slots]])
    want[pairs[slots]] = weights[pairs[slots], None] * rows
    assert real.sum() == tokens * topk  # every pair has one slot
    torch.testing.assert_close(y, want, **TOL)


@interpreted
@pytest.mark.parametrize("group_m", [4, 5])
def test_gemms_compute_every_tile_when_the_routing_needs_all_max_tiles(group_m: int) -> None:
    """The worst routing (one pair on each expert but one, the rest on that one) uses all
    max_tiles tiles, so the swizzle's last, shorter group of tile rows holds used tiles too:
    each must be computed once."""
    from minisgl.kernel.fused_moe import down, gate_up_silu
    from minisgl.kernel.moe_routing import align, max_tiles, route

    tokens, num_experts = 37, 4
    gating = torch.zeros(tokens, num_experts)
    chosen = torch.arange(tokens).clamp(max=num_experts - 1)  # experts 0-2 once, 3 for the rest
    gating[torch.arange(tokens), chosen] = 30.0
    weights, ids, block_counts = route(gating, 1, True)
    sorted_ids, expert_ids, num_padded = align(ids, block_counts, num_experts, 16)
    assert int(num_padded.item()) == max_tiles(tokens, num_experts, 16) * 16 == 6 * 16
    torch.manual_seed(group_m)
    x = torch.randn(tokens, 40)
    w1, w2 = _weights(num_experts, 40, 20)
    h = torch.full((sorted_ids.numel(), 20), float("nan"))
    gate_up_silu(x, w1, h, sorted_ids, expert_ids, num_padded, 1, _gemm(16, 16, group_m))
    y = torch.full((tokens, 40), float("nan"))
    down(h, w2, y, weights.view(-1), sorted_ids, expert_ids, num_padded, _gemm(16, 16, group_m))
    gate = torch.einsum("th,tih->ti", x, w1[chosen, :20])
    up = torch.einsum("th,tih->ti", x, w1[chosen, 20:])
    want = torch.einsum("ti,thi->th", F.silu(gate) * up, w2[chosen])
    torch.testing.assert_close(y, want, **TOL)


@interpreted
@pytest.mark.parametrize("block_m, split", [(16, 2), (32, 4), (64, 3)])
def test_tail_splits_refuse_parts_too_short(block_m, split) -> None:
    from minisgl.kernel.fused_moe import gate_up_silu

    _, sorted_ids, expert_ids, num_padded, _, _ = _sorted_pairs(5, 4, 2, block_m)
    w1, _ = _weights(4, 40, 20)
    h = torch.empty(sorted_ids.numel(), 20)
    with pytest.raises(ValueError, match=f"got {split} with BLOCK_M {block_m}"):
        gate_up_silu(
            torch.randn(5, 40),
            w1,
            h,
            sorted_ids,
            expert_ids,
            num_padded,
            2,
            dict(_gemm(16, 16), TAIL_SPLIT=split),
        )


@interpreted
@pytest.mark.parametrize("block_t, block_h", [(1, 1024), (8, 256), (4, 128)])
@pytest.mark.parametrize(
    "tokens, topk, hidden", [(1, 1, 8), (19, 3, 300), (8, 8, 256), (3, 2, 1100)]
)
def test_sum_choices_adds_each_tokens_k_rows(
    tokens, topk, hidden, block_t, block_h, monkeypatch
) -> None:
    """The chosen tile (1 token by 1,024 columns) and two others the sweep tries, with T past a
    tile of tokens and H past a tile of columns."""
    from minisgl.kernel import fused_moe
    from minisgl.kernel.fused_moe import sum_choices

    monkeypatch.setattr(fused_moe, "SUM_BLOCK_T", block_t)
    monkeypatch.setattr(fused_moe, "SUM_BLOCK_H", block_h)
    torch.manual_seed(tokens)
    y = torch.randn(tokens * topk, hidden)
    torch.testing.assert_close(sum_choices(y, topk), y.view(tokens, topk, hidden).sum(dim=1))


# ---- the backend ------------------------------------------------------------------------------


BACKEND_CASES = [  # tokens, experts, k, hot expert: T=1, experts with no token, all to one,
    (1, 8, 1, None),
    (1, 6, 2, None),
    (5, 8, 2, 3),
    (16, 6, 3, None),
    (17, 8, 2, None),
    (37, 6, 2, 5),
    (40, 5, 1, None),
    (23, 8, 8, None),
]  # T past the block, k=E


def _run_backend(
    config: Dict[str, Any] | None,
    tokens: int,
    num_experts: int,
    topk: int,
    hot: int | None,
    renormalize: bool,
) -> None:
    from minisgl.moe.sync_free import SyncFreeMoeBackend
    from minisgl.moe.torch_backend import TorchMoeBackend

    torch.manual_seed(tokens * 10 + topk)
    x, gating = torch.randn(tokens, 40), _gating(tokens, num_experts, hot)
    w1, w2 = _weights(num_experts, 40, 20)
    backend = SyncFreeMoeBackend()
    if config is None:
        got = backend.forward(x, w1, w2, gating, topk, renormalize)
    else:
        got = backend.forward_with(config, x, w1, w2, gating, topk, renormalize)
    assert got.shape == x.shape and got.dtype == x.dtype
    want = TorchMoeBackend().forward(x, w1, w2, gating, topk, renormalize)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(
        got, _literal_moe(x, w1, w2, gating, topk, renormalize), rtol=1e-5, atol=1e-5
    )


# renormalize reaches only `route`, which each path calls in its own way: both values for the
# decode path and one aligned path, True for the other tile shapes (their GEMMs never see it)
PATH_CASES = [  # the decode path only for a few tokens (DECODE_MAX_TOKENS = 16)
    pytest.param(config, *case, renormalize, id=f"{name}-{'-'.join(map(str, case))}-{renormalize}")
    for name, config in (
        ("aligned16", _aligned(16, group_m=4)),
        ("aligned64", _aligned(64)),
        ("aligned64-halves", _tail_split(_aligned(64), 2)),
        ("aligned64-quarters", _tail_split(_aligned(64), 4)),
        ("decode", DECODE),
    )
    for case in BACKEND_CASES
    if name != "decode" or case[0] <= 16
    for renormalize in ((True, False) if name in ("aligned16", "decode") else (True,))
]


@interpreted
@pytest.mark.parametrize("config, tokens, num_experts, topk, hot, renormalize", PATH_CASES)
def test_forward_with_each_path_matches_the_reference(
    config, tokens, num_experts, topk, hot, renormalize
) -> None:
    _run_backend(config, tokens, num_experts, topk, hot, renormalize)


@interpreted
@pytest.mark.parametrize(
    "tokens, num_experts, topk, hot",
    [(1, 8, 2, None), (16, 8, 2, 1), (17, 8, 2, None), (50, 4, 2, 0)],
)
def test_forward_picks_a_config_and_matches_the_reference(tokens, num_experts, topk, hot) -> None:
    _run_backend(None, tokens, num_experts, topk, hot, renormalize=True)


@interpreted
def test_forward_of_no_tokens() -> None:
    from minisgl.moe.sync_free import SyncFreeMoeBackend

    w1, w2 = _weights(4, 40, 20)
    out = SyncFreeMoeBackend().forward(torch.empty(0, 40), w1, w2, torch.empty(0, 4), 2, True)
    assert out.shape == (0, 40)


# ---- configs ----------------------------------------------------------------------------------


def test_default_config_by_pairs_per_expert() -> None:
    from minisgl.moe.configs import DECODE_MAX_TOKENS, default_config, get_config

    assert default_config(1, 8, 128)["path"] == "decode"
    assert default_config(DECODE_MAX_TOKENS, 8, 128)["path"] == "decode"
    assert default_config(DECODE_MAX_TOKENS + 1, 8, 128)["path"] == "aligned"
    block_ms = [
        default_config(t, 8, 128)["BLOCK_M"] for t in range(DECODE_MAX_TOKENS + 1, 20000, 97)
    ]
    assert block_ms == sorted(block_ms) and block_ms[0] == 16 and block_ms[-1] == 128
    for tokens in (1, 17, 100, 5000):  # no tuned file on a CPU: the heuristic
        assert get_config(
            tokens, 8, 128, 768, torch.bfloat16, torch.device("cpu")
        ) == default_config(tokens, 8, 128)


def _tuned_files() -> list:
    from minisgl.moe.configs import CONFIG_DIR

    return sorted(CONFIG_DIR.glob("*.json"))


def test_the_tuned_h200_file() -> None:
    from minisgl.moe.configs import config_file_name, load_tuned

    name = config_file_name(128, 768, torch.bfloat16, "NVIDIA H200")
    assert name == "E=128,N=768,dtype=bf16,device=NVIDIA_H200.json"
    assert name in [path.name for path in _tuned_files()]
    for path in _tuned_files():
        data = json.loads(path.read_text())
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        assert path.name == config_file_name(
            data["experts"], data["inter"], dtype[data["dtype"]], data["device"]
        )
        keys = [int(k) for k in data["configs"]]
        assert keys == sorted(keys) and len(set(keys)) == len(keys) and keys[0] >= 1
        for config in data["configs"].values():
            assert config["path"] in ("aligned", "decode")
            if config["path"] == "aligned":
                assert config["BLOCK_M"] in (16, 32, 64, 128)
            for gemm in ("gate_up", "down"):
                keys_known = {
                    "BLOCK_N",
                    "BLOCK_K",
                    "GROUP_M",
                    "num_warps",
                    "num_stages",
                    "TAIL_SPLIT",
                }  # a key the kernels do not read would be ignored
                assert {"BLOCK_N", "BLOCK_K", "num_warps", "num_stages"} <= set(config[gemm])
                assert set(config[gemm]) <= keys_known, config[gemm]
                split = config[gemm].get("TAIL_SPLIT", 1)
                assert split in (1, 2, 4) and (split == 1 or config["BLOCK_M"] // split >= 16)
        assert sorted(load_tuned(path.name)) == keys


@pytest.fixture
def fake_gpu_configs(tmp_path, monkeypatch) -> Any:
    """A tuned file for E=4, N=8, fp32 on a device named "Fake GPU 21", in a directory of its
    own; load_tuned's cache is emptied around the test."""
    from minisgl.moe import configs

    table = {
        str(t): dict(
            path="aligned", BLOCK_M=16, tokens=t, gate_up=_gemm(16, 16), down=_gemm(16, 16)
        )
        for t in (1, 8, 64)
    }
    name = configs.config_file_name(4, 8, torch.float32, "Fake GPU 21")
    (tmp_path / name).write_text(json.dumps({"configs": table}))
    monkeypatch.setattr(configs, "CONFIG_DIR", tmp_path)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU 21")
    configs.load_tuned.cache_clear()
    yield configs
    configs.load_tuned.cache_clear()


def test_get_config_takes_the_nearest_tuned_batch_size(fake_gpu_configs) -> None:
    configs, cuda = fake_gpu_configs, torch.device("cuda")
    assert sorted(configs.load_tuned("E=4,N=8,dtype=fp32,device=Fake_GPU_21.json")) == [1, 8, 64]

    def tuned_for(tokens: int) -> int:
        return configs.get_config(tokens, 2, 4, 8, torch.float32, cuda)["tokens"]

    assert [tuned_for(t) for t in (1, 3, 5, 8, 30, 40, 64, 5000)] == [1, 1, 8, 8, 8, 64, 64, 64]
    assert tuned_for(36) == 8  # halfway: the smaller
    # another shape, dtype or device has no file: the heuristic
    for num_experts, inter, dtype in (
        (4, 16, torch.float32),
        (4, 8, torch.bfloat16),
        (4, 8, torch.float64),
    ):
        assert configs.get_config(40, 2, num_experts, inter, dtype, cuda) == configs.default_config(
            40, 2, num_experts
        )
    assert configs.get_config(
        40, 2, 4, 8, torch.float32, torch.device("cpu")
    ) == configs.default_config(40, 2, 4)


def test_nearest_stays_on_the_path_of_the_token_count() -> None:
    """A count above DECODE_MAX_TOKENS never takes a decode entry, however near, and one at or
    below it takes a decode entry when the file has one."""
    from minisgl.moe.configs import DECODE_MAX_TOKENS, nearest

    small, large = DECODE_MAX_TOKENS, 2 * DECODE_MAX_TOKENS
    tuned = {
        1: dict(path="decode"),
        small: dict(path="decode"),
        large: dict(path="aligned"),
        1024: dict(path="aligned"),
    }
    assert nearest(tuned, small + 1) is tuned[large]  # small is nearer, but on the other path
    assert nearest(tuned, small) is tuned[small] and nearest(tuned, 2) is tuned[1]
    assert nearest(tuned, 600) is tuned[1024] and nearest(tuned, 500) is tuned[large]
    only_aligned = {large: dict(path="aligned")}
    assert nearest(only_aligned, 1) is only_aligned[large]  # no entry of its path: the nearest


# ---- registry and the engine ------------------------------------------------------------------


def test_sync_free_backend_is_registered_and_capturable() -> None:
    from minisgl.moe import MOE_BACKENDS, TorchMoeBackend, create_moe_backend

    assert {"torch", "fused", "sync_free"} <= set(MOE_BACKENDS.names())
    assert isinstance(create_moe_backend("cpu"), TorchMoeBackend)  # auto: the reference
    assert not TorchMoeBackend.supports_cuda_graph
    if not HAS_TRITON:
        return
    from minisgl.moe.fused import FusedMoeBackend
    from minisgl.moe.sync_free import SyncFreeMoeBackend

    assert isinstance(create_moe_backend("cuda"), SyncFreeMoeBackend)  # auto on a GPU
    assert isinstance(create_moe_backend("cpu", "sync_free"), SyncFreeMoeBackend)
    assert SyncFreeMoeBackend.supports_cuda_graph and not FusedMoeBackend.supports_cuda_graph


@pytest.mark.parametrize(
    "backend, moe, asked, want",
    [
        ("sync_free", True, None, 8),
        ("fused", True, None, 0),
        ("torch", True, None, 0),
        ("fused", False, None, 8),
        ("sync_free", True, 4, 4),
        ("fused", True, 4, 0),
    ],
)
def test_graph_max_bs_on_a_gpu_needs_a_capturable_moe(backend, moe, asked, want) -> None:
    """Engine._graph_max_bs with a GPU's device: an MoE model gets graphs only from a backend
    that reads nothing on the host (only the logic: no GPU is touched)."""
    if backend != "torch" and not HAS_TRITON:
        pytest.skip("needs Triton")
    from minisgl.engine.engine import Engine
    from minisgl.moe import create_moe_backend

    engine = SimpleNamespace(
        config=SimpleNamespace(cuda_graph_max_bs=asked, max_running_req=8),
        device=torch.device("cuda"),
        attn_backend=SimpleNamespace(supports_cuda_graph=True),
        model_config=SimpleNamespace(is_moe=moe),
        moe_backend=create_moe_backend("cpu", backend),
    )
    assert Engine._graph_max_bs(engine) == want


# ---- end to end -------------------------------------------------------------------------------


def _record_paths(backend: Any) -> list:
    """Wraps backend.forward_with to note each call's (path, tokens)."""
    seen: list = []
    forward_with = backend.forward_with

    def spy(config: Dict[str, Any], hidden_states: torch.Tensor, *args: Any) -> torch.Tensor:
        seen.append((config["path"], hidden_states.shape[0]))
        return forward_with(config, hidden_states, *args)

    backend.forward_with = spy
    return seen


@interpreted
@pytest.mark.parametrize("family", ["qwen3moe", "qwen3moe_nonorm"])
def test_tiny_qwen3_moe_with_the_sync_free_backend_matches_hf(tiny_models, family) -> None:
    """The engine with moe_backend="sync_free" (Triton's interpreter): the prefill of both prompts
    takes the aligned path (more than DECODE_MAX_TOKENS tokens), each decode step the decode
    path; norm_topk_prob true and false."""
    from minisgl.llm import LLM
    from minisgl.moe.configs import DECODE_MAX_TOKENS
    from minisgl.moe.sync_free import SyncFreeMoeBackend

    path = tiny_models[family]
    prompts = ["The quick brown fox jumps over the lazy dog, and then", [7, 7, 1, 2, 9, 3]]
    assert sum(len(encode(path, p)) for p in prompts) > DECODE_MAX_TOKENS
    llm = LLM(
        str(path),
        device="cpu",
        page_size=4,
        num_pages=256,
        max_running_req=8,
        max_extend_tokens=256,
        moe_backend="sync_free",
    )
    try:
        backend = llm.scheduler.engine.ctx.moe_backend
        assert isinstance(backend, SyncFreeMoeBackend)
        seen = _record_paths(backend)
        out = llm.generate(prompts, greedy(5))
    finally:
        llm.shutdown()
    assert [o["token_ids"] for o in out] == hf_greedy(path, prompts, 5)
    paths = {p for p, _ in seen}
    assert paths == {"aligned", "decode"}, seen
    assert all((p == "decode") == (t <= DECODE_MAX_TOKENS) for p, t in seen)


# ---- on CUDA: the real shape, graphs ---------------------------------------------------------


def _qwen3_30b_inputs(tokens: int) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(tokens)
    w1, w2 = _weights(128, 2048, 768, "cuda", torch.bfloat16)
    x = torch.randn(tokens, 2048, device="cuda", dtype=torch.bfloat16)
    return x, w1, w2, torch.randn(tokens, 128, device="cuda")


@on_cuda
@pytest.mark.parametrize("tokens", [1, 2, 16, 17, 64, 129, 1000, 4096, 16384])
def test_sync_free_at_qwen3_30b_a3b_shape(tokens: int) -> None:
    """E=128, top-8, H=2048, I=768 in bf16 against the reference in fp32 on the same values:
    the config get_config picks, and each path the token count allows."""
    from minisgl.moe.configs import DECODE_MAX_TOKENS, default_config
    from minisgl.moe.sync_free import SyncFreeMoeBackend
    from minisgl.moe.torch_backend import TorchMoeBackend

    x, w1, w2, gating = _qwen3_30b_inputs(tokens)
    want = TorchMoeBackend().forward(x.float(), w1.float(), w2.float(), gating, 8, True)
    backend = SyncFreeMoeBackend()
    runs = {
        "picked": backend.forward(x, w1, w2, gating, 8, True),
        "aligned": backend.forward_with(
            default_config(max(tokens, DECODE_MAX_TOKENS + 1), 8, 128), x, w1, w2, gating, 8, True
        ),
    }
    if tokens <= DECODE_MAX_TOKENS:
        runs["decode"] = backend.forward_with(
            default_config(tokens, 8, 128), x, w1, w2, gating, 8, True
        )
    for name, got in runs.items():
        assert got.dtype == torch.bfloat16 and got.shape == (tokens, 2048)
        err = (got.float() - want).abs().max().item() / want.abs().max().item()
        assert err < 2e-2, f"{name}: max error {err:.2e} of the largest output"


@on_cuda
@pytest.mark.parametrize("tokens", [1, 3, 16])
def test_decode_launched_early_equals_launched_in_order(tokens: int) -> None:
    """Programmatic dependent launch changes when programs start, never what they compute: a
    missing gdc_wait would let the down kernel read h before it is written."""
    from minisgl.kernel.moe_decode import decode_moe
    from minisgl.moe.configs import default_config

    x, w1, w2, gating = _qwen3_30b_inputs(tokens)
    config = default_config(tokens, 8, 128)
    early = [decode_moe(x, w1, w2, gating, 8, True, config, pdl=True) for _ in range(3)]
    in_order = decode_moe(x, w1, w2, gating, 8, True, config, pdl=False)
    assert all(torch.equal(out, in_order) for out in early)


@on_cuda
@pytest.mark.parametrize("tokens", [4, 64])
def test_sync_free_under_a_cuda_graph_equals_eager(tokens: int) -> None:
    """Captured once, replayed on new inputs copied into the static tensors: bit for bit the
    eager result (no size was read on the host at capture)."""
    from minisgl.moe.sync_free import SyncFreeMoeBackend

    backend = SyncFreeMoeBackend()
    x, w1, w2, gating = _qwen3_30b_inputs(tokens)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile every kernel outside the capture
        backend.forward(x, w1, w2, gating, 8, True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(x, w1, w2, gating, 8, True)
    for seed in (1, 2):
        torch.manual_seed(seed)
        new_x = torch.randn_like(x)
        new_gating = torch.randn_like(gating)
        new_gating[:, seed] += 30.0  # every token to one expert
        x.copy_(new_x)
        gating.copy_(new_gating)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, backend.forward(new_x, w1, w2, new_gating, 8, True))


@on_cuda
def test_tiny_qwen3_moe_on_cuda_with_graphs(tiny_models) -> None:
    """The sync-free backend lets the engine capture decode steps (the fused one does not), and
    gives the torch backend's greedy tokens, in float32."""
    from minisgl.llm import LLM

    path = tiny_models["qwen3moe"]
    prompts = [
        "The quick brown fox jumps over the lazy dog, and then",
        [7, 7, 1, 2, 9, 3],
        "hello world",
    ]
    tokens: dict = {}
    for backend in ("sync_free", "fused", "torch"):
        llm = LLM(
            str(path),
            device="cuda",
            dtype=torch.float32,
            page_size=4,
            num_pages=256,
            max_running_req=8,
            max_extend_tokens=256,
            moe_backend=backend,
        )
        try:
            max_bs = llm.scheduler.engine.graph_runner.max_bs
            assert (max_bs > 0) == (backend == "sync_free"), (backend, max_bs)
            tokens[backend] = [o["token_ids"] for o in llm.generate(prompts, greedy(8))]
        finally:
            llm.shutdown()
    assert tokens["sync_free"] == tokens["torch"]
