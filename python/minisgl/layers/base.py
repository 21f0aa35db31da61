from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Tuple, Union

import torch

StateDict = Dict[str, torch.Tensor]
Weights = Union[Mapping[str, torch.Tensor], Iterable[Tuple[str, torch.Tensor]]]  # or streamed


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _first(names: list[str], k: int = 5) -> str:
    more = f" and {len(names) - k} more" if len(names) > k else ""
    return ", ".join(repr(n) for n in names[:k]) + more


class BaseOP:
    """An op of the model: a plain object whose tensor attributes are its weights.

    There is no ``nn.Module`` machinery: ``state_dict`` finds the weights by walking the object's
    attributes. A tensor is a weight; a ``BaseOP`` is walked into; so is a list of them, its items
    named by index (``layers.0``); ``None`` and other values are ignored. Names starting with ``_``
    are private (caches, communicators) and neither saved nor loaded. Subclasses create their
    tensors in ``__init__`` with a bare ``torch.empty`` (dtype and device are the defaults in force
    while the model is built) and need not call ``super().__init__()``.
    """

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement forward")

    def state_dict(self, prefix: str = "") -> StateDict:
        """Every weight by its dotted name. The values are the op's own tensors, not copies."""
        result: StateDict = {}
        for name, value in vars(self).items():
            if name.startswith("_"):
                continue
            key = _join(prefix, name)
            if isinstance(value, torch.Tensor):
                result[key] = value
            elif isinstance(value, BaseOP):
                result.update(value.state_dict(key))
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, BaseOP):
                        result.update(item.state_dict(_join(key, str(i))))
        return result

    @torch.inference_mode()  # also lets us write into tensors made under inference mode
    def load_state_dict(self, state: Weights, prefix: str = "") -> None:
        """Copy weights into the op's tensors, in place (converting dtype and device).

        ``state`` is a mapping, or a stream of ``(name, tensor)`` pairs: a checkpoint is streamed,
        so only the tensor being copied needs to be in memory. Strict: every key must be a weight
        of this op's shape, and every weight must arrive.
        """
        own = self.state_dict(prefix)
        pairs = state.items() if isinstance(state, Mapping) else state
        loaded = set()
        for name, new in pairs:
            if name not in own:
                raise ValueError(f"unexpected weights in the state dict: {name!r}")
            tensor = own[name]
            if new.shape != tensor.shape:
                raise ValueError(
                    f"shape mismatch for {name!r}: the op holds {tuple(tensor.shape)}, "
                    f"the state dict has {tuple(new.shape)}"
                )
            tensor.copy_(new)
            loaded.add(name)
        missing = [name for name in own if name not in loaded]
        if missing:
            raise ValueError(f"missing weights in the state dict: {_first(missing)}")
