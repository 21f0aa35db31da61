"""Tensor parallelism: which rank this process is, and the collectives between the ranks."""

from .impl import (
    DistributedCommunicator,
    broadcast_objects,
    destroy_distributed,
    init_distributed,
    min_across_ranks,
)
from .info import DistributedInfo, get_tp_info, set_tp_info

__all__ = [
    "DistributedCommunicator",
    "DistributedInfo",
    "broadcast_objects",
    "destroy_distributed",
    "get_tp_info",
    "init_distributed",
    "min_across_ranks",
    "set_tp_info",
]
