"""Benchmark suite ``assd``: sequential decoding vs ASSD vs ASSD-ngram on an XLNet AS-ARM
(ASSD paper Table 1, Table 5 and Appendix E.7).

**Generation** (Table 1). Each evaluation sequence (``N`` model ids, e.g. held-out stdlib text)
gets a fixed random mask of ``round(mask_rate * N)`` positions (seeded per sequence; at least one
position stays visible and one is masked); every method infills it at ``temperature`` (sampling:
the methods must agree in distribution, not token by token), batch 1, one sequence at a time
with the methods' order rotating (:func:`jaxspec.bench.dllm.run_interleaved`). Per row:

* ``nfe`` (AS-ARM forwards per sequence, mean and standard error) and ``nfe_per_token``;
  ``draft_calls`` (n-gram drafter calls, the "auxiliary draft" column of Table 1);
* ``gen_ppl`` (Eq. 21: ``exp(-mean_i log q(x_i | x_<i))`` of the whole infilled sequence under the
  causal judge ``q``, SmolLM2-135M by default; :func:`jaxspec.eval.judge.smollm2_judge`), mean
  and standard error;
* ``entropy`` (Eq. 22: Shannon entropy in bits of the token frequencies of each sequence);
* degeneracy figures (:func:`jaxspec.eval.metrics.mean_degeneracy`: distinct-token share, repeated
  4-gram rate, longest run);
* ``seconds`` (median per sequence), ``speedup`` (median per-sequence wall-clock ratio to
  sequential), acceptance rate and tokens per iteration;
* ``ppl_p_value`` / ``entropy_p_value``: Welch's t-test (unequal variances) of the per-sequence
  values against sequential's; Theorem 2 predicts no significant difference. The test needs
  independent samples: every (row, sequence) pair samples with its own seed
  (:func:`row_seed`). Until 2026-11-25 a row used one seed for all its sequences, so every
  sequence of a row drew the same Gumbel noise per step (common random numbers across
  sequences): the row means were unbiased but shared one noise draw, and two runs of the same
  decoder differed "significantly" (the entropy question, ``results/assd-ppl-100``).

**k sweep** (Table 5): ASSD at every ``k`` of ``k_sweep`` on the same sequences: NFE per token,
speedup and the two p-values.

**Infilling** (Appendix E.7): HumanEval single-line tasks (:mod:`jaxspec.eval.tasks`, oracle span
length), sequential vs ASSD (``infill_temperature``, default greedy, so ASSD's completions are
identical to sequential's and only the cost differs): pass@1 in the sandbox, NFE, identical
fraction.

Everything works on an already-loaded model (any :func:`models.xlnet.modeling.load_xlnet`
checkpoint) so the tests run it end to end on a tiny random XLNet with a stand-in judge.
"""

from __future__ import annotations

import datetime
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from jaxspec.asarm.assd import assd_generate
from jaxspec.bench import report
from jaxspec.bench.dllm import run_interleaved
from jaxspec.bench.machine import machine_info
from jaxspec.bench.records import BenchError, BenchPrompt, _num
from jaxspec.bench.report import save_figure
from jaxspec.core.plotting import pyplot
from jaxspec.core.sampling import SamplingConfig
from jaxspec.eval.judge import smollm2_judge
from jaxspec.eval.metrics import mean_degeneracy, shannon_entropy
from jaxspec.eval.quality import heldout_snippets, random_mask
from jaxspec.eval.sandbox import SandboxUnavailable, pass_at_1, run_program
from jaxspec.eval.tasks import fill_text, line_template, single_line_tasks
from jaxspec.training.config import load_config
from models.llama.params import WeightFileError
from models.registry import REPO_ROOT, load_asarm

K_SWEEP = (2, 3, 4, 5, 6, 8)
MAIN_METHODS = ("assd", "assd-ngram", "assd-fused", "assd-fused-ngram")


def _mean_se(xs) -> tuple[Optional[float], Optional[float]]:
    xs = [float(x) for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return None, None
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
    return statistics.fmean(xs), se


def welch_p(a, b) -> Optional[float]:
    """Two-sided Welch t-test p-value (None when undefined: fewer than 2 values or no spread)."""
    from scipy import stats as sps

    a, b = np.asarray(a, float), np.asarray(b, float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]  # as _mean_se: one inf PPL must not give NaN
    if len(a) < 2 or len(b) < 2:
        return None
    if a.std() == 0 and b.std() == 0:  # no spread: equal means or certainly different
        return 1.0 if a.mean() == b.mean() else 0.0
    return float(sps.ttest_ind(a, b, equal_var=False).pvalue)


def _gen_row(
    label,
    method,
    k,
    outs,
    ref,
    judge_vals,
    to_ext,
    *,
    model_name,
    N_list,
    mask_rate,
    temperature,
    compile_s,
):
    st = [o.stats for o in outs]
    nfe = [int(s.target_nfe.sum()) for s in st]
    G = [int(s.new_tokens.sum()) for s in st]
    ext = [to_ext(o.sequences[0]) for o in outs]
    ppl, ppl_se = _mean_se(judge_vals) if judge_vals is not None else (None, None)
    ent_vals = [shannon_entropy(e) for e in ext]
    ent, ent_se = _mean_se(ent_vals)
    prop = sum(int(s.drafts_proposed.sum()) for s in st if s.drafts_proposed is not None)
    acc = sum(s.accepted_drafts for s in st if s.drafts_proposed is not None)
    nm, nse = _mean_se(nfe)
    row = {
        "method": method,
        "k": k,
        "label": label,
        "model": model_name,
        "sequences": len(outs),
        "seq_len": int(statistics.fmean(N_list)),
        "mask_rate": mask_rate,
        "temperature": temperature,
        "masked_tokens": int(statistics.fmean(G)),
        "nfe": _num(nm, 2),
        "nfe_se": _num(nse, 2),
        "nfe_per_token": _num(sum(nfe) / max(sum(G), 1), 4),
        "draft_calls": _num(statistics.fmean(int(s.draft_nfe.sum()) for s in st), 2),
        "gen_ppl": _num(ppl, 3),
        "gen_ppl_se": _num(ppl_se, 3),
        "entropy": _num(ent, 4),
        "entropy_se": _num(ent_se, 4),
        "acceptance_rate": _num(acc / prop, 4) if prop else None,
        "tokens_per_iteration": _num(sum(G) / max(sum(int(s.steps.sum()) for s in st), 1), 3),
        "query_tokens_per_call": st[0].extra.get("query_tokens_per_call"),
        "seconds": _num(statistics.median(o.run_s for o in outs), 4),
        "speedup": _num(
            statistics.median(r.run_s / max(o.run_s, 1e-9) for r, o in zip(ref, outs)), 3
        ),
        "compile_s": _num(compile_s, 2),
        "lossless": all(s.extra["lossless"] for s in st),
        **mean_degeneracy(ext),
        "_ent_vals": ent_vals,
        "_ppl_vals": judge_vals,
    }
    return row


def _add_p_values(all_rows: dict) -> None:
    """Welch p-values of each row's per-sequence PPL and entropy against sequential's."""
    base = all_rows[("sequential", None)]
    for r in all_rows.values():
        seq = r["method"] == "sequential"
        r["ppl_p_value"] = (
            None
            if seq or r["_ppl_vals"] is None
            else _num(welch_p(r["_ppl_vals"], base["_ppl_vals"]), 4)
        )
        r["entropy_p_value"] = None if seq else _num(welch_p(r["_ent_vals"], base["_ent_vals"]), 4)


def _sweep_rows(all_rows: dict, k: int, k_sweep: Sequence[int]) -> list:
    """Table 5: ASSD at every ``k`` of the sweep (and the main ``k``); empty without a sweep."""
    if not k_sweep:
        return []
    out = []
    for kk in sorted(set(k_sweep) | {k}):
        r = all_rows[("assd", kk)]
        out.append(
            {
                "k": kk,
                "nfe_per_token": r["nfe_per_token"],
                "speedup": r["speedup"],
                "speedup_pct": _num(100 * (1 - 1 / r["speedup"]), 2) if r["speedup"] else None,
                "tokens_per_iteration": r["tokens_per_iteration"],
                "ppl_p_value": r["ppl_p_value"],
                "entropy_p_value": r["entropy_p_value"],
            }
        )
    return out


def _per_sequence(prompts, masks: dict, outs: dict, all_rows: dict, judged: dict) -> list:
    """Per evaluation sequence: its size and every run's NFE, seconds, entropy and PPL."""

    def run_figures(i, key):
        return {
            "nfe": int(outs[key][i].stats.target_nfe.sum()),
            "seconds": _num(outs[key][i].run_s, 4),
            "entropy": _num(all_rows[key]["_ent_vals"][i], 4),
            "gen_ppl": None if key not in judged else _num(judged[key][i], 3),
        }

    return [
        {
            "id": p.task_id,
            "tokens": len(p.ids),
            "masked": int(masks[p.task_id].sum()),
            "runs": {f"{m}/{kk}": run_figures(i, (m, kk)) for m, kk in outs},
        }
        for i, p in enumerate(prompts)
    ]


def _check_inputs(sequences, infill_tasks, tokenizer) -> None:
    """Raise :class:`BenchError` without sequences, or for infilling tasks without a
    tokenizer."""
    if not sequences:
        raise BenchError("no sequences to benchmark")
    if infill_tasks and tokenizer is None:
        raise BenchError("infilling rows need a tokenizer")


def _run_generation(model, params, prompts, masks, keys, gen: dict, progress: bool):
    """The generation rows (:func:`_generation_runs` with ``gen``) run interleaved prompt by
    prompt; returns ``(outputs, compile seconds)`` by ``(method, k)``."""
    runs = _generation_runs(model, params, prompts, masks, keys, **gen)
    return run_interleaved(runs, prompts, max(len(p.ids) for p in prompts), progress, "assd runs")


def _suite_result(config: Optional[dict], rows, sweep, infill, per_sequence) -> dict[str, Any]:
    """The result document: suite, date, machine, config, then the tables."""
    return {
        "suite": "assd",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "config": dict(config or {}),
        "rows": rows,
        "k_sweep": sweep,
        "infill": infill,
        "per_sequence": per_sequence,
    }


def run_assd_suite(
    model,
    params,
    sequences: Sequence[Sequence[int]],
    *,
    model_name: str,
    to_external: Optional[Callable[[Sequence[int]], list]] = None,
    judge: Optional[Callable[[Sequence[Sequence[int]]], list]] = None,
    mask_rate: float = 0.95,
    k: int = 5,
    k_sweep: Sequence[int] = K_SWEEP,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    mask_seed: Optional[int] = None,
    bucket: int = 64,
    infill_tasks: Sequence = (),
    tokenizer=None,
    to_model: Optional[Callable[[Sequence[int]], list]] = None,
    infill_temperature: float = 0.0,
    sandbox_timeout: float = 10.0,
    max_len: Optional[int] = None,
    suppress: Sequence[int] = (),
    cache: str = "none",
    methods: Sequence[str] = MAIN_METHODS,
    config: Optional[dict] = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Run the ``assd`` suite (module docstring) and return the result document.

    Args:
      model, params: an :class:`models.xlnet.modeling.XLNetLM` and its parameters.
      sequences: evaluation sequences of **model** ids (each >= 2 tokens).
      to_external: model ids -> judge/tokenizer ids (e.g. ``ASARM.to_external``; identity when
        None); UNK may map to a negative id (the judge handles it).
      judge: ``judge(list of tokenizer-id sequences) -> per-sequence generative perplexity``
        (:func:`jaxspec.eval.judge.smollm2_judge`); None leaves ``gen_ppl`` empty.
      mask_rate: share of each sequence to infill (the paper: 0.95).
      k: ASSD / ASSD-ngram draft length of the main rows (the paper: 5).
      k_sweep: ASSD draft lengths of the Table 5 sweep (empty: no sweep).
      suppress: model ids never generated, by every row alike (e.g. the UNK id).
      cache: ``"none"`` or ``"content"`` (the content-stream KV cache), for every row alike.
      methods: the main rows after sequential (default: ASSD, ASSD-ngram, fused ASSD and
        fused ASSD-ngram, all at ``k``).
      seed: the generation rows sample sequence ``i`` of row ``j`` with :func:`row_seed`
        ``(seed, j, i)`` (independent samples); the infilling rows use ``seed`` (the same draw
        for sequential and ASSD).
      mask_seed: seed of the evaluation masks (sequence ``i`` uses ``mask_seed * 100003 +
        i``); None: ``seed``. Fix it to compare runs of different ``seed`` on the same masks.
      max_len: the model's context for the infilling rows (a longer template is an error).
      temperature, top_k, top_p: the sampling configuration of every generation row.
      infill_tasks: :class:`jaxspec.eval.tasks.LineTask` items (empty: no infilling rows); needs
        ``tokenizer`` (``encode``/``decode`` of tokenizer ids) and ``to_model`` (tokenizer ids
        -> model ids; identity when None).
      infill_temperature: sampling temperature of the infilling rows (0 = greedy).

    Returns:
      ``{"suite": "assd", "date", "machine", "config", "rows", "k_sweep", "infill",
      "per_sequence"}``.

    Raises:
      BenchError: no sequences, a sequence shorter than 2 tokens, infilling tasks without a
      tokenizer; ValueError: invalid decoding settings (from
      :func:`jaxspec.asarm.assd.assd_generate`).
    """
    _check_inputs(sequences, infill_tasks, tokenizer)
    to_ext = to_external or (lambda ids: [int(i) for i in ids])
    to_mod = to_model or (lambda ids: [int(i) for i in ids])
    ms = seed if mask_seed is None else mask_seed
    prompts, masks = _masked_sequences(sequences, mask_rate, ms)
    main = [("sequential", None)] + [(m, k) for m in methods]
    keys = main + [("assd", kk) for kk in k_sweep if kk != k]
    sampling = SamplingConfig(temperature, top_k, top_p)
    gen = dict(sampling=sampling, seed=seed, bucket=bucket, suppress=suppress, cache=cache)
    outs, compile_s = _run_generation(model, params, prompts, masks, keys, gen, progress)
    judged = _judge_outputs(outs, judge, to_ext, log)
    labels = dict(model_name=model_name, mask_rate=mask_rate, temperature=temperature)
    rows, sweep, per_sequence = _generation_tables(
        prompts, masks, outs, compile_s, judged, to_ext, main=main, k=k, k_sweep=k_sweep, **labels
    )
    infill = None
    if infill_tasks:  # HumanEval single-line infilling (Appendix E.7)
        inputs = (model, params, infill_tasks, tokenizer, to_mod, to_ext)
        opts = dict(k=k, temperature=infill_temperature, seed=seed, bucket=bucket, log=log)
        infill = run_infill(*inputs, **opts, timeout=sandbox_timeout, max_len=max_len)
    return _suite_result(config, rows, sweep, infill, per_sequence)


def _masked_sequences(sequences, mask_rate: float, mask_seed: int) -> tuple[list, dict]:
    """``(prompts, masks)``: the evaluation sequences as :class:`BenchPrompt` items
    ``seq<i>`` and each one's fixed random mask (:func:`jaxspec.eval.quality.random_mask`,
    seeded ``mask_seed * 100003 + i``), keyed by ``task_id``."""
    seqs = [[int(t) for t in s] for s in sequences]
    masks = {
        f"seq{i}": random_mask(len(s), mask_rate, mask_seed * 100003 + i)
        for i, s in enumerate(seqs)
    }
    return [BenchPrompt(f"seq{i}", s) for i, s in enumerate(seqs)], masks


def _generation_tables(
    prompts,
    masks: dict,
    outs: dict,
    compile_s: dict,
    judged: dict,
    to_ext,
    *,
    main,
    k,
    k_sweep,
    model_name,
    mask_rate,
    temperature,
) -> tuple[list, list, list]:
    """``(rows, k sweep, per_sequence)`` of the generation runs: one :func:`_gen_row` per
    ``(method, k)`` with its Welch p-values against sequential; ``rows`` in ``main``'s order."""
    all_rows = {
        key: _gen_row(
            key[0] if key[1] is None else f"{key[0]} (k={key[1]})",
            key[0],
            key[1],
            o,
            outs[("sequential", None)],
            judged.get(key),
            to_ext,
            model_name=model_name,
            N_list=[len(p.ids) for p in prompts],
            mask_rate=mask_rate,
            temperature=temperature,
            compile_s=compile_s[key],
        )
        for key, o in outs.items()
    }
    _add_p_values(all_rows)
    sweep = _sweep_rows(all_rows, k, k_sweep)
    per_sequence = _per_sequence(prompts, masks, outs, all_rows, judged)
    for r in all_rows.values():
        r.pop("_ent_vals")
        r.pop("_ppl_vals")
    return [all_rows[key] for key in main], sweep, per_sequence


def _generation_runs(
    model, params, prompts, masks: dict, keys, *, sampling, seed, bucket, suppress, cache
) -> dict:
    """``{(method, k): run(ids)}`` of the generation rows for
    :func:`jaxspec.bench.dllm.run_interleaved`: each infills its sequence's mask
    (``masks[task_id]``) with :func:`jaxspec.asarm.assd.assd_generate`. Every (row, sequence)
    pair samples with its own seed (:func:`row_seed`): independent samples within and across
    rows, as the Welch tests against sequential assume."""
    mask_of = {id(p.ids): masks[p.task_id] for p in prompts}
    index_of = {id(p.ids): i for i, p in enumerate(prompts)}
    runs: dict = {}
    for j, (method, kk) in enumerate(keys):

        def run(ids, method=method, kk=kk, j=j):
            return assd_generate(
                model,
                params,
                [ids],
                [mask_of[id(ids)]],
                method=method,
                k=kk or 1,
                sampling=sampling,
                seed=row_seed(seed, j, index_of[id(ids)]),
                bucket=bucket,
                suppress=suppress,
                cache=cache,
            )

        runs[(method, kk)] = run
    return runs


def _judge_outputs(outs: dict, judge, to_ext, log) -> dict:
    """``{(method, k): per-sequence generative perplexity}`` of every row's infilled
    sequences under ``judge`` (empty without one)."""
    judged = {}
    if judge is not None:
        for key, o in outs.items():
            log(f"[bench] judging {key[0]} k={key[1]}")
            judged[key] = list(judge([to_ext(x.sequences[0]) for x in o]))
    return judged


def run_infill(
    model,
    params,
    tasks,
    tokenizer,
    to_model,
    to_external,
    *,
    k: int = 5,
    temperature: float = 0.0,
    seed: int = 0,
    bucket: int = 64,
    timeout: float = 10.0,
    max_len: Optional[int] = None,
    log: Callable[[str], None] = lambda m: None,
) -> dict:
    """HumanEval single-line infilling, sequential vs ASSD (module docstring).

    Returns ``{"tasks", "temperature", "k", "rows": [{method, pass_at_1, nfe, nfe_per_token,
    seconds, identical_fraction}], "per_task": [...]}``."""
    sampling = SamplingConfig(temperature)
    tpls = [line_template(t, tokenizer) for t in tasks]
    dec = lambda ids: tokenizer.decode([i for i in to_external(ids) if i >= 0])  # noqa: E731
    res: dict = {}
    for method in ("sequential", "assd"):
        outs = []
        for t, tpl in zip(tasks, tpls):
            r = assd_generate(
                model,
                params,
                [to_model(tpl.ids)],
                [tpl.masked],
                method=method,
                k=k,
                sampling=sampling,
                seed=seed,
                bucket=bucket,
                max_len=max_len,
            )
            fill = fill_text(tpl, r.sequences[0], dec)
            sb = run_program(t.program(fill), timeout=timeout)
            outs.append((r, fill, sb))
        log(f"[bench] infilling {method}: pass@1 {pass_at_1([o[2] for o in outs]):.3f}")
        res[method] = outs
    rows = []
    for method, outs in res.items():
        nfe = [int(o[0].stats.target_nfe.sum()) for o in outs]
        G = [int(o[0].stats.new_tokens.sum()) for o in outs]
        rows.append(
            {
                "method": method,
                "k": None if method == "sequential" else k,
                "tasks": len(outs),
                "pass_at_1": _num(pass_at_1([o[2] for o in outs]), 4),
                "nfe": _num(statistics.fmean(nfe), 2),
                "nfe_per_token": _num(sum(nfe) / max(sum(G), 1), 4),
                "seconds": _num(statistics.median(o[0].run_s for o in outs), 4),
                "identical_fraction": _num(
                    statistics.fmean(
                        float(np.array_equal(a[0].sequences[0], o[0].sequences[0]))
                        for a, o in zip(res["sequential"], outs)
                    ),
                    4,
                ),
            }
        )
    per_task = [
        {
            "task_id": t.task_id,
            "target": t.target,
            **{
                m: {
                    "fill": res[m][i][1],
                    "status": res[m][i][2].status,
                    "nfe": int(res[m][i][0].stats.target_nfe.sum()),
                }
                for m in res
            },
        }
        for i, t in enumerate(tasks)
    ]
    return {
        "tasks": len(tasks),
        "temperature": temperature,
        "k": k,
        "rows": rows,
        "per_task": per_task,
    }


_COLUMNS = [
    ("label", "method", "{}"),
    ("nfe", "NFE", "{:.1f}"),
    ("nfe_per_token", "NFE/token", "{:.3f}"),
    ("draft_calls", "draft calls", "{:.1f}"),
    ("gen_ppl", "gen PPL", "{:.2f}"),
    ("gen_ppl_se", "± se", "{:.2f}"),
    ("ppl_p_value", "PPL p", "{:.3f}"),
    ("entropy", "entropy", "{:.3f}"),
    ("entropy_se", "± se", "{:.3f}"),
    ("entropy_p_value", "entropy p", "{:.3f}"),
    ("seconds", "s/seq", "{:.3f}"),
    ("speedup", "wall speedup", "{:.2f}x"),
    ("acceptance_rate", "acceptance", "{:.3f}"),
    ("tokens_per_iteration", "tokens/iter", "{:.2f}"),
    ("query_tokens_per_call", "queries/call", "{}"),
    ("distinct_token_share", "distinct", "{:.2f}"),
    ("repeated_ngram_rate", "rep. 4-gram", "{:.2f}"),
]


def markdown_report(result: dict) -> str:
    """Markdown page of an ``assd`` result: Table 1 rows, the Table 5 k sweep, infilling."""
    r0 = result["rows"][0]
    lines = [
        *report.report_header("Benchmark suite `assd`", result),
        f"Model `{r0['model']}`, {r0['sequences']} sequences of ~{r0['seq_len']} tokens, "
        f"{r0['mask_rate']:.0%} masked (~{r0['masked_tokens']} tokens infilled per sequence), "
        f"temperature {r0['temperature']}, batch 1. Reference: sequential decoding (one "
        "AS-ARM forward per masked token). p-values: Welch's t-test against sequential.",
        "",
        report.markdown_table(result, _COLUMNS),
    ]
    if result.get("k_sweep"):
        lines += [
            "",
            "k sweep (Table 5): ASSD at each draft length on the same sequences.",
            "",
            "| k | NFE/token | tokens/iter | wall speedup | PPL p | entropy p |",
            "|---|---|---|---|---|---|",
        ]
        f = lambda v, fmt: "-" if v is None else fmt.format(v)  # noqa: E731
        for r in result["k_sweep"]:
            lines.append(
                f"| {r['k']} | {f(r['nfe_per_token'], '{:.3f}')} | "
                f"{f(r['tokens_per_iteration'], '{:.2f}')} | {f(r['speedup'], '{:.2f}x')} | "
                f"{f(r['ppl_p_value'], '{:.3f}')} | {f(r['entropy_p_value'], '{:.3f}')} |"
            )
    inf = result.get("infill")
    if inf:
        lines += [
            "",
            f"HumanEval single-line infilling ({inf['tasks']} tasks, oracle span length, "
            f"temperature {inf['temperature']}, pass@1 in the sandbox):",
            "",
            "| method | pass@1 | NFE | NFE/token | s/task | identical to sequential |",
            "|---|---|---|---|---|---|",
        ]
        for r in inf["rows"]:
            name = r["method"] if r["k"] is None else f"{r['method']} (k={r['k']})"
            lines.append(
                f"| {name} | "
                f"{r['pass_at_1']:.3f} | {r['nfe']:.1f} | {r['nfe_per_token']:.3f} | "
                f"{r['seconds']:.3f} | {r['identical_fraction']:.2f} |"
            )
    lines += [
        "",
        "How to read this:",
        "",
        "- `NFE` counts every AS-ARM forward (draft passes + density passes; Theorem 1 "
        "bounds it by the masked count). `draft calls`: n-gram drafter calls (no network).",
        "- ASSD is lossless: PPL and entropy should not differ significantly from "
        "sequential (large p-values); a small p-value on few sequences is noise or a bug.",
        "- `distinct`, `rep. 4-gram`: degeneracy; a collapsed model agrees with itself and "
        "inflates acceptance.",
    ]
    return "\n".join(lines) + "\n"


def plot_rows(result: dict, out: Path) -> Path:
    """Bars: NFE per token and wall-clock speedup of the main rows and the k sweep."""
    plt = pyplot()

    rows = result["rows"] + [
        dict(label=f"assd k={r['k']}", nfe_per_token=r["nfe_per_token"], speedup=r["speedup"])
        for r in result.get("k_sweep") or []
    ]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.0 * len(rows)), 3.8))
    ax.bar(x - 0.2, [r["nfe_per_token"] or 0 for r in rows], 0.4, label="NFE per token")
    ax.bar(x + 0.2, [r["speedup"] or 0 for r in rows], 0.4, label="wall-clock speedup")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x, [r["label"] for r in rows], fontsize=7, rotation=30)
    ax.legend(fontsize=8)
    ax.set_title(f"assd: {result['rows'][0]['model']}")
    return save_figure(fig, out)


def write_results(result: dict, out: Path) -> tuple[Path, Path]:
    """Write the JSON, the markdown report (``.md``) and the chart (``.png``)."""
    return report.write_results(
        result,
        out,
        report=markdown_report,
        plot=plot_rows,
        caption="NFE per token and wall-clock speedup",
    )


def row_seed(seed: int, row: int, sequence: int) -> int:
    """The sampling seed of ``row`` (a method of the table) on evaluation ``sequence`` of a
    run with ``seed``: ``numpy.random.SeedSequence([seed, row, sequence])``'s first 32-bit
    word, distinct for every triple in practice."""
    return int(np.random.SeedSequence([seed, row, sequence]).generate_state(1)[0])


# --------------------------------------------------------------------------- CLI
def add_arguments(ap) -> None:
    """The ``--assd-*`` options of ``python -m scripts.benchmark --suite assd``."""
    g = ap.add_argument_group("suite assd (XLNet AS-ARM: sequential vs ASSD vs ASSD-ngram)")
    g.add_argument("--assd-k", type=int, default=5, help="draft length k of the main rows (5)")
    g.add_argument(
        "--assd-k-sweep",
        type=int,
        nargs="*",
        default=list(K_SWEEP),
        help="k values of the Table 5 sweep (default 2 3 4 5 6 8; none: no sweep)",
    )
    g.add_argument(
        "--assd-seq-len", type=int, default=256, help="tokens per evaluation sequence (default 256)"
    )
    g.add_argument("--assd-mask-rate", type=float, default=0.95, help="share of tokens infilled")
    g.add_argument("--assd-temperature", type=float, default=1.0, help="sampling temperature")
    g.add_argument(
        "--assd-seed",
        type=int,
        default=0,
        help="sampling seed (each row and sequence samples with its own seed from it)",
    )
    g.add_argument(
        "--assd-mask-seed",
        type=int,
        default=None,
        help="seed of the evaluation masks (default: --assd-seed); fix it to compare "
        "runs of different --assd-seed on the same masks",
    )
    g.add_argument(
        "--assd-infill-tasks",
        type=int,
        default=20,
        help="HumanEval single-line infilling tasks (0: none)",
    )
    g.add_argument("--assd-infill-temperature", type=float, default=0.0)
    g.add_argument(
        "--assd-no-judge",
        action="store_true",
        help="skip generative perplexity (no SmolLM2-135M judge)",
    )
    g.add_argument(
        "--assd-methods",
        nargs="*",
        default=list(MAIN_METHODS),
        help=f"main rows after sequential ({' '.join(MAIN_METHODS)})",
    )
    g.add_argument(
        "--assd-cache",
        choices=("none", "content"),
        default="none",
        help="content-stream KV cache for every row (Appendix F.4)",
    )
    g.add_argument(
        "--assd-keep-unk",
        action="store_true",
        help="let every row sample the AS-ARM's UNK id (suppressed by default)",
    )


def fitting_tasks(tasks, tokenizer, max_len: int, limit: int) -> list:
    """The first ``limit`` single-line infilling tasks whose template (prompt + solution with the
    masked line) fits the model's context of ``max_len`` tokens, in task order."""
    out = []
    for t in tasks:
        if len(out) >= limit:
            break
        if len(line_template(t, tokenizer).ids) <= max_len:
            out.append(t)
    return out


DEFAULT_HOLDOUT = (
    "argparse",
    "configparser",
    "csv",
    "difflib",
    "fractions",
    "heapq",
    "json",
    "shlex",
    "statistics",
    "textwrap",
)


def main_assd(args, log) -> int:
    """``--suite assd``: held-out stdlib windows (the training config's ``data.holdout`` when
    ``configs/train/<meta name>.yaml`` exists) as evaluation sequences; ``--limit`` sequences
    (default 8), ``--model`` an AS-ARM name or weight file (default ``asarm-small``)."""
    try:
        name = args.model or (Path(args.weights).stem if args.weights else "asarm-small")
        limit = 8 if args.limit is None else args.limit
        if limit < 1:
            raise BenchError(f"--limit must be >= 1, got {limit}")
        if args.assd_k < 1 or any(k < 1 for k in args.assd_k_sweep):
            raise BenchError("--assd-k and --assd-k-sweep values must be >= 1")
        if args.assd_seq_len < 2:
            raise BenchError(f"--assd-seq-len must be >= 2, got {args.assd_seq_len}")
        asarm = load_asarm(args.weights or name, log=log)
        holdout = DEFAULT_HOLDOUT
        cfg_path = REPO_ROOT / "configs" / "train" / f"{asarm.meta.get('name', name)}.yaml"
        if cfg_path.is_file():
            holdout = tuple(load_config(cfg_path).data.holdout) or DEFAULT_HOLDOUT
        snips = heldout_snippets(
            asarm.tokenizer, holdout, limit, prompt_len=args.assd_seq_len - 1, cont_len=1
        )
        seqs = [asarm.to_model(s.tokens) for s in snips]
        bad = sorted(set(args.assd_methods) - set(MAIN_METHODS))
        if bad:
            raise BenchError(f"unknown --assd-methods {bad}; expected some of {MAIN_METHODS}")
        unk = getattr(asarm.vocab, "unk", None)
        suppress = () if args.assd_keep_unk or unk is None else (int(unk),)
        judge = None if args.assd_no_judge else smollm2_judge(log)
        tasks = (
            fitting_tasks(
                single_line_tasks(), asarm.tokenizer, asarm.max_len, args.assd_infill_tasks
            )
            if args.assd_infill_tasks
            else []
        )
        config = {
            "model": name,
            "weights": asarm.path,
            "limit": limit,
            "seq_len": args.assd_seq_len,
            "mask_rate": args.assd_mask_rate,
            "k": args.assd_k,
            "k_sweep": list(args.assd_k_sweep),
            "temperature": args.assd_temperature,
            "seed": args.assd_seed,
            "holdout": list(holdout),
            "judge": None if judge is None else "smollm2-135m-instruct",
            "infill_tasks": len(tasks),
            "infill_temperature": args.assd_infill_temperature,
            "mask_seed": (args.assd_seed if args.assd_mask_seed is None else args.assd_mask_seed),
            "context": asarm.max_len,
            "row_seeds": "SeedSequence([seed, row index, sequence index])",
            "batch": 1,
            "suppressed_ids": list(suppress),
            "methods": list(args.assd_methods),
            "cache": args.assd_cache,
        }
        result = run_assd_suite(
            asarm.model,
            asarm.params,
            seqs,
            model_name=name,
            to_external=asarm.to_external,
            judge=judge,
            mask_rate=args.assd_mask_rate,
            k=args.assd_k,
            k_sweep=args.assd_k_sweep,
            temperature=args.assd_temperature,
            seed=args.assd_seed,
            mask_seed=args.assd_mask_seed,
            infill_tasks=tasks,
            tokenizer=asarm.tokenizer,
            to_model=asarm.to_model,
            infill_temperature=args.assd_infill_temperature,
            config=config,
            max_len=asarm.max_len,
            suppress=suppress,
            cache=args.assd_cache,
            methods=args.assd_methods,
            progress=not args.no_progress,
            log=log,
        )
    except (BenchError, WeightFileError, ValueError, SandboxUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out or "results/assd.json")
    js, md = write_results(result, out)
    print(markdown_report(result))
    log(f"[bench] wrote {js} and {md}")
    return 0
