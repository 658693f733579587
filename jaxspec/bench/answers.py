"""Answer-token accounting of the diffusion suites (``dllm``, ``ssd``, ``spiffy`` and the
drafter rows of ``diffuspec``), their prompt sets and the answer-quality flag.

A masked-diffusion decoder fills all ``G`` generated positions; an instruct model answers in
the first few and pads the rest with EOS, which every parallel or speculative decoder
commits in bulk. Figures over all ``G`` positions ("EOS-padded") then mostly measure the
tail. The figures here stop where the answer is complete:

* **answer** of one output: its generated positions up to and including the first EOS (all
  ``G`` without one) (:func:`answer_length`).
* **answer NFE**: the forwards the decoder spent until every answer position was committed
  (:func:`answer_nfe`). Each position's ``transfer_step`` says at which *reference step* it
  was committed, so the answer needs ``R = max(transfer_step[:n]) + 1`` reference steps.
  The reference decoders (:func:`jaxspec.dllm.decode.diffusion_generate`) run one step per
  iteration, ``NFE / steps`` forwards each (2 with classifier-free guidance), so the answer
  NFE is ``R * NFE / steps``. SSD and Spiffy take several reference steps per forward; their
  ``steps_by_nfe`` record (cumulative reference steps after each forward) gives the first
  forward after which ``R`` steps were taken. Forwards spent on the rest of a block or on
  later blocks count exactly when they came before that point (a decoder that commits tail
  positions before the last answer position really spends those forwards); forwards after
  it do not.
* **answer seconds**: the run's wall-clock seconds times ``answer NFE / NFE``. This assumes
  every forward of a run costs the same; a cached decoder's full forward at a block's first
  step costs more than its window forwards, and an SSD / Spiffy forward that verifies drafts
  more than a root-only one, so it is an estimate, not a separate timing.
* A causal decoder (DiffuSpec's verifier) stops at the first EOS: all its forwards are answer
  forwards (:func:`causal_answer`).

Row figures (:func:`answer_figures`, :func:`answer_speedups`): ``answer_nfe`` (mean),
``answer_tokens_per_nfe`` (answer positions / answer NFE, summed over prompts),
``answer_tokens_per_s`` (median over prompts of answer positions / answer seconds), and
against a reference row ``answer_nfe_speedup`` (reference answer NFE / answer NFE, summed)
and ``answer_speedup`` (median over prompts of reference answer seconds / answer seconds).

Quality flag (:func:`row_quality`, :func:`flag_line`): a row whose answers are mostly EOS or
loop (:func:`jaxspec.eval.quality.answer_flags`) is flagged in its report: one header line
names it and its speed figures carry a mark (:data:`FLAG_MARK`).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Callable, Optional, Sequence

import numpy as np

from jaxspec.bench.records import BenchError, BenchPrompt, _num
from jaxspec.eval.quality import ANSWER_FLAG_RULE, answer_quality

#: Mark appended to the speed figures of a flagged row in the markdown tables.
FLAG_MARK = " ⚠"


@dataclasses.dataclass(frozen=True)
class AnswerRun:
    """One decode of one prompt, accounted up to its answer.

    Attributes:
      length: answer positions (up to and including the first EOS; all of them without one).
      answer: the token ids before the first EOS (the degeneracy figures' text).
      nfe: target forwards until the answer was complete.
      seconds: wall-clock seconds until then (estimated: module docstring).
      total_nfe, total_seconds: the whole run's forwards and seconds.
      draft_nfe: drafter forwards until the answer was complete (DiffuSpec; 0 otherwise).
    """

    length: int
    answer: tuple
    nfe: int
    seconds: float
    total_nfe: int
    total_seconds: float
    draft_nfe: int = 0

    def entry(self) -> dict[str, Any]:
        """The answer fields of a suite's ``per_prompt`` run entry: ``answer_length``,
        ``answer_nfe`` and ``answer_seconds`` (rounded to 0.1 ms)."""
        return {
            "answer_length": self.length,
            "answer_nfe": self.nfe,
            "answer_seconds": _num(self.seconds, 4),
        }


def answer_length(tokens: Sequence[int], eos_ids: Sequence[int]) -> int:
    """Positions up to and including the first of ``eos_ids`` in ``tokens`` (``len(tokens)``
    when none occurs)."""
    eos = {int(e) for e in eos_ids}
    return next((i + 1 for i, t in enumerate(tokens) if int(t) in eos), len(tokens))


def answer_nfe(
    transfer_step: Sequence[int],
    length: int,
    *,
    nfe: int,
    steps: int,
    steps_by_nfe: Optional[Sequence[int]] = None,
) -> int:
    """Forwards spent until the first ``length`` positions were committed (module docstring).

    Args:
      transfer_step: int ``(G,)`` the reference step that committed each position.
      length: answer positions (>= 1).
      nfe, steps: the run's forwards and reference steps.
      steps_by_nfe: int ``(>= nfe,)`` reference steps taken after each forward (SSD / Spiffy);
        None for a reference decoder (step ``i`` = iteration ``i``, ``nfe / steps`` forwards
        each).

    Raises:
      ValueError: ``length`` outside ``[1, G]``, an uncommitted answer position, or a record
        that never reaches the answer's last step.
    """
    ts = np.asarray(transfer_step)
    if not 1 <= length <= len(ts):
        raise ValueError(f"answer length {length} outside [1, {len(ts)}]")
    if (ts[:length] < 0).any():
        raise ValueError("an answer position was never committed (transfer_step -1)")
    need = int(ts[:length].max()) + 1  # reference steps the answer needs
    if steps_by_nfe is None:
        return need * int(nfe) // max(int(steps), 1)
    log = np.asarray(steps_by_nfe)[: int(nfe)]
    i = int(np.searchsorted(log, need, side="left"))
    if i >= len(log):
        raise ValueError(
            f"the steps_by_nfe record ends at {log[-1] if len(log) else 0} "
            f"reference steps; the answer needs {need}"
        )
    return i + 1


def diffusion_answer(res, eos_ids: Sequence[int], row: int = 0) -> AnswerRun:
    """:class:`AnswerRun` of row ``row`` of a :class:`~jaxspec.dllm.config.DiffusionResult`
    (reference decoders, SSD, Spiffy).

    Raises:
      BenchError: an SSD / Spiffy result without its ``steps_by_nfe`` record.
    """
    toks = np.asarray(res.full_tokens[row])
    n = answer_length(toks, eos_ids)
    total, steps = int(res.stats.target_nfe[row]), int(res.stats.steps[row])
    log = None if res.steps_by_nfe is None else np.asarray(res.steps_by_nfe[row])
    if log is None and res.stats.method in ("ssd", "spiffy"):
        raise BenchError(
            f"a {res.stats.method} result needs its steps_by_nfe record for answer accounting"
        )
    a = answer_nfe(res.transfer_step[row], n, nfe=total, steps=steps, steps_by_nfe=log)
    cut = n - 1 if n and int(toks[n - 1]) in {int(e) for e in eos_ids} else n
    return AnswerRun(
        length=n,
        answer=tuple(int(t) for t in toks[:cut]),
        nfe=a,
        seconds=res.run_s * a / max(total, 1),
        total_nfe=total,
        total_seconds=res.run_s,
    )


def causal_answer(
    tokens: Sequence[int], eos_ids: Sequence[int], *, nfe: int, seconds: float, draft_nfe: int = 0
) -> AnswerRun:
    """:class:`AnswerRun` of a causal decode that stops at the first EOS (its ``tokens`` cut
    after it): every forward it ran was spent on the answer."""
    n = answer_length(tokens, eos_ids)
    eos = {int(e) for e in eos_ids}
    cut = n - 1 if n and int(tokens[n - 1]) in eos else n
    return AnswerRun(
        length=n,
        answer=tuple(int(t) for t in tokens[:cut]),
        nfe=int(nfe),
        seconds=float(seconds),
        total_nfe=int(nfe),
        total_seconds=float(seconds),
        draft_nfe=int(draft_nfe),
    )


def answer_figures(
    runs: Sequence[AnswerRun], *, draft: bool = False, rule: Optional[dict] = None
) -> dict[str, Any]:
    """The answer-based figures of one row (module docstring) and its quality
    (:func:`row_quality`): ``answer_nfe``, ``answer_seconds`` (means), ``answer_length``
    (mean positions through the EOS), ``answer_tokens_per_nfe``, ``answer_tokens_per_s``,
    with ``draft`` also ``answer_draft_nfe`` and ``answer_tokens_per_draft_nfe``."""
    if not runs:
        raise BenchError("no runs to account")
    tokens = sum(r.length for r in runs)
    out = {
        "answer_nfe": _num(statistics.fmean(r.nfe for r in runs), 2),
        "answer_seconds": _num(statistics.fmean(r.seconds for r in runs), 4),
        "answer_length": _num(statistics.fmean(r.length for r in runs), 2),
        "answer_tokens_per_nfe": _num(tokens / max(sum(r.nfe for r in runs), 1), 3),
        "answer_tokens_per_s": _num(
            statistics.median(r.length / max(r.seconds, 1e-9) for r in runs), 3
        ),
    }
    if draft:
        d = sum(r.draft_nfe for r in runs)
        out["answer_draft_nfe"] = _num(statistics.fmean(r.draft_nfe for r in runs), 2)
        out["answer_tokens_per_draft_nfe"] = _num(tokens / d, 3) if d else None
    return {**out, **row_quality(runs, rule)}


def answer_speedups(
    runs: Sequence[AnswerRun], ref: Sequence[AnswerRun], suffix: str = ""
) -> dict[str, Any]:
    """``answer_nfe_speedup`` (reference answer NFE / answer NFE, summed over prompts),
    ``answer_step_reduction`` (``1 -`` its inverse) and ``answer_speedup`` (median over
    prompts of reference answer seconds / answer seconds) against ``ref`` (same prompts);
    ``suffix`` is appended to every key (e.g. ``"_vs_reference"``)."""
    if len(runs) != len(ref):
        raise BenchError(f"{len(runs)} runs against {len(ref)} reference runs")
    nfe, rnfe = sum(r.nfe for r in runs), sum(r.nfe for r in ref)
    return {
        f"answer_nfe_speedup{suffix}": _num(rnfe / max(nfe, 1), 3),
        f"answer_step_reduction{suffix}": _num(1 - nfe / max(rnfe, 1), 4),
        f"answer_speedup{suffix}": _num(
            statistics.median(a.seconds / max(r.seconds, 1e-9) for a, r in zip(ref, runs)), 3
        ),
    }


def row_quality(runs: Sequence[AnswerRun], rule: Optional[dict] = None) -> dict[str, Any]:
    """``median_answer_tokens`` (before the EOS) and ``answer_flag`` (``"EOS"``, ``"loop"``,
    ``"EOS+loop"`` or None) of a row (:func:`jaxspec.eval.quality.answer_quality`)."""
    q = answer_quality([r.answer for r in runs], rule)
    return {
        "median_answer_tokens": q["median_answer_tokens"],
        "answer_flag": "+".join(q["answer_flags"]) or None,
    }


def prompt_set(tok, name: str, limit: int, start: int = 0) -> list[BenchPrompt]:
    """The token ids of prompts ``start .. start + limit - 1`` of a diffusion prompt set
    (:func:`jaxspec.eval.datasets.prompt_set_texts`: ``long`` or ``chat``).

    Raises:
      BenchError: an unknown set, bad ``limit`` / ``start``, or too few prompts.
    """
    from jaxspec.eval.datasets import prompt_set_texts

    try:
        texts = prompt_set_texts(name, tok, limit, start)
    except ValueError as e:
        raise BenchError(str(e)) from None
    return [BenchPrompt(t, tok.encode(x)) for t, x in texts]


PROMPT_SET_TEXT = {
    "long": "long-answer set: HumanEval raw completions (the stub as code, no chat template) "
    "alternating with held-out stdlib function bodies (signature + docstring given)",
    "chat": "chat set: HumanEval stubs in the chat template alternating with MT-Bench first turns",
}


def prompt_set_line(rows: Sequence[dict]) -> str:
    """The report sentence naming the prompt set(s) of ``rows`` (their ``prompt_set``)."""
    names = list(dict.fromkeys(r.get("prompt_set") for r in rows))
    parts = [
        f"`{n}` ({PROMPT_SET_TEXT.get(n, 'HumanEval prompts')})"
        if n
        else "HumanEval prompts (set not recorded)"
        for n in names
    ]
    return "Prompt set: " + "; ".join(parts) + "."


def _label(row: dict, keys: Sequence[str]) -> str:
    return "/".join(str(row[k]) for k in keys if row.get(k) not in (None, ""))


def flag_line(
    rows: Sequence[dict], label_keys: Sequence[str], rule: Optional[dict] = None
) -> Optional[str]:
    """One report-header line naming the flagged rows (``answer_flag``), or None when no row
    is flagged. ``label_keys``: the row fields that name a row (e.g. method, cache)."""
    r = {**ANSWER_FLAG_RULE, **(rule or {})}
    eos = [x for x in rows if "EOS" in (x.get("answer_flag") or "")]
    loop = [x for x in rows if "loop" in (x.get("answer_flag") or "")]
    if not eos and not loop:
        return None
    parts = []
    if eos:
        lo = min(x["median_answer_tokens"] for x in eos)
        hi = max(x["median_answer_tokens"] for x in eos)
        med = f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"
        parts.append(
            f"answers mostly EOS (median answer {med} tokens < "
            f"{r['median_answer_min']}) in {len(eos)} of {len(rows)} rows"
        )
    if loop:
        parts.append(
            f"answers loop (rep. 4-gram > {r['repeated_ngram_rate_max']} or distinct "
            f"< {r['distinct_token_share_min']} before the EOS) in {len(loop)} of "
            f"{len(rows)} rows ("
            + ", ".join(f"`{_label(x, label_keys)}`" for x in loop[:6])
            + (", ..." if len(loop) > 6 else "")
            + ")"
        )
    return (
        "**Bad input: " + "; ".join(parts) + f". The speed figures of flagged rows (marked"
        f"{FLAG_MARK}) measure EOS padding or a loop, not written text.**"
    )


def header_lines(
    result: dict, label_keys: Sequence[str], rows: Optional[Sequence[dict]] = None
) -> list[str]:
    """The lines a diffusion report puts under its header: the bad-input line
    (:func:`flag_line`, with the result's ``answer_flag_rule``) when a row is flagged, and the
    prompt-set sentence (:func:`prompt_set_line`). ``rows`` defaults to ``result["rows"]``."""
    rows = result["rows"] if rows is None else rows
    flag = flag_line(rows, label_keys, result.get("answer_flag_rule"))
    return ([flag, ""] if flag else []) + [prompt_set_line(rows), ""]


def is_speed_key(key: str) -> bool:
    """Whether a column is a speed figure (flagged in a flagged row): speedups, step
    reductions, MAT, tokens per NFE / per drafter NFE / per second."""
    return key == "mat" or any(
        s in key for s in ("speedup", "step_reduction", "per_nfe", "per_draft_nfe", "per_s")
    )


def markdown_table(
    rows: Sequence[dict], columns, *, flagged: Callable[[str], bool] = is_speed_key
) -> str:
    """:func:`jaxspec.bench.report.markdown_table` with the flag: in a row with an
    ``answer_flag`` the cells of the columns ``flagged`` selects carry :data:`FLAG_MARK`."""
    lines = [
        "| " + " | ".join(h for _, h, _ in columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    for r in rows:
        cells = []
        for key, _, fmt in columns:
            v = r.get(key)
            cell = (
                "-"
                if v is None
                else (("yes" if v else "NO") if isinstance(v, bool) else fmt.format(v))
            )
            if v is not None and r.get("answer_flag") and flagged(key):
                cell += FLAG_MARK
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: Columns every diffusion report shows right after a row's name: the answer-based figures.
ANSWER_LEAD = (
    ("answer_length", "answer len", "{:.1f}"),
    ("answer_nfe", "answer NFE", "{:.1f}"),
    ("answer_tokens_per_nfe", "answer tok/NFE", "{:.2f}"),
    ("answer_tokens_per_s", "answer tok/s", "{:.2f}"),
)
FLAG_COLUMN = ("answer_flag", "flag", "{}")

ANSWER_ACCOUNTING_NOTE = (
    "- Answer-based columns (first): an output's *answer* is its generated positions up to and "
    "including the first EOS (`answer len`, mean). `answer NFE` = forwards until every answer "
    "position was committed (from each position's transfer step; forwards spent on the EOS tail "
    "count only when they came earlier); `answer tok/NFE` = answer positions / answer NFE; "
    "`answer tok/s` = median over prompts of answer positions / answer seconds, where answer "
    "seconds = run seconds x answer NFE / NFE (forwards assumed equally costly: an estimate). "
    "The columns without `answer` count all generated positions, EOS padding included."
)
