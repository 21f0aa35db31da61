"""N-gram drafts (prompt lookup): the request's own tokens predict what comes next."""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

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


class NgramIndex:
    """``propose_ngram`` for one request without its scan: every n-gram of the request's
    tokens that some token follows, mapped to where it last started. A step indexes only the
    tokens that arrived since the last one, and a proposal is ``max_n`` lookups, so a step's
    work no longer grows with the request's length."""

    def __init__(self, max_n: int = 4):
        self.max_n = max_n
        self.tokens: List[int] = []
        self.latest: Dict[Tuple[int, ...], int] = {}  # n-gram -> start of its latest occurrence

    def extend(self, tokens: Sequence[int]) -> None:
        """Catch up on ``tokens``, the request's tokens now (those indexed, then new ones)."""
        old = len(self.tokens)
        self.tokens.extend(tokens[old:])
        for end in range(max(old - 1, 0), len(self.tokens) - 1):  # a token follows each end
            for n in range(1, min(self.max_n, end + 1) + 1):
                self.latest[tuple(self.tokens[end - n + 1 : end + 1])] = end - n + 1

    def propose(self, k: int) -> List[int]:
        """The drafts ``propose_ngram(tokens, k, max_n)`` gives for the tokens indexed."""
        if k <= 0:
            return []
        tokens = self.tokens
        for n in range(min(self.max_n, len(tokens) - 1), 0, -1):
            start = self.latest.get(tuple(tokens[-n:]))
            if start is not None:
                return tokens[start + n : start + n + k]
        return []


class NgramDrafter:
    """Drafts from the request's own tokens: no second model, an index per request."""

    def __init__(self, max_n: int = 4):
        self.max_n = max_n
        self.indexes: Dict[Req, NgramIndex] = {}

    def propose(self, reqs: Sequence[Req], ks: Sequence[int]) -> List[List[int]]:
        return [self._index(req).propose(k) for req, k in zip(reqs, ks)]

    def accepted(self, req: Req, kept_len: int) -> None:
        pass  # nothing was computed ahead: the kept tokens are indexed when they arrive

    def remove(self, req: Req) -> None:
        self.indexes.pop(req, None)

    def check_integrity(self) -> None:
        assert not self.indexes, f"{len(self.indexes)} finished requests still indexed"

    def _index(self, req: Req) -> NgramIndex:
        index = self.indexes.setdefault(req, NgramIndex(self.max_n))
        index.extend(req.all_ids)
        return index
