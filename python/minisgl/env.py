"""Settings read from the environment (``MINISGL_*``): the few knobs that are not worth a flag,
read when they are used so that a test can set them for one server."""

from __future__ import annotations

import os


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None


def ready_timeout_s() -> float:
    """How long the workers may take to load the model and say they are ready."""
    return _float("MINISGL_READY_TIMEOUT_S", 300.0)


def failure_grace_s() -> float:
    """After a worker dies: how long the server answers 503 (so clients learn why) before it
    exits."""
    return _float("MINISGL_FAILURE_GRACE_S", 2.0)


def disable_overlap_scheduling() -> bool:
    """``MINISGL_DISABLE_OVERLAP_SCHEDULING=1`` (or true, yes): the scheduler waits for each
    batch's tokens before it schedules the next, whatever its config says."""
    return os.environ.get("MINISGL_DISABLE_OVERLAP_SCHEDULING", "").lower() in ("1", "true", "yes")


def disable_fused_kernels() -> bool:
    """``MINISGL_DISABLE_FUSED_KERNELS=1`` (or true, yes): on a GPU, the decoder's residual add +
    RMSNorm, its q/k norms + rotary embedding and the sampler run as torch operations, not
    the fused Triton kernels."""
    return os.environ.get("MINISGL_DISABLE_FUSED_KERNELS", "").lower() in ("1", "true", "yes")
