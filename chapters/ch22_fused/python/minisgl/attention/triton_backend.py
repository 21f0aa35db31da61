"""The Triton backend: the new tokens' K and V stored by one kernel, then paged attention by one
kernel for the whole batch (the default on a GPU).

A decode batch (every request brings one token) runs split-K decode attention; any other batch,
prefill, chunk, or prefill and decode requests together, runs extend attention, which handles
any number of new tokens per request. Both read K and V through the page table, in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING

import torch

from minisgl.core import Batch, get_global_ctx
from minisgl.kernel import decode_attention, extend_attention, store_kv

from .base import BaseAttnBackend

if TYPE_CHECKING:
    from minisgl.models.config import ModelConfig


@dataclass
class TritonAttnMetadata:
    """Per request of the batch, on the device: its page-table row, the tokens cached before this
    forward, the new ones, all of them, and where its new tokens start among the batch's."""

    rows: torch.Tensor  # [B] int32
    cached_lens: torch.Tensor  # [B] int32
    extend_lens: torch.Tensor  # [B] int32
    seq_lens: torch.Tensor  # [B] int32: cached + extend
    q_starts: torch.Tensor  # [B] int32
    max_extend_len: int  # sizes the extend kernel's grid, known on the host without a sync
    is_decode: bool  # every request brings exactly one token


class TritonAttnBackend(BaseAttnBackend):
    supports_cuda_graph = True

    def __init__(self, config: ModelConfig, device: torch.device | str):
        self.device = torch.device(device)
        self.sm_scale = config.head_dim**-0.5
        self._graph_lens: torch.Tensor | None = None  # [5, max_bs] once graphs are captured

    def init_graph_buffers(self, max_bs: int) -> None:
        """Decode metadata lives in one buffer from now on: a graph reads it where the capture
        found it, so each step writes its values there."""
        self._graph_lens = torch.zeros(5, _aligned(max_bs), dtype=torch.int32, device=self.device)

    def prepare_metadata(self, batch: Batch) -> None:
        """One host-to-device copy of the batch's lengths, made from the requests' own counts,
        from pinned memory on a GPU: a copy from pageable memory may wait for the device.

        Zeros pad each of the five rows to a multiple of 4 entries, so that every row starts
        16-byte aligned: Triton compiles a kernel anew for a pointer that is not, so unpadded, a
        batch of odd size or of 2 mod 4 compiled an extend kernel of its own in mid-run.
        """
        cached = [r.cached_len for r in batch.reqs]
        extend = [r.extend_len for r in batch.reqs]
        starts = [0, *accumulate(extend[:-1])]  # where each request's new tokens begin
        rows = [r.table_idx for r in batch.reqs]
        seq = [c + e for c, e in zip(cached, extend)]
        pad = [0] * (_aligned(batch.size) - batch.size)
        host = torch.tensor(
            [x + pad for x in (rows, cached, extend, seq, starts)],
            dtype=torch.int32,
            pin_memory=self.device.type == "cuda",
        )
        is_decode = not batch.is_prefill and max(extend) == 1
        if is_decode and self._graph_lens is not None and batch.size <= self._graph_lens.shape[1]:
            lens = self._graph_lens[:, : host.shape[1]]
            lens.copy_(host, non_blocking=True)
        else:
            lens = host.to(self.device, non_blocking=True)
        lens = lens[:, : batch.size]
        batch.attn_metadata = TritonAttnMetadata(
            rows=lens[0],
            cached_lens=lens[1],
            extend_lens=lens[2],
            seq_lens=lens[3],
            q_starts=lens[4],
            max_extend_len=max(extend),
            is_decode=is_decode,
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        ctx, meta = get_global_ctx(), batch.attn_metadata
        assert ctx.kv_cache is not None and ctx.page_table is not None
        assert batch.out_loc is not None
        k_cache, v_cache = ctx.kv_cache.k_cache(layer_id), ctx.kv_cache.v_cache(layer_id)
        store_kv(k_cache, v_cache, batch.out_loc, k, v)  # first: a token sees its own K, V
        if meta.is_decode:
            return decode_attention(
                q, k_cache, v_cache, ctx.page_table, meta.rows, meta.seq_lens, self.sm_scale
            )
        return extend_attention(
            q,
            k_cache,
            v_cache,
            ctx.page_table,
            meta.rows,
            meta.cached_lens,
            meta.extend_lens,
            meta.q_starts,
            meta.max_extend_len,
            self.sm_scale,
        )


def _aligned(n: int) -> int:
    """n rounded up to a multiple of 4: that many int32 fill whole 16-byte units."""
    return -(-n // 4) * 4
