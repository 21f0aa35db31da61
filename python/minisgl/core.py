"""The engine's shared vocabulary: how to sample (``SamplingParams``), a request (``Req``), the
log-probabilities it may ask for (``Logprobs``), the requests run together (``Batch``), and the
one ``Context`` every layer can reach."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Collection, Dict, Iterator, List, Literal

import torch

if TYPE_CHECKING:
    from minisgl.attention.base import BaseAttnBackend
    from minisgl.kvcache.base import BaseKVCachePool


@dataclass
class SamplingParams:
    """How to pick each next token of one request."""

    temperature: float = 0.0  # 0: greedy, the most likely token; else divides the logits
    top_k: int = -1  # keep only the k most likely tokens; -1: no limit
    top_p: float = 1.0  # keep the most likely tokens until their probability reaches top_p
    max_tokens: int = 128  # new tokens at most
    ignore_eos: bool = False  # go on past the end-of-sequence token
    seed: int | None = None  # draws of its own, whatever the batch; None: the sampler's
    # structured output: at most one; None: free text
    json_schema: str | None = None  # JSON valid under this schema ("{}": any JSON)
    regex: str | None = None  # text this regular expression matches whole
    ebnf: str | None = None  # a sentence of this EBNF grammar, from its rule ``root``
    # log-probabilities: None, none; k: the chosen token's and the k most likely (k may be 0)
    logprobs: int | None = None  # of each new token
    prompt_logprobs: int | None = None  # of each prompt token after the first (echo)
    n: int = 1  # completions drawn from the one prompt, choice i with seed choice_seed(seed, i)
    # changes to the logits before the draw (OpenAI's, SGLang's and vLLM's definitions)
    presence_penalty: float = 0.0  # minus this from every token the output holds already
    frequency_penalty: float = 0.0  # minus this times how often the output holds the token
    repetition_penalty: float = 1.0  # divides a positive logit, multiplies a negative one, of
    # every token the prompt or the output holds
    logit_bias: Dict[int, float] | None = None  # token id -> added to its logit

    def __post_init__(self) -> None:
        if self.logit_bias is not None:  # JSON's keys are strings: "50256" means token 50256
            self.logit_bias = _bias_by_token(self.logit_bias)
        self.validate()

    def validate(self) -> None:
        """A ValueError naming the field that is out of range. The engine calls it again when a
        request arrives: a dataclass can be changed after it was made."""
        # "not x >= 0" rather than "x < 0": NaN is refused too
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (no limit) or >= 1, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.seed is not None and not 0 <= self.seed < 2**31:
            raise ValueError(f"seed must be in [0, 2**31), got {self.seed}")
        constraints = [k for k in ("json_schema", "regex", "ebnf") if getattr(self, k) is not None]
        if len(constraints) > 1:
            raise ValueError(f"at most one of json_schema, regex, ebnf, got {constraints}")
        if constraints and not getattr(self, constraints[0]).strip():
            raise ValueError(f"{constraints[0]} is empty")
        self._validate_reply()
        self._validate_penalties()

    def _validate_reply(self) -> None:
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (isinstance(k, bool) or not 0 <= k <= MAX_TOP_LOGPROBS):
                raise ValueError(f"{name} must be None or in [0, {MAX_TOP_LOGPROBS}], got {k!r}")
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be in [1, {MAX_N}], got {self.n}")

    def _validate_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty < float("inf"):
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for token, bias in (self.logit_bias or {}).items():
            if token < 0 or not -100.0 <= bias <= 100.0:
                raise ValueError(
                    "logit_bias must map token ids >= 0 to biases in [-100, 100], "
                    f"got {token}: {bias}"
                )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        """Whether a penalty or a bias changes this request's logits before the draw."""
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
            or bool(self.logit_bias)
        )

    def for_choice(self, index: int) -> SamplingParams:
        """The parameters of choice ``index`` of ``n``: one completion, its own seed."""
        return replace(self, n=1, seed=choice_seed(self.seed, index))


MAX_TOP_LOGPROBS = 20  # alternatives a position reports at most (OpenAI's limit)
MAX_N = 128  # choices a request asks at most (OpenAI's limit)


def choice_seed(seed: int | None, index: int) -> int | None:
    """Choice ``index``'s seed: choice 0 keeps the request's (n = 1 is the request itself), the
    others get seeds of their own, each a function of (seed, index) alone."""
    if seed is None or index == 0:
        return seed
    return (seed + index * 0x9E3779B1) % 2**31  # the golden ratio's step spreads them out


def _bias_by_token(bias: Dict[Any, Any]) -> Dict[int, float]:
    """logit_bias with int keys; a ValueError naming a key that is not a token id."""
    try:
        return {int(token): float(value) for token, value in bias.items()}
    except (TypeError, ValueError):
        raise ValueError(f"logit_bias must map token ids to numbers, got {bias!r}") from None


@dataclass
class Logprobs:
    """Log-probabilities at a run of positions, one entry per position, in order: the token at
    the position, its log-probability, and the most likely tokens there, best first. A prompt's
    first token has none (nothing comes before it), so its entry is None and its list empty."""

    token_ids: List[int] = field(default_factory=list)
    logprobs: List[float | None] = field(default_factory=list)
    top_ids: List[List[int]] = field(default_factory=list)
    top_logprobs: List[List[float]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    def append(self, token: int, logprob: float | None, top: List[tuple]) -> None:
        """One position: its token, the token's log-probability, [(id, logprob)] best first."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        self.top_ids.append([t for t, _ in top])
        self.top_logprobs.append([lp for _, lp in top])

    def extend(self, other: Logprobs) -> None:
        self.token_ids += other.token_ids
        self.logprobs += other.logprobs
        self.top_ids += other.top_ids
        self.top_logprobs += other.top_logprobs

    def slice(self, start: int, end: int | None = None) -> Logprobs:
        return Logprobs(
            self.token_ids[start:end],
            self.logprobs[start:end],
            self.top_ids[start:end],
            self.top_logprobs[start:end],
        )


@dataclass(eq=False)
class Req:
    """One request: its prompt, the tokens generated so far, and how to sample the next one.

    Its K and V live in the KV cache: tokens ``[0, cached_len)`` are there already, and the next
    forward runs tokens ``[cached_len, device_len)`` (the whole prompt at first, then one token per
    step; a part of the prompt under chunked prefill). ``table_idx`` is its row of the page table.
    """

    uid: int
    input_ids: List[int]  # the prompt
    sampling_params: SamplingParams
    output_ids: List[int] = field(default_factory=list)
    table_idx: int = -1  # its row of the page table; -1 until it has one
    cached_len: int = 0  # tokens whose K and V are in the cache
    device_len: int = -1  # the next forward runs up to here; -1: every token so far
    cache_handle: Any = None  # the prefix it shares with the prefix cache
    # what its params ask of log-probabilities, filled as its tokens come (None: not asked)
    output_logprobs: Logprobs | None = None
    prompt_logprobs: Logprobs | None = None  # the first token's entry None, then one a token

    def __post_init__(self) -> None:
        if self.device_len < 0:
            self.device_len = len(self.input_ids) + len(self.output_ids)
        params = self.sampling_params
        if params.logprobs is not None and self.output_logprobs is None:
            self.output_logprobs = Logprobs()
        if params.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = Logprobs()
            self.prompt_logprobs.append(self.input_ids[0], None, [])

    @property
    def needs_prompt_logits(self) -> bool:
        """Its prompt's log-probabilities are asked and not all known: its prefill needs the
        logits at every prompt position, so no cached prefix can stand in for them."""
        lp = self.prompt_logprobs
        return lp is not None and len(lp) < len(self.input_ids)

    @property
    def all_ids(self) -> List[int]:
        return self.input_ids + self.output_ids

    @property
    def new_ids(self) -> List[int]:
        """The tokens the next forward runs, positions cached_len .. device_len - 1, sliced from
        the prompt and the output without joining them (``all_ids`` copies both every step)."""
        n, start, end = len(self.input_ids), self.cached_len, self.device_len
        return self.input_ids[start:end] + self.output_ids[max(start - n, 0) : max(end - n, 0)]

    @property
    def extend_len(self) -> int:
        """How many tokens the next forward runs for this request."""
        return self.device_len - self.cached_len

    @property
    def max_len(self) -> int:
        """The most tokens it can ever have: prompt plus max_tokens."""
        return len(self.input_ids) + self.sampling_params.max_tokens

    def complete_forward(self) -> None:
        """The forward has run: the K and V of its tokens are in the cache now."""
        self.cached_len = self.device_len

    def append(self, token_id: int) -> None:
        """A new token; the next forward runs it (its K and V are not cached yet)."""
        self.output_ids.append(token_id)
        self.device_len = len(self.input_ids) + len(self.output_ids)

    @property
    def num_sampled(self) -> int:
        """Tokens sampled so far, a token still on its way to the host included."""
        return max(self.device_len - len(self.input_ids), 0)

    @property
    def can_decode(self) -> bool:
        """Below max_tokens, counting the tokens the host has not received yet."""
        return self.device_len < self.max_len

    def sampled_on_device(self) -> None:
        """A forward has sampled its next token, which the host does not have yet:
        the next forward runs it from the device, so it counts in ``device_len`` already."""
        self.device_len += 1

    def append_host(self, token_id: int) -> None:
        """The host receives the token ``sampled_on_device`` counted already."""
        self.output_ids.append(token_id)

    def finish_reason(self, eos_token_id: int | Collection[int] | None) -> str | None:
        """Why the request is finished after its last token, or None: "eos" when that token ends
        the sequence (unless the request ignores EOS), else "length" once it has max_tokens
        tokens. ``eos_token_id`` is one id or several (a model may name more than one), or
        None."""
        ids, params = self.output_ids, self.sampling_params
        eos_ids = (eos_token_id,) if isinstance(eos_token_id, int) else eos_token_id or ()
        if ids and not params.ignore_eos and ids[-1] in eos_ids:
            return "eos"
        return "length" if len(ids) >= params.max_tokens else None

    def is_finished(self, eos_token_id: int | Collection[int] | None) -> bool:
        return self.finish_reason(eos_token_id) is not None


@dataclass
class Batch:
    """The requests run together in one forward pass: each brings ``extend_len`` new tokens, laid
    one request after another, and gets one row of logits (its last token's) and one new token.

    The tensors are made just before its forward (by ``sequence_logits`` for one sequence; by
    the engine for a batch), T new tokens: input_ids, positions, out_loc: [T]; ``out_loc`` is
    the KV slot each token's K and V go to.
    """

    reqs: List[Req]
    phase: Literal["prefill", "decode", "verify"] = "decode"  # verify: drafts to check
    input_ids: torch.Tensor | None = field(default=None, repr=False)
    positions: torch.Tensor | None = field(default=None, repr=False)
    out_loc: torch.Tensor | None = field(default=None, repr=False)
    table_rows: torch.Tensor | None = field(default=None, repr=False)  # [T] each token's row
    # the new tokens whose logits the model computes (each request's last, and every prompt
    # token of a request that asks its prompt's log-probabilities); None: every token's
    logits_rows: torch.Tensor | None = field(default=None, repr=False)
    # [B] each request's sampled row among those logits; None: row i is request i's
    sample_rows: torch.Tensor | None = field(default=None, repr=False)
    logprob_plan: Any = field(default=None, repr=False)  # which rows report log-probabilities
    logprobs: Any = field(default=None, repr=False)  # and what they reported, on the device
    attn_metadata: Any = field(default=None, repr=False)  # the attention backend's, per batch

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def is_prefill(self) -> bool:
        """A prompt, or a chunk of one, for each request."""
        return self.phase == "prefill"

    @property
    def is_extend(self) -> bool:
        """Its requests may bring several tokens each (a prompt, its chunk, or drafts to
        verify): the extend path of attention, not a decode step."""
        return self.phase != "decode"


@dataclass
class Context:
    """What every layer may need for the batch being run, in one place rather than passed down
    through every forward call. The engine makes one and makes it the global one while it
    runs a batch (``use_global_ctx``).

    page_table: [rows, max_seq_len] int32, row ``req.table_idx``: the KV slot of each of the
    request's tokens (a slot is ``page * page_size + offset`` in the KV pool).
    """

    page_size: int = 1
    page_table: torch.Tensor | None = field(default=None, repr=False)
    attn_backend: BaseAttnBackend | None = None
    kv_cache: BaseKVCachePool | None = field(default=None, repr=False)
    moe_backend: Any = None  # how MoE layers compute their experts; None if dense
    _batch: Batch | None = field(default=None, repr=False)

    @property
    def batch(self) -> Batch:
        if self._batch is None:
            raise RuntimeError("no batch is being run: run it inside ctx.forward_batch(batch)")
        return self._batch

    @contextmanager
    def forward_batch(self, batch: Batch) -> Iterator[None]:
        """``batch`` is the context's batch for the duration of the ``with`` block."""
        if self._batch is not None:
            raise RuntimeError("a batch is already being run: forward_batch does not nest")
        self._batch = batch
        try:
            yield
        finally:
            self._batch = None


_GLOBAL_CTX: Context | None = None


def set_global_ctx(ctx: Context) -> None:
    global _GLOBAL_CTX
    _GLOBAL_CTX = ctx


def get_global_ctx() -> Context:
    if _GLOBAL_CTX is None:
        raise RuntimeError("no global Context: the engine sets one with set_global_ctx()")
    return _GLOBAL_CTX


@contextmanager
def use_global_ctx(ctx: Context) -> Iterator[Context]:
    """``ctx`` is the global context inside the ``with`` block, the previous one again after."""
    global _GLOBAL_CTX
    previous, _GLOBAL_CTX = _GLOBAL_CTX, ctx
    try:
        yield ctx
    finally:
        _GLOBAL_CTX = previous
