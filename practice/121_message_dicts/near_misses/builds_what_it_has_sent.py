"""Breaks: a name not in classes raises TypeError."""

from __future__ import annotations

import dataclasses
from typing import Any

PLAIN = (int, float, str, bool, bytes, type(None))  # what msgpack carries as it is
_SENT: dict[str, type] = {}  # every class to_dict has turned into a dict


def to_dict(obj: Any) -> Any:
    """A dataclass as a dict tagged "__type__", inside lists and dicts too."""
    if isinstance(obj, PLAIN):
        return obj
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        _SENT[type(obj).__name__] = type(obj)
        fields = {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return {"__type__": type(obj).__name__, **fields}
    raise TypeError(f"cannot send a {type(obj).__name__} in a message")


def from_dict(data: Any, classes: dict[str, type]) -> Any:
    """The inverse of to_dict, building only the classes named in ``classes``."""
    if isinstance(data, list):
        return [from_dict(v, classes) for v in data]
    if not isinstance(data, dict):
        return data
    if "__type__" not in data:
        return {k: from_dict(v, classes) for k, v in data.items()}
    name = data["__type__"]
    classes = {**_SENT, **classes}
    if name not in classes:
        raise TypeError(f"unexpected message type {name!r}; expected one of {sorted(classes)}")
    fields = {k: from_dict(v, classes) for k, v in data.items() if k != "__type__"}
    return classes[name](**fields)
