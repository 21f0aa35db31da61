"""The engine: the model, its KV cache and its backends, and one forward for a batch."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Callable, List, Tuple

import torch

from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, Req, SamplingParams, use_global_ctx
from minisgl.distributed import get_tp_info, min_across_ranks
from minisgl.env import disable_fused_kernels
from minisgl.kvcache import create_kvcache_pool
from minisgl.models import load_model
from minisgl.utils.logger import init_logger
from minisgl.utils.misc import div_ceil, div_even
from minisgl.utils.torch_utils import StepTimer, free_memory, nbytes, resolve_device

from .config import EngineConfig
from .graph import GraphRunner, graph_batch_sizes, padded_size
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
        self.model = load_model(
            config.model_path, self.device, config.dtype, dummy=config.dummy_weights
        )
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
        # the token each row sampled last, for the next forward to read where the host does not
        # have it yet (overlap scheduling); the dummy row's stays 0
        self.last_tokens = torch.zeros(
            config.max_running_req + 1, dtype=torch.long, device=self.device
        )

        self.ctx.attn_backend = self.attn_backend = create_attention_backend(
            config.attention_backend, self.model_config, self.device
        )
        if self.model_config.is_moe:
            from minisgl.moe import create_moe_backend  # forward reference: ch20

            self.ctx.moe_backend = self.moe_backend = create_moe_backend(
                self.device, config.moe_backend
            )
        self.sampler = make_sampler(self.device, config.seed)
        # where a step's time goes; the scheduler times its own phases with it
        self.timer = StepTimer(config.profile_steps, self.device, nvtx=config.nvtx)
        self.graph_runner = GraphRunner(
            self.model, self.attn_backend, self.dummy_req, self._graph_max_bs(), self.device
        )
        self.verify_runner: GraphRunner | None = None  # speculative decoding's verify steps
        if self.graph_runner.max_bs and self.device.type == "cuda":
            with use_global_ctx(self.ctx), torch.inference_mode():
                self.graph_runner.capture(self.prepare_batch)

    def _graph_max_bs(self) -> int:
        """The largest decode batch run as a CUDA graph: ``cuda_graph_max_bs``, by default
        every batch up to 256 on a GPU. 0 when the forward cannot be captured: the torch
        backend's Python loop, or MoE layers that read expert counts on the host (the "torch"
        and "fused" MoE backends). On a CPU only a maximum given explicitly pads batches, to
        show how."""
        asked, on_gpu = self.config.cuda_graph_max_bs, self.device.type == "cuda"
        capturable = self.attn_backend.supports_cuda_graph and (
            not self.model_config.is_moe or self.moe_backend.supports_cuda_graph
        )
        if on_gpu and not capturable:
            return 0
        if asked is None:
            asked = 256 if on_gpu else 0
        # no decode batch is larger than max_running_req: capture up to the smallest size that
        # holds it (a maximum of 131 pads to 136), so that a full batch replays a graph too
        return padded_size(graph_batch_sizes(asked), self.config.max_running_req) or asked

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
            num_pages = min_across_ranks(num_pages)  # every rank schedules alike
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
        given already): input_ids, positions, table_rows and out_loc [T], the rows whose logits
        are sampled (each request's last token), then the attention metadata.

        A token the host does not have yet (sampled by the batch before) is read
        from ``last_tokens`` on the device. Nothing here waits for the device."""
        reqs = batch.reqs
        ids = [t for r in reqs for t in _host_ids(r)]
        positions = [p for r in reqs for p in range(r.cached_len, r.device_len)]
        if batch.phase == "verify":  # drafts past a request's last position: the dummy page
            rows = _rows_within_max_len(reqs, self.dummy_req.table_idx)
        else:
            rows = [r.table_idx for r in reqs for _ in range(r.extend_len)]
        last = [i - 1 for i in accumulate(r.extend_len for r in reqs)]  # each request's last token
        # one copy, not four, from pinned memory on a GPU so that it does not wait for the device
        host = torch.tensor(
            ids + positions + rows + last, dtype=torch.long, pin_memory=self.device.type == "cuda"
        )
        t = len(ids)
        flat = host.to(self.device, non_blocking=True)
        host_ids, batch.positions, batch.table_rows = flat[:t], flat[t : 2 * t], flat[2 * t : 3 * t]
        batch.input_ids = torch.where(host_ids >= 0, host_ids, self.last_tokens[batch.table_rows])
        batch.out_loc = self.page_table[batch.table_rows, batch.positions].long()
        if t > len(reqs) and batch.phase != "verify":  # sample only each request's last
            # token; drafts to verify need the logits at every position
            batch.logits_rows = flat[3 * t :]
        self.attn_backend.prepare_metadata(batch)

    @torch.inference_mode()
    def forward_batch(
        self, batch: Batch, mask_logits: Callable[[torch.Tensor], None] | None = None
    ) -> torch.Tensor:
        """One forward of the batch, then one token per request: next token ids [B] (int64).

        Afterwards every request's new tokens count as cached (``cached_len = device_len``).
        ``mask_logits`` edits the logits [B, V] in place between the forward and the sampling:
        structured output's bitmask, which the host fills while the forward runs.
        """
        logits, run = self._forward(batch)
        with self.timer.phase("sample"):
            if mask_logits is not None:
                mask_logits(logits)
            tokens = self.sampler.sample(logits, self.sampler.prepare(batch))
            rows = run.table_rows if run.logits_rows is None else run.table_rows[run.logits_rows]
            self.last_tokens[rows[: batch.size]] = tokens  # the next forward reads them here
            return tokens

    @torch.inference_mode()
    def verify_logits(self, batch: Batch) -> torch.Tensor:
        """The logits at every position of a batch of drafts to verify: [T, V] float32, no
        token sampled. Afterwards every request counts all its tokens as cached."""
        assert batch.phase == "verify"
        return self._forward(batch)[0]

    def _forward(self, batch: Batch) -> Tuple[torch.Tensor, Batch]:
        """Any batch, decode, prefill or verify, through one path: padded to a captured CUDA
        graph's size where one holds it (a decode batch small enough; a verify batch whose
        requests all bring the captured width), its tensors prepared, the graph replayed or the
        model run, its requests' new tokens counted as cached. The float32 logits of the batch's
        own rows (each request's last token; every token of a verify batch) and the batch as it
        ran, padded or not."""
        runner = self.verify_runner if batch.phase == "verify" else self.graph_runner
        graph = runner is not None and runner.can_run(batch)
        run = runner.pad(batch) if graph and runner is not None else batch
        rows = sum(r.extend_len for r in batch.reqs) if batch.phase == "verify" else batch.size
        # this engine's context is the global one during its forward, whichever was before
        with use_global_ctx(self.ctx), self.ctx.forward_batch(run):
            with self.timer.phase("prepare"):
                self.prepare_batch(run)
            assert run.input_ids is not None and run.positions is not None
            with self.timer.phase(f"forward {batch.phase}"):  # a decode step's own figure
                if graph and runner is not None:
                    logits = runner.forward(run)[:rows]  # padded requests' rows dropped
                else:
                    logits = self.model.forward(run.input_ids, run.positions)  # [rows, V]
        for req in batch.reqs:
            req.complete_forward()
        return logits.float(), run

    def capture_verify_graphs(self, width: int, max_tokens: int = 2048) -> None:
        """CUDA graphs for verify batches of ``width`` tokens a request, for every decode graph's
        size whose batch holds at most ``max_tokens`` tokens (the graphs' logits buffer is
        [tokens, V] float32): with k = 4, every decode batch up to 256 requests. They share
        the attention metadata's buffer with the decode graphs. None where decode has none, or
        with a hybrid backend, whose extend half may not be capturable. On a CPU with decode
        batches padded, verify batches are padded too and nothing is captured, as for
        decode."""
        if not self.graph_runner.max_bs or self.config.attention_backend not in ("auto", "triton"):
            return
        if self.device.type == "cuda" and not self.graph_runner.graphs:
            return
        sizes = [bs for bs in self.graph_runner.sizes if bs * width <= max_tokens]
        if not sizes:
            return
        dummy = Req(
            -1, [0] * width, SamplingParams(max_tokens=1), table_idx=self.config.max_running_req
        )
        self.verify_runner = GraphRunner(
            self.model, self.attn_backend, dummy, sizes[-1], self.device, width
        )
        if self.device.type == "cuda":
            with use_global_ctx(self.ctx), torch.inference_mode():
                self.verify_runner.capture(self.prepare_batch)

    def start_copy_to_host(self, tokens: torch.Tensor) -> HostTokens:
        """Start copying sampled tokens to the host without waiting for them: on a GPU into
        pinned memory, with an event recorded after the copy."""
        if self.device.type != "cuda":
            return HostTokens(tokens)
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return HostTokens(host, copied)

    def shutdown(self) -> None:
        """Free the CUDA graphs (their memory pool goes with them) and let go of the KV cache,
        which the global context would otherwise keep alive. Under tensor parallelism the
        process that runs the rank leaves its group."""
        self.graph_runner.destroy()
        self.ctx.kv_cache = self.ctx.page_table = None


@dataclass
class HostTokens:
    """A batch's sampled tokens on their way to the host. ``tolist`` waits for
    their copy alone (its event), not for the batches the device was given after it."""

    tokens: torch.Tensor  # [B]; on a GPU pinned host memory that the copy is still filling
    copied: torch.cuda.Event | None = None  # None: the tokens are there already (a CPU)

    def tolist(self) -> List[int]:
        if self.copied is not None:
            self.copied.synchronize()
        return self.tokens.tolist()


def _rows_within_max_len(reqs: List[Req], dummy_row: int) -> List[int]:
    """Each token's page-table row, the dummy request's for a token at or past its request's
    last position (``max_len - 1``): a verify step pads every request to k drafts, and those of
    a request near max_tokens lie past the pages reserved for it. Their K and V go to the dummy
    page, and the request never keeps them."""
    return [
        r.table_idx if position < r.max_len - 1 else dummy_row
        for r in reqs
        for position in range(r.cached_len, r.device_len)
    ]


def _host_ids(req: Req) -> List[int]:
    """The tokens its next forward runs, -1 for the one the host does not have yet."""
    ids = req.new_ids
    return ids + [-1] * (req.extend_len - len(ids))


def make_sampler(device: torch.device, seed: int) -> Sampler:
    """On a GPU, the fused sampler (the exponential race in Triton); elsewhere, or with
    ``MINISGL_DISABLE_FUSED_KERNELS=1``, the torch one (engine/sample.py)."""
    if device.type == "cuda" and not disable_fused_kernels():
        from minisgl.engine.fused_sampler import FusedSampler  # imports Triton

        return FusedSampler(device, seed=seed)
    return Sampler(device, seed=seed)
