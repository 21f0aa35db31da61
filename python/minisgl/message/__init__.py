"""The messages the processes exchange: dataclasses, sent as msgpack'd dicts over ZMQ.

frontend --TokenizeMsg/AbortMsg--> tokenizer worker --UserMsg/AbortBackendMsg--> scheduler
scheduler --DetokenizeMsg--> tokenizer worker (the detokenizer) --UserReply--> frontend
"""

from .backend import AbortBackendMsg, BaseBackendMsg, BatchBackendMsg, ExitMsg, UserMsg
from .frontend import BaseFrontendMsg, BatchFrontendMsg, UserReply
from .tokenizer import AbortMsg, BaseTokenizerMsg, BatchTokenizerMsg, DetokenizeMsg, TokenizeMsg

__all__ = [
    "AbortBackendMsg",
    "AbortMsg",
    "BaseBackendMsg",
    "BaseFrontendMsg",
    "BaseTokenizerMsg",
    "BatchBackendMsg",
    "BatchFrontendMsg",
    "BatchTokenizerMsg",
    "DetokenizeMsg",
    "ExitMsg",
    "TokenizeMsg",
    "UserMsg",
    "UserReply",
]
