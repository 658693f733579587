"""Benchmark suite ``ssd``: SSD against its stepwise references.

For each cache policy in the suite, the reference row is one-token-per-step stepwise
decoding (:func:`jaxspec.dllm.decode.diffusion_generate`, ``steps = gen_length``) and every SSD row
(:func:`jaxspec.dllm.ssd.ssd_generate`: draft length, tree) is compared with the reference of the
same cache policy. Every prompt runs alone (batch 1), greedy; the configurations of one prompt
run in turn, the order rotating from prompt to prompt (:func:`jaxspec.bench.dllm.run_interleaved`).

Figures per row, as in SSD Table 1 (TPS, Step↓) plus what a CPU needs to read them:

* ``nfe`` (forwards per prompt, mean) and ``step_reduction`` = ``1 - NFE / reference NFE``;
  ``nfe_speedup`` = reference NFE / NFE;
* ``tokens_per_s`` (median of ``gen_length`` / wall seconds) and ``speedup`` (median
  per-prompt wall-clock ratio to the reference); ``seconds_per_forward`` = wall seconds / NFE
  (mean), the per-forward cost that turns the NFE ratio into the wall-clock ratio (an SSD
  forward verifies ``nodes`` sequences in one batch);
* ``identical_to_reference`` (every prompt's tokens equal the reference's), acceptance rate
  (accepted drafts / candidates verified), ``mat`` (tokens per forward);
* degeneracy figures of the text before each output's first EOS, the mean answer length and
  the share of EOS positions (:func:`jaxspec.eval.metrics.answer_degeneracy`): EOS tails are
  easy to accept, so acceptance and step reduction are read beside them;
* the answer-based figures (:mod:`jaxspec.bench.answers`), shown first: ``answer_nfe``
  (forwards until each output's answer, up to and including its first EOS, was committed,
  from SSD's ``steps_by_nfe`` record), ``answer_step_reduction`` = ``1 - answer NFE /
  reference answer NFE``, ``answer_nfe_speedup``, ``answer_tokens_per_s`` and the wall-clock
  ``answer_speedup`` (estimated answer seconds); ``answer_flag`` marks rows whose answers are
  mostly EOS or loop, ``prompt_set`` names the prompt set.

The Sec. 5.1 acceptance-limit analysis (Table 2) runs on the same prompts from recorded
stepwise runs (:func:`jaxspec.dllm.ssd.stepwise_topk`, :func:`jaxspec.dllm.ssd.acceptance_limit`).
"""

from __future__ import annotations

import datetime
import statistics
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from jaxspec.bench import answers as ans
from jaxspec.bench import report
from jaxspec.bench.dllm import run_interleaved
from jaxspec.bench.machine import machine_info
from jaxspec.bench.records import BenchError, BenchPrompt, _num
from jaxspec.bench.report import save_figure
from jaxspec.dllm import (
    DiffusionDecodeConfig,
    SSDConfig,
    acceptance_limit,
    diffusion_generate,
    ssd_generate,
    stepwise_topk,
)
from jaxspec.eval.metrics import answer_degeneracy

# (draft length, tree, cache) rows of the default suite: every draft length of Table 1 with
# the dual cache (the paper's setting) and the mix-order tree. Uncached rows (e.g. 3:chain:none)
# cost about 4x the dual ones on a CPU; add them with --ssd-rows.
SSD_ROWS = (
    (3, "chain", "dual"),
    (4, "chain", "dual"),
    (5, "chain", "dual"),
    (4, "mix-order", "dual"),
)


def parse_rows(specs: Optional[Sequence[str]]) -> list[tuple[int, str, str]]:
    """``"N:tree:cache"`` strings (e.g. ``"3:chain:dual"``) -> row tuples (default
    :data:`SSD_ROWS`). Raises BenchError on a malformed spec."""
    if not specs:
        return list(SSD_ROWS)
    out = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) != 3 or not parts[0].isdigit():
            raise BenchError(f"bad SSD row {spec!r}: expected N:tree:cache, e.g. 3:chain:dual")
        out.append((int(parts[0]), parts[1], parts[2]))
    return out


def speed_figures(
    o: Sequence,
    ref: Sequence,
    gen_length: int,
    compile_s: float,
    drafted: bool,
    eos_ids: Sequence[int],
    flag_rule: Optional[dict] = None,
) -> dict[str, Any]:
    """The figures of one benchmark row (module docstring) from its per-prompt results ``o``
    and its reference's ``ref`` (same prompts, batch 1), the degeneracy figures on the text
    before the first of ``eos_ids``, and the answer-based figures against ``ref``
    (:func:`jaxspec.bench.answers.answer_figures`, :func:`~jaxspec.bench.answers.answer_speedups`;
    ``flag_rule`` overrides the flag's thresholds); shared with the ``spiffy`` suite."""
    a = [ans.diffusion_answer(r, eos_ids) for r in o]
    a_ref = [ans.diffusion_answer(r, eos_ids) for r in ref]
    nfe = [int(r.stats.target_nfe.sum()) for r in o]
    ref_nfe = [int(r.stats.target_nfe.sum()) for r in ref]
    st = [r.stats for r in o]
    prop = sum(int(s.drafts_proposed.sum()) for s in st)
    acc = sum(s.accepted_drafts for s in st)
    return {
        **ans.answer_figures(a, rule=flag_rule),
        **ans.answer_speedups(a, a_ref),
        "nfe": _num(statistics.fmean(nfe), 2),
        "step_reduction": _num(1 - sum(nfe) / sum(ref_nfe), 4),
        "nfe_speedup": _num(sum(ref_nfe) / sum(nfe), 3),
        "mat": _num(gen_length * len(o) / sum(nfe), 3),
        "acceptance_rate": _num(acc / prop, 4) if drafted and prop else None,
        "tokens_per_s": _num(statistics.median(gen_length / max(r.run_s, 1e-9) for r in o), 3),
        "speedup": _num(statistics.median(a.run_s / max(r.run_s, 1e-9) for a, r in zip(ref, o)), 3),
        "seconds_per_forward": _num(
            statistics.fmean(r.run_s / max(n, 1) for r, n in zip(o, nfe)), 4
        ),
        "forward_tokens_per_forward": _num(
            sum(int(s.extra.get("forward_tokens", 0)) for s in st) / sum(nfe), 1
        ),
        "identical_to_reference": all(
            np.array_equal(a.full_tokens, r.full_tokens) for a, r in zip(ref, o)
        ),
        "compile_s": _num(compile_s, 2),
        "accept_hist": np.sum([s.accept_hist.sum(0) for s in st], axis=0).tolist(),
        **answer_degeneracy([r.full_tokens[0] for r in o], eos_ids, gen_length),
    }


def _ssd_runs(model, params, rows, gen_length, block_length, remasking, eos, pad_id):
    """The interleaved runs (``("stepwise", cache)`` per cache policy, then ``("ssd", n, tree,
    cache)`` per row) and the SSD configs by row."""
    caches = list(dict.fromkeys(c for _, _, c in rows))
    refs = {
        c: DiffusionDecodeConfig(gen_length, block_length, gen_length, remasking=remasking, cache=c)
        for c in caches
    }
    ssds = {(n, t, c): SSDConfig(refs[c], n, t) for n, t, c in rows}
    runs: dict = {
        ("stepwise", c): (
            lambda ids, d=d: diffusion_generate(model, params, [ids], d, eos_ids=eos, pad_id=pad_id)
        )
        for c, d in refs.items()
    }
    runs.update(
        {
            ("ssd", *k): (
                lambda ids, s=s: ssd_generate(model, params, [ids], s, eos_ids=eos, pad_id=pad_id)
            )
            for k, s in ssds.items()
        }
    )
    return runs, ssds


def _summary_rows(outs, compile_s, ssds, meta: dict, gen_length, block_length, eos, flag_rule):
    """One row per run: method, draft length, tree, nodes, cache, ``meta`` (model, remasking,
    prompt set), prompts, gen and block length, then :func:`speed_figures` against the
    stepwise reference of the run's cache policy."""
    out_rows = []
    for key, o in outs.items():
        c = key[-1]
        is_ssd = key[0] == "ssd"
        out_rows.append(
            {
                "method": key[0],
                "draft_length": key[1] if is_ssd else None,
                "tree": key[2] if is_ssd else None,
                "nodes": ssds[key[1:]].num_nodes if is_ssd else 1,
                "cache": c,
                **meta,
                "prompts": len(o),
                "gen_length": gen_length,
                "block_length": block_length,
                **speed_figures(
                    o, outs[("stepwise", c)], gen_length, compile_s[key], is_ssd, eos, flag_rule
                ),
            }
        )
    return out_rows


def _acceptance_limits(
    model, params, prompts, d0, pad_id, draft_lengths, top_ks, log
) -> dict[str, Any]:
    """Sec. 5.1's acceptance-limit analysis: stepwise top-k records per prompt (one log line
    each), then the mean step reduction per draft length and top-k."""
    recs = []
    for p in prompts:
        log(f"[bench] acceptance-limit records: {p.task_id}")
        recs.append(stepwise_topk(model, params, p.ids, d0, top_k=max(top_ks), pad_id=pad_id))
    return {
        "top_ks": list(top_ks),
        "rows": [
            {
                "draft_length": n,
                "upper_bound": _num(n / (n + 1), 4),
                "step_reduction": [
                    _num(statistics.fmean(acceptance_limit(*r, n, k) for r in recs), 4)
                    for k in top_ks
                ],
            }
            for n in draft_lengths
        ],
    }


def per_prompt_records(prompts, outs: dict, eos, reference: str = "stepwise") -> list[dict]:
    """Per prompt (``task_id``, prompt tokens) and run (``outs`` key joined by ``/``): target
    NFE, seconds, the answer entry (:func:`jaxspec.bench.answers.diffusion_answer`) and
    whether its tokens equal those of the run ``(reference, <the key's last item>)``."""
    return [
        {
            "task_id": p.task_id,
            "prompt_tokens": len(p.ids),
            "runs": {
                "/".join(map(str, k)): {
                    "nfe": int(o[i].stats.target_nfe.sum()),
                    "seconds": _num(o[i].run_s, 4),
                    **ans.diffusion_answer(o[i], eos).entry(),
                    "identical_to_reference": bool(
                        np.array_equal(o[i].full_tokens, outs[(reference, k[-1])][i].full_tokens)
                    ),
                }
                for k, o in outs.items()
            },
        }
        for i, p in enumerate(prompts)
    ]


def run_ssd_suite(
    model,
    params,
    prompts: Sequence[BenchPrompt],
    *,
    model_name: str,
    gen_length: int = 256,
    block_length: int = 8,
    rows: Sequence[tuple[int, str, str]] = SSD_ROWS,
    remasking: str = "low_confidence",
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
    config: Optional[dict] = None,
    progress: bool = True,
    limit_analysis: bool = True,
    limit_draft_lengths=(3, 4, 5),
    limit_top_ks=(1, 2, 3, 4, 5),
    prompt_set: Optional[str] = None,
    flag_rule: Optional[dict] = None,
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Run the ``ssd`` suite (module docstring) and return the result document.

    Args:
      rows: ``(draft_length, tree, cache)`` per SSD row; the stepwise reference of every
        cache policy used is added.
      limit_analysis: also run Sec. 5.1's acceptance-limit analysis (no cache; costs one
        forward per generated position and prompt).
      prompt_set: the prompt set's name (``long`` / ``chat``), recorded in every row.
      flag_rule: overrides of :data:`jaxspec.eval.quality.ANSWER_FLAG_RULE`.

    Returns:
      ``{"suite": "ssd", "date", "machine", "config", "prompt_set", "answer_flag_rule",
      "rows", "acceptance_limits", "per_prompt"}``.

    Raises:
      BenchError: no prompts; ValueError: invalid settings (from the configs).
    """
    if not prompts:
        raise BenchError("no prompts to benchmark")
    eos = tuple(int(e) for e in eos_ids)
    runs, ssds = _ssd_runs(model, params, rows, gen_length, block_length, remasking, eos, pad_id)
    outs, compile_s = run_interleaved(runs, prompts, gen_length, progress, "ssd runs")
    meta = dict(model=model_name, remasking=remasking, prompt_set=prompt_set)
    out_rows = _summary_rows(outs, compile_s, ssds, meta, gen_length, block_length, eos, flag_rule)
    limits = None
    if limit_analysis:
        d0 = DiffusionDecodeConfig(gen_length, block_length, gen_length, remasking=remasking)
        limits = _acceptance_limits(
            model, params, prompts, d0, pad_id, limit_draft_lengths, limit_top_ks, log
        )
    per_prompt = per_prompt_records(prompts, outs, eos)
    return {
        "suite": "ssd",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "config": dict(config or {}),
        "prompt_set": prompt_set,
        "answer_flag_rule": dict(flag_rule or {}),
        "rows": out_rows,
        "acceptance_limits": limits,
        "per_prompt": per_prompt,
    }


_COLUMNS = [
    ("method", "method", "{}"),
    ("draft_length", "N", "{}"),
    ("tree", "tree", "{}"),
    ("nodes", "nodes", "{}"),
    ("cache", "cache", "{}"),
    ("prompt_set", "set", "{}"),
    *ans.ANSWER_LEAD,
    ("answer_step_reduction", "answer Step↓", "{:.1%}"),
    ("answer_nfe_speedup", "answer NFE speedup", "{:.2f}x"),
    ("answer_speedup", "answer wall speedup", "{:.2f}x"),
    ans.FLAG_COLUMN,
    ("nfe", "NFE", "{:.1f}"),
    ("step_reduction", "Step↓", "{:.1%}"),
    ("nfe_speedup", "NFE speedup", "{:.2f}x"),
    ("tokens_per_s", "tok/s", "{:.2f}"),
    ("speedup", "wall speedup", "{:.2f}x"),
    ("seconds_per_forward", "s/forward", "{:.3f}"),
    ("acceptance_rate", "acceptance", "{:.3f}"),
    ("identical_to_reference", "identical", "{}"),
    *report.ANSWER_COLUMNS,
]


def markdown_report(result: dict) -> str:
    """Markdown page of an ``ssd`` result: SSD Table 1 style rows and the Table 2 analysis."""
    r0 = result["rows"][0]
    lines = [
        *report.report_header("Benchmark suite `ssd`", result),
        *ans.header_lines(result, ("method", "draft_length", "tree", "cache")),
        f"Model `{r0['model']}`, {r0['prompts']} prompts (batch 1, greedy), gen "
        f"length {r0['gen_length']}, block {r0['block_length']}, remasking "
        f"`{r0['remasking']}`. Reference of every row: one-token-per-step stepwise decoding "
        "with the same cache policy.",
        "",
        ans.markdown_table(result["rows"], _COLUMNS),
    ]
    lim = result.get("acceptance_limits")
    if lim:
        lines += [
            "",
            "Acceptance limits (SSD Sec. 5.1, Table 2): step reduction an ideal "
            "verifier could reach when a transferred token counts as accepted if it is "
            "among the draft's top-k at its position (no cache).",
            "",
            "| draft length | "
            + " | ".join(f"k = {k}" for k in lim["top_ks"])
            + " | upper bound |",
            "|---" * (len(lim["top_ks"]) + 2) + "|",
        ]
        for row in lim["rows"]:
            lines.append(
                f"| {row['draft_length']} | "
                + " | ".join(f"{v:.1%}" for v in row["step_reduction"])
                + f" | {row['upper_bound']:.1%} |"
            )
    lines += [
        "",
        "How to read this:",
        "",
        ans.ANSWER_ACCOUNTING_NOTE,
        "- `answer Step↓` = 1 - answer NFE / the reference's answer NFE (SSD Table 1's "
        "Step↓ on the answer); `answer NFE speedup` its inverse ratio; `answer wall "
        "speedup` the median per-prompt ratio of answer seconds.",
        "- `Step↓` = 1 - NFE / reference NFE over all generated positions; `NFE speedup` "
        "its inverse ratio. An SSD forward verifies `nodes` sequences in one batch, so on a "
        "compute-bound CPU its cost (`s/forward`) grows with the node count and the "
        "wall-clock speedup falls short of the NFE speedup.",
        "- `identical` says whether every prompt's output equals the reference's token for "
        "token (SSD is lossless by construction).",
        report.ANSWER_NOTE,
    ]
    return "\n".join(lines) + "\n"


def speedup_bars(
    rows: Sequence[dict], labels: Sequence[str], ylabel: str, title: str, out: Path
) -> Path:
    """Bars per row (shared by the ssd/spiffy charts): the answer NFE speedup, the answer
    wall-clock speedup and, lighter, the NFE speedup over all positions; a flagged row's
    label gets the flag."""
    from jaxspec.core.plotting import pyplot

    plt = pyplot()

    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(rows)), 3.8))
    val = lambda r, k: r.get(k) or 0.0  # noqa: E731 - None (not measured) plots as 0
    ax.bar(x - 0.27, [val(r, "answer_nfe_speedup") for r in rows], 0.27, label="answer NFE speedup")
    ax.bar(
        x,
        [val(r, "answer_speedup") for r in rows],
        0.27,
        label="answer wall-clock speedup (this machine)",
    )
    ax.bar(
        x + 0.27,
        [val(r, "nfe_speedup") for r in rows],
        0.27,
        alpha=0.4,
        label="NFE speedup, all positions (EOS padding included)",
    )
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(
        x,
        [
            lab + (f"\n[{r['answer_flag']}]" if r.get("answer_flag") else "")
            for lab, r in zip(labels, rows)
        ],
        fontsize=8,
    )
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.set_title(title)
    return save_figure(fig, out)


def plot_rows(result: dict, out: Path) -> Path:
    """Bars: step reduction and wall-clock speedup per SSD row."""
    rows = [r for r in result["rows"] if r["method"] == "ssd"]
    return speedup_bars(
        rows,
        [f"N={r['draft_length']}\n{r['tree']}\n{r['cache']}" for r in rows],
        "x over stepwise (same cache)",
        f"ssd: {rows[0]['model'] if rows else ''}, gen {result['rows'][0]['gen_length']}",
        out,
    )


def write_results(result: dict, out: Path) -> tuple[Path, Path]:
    """Write the JSON, the markdown report (``.md``) and the chart (``.png``)."""
    return report.write_results(
        result,
        out,
        report=markdown_report,
        plot=plot_rows,
        caption="answer NFE and wall-clock speedup",
    )
