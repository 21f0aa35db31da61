"""Which tensor-parallel rank this process is, read by every layer as it is built."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DistributedInfo:
    """This process's place among the ``size`` ranks that share each weight."""

    rank: int
    size: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is not in [0, {self.size})")

    def is_primary(self) -> bool:
        """Rank 0: the one that talks to the rest of the system (replies, logs)."""
        return self.rank == 0


# one rank holding every weight whole until a launcher says otherwise, so that a model built
# in a plain process (the tests, ``MoELayer``) needs no set-up
_TP_INFO = DistributedInfo(rank=0, size=1)


def set_tp_info(rank: int, size: int) -> None:
    """Set once per process, before the model is built: the layers size themselves from it."""
    global _TP_INFO
    _TP_INFO = DistributedInfo(rank, size)


def get_tp_info() -> DistributedInfo:
    return _TP_INFO
