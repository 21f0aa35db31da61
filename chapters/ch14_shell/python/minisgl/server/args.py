"""The server's command line, parsed into ``ServerArgs``; where a flag is also mini-sglang's it
has mini-sglang's spellings, and mini-sglang's flags for settings this server does not take on
its command line are refused."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Sequence

import torch

from minisgl.scheduler import SchedulerConfig

DTYPES = {
    "auto": None,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}


@dataclass
class ServerArgs(SchedulerConfig):
    """The engine's options (``SchedulerConfig``) and where and how to serve them."""

    host: str = "127.0.0.1"  # this machine only, unless asked otherwise
    port: int = 1919  # mini-sglang's port, so its clients need no change
    api_key: str | None = None  # when set, every request needs "Authorization: Bearer KEY"
    shell: bool = False  # the interactive shell instead of the HTTP server
    shutdown_timeout: float = 5.0  # on SIGTERM/SIGINT: seconds the replies under way may take
    # torch threads of each scheduler process; None: launch.py's engine_threads decides
    threads: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.shutdown_timeout >= 0:  # NaN too
            raise ValueError(f"shutdown_timeout must be >= 0 seconds, got {self.shutdown_timeout}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    def scheduler_config(self) -> SchedulerConfig:
        """The engine's options alone: what the scheduler process needs."""
        names = [f.name for f in fields(SchedulerConfig)]
        return SchedulerConfig(**{name: getattr(self, name) for name in names})


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m minisgl", description="Serve a model over an OpenAI-compatible HTTP API."
    )
    d = ServerArgs  # the defaults, read from the dataclass so that they are written once
    p.add_argument(
        "--model-path",
        "--model",
        dest="model_path",
        required=True,
        help="a local folder with the model's config, weights and tokenizer",
    )
    p.add_argument("--host", default=d.host, help="the address to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=d.port, help="default: %(default)s")
    p.add_argument(
        "--dtype",
        choices=list(DTYPES),
        default="auto",
        help="the weights' and activations' dtype; auto: the checkpoint's",
    )
    p.add_argument("--page-size", type=int, default=d.page_size, help="tokens per KV page")
    p.add_argument(
        "--num-pages",
        type=int,
        default=d.num_pages,
        help="KV pages (default: as many as the memory budget allows)",
    )
    p.add_argument(
        "--memory-ratio",
        type=float,
        default=d.memory_ratio,
        help="on a GPU: the share of free memory for weights and KV cache",
    )
    p.add_argument(
        "--max-running-requests",
        dest="max_running_req",
        type=int,
        default=d.max_running_req,
        help="requests in flight at once",
    )
    p.add_argument(
        "--max-prefill-length",
        "--max-extend-length",
        dest="max_extend_tokens",
        type=int,
        default=d.max_extend_tokens,
        help="prompt tokens one prefill forward takes",
    )
    p.add_argument(
        "--cache-type", choices=["radix", "naive"], default=d.cache_type, help="the prefix cache"
    )
    p.add_argument(
        "--attn",
        "--attention-backend",
        dest="attention_backend",
        default=d.attention_backend,
        help="the attention backend, by name (default: the best for the device)",
    )
    p.add_argument("--device", default=d.device, help="cpu, cuda, or auto")
    p.add_argument(
        "--threads",
        type=int,
        default=d.threads,
        help="torch threads of the scheduler process (default: OMP_NUM_THREADS if set, else "
        "the cores idle over the last minute); the other processes get one each",
    )
    p.add_argument(
        "--shell", "--shell-mode", action="store_true", help="an interactive shell, not a server"
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=d.shutdown_timeout,
        help="on SIGTERM or Ctrl-C: seconds the replies under way may take to "
        "finish before they are cut (default: %(default)s)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer API_KEY' on every /v1 route (/health and "
        "/metrics stay open, for probes and scrapers)",
    )
    return p


def parse_args(argv: Sequence[str]) -> ServerArgs:
    """``ServerArgs`` from a command line; argparse exits with a usage message on a bad flag,
    and so does a value the engine refuses (a page size of 0 ...)."""
    parser = build_parser()
    ns = vars(parser.parse_args(list(argv)))
    ns["dtype"] = DTYPES[ns["dtype"]]
    if not 0 <= ns["port"] < 65536:
        parser.error(f"--port must be in [0, 65536), got {ns['port']}")
    try:
        return ServerArgs(**ns)
    except ValueError as e:
        parser.error(str(e))
        raise  # not reached: error() exits
