"""Helpers the tests share. The same file in every chapter's tree: minisgl is imported only
inside functions, and only where a chapter that has the module calls them."""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
DENSE = ("llama3", "qwen2", "qwen3", "mistral")  # the families a dense decoder runs end to end
# how long a process (a server, a worker) may take to start: mostly imports, which a loaded
# machine slows tenfold; a start that takes longer is a hang
START_TIMEOUT = 300.0


def _quiet_transformers() -> None:
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


@functools.lru_cache(maxsize=None)
def hf_model(path: str | Path) -> Any:
    """The transformers model of a directory, float32, in eval mode (cached: do not modify it)."""
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


@functools.lru_cache(maxsize=None)
def hf_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    _quiet_transformers()
    return AutoTokenizer.from_pretrained(str(path))


def encode(path: str | Path, prompt: str | Sequence[int]) -> list[int]:
    """A prompt's token ids, as ``hf_greedy`` feeds them to transformers."""
    if isinstance(prompt, str):
        return hf_tokenizer(path)(prompt)["input_ids"]
    return list(prompt)


@torch.inference_mode()
def hf_greedy(path: str | Path, prompts: Sequence[str | Sequence[int]], n: int) -> list[list[int]]:
    """transformers' greedy ``generate`` of exactly ``n`` new tokens per prompt (EOS does not
    stop it); returns only the new token ids. Prompts run one at a time, without padding."""
    model = hf_model(path)
    result = []
    for prompt in prompts:
        ids = torch.tensor([encode(path, prompt)])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
        )
        new = out[0, ids.shape[1] :].tolist()
        assert len(new) == n, f"transformers stopped after {len(new)} of {n} tokens"
        result.append(new)
    return result


@torch.inference_mode()
def hf_logits(path: str | Path, token_ids: Sequence[int]) -> torch.Tensor:
    """transformers' logits [T, vocab] (float32) for one whole sequence."""
    return hf_model(path)(torch.tensor([list(token_ids)])).logits[0].float()


_QKV = re.compile(r"^(.*\.self_attn)\.(q|k|v)_proj\.(weight|bias)$")
_GATE_UP = re.compile(r"^(.*\.mlp)\.(gate|up)_proj\.weight$")


def hf_to_minisgl_state(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename and merge a transformers state dict into minisgl's names, literally:
    ``q_proj, k_proj, v_proj -> qkv_proj`` (rows q, k, v) and ``gate_proj, up_proj ->
    gate_up_proj`` (rows gate, up). transformers 5 already holds MoE experts packed
    (``mlp.experts.gate_up_proj``), so they pass through. Chapter 2 cannot use chapter 3's loader.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in hf_state.items():
        if m := _QKV.match(key):
            if m.group(2) == "q":
                parts = [hf_state[f"{m.group(1)}.{p}_proj.{m.group(3)}"] for p in "qkv"]
                out[f"{m.group(1)}.qkv_proj.{m.group(3)}"] = torch.cat(parts)
        elif m := _GATE_UP.match(key):
            if m.group(2) == "gate":
                parts = [hf_state[f"{m.group(1)}.{p}_proj.weight"] for p in ("gate", "up")]
                out[f"{m.group(1)}.gate_up_proj.weight"] = torch.cat(parts)
        else:
            out[key] = value
    return out


def copy_hf_weights(hf: Any, model: Any) -> None:
    """Copy a transformers model's weights into a minisgl model of the same config."""
    model.load_state_dict(hf_to_minisgl_state(hf.state_dict()))


def build_llm(path: str | Path) -> Any:
    """An offline ``LLM`` with small CPU options: a few pages of 4 tokens, a few rows."""
    from minisgl.llm import LLM

    return LLM(
        str(path),
        device="cpu",
        page_size=4,
        num_pages=256,
        max_running_req=8,
        max_extend_tokens=256,
    )


def greedy(n: int) -> Any:
    """Sampling parameters for exactly ``n`` greedy tokens (EOS does not stop them)."""
    from minisgl.core import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def assert_pages_all_back(s: Any) -> None:
    """A scheduler that has run dry gave everything back: every row, no cached token still
    locked, and every page of the pool free or held by the prefix cache (none lost, none twice)."""
    pool = s.cache_manager
    pool.check_integrity(exhaustive=True)
    info = pool.prefix_cache.size_info
    assert info.protected_size == 0, f"{info.protected_size} cached tokens still locked"
    assert info.total_size % pool.page_size == 0  # the cache keeps whole pages
    assert pool.num_free_pages + info.total_size // pool.page_size == pool.num_pages
    assert s.table_manager.available_size == s.config.max_running_req and s.idle


def benchmark_module(name: str) -> Any:
    """benchmark/<name>.py as a module (benchmark/ is a folder of scripts, not a package, and no
    chapter's tree holds it: the tests that use this skip there)."""
    import importlib

    folder = str(ROOT / "benchmark")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(folder)


def modules_imported(imports: str, names: Sequence[str]) -> list[str]:
    """Which of ``names`` a fresh interpreter holds after ``import <imports>`` with this tree's
    python/ on its path, sorted: what a process that imports only those modules pays for."""
    import ast
    import os
    import subprocess

    code = f"import sys, {imports}; print(sorted({set(names)!r} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "python")},
        timeout=START_TIMEOUT,
    )
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout.strip())
