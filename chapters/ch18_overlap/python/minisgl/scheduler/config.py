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

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_extend_tokens < 1:
            raise ValueError(f"max_extend_tokens must be >= 1, got {self.max_extend_tokens}")
