"""The scheduler: requests in, one batch per step, tokens out (continuous batching)."""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine.engine import Engine
from minisgl.kvcache import create_prefix_cache
from minisgl.utils.hf import read_generation_config, read_hf_config

from .cache import CacheManager
from .config import SchedulerConfig
from .decode import DecodeManager
from .prefill import PrefillManager
from .table import TableManager
from .utils import StepOutput, check_request


class Scheduler:
    """Continuous batching: each step runs either a prefill (new requests, or the next chunk of
    a long prompt, within a token budget) or a decode step of all running requests; a finished
    request leaves at once and its row and pages serve the next. A request waits (never dropped)
    until there is a row for it and pages for everything it may still generate, so a running
    request never runs out of pages.
    """

    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.engine = Engine(config)
        self.page_size = config.page_size
        self.table_manager = TableManager(config.max_running_req)
        self.cache_manager = CacheManager(
            self.engine.num_pages,
            config.page_size,
            self.engine.page_table,
            create_prefix_cache(config.cache_type, config.page_size),
        )
        self.decode_manager = DecodeManager()
        self.prefill_manager = PrefillManager(
            self.cache_manager, self.table_manager, self.decode_manager, config.page_size
        )
        self.eos_token_ids = _eos_token_ids(config.model_path)
        self._next_uid = 0

    def add_req(self, input_ids: Sequence[int], params: SamplingParams) -> Req:
        """Queue a request; a ValueError naming the field if it is bad (nothing is queued)."""
        params = check_request(
            input_ids, params, self.engine.max_seq_len, self.engine.model_config.vocab_size
        )
        req = Req(self._next_uid, list(input_ids), params)
        self._next_uid += 1
        self.prefill_manager.add_req(req)
        return req

    @property
    def waiting(self) -> List[Req]:
        """Requests not yet admitted, or admitted with part of their prompt still to run."""
        return self.prefill_manager.waiting

    @property
    def idle(self) -> bool:
        return not self.prefill_manager.runnable and not self.decode_manager.runnable

    def step(self) -> StepOutput | None:
        """Schedule one batch (prefill first), run it, and process its tokens. None when idle."""
        batch = (
            self.prefill_manager.schedule_next_batch(self.config.max_extend_tokens)
            or self.decode_manager.schedule_next_batch()
        )
        if batch is None:
            return None
        extend_lens = [r.extend_len for r in batch.reqs]
        self.cache_manager.allocate(batch.reqs)
        next_tokens = self.engine.forward_batch(batch).tolist()
        finished = self._process_tokens(batch, next_tokens)
        return StepOutput(batch.phase, [r.uid for r in batch.reqs], extend_lens, finished)

    def run_until_idle(self) -> Dict[Req, str]:
        """Step until every request has finished; why each one finished, in the order they
        finished."""
        finished: Dict[Req, str] = {}
        while (out := self.step()) is not None:
            finished.update(out.finished)
        self.cache_manager.check_integrity()  # idle: every page is free or cached, none locked
        return finished

    def shutdown(self) -> None:
        self.engine.shutdown()

    def _process_tokens(self, batch: Batch, next_tokens: List[int]) -> Dict[Req, str]:
        finished: Dict[Req, str] = {}
        for req, token in zip(batch.reqs, next_tokens):
            if req.device_len < len(req.input_ids):
                continue  # a chunk of a prompt: no token yet, the next chunk follows
            req.append(token)
            if reason := req.finish_reason(self.eos_token_ids):
                self.decode_manager.remove_req(req)
                self.cache_manager.cache_req(req, finished=True)
                self.table_manager.free(req.table_idx)
                finished[req] = reason
            elif batch.is_prefill:  # its prompt is cached now: share it, then decode
                self.cache_manager.cache_req(req, finished=False)
                self.decode_manager.add_reqs([req])
        return finished


def _eos_token_ids(model_path: str) -> Tuple[int, ...]:
    """Every token id that ends a sequence: a model may name several (Llama 3 Instruct three,
    Qwen3 two). generation_config.json's wins over config.json's, as in transformers 5, whose
    ``from_pretrained`` takes generation_config.json when there is one and builds the generation
    config from config.json only when there is none (where the file names no EOS, transformers
    stops at none; we still take config.json's)."""
    eos = read_generation_config(model_path).get("eos_token_id")
    if eos is None:
        eos = read_hf_config(model_path).get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (eos,)
