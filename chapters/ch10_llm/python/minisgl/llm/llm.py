"""The offline API: prompts in, completions out, all in this process."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from transformers import AutoTokenizer

from minisgl.core import Req, SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.utils import check_request

Prompt = str | Sequence[int]  # text, or token ids


class LLM:
    """``LLM(model_path, **engine_options).generate(prompts, sampling_params)``.

    The options are ``SchedulerConfig``'s (``device``, ``page_size``, ``num_pages``,
    ``max_running_req``, ``max_extend_tokens``, ``cache_type``, ``seed`` ...). ``generate`` queues
    every prompt at once and runs the scheduler until all are done, so they are batched together.
    """

    def __init__(self, model_path: str, **engine_options: Any):
        self.scheduler = Scheduler(SchedulerConfig(str(model_path), **engine_options))
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))

    def generate(
        self, prompts: Sequence[Prompt], sampling_params: SamplingParams | Sequence[SamplingParams]
    ) -> List[Dict[str, Any]]:
        """One dict per prompt, in order: ``"text"`` (without the EOS that ended it, and without
        special tokens), ``"token_ids"`` (every generated token, the EOS that ended it too) and
        ``"prompt_token_ids"``.

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
                )
            except ValueError as e:
                raise ValueError(f"request {i}: {e}") from e
        ids = [[int(t) for t in one_ids] for one_ids in ids]  # numpy's or torch's ints: int
        reqs = [self.scheduler.add_req(i, p) for i, p in zip(ids, params)]
        finished = self.scheduler.run_until_idle()
        return [self._result(r, finished[r]) for r in reqs]

    def shutdown(self) -> None:
        self.scheduler.shutdown()

    def _encode(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt) if prompt else []
        return list(prompt)  # checked before int(): a float or a bool is refused, not cast

    def _result(self, req: Req, why: str) -> Dict[str, Any]:
        ids = req.output_ids
        ended_at_eos = why == "eos"
        # drop the EOS itself, even one that is not a special token; then any special token
        text = self.tokenizer.decode(ids[:-1] if ended_at_eos else ids, skip_special_tokens=True)
        return {
            "text": text,
            "token_ids": list(req.output_ids),
            "prompt_token_ids": list(req.input_ids),
        }
