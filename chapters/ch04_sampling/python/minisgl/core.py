"""The engine's shared vocabulary: how to sample (``SamplingParams``), a request (``Req``), the
requests run together (``Batch``), and the one ``Context`` every layer can reach."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Collection, Iterator, List


@dataclass
class SamplingParams:
    """How to pick each next token of one request."""

    temperature: float = 0.0  # 0: greedy, the most likely token; else divides the logits
    top_k: int = -1  # keep only the k most likely tokens; -1: no limit
    top_p: float = 1.0  # keep the most likely tokens until their probability reaches top_p
    max_tokens: int = 128  # new tokens at most
    ignore_eos: bool = False  # go on past the end-of-sequence token
    seed: int | None = None  # draws of its own, whatever the batch; None: the sampler's

    def __post_init__(self) -> None:
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

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(eq=False)
class Req:
    """One request: its prompt, the tokens generated so far, and how to sample the next one."""

    uid: int
    input_ids: List[int]  # the prompt
    sampling_params: SamplingParams
    output_ids: List[int] = field(default_factory=list)

    @property
    def all_ids(self) -> List[int]:
        return self.input_ids + self.output_ids

    def append(self, token_id: int) -> None:
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
    """The requests run together in one forward pass: one row of logits, one new token each."""

    reqs: List[Req]

    @property
    def size(self) -> int:
        return len(self.reqs)


@dataclass
class Context:
    """What every layer may need for the batch being run, in one place rather than passed down
    through every forward call. The engine makes one and makes it the global one
    (``set_global_ctx``)."""

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
