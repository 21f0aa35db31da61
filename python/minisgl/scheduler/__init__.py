"""The scheduler: continuous batching over the engine (request table, pages, prefill, decode)."""

from __future__ import annotations

from .config import SchedulerConfig
from .scheduler import Scheduler
from .utils import StepOutput

__all__ = ["Scheduler", "SchedulerConfig", "StepOutput"]
