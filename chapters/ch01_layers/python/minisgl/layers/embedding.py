from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.utils.misc import div_ceil, get_tp_info

from .base import BaseOP


def _vocab_range(num_embeddings: int) -> tuple[int, int]:
    """The rows ``[start, end)`` of the vocabulary this rank holds (all of them on one rank)."""
    tp = get_tp_info()
    per_rank = div_ceil(num_embeddings, tp.size)
    start = min(tp.rank * per_rank, num_embeddings)
    return start, min(start + per_rank, num_embeddings)


class VocabParallelEmbedding(BaseOP):
    """Token ids to vectors. The vocabulary's rows are split over the ranks.

    weight: [V_local, H]; input_ids: [T] -> [T, H]
    """

    def __init__(self, num_embeddings: int, embedding_dim: int):
        self.vocab_start, self.vocab_end = _vocab_range(num_embeddings)
        self.weight = torch.empty(self.vocab_end - self.vocab_start, embedding_dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # with several ranks, ids outside this rank's rows give zeros and the ranks' vectors are
        # summed; one rank holds every row
        return F.embedding(input_ids, self.weight)


class ParallelLMHead(BaseOP):
    """Hidden states to logits over the vocabulary.

    weight: [V_local, H]; x: [T, H] -> logits: [T, V].
    With ``tie_to`` (``tie_word_embeddings``) it shares the embedding's tensor instead of holding
    its own: one storage, read by both, filled by loading either name.
    """

    def __init__(
        self, num_embeddings: int, embedding_dim: int, tie_to: VocabParallelEmbedding | None = None
    ):
        if tie_to is not None:
            self.weight = tie_to.weight
        else:
            start, end = _vocab_range(num_embeddings)
            self.weight = torch.empty(end - start, embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # with several ranks each computes its slice of the vocabulary and the slices are gathered
        return F.linear(x, self.weight)
