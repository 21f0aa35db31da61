"""What the scheduler receives (from the tokenizer worker)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

import torch

from minisgl.core import SamplingParams

from .utils import classes_by_name, from_dict, to_dict


@dataclass
class BaseBackendMsg:
    @staticmethod
    def encoder(msg: BaseBackendMsg) -> Dict[str, Any]:
        return to_dict(msg)

    @staticmethod
    def decoder(data: Dict[str, Any]) -> BaseBackendMsg:
        return from_dict(data, _CLASSES)


@dataclass
class BatchBackendMsg(BaseBackendMsg):
    data: List[BaseBackendMsg]  # several messages in one send


@dataclass
class UserMsg(BaseBackendMsg):
    """A tokenized request: run it."""

    uid: int  # the frontend's id of the request, in every message about it
    input_ids: torch.Tensor  # the prompt: [prompt_len] int32, on the CPU
    sampling_params: SamplingParams


@dataclass
class AbortBackendMsg(BaseBackendMsg):
    """Stop the request now and give back its pages (its client left, or a stop string)."""

    uid: int


@dataclass
class ExitMsg(BaseBackendMsg):
    """Shut down: the tokenizer worker passes it on to the scheduler, then both exit."""


_CLASSES = classes_by_name(BatchBackendMsg, UserMsg, AbortBackendMsg, ExitMsg, SamplingParams)
