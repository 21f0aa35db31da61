"""Breaks: a request is freed at its first release only."""

from __future__ import annotations


def free_events(events: list[tuple]) -> list[tuple[int, str]]:
    """When each released request's row and pages are freed: (event index, uid), in order.

    Events: ("launch",) a batch goes to the device; ("process",) the oldest launched batch's
    tokens are back, so the device is done with it; ("release", uid) the request finished or
    was aborted. A request is freed once, at its first release: at once when no launched batch
    is unprocessed, else at the process event of the newest batch launched before it."""
    launched = processed = 0  # batches so far; the unprocessed ones are processed+1..launched
    waiting: list[tuple[int, str]] = []  # (the batch that must be processed first, uid)
    released: set[str] = set()
    freed: list[tuple[int, str]] = []
    for index, event in enumerate(events):
        if event[0] == "launch":
            launched += 1
        elif event[0] == "process":
            processed += 1
            freed += [(index, uid) for batch, uid in waiting if batch <= processed]
            waiting = [(batch, uid) for batch, uid in waiting if batch > processed]
        else:  # a second release (abort after finish) gives nothing
            released.add(event[1])
            if launched == processed:
                freed.append((index, event[1]))
            else:
                waiting.append((launched, event[1]))
    return freed
