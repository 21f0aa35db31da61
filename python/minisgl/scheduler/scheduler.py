"""The scheduler: requests in, one batch per step, tokens out (continuous batching); with
overlap scheduling the next batch is launched before this one's tokens are back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Set, Tuple

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine.engine import Engine, HostTokens
from minisgl.engine.logprobs import RequestLogprobs, by_request
from minisgl.env import disable_overlap_scheduling
from minisgl.kvcache import create_prefix_cache
from minisgl.utils.hf import read_generation_config, read_hf_config

from .cache import CacheManager
from .config import SchedulerConfig
from .constraints import GrammarManager, Pending, pending_tokens
from .decode import DecodeManager
from .prefill import PrefillManager
from .speculator import Speculator
from .table import TableManager
from .utils import StepOutput, check_request


@dataclass
class Launched:
    """A batch given to the engine, whose tokens the host has not processed yet."""

    batch: Batch
    extend_lens: List[int]  # tokens each request ran
    sampled: List[bool]  # whether each request got a token (not a chunk of a prompt)
    tokens: HostTokens  # on their way to the host
    runs: List[List[int]] | None = None  # speculative decoding: each request's new tokens


class Scheduler:
    """Continuous batching: each step runs either a prefill (new requests, or the next chunk of
    a long prompt, within a token budget) or a decode step of all running requests; a finished
    request leaves at once and its row and pages serve the next. A request waits (never dropped)
    until there is a row for it and pages for everything it may still generate, so a running
    request never runs out of pages.

    With overlap scheduling a step launches batch k+1 before it processes batch k's
    tokens, so the host's work hides behind the device's. Batch k+1 may then hold a request that
    batch k finished (at EOS): its token is dropped, and the request's row and pages are given
    back only once no launched batch can read them.
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
        self.grammars = GrammarManager(config.model_path, self.engine.model_config.vocab_size)
        self.speculator = (
            Speculator(config, self.engine, self.cache_manager) if config.speculative else None
        )
        self.overlap = _use_overlap(config, self.engine.device)
        self._next_uid = 0
        self._in_flight: Launched | None = None  # launched, not processed (overlap only)
        self._deferred: List[Tuple[Req, bool]] = []  # cache_req calls waiting for _in_flight
        self._released: Set[Req] = set()  # finished or aborted, maybe in _in_flight still

    def add_req(self, input_ids: Sequence[int], params: SamplingParams) -> Req:
        """Queue a request; a ValueError naming the field if it is bad (nothing is queued)."""
        if params.n != 1:
            raise ValueError(f"n={params.n}: a request of several choices goes to add_choices")
        return self.add_choices(input_ids, params)[0]

    def add_choices(self, input_ids: Sequence[int], params: SamplingParams) -> List[Req]:
        """Queue a request's ``n`` choices, choice i with its own seed (``for_choice``); a
        ValueError naming the field if it is bad (nothing is queued). Choice 0 runs the prompt;
        the others wait until it is in the prefix cache, then share its pages."""
        params = check_request(
            input_ids,
            params,
            self.engine.max_seq_len,
            self.engine.model_config.vocab_size,
            speculative=self.speculator is not None,
        )
        reqs = [
            Req(self._next_uid + i, list(input_ids), params.for_choice(i)) for i in range(params.n)
        ]
        for req in reqs:
            self.grammars.add(req)  # structured output: compiled before it is queued
        self._next_uid += len(reqs)
        for req in reqs:
            self.prefill_manager.add_req(req, after=reqs[0] if req is not reqs[0] else None)
        return reqs

    @property
    def waiting(self) -> List[Req]:
        """Requests not yet admitted, or admitted with part of their prompt still to run."""
        return self.prefill_manager.waiting

    @property
    def in_flight(self) -> Batch | None:
        """The batch launched whose tokens the host has not processed yet (overlap only)."""
        return self._in_flight.batch if self._in_flight is not None else None

    @property
    def idle(self) -> bool:
        return (
            not self.prefill_manager.runnable
            and not self.decode_manager.runnable
            and self._in_flight is None
        )

    def step(self) -> StepOutput | None:
        """Launch the next batch and process one batch's tokens; None when idle. Without
        overlap the batch processed is the one just launched; with it, the one launched before
        (the first step launches two)."""
        if self._in_flight is not None and self._speculates_next():
            done, self._in_flight = self._in_flight, None  # a speculative step drafts from
            return self._process(done)  # every token: the host takes the last ones first
        launched = self._launch_next()
        if not self.overlap or (launched is not None and launched.runs is not None):
            return self._process(launched) if launched else None  # speculative: ran to its end
        if self._in_flight is None and launched is not None:  # nothing to process yet
            self._in_flight = launched  # first: the next launch's grammars read its tokens
            launched = self._launch_next()
        done, self._in_flight = self._in_flight, launched
        return self._process(done) if done else None

    def run_until_idle(self) -> Dict[Req, str]:
        """Step until every request has finished; why each one finished, in the order they
        finished."""
        finished: Dict[Req, str] = {}
        while (out := self.step()) is not None:
            finished.update(out.finished)
        self.cache_manager.check_integrity()  # idle: every page is free or cached, none locked
        if self.speculator is not None:
            self.speculator.check_integrity()  # the draft model's pages are all back
        return finished

    def abort(self, req: Req) -> None:
        """Drop the request wherever it is (waiting, mid-prefill, decoding) and give back its
        row and pages as if it had finished, once; its computed prefix stays in the cache.
        Choices held for it run without it."""
        self.prefill_manager.remove(req)
        self.prefill_manager.release(req)
        self.decode_manager.remove_req(req)
        if req.table_idx >= 0 and req not in self._released:  # admitted, not released yet
            self._release(req, finished=True)

    def shutdown(self) -> None:
        if self._in_flight is not None:  # let the device finish it before the engine goes
            self._in_flight.tokens.tolist()
        self.engine.shutdown()

    def _launch_next(self) -> Launched | None:
        """Schedule the next batch (prefill first), give it its pages and launch its forward;
        the host does not wait for its tokens."""
        with self.engine.timer.phase("schedule"):
            batch = (
                self.prefill_manager.schedule_next_batch(self.config.max_extend_tokens)
                or self.decode_manager.schedule_next_batch()
            )
            if batch is None:
                return None
            speculative = self._in_flight is None and self._speculates(batch)
            if not speculative:
                extend_lens = [r.extend_len for r in batch.reqs]
                self.cache_manager.allocate(batch.reqs)
        if speculative:  # outside "schedule": its draft, verify and accept are phases of their own
            return self._launch_speculative(batch)
        mask = self.grammars.mask_for(batch, self._pending())
        next_tokens = self.engine.forward_batch(batch, mask)
        sampled = [r.cached_len >= len(r.input_ids) for r in batch.reqs]  # a chunk samples none
        for req, got_token in zip(batch.reqs, sampled):
            if got_token:
                req.sampled_on_device()  # the next forward runs it from the device
        if batch.is_prefill:  # its prompt is done: it decodes from the next step on
            self.decode_manager.add_reqs(
                r for r, got_token in zip(batch.reqs, sampled) if got_token and r.can_decode
            )
        self.decode_manager.remove_done()  # max_tokens: known now, before the tokens are back
        tokens = self.engine.start_copy_to_host(next_tokens, batch.logprobs)
        return Launched(batch, extend_lens, sampled, tokens)

    def _speculates(self, batch: Batch) -> bool:
        """Whether the batch verifies drafts: a decode batch the speculator wants."""
        if self.speculator is None or batch.is_prefill:
            return False
        constrained = [r in self.grammars.grammars for r in batch.reqs]
        return self.speculator.wants(batch.reqs, constrained)

    def _speculates_next(self) -> bool:
        """Whether the next step will likely verify drafts, judged before it is scheduled: the
        batch in flight is a decode step (after a prefill another chunk may come), and the
        running requests make a batch the speculator wants. A wrong guess costs one step of
        overlap, or one step without drafts."""
        flight = self._in_flight
        if flight is None or flight.batch.phase != "decode":
            return False
        return self._speculates(Batch(list(self.decode_manager.running_reqs), "decode"))

    def _launch_speculative(self, batch: Batch) -> Launched:
        """A decode step with drafts, run to its end: the next step's positions
        depend on how many tokens this one keeps, so nothing is launched ahead of it."""
        constrained = [r in self.grammars.grammars for r in batch.reqs]
        mask = self.grammars.mask_for(batch, self._pending())
        runs, ran = self.speculator.decode(batch, constrained, mask)
        self.decode_manager.remove_done()
        tokens = HostTokens(torch.tensor([run[0] for run in runs]))  # the runs' first tokens
        return Launched(batch, ran, [True] * batch.size, tokens, runs)

    def _process(self, done: Launched) -> StepOutput:
        """The host's share of a batch: wait for its tokens, append them, finish requests."""
        with self.engine.timer.phase("process"):
            next_tokens = done.tokens.tolist()  # this batch's tokens alone, not the next batch's
            runs = done.runs or [[token] for token in next_tokens]  # several: speculation
            deferred, self._deferred = self._deferred, []
            for req, finished in deferred:  # they waited for `done`, which is over
                self._cache(req, finished)
            released, self._released = self._released, set()
            delivered: List[Tuple[int, int]] = []
            finished_reqs: Dict[Req, str] = {}
            logprobs = self._logprobs(done)
            for i, (req, run, got_token, n) in enumerate(
                zip(done.batch.reqs, runs, done.sampled, done.extend_lens)
            ):
                if req in released:
                    continue  # finished or aborted after this batch was launched: drop it
                delivered.append((req.uid, n))
                if logprobs is not None:
                    _record(req, i, run, got_token, logprobs)
                if not got_token:
                    continue  # a chunk of a prompt: no token yet, the next chunk follows
                if reason := self._append_run(req, run):
                    self.decode_manager.remove_req(req)
                    self._release(req, finished=True)
                    finished_reqs[req] = reason
                elif done.batch.is_prefill:  # its prompt is cached now: share it
                    self._release(req, finished=False)
        uids, extend_lens = [u for u, _ in delivered], [n for _, n in delivered]
        return StepOutput(done.batch.phase, uids, extend_lens, finished_reqs)

    def _logprobs(self, done: Launched) -> RequestLogprobs | None:
        """The batch's log-probabilities by request (its tokens are on the host already)."""
        plan, host = done.batch.logprob_plan, done.tokens.logprobs
        return None if plan is None or host is None else by_request(done.batch.reqs, plan, host)

    def _append_run(self, req: Req, run: List[int]) -> str | None:
        """Append the request's new tokens until one finishes it (EOS, max_tokens, the
        grammar's end); the rest of the run is dropped. Why it finished, or None."""
        for token in run:
            req.append_host(token)
            if reason := self._finish_reason(req):
                return reason
        return None

    def _finish_reason(self, req: Req) -> str | None:
        """Why the request is finished after its last token: the request's own rule (EOS,
        max_tokens), or "grammar" once its constraint admits nothing more."""
        if reason := req.finish_reason(self.eos_token_ids):
            return reason
        return "grammar" if self.grammars.is_done(req) else None

    def _pending(self) -> Pending:
        """The in-flight batch's tokens by request (none without one), read when asked."""
        done = self._in_flight
        if done is None:
            return lambda: {}
        return pending_tokens(done.batch.reqs, done.sampled, done.tokens.tolist)

    def _release(self, req: Req, *, finished: bool) -> None:
        """Give the request's pages to the prefix cache (finished: its row back too), at once
        when no batch is in flight, else when it is done: it may read them still (a request
        that finished at EOS runs once more in it), and a page or row handed out again now
        would be written while it runs."""
        if finished:
            self._released.add(req)
        if self._in_flight is None:
            self._cache(req, finished)
        else:
            self._deferred.append((req, finished))

    def _cache(self, req: Req, finished: bool) -> None:
        self.cache_manager.cache_req(req, finished=finished)
        self.prefill_manager.release(req)  # its prompt is cached: its other choices may run
        if finished:
            self.grammars.remove(req)
            if self.speculator is not None:
                self.speculator.remove(req)
            self.table_manager.free(req.table_idx)
            req.table_idx = -1  # released: an abort that comes later finds nothing to give back


def _record(req: Req, i: int, run: List[int], got_token: bool, logprobs: RequestLogprobs) -> None:
    """Request i's share of its batch's log-probabilities: its prompt chunk's entries, and the
    entry of the token it sampled (``run[0]``, which the host appends next)."""
    if i in logprobs.prompt and req.prompt_logprobs is not None:
        req.prompt_logprobs.extend(logprobs.prompt[i])
    if got_token and i in logprobs.sampled and req.output_logprobs is not None:
        req.output_logprobs.append(run[0], *logprobs.sampled[i])


def _use_overlap(config: SchedulerConfig, device: torch.device) -> bool:
    """Overlap scheduling: as the config says (None: on a GPU), unless the environment has
    MINISGL_DISABLE_OVERLAP_SCHEDULING=1, which overrides the config. A speculative step is
    never overlapped (its drafts and positions follow from how many tokens the step before
    kept); the steps without drafts around it are."""
    if disable_overlap_scheduling():
        return False
    if config.overlap_scheduling is None:
        return device.type == "cuda"
    return config.overlap_scheduling


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
