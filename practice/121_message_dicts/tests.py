from dataclasses import dataclass, field


@dataclass
class Tokenize:
    uid: int
    text: str
    stop: list = field(default_factory=list)


@dataclass
class Reply:
    uid: int
    piece: str
    finished: bool = False
    ids: tuple = ()


@dataclass
class Batch:
    data: list


@dataclass
class Table:
    by_uid: dict


@dataclass
class Timed:
    uid: int

    def __post_init__(self):
        self.received_at = 0.5  # an attribute, not a field: not part of the message


@dataclass(slots=True)
class Slim:  # no __dict__: its fields are slots
    uid: int
    ids: list


CLASSES = {
    "Tokenize": Tokenize,
    "Reply": Reply,
    "Batch": Batch,
    "Table": Table,
    "Timed": Timed,
    "Slim": Slim,
}


def test_plain_values(solution):
    for value in [0, -3, 2.5, "x", "", True, False, None, b"\x00\xff"]:
        got = solution.to_dict(value)
        assert got == value and type(got) is type(value), f"to_dict({value!r}) gave {got!r}"
        back = solution.from_dict(value, CLASSES)
        assert back == value and type(back) is type(value), f"from_dict({value!r}) gave {back!r}"


def test_one_message(solution):
    got = solution.to_dict(Tokenize(3, "hi", ["</s>"]))
    want = {"__type__": "Tokenize", "uid": 3, "text": "hi", "stop": ["</s>"]}
    assert got == want, f"to_dict(Tokenize(3, 'hi', ['</s>'])) gave {got}, expected {want}"
    assert list(got) == ["__type__", "uid", "text", "stop"], (
        f"keys should be '__type__' then the fields in order, got {list(got)}"
    )


def test_tuples_become_lists(solution):
    got = solution.to_dict(Reply(1, "a", True, (4, 5)))
    assert got["ids"] == [4, 5] and isinstance(got["ids"], list), (
        f"a tuple field should become a list, got {got['ids']!r}"
    )
    got = solution.to_dict((1, (2, 3)))
    assert got == [1, [2, 3]], f"to_dict((1, (2, 3))) gave {got!r}, expected [1, [2, 3]]"


def test_nested(solution):
    batch = Batch([Reply(1, "a"), Reply(2, "b", True, (7,))])
    got = solution.to_dict(batch)
    want = {
        "__type__": "Batch",
        "data": [
            {"__type__": "Reply", "uid": 1, "piece": "a", "finished": False, "ids": []},
            {"__type__": "Reply", "uid": 2, "piece": "b", "finished": True, "ids": [7]},
        ],
    }
    assert got == want, f"a batch of replies:\n got  {got}\n want {want}"
    table = Table({"x": Tokenize(1, "t"), "y": [Reply(2, "p")]})
    got = solution.to_dict(table)
    assert got["by_uid"]["y"][0]["__type__"] == "Reply", f"a dict of messages: got {got}"


def test_round_trip(solution):
    msgs = [
        Tokenize(9, "héllo", ["a", "b"]),
        Batch([Tokenize(1, "x"), Reply(2, "y", True, [3])]),
        Table({"k": Batch([]), "plain": {"n": [1, 2]}}),
    ]
    for msg in msgs:
        back = solution.from_dict(solution.to_dict(msg), CLASSES)
        assert back == msg, f"round trip of {msg!r} gave {back!r}"


def test_dict_without_tag(solution):
    got = solution.from_dict(
        {"a": {"__type__": "Reply", "uid": 1, "piece": "p"}, "b": [1]}, CLASSES
    )
    assert got == {"a": Reply(1, "p"), "b": [1]}, f"a plain dict holding a message: got {got!r}"


def test_unknown_class_refused(solution):
    try:
        solution.from_dict({"__type__": "Evil", "cmd": "rm"}, CLASSES)
    except TypeError:
        return
    raise AssertionError("from_dict of an unknown '__type__' should raise TypeError")


def test_unsendable_refused(solution):
    for value in [object(), {1, 2}, Reply]:
        try:
            solution.to_dict(value)
        except TypeError:
            continue
        raise AssertionError(f"to_dict({value!r}) should raise TypeError")


def test_fields_only(solution):
    got = solution.to_dict(Timed(4))
    assert got == {"__type__": "Timed", "uid": 4}, (
        f"to_dict(Timed(4)) gave {got}: only the dataclass's fields go in the message"
    )
    got = solution.to_dict(Slim(2, (3,)))
    assert got == {"__type__": "Slim", "uid": 2, "ids": [3]}, (
        f"a dataclass with slots=True: to_dict(Slim(2, (3,))) gave {got}"
    )
    back = solution.from_dict(got, CLASSES)
    assert back == Slim(2, [3]), f"round trip of Slim(2, [3]) gave {back!r}"


def test_keys_and_other_values_kept(solution):
    got = solution.to_dict({1: Reply(1, "a"), "x": (2,)})
    want = {
        1: {"__type__": "Reply", "uid": 1, "piece": "a", "finished": False, "ids": []},
        "x": [2],
    }
    assert got == want, f"a dict keeps its keys: got {got}, expected {want}"
    back = solution.from_dict({7: [1, {"n": 2}]}, CLASSES)
    assert back == {7: [1, {"n": 2}]}, f"from_dict keeps a dict's keys, got {back!r}"
    for value in [(1, 2), frozenset({3})]:
        back = solution.from_dict(value, CLASSES)
        assert back == value and type(back) is type(value), (
            f"from_dict({value!r}) gave {back!r}: a value neither list nor dict stays as it is"
        )


def test_only_the_classes_given(solution):
    sent = solution.to_dict(Tokenize(1, "t"))
    try:
        solution.from_dict(sent, {"Reply": Reply})
    except TypeError:
        return
    raise AssertionError(
        "from_dict with classes {'Reply': Reply} built a 'Tokenize': a name "
        "not in classes raises TypeError, whatever to_dict has seen"
    )
