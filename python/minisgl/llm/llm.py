"""The offline API: prompts in, completions out, in this process (and, under tensor
parallelism, one spawned process per further rank)."""

from __future__ import annotations

import multiprocessing as mp
import shutil
import tempfile
from dataclasses import replace
from functools import cached_property
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from minisgl.core import Req, SamplingParams
from minisgl.distributed import broadcast_objects, destroy_distributed, init_distributed
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.utils import check_request

Prompt = str | Sequence[int]  # text, or token ids
# upstream mini-sglang's option names -> ours, so that its scripts run unchanged
UPSTREAM_OPTIONS = {"max_seq_len_override": "max_seq_len", "num_page_override": "num_pages",
                    "use_dummy_weight": "dummy_weights"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class LLM:
    """``LLM(model_path, **engine_options).generate(prompts, sampling_params)``.

    The options are ``SchedulerConfig``'s (``device``, ``page_size``, ``num_pages``,
    ``max_running_req``, ``max_extend_tokens``, ``cache_type``, ``seed``, ``tp_size`` ...), or
    upstream's names for them (``UPSTREAM_OPTIONS``). ``generate`` queues every prompt at once
    and runs the scheduler until all are done, so they are batched together.

    With ``tp_size=N`` this process is rank 0 and N - 1 spawned processes are the others: each
    builds the same scheduler on its shard of the model, and rank 0 broadcasts every
    ``generate``'s requests, so all ranks run the same batches and meet in every all-reduce.
    """

    def __init__(self, model_path: str, **engine_options: Any):
        self.model_path = str(model_path)
        config = SchedulerConfig(self.model_path, **_our_names(engine_options))
        self._followers: List[BaseProcess] = []
        self._tp_dir: str | None = None
        if config.tp_size == 1:
            self.scheduler = Scheduler(config)
            return
        config = self._start_followers(config)
        try:
            init_distributed(0, config.tp_size, str(config.dist_init_addr), config.device)
            self.scheduler = Scheduler(config)
        except BaseException:  # a model that does not split (heads over ranks ...): no rank left
            self._stop_followers()
            raise

    def _start_followers(self, config: SchedulerConfig) -> SchedulerConfig:
        """Spawn ranks 1..N-1; rank 0's config. They meet at a file in a directory of their own
        (no port to pick, none to collide)."""
        if config.dist_init_addr is None:
            self._tp_dir = tempfile.mkdtemp(prefix="minisgl-tp-")
            config = replace(config, dist_init_addr=f"file://{self._tp_dir}/init")
        spawn = mp.get_context("spawn")  # a fresh interpreter: no state of ours inherited
        for rank in range(1, config.tp_size):
            proc = spawn.Process(target=follow_rank0, args=(replace(config, tp_rank=rank),),
                                 name=f"minisgl-tp{rank}", daemon=True)
            proc.start()
            self._followers.append(proc)
        return replace(config, tp_rank=0)

    @cached_property
    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer, read when first needed: prompts given as token ids need
        no tokenizer files (a benchmark's model may be config.json alone)."""
        from transformers import AutoTokenizer

        if not self.has_tokenizer:
            raise ValueError(f"{self.model_path!r} has no tokenizer files: give prompts as "
                             "token ids")
        return AutoTokenizer.from_pretrained(self.model_path)

    @cached_property
    def has_tokenizer(self) -> bool:
        return any((Path(self.model_path) / name).is_file() for name in TOKENIZER_FILES)

    def generate(self, prompts: Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams]
                 ) -> List[Dict[str, Any]]:
        """One dict per prompt, in order: ``"text"`` (without the EOS that ended it, and without
        special tokens; None when the model has no tokenizer files), ``"token_ids"`` (every
        generated token, the EOS that ended it too) and ``"prompt_token_ids"``.

        A bad request raises a ValueError naming its field before any request runs."""
        if isinstance(prompts, str) or any(isinstance(p, int) for p in prompts):
            raise TypeError("prompts must be a list of prompts (strings or lists of token ids), "
                            "not one prompt")
        params = sampling_params
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params has {len(params)} entries for "
                             f"{len(prompts)} prompts")
        ids = [self._encode(p) for p in prompts]
        for i, (one_ids, one_params) in enumerate(zip(ids, params)):
            try:
                check_request(one_ids, one_params, self.scheduler.engine.max_seq_len,
                              self.scheduler.engine.model_config.vocab_size)
                self.scheduler.grammars.check(one_params)  # compiled now: none queued if bad
            except ValueError as e:
                raise ValueError(f"request {i}: {e}") from e
        ids = [[int(t) for t in one_ids] for one_ids in ids]  # numpy's or torch's ints: int
        if self._followers:  # the other ranks queue the same requests, in the same order
            broadcast_objects(list(zip(ids, params)))
        reqs = [self.scheduler.add_req(i, p) for i, p in zip(ids, params)]
        finished = self.scheduler.run_until_idle()
        return [self._result(r, finished[r]) for r in reqs]

    def shutdown(self) -> None:
        self.scheduler.shutdown()
        if self._followers:
            broadcast_objects(None)  # the other ranks' signal to stop
            self._stop_followers()

    def _stop_followers(self, grace: float = 10.0) -> None:
        """Wait for the other ranks to end (they end on their own after None, or after a
        failure at start), leave the process group, remove the meeting place."""
        for proc in self._followers:
            proc.join(grace)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        self._followers = []
        destroy_distributed()
        if self._tp_dir is not None:
            shutil.rmtree(self._tp_dir, ignore_errors=True)

    def _encode(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt) if prompt else []
        return list(prompt)  # checked before int(): a float or a bool is refused, not cast

    def _result(self, req: Req, why: str) -> Dict[str, Any]:
        ids = req.output_ids
        ended_at_eos = why == "eos"
        # drop the EOS itself, even one that is not a special token; then any special token
        text = (self.tokenizer.decode(ids[:-1] if ended_at_eos else ids, skip_special_tokens=True)
                if self.has_tokenizer else None)  # None: config.json alone, no tokenizer
        return {"text": text, "token_ids": list(req.output_ids),
                "prompt_token_ids": list(req.input_ids)}


def follow_rank0(config: SchedulerConfig) -> None:
    """A rank other than 0, in its own process: its shard of the model, and rank 0's requests
    run exactly as rank 0 runs them (the same batches, the same tokens), until None comes."""
    init_distributed(config.tp_rank, config.tp_size, str(config.dist_init_addr), config.device)
    scheduler = Scheduler(config)
    try:
        while (requests := broadcast_objects(None)) is not None:
            batch: List[Tuple[List[int], SamplingParams]] = requests
            for ids, params in batch:
                scheduler.add_req(ids, params)
            scheduler.run_until_idle()
    finally:
        scheduler.shutdown()
        destroy_distributed()


def _our_names(options: Dict[str, Any]) -> Dict[str, Any]:
    """The options with upstream's names renamed to ours; both names at once is an error."""
    renamed = dict(options)
    for theirs, ours in UPSTREAM_OPTIONS.items():
        if theirs in renamed:
            if ours in renamed:
                raise TypeError(f"give {ours!r} or upstream's {theirs!r}, not both")
            renamed[ours] = renamed.pop(theirs)
    return renamed
