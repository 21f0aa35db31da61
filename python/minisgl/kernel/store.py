"""Writing the new tokens' K and V into their KV-cache slots: one Triton kernel for both."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    k_cache,
    v_cache,
    out_loc,
    k,
    v,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_slot,
    stride_vc_head,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    num_heads,
    head_dim,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program copies one token: k[t] and v[t], [num_heads, head_dim] each, to slot out_loc[t].

    The last dimension of every tensor is contiguous; the others go by their strides.
    """
    t = tl.program_id(0)
    slot = tl.load(out_loc + t).to(tl.int64)  # int64: slot * stride overflows int32 in big pools
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < head_dim)
    k_row = tl.load(
        k + t * stride_k_tok + offs_h[:, None] * stride_k_head + offs_d[None, :], mask=mask
    )
    v_row = tl.load(
        v + t * stride_v_tok + offs_h[:, None] * stride_v_head + offs_d[None, :], mask=mask
    )
    tl.store(
        k_cache + slot * stride_kc_slot + offs_h[:, None] * stride_kc_head + offs_d[None, :],
        k_row,
        mask=mask,
    )
    tl.store(
        v_cache + slot * stride_vc_slot + offs_h[:, None] * stride_vc_head + offs_d[None, :],
        v_row,
        mask=mask,
    )


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """k_cache[out_loc[t]] = k[t] and v_cache[out_loc[t]] = v[t] for every new token t.

    k_cache, v_cache: [num_slots, Hkv, D]; out_loc: [T] int32 or int64; k, v: [T, Hkv, D].
    """
    num_tokens, num_heads, head_dim = k.shape
    assert v.shape == k.shape and out_loc.shape == (num_tokens,)
    assert k_cache.shape[1:] == k.shape[1:] and v_cache.shape[1:] == v.shape[1:]
    for x in (k_cache, v_cache, k, v):
        assert x.stride(-1) == 1, "the head dimension must be contiguous"
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        k_cache,
        v_cache,
        out_loc,
        k,
        v,
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        num_heads,
        head_dim,
        BLOCK_H=triton.next_power_of_2(num_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
