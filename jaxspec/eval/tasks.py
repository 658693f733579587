"""Evaluation tasks of the AS-ARM infilling benchmarks.

**HumanEval single-line infilling** (ASSD paper Appendix E.7, following Gong et al. 2024 /
Bavarian et al. 2022): for every non-blank line of every canonical solution, the line is
removed and must be infilled given the prompt and the rest of the solution. The line's
indentation stays in the prefix (the paper inserts the ground-truth indentation for its
baseline for the same reason) and the masked span has the oracle length: the number of tokens
of the removed line's text (plus ``extra_masks``). A completion passes when the program (prompt
+ solution with the infilled line + the problem's tests + ``check(entry_point)``) exits with
status 0 in the sandbox (:func:`jaxspec.eval.sandbox.run_program`). The template of a task is
built with the ``<mask:N>`` machinery of :mod:`jaxspec.asarm.infill`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

from jaxspec.asarm.infill import InfillTemplate, build_template
from jaxspec.eval.datasets import humaneval_problems


@dataclasses.dataclass(frozen=True)
class LineTask:
    """One HumanEval single-line infilling task.

    Attributes:
      task_id: ``"HumanEval/<p>/L<i>"``; problem: the problem's ``task_id``; line: index ``i`` of
      the removed line in the canonical solution; prefix: prompt + solution lines before it;
      indent: the removed line's leading whitespace; target: the removed text (after
      ``indent``); suffix: solution lines after it; test, entry_point: from the problem.
    """

    task_id: str
    problem: str
    line: int
    prefix: str
    indent: str
    target: str
    suffix: str
    test: str
    entry_point: str

    def program(self, fill: str) -> str:
        """The full program with ``fill`` as the removed line's text."""
        return (
            self.prefix
            + self.indent
            + fill
            + "\n"
            + self.suffix
            + "\n\n"
            + self.test
            + f"\n\ncheck({self.entry_point})\n"
        )

    def pieces(self, n_masks: int) -> list:
        """Template pieces: prefix + indentation, ``n_masks`` masks, newline + suffix."""
        return [self.prefix + self.indent, int(n_masks), "\n" + self.suffix]


def single_line_tasks(
    problems: Optional[Sequence[dict]] = None, limit: Optional[int] = None
) -> list:
    """Single-line infilling tasks (module docstring), problem by problem, line by line.

    Args:
      problems: HumanEval problems (default: :func:`jaxspec.eval.datasets.humaneval_problems`).
      limit: keep the first ``limit`` tasks.
    """
    if problems is None:
        problems = humaneval_problems()
    out = []
    for p in problems:
        lines = p["canonical_solution"].split("\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            body = line.lstrip()
            indent = line[: len(line) - len(body)]
            prefix = p["prompt"] + "".join(x + "\n" for x in lines[:i])
            out.append(
                LineTask(
                    task_id=f"{p['task_id']}/L{i}",
                    problem=p["task_id"],
                    line=i,
                    prefix=prefix,
                    indent=indent,
                    target=body.rstrip(),
                    suffix="\n".join(lines[i + 1 :]),
                    test=p["test"],
                    entry_point=p["entry_point"],
                )
            )
            if limit is not None and len(out) >= limit:
                return out
    return out


def line_template(
    task: LineTask, tokenizer, extra_masks: int = 0, max_len: Optional[int] = None
) -> InfillTemplate:
    """Template of ``task`` with the oracle span length ``len(encode(target)) + extra_masks``."""
    encode = tokenizer.encode if hasattr(tokenizer, "encode") else tokenizer
    n = max(1, len(encode(task.target)) + int(extra_masks))
    return build_template(task.pieces(n), encode, max_len)


def fill_text(template: InfillTemplate, ids: Sequence[int], decode: Callable[[list], str]) -> str:
    """The decoded text of the first masked span (the infilled line), cut at its first newline
    (a single-line task can only use one line), without leading spaces or tabs: the template
    already holds the line's indentation, and a BPE tokenizer's word-initial space token would
    otherwise indent the line once more (the paper's Appendix E.7 strips the leading space)."""
    a, b = template.spans[0]
    return decode([int(t) for t in ids[a:b]]).split("\n")[0].lstrip(" \t")


__all__ = ["LineTask", "single_line_tasks", "line_template", "fill_text"]
