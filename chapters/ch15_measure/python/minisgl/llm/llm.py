"""The offline API: prompts in, completions out, all in this process."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Dict, List, Sequence

from minisgl.core import Req, SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.utils import check_request

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
    ``max_running_req``, ``max_extend_tokens``, ``cache_type``, ``seed`` ...), or upstream's
    names for them (``UPSTREAM_OPTIONS``). ``generate`` queues every prompt at once and runs the
    scheduler until all are done, so they are batched together.
    """

    def __init__(self, model_path: str, **engine_options: Any):
        self.model_path = str(model_path)
        options = _our_names(engine_options)
        self.scheduler = Scheduler(SchedulerConfig(self.model_path, **options))

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
        generated token, the EOS that ended it too) and ``"prompt_token_ids"``.

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
        text = (
            self.tokenizer.decode(ids[:-1] if ended_at_eos else ids, skip_special_tokens=True)
            if self.has_tokenizer
            else None
        )  # None: config.json alone, no tokenizer
        return {
            "text": text,
            "token_ids": list(req.output_ids),
            "prompt_token_ids": list(req.input_ids),
        }


def _our_names(options: Dict[str, Any]) -> Dict[str, Any]:
    """The options with upstream's names renamed to ours; both names at once is an error."""
    renamed = dict(options)
    for theirs, ours in UPSTREAM_OPTIONS.items():
        if theirs in renamed:
            if ours in renamed:
                raise TypeError(f"give {ours!r} or upstream's {theirs!r}, not both")
            renamed[ours] = renamed.pop(theirs)
    return renamed
