from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, List

from minisgl.core import Batch, Req

from .utils import pages_to_finish


@dataclass
class DecodeManager:
    """The requests past their prefill: every decode step runs all of them, one token each."""

    running_reqs: List[Req] = field(default_factory=list)  # in order of admission

    def add_reqs(self, reqs: Iterable[Req]) -> None:
        self.running_reqs.extend(reqs)

    def remove_req(self, req: Req) -> None:
        if req in self.running_reqs:
            self.running_reqs.remove(req)

    def remove_done(self) -> None:
        """Drop the requests whose last token is sampled (max_tokens): known at launch, before
        the host has that token."""
        self.running_reqs = [r for r in self.running_reqs if r.can_decode]

    def reserved_pages(self, page_size: int) -> int:
        """Pages the running requests may still take before they finish."""
        return sum(pages_to_finish(req, page_size) for req in self.running_reqs)

    def schedule_next_batch(self) -> Batch | None:
        return Batch(list(self.running_reqs), "decode") if self.runnable else None

    @property
    def runnable(self) -> bool:
        return len(self.running_reqs) > 0
