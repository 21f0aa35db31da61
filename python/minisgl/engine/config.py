from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EngineConfig:
    """How to build an engine: which model, where, and how much KV cache."""

    model_path: str
    device: str = "auto"  # "cpu", "cuda", or "auto" (the GPU when there is one)
    dtype: torch.dtype | None = None  # None: the checkpoint's
    page_size: int = 1  # tokens per KV page
    num_pages: int | None = None  # KV pages; None: as many as the memory budget allows
    memory_ratio: float = 0.9  # on a GPU: the share of free memory for weights and KV
    cpu_kv_bytes: int = 256 << 20  # on a CPU: the KV budget in bytes (when num_pages is None)
    # rows of the page table: requests in flight at once; 256, so that a decode batch fills
    # the largest CUDA graph and the GPU's bandwidth
    max_running_req: int = 256
    max_seq_len: int | None = None  # None: the model's max_position_embeddings
    attention_backend: str = "auto"  # "torch"; "auto": the best one for the device
    moe_backend: str = "auto"  # "torch", "fused", "sync_free"; "auto": "sync_free" on a GPU
    seed: int = 0  # of the sampler's generator
    dummy_weights: bool = False  # random weights on the device, from config.json alone
    profile_steps: bool = False  # time each step's phases (synchronizes at their edges)
    nvtx: bool = False  # NVTX ranges around the phases, for Nsight Systems (CUDA only)
    # decode batches up to this size run as CUDA graphs; None: 256 on a GPU, none on a CPU
    cuda_graph_max_bs: int | None = None
    tp_size: int = 1  # tensor parallelism: ranks (processes, one GPU each) sharing every layer
    tp_rank: int = 0  # which of them this process is (set by the launcher)
    dist_init_addr: str | None = None  # where the ranks meet: "file://..." or "tcp://host:port"

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.num_pages is not None and self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {self.num_pages}")
        if self.cuda_graph_max_bs is not None and self.cuda_graph_max_bs < 0:
            raise ValueError(f"cuda_graph_max_bs must be >= 0, got {self.cuda_graph_max_bs}")
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank must be in [0, tp_size={self.tp_size}), got {self.tp_rank}")
        if self.max_running_req < 1:
            raise ValueError(f"max_running_req must be >= 1, got {self.max_running_req}")
