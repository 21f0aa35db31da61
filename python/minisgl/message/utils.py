"""Messages as plain data: a dataclass becomes a dict tagged with its class name, a 1-D tensor
becomes its bytes and dtype, a dict whose keys are not all strings becomes the list of its items
(msgpack reads back string keys only), and back. ``utils/mp.py`` msgpacks these dicts over
ZMQ."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Type

import torch

PLAIN = (int, float, str, bool, bytes, type(None))  # what msgpack carries as it is


def to_dict(obj: Any) -> Any:
    """A dataclass or a 1-D tensor as a dict tagged ``__type__``, inside lists and dicts too."""
    if isinstance(obj, PLAIN):
        return obj
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]  # msgpack has one sequence type: a tuple comes back a list
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: to_dict(v) for k, v in obj.items()}
        return {"__type__": "dict", "items": [[to_dict(k), to_dict(v)] for k, v in obj.items()]}
    if isinstance(obj, torch.Tensor):
        return _tensor_to_dict(obj)
    if dataclasses.is_dataclass(obj):
        fields = {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return {"__type__": type(obj).__name__, **fields}
    raise TypeError(f"cannot send a {type(obj).__name__} in a message")


def from_dict(data: Any, classes: Dict[str, Type]) -> Any:
    """The inverse of ``to_dict``; ``classes`` maps the ``__type__`` names it may meet to classes
    (only those: a message cannot make the receiver build anything else)."""
    if isinstance(data, list):
        return [from_dict(v, classes) for v in data]
    if not isinstance(data, dict):
        return data
    if "__type__" not in data:
        return {k: from_dict(v, classes) for k, v in data.items()}
    name = data["__type__"]
    if name == "Tensor":
        return _tensor_from_dict(data)
    if name == "dict":  # a logit_bias: token id -> bias
        return {from_dict(k, classes): from_dict(v, classes) for k, v in data["items"]}
    if name not in classes:
        raise TypeError(f"unexpected message type {name!r}; expected one of {sorted(classes)}")
    fields = {k: from_dict(v, classes) for k, v in data.items() if k != "__type__"}
    return classes[name](**fields)


def classes_by_name(*classes: Type) -> Dict[str, Type]:
    return {cls.__name__: cls for cls in classes}


def _tensor_to_dict(t: torch.Tensor) -> Dict[str, Any]:
    if t.dim() != 1:
        raise ValueError(f"only 1-D tensors travel in messages, not shape {tuple(t.shape)}")
    t = t.detach().cpu().contiguous()
    # the raw bytes, seen as uint8 (numpy has no bfloat16, so torch alone does the work)
    raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"__type__": "Tensor", "dtype": str(t.dtype).removeprefix("torch."), "buffer": raw}


def _tensor_from_dict(data: Dict[str, Any]) -> torch.Tensor:
    dtype = getattr(torch, data["dtype"])
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{data['dtype']!r} is not a torch dtype")
    if not data["buffer"]:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(bytearray(data["buffer"]), dtype=dtype)  # a copy: writable, owned
