"""Benchmark suite ``spiffy``: Spiffy against the decoders it accelerates.

Every row names a draft graph size ``D`` and an unmasking rule (the paper's ``S_t``):
``stepwise`` (one token per step), ``fixed-K`` (K tokens per step, Table 2 "hard-code") or
``threshold-T`` (Fast-dLLM threshold T, Table 2 "threshold"). Its reference is the decoder with
the same rule and cache policy (:func:`jaxspec.dllm.decode.diffusion_generate`), run in the same
interleaved loop (:func:`jaxspec.bench.dllm.run_interleaved`, batch 1, greedy). The graphs are
the calibrated ones (``configs/graphs/<model>/D<D>.json``, made by ``scripts.calibrate`` on
HumanEval problems disjoint from the benchmark's).

Figures per row (:func:`jaxspec.bench.ssd.speed_figures`): ``nfe``, ``nfe_speedup`` (reference
NFE / NFE, Spiffy Eq. 14), ``step_reduction``, ``tokens_per_s`` and wall-clock ``speedup``
(medians), ``seconds_per_forward`` and ``forward_tokens_per_forward`` (a forward verifies
``D + 1`` blocks, so its CPU cost grows with ``D``: Spiffy Appendix B, Fig. 5),
``identical_to_reference``, acceptance rate (accepted draft blocks / draft blocks verified) and
the degeneracy of the outputs. ``parallel_speedup`` is the reference rule's own NFE speedup
over one-token-per-step stepwise decoding and ``total_speedup`` the product (Table 2 columns).

The answer-based figures (:mod:`jaxspec.bench.answers`) come first in the report:
``answer_nfe`` (forwards until each output's answer, up to and including its first EOS, was
committed, from Spiffy's ``steps_by_nfe`` record), ``answer_nfe_speedup`` against the same
rule's reference, ``answer_parallel_speedup`` (the reference rule's answer NFE speedup over
stepwise) and ``answer_total_speedup`` (their product), ``answer_tokens_per_s`` and the
wall-clock ``answer_speedup``; ``answer_flag`` marks rows whose answers are mostly EOS or
loop, ``prompt_set`` names the prompt set.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any, Optional, Sequence

from jaxspec.bench import answers as ans
from jaxspec.bench import report
from jaxspec.bench.dllm import method_config, run_interleaved
from jaxspec.bench.machine import machine_info
from jaxspec.bench.records import BenchError, BenchPrompt, _num
from jaxspec.bench.ssd import per_prompt_records, speed_figures, speedup_bars
from jaxspec.dllm import (
    DiffusionDecodeConfig,
    DraftGraph,
    SpiffyConfig,
    diffusion_generate,
    load_graph,
    spiffy_generate,
)

# (D, unmasking rule) rows of the default suite: Table 1's D sweep at one token per step and
# Table 2's D = 10 combined with fixed-2 and threshold-0.9 parallel decoding.
SPIFFY_ROWS = (
    (3, "stepwise"),
    (5, "stepwise"),
    (8, "stepwise"),
    (10, "stepwise"),
    (10, "fixed-2"),
    (10, "threshold-0.9"),
)


def parse_rows(specs: Optional[Sequence[str]]) -> list[tuple[int, str]]:
    """``"D:rule"`` strings (``"10:threshold-0.9"``, ``"3:stepwise"``, ``"10:fixed-2"``) ->
    row tuples (default :data:`SPIFFY_ROWS`). Raises BenchError on a malformed spec."""
    if not specs:
        return list(SPIFFY_ROWS)
    out = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) != 2 or not parts[0].isdigit():
            raise BenchError(f"bad Spiffy row {spec!r}: expected D:rule, e.g. 10:threshold-0.9")
        rule_config(parts[1], 8, 8, "low_confidence", "dual")
        out.append((int(parts[0]), parts[1]))
    return out


def rule_config(
    rule: str, gen_length: int, block_length: int, remasking: str, cache: str
) -> DiffusionDecodeConfig:
    """The reference decoder of an unmasking rule name (the ``dllm`` suite's row names).
    Raises BenchError on an unknown rule."""
    return method_config(
        rule, gen_length=gen_length, block_length=block_length, cache=cache, remasking=remasking
    )


def _check_inputs(prompts, rows, graphs: dict) -> None:
    """Raise :class:`BenchError` without prompts or for a row whose graph is missing."""
    if not prompts:
        raise BenchError("no prompts to benchmark")
    missing = sorted({D for D, _ in rows} - set(graphs))
    if missing:
        raise BenchError(f"no draft graph for D = {missing}")


def _spiffy_runs(model, params, rows, graphs, refs: dict, eos, pad_id) -> dict:
    """The interleaved runs: ``("reference", rule)`` per rule of ``refs``, then ``("spiffy", D,
    rule)`` per row (:class:`SpiffyConfig` over that rule's reference and graph ``D``)."""
    cfgs = {(D, r): SpiffyConfig(refs[r], graphs[D]) for D, r in rows}
    runs: dict = {
        ("reference", r): (
            lambda ids, d=d: diffusion_generate(model, params, [ids], d, eos_ids=eos, pad_id=pad_id)
        )
        for r, d in refs.items()
    }
    runs.update(
        {
            ("spiffy", D, r): (
                lambda ids, c=c: spiffy_generate(
                    model, params, [ids], c, eos_ids=eos, pad_id=pad_id
                )
            )
            for (D, r), c in cfgs.items()
        }
    )
    return runs


def _summary_rows(outs, compile_s, meta: dict, gen_length, block_length, eos, flag_rule):
    """One row per run: method, graph ``D``, unmasking rule, nodes, ``meta`` (cache, model,
    remasking, prompt set), prompts, gen and block length, :func:`speed_figures` against the
    rule's reference, then the parallel and total speedups over the stepwise reference (in
    NFE, answer and whole)."""
    base_nfe = sum(int(r.stats.target_nfe.sum()) for r in outs[("reference", "stepwise")])
    answer_nfe = {
        k: sum(ans.diffusion_answer(r, eos).nfe for r in o)
        for k, o in outs.items()
        if k[0] == "reference"
    }
    out_rows = []
    for key, o in outs.items():
        rule = key[-1]
        is_sp = key[0] == "spiffy"
        fig = speed_figures(
            o, outs[("reference", rule)], gen_length, compile_s[key], is_sp, eos, flag_rule
        )
        ref_nfe = sum(int(r.stats.target_nfe.sum()) for r in outs[("reference", rule)])
        par = base_nfe / ref_nfe
        a_par = answer_nfe[("reference", "stepwise")] / max(answer_nfe[("reference", rule)], 1)
        out_rows.append(
            {
                "method": key[0],
                "graph_D": key[1] if is_sp else 0,
                "unmasking": rule,
                "nodes": key[1] + 1 if is_sp else 1,
                **meta,
                "prompts": len(o),
                "gen_length": gen_length,
                "block_length": block_length,
                **fig,
                "answer_parallel_speedup": _num(a_par, 3),
                "answer_total_speedup": _num(a_par * fig["answer_nfe_speedup"], 3),
                "parallel_speedup": _num(par, 3),
                "total_speedup": _num(par * fig["nfe_speedup"], 3),
            }
        )
    return out_rows


def run_spiffy_suite(
    model,
    params,
    prompts: Sequence[BenchPrompt],
    *,
    model_name: str,
    graphs: dict[int, DraftGraph],
    gen_length: int = 256,
    block_length: int = 32,
    rows: Sequence[tuple[int, str]] = SPIFFY_ROWS,
    cache: str = "dual",
    remasking: str = "low_confidence",
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
    config: Optional[dict] = None,
    progress: bool = True,
    prompt_set: Optional[str] = None,
    flag_rule: Optional[dict] = None,
) -> dict[str, Any]:
    """Run the ``spiffy`` suite (module docstring) and return the result document.

    Args:
      graphs: ``D -> DraftGraph`` for every ``D`` in ``rows``.
      rows: ``(D, rule)`` per Spiffy row; the reference of every rule used is added, and the
        stepwise reference always (for ``parallel_speedup``).
      prompt_set: the prompt set's name (``long`` / ``chat``), recorded in every row.
      flag_rule: overrides of :data:`jaxspec.eval.quality.ANSWER_FLAG_RULE`.

    Returns: ``{"suite": "spiffy", "date", "machine", "config", "prompt_set",
    "answer_flag_rule", "rows", "graphs", "per_prompt"}``.

    Raises: BenchError: no prompts, a missing graph or an unknown rule.
    """
    _check_inputs(prompts, rows, graphs)
    eos = tuple(int(e) for e in eos_ids)
    rules = list(dict.fromkeys(["stepwise"] + [r for _, r in rows]))
    refs = {r: rule_config(r, gen_length, block_length, remasking, cache) for r in rules}
    runs = _spiffy_runs(model, params, rows, graphs, refs, eos, pad_id)
    outs, compile_s = run_interleaved(runs, prompts, gen_length, progress, "spiffy runs")
    meta = dict(cache=cache, model=model_name, remasking=remasking, prompt_set=prompt_set)
    out_rows = _summary_rows(outs, compile_s, meta, gen_length, block_length, eos, flag_rule)
    per_prompt = per_prompt_records(prompts, outs, eos, reference="reference")
    return {
        "suite": "spiffy",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "config": dict(config or {}),
        "prompt_set": prompt_set,
        "answer_flag_rule": dict(flag_rule or {}),
        "rows": out_rows,
        "graphs": {
            str(D): [[list(p) for p in f] for f in graphs[D].formulas]
            for D in sorted({D for D, _ in rows})
        },
        "per_prompt": per_prompt,
    }


def load_graphs(directory, sizes) -> dict[int, DraftGraph]:
    """``D -> graph`` from ``directory/D<D>.json``. Raises GraphError on a missing/bad file."""
    return {D: load_graph(Path(directory) / f"D{D}.json") for D in sorted(set(sizes))}


_COLUMNS = [
    ("method", "method", "{}"),
    ("unmasking", "unmasking", "{}"),
    ("graph_D", "D", "{}"),
    ("prompt_set", "set", "{}"),
    *ans.ANSWER_LEAD,
    ("answer_nfe_speedup", "answer NFE speedup", "{:.2f}x"),
    ("answer_parallel_speedup", "answer parallel", "{:.2f}x"),
    ("answer_total_speedup", "answer total", "{:.2f}x"),
    ("answer_speedup", "answer wall speedup", "{:.2f}x"),
    ans.FLAG_COLUMN,
    ("nfe", "NFE", "{:.1f}"),
    ("nfe_speedup", "NFE speedup", "{:.2f}x"),
    ("parallel_speedup", "parallel", "{:.2f}x"),
    ("total_speedup", "total", "{:.2f}x"),
    ("tokens_per_s", "tok/s", "{:.2f}"),
    ("speedup", "wall speedup", "{:.2f}x"),
    ("seconds_per_forward", "s/forward", "{:.3f}"),
    ("forward_tokens_per_forward", "tokens/forward", "{:.0f}"),
    ("acceptance_rate", "acceptance", "{:.3f}"),
    ("identical_to_reference", "identical", "{}"),
    *report.ANSWER_COLUMNS,
]


def markdown_report(result: dict) -> str:
    """Markdown page of a ``spiffy`` result (Spiffy Tables 1-2 style)."""
    r0 = result["rows"][0]
    lines = [
        *report.report_header("Benchmark suite `spiffy`", result),
        *ans.header_lines(result, ("method", "unmasking", "graph_D")),
        f"Model `{r0['model']}`, {r0['prompts']} prompts (batch 1, greedy), gen "
        f"length {r0['gen_length']}, block {r0['block_length']}, cache `{r0['cache']}`, "
        f"remasking `{r0['remasking']}`. Reference of every row: the decoder with the same "
        "unmasking rule and cache policy.",
        "",
        ans.markdown_table(result["rows"], _COLUMNS),
        "",
        "How to read this:",
        "",
        ans.ANSWER_ACCOUNTING_NOTE,
        "- `answer NFE speedup` = the reference's answer NFE / Spiffy's answer NFE; "
        "`answer parallel` = the rule's answer NFE speedup over one token per step; "
        "`answer total` their product; `answer wall speedup` the median per-prompt ratio "
        "of answer seconds.",
        "- `NFE speedup` = reference NFE / Spiffy NFE (Spiffy Eq. 14) against the same "
        "unmasking rule; `parallel` = that rule's NFE speedup over one token per step; "
        "`total` = their product (Table 2).",
        "- A Spiffy forward verifies `D + 1` blocks (`tokens/forward`); on a compute-bound "
        "CPU its cost (`s/forward`) grows with it, so the wall-clock speedup falls short of "
        "the NFE speedup (the paper's Fig. 5 shows the same growth on an A100).",
        "- `identical`: every prompt's output equals the reference's token for token.",
        report.ANSWER_NOTE,
    ]
    return "\n".join(lines) + "\n"


def plot_rows(result: dict, out: Path) -> Path:
    """Bars: NFE speedup and wall-clock speedup per Spiffy row."""
    rows = [r for r in result["rows"] if r["method"] == "spiffy"]
    return speedup_bars(
        rows,
        [f"D={r['graph_D']}\n{r['unmasking']}" for r in rows],
        "x over the same unmasking rule",
        f"spiffy: {rows[0]['model'] if rows else ''}, gen {result['rows'][0]['gen_length']}",
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
