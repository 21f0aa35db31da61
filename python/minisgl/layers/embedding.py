from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.distributed import DistributedCommunicator, get_tp_info
from minisgl.utils.misc import div_ceil

from .base import BaseOP


def vocab_range(num_embeddings: int) -> tuple[int, int, int]:
    """This rank's rows of the vocabulary: ``(start, end, rows)``. Every rank holds ``rows``
    rows (the last one's tail, past ``end``, is zero padding) so that their logits line up
    for the gather; one rank holds every row."""
    tp = get_tp_info()
    rows = div_ceil(num_embeddings, tp.size)
    start = min(tp.rank * rows, num_embeddings)
    return start, min(start + rows, num_embeddings), rows


class VocabParallelEmbedding(BaseOP):
    """Token ids to vectors. The vocabulary's rows are split over the ranks.

    weight: [V_local, H] (V_local = ceil(V / tp_size)); input_ids: [T] -> [T, H]
    """

    def __init__(self, num_embeddings: int, embedding_dim: int):
        self.vocab_start, self.vocab_end, rows = vocab_range(num_embeddings)
        self.tp_size = get_tp_info().size
        self._comm = DistributedCommunicator()
        self.weight = torch.empty(rows, embedding_dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        # each id lives on one rank: the others give zeros, and the sum over ranks is its vector
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local = torch.where(mine, input_ids - self.vocab_start, 0)
        y = F.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return self._comm.all_reduce(y)


class ParallelLMHead(BaseOP):
    """Hidden states to logits over the vocabulary.

    weight: [V_local, H]; x: [T, H] -> logits: [T, V]. Each rank computes the logits of its
    rows of the vocabulary, and the ranks' slices are gathered side by side.
    With ``tie_to`` (``tie_word_embeddings``) it shares the embedding's tensor instead of holding
    its own: one storage, read by both, filled by loading either name.
    """

    def __init__(
        self, num_embeddings: int, embedding_dim: int, tie_to: VocabParallelEmbedding | None = None
    ):
        self.num_embeddings = num_embeddings
        self.tp_size = get_tp_info().size
        self._comm = DistributedCommunicator()
        if tie_to is not None:
            self.weight = tie_to.weight
        else:
            self.weight = torch.empty(vocab_range(num_embeddings)[2], embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)  # [T, V_local]
        if self.tp_size == 1:
            return logits
        # [T, tp_size * V_local] in rank order, which is vocabulary order; then the padding off
        return self._comm.all_gather(logits)[:, : self.num_embeddings]
