"""Exercise 181: when a request released while a batch is in flight may have its row back."""

from __future__ import annotations


def free_events(events: list[tuple]) -> list[tuple[int, str]]:
    """When each released request's row and pages are freed: (event index, uid), in order.

    Events: ("launch",) a batch goes to the device; ("process",) the oldest launched batch's
    tokens are back, so the device is done with it; ("release", uid) the request finished or
    was aborted. A request is freed once, at its first release: at once when no launched batch
    is unprocessed, else at the process event of the newest batch launched before it."""
    raise NotImplementedError
