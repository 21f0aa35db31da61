"""The collectives tensor parallelism needs, over ``torch.distributed``: gloo on a CPU, NCCL on
GPUs. One process per rank; each runs the same scheduler on the same requests, so the ranks
launch the same forwards in the same order and meet in every collective."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from minisgl.utils.torch_utils import resolve_device

from .info import get_tp_info, set_tp_info

# a collective that waits longer than this means a rank is gone (it also bounds the start)
TIMEOUT = timedelta(minutes=5)
# but a follower rank waits in a broadcast for as long as the server has no request: days
IDLE_TIMEOUT = timedelta(days=365)
_cpu_group: Any = None  # gloo: Python objects (the requests) go from rank 0 to the others


def init_distributed(rank: int, size: int, init_addr: str, device: str) -> None:
    """Join the ``size`` ranks meeting at ``init_addr`` (``file://`` or ``tcp://``); returns once
    all have joined. Tensors go over NCCL on CUDA, over gloo on a CPU; objects over gloo."""
    global _cpu_group
    on_gpu = resolve_device(device).type == "cuda"
    if on_gpu:
        torch.cuda.set_device(rank)  # one GPU per rank: "cuda" means this rank's from now on
    dist.init_process_group(
        "nccl" if on_gpu else "gloo",
        init_method=init_addr,
        rank=rank,
        world_size=size,
        timeout=TIMEOUT,
    )
    _cpu_group = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    # no rank goes on until every rank's connections are made: one that fails next (a model
    # that does not split) would otherwise close its sockets under a rank still connecting
    dist.barrier(group=_cpu_group)
    set_tp_info(rank, size)


def destroy_distributed() -> None:
    """Leave the process group; the process is one rank of one again."""
    global _cpu_group
    if dist.is_initialized():
        dist.destroy_process_group()
    _cpu_group = None
    set_tp_info(0, 1)


class DistributedCommunicator:
    """The sums and gathers between the ranks' partial results. At one rank each is the
    identity, so a layer may hold one without any process group (as ``MoELayer`` does)."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of every rank's ``x``, in place; returns ``x``."""
        if get_tp_info().size > 1:
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` [..., N] side by side along the last dimension, in rank order:
        [..., size * N]."""
        size = get_tp_info().size
        if size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)


def broadcast_objects(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (the others pass None and block until it comes)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_cpu_group)
    return box[0]


def min_across_ranks(value: int) -> int:
    """The smallest of the ranks' ``value``s, on every rank: the KV pages each can hold differ
    with each GPU's free memory, and all must schedule with the same number."""
    if get_tp_info().size == 1:
        return value
    box = torch.tensor([value])
    dist.all_reduce(box, op=dist.ReduceOp.MIN, group=_cpu_group)
    return int(box.item())
