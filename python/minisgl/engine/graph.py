"""CUDA graphs for decode: a step's few hundred kernel launches replayed as one.

A decode step of a small model is short on the GPU (a millisecond or two) and long on the CPU,
which launches every kernel of every layer, one after another. The launches are the same at
every step: only the batch size and the values in a few tensors change. So the engine records
the launches once per batch size in a CUDA graph (capture) and then replays the graph, reading
the step's values from the same buffers the capture read.

Sizes 1, 2, 4, then every 8 up to a maximum are captured, largest first, all in one memory pool
(the largest graph's memory serves the smaller ones). A batch of 13 runs the graph of 16: it is
padded with 3 copies of the dummy request, whose one token sits at position 0 of the dummy page,
a page never handed out. Padded rows compute garbage nobody reads, and never write a real
request's KV slots, so they cannot change its output.

On a CPU nothing is captured, but a batch is padded the same way (when a maximum is given), so
the bucket choice and the padding can be seen and tested anywhere.

Speculative decoding captures a second set: verify batches in which every request
brings the same number of tokens, its last one and its k drafts.
"""

from __future__ import annotations

from typing import Callable, Dict, List

import torch

from minisgl.attention.base import BaseAttnBackend
from minisgl.core import Batch, Req, get_global_ctx
from minisgl.models.base import BaseLLMModel
from minisgl.utils.logger import init_logger

logger = init_logger(__name__)


def graph_batch_sizes(max_bs: int) -> List[int]:
    """The captured sizes: 1, 2, 4, then every multiple of 8 up to ``max_bs``."""
    return [bs for bs in (1, 2, 4) if bs <= max_bs] + list(range(8, max_bs + 1, 8))


def padded_size(sizes: List[int], batch_size: int) -> int | None:
    """The smallest captured size that holds ``batch_size`` rows; None when none does."""
    return next((bs for bs in sizes if bs >= batch_size), None)


class GraphRunner:
    """Pads decode batches up to a captured size and runs them: by replaying the size's CUDA
    graph when the graphs were captured, else by an ordinary forward of the padded batch.

    With ``width`` > 1 its batches are verify batches of ``width`` tokens a request (chapter
    24), and its dummy request brings that many."""

    def __init__(
        self,
        model: BaseLLMModel,
        attn_backend: BaseAttnBackend,
        dummy_req: Req,
        max_bs: int,
        device: torch.device,
        width: int = 1,
    ):
        self.model, self.attn_backend, self.dummy_req = model, attn_backend, dummy_req
        self.sizes = graph_batch_sizes(max_bs)
        self.device, self.width = device, width
        self.phase = "decode" if width == 1 else "verify"
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}

    @property
    def max_bs(self) -> int:
        return self.sizes[-1] if self.sizes else 0

    def can_run(self, batch: Batch) -> bool:
        if batch.phase != self.phase or batch.size > self.max_bs:
            return False
        return self.width == 1 or all(r.extend_len == self.width for r in batch.reqs)

    def pad(self, batch: Batch) -> Batch:
        """The batch with dummy requests appended up to its captured size."""
        size = padded_size(self.sizes, batch.size)
        assert size is not None and self.can_run(batch)
        return Batch(batch.reqs + [self.dummy_req] * (size - batch.size), batch.phase)

    def capture(self, prepare_batch: Callable[[Batch], None]) -> None:
        """Record one graph per size, largest first, in one shared memory pool.

        ``prepare_batch`` is the engine's: it fills a batch's input tensors and attention
        metadata. The buffers it fills for the largest batch are the ones every graph reads.
        """
        max_bs, tokens = self.max_bs, self.max_bs * self.width
        self.attn_backend.init_graph_buffers(max_bs)
        vocab = self.model.config.vocab_size
        self.input_ids = torch.zeros(tokens, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(tokens, dtype=torch.long, device=self.device)
        self.out_loc = torch.zeros(tokens, dtype=torch.long, device=self.device)
        self.logits = torch.empty(tokens, vocab, dtype=torch.float32, device=self.device)
        pool = None
        for bs in reversed(self.sizes):
            batch = Batch([self.dummy_req] * bs, self.phase)
            prepare_batch(batch)
            self._use_buffers(batch)
            graph = torch.cuda.CUDAGraph()
            with get_global_ctx().forward_batch(batch):
                self._forward(batch)  # once outside the graph: Triton compiles its kernels
                with torch.cuda.graph(graph, pool=pool):
                    self._forward(batch)
            pool = graph.pool() if pool is None else pool
            self.graphs[bs] = graph
        torch.cuda.synchronize(self.device)
        logger.info("captured CUDA graphs for batch sizes %s", self.sizes)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits [B * width, V] of a padded, prepared batch: the graph's replay, or a
        forward."""
        if not self.graphs:
            assert batch.input_ids is not None and batch.positions is not None
            return self.model.forward(batch.input_ids, batch.positions)
        self._copy_inputs(batch)
        self.graphs[batch.size].replay()
        return self.logits[: batch.size * self.width]

    def _forward(self, batch: Batch) -> None:
        t = batch.size * self.width
        self.logits[:t] = self.model.forward(self.input_ids[:t], self.positions[:t])

    def _use_buffers(self, batch: Batch) -> None:
        """Point the batch at the graph's input buffers, holding its values."""
        self._copy_inputs(batch)
        t = batch.size * self.width
        batch.input_ids, batch.positions = self.input_ids[:t], self.positions[:t]
        batch.out_loc = self.out_loc[:t]

    def _copy_inputs(self, batch: Batch) -> None:
        assert batch.input_ids is not None and batch.positions is not None
        assert batch.out_loc is not None
        t = batch.size * self.width
        self.input_ids[:t].copy_(batch.input_ids)
        self.positions[:t].copy_(batch.positions)
        self.out_loc[:t].copy_(batch.out_loc)

    def destroy(self) -> None:
        self.graphs.clear()
