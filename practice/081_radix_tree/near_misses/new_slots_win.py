"""Breaks: tokens already cached keep their old slots."""

from __future__ import annotations


class _Node:
    def __init__(self, key: list[int], value: list[int], parent: _Node | None):
        self.key, self.value, self.parent = key, value, parent
        self.children: dict[tuple[int, ...], _Node] = {}  # by their first page


class RadixCache:
    """Cached token sequences in one tree; every edge holds whole pages of tokens and slots."""

    def __init__(self, page_size: int):
        self.page_size = page_size
        self.root = _Node([], [], None)

    def match(self, ids: list[int]) -> list[int]:
        """The slots of the longest cached prefix of ids, in whole pages (splitting an edge that
        the match ends inside)."""
        node, _ = self._walk(list(ids))
        values = []
        while node.parent is not None:
            values.append(node.value)
            node = node.parent
        return [slot for value in reversed(values) for slot in value]

    def insert(self, ids: list[int], slots: list[int]) -> int:
        """Cache ids cut to whole pages; return how many tokens were cached already."""
        n = len(ids) // self.page_size * self.page_size
        ids = list(ids[:n])
        node, matched = self._walk(ids)
        self._overwrite(node, slots)
        if matched < n:
            leaf = _Node(ids[matched:], list(slots[matched:n]), node)
            node.children[self._page_key(leaf.key)] = leaf
        return matched

    def _overwrite(self, node: _Node, slots: list[int]) -> None:
        path = []
        while node.parent is not None:
            path.append(node)
            node = node.parent
        start = 0
        for node in reversed(path):
            node.value = list(slots[start : start + len(node.value)])
            start += len(node.value)

    def edges(self) -> list[tuple[int, ...]]:
        """The key of every node but the root, sorted."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(tuple(node.key))
            stack.extend(node.children.values())
        return sorted(out)

    def _walk(self, ids: list[int]) -> tuple[_Node, int]:
        node, matched = self.root, 0
        while matched < len(ids):
            child = node.children.get(self._page_key(ids[matched:]))
            if child is None:
                break
            same = _common_prefix(child.key, ids[matched:]) // self.page_size * self.page_size
            if same < len(child.key):
                child = self._split(child, same)
            node, matched = child, matched + same
        return node, matched

    def _split(self, node: _Node, pos: int) -> _Node:
        """Cut node's edge after pos tokens: a new node takes the first part, as its parent."""
        parent = node.parent
        assert parent is not None
        head = _Node(node.key[:pos], node.value[:pos], parent)
        parent.children[self._page_key(head.key)] = head
        node.key, node.value, node.parent = node.key[pos:], node.value[pos:], head
        head.children[self._page_key(node.key)] = node
        return head

    def _page_key(self, ids: list[int]) -> tuple[int, ...]:
        return tuple(ids[: self.page_size])


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
