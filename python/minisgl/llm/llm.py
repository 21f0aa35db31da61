"""The offline API: prompts in, completions out, in this process (and, under tensor
parallelism, one further process per rank, run as the server runs them)."""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any, Dict, List, Sequence

import torch

from minisgl.core import Req, SamplingParams
from minisgl.distributed import broadcast_objects, destroy_distributed
from minisgl.message import ExitMsg, UserMsg
from minisgl.scheduler import SchedulerConfig
from minisgl.scheduler.io import run_follower, start_rank, stop_rank
from minisgl.scheduler.utils import check_request
from minisgl.utils.mp import Workers

Prompt = str | Sequence[int]  # text, or token ids
# upstream mini-sglang's option names -> ours, so that its scripts run with upstream's names
UPSTREAM_OPTIONS = {
    "max_seq_len_override": "max_seq_len",
    "num_page_override": "num_pages",
    "use_dummy_weight": "dummy_weights",
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class LLM:
    """``LLM(model_path, **engine_options).generate(prompts, sampling_params)``.

    The options are ``SchedulerConfig``'s (``device``, ``page_size``, ``num_pages``,
    ``max_running_req``, ``max_extend_tokens``, ``cache_type``, ``seed``, ``tp_size`` ...), or
    upstream's names for them (``UPSTREAM_OPTIONS``). ``generate`` queues every prompt at once
    and runs the scheduler until all are done, so they are batched together.

    With ``tp_size=N`` this process is rank 0 and ranks 1..N-1 are worker processes, each
    running the server's follower loop (``run_follower``) on its shard of the model. Before
    each step rank 0 broadcasts the messages of that step (``generate``'s requests, then none),
    as the server's rank 0 does, so all ranks run the same batches and meet in every
    all-reduce.
    """

    def __init__(self, model_path: str, **engine_options: Any):
        self.model_path = str(model_path)
        config = SchedulerConfig(self.model_path, **_our_names(engine_options))
        self._workers: Workers | None = None
        if config.tp_size > 1:
            config = self._start_followers(config)
        try:
            self.scheduler = start_rank(config)
            if self._workers is not None:
                self._workers.wait_ready()
        except BaseException:  # a model that does not split (heads over ranks ...): no rank left
            self._stop_followers()
            if config.tp_size > 1:
                destroy_distributed()  # this rank joined before it failed
            raise

    def _start_followers(self, config: SchedulerConfig) -> SchedulerConfig:
        """Ranks 1..N-1 as the server starts them, under ``Workers``; rank 0's config. The ranks
        meet at a file in the workers' own directory (no port to pick, none to collide)."""
        self._workers = Workers()
        if config.dist_init_addr is None:
            config = replace(config, dist_init_addr=f"file://{self._workers.ipc_dir}/tp")
        for rank in range(1, config.tp_size):
            self._workers.start(
                f"scheduler-{rank}", run_follower, config=replace(config, tp_rank=rank)
            )
        return replace(config, tp_rank=0)

    @cached_property
    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer, read when first needed: prompts given as token ids need
        no tokenizer files (a benchmark's model may be config.json alone)."""
        from transformers import AutoTokenizer

        if not self.has_tokenizer:
            raise ValueError(
                f"{self.model_path!r} has no tokenizer files: give prompts as token ids"
            )
        return AutoTokenizer.from_pretrained(self.model_path)

    @cached_property
    def has_tokenizer(self) -> bool:
        return any((Path(self.model_path) / name).is_file() for name in TOKENIZER_FILES)

    def generate(
        self, prompts: Sequence[Prompt], sampling_params: SamplingParams | Sequence[SamplingParams]
    ) -> List[Dict[str, Any]]:
        """One dict per prompt, in order: ``"text"`` (without the EOS that ended it, and without
        special tokens; None when the model has no tokenizer files), ``"token_ids"`` (every
        generated token, the EOS that ended it too), ``"prompt_token_ids"`` and
        ``"finish_reason"``; ``"logprobs"`` and ``"prompt_logprobs"`` (``Logprobs``) where the
        parameters ask. ``"choices"`` holds the ``n`` choices, each with the same keys but the
        prompt's; the keys outside it are choice 0's.

        A bad request raises a ValueError naming its field before any request runs."""
        if isinstance(prompts, str) or any(isinstance(p, int) for p in prompts):
            raise TypeError(
                "prompts must be a list of prompts (strings or lists of token ids), not one prompt"
            )
        params = sampling_params
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(
                f"sampling_params has {len(params)} entries for {len(prompts)} prompts"
            )
        ids = [self._encode(p) for p in prompts]
        for i, (one_ids, one_params) in enumerate(zip(ids, params)):
            try:
                check_request(
                    one_ids,
                    one_params,
                    self.scheduler.engine.max_seq_len,
                    self.scheduler.engine.model_config.vocab_size,
                    speculative=self.scheduler.speculator is not None,
                )
                self.scheduler.grammars.check(one_params)  # compiled now: none queued if bad
            except ValueError as e:
                raise ValueError(f"request {i}: {e}") from e
        ids = [[int(t) for t in one_ids] for one_ids in ids]  # numpy's or torch's ints: int
        choices = [self.scheduler.add_choices(i, p) for i, p in zip(ids, params)]
        firsts = [reqs[0] for reqs in choices]
        finished = self._run_until_idle(self._messages(firsts, ids, params))
        return [self._result(reqs, finished) for reqs in choices]

    def _messages(
        self, reqs: List[Req], ids: List[List[int]], params: Sequence[SamplingParams]
    ) -> List[UserMsg]:
        """The requests as the other ranks' loops receive them, to queue them alike (none at
        one rank)."""
        if self._workers is None:
            return []
        return [
            UserMsg(r.uid, torch.tensor(i, dtype=torch.int32), p)
            for r, i, p in zip(reqs, ids, params)
        ]

    def _run_until_idle(self, msgs: List[UserMsg]) -> Dict[Req, str]:
        """``Scheduler.run_until_idle``; under tensor parallelism each step is first announced
        to the other ranks with what arrived for it, one broadcast a step, which their loops
        receive before each of theirs."""
        if self._workers is None:
            return self.scheduler.run_until_idle()
        finished: Dict[Req, str] = {}
        while True:
            broadcast_objects(msgs)
            msgs = []
            out = self.scheduler.step()
            if out is None:
                break
            finished.update(out.finished)
        self.scheduler.cache_manager.check_integrity()
        return finished

    def shutdown(self) -> None:
        if self._workers is not None:
            broadcast_objects([ExitMsg()])  # the other ranks' loops end on it
        stop_rank(self.scheduler)
        self._stop_followers()

    def _stop_followers(self, grace: float = 10.0) -> None:
        """Wait for the other ranks to end (they end on their own after an exit message, or
        after a failure at start), then remove their meeting place."""
        if self._workers is not None:
            self._workers.stop(grace=grace)
            self._workers = None

    def _encode(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt) if prompt else []
        return list(prompt)  # checked before int(): a float or a bool is refused, not cast

    def _result(self, reqs: List[Req], finished: Dict[Req, str]) -> Dict[str, Any]:
        """A prompt's dict: choice 0's keys, the prompt's, and every choice under "choices"."""
        choices = [self._choice(req, finished[req]) for req in reqs]
        result = {**choices[0], "prompt_token_ids": list(reqs[0].input_ids), "choices": choices}
        if reqs[0].prompt_logprobs is not None:
            result["prompt_logprobs"] = reqs[0].prompt_logprobs
        return result

    def _choice(self, req: Req, why: str) -> Dict[str, Any]:
        ids = req.output_ids
        ended_at_eos = why == "eos"
        # drop the EOS itself, even one that is not a special token; then any special token
        text = (
            self.tokenizer.decode(ids[:-1] if ended_at_eos else ids, skip_special_tokens=True)
            if self.has_tokenizer
            else None
        )  # None: config.json alone, no tokenizer
        choice = {"text": text, "token_ids": list(ids), "finish_reason": why}
        if req.output_logprobs is not None:
            choice["logprobs"] = req.output_logprobs
        return choice


def _our_names(options: Dict[str, Any]) -> Dict[str, Any]:
    """The options with upstream's names renamed to ours; both names at once is an error."""
    renamed = dict(options)
    for theirs, ours in UPSTREAM_OPTIONS.items():
        if theirs in renamed:
            if ours in renamed:
                raise TypeError(f"give {ours!r} or upstream's {theirs!r}, not both")
            renamed[ours] = renamed.pop(theirs)
    return renamed
