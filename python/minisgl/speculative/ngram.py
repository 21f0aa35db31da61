"""N-gram drafts (prompt lookup): the request's own tokens predict what comes next."""

from __future__ import annotations

from typing import List, Sequence

from minisgl.core import Req


def propose_ngram(tokens: Sequence[int], k: int, max_n: int = 4) -> List[int]:
    """Up to ``k`` draft tokens: the longest suffix of ``tokens`` (``max_n`` tokens at most)
    that occurred earlier, and the tokens that followed its latest earlier occurrence. None
    when no suffix occurred before. Text that copies from its prompt (an edit, a summary
    quoting its source, code) repeats its n-grams, and there the drafts are often right."""
    if k <= 0:
        return []
    tokens = list(tokens)
    for n in range(min(max_n, len(tokens) - 1), 0, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # the latest occurrence first
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


class NgramDrafter:
    """Drafts from the request's own tokens: no second model, no state to keep."""

    def __init__(self, max_n: int = 4):
        self.max_n = max_n

    def propose(self, reqs: Sequence[Req], ks: Sequence[int]) -> List[List[int]]:
        return [propose_ngram(req.all_ids, k, self.max_n) for req, k in zip(reqs, ks)]

    def accepted(self, req: Req, kept_len: int) -> None:
        pass  # nothing was computed ahead

    def remove(self, req: Req) -> None:
        pass

    def check_integrity(self) -> None:
        pass
