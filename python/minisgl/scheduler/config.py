from __future__ import annotations

from dataclasses import dataclass

from minisgl.engine.config import EngineConfig


@dataclass
class SchedulerConfig(EngineConfig):
    """The engine's options, and how the scheduler fills each forward."""

    max_extend_tokens: int = 1024  # prompt tokens one prefill forward takes at most
    cache_type: str = "radix"  # the prefix cache: "radix" or "naive"
    # schedule batch k+1 before batch k's tokens reach the host; None: on a GPU.
    # MINISGL_DISABLE_OVERLAP_SCHEDULING=1 turns it off whatever this says
    overlap_scheduling: bool | None = None
    # speculative decoding: None (off), "ngram" or "draft" (needs draft_model);
    # each decode step proposes speculative_k drafts a request
    speculative: str | None = None
    speculative_k: int = 4
    draft_model: str | None = None  # a smaller model with the target's tokenizer
    # where drafts do not pay, a decode step runs without them: a batch of more requests than
    # speculative_max_batch (None: no limit), a batch whose requests are expected to get fewer
    # than speculative_min_tokens tokens a step on average, and a request whose verify steps
    # lately gave it fewer than that (0: never) drafts nothing for a while
    speculative_max_batch: int | None = 8
    speculative_min_tokens: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_extend_tokens < 1:
            raise ValueError(f"max_extend_tokens must be >= 1, got {self.max_extend_tokens}")
        if self.speculative not in (None, "ngram", "draft"):
            raise ValueError(f"speculative must be 'ngram' or 'draft', got {self.speculative!r}")
        if not 1 <= self.speculative_k <= 16:
            raise ValueError(f"speculative_k must be in [1, 16], got {self.speculative_k}")
        if self.speculative_max_batch is not None and self.speculative_max_batch < 1:
            raise ValueError(
                f"speculative_max_batch must be >= 1 or None, got {self.speculative_max_batch}"
            )
        if not 0.0 <= self.speculative_min_tokens <= self.speculative_k + 1:
            raise ValueError(
                f"speculative_min_tokens must be in [0, speculative_k + 1], "
                f"got {self.speculative_min_tokens}"
            )
        if (self.speculative == "draft") != (self.draft_model is not None):
            raise ValueError("draft_model goes with speculative='draft', and only with it")
        if self.speculative and self.tp_size > 1:
            raise ValueError("speculative decoding runs at tp_size=1 only")
