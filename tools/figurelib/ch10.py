"""Chapter 10's figure: lifetimes.svg, the steps of one LLM.generate call."""

from __future__ import annotations

import matplotlib.pyplot as plt

from .common import Step, figure, run_main, timeline


@figure("ch10", "lifetimes")
def lifetimes() -> plt.Figure:
    """The steps of the ch10 main's first LLM.generate call, as the scheduler reported them."""
    steps: list[list[Step]] = []
    main = run_main("ch10_llm.py", steps)
    run = steps[0]
    config = main["llm"].scheduler.config
    fig, ax = plt.subplots(figsize=(12, 3.6), layout="constrained")
    fig.suptitle(
        f"One LLM.generate call in the chapter 10 main: {len(main['PROMPTS'])} "
        f"prompts, budget {config.max_extend_tokens} prompt tokens a prefill"
    )
    timeline(ax, run)
    ax.set_title(
        "P n: a prefill of n prompt tokens, D decode, * last token, w waiting (admitted or not)",
        loc="left",
        fontsize=10,
    )
    ax.set_xlabel("step")
    return fig
