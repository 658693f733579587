"""Writing a suite's results: markdown tables and headers, the answer-degeneracy columns,
figures, and the atomic write of the JSON / markdown / PNG trio (:func:`write_results`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

# Columns of :func:`jaxspec.eval.metrics.answer_degeneracy` (diffusion suites): degeneracy of the
# text before the first EOS, the answer length and the EOS-tail share.
ANSWER_COLUMNS = (
    ("distinct_token_share", "distinct", "{:.2f}"),
    ("repeated_ngram_rate", "rep. 4-gram", "{:.2f}"),
    ("longest_run", "longest run", "{}"),
    ("answer_tokens", "answer tokens", "{:.1f}"),
    ("eos_share", "EOS share", "{:.2f}"),
)
ANSWER_NOTE = (
    "- `distinct`, `rep. 4-gram`, `longest run`: degeneracy of the text before each "
    "output's first EOS (a looping model agrees with itself and inflates acceptance); "
    "`answer tokens`: its mean length; `EOS share`: share of the generated positions "
    "that hold EOS, the tail an instruct dLLM pads its blocks with. EOS tails are easy "
    "to accept and decode, as in the papers' figures: read speedups beside this share."
)


def markdown_table(result: dict, columns: Sequence[tuple[str, str, str]]) -> str:
    """The rows of a result document as a GitHub markdown table; ``columns`` is a list of
    ``(key, header, format)``. ``None`` prints ``-``, booleans ``yes`` / ``NO``."""
    lines = [
        "| " + " | ".join(h for _, h, _ in columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    for r in result["rows"]:
        cells = []
        for key, _, fmt in columns:
            v = r.get(key)
            cells.append(
                "-"
                if v is None
                else (("yes" if v else "NO") if isinstance(v, bool) else fmt.format(v))
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


MAT_DEFINITION = (
    "`MAT` = generated tokens / target forwards (prefill counted, the bonus or "
    "correction token of each step counted); AR has MAT 1."
)


def report_header(title: str, result: dict, *, peers: bool = False) -> list[str]:
    """The first lines of a suite's markdown page: title; date / CPU / cores / accelerator (when
    JAX ran on one) / jax, plus torch and transformers when ``peers`` (suites that time the
    transformers peers); and the config."""
    m, c = result["machine"], result.get("config") or {}
    line = (
        f"{result['date']} · {m.get('cpu')} · {m.get('cores')} cores"
        + (f" · {m['accelerator']}" if m.get("accelerator") else "")
        + f" · jax {m.get('jax')}"
        + (f" · torch {m.get('torch')} · transformers {m.get('transformers')}" if peers else "")
    )
    out = [f"# {title}", "", line, ""]
    return out + (["Config: " + ", ".join(f"`{k}={v}`" for k, v in c.items()), ""] if c else [])


def save_figure(fig, out: Path, title: Optional[str] = None) -> Path:
    """Give ``fig`` its (small) title, lay it out, write it to ``out`` as PNG and close it."""
    from jaxspec.core.plotting import pyplot

    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    pyplot().close(fig)
    return out


def plot_k_sweep(ax, rows: list, xlabel: str, title: str) -> None:
    """MAT and the wall-clock speedup vs AR of ``rows`` (each with ``k``, ``mat``,
    ``speedup_vs_baseline``) against ``k`` on ``ax``, with the break-even line at 1."""
    ks = [r["k"] for r in rows]
    ax.plot(ks, [r["mat"] for r in rows], "o-", label="MAT")
    ax.plot(ks, [r["speedup_vs_baseline"] for r in rows], "s-", label="wall-clock speedup vs AR")
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=8)
    ax.set_title(title)


def write_results(
    result: dict,
    out: Path,
    *,
    report: Callable[[dict], str],
    plot: Callable[[dict, Path], Path],
    caption: str = "per-prompt throughput",
) -> tuple[Path, Path]:
    """Write ``result`` as JSON to ``out``, the suite's markdown ``report`` of it next to it
    (``.md``) and its ``plot`` (``.png``, linked from the report)."""
    import json

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2) + "\n"
    _replace_atomically(out, lambda tmp: tmp.write_text(text))
    png = out.with_suffix(".png")
    _replace_atomically(png, lambda tmp: plot(result, tmp))
    md = out.with_suffix(".md")
    text = report(result) + f"\n![{caption}]({png.name})\n"
    _replace_atomically(md, lambda tmp: tmp.write_text(text))
    return out, md


def _replace_atomically(path: Path, write: Callable[[Path], Any]) -> None:
    """``write(tmp)`` to a temporary file beside ``path`` (same suffix), then rename it over
    ``path``: a reader, or a run that fails half-way, never sees a half-written file."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
