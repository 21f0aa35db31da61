"""What the frontend (the main process: the API server, the shell) receives."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

from minisgl.core import Logprobs

from .utils import classes_by_name, from_dict, to_dict


@dataclass
class BaseFrontendMsg:
    @staticmethod
    def encoder(msg: BaseFrontendMsg) -> Dict[str, Any]:
        return to_dict(msg)

    @staticmethod
    def decoder(data: Dict[str, Any]) -> BaseFrontendMsg:
        return from_dict(data, _CLASSES)


@dataclass
class BatchFrontendMsg(BaseFrontendMsg):
    data: List[BaseFrontendMsg]  # several messages in one send


@dataclass
class UserReply(BaseFrontendMsg):
    """The next piece of one request's reply: joined, the pieces are the whole text."""

    uid: int
    incremental_output: str  # new text (possibly "" while a character or a stop is incomplete)
    finished: bool
    finish_reason: str = ""  # once finished: "length", "stop" (EOS or stop string), "error"
    # the tokens generated since the last reply; after a stop string, only those up to and
    # including the token whose text completed it (the reply's usage counts these)
    token_ids: List[int] = field(default_factory=list)
    num_prompt_tokens: int = 0
    error: str = ""  # why the request was refused
    index: int = 0  # which of the request's n choices
    logprobs: TextLogprobs | None = None  # of ``token_ids``, where the request asks
    prompt_logprobs: TextLogprobs | None = None  # in a choice's first reply, where it asks
    prompt_text: str | None = None  # in a choice's first reply, where the request echoes


@dataclass
class TextLogprobs(Logprobs):
    """``Logprobs`` with each token's bytes, which the API's ``token`` and ``bytes`` fields
    show: a token may hold part of a UTF-8 character, which no text can."""

    token_bytes: List[bytes] = field(default_factory=list)
    top_bytes: List[List[bytes]] = field(default_factory=list)

    def extend(self, other: Logprobs) -> None:
        super().extend(other)
        assert isinstance(other, TextLogprobs)
        self.token_bytes += other.token_bytes
        self.top_bytes += other.top_bytes


_CLASSES = classes_by_name(BatchFrontendMsg, UserReply, TextLogprobs)
