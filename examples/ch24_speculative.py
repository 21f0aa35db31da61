"""Chapter 24: speculative decoding. N-gram drafts from a request's own tokens; the run the
target keeps from them, greedy and sampled; speculative sampling's frequencies beside the
target's probabilities; then the engine on a tiny model: greedy output with drafts equal to
the output without, for n-gram drafts and draft models that agree more or less, the target
forwards each saves, and the pages of refused drafts given back."""

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

import tiny_models
import torch
from safetensors.torch import load_file, save_file

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.speculative import accept_greedy, accept_sampled, propose_ngram

torch.set_num_threads(1)

WORDS = "the cat sat on the mat . the dog sat on the".split()
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [11, 12, 13, 14, 15, 11, 12, 13], [3, 9, 27, 81]]


def show_ngram_drafts() -> None:
    """The longest suffix seen before, and what followed it then."""
    ids = {w: i for i, w in enumerate(dict.fromkeys(WORDS))}
    tokens = [ids[w] for w in WORDS]
    names = {i: w for w, i in ids.items()}
    print(f"tokens: {' '.join(WORDS)}")
    for k in (1, 3, 5):
        drafts = propose_ngram(tokens, k)
        print(f"  k={k}: drafts {' '.join(names[t] for t in drafts)!r}")
    print(f"  nothing repeats: {propose_ngram([1, 2, 3, 4], 3)}")


def show_greedy_runs() -> None:
    """The drafts kept while they equal the target's argmax, then the target's own token."""
    print("\ngreedy verification (drafts | target argmax at each position -> run kept):")
    for drafts, target in [
        ([5, 9, 2, 7], [5, 9, 4, 1, 8]),
        ([5, 9], [5, 9, 3]),
        ([4, 4, 4], [6, 4, 4, 4]),
    ]:
        run = accept_greedy(drafts, target)
        print(f"  {drafts} | {target} -> {run}  ({len(run) - 1} of {len(drafts)} kept)")


def show_sampled_frequencies(draws: int = 20000) -> None:
    """The first token of each run, over many runs: its frequencies are the target's p,
    whether the drafts are deterministic or drawn from a q unlike p."""
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.1, 0.6, 0.2, 0.1]])
    generator = torch.Generator().manual_seed(0)
    print(
        f"\nspeculative sampling, the first token of {draws} runs, target p = "
        f"{[round(x, 2) for x in p[0].tolist()]}:"
    )
    for label, draft, draft_probs in [
        ("draft 1, deterministic", 1, None),
        ("draft 3, deterministic", 3, None),
        ("draft drawn from q = [0.1, 0.6, 0.2, 0.1]", None, q),
    ]:
        counts = [0] * 4
        kept = 0
        for _ in range(draws):
            token = draft if draft is not None else _draw(q[0], generator)
            run = accept_sampled([token], p, generator, draft_probs)
            counts[run[0]] += 1
            kept += len(run) == 2
        freqs = " ".join(f"{c / draws:.3f}" for c in counts)
        print(f"  {label}: {freqs}  (kept {kept / draws:.2f})")


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def noisy_copy(path: str, directory: str, scale: float, seed: int = 1) -> str:
    """The model with Gaussian noise of ``scale`` times each weight's spread added: a draft
    that agrees with it more, the less noise (random weights have no smaller relative)."""
    shutil.copytree(path, directory)
    generator = torch.Generator().manual_seed(seed)
    for file in Path(directory).glob("*.safetensors"):
        weights = load_file(file)
        for name, w in weights.items():
            noise = torch.randn(w.shape, generator=generator) * w.float().std() * scale
            weights[name] = (w.float() + noise).to(w.dtype) if w.numel() > 1 else w
        save_file(weights, file, metadata={"format": "pt"})
    return directory


def expected_tokens(a: float, k: int) -> float:
    """Tokens a step keeps when each draft is kept with probability a, independently, once
    every draft before it was: 1 + a + ... + a^k."""
    return sum(a**i for i in range(k + 1))


@dataclass
class EngineRun:
    """One engine run: its tokens, and the target's forwards by kind. ``drafted`` holds, for
    every request-step (verify or decode), the drafts the request proposed, and ``runs`` the
    tokens it kept then (the main runs on a CPU, where no verify graph pads the drafts)."""

    llm: LLM
    tokens: List[List[int]]
    decode_forwards: int = 0  # plain decode steps: the scheduler's, or the speculator's
    verify_forwards: int = 0
    drafted: List[int] = field(default_factory=list)
    runs: List[int] = field(default_factory=list)

    @property
    def forwards(self) -> int:
        return self.decode_forwards + self.verify_forwards

    @property
    def reached(self) -> int:
        """The drafts the target compared: those kept, and the first refused of each run."""
        return sum(min(run, n) for run, n in zip(self.runs, self.drafted))

    def formula(self, a: float) -> float:
        """(1 - a^(k+1)) / (1 - a) a request-step, with each step's own k, averaged."""
        return sum(expected_tokens(a, n) for n in self.drafted) / len(self.drafted)


def run_engine(path: str, **spec: object) -> EngineRun:
    """The outputs, and the target's decode and verify forwards and request-steps, with drafts
    or without (a step in which no request drafts is a plain decode step)."""
    llm = LLM(path, device="cpu", page_size=4, num_pages=64, **spec)
    engine, speculator = llm.scheduler.engine, llm.scheduler.speculator
    run = EngineRun(llm, [])
    forward_batch = engine.forward_batch

    def counted(batch, *args):  # a decode step: the scheduler's own, or the speculator's
        if batch.phase == "decode":
            run.decode_forwards += 1
            run.drafted += [0] * batch.size
            run.runs += [1] * batch.size
        return forward_batch(batch, *args)

    engine.forward_batch = counted
    if speculator is not None:
        decode = speculator.decode

        def verifying(batch, constrained, mask):  # a verify step, unless no request drafted
            runs, ran = decode(batch, constrained, mask)
            if any(n > 1 for n in ran):
                run.verify_forwards += 1
                run.drafted += [n - 1 for n in ran]
                run.runs += [len(r) for r in runs]
            return runs, ran

        speculator.decode = verifying
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=24))
    run.tokens = [out["token_ids"] for out in outs]
    return run


def show_engine(models: Dict[str, str]) -> None:
    """Greedy on a tiny Llama 3: no drafts; n-gram drafts; draft models that agree with it
    less and less (noisy copies of it, then a model of unrelated weights); the target as its
    own draft; all of them drafting at every step (the rule off), then the noisier copy under
    the rule's defaults. The tokens are the same every time; the target's forwards are not."""
    base = run_engine(models["target"])
    print(
        f"\ntiny llama3, 3 prompts, greedy, 24 tokens each: {base.forwards} decode forwards"
        " without drafts"
    )
    runs = [("n-gram", {"speculative": "ngram"})] + [
        (f"draft {name}", {"speculative": "draft", "draft_model": models[name]})
        for name in ("target", "noise 0.1", "noise 0.3", "qwen3")
    ]
    for label, spec in runs:
        run = run_engine(models["target"], speculative_k=4, speculative_min_tokens=0.0, **spec)
        stats, steps = run.llm.scheduler.speculator.stats, len(run.drafted)
        a = stats.accepted / run.reached if run.reached else 0.0
        print(
            f"  {label:>15}, k=4: same tokens {run.tokens == base.tokens}, {run.forwards:>2}"
            f" forwards ({run.verify_forwards} verify + {run.decode_forwards} decode),"
            f" kept {stats.accepted:>2} of {stats.proposed:>3} drafts ({stats.acceptance:4.0%}),"
            f" {(stats.accepted + steps) / steps:.2f} tokens a step"
        )
        print(
            f"  {'':>15}       {steps} request-steps, {sum(n > 0 for n in run.drafted)} with"
            f" drafts; drafts reached {run.reached}, a = {a:.2f}; the formula at a with each"
            f" step's k: {run.formula(a):.2f} tokens a step"
        )
    print(f"  first prompt's tokens: {base.tokens[0]}")
    noisy = {"speculative": "draft", "draft_model": models["noise 0.3"]}
    run = run_engine(models["target"], speculative_k=4, **noisy)
    llm, stats = run.llm, run.llm.scheduler.speculator.stats
    print(
        f"  draft noise 0.3 under the rule (a request pauses below"
        f" {llm.scheduler.config.speculative_min_tokens} tokens a step): same tokens"
        f" {run.tokens == base.tokens}, {run.forwards} forwards, {stats.forwards} of them"
        f" verifying {stats.proposed} drafts"
    )


def show_pages_given_back(models: Dict[str, str]) -> None:
    """One request with k=6 drafts from the noisier copy: at each step the pages its refused
    drafts took go back; at the end every page is free or cached."""
    llm = LLM(
        models["target"],
        device="cpu",
        page_size=4,
        num_pages=64,
        speculative="draft",
        draft_model=models["noise 0.3"],
        speculative_k=6,
        speculative_min_tokens=0.0,  # every step drafts, however few it keeps
    )
    cache = llm.scheduler.cache_manager
    freed: List[int] = []
    free_tail = cache.free_tail

    def counted(req, held_len):  # the pages each step gives back
        before = cache.num_free_pages
        free_tail(req, held_len)
        freed.append(cache.num_free_pages - before)

    cache.free_tail = counted
    llm.generate([PROMPTS[0]], SamplingParams(max_tokens=24))
    stats = llm.scheduler.speculator.stats
    print(f"\npages given back at each step (page_size 4, k=6, the noise 0.3 draft): {freed}")
    print(f"  {stats.forwards} verify steps kept {stats.accepted} of {stats.proposed} drafts")
    free, cached = cache.num_free_pages, cache.prefix_cache.size_info.total_size // 4
    print(f"  idle: {free} free + {cached} cached = {free + cached} of {cache.num_pages} pages")


def main() -> None:
    show_ngram_drafts()
    show_greedy_runs()
    show_sampled_frequencies()
    with tempfile.TemporaryDirectory() as tmp:
        target = str(tiny_models.make_tiny_model("llama3", f"{tmp}/llama3"))
        models = {
            "target": target,
            "qwen3": str(tiny_models.make_tiny_model("qwen3", f"{tmp}/qwen3")),
            "noise 0.1": noisy_copy(target, f"{tmp}/noise_0.1", 0.1),
            "noise 0.3": noisy_copy(target, f"{tmp}/noise_0.3", 0.3),
        }
        show_engine(models)
        show_pages_given_back(models)


if __name__ == "__main__":
    main()
