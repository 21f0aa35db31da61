"""Exercise 181's tests: each takes the learner's module and checks its behaviour."""

from __future__ import annotations

import random


def model(events: list[tuple]) -> list[tuple[int, str]]:
    """For each first release, count the launches before it and look for the process event
    that brings the processed count up to them: the long way."""
    frees = []  # (event index, the release's index, uid)
    seen = set()
    for i, event in enumerate(events):
        if event[0] != "release" or event[1] in seen:
            continue
        seen.add(event[1])
        launches = sum(1 for e in events[:i] if e[0] == "launch")
        processes = sum(1 for e in events[:i] if e[0] == "process")
        if launches == processes:
            frees.append((i, i, event[1]))
            continue
        count = processes
        for j in range(i + 1, len(events)):
            if events[j][0] == "process":
                count += 1
                if count == launches:
                    frees.append((j, i, event[1]))
                    break
    return [(index, uid) for index, _, uid in sorted(frees)]


def overlap_steps(rng: random.Random, steps: int, uids: list[str]) -> list[tuple]:
    """The scheduler with overlap: the first step launches two batches and processes one, every
    later step launches one and processes the one before; requests finish while a step
    processes, aborts come between steps, some twice."""
    events: list[tuple] = [("launch",)]
    for _ in range(steps):
        if rng.random() < 0.8:
            events.append(("launch",))
        events.append(("process",))
        for _ in range(rng.randint(0, 2)):
            events.append(("release", rng.choice(uids)))
        if events.count(("launch",)) == events.count(("process",)):
            events.append(("launch",))
    while events.count(("launch",)) > events.count(("process",)):
        events.append(("process",))
    return events


def check(solution, events: list[tuple]) -> None:
    got = solution.free_events([tuple(e) for e in events])
    want = model(events)
    got = [tuple(g) for g in got]
    assert got == want, f"free_events({events}) should be {want}, not {got}"


def test_nothing_in_flight_frees_at_once(solution):
    events = [("release", "a"), ("launch",), ("process",), ("release", "b")]
    got = [tuple(g) for g in solution.free_events(events)]
    assert got == [(0, "a"), (3, "b")], (
        f"with no batch in flight a release frees at once: [(0, 'a'), (3, 'b')], not {got}"
    )


def test_one_batch_in_flight_waits_for_it(solution):
    events = [("launch",), ("release", "a"), ("launch",), ("process",), ("process",)]
    got = [tuple(g) for g in solution.free_events(events)]
    assert got == [(3, "a")], (
        f"'a' released while batch 1 runs is freed when batch 1 is "
        f"processed (event 3): [(3, 'a')], not {got}"
    )


def test_the_overlap_step(solution):
    # Step 1 launches batches 1 and 2, processes 1: 'a' finishes there, with batch 2 in flight.
    events = [
        ("launch",),
        ("launch",),
        ("process",),
        ("release", "a"),
        ("launch",),
        ("process",),
        ("release", "b"),
        ("process",),
    ]
    got = [tuple(g) for g in solution.free_events(events)]
    want = [(5, "a"), (7, "b")]
    assert got == want, (
        f"each release waits for the batch in flight when it came: {want}, not {got}"
    )


def test_two_batches_in_flight_wait_for_the_newer(solution):
    events = [("launch",), ("launch",), ("release", "a"), ("process",), ("process",)]
    got = [tuple(g) for g in solution.free_events(events)]
    assert got == [(4, "a")], (
        f"with batches 1 and 2 in flight 'a' waits for batch 2 "
        f"(event 4), not the next process: [(4, 'a')], not {got}"
    )


def test_freed_exactly_once(solution):
    events = [
        ("launch",),
        ("release", "a"),
        ("release", "a"),
        ("process",),
        ("release", "a"),
        ("release", "b"),
        ("release", "b"),
    ]
    got = [tuple(g) for g in solution.free_events(events)]
    want = [(3, "a"), (5, "b")]
    assert got == want, f"an abort after a finish frees nothing more: {want}, not {got}"


def test_never_processed_is_never_freed(solution):
    events = [("launch",), ("release", "a"), ("launch",), ("process",), ("release", "b")]
    got = [tuple(g) for g in solution.free_events(events)]
    assert got == [(3, "a")], (
        f"'b' waits for batch 2, which is never processed: [(3, 'a')], not {got}"
    )


def test_frees_at_one_event_keep_their_release_order(solution):
    events = [("launch",), ("release", "c"), ("release", "a"), ("release", "b"), ("process",)]
    got = [tuple(g) for g in solution.free_events(events)]
    want = [(4, "c"), (4, "a"), (4, "b")]
    assert got == want, f"three frees at event 4, in the order of release: {want}, not {got}"


def test_no_events(solution):
    got = list(solution.free_events([]))
    assert got == [], f"no events free nothing, not {got}"


def test_scheduler_runs_against_the_model(solution):
    rng = random.Random(181)
    for _ in range(200):
        uids = [f"r{i}" for i in range(rng.randint(1, 8))]
        check(solution, overlap_steps(rng, rng.randint(1, 12), uids))


def test_random_event_orders_against_the_model(solution):
    rng = random.Random(1811)
    for _ in range(300):
        events, launched, processed = [], 0, 0
        for _ in range(rng.randint(0, 20)):
            kind = rng.choice(["launch", "process", "release", "release"])
            if kind == "process" and processed == launched:
                kind = "launch"
            if kind == "release":
                events.append(("release", rng.choice("abcdef")))
            else:
                events.append((kind,))
                launched += kind == "launch"
                processed += kind == "process"
        check(solution, events)


def test_events_are_left_as_they_were(solution):
    events = [("launch",), ("release", "a"), ("process",)]
    solution.free_events(events)
    assert events == [("launch",), ("release", "a"), ("process",)], (
        f"free_events changed its list: {events}"
    )
