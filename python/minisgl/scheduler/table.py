from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import List


@dataclass
class TableManager:
    """The request table: the page table's rows, one per request in flight. A request takes a
    row when it is admitted and gives it back when it finishes; the lowest free row first."""

    max_running_req: int
    _free_rows: List[int] = field(init=False)

    def __post_init__(self) -> None:
        self._free_rows = list(range(self.max_running_req))  # sorted: a heap already

    @property
    def available_size(self) -> int:
        return len(self._free_rows)

    def allocate(self) -> int:
        return heapq.heappop(self._free_rows)

    def free(self, row: int) -> None:
        heapq.heappush(self._free_rows, row)
