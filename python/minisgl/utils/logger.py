from __future__ import annotations

import logging
import sys

_FORMAT = "[%(asctime)s %(name)s] %(levelname)s: %(message)s"


def init_logger(name: str, level: int = logging.WARNING) -> logging.Logger:
    """A logger writing to stderr (never into a main's prints); WARNING and above by default,
    ``logging.getLogger("minisgl").setLevel(logging.INFO)`` to see the engine's sizes."""
    logger = logging.getLogger(name)
    root = logging.getLogger("minisgl")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(level)
    return logger
