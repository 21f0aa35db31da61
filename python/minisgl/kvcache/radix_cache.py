"""The radix prefix cache: every cached token sequence in one tree, shared prefixes stored once.

Each edge holds a run of tokens and their KV slots; a path from the root spells a cached prefix.
Requests lock the path they use (reference counts up to the root); only unlocked leaves are
evicted, the least recently used first. With pages of several tokens everything is page-aligned:
edges hold whole pages, and a child is found by its first page of tokens.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple

import torch

from .base import BaseCacheHandle, BasePrefixCache, InsertResult, SizeInfo


class RadixTreeNode:
    """An edge into this node: ``key`` tokens whose K and V sit in ``value`` slots [len(key)]."""

    _created = 0  # a creation number per node: ties in the LRU order break the same way

    def __init__(
        self,
        key: List[int],
        value: torch.Tensor,
        parent: RadixTreeNode | None,
        last_access: int = 0,
    ):
        self.key, self.value, self.parent = key, value, parent
        self.children: Dict[Tuple[int, ...], RadixTreeNode] = {}  # by their first page
        self.ref_count = 0  # requests using this node (and so its whole path from the root)
        self.last_access = last_access
        self.order = RadixTreeNode._created
        RadixTreeNode._created += 1

    @property
    def length(self) -> int:
        return len(self.key)

    def is_leaf(self) -> bool:
        return not self.children

    def __lt__(self, other: RadixTreeNode) -> bool:  # for the eviction heap: oldest first
        return (self.last_access, self.order) < (other.last_access, other.order)


@dataclass(frozen=True)
class RadixCacheHandle(BaseCacheHandle):
    node: RadixTreeNode  # the matched prefix is the path from the root to here

    def get_matched_indices(self) -> torch.Tensor:
        values, node = [], self.node
        while node.parent is not None:
            values.append(node.value)
            node = node.parent
        return torch.cat(values[::-1]) if values else torch.empty(0, dtype=torch.int32)


class RadixPrefixCache(BasePrefixCache):
    def __init__(self, page_size: int):
        self.page_size = page_size
        self.root = RadixTreeNode([], torch.empty(0, dtype=torch.int32), None)
        self.root.ref_count = 1  # never evicted
        self.evictable_size = 0  # tokens in unlocked nodes
        self.protected_size = 0  # tokens in locked nodes
        self._clock = 0  # a logical clock for LRU: bumped at every match and insert

    def match_prefix(self, input_ids: Sequence[int]) -> BaseCacheHandle:
        node, matched = self._walk(list(input_ids))
        return RadixCacheHandle(matched, node)

    def insert_prefix(self, input_ids: Sequence[int], slots: torch.Tensor) -> InsertResult:
        n = len(input_ids) // self.page_size * self.page_size  # whole pages only
        ids = list(input_ids[:n])
        node, matched = self._walk(ids)
        if matched < n:
            leaf = RadixTreeNode(ids[matched:], slots[matched:n].clone(), node, self._clock)
            node.children[self._page_key(leaf.key)] = leaf
            self.evictable_size += leaf.length
            node = leaf
        return InsertResult(matched, RadixCacheHandle(n, node))

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        """Add (or remove) one reference on every node from the handle's up to the root."""
        assert isinstance(handle, RadixCacheHandle)
        node = handle.node
        while node.parent is not None:
            if unlock:
                node.ref_count -= 1
                if node.ref_count == 0:
                    self._move(node.length, to_evictable=True)
            else:
                if node.ref_count == 0:
                    self._move(node.length, to_evictable=False)
                node.ref_count += 1
            node = node.parent

    def evict(self, size: int) -> torch.Tensor:
        """Remove unlocked leaves, least recently used first, until ``size`` tokens are gone; a
        parent left an unlocked leaf becomes a candidate in turn."""
        if size > self.evictable_size:
            raise RuntimeError(f"cannot evict {size} tokens: only {self.evictable_size} unlocked")
        leaves = [n for n in self._nodes() if n.is_leaf() and n.ref_count == 0]
        heapq.heapify(leaves)
        evicted: List[torch.Tensor] = []
        freed = 0
        while freed < size:
            node = heapq.heappop(leaves)
            parent = node.parent
            assert parent is not None
            del parent.children[self._page_key(node.key)]
            evicted.append(node.value)
            freed += node.length
            self.evictable_size -= node.length
            if parent.is_leaf() and parent.ref_count == 0:
                heapq.heappush(leaves, parent)
        return torch.cat(evicted) if evicted else torch.empty(0, dtype=torch.int32)

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(self.evictable_size, self.protected_size)

    def check_integrity(self) -> None:
        evictable = protected = 0
        slots: List[int] = []
        for node in self._nodes():
            assert node.parent is not None
            if node.length == 0 or node.length % self.page_size or node.length != len(node.value):
                raise RuntimeError(f"a node holds {node.length} tokens, {len(node.value)} slots")
            if node.parent.children.get(self._page_key(node.key)) is not node:
                raise RuntimeError("a node is not filed under its first page in its parent")
            if node.ref_count < 0 or (
                node.parent.parent and node.parent.ref_count < node.ref_count
            ):
                raise RuntimeError("reference counts must not grow away from the root")
            evictable += node.length if node.ref_count == 0 else 0
            protected += node.length if node.ref_count > 0 else 0
            slots += node.value.tolist()
        if (evictable, protected) != (self.evictable_size, self.protected_size):
            raise RuntimeError(
                f"sizes ({self.evictable_size}, {self.protected_size}) should be "
                f"({evictable}, {protected})"
            )
        if len(set(slots)) != len(slots):
            raise RuntimeError("a KV slot is held by two nodes")

    def format_tree(self, decode: Callable[[List[int]], str] = str) -> str:
        """The tree as text, one node a line: its tokens (through ``decode``) and references."""
        lines = ["(root)"]

        def draw(node: RadixTreeNode, indent: str) -> None:
            children = list(node.children.values())
            for i, child in enumerate(children):
                last = i == len(children) - 1  # the last child closes its parent's branch
                lines.append(
                    f"{indent}{'└──' if last else '├──'} {decode(child.key)}  "
                    f"({child.length} tokens, ref {child.ref_count})"
                )
                draw(child, indent + ("    " if last else "│   "))

        draw(self.root, "")
        return "\n".join(lines)

    def _walk(self, ids: List[int]) -> Tuple[RadixTreeNode, int]:
        """Follow ``ids`` down the tree as far as whole pages match; split the last edge if the
        match ends inside it. The deepest node matched, and how many tokens matched."""
        self._clock += 1
        node, matched = self.root, 0
        while matched < len(ids):
            child = node.children.get(self._page_key(ids[matched:]))
            if child is None:
                break
            same = _common_prefix(child.key, ids[matched:])
            same = same // self.page_size * self.page_size
            if same < child.length:
                child = self._split(child, same)
            child.last_access = self._clock
            node, matched = child, matched + same
        return node, matched

    def _split(self, node: RadixTreeNode, pos: int) -> RadixTreeNode:
        """Cut ``node``'s edge after ``pos`` tokens: a new node takes the first part and becomes
        its parent, with its references and last use. Returns the new node."""
        parent = node.parent
        assert parent is not None and 0 < pos < node.length
        head = RadixTreeNode(node.key[:pos], node.value[:pos], parent, node.last_access)
        head.ref_count = node.ref_count
        parent.children[self._page_key(head.key)] = head
        node.key, node.value, node.parent = node.key[pos:], node.value[pos:], head
        head.children[self._page_key(node.key)] = node
        return head

    def _move(self, size: int, to_evictable: bool) -> None:
        sign = 1 if to_evictable else -1
        self.evictable_size += sign * size
        self.protected_size -= sign * size

    def _page_key(self, ids: Sequence[int]) -> Tuple[int, ...]:
        return tuple(ids[: self.page_size])

    def _nodes(self) -> List[RadixTreeNode]:
        """Every node but the root."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
