"""The server's command line, parsed into ``ServerArgs``; where a flag is also mini-sglang's it
has mini-sglang's spellings, and mini-sglang's flags for settings this server does not take on
its command line are refused."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path
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
    served_model_name: str | None = None  # the model's id in the API; None: its folder's name
    tool_call_parser: str | None = None  # the tool-call syntax; None: read from the template

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


def served_model_name(args: ServerArgs) -> str:
    """The model's id in the API: ``--served-model-name``, else the model folder's name."""
    return args.served_model_name or Path(args.model_path).name


# SGLang's --speculative-algorithm values that this engine builds, and their names here
SGLANG_ALGORITHMS = {"NGRAM": "ngram", "STANDALONE": "draft"}


def _sglang_speculation(parser: argparse.ArgumentParser, ns: dict) -> None:
    """SGLang's two speculation flags, in SGLang's meanings, turned into this engine's."""
    algorithm = ns.pop("speculative_algorithm")
    if algorithm is not None:
        if ns["speculative"] not in (None, SGLANG_ALGORITHMS[algorithm]):
            parser.error(
                f"--speculative-algorithm {algorithm} and --speculative {ns['speculative']} "
                "disagree: give one of them"
            )
        ns["speculative"] = SGLANG_ALGORITHMS[algorithm]
    verified = ns.pop("speculative_num_draft_tokens")
    if verified is not None:
        if verified < 2:
            parser.error(
                f"--speculative-num-draft-tokens counts the request's last token as well as "
                f"its drafts, so it is at least 2 (one draft); got {verified}"
            )
        ns["speculative_k"] = verified - 1


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
        "--tp-size",
        "--tensor-parallel-size",
        dest="tp_size",
        type=int,
        default=d.tp_size,
        help="tensor parallelism: one process (and GPU) per rank",
    )
    p.add_argument(
        "--speculative",
        choices=["ngram", "draft"],
        default=None,
        help="speculative decoding: drafts from the request's own n-grams, or from "
        "--draft-model (default: off)",
    )
    p.add_argument(
        "--speculative-algorithm",
        type=str.upper,
        choices=list(SGLANG_ALGORITHMS),
        default=None,
        help="SGLang's flag: NGRAM is --speculative ngram, STANDALONE --speculative draft",
    )
    p.add_argument(
        "--speculative-k",
        type=int,
        default=d.speculative_k,
        help="draft tokens a request per step (default: %(default)s)",
    )
    p.add_argument(
        "--speculative-num-draft-tokens",
        type=int,
        default=None,
        help="SGLang's flag: the tokens a request verifies a step, its last token included, "
        "so --speculative-k plus one",
    )
    p.add_argument(
        "--draft-model",
        "--speculative-draft-model-path",
        dest="draft_model",
        default=None,
        help="with --speculative draft: a smaller model with the same tokenizer",
    )
    p.add_argument(
        "--speculative-max-batch",
        type=int,
        default=d.speculative_max_batch,
        help="decode batches of more requests run without drafts (default: %(default)s)",
    )
    p.add_argument(
        "--speculative-min-tokens",
        type=float,
        default=d.speculative_min_tokens,
        help="a request whose verify steps lately gave it fewer tokens a step drafts "
        "nothing for a while (default: %(default)s)",
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
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model's id in the API, which requests name (default: the model folder's name)",
    )
    p.add_argument(
        "--tool-call-parser",
        choices=["hermes", "llama3_json"],
        default=None,
        help="the syntax of the model's tool calls (default: read from its chat template)",
    )
    return p


def parse_args(argv: Sequence[str]) -> ServerArgs:
    """``ServerArgs`` from a command line; argparse exits with a usage message on a bad flag,
    and so does a value the engine refuses (a page size of 0 ...)."""
    parser = build_parser()
    ns = vars(parser.parse_args(list(argv)))
    ns["dtype"] = DTYPES[ns["dtype"]]
    _sglang_speculation(parser, ns)
    if not 0 <= ns["port"] < 65536:
        parser.error(f"--port must be in [0, 65536), got {ns['port']}")
    try:
        return ServerArgs(**ns)
    except ValueError as e:
        parser.error(str(e))
        raise  # not reached: error() exits
