import copy

HELP = "/reset forgets the conversation, /exit (or Ctrl-D) leaves"


class _Script:
    """Answers turn n with replies[n]; None in a reply raises KeyboardInterrupt there."""

    def __init__(self, replies):
        self.replies, self.seen = list(replies), []

    def __call__(self, messages):
        self.seen.append(copy.deepcopy(messages))
        reply = self.replies.pop(0)
        messages.append({"role": "user", "content": "changed by the stream"})

        def pieces():
            for p in reply:
                if p is None:
                    raise KeyboardInterrupt
                yield p

        return pieces()


def _u(text):
    return {"role": "user", "content": text}


def _a(text):
    return {"role": "assistant", "content": text}


def test_readme_example(solution):
    script = _Script([["Hel", "lo"]])
    shell = solution.Shell(script)
    assert shell.handle("  hi ") is True, "a chat turn returns True"
    assert shell.printed == "Hello\n", f"printed {shell.printed!r}, expected 'Hello\\n'"
    assert shell.history == [_u("hi"), _a("Hello")], f"history is {shell.history}"
    assert script.seen == [[_u("hi")]], f"the stream got {script.seen}"


def test_conversation_grows(solution):
    script = _Script([["A"], ["B", "C"]])
    shell = solution.Shell(script)
    shell.handle("one")
    shell.handle("two")
    assert script.seen[1] == [_u("one"), _a("A"), _u("two")], (
        f"the second turn should send the whole conversation, got {script.seen[1]}"
    )
    assert shell.history == [_u("one"), _a("A"), _u("two"), _a("BC")], f"history {shell.history}"
    assert shell.printed == "A\nBC\n", f"printed {shell.printed!r}"


def test_stopped_turn_left_out(solution):
    script = _Script([["A"], ["par", None, "never"], ["C"]])
    shell = solution.Shell(script)
    shell.handle("one")
    try:
        stopped = shell.handle("two")
    except KeyboardInterrupt:
        raise AssertionError(
            "Ctrl-C during a reply (KeyboardInterrupt from the stream) should "
            "stop the turn, not the shell"
        ) from None
    assert stopped is True, "a stopped turn returns True"
    assert shell.history == [_u("one"), _a("A")], f"a stopped turn stays out: {shell.history}"
    shell.handle("three")
    assert script.seen[2] == [_u("one"), _a("A"), _u("three")], f"the stream got {script.seen[2]}"
    assert shell.printed == "A\npar\n(stopped)\nC\n", f"printed {shell.printed!r}"


def test_reset(solution):
    shell = solution.Shell(_Script([["A"], ["B"]]))
    shell.handle("one")
    assert shell.handle("/reset") is True, "/reset returns True"
    assert shell.history == [], f"/reset should empty the history, got {shell.history}"
    shell.handle("two")
    assert shell.history == [_u("two"), _a("B")], f"history after reset {shell.history}"
    assert shell.printed == "A\n(the conversation is forgotten)\nB\n", f"printed {shell.printed!r}"


def test_exit_and_unknown(solution):
    shell = solution.Shell(_Script([]))
    assert shell.handle("/help") is True, "an unknown command returns True"
    assert shell.printed == f"(unknown command /help; {HELP})\n", f"printed {shell.printed!r}"
    assert shell.handle(" /exit ") is False, "/exit returns False"
    assert shell.printed == f"(unknown command /help; {HELP})\n", "/exit prints nothing"


def test_commands_are_whole_stripped_lines(solution):
    shell = solution.Shell(_Script([["A"]]))
    shell.handle("one")
    assert shell.handle("  /help  ") is True, "an unknown command returns True"
    assert shell.handle("/exits") is True, "/exits is not /exit: an unknown command"
    assert shell.handle("/resets") is True, "/resets is an unknown command"
    want = "".join(f"(unknown command {c}; {HELP})\n" for c in ("/help", "/exits", "/resets"))
    assert shell.printed == "A\n" + want, (
        f"printed {shell.printed!r}: a command is the whole line, stripped"
    )
    assert shell.history == [_u("one"), _a("A")], f"/resets forgot the history: {shell.history}"


def test_empty_line(solution):
    script = _Script([])
    shell = solution.Shell(script)
    assert shell.handle("   ") is True and shell.printed == "" and script.seen == [], (
        "an empty line does nothing"
    )


def test_stream_gets_a_copy(solution):
    shell = solution.Shell(_Script([["x"]]))
    shell.handle("q")
    assert shell.history == [_u("q"), _a("x")], (
        f"the stream appended to the list it got; the history must not change: {shell.history}"
    )
