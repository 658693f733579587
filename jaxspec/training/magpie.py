"""Prompts the target writes itself, for self-distillation (Magpie: Xu et al., "Magpie:
Alignment Data Synthesis from Scratch by Prompting Aligned LLMs with Nothing",
arXiv:2406.08464, Sec. 2.1, step 1 "instruction generation").

An instruction-tuned model fed only its chat template's *pre-query* part (everything before
the user's text) continues with a user query of the kind it was tuned on, and ends it with its
end-of-turn token. Sampled (temperature 1, nucleus 0.95 by default) this gives varied queries
no benchmark contains. Step 2 of Magpie, the answers, is
:func:`jaxspec.training.distill.self_distill`: the target's greedy answer to each query, so a
drafter learns the target's own answers on prompts like the ones it is benchmarked on.

Two kinds of prompt come from the queries:

* ``"chat"``: the query as one user turn of the chat template. The sampled part follows a
  lead from :data:`CHAT_LEADS`, cycled (an empty lead: the model picks the topic; "Write a
  Python function": a coding task, the kind SmolLM2-135M-Instruct asks itself most readily);
* ``"code"``: a raw function stub for code continuation, as HumanEval prompts are written (a
  signature and a docstring, no chat template): from a query that follows :data:`CODE_LEAD`
  and names its function as ``name(args)`` in backticks, :func:`code_stub` builds
  ``def name(args):`` with the query's first paragraph as the docstring. Queries that name no
  parseable signature give no code prompt.

Sampling depends on float rounding, which differs between machines, so the queries are kept in
a JSON-lines file (:func:`sample_queries`); a rerun reads them back instead of sampling again,
and the prompts (:func:`magpie_prompts`) are a function of that file.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from jaxspec.training.data import DataError
from jaxspec.training.distill import open_for_append, read_distill

__all__ = ["CHAT_LEADS", "CODE_LEAD", "pre_query", "code_stub", "sample_queries", "magpie_prompts"]

#: leads of the sampled chat queries, cycled over the samples ("" lets the model pick)
CHAT_LEADS = ("", "", "Write a Python function")
#: lead of the queries code stubs are built from (:func:`code_stub`)
CODE_LEAD = "Write a Python function `"
_SENTINEL = "\x00"
_SIGNATURE = re.compile(r"`([A-Za-z_]\w*)\(([^`()]*)\)`")


def pre_query(tokenizer) -> str:
    """The chat template's text before the user's message (Magpie's pre-query template): the
    template rendered around a sentinel user message, cut at the sentinel.

    Raises:
      DataError: a tokenizer without a chat template, or a template that does not show the
        user's message verbatim.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("Magpie prompts need a tokenizer with a chat template")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}])
    if text.count(_SENTINEL) != 1:
        raise DataError("the chat template does not show the user's message verbatim")
    return text[: text.index(_SENTINEL)]


def code_stub(query: str, max_doc_chars: int = 600) -> Optional[str]:
    """A HumanEval-style function stub from a coding query that names its function.

    ``"Write a Python function `f(xs, k)` that ..."`` gives::

        def f(xs, k):
            \"\"\"Write a Python function `f(xs, k)` that ...\"\"\"

    (the query's first paragraph, cut at ``max_doc_chars`` characters and wrapped at 88
    columns, as the docstring; the stub ends with a newline, where the model continues).

    Returns:
      the stub, or None when the query names no ``name(args)`` in backticks, the signature
      does not parse as Python, or the docstring would hold triple quotes or backslashes.
    """
    m = _SIGNATURE.search(query)
    if m is None:
        return None
    doc = query.strip().split("\n\n")[0][:max_doc_chars].strip()
    if '"""' in doc or "\\" in doc or not doc:
        return None
    head = f"def {m.group(1)}({m.group(2).strip()}):\n"
    body = textwrap.fill(doc, 88, initial_indent='    """', subsequent_indent="    ")
    stub = f'{head}{body}\n    """\n'
    try:
        ast.parse(stub + "    pass\n")
    except SyntaxError:
        return None
    return stub


def _kind(seed: int, tag: int, j: int, chat_fraction: float) -> str:
    return "chat" if np.random.default_rng([seed, tag, 7, j]).random() < chat_fraction else "code"


def sample_queries(
    model,
    params,
    tokenizer,
    path,
    *,
    split: str,
    count: int,
    chat_fraction: float = 0.5,
    seed: int = 0,
    batch: int = 32,
    bucket: int = 64,
    max_query_tokens: int = 96,
    temperature: float = 1.0,
    top_p: float = 0.95,
    progress: bool = True,
) -> list[dict]:
    """Sample queries until ``path`` holds ``count`` of ``split`` (Magpie step 1).

    Sample ``j`` of a split is a chat query with probability ``chat_fraction`` (seeded per
    ``(seed, split, j)``) and follows ``CHAT_LEADS[j % 3]``, else it follows :data:`CODE_LEAD`;
    each batch of ``batch`` samples is one :func:`jaxspec.causal.decode.generate` call from the
    pre-query template plus lead, seeded by ``(seed, split, first j)``, stopped at the model's
    EOS or ``max_query_tokens``. Rows ``{"j", "split", "settings", "kind", "lead", "query",
    "ended"}`` (``settings``: ``seed``, ``chat_fraction``, ``temperature``, ``top_p``,
    ``max_query_tokens``; ``query`` includes the lead) are appended to ``path``; rows already
    there are kept, so a rerun continues (a partial last line, from an interrupted write, is
    cut first). ``bucket``: prompt-length rounding of the compiled loop (as
    :func:`jaxspec.training.distill.self_distill`).

    Returns:
      the rows of ``split`` in ``path``, ``j`` order.

    Raises:
      DataError: ``split`` not ``train`` / ``val``, ``chat_fraction`` outside ``[0, 1]``,
        ``count`` or ``batch`` < 1, no chat template, a row of ``path`` that is not JSON, a
        missing or repeated ``j``, or rows of ``split`` sampled with other ``settings``.
    """
    from tqdm.auto import tqdm

    from jaxspec.causal.decode import generate
    from jaxspec.core.sampling import SamplingConfig

    if split not in ("train", "val"):
        raise DataError(f"split must be 'train' or 'val', got {split!r}")
    if not 0.0 <= chat_fraction <= 1.0:
        raise DataError(f"chat_fraction must lie in [0, 1], got {chat_fraction}")
    if count < 1 or batch < 1:
        raise DataError(f"count and batch must be >= 1, got {count} and {batch}")
    pre = pre_query(tokenizer)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tag = 0 if split == "train" else 1
    settings = dict(
        seed=seed,
        chat_fraction=chat_fraction,
        temperature=temperature,
        top_p=top_p,
        max_query_tokens=max_query_tokens,
    )
    have = sorted((r for r in read_distill(path) if r.get("split") == split), key=lambda r: r["j"])
    for i, r in enumerate(have):
        if r["j"] != i:
            raise DataError(f"{path}: {split} query j={i} is missing or repeated: use a new file")
        if r.get("settings") != settings:
            raise DataError(
                f"{path} holds {split} queries sampled otherwise (row j={i}: "
                f"{r.get('settings')}; this call: {settings}): use a new file"
            )
    eos = tuple(tokenizer.eos_token_ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    sampling = SamplingConfig(temperature=temperature, top_p=top_p)
    with (
        open_for_append(path) as f,
        tqdm(
            total=count, initial=min(len(have), count), disable=not progress, desc="queries"
        ) as bar,
    ):
        while len(have) < count:
            j0 = len(have)
            rows = []
            for j in range(j0, j0 + batch):
                kind = _kind(seed, tag, j, chat_fraction)
                lead = CHAT_LEADS[j % len(CHAT_LEADS)] if kind == "chat" else CODE_LEAD
                rows.append(
                    {"j": j, "split": split, "settings": settings, "kind": kind, "lead": lead}
                )
            res = generate(
                model,
                params,
                [tokenizer.encode(pre + r["lead"]) for r in rows],
                max_new_tokens=max_query_tokens,
                sampling=sampling,
                seed=int(np.random.default_rng([seed, tag, j0]).integers(2**31)),
                eos_ids=eos,
                pad_id=pad,
                bucket=bucket,
            )
            for r, toks in zip(rows, res.tokens):
                toks = [int(t) for t in toks]
                ended = any(t in eos for t in toks)
                if ended:
                    toks = toks[: min(toks.index(e) for e in eos if e in toks)]
                r.update(query=r["lead"] + tokenizer.decode(toks), ended=ended)
                f.write(json.dumps(r) + "\n")
            f.flush()
            have += rows
            bar.update(min(len(rows), count - bar.n))
    return have[:count]


def magpie_prompts(
    model,
    params,
    tokenizer,
    queries_path,
    *,
    split: str = "train",
    n: int = 1000,
    chat_fraction: float = 0.5,
    seed: int = 0,
    must_end: bool = True,
    min_chars: int = 16,
    max_tries: Optional[int] = None,
    exclude: Iterable[str] = (),
    **sample_kw,
) -> list[dict]:
    """``n`` prompts (dicts ``{"kind": "chat" | "code", "split", "text", "source"}``) from
    queries the model samples itself (module docstring), sampling more into ``queries_path``
    (:func:`sample_queries`) until ``n`` usable ones exist.

    A query is usable when it is complete (``must_end``: it ended with EOS, or, for the code
    kind, whose stub takes the first paragraph only, a blank line follows that paragraph; a
    query cut by the budget is otherwise unfinished), has at least ``min_chars`` characters
    after its lead, gives a prompt that is not a repeat of an earlier one of the split nor one
    of ``exclude`` (e.g. the train prompts, when building the val split), and, for the code
    kind, gives a stub (:func:`code_stub`). ``n < 1`` gives ``[]``. ``source`` is
    ``magpie:<split>:<j>``.

    Raises:
      DataError: fewer than ``n`` usable queries after ``max_tries`` samples (default
        ``4 * n + 64``), and :func:`sample_queries`'s errors.
    """
    from jaxspec.eval.datasets import chat_prompt

    if n < 1:
        return []
    tries = max_tries if max_tries is not None else 4 * n + 64
    count = min(n, tries)
    while True:
        rows = sample_queries(
            model,
            params,
            tokenizer,
            queries_path,
            split=split,
            count=count,
            chat_fraction=chat_fraction,
            seed=seed,
            **sample_kw,
        )
        out, seen = [], set(exclude)
        for r in rows:
            q = r["query"]
            # a code stub takes the first paragraph only: complete once a blank line follows it
            done = r["ended"] or (r["kind"] == "code" and "\n\n" in q.strip())
            if (must_end and not done) or len(q) - len(r["lead"]) < min_chars:
                continue
            text = chat_prompt(q, tokenizer) if r["kind"] == "chat" else code_stub(q)
            if text is None or text in seen:
                continue
            seen.add(text)
            out.append(
                {
                    "kind": r["kind"],
                    "split": split,
                    "text": text,
                    "source": f"magpie:{split}:{r['j']}",
                }
            )
            if len(out) == n:
                return out
        if count >= tries:
            raise DataError(
                f"only {len(out)} usable {split} queries of {count} sampled in {queries_path} "
                f"(asked for {n}): raise max_tries or lower n"
            )
        # sample for the shortfall at the yield so far
        rate = max(len(out) / count, 0.05)
        count = min(tries, count + int((n - len(out)) / rate) + 1)
