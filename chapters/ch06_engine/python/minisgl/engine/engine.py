"""The engine: the model, its KV cache and its backends, and one forward for a batch."""

from __future__ import annotations

import torch

from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, Req, SamplingParams, use_global_ctx
from minisgl.kvcache import create_kvcache_pool
from minisgl.models import load_model
from minisgl.utils.logger import init_logger
from minisgl.utils.misc import div_ceil, div_even, get_tp_info
from minisgl.utils.torch_utils import free_memory, nbytes, resolve_device

from .config import EngineConfig
from .sample import Sampler

logger = init_logger(__name__)


class Engine:
    """Runs a batch of requests: each brings its new tokens (a whole prompt, a chunk, or the one
    token of a decode step), and gets its next token sampled from its last position's logits.

    It owns the page table, whose rows the scheduler hands out, and the KV pool, whose pages the
    scheduler hands out; the engine only reads them. Page ``num_pages`` (the last) is a dummy
    page, never handed out: a padding request's row points at it (CUDA graphs).
    """

    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = resolve_device(config.device)
        used_before = self._used_memory()
        self.model = load_model(config.model_path, self.device, config.dtype)
        self.model_config = self.model.config
        self.dtype = config.dtype or self.model_config.dtype
        self.ctx = Context(page_size=config.page_size)

        asked_len = config.max_seq_len or self.model_config.max_position_embeddings
        self.num_pages = self._determine_num_pages(used_before, asked_len)
        self.ctx.kv_cache = self.kv_cache = create_kvcache_pool(
            self.model_config, self.num_pages + 1, config.page_size, self.dtype, self.device
        )
        num_slots = self.num_pages * config.page_size
        self.max_seq_len = min(asked_len, num_slots)
        # row max_running_req is the dummy request's, pointing at the dummy page; whole pages
        width = div_ceil(self.max_seq_len, config.page_size) * config.page_size
        self.ctx.page_table = self.page_table = torch.zeros(
            config.max_running_req + 1, width, dtype=torch.int32, device=self.device
        )
        self.dummy_req = Req(
            -1, [0], SamplingParams(max_tokens=1), table_idx=config.max_running_req
        )
        self.page_table[self.dummy_req.table_idx].fill_(num_slots)

        self.ctx.attn_backend = self.attn_backend = create_attention_backend(
            config.attention_backend, self.model_config, self.device
        )
        if self.model_config.is_moe:
            from minisgl.moe import create_moe_backend  # forward reference: ch20

            self.ctx.moe_backend = self.moe_backend = create_moe_backend(self.device)
        self.sampler = Sampler(self.device, seed=config.seed)

    def _used_memory(self) -> int:
        if self.device.type != "cuda":
            return 0
        return torch.cuda.mem_get_info(self.device)[1] - free_memory(self.device)

    def bytes_per_page(self) -> int:
        """K and V of ``page_size`` tokens in every layer, for this rank's KV heads."""
        c = self.model_config
        kv_heads = div_even(c.num_kv_heads, get_tp_info().size)
        return 2 * c.num_layers * self.config.page_size * kv_heads * c.head_dim * nbytes(self.dtype)

    def _determine_num_pages(self, used_before: int, max_seq_len: int) -> int:
        """``config.num_pages``, or as many pages as the budget holds (on a GPU the share
        ``memory_ratio`` of its memory less the weights, on a CPU ``cpu_kv_bytes``), but no more
        than ``max_running_req`` requests of ``max_seq_len`` tokens can ever fill."""
        num_pages = self.config.num_pages
        if num_pages is None:
            by_budget = self._kv_budget(used_before) // self.bytes_per_page()
            num_pages = min(by_budget, self._most_pages_needed(max_seq_len))
        if num_pages < 1:
            raise ValueError("no memory left for the KV cache: give num_pages or more memory")
        logger.info("KV cache: %d pages of %d tokens", num_pages, self.config.page_size)
        return num_pages

    def _kv_budget(self, used_before: int) -> int:
        """Bytes for the KV cache: on a GPU what the memory ratio leaves after the weights."""
        if self.device.type != "cuda":
            return self.config.cpu_kv_bytes
        total = torch.cuda.mem_get_info(self.device)[1]
        weights = total - free_memory(self.device) - used_before
        return int(self.config.memory_ratio * (total - used_before)) - weights

    def _most_pages_needed(self, max_seq_len: int) -> int:
        """Pages that every row of the page table, filled to ``max_seq_len``, would hold."""
        return self.config.max_running_req * div_ceil(max_seq_len, self.config.page_size)

    def prepare_batch(self, batch: Batch) -> None:
        """The batch's tensors, from its requests' tokens and page-table rows (the pages must be
        given already): input_ids, positions and out_loc [T], then the attention metadata."""
        reqs = batch.reqs
        ids = [t for r in reqs for t in r.all_ids[r.cached_len : r.device_len]]
        positions = [p for r in reqs for p in range(r.cached_len, r.device_len)]
        rows = [r.table_idx for r in reqs for _ in range(r.extend_len)]
        batch.input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        batch.positions = torch.tensor(positions, dtype=torch.long, device=self.device)
        row_index = torch.tensor(rows, dtype=torch.long, device=self.device)
        batch.out_loc = self.page_table[row_index, batch.positions].long()
        self.attn_backend.prepare_metadata(batch)

    @torch.inference_mode()
    def forward_batch(self, batch: Batch) -> torch.Tensor:
        """One forward of the batch, then one token per request: next token ids [B] (int64).

        Afterwards every request's new tokens count as cached (``cached_len = device_len``).
        """
        # this engine's context is the global one during its forward, whichever was before
        with use_global_ctx(self.ctx), self.ctx.forward_batch(batch):
            self.prepare_batch(batch)
            assert batch.input_ids is not None and batch.positions is not None
            logits = self.model.forward(batch.input_ids, batch.positions)  # [T, V]
        ends = torch.tensor([r.extend_len for r in batch.reqs], device=self.device).cumsum(0)
        last_logits = logits[ends - 1].float()  # each request's last position: [B, V]
        for req in batch.reqs:
            req.complete_forward()
        return self.sampler.sample(last_logits, self.sampler.prepare(batch))

    def shutdown(self) -> None:
        """Nothing to release on a CPU; later chapters free CUDA graphs and process groups."""
