"""Tiny random-weight Hugging Face models, made locally so that nothing is downloaded.

Each model is a directory like one from the Hub: ``config.json``, ``model.safetensors``,
``generation_config.json`` and tokenizer files that ``transformers.AutoTokenizer`` loads, and
``random_weights.txt``, which says that the weights are random (the shell's banner reads it). The
tokenizer is a BPE trained with ``tokenizers`` on the small text below, over printable ASCII
only, so that every token id decodes to readable text. Weights come from a fixed seed, so the
same call makes the same model on every machine.

Families (hidden 64, 4 query heads, 2 KV heads, head_dim 16, 2 layers, float32):
    llama3    Llama 3 with ``rope_type: llama3`` long-context scaling
    qwen2     Qwen2 with the QKV bias and tied input/output embeddings
    qwen3     Qwen3 with q/k RMSNorm and YaRN rope scaling
    mistral   Mistral
    qwen3moe  Qwen3-MoE: 8 experts, top-2, ``norm_topk_prob=True`` (the Hugging Face default is
              False), checkpoint in the per-expert layout ``mlp.experts.{i}.{gate,up,down}_proj``
    qwen3moe_nonorm  Qwen3-MoE (as qwen3moe) with ``norm_topk_prob=False``, so the two routing
              weights of a token sum to less than 1, and a dense first layer (``mlp_only_layers``)
    qwen2bytes  Qwen2 (as qwen2) with a byte-level BPE of its own over all 256 bytes, trained on
              ``TEXT`` and ``MULTIBYTE_TEXT`` (accents, CJK, emoji), so that tokens split
              multi-byte characters; Qwen2-Instruct's special tokens, EOS and chat template

Usage: ``make_tiny_model("llama3", directory) -> Path`` or ``make_all(directory) -> dict``.
This file imports no ``minisgl`` module: it is the same in every chapter's tree.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

RANDOM_WEIGHTS_FILE = "random_weights.txt"  # nothing else in a model's files tells it apart
VOCAB_SIZE = 450  # 4 special tokens, 96 characters, 350 merges: each word of TEXT is a token
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
UNK_TOKEN = "<unk>"
# Qwen2's pre-tokenizer: words with their leading space, single digits, punctuation, whitespace
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TEXT = """\
The quick brown fox jumps over the lazy dog. Hello world, hello again.
A language model reads a sequence of tokens and predicts the next one. To write a long answer it
predicts one token, appends it to the sequence, and predicts again. An inference engine makes this
loop fast: it keeps the keys and values of the tokens it has already seen in a cache, it runs many
requests together in one batch, and it shares the cache between requests that start with the
same prompt.
Once upon a time there was a small robot who lived in a library. Every night the robot read one
book, and every morning it told the children what the book was about. The children asked many
questions, and the robot answered them one word at a time.
The weather today is sunny with a light wind from the west. Tomorrow it will rain in the morning
and clear up in the afternoon. The sea is calm and the boats are out early.
Numbers: one, two, three, four, five, six, seven, eight, nine, ten. 1 2 3 4 5 6 7 8 9 10.
def add(a, b): return a + b
for i in range(10): print(i * i)
"""
# qwen2bytes's tokenizer learns these too: characters of 2, 3 and 4 bytes, common enough that
# some become tokens, with many others left split across byte tokens
MULTIBYTE_TEXT = """\
Café crème, déjà vu, naïve façade, Größe, Straße, mañana, señor, São Paulo, Ærøskøbing.
你好，世界。今天天气很好，我们去公园散步吧。我喜欢读书，也喜欢写代码。
こんにちは、世界。ありがとうございます。日本語のテキストです。
안녕하세요, 세계. 감사합니다.
Emoji: 😀 😂 🎉 👍 🚀 ❤️ 🌍 🍕 😀😀 🎉🎉
Price: 5 € or £4, 30°C, naïve café, 你好 😀.
"""
BYTES_VOCAB_SIZE = 512  # 256 bytes, 3 special tokens, 253 merges
BYTES_EOS, BYTES_PAD = "<|im_end|>", "<|endoftext|>"  # as Qwen2-Instruct
# Qwen2-Instruct's template: a default system turn when the conversation has none
BYTES_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant."
    "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    vocab_size=VOCAB_SIZE,
    tie_word_embeddings=False,
)

FAMILIES = ("llama3", "qwen2", "qwen3", "mistral", "qwen3moe", "qwen2bytes", "qwen3moe_nonorm")


def _config(name: str, eos: int):
    import transformers as tf

    ids = dict(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    if name == "llama3":
        rope = dict(
            rope_type="llama3",
            rope_theta=500000.0,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        )
        return tf.LlamaConfig(**_COMMON, **ids, rope_scaling=rope)
    if name == "qwen2":
        return tf.Qwen2Config(
            **{**_COMMON, "tie_word_embeddings": True}, **ids, rope_theta=1000000.0
        )
    if name == "qwen2bytes":
        return tf.Qwen2Config(
            **{**_COMMON, "tie_word_embeddings": True, **ids, "vocab_size": BYTES_VOCAB_SIZE},
            rope_theta=1000000.0,
        )
    if name == "qwen3":
        rope = dict(
            rope_type="yarn", rope_theta=1000000.0, factor=4.0, original_max_position_embeddings=128
        )
        return tf.Qwen3Config(**_COMMON, **ids, rope_scaling=rope)
    if name == "mistral":
        return tf.MistralConfig(**_COMMON, **ids, rope_theta=1000000.0, sliding_window=None)
    if name == "qwen3moe":
        return tf.Qwen3MoeConfig(
            **_COMMON,
            **ids,
            rope_theta=1000000.0,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    if name == "qwen3moe_nonorm":
        return tf.Qwen3MoeConfig(
            **_COMMON,
            **ids,
            rope_theta=1000000.0,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[0],
        )
    raise ValueError(f"unknown tiny model {name!r}; known: {', '.join(FAMILIES)}")


def _train_tokenizer():
    """A BPE over printable ASCII, trained on ``TEXT`` until every word of it is one token.

    The pipeline is Qwen2's (NFC, its pre-tokenizing regex, byte-level): transformers 5 loads any
    ``qwen2`` directory with ``Qwen2Tokenizer``, which rebuilds that pipeline around the saved
    vocabulary and merges, so every family must use it to encode alike. Byte-level maps the space
    to ``Ġ``, the newline to ``Ċ`` and printable ASCII to itself. The alphabet is those 96
    characters only, with no token for any other byte: every id decodes to readable text. Any
    other character encodes to one ``<unk>`` per UTF-8 byte (``Qwen2Tokenizer``, whose BPE has
    no unknown token, drops it).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated"), byte_level]
    )
    tok.decoder = decoders.ByteLevel()
    ascii_text = "\n" + "".join(map(chr, range(32, 127)))
    alphabet = list(byte_level.pre_tokenize_str(ascii_text)[0][0])
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS + [UNK_TOKEN],
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT], trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:  # the config's vocab_size must be the tokenizer's
        raise RuntimeError(f"the tokenizer has {tok.get_vocab_size()} tokens, not {VOCAB_SIZE}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token=UNK_TOKEN,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _train_byte_tokenizer():
    """Qwen2's pipeline (NFC, its regex, byte-level) with all 256 bytes in the alphabet, as real
    byte-level BPEs have it: any text encodes, with no unknown token, and a character of 2 to 4
    bytes may be one token, or split across several. Stops at ``BYTES_VOCAB_SIZE``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BYTES_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT, MULTIBYTE_TEXT], trainer=trainer)
    if tok.get_vocab_size() != BYTES_VOCAB_SIZE:
        raise RuntimeError(
            f"the tokenizer has {tok.get_vocab_size()} tokens, not {BYTES_VOCAB_SIZE}"
        )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=BYTES_EOS, pad_token=BYTES_PAD)
    fast.chat_template = BYTES_CHAT_TEMPLATE
    return fast


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights large enough that the logits are well apart (greedy decoding has no near-ties)."""
    gen = torch.Generator().manual_seed(seed)
    # A tied LM head scores each token by its own embedding: with large embeddings the model
    # mostly repeats its input. Keep them small (0.02) and scale the final norm up (20) instead,
    # so that the logits spread as widely as with embeddings of 0.1 and a final norm of 4.
    tied = model.config.tie_word_embeddings
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen)
            if name == "model.norm.weight":
                p.copy_((1.0 + 0.1 * noise) * (20.0 if tied else 1.0))
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.1 * noise)
            elif "embed_tokens" in name:
                p.copy_(noise * (0.02 if tied else 1.0))
            elif name == "lm_head.weight":
                p.copy_(4.0 * noise / p.shape[-1] ** 0.5)
            else:  # projections [out, in], experts [E, out, in], router [E, hidden]
                p.copy_(noise / p.shape[-1] ** 0.5)


def _check_expert_layout(path: Path) -> None:
    """Real Qwen3-MoE checkpoints store each expert apart: ``mlp.experts.{i}.gate_proj.weight``.

    transformers 5 keeps the experts fused in memory (``experts.gate_up_proj [E, 2I, H]``) and
    5.24 splits them again when saving; fail loudly should a version save the fused form.
    """
    with safe_open(path / "model.safetensors", "pt") as f:
        fused = [k for k in f.keys() if re.search(r"\.experts\.(gate_up|down)_proj$", k)]
    if fused:
        raise RuntimeError(f"this transformers version saved fused experts: {fused[:2]}")


def _check_tokenizer(path: Path, trained, text: str = "") -> None:
    """transformers chooses the tokenizer class by model type too (``Qwen2Tokenizer`` for qwen2,
    with its own pipeline): what ``AutoTokenizer`` loads must encode as the trained one."""
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(path)
    text = TEXT + "".join(map(chr, range(32, 127))) + text
    if len(loaded) != len(trained) or loaded.encode(text) != trained.encode(text):
        raise RuntimeError(
            f"AutoTokenizer loads a {type(loaded).__name__} from {path} that does "
            "not encode as the trained tokenizer"
        )


def make_tiny_model(name: str, directory: str | Path) -> Path:
    """Write the tiny model ``name`` into ``directory`` and return its path."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # no "Writing model shards" bars in a chapter's prints
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    byte_level = name == "qwen2bytes"
    tokenizer = _train_byte_tokenizer() if byte_level else _train_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = _config(name, eos)
    if byte_level:  # Qwen2-Instruct: a reply ends at <|im_end|>, <|endoftext|> ends it too
        config.eos_token_id = tokenizer.convert_tokens_to_ids(BYTES_EOS)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize(model, seed=FAMILIES.index(name) + 1)
    if byte_level:
        model.generation_config.eos_token_id = [config.eos_token_id, eos]
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    # the generic class name, which transformers 4 and 5 both know
    config_file = path / "tokenizer_config.json"
    tok_config = json.loads(config_file.read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(tok_config, indent=2) + "\n")
    (path / RANDOM_WEIGHTS_FILE).write_text(
        f"The weights of this model ({name}, examples/tiny_models.py) are random: "
        "it writes random text.\n"
    )
    _check_tokenizer(path, tokenizer, MULTIBYTE_TEXT if byte_level else "")
    _check_expert_layout(path)
    return path


def make_all(directory: str | Path) -> dict[str, Path]:
    """Every family, each in its own subdirectory of ``directory``."""
    return {name: make_tiny_model(name, Path(directory) / name) for name in FAMILIES}


if __name__ == "__main__":
    import sys

    out = make_all(sys.argv[1] if len(sys.argv) > 1 else "tiny-models")
    for name, path in out.items():
        print(f"{name}: {path}")
