"""Chapter 11: chat templates and incremental detokenization, against transformers' own
``apply_chat_template`` and ``decode`` of the whole sequence, on the byte-level tiny model whose
tokens split multi-byte characters."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT, build_llm, greedy, hf_tokenizer
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tiny_models import BYTES_VOCAB_SIZE, MULTIBYTE_TEXT

from minisgl.tokenizer import DecodeState, apply_chat_template, detokenize, tokenize_request

SPECIAL_IDS = (0, 1, 2)  # <|endoftext|>, <|im_start|>, <|im_end|>


@pytest.fixture(scope="module")
def tok(tiny_models):
    return hf_tokenizer(tiny_models["qwen2bytes"])


def stream(tok, chunks, *, stop=(), skip_special_tokens=True):
    """Feed the chunks of ids one call each, the last one finishing; return the pieces and the
    state. Checks on the way that no piece before the end finishes inside a character."""
    state = DecodeState(stop=stop, skip_special_tokens=skip_special_tokens)
    pieces = []
    for i, chunk in enumerate(chunks):
        pieces += detokenize(tok, [state], [chunk], [i == len(chunks) - 1])
        if i < len(chunks) - 1:
            assert not "".join(pieces).endswith("\ufffd")
    return pieces, state


def one_by_one(ids):
    return [[t] for t in ids] or [[]]


# ---- the byte-level tiny model -------------------------------------------------------------


def test_byte_level_tokens_split_multibyte_characters(tok):
    assert len(tok) == BYTES_VOCAB_SIZE and tok.eos_token == "<|im_end|>"
    split = [ch for ch in set(MULTIBYTE_TEXT) if len(tok.encode(ch)) > 1]
    assert len(split) >= 10  # many characters need several tokens
    partial = [i for i in range(len(tok)) if tok.decode([i]).endswith("\ufffd")]
    assert len(partial) >= 50  # and many tokens are part of a character


# ---- streaming equals the one-shot decode --------------------------------------------------

ids_strategy = st.lists(st.integers(0, BYTES_VOCAB_SIZE - 1), max_size=40)
chunk_sizes = st.lists(st.integers(0, 4), min_size=1, max_size=40)


def chunked(ids, sizes):
    """ids cut into chunks of the sizes in turn (0: a call that brings no new id)."""
    sizes = sizes if any(sizes) else sizes + [1]
    chunks, i = [], 0
    while i < len(ids):
        n = sizes[len(chunks) % len(sizes)]
        chunks.append(ids[i : i + n])
        i += n
    return chunks or [[]]


@settings(max_examples=300, deadline=None, derandomize=True)  # the same examples every run
@given(ids=ids_strategy, sizes=chunk_sizes, skip=st.booleans())
@example(ids=[164, 125, 233, 330], sizes=[1], skip=True)  # 很 in three tokens, then 好
@example(ids=[164, 2, 125, 233], sizes=[1], skip=False)  # a special token inside a character
@example(ids=[164, 2, 125, 233], sizes=[1], skip=True)
@example(ids=[164], sizes=[1], skip=True)  # ends inside a character: decode's U+FFFD at the end
def test_streamed_pieces_join_to_decode_of_all_ids(tok, ids, sizes, skip):
    pieces, _ = stream(tok, chunked(ids, sizes), skip_special_tokens=skip)
    whole = tok.decode(ids, skip_special_tokens=skip)
    assert "".join(pieces) == whole
    so_far = ""
    for piece in pieces:  # every piece is final: the text sent is always a prefix of the whole
        so_far += piece
        assert whole.startswith(so_far)


multibyte_ids = st.builds(
    lambda start, length: MULTIBYTE_TEXT[start : start + length],
    st.integers(0, len(MULTIBYTE_TEXT) - 1),
    st.integers(1, 40),
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(text=multibyte_ids, sizes=chunk_sizes)
def test_real_text_streams_back_to_itself(tok, text, sizes):
    ids = tok.encode(text)
    pieces, _ = stream(tok, chunked(ids, sizes))
    assert "".join(pieces) == text == tok.decode(ids)


SPACED_TEXT = "Hi , you . don't ! we 're"  # every space the clean-up removes


def cleaning_tokenizer(tiny_models):
    """The byte-level tokenizer with the clean-up forced on, as transformers runs it for a
    WordPiece tokenizer. Llama 3's tokenizer sets clean_up_tokenization_spaces; transformers
    applies it to a BPE only when forced."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_models["qwen2bytes"]))  # not the shared one
    tok.clean_up_tokenization_spaces = True
    tok.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True
    return tok


def test_a_tokenizer_that_cleans_up_spaces_streams_its_raw_text(tiny_models):
    """Where decode cleans up, the stream keeps the text as the tokens spell it."""
    tok = cleaning_tokenizer(tiny_models)
    ids = tok.encode(SPACED_TEXT)
    assert tok.decode(ids) == "Hi, you. don't! we're"  # the clean-up is on
    for sizes in ([1], [2, 1], [3]):
        pieces, _ = stream(tok, chunked(ids, sizes))
        assert "".join(pieces) == tok.decode(ids, clean_up_tokenization_spaces=False)
        assert "".join(pieces) == SPACED_TEXT


def windowed_stream(tok, ids, clean_up):
    """The offsets of ``_advance`` in a few lines (one id per call, no stop strings), with the
    windows decoded with or without the clean-up; the streamed text."""
    surr = read = 0
    text = ""
    for n in range(1, len(ids) + 1):
        window = tok.decode(ids[surr:n], clean_up_tokenization_spaces=clean_up)
        context = tok.decode(ids[surr:read], clean_up_tokenization_spaces=clean_up)
        new_text = window[len(context) :]
        if new_text and not new_text.endswith("\ufffd"):
            text += new_text
            surr, read = read, n
    return text


def test_windows_decoded_with_the_clean_up_lose_the_marks(tiny_models):
    """Why the windows are decoded without the clean-up: with it, the window " ," is cleaned to
    "," while its context " " is not, so the new text, the window past the context's length, is
    empty and the mark is never sent. The text of chapter 11 quotes this output."""
    tok = cleaning_tokenizer(tiny_models)
    ids = tok.encode(SPACED_TEXT)
    assert windowed_stream(tok, ids, clean_up=True) == "Hi  you  don't  we 're"
    assert windowed_stream(tok, ids, clean_up=False) == SPACED_TEXT


def test_a_character_split_over_tokens_waits_until_it_is_whole(tok):
    ids = tok.encode("很好")  # 很 is e5 be 88 in three tokens, 好 one token
    assert [tok.decode([i]) for i in ids] == ["\ufffd", "\ufffd", "\ufffd", "好"]
    pieces, state = stream(tok, one_by_one(ids))
    assert pieces == ["", "", "很", "好"]
    assert (state.surr_offset, state.read_offset, state.sent_offset) == (3, 4, 2)


def test_a_batch_of_requests_each_gets_its_own_text(tok):
    texts = ["Café crème", "你好，世界。", "😀 🎉 done", "plain ASCII"]
    ids = [tok.encode(t) + [2] for t in texts]
    states = [DecodeState(skip_special_tokens=i % 2 == 0) for i in range(len(texts))]
    pieces = [[] for _ in texts]
    for step in range(max(map(len, ids))):
        new = [one[step : step + 1] for one in ids]
        finished = [step == len(one) - 1 for one in ids]
        active = [i for i, one in enumerate(ids) if step < len(one)]
        out = detokenize(
            tok,
            [states[i] for i in active],
            [new[i] for i in active],
            [finished[i] for i in active],
        )
        for i, piece in zip(active, out):
            pieces[i].append(piece)
    for i, text in enumerate(texts):
        assert "".join(pieces[i]) == text + ("" if i % 2 == 0 else "<|im_end|>")


# ---- stop strings --------------------------------------------------------------------------


def test_a_stop_string_spanning_tokens_is_cut(tok):
    ids = tok.encode("Café 很好 😀!")
    pieces, state = stream(tok, one_by_one(ids), stop=["很好"])
    assert "".join(pieces) == "Café " and state.finish_reason == "stop"
    assert pieces[:3] == ["Ca", "fé", " "]  # then 很 waits: it may be the start of 很好


def test_a_stop_string_at_the_start_sends_nothing(tok):
    ids = tok.encode("Hello world")
    pieces, state = stream(tok, one_by_one(ids), stop="Hel")
    assert pieces == [""] * len(ids) and state.finish_reason == "stop"


def test_the_earliest_of_several_stop_strings_wins(tok):
    ids = tok.encode("Hello world, hello again")
    pieces, state = stream(tok, one_by_one(ids), stop=["again", "world", "lo w"])
    assert "".join(pieces) == "Hel" and state.finish_reason == "stop"


def test_overlapping_stop_strings(tok):
    # "abc" is held back as it starts ... then "bd" completes inside it
    ids = tok.encode("xabdy")
    pieces, state = stream(tok, one_by_one(ids), stop=["abc", "bd"])
    assert "".join(pieces) == "xa" and state.finish_reason == "stop"
    pieces, state = stream(tok, one_by_one(tok.encode("aab")), stop=["ab"])
    assert "".join(pieces) == "a"


def test_a_stop_string_that_never_completes_is_sent_at_the_end(tok):
    ids = tok.encode("Hello wor")
    pieces, state = stream(tok, one_by_one(ids) + [[]], stop=["world"])  # then ends, no new id
    assert "".join(pieces[:-1]) == "Hello " and pieces[-1] == "wor"
    assert state.finish_reason is None


def test_after_a_stop_string_nothing_more_is_sent(tok):
    state = DecodeState(stop=["lo"])
    ids = tok.encode("Hello world")
    assert "".join(detokenize(tok, [state], [ids])) == "Hel"
    assert detokenize(tok, [state], [tok.encode(" more")], [True]) == [""]
    assert state.ids == ids  # the ids after the stop are not even kept
    assert state.finish_reason == "stop" and state.finished
    with pytest.raises(ValueError, match="request 0 has finished"):
        detokenize(tok, [state], [[5]])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    text=st.text(alphabet="ab 很好😀é", max_size=24),
    stops=st.lists(st.text(alphabet="ab 很好😀é", min_size=1, max_size=4), max_size=3),
    sizes=chunk_sizes,
)
def test_stop_strings_cut_as_a_search_of_the_whole_text(tok, text, stops, sizes):
    ids = tok.encode(text)
    whole = tok.decode(ids)
    hits = [whole.find(s) for s in stops if s in whole]
    pieces, state = stream(tok, chunked(ids, sizes), stop=stops)
    assert "".join(pieces) == whole[: min(hits, default=len(whole))]
    assert state.finish_reason == ("stop" if hits else None)


def test_skip_special_tokens(tok):
    ids = tok.encode("Hi") + [2] + tok.encode("there")  # <|im_end|> in the middle
    pieces, _ = stream(tok, one_by_one(ids))
    assert "".join(pieces) == "Hithere" == tok.decode(ids, skip_special_tokens=True)
    pieces, _ = stream(tok, one_by_one(ids), skip_special_tokens=False)
    assert "".join(pieces) == "Hi<|im_end|>there" == tok.decode(ids)
    # a stop string matches the text as sent: a skipped special token is not in it
    pieces, state = stream(tok, one_by_one(ids), stop=["<|im_end|>"])
    assert "".join(pieces) == "Hithere" and state.finish_reason is None
    pieces, state = stream(tok, one_by_one(ids), stop=["<|im_end|>"], skip_special_tokens=False)
    assert "".join(pieces) == "Hi" and state.finish_reason == "stop"


def test_the_llm_reply_streamed_equals_its_text(tiny_models, tok):
    llm = build_llm(tiny_models["qwen2bytes"])
    prompt = tokenize_request(tok, messages=[{"role": "user", "content": "你好 😀"}])
    out = llm.generate([prompt], greedy(24))[0]
    llm.shutdown()
    pieces, _ = stream(tok, one_by_one(out["token_ids"]))
    assert "".join(pieces) == out["text"]


# ---- chat templates and prompts ------------------------------------------------------------

CONVERSATIONS = [
    [{"role": "user", "content": "Say hello in French."}],
    [
        {"role": "system", "content": "Answer in Chinese."},
        {"role": "user", "content": "你好"},
        {"role": "assistant", "content": "你好！"},
        {"role": "user", "content": "Café? 😀"},
    ],
]


@pytest.mark.parametrize("family", ["qwen2bytes", "qwen3"])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_is_the_tokenizers_own(tiny_models, family, messages):
    tok = hf_tokenizer(tiny_models[family])
    text = apply_chat_template(tok, messages)
    assert text == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    expected = tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert tokenize_request(tok, messages=messages) == expected
    if family == "qwen2bytes" and messages[0]["role"] != "system":
        assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")


def test_a_template_with_its_own_bos_gets_it_once(tiny_models):
    """Llama 3's tokenizer adds <|begin_of_text|> to every encode, and its template writes it
    too: the template's text must be encoded without adding special tokens. An empty prompt
    stays empty rather than a lone BOS."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_models["qwen2bytes"])
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
    )
    tok.chat_template = "<|endoftext|>" + tok.chat_template
    messages = CONVERSATIONS[0]
    assert tok.encode("Hi")[0] == 0  # the tokenizer adds it
    ids = tokenize_request(tok, messages=messages)
    assert ids == tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert ids.count(0) == 1
    assert tokenize_request(tok, prompt="") == []  # not a lone BOS: empty, for check_request


def test_prompts_as_text_or_token_ids(tok):
    assert tokenize_request(tok, prompt="Café 😀") == tok.encode("Café 😀")
    assert tokenize_request(tok, prompt="") == []  # for the scheduler to refuse
    assert tokenize_request(tok, prompt=[5, 7, 500]) == [5, 7, 500]


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({}, ValueError, "exactly one of prompt and messages"),
        ({"prompt": "Hi", "messages": CONVERSATIONS[0]}, ValueError, "exactly one"),
        ({"prompt": [1, True]}, ValueError, r"ids\[1\] is True"),
        ({"prompt": [1, 2.0]}, ValueError, r"ids\[1\] is 2.0"),
        ({"prompt": [-1]}, ValueError, r"ids\[0\] is -1: a token id is >= 0"),
        ({"prompt": 5}, TypeError, "list of ints, got int"),
        ({"messages": []}, ValueError, "non-empty list"),
        ({"messages": "Hi"}, ValueError, "non-empty list"),
        ({"messages": ["Hi"]}, ValueError, r"messages\[0\] must be a dict"),
        ({"messages": [{"role": "user"}]}, ValueError, r"messages\[0\]\['content'\] must be a str"),
        ({"messages": [{"role": 1, "content": "Hi"}]}, ValueError, r"\['role'\] must be a str"),
    ],
)
def test_bad_requests_are_refused_by_name(tok, kwargs, error, message):
    with pytest.raises(error, match=message):
        tokenize_request(tok, **kwargs)


def test_a_tokenizer_without_a_chat_template(tiny_models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_models["qwen2bytes"])
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        tokenize_request(tok, messages=CONVERSATIONS[0])


def test_bad_detokenize_input(tok):
    for stop, message in [([""], r"stop\[0\] is ''"), (["a", 3], r"stop\[1\] is 3")]:
        with pytest.raises(ValueError, match=message):
            DecodeState(stop=stop)
    assert DecodeState(stop="end").stop == ("end",)
    with pytest.raises(ValueError, match="2 states, 1 lists of new ids"):
        detokenize(tok, [DecodeState(), DecodeState()], [[1]])
    with pytest.raises(ValueError, match=r"request 1: new token ids\[0\] is 'a'"):
        detokenize(tok, [DecodeState(), DecodeState()], [[1], ["a"]])


def test_the_tokenizer_imports_no_server_package():
    code = (
        "import sys, minisgl.tokenizer\n"
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'zmq', 'openai', 'msgpack') "
        "if m in sys.modules))"
    )
    env_path = str(ROOT / "python")
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": env_path, "PATH": ""},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_a_real_models_chat_template_is_its_own(real_model, messages):
    """SmolLM2-135M-Instruct (examples/real_model.py): ChatML, with a system turn of its own
    where the conversation has none, and a byte-level BPE of 49,152 tokens."""
    tok = hf_tokenizer(real_model)
    assert len(tok) == 49152 and tok.decode(tok.encode("Café 😀")) == "Café 😀"
    text = apply_chat_template(tok, messages)
    assert text == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert tokenize_request(tok, messages=messages) == expected
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    own_system = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM"
    assert text.startswith(own_system) == (messages[0]["role"] != "system")
