"""The server: an OpenAI-compatible HTTP API (``api_server``) in front of the tokenizer worker
and the scheduler process (``launch``), configured from the command line (``args``)."""

from .args import ServerArgs, parse_args
from .launch import launch_server

__all__ = ["ServerArgs", "launch_server", "parse_args"]
