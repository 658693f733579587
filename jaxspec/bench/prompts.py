"""Prompt sets of the ``space`` and ``diffuspec`` suites (:func:`suite_prompts`): HumanEval
(completion and chat), MT-Bench first turns and news summaries, as token ids."""

from __future__ import annotations

from typing import Sequence

from jaxspec.bench.records import BenchError, BenchPrompt

# prompt sets of the space and diffuspec suites (suite_prompts)
PROMPT_SETS = ("humaneval", "humaneval-chat", "mt-bench", "news")


def suite_prompts(
    tok, sets: Sequence[str], limit: int, start: int = 0
) -> dict[str, list[BenchPrompt]]:
    """Token ids of the first ``limit`` prompts of each set (:data:`PROMPT_SETS`).

    Raises:
      BenchError: an unknown set name or ``limit < 1``.
    """
    from jaxspec.eval.datasets import (
        chat_prompt,
        humaneval_problems,
        humaneval_prompt,
        lee_documents,
        mtbench_questions,
        summarize_prompt,
    )

    if limit < 1:
        raise BenchError(f"--limit must be >= 1, got {limit}")
    out = {}
    for name in sets:
        sl = slice(start, start + limit)
        if name in ("humaneval", "humaneval-chat"):
            texts = [
                (p["task_id"], humaneval_prompt(p, tok, name == "humaneval-chat"))
                for p in humaneval_problems()[sl]
            ]
        elif name == "mt-bench":
            texts = [
                (f"mt-bench/{q['question_id']}", chat_prompt(q["turns"][0], tok))
                for q in mtbench_questions()[sl]
            ]
        elif name == "news":
            texts = [
                (f"lee/{i}", summarize_prompt(d, tok))
                for i, d in list(enumerate(lee_documents()))[sl]
            ]
        else:
            raise BenchError(f"unknown prompt set {name!r}; available: {', '.join(PROMPT_SETS)}")
        out[name] = [BenchPrompt(t, tok.encode(x)) for t, x in texts]
    return out
