"""Benchmark suite ``space``: SPACE auto-correct decoding on a SAR-SFT model (Sec. 4
of SPACE, arXiv:2402.11809).

Three parts, all greedy, in one process (wall-clock ratios are comparable within one run only):

1. **Prompt sets** (:data:`PROMPT_SETS`): HumanEval completion (raw stubs) and chat, MT-Bench
   first turns (chat) and news summarization ("Summarize:" over Lee-corpus documents, the
   paper's XSum stand-in). Per set, batch 1, interleaved prompt by prompt
   (:func:`jaxspec.bench.ar_suite.run_ar_suite`): ``jaxspec/ar`` on the SAR model (baseline and
   reference), ``jaxspec/space`` (k mask groups), ``jaxspec/ngram`` on the SAR model, and
   ``jaxspec/ar-base``, AR on the base model the SAR delta was trained from.
2. **k ablation** (Fig. 5): SPACE with k = 1..8 against AR on one prompt set.
3. **Batch sizes** (Table 3): AR and SPACE on batches of 1/2/4/8/16 prompts, tokens/s per
   request and in all.

**MAT** (mean accepted tokens, the paper's "average accepted tokens", Sec. 4.1) = generated
tokens / target forward passes, the prefill counted as one forward and the bonus or
correction token of each step counted: AR has MAT = 1 (``results/*.json``: ``mat``).
Every row carries the degeneracy figures of its outputs, and the report quotes the SAR model's
quality figures (held-out AR loss, HumanEval pass@1 vs the base model) when given.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from jaxspec.bench.ar_suite import free_programs, run_ar_suite
from jaxspec.bench.machine import machine_info
from jaxspec.bench.prompts import PROMPT_SETS, suite_prompts
from jaxspec.bench.records import BenchError, BenchPrompt, _num
from jaxspec.bench.report import (
    MAT_DEFINITION,
    markdown_table,
    plot_k_sweep,
    report_header,
    save_figure,
)
from jaxspec.bench.systems import JaxspecSystem
from jaxspec.eval.metrics import mean_degeneracy
from jaxspec.methods import get_method

K_SWEEP = (1, 2, 3, 4, 5, 6, 7, 8)
BATCH_SIZES = (1, 2, 4, 8, 16)


def _median_tps(rows: list[dict], method: str) -> Optional[float]:
    r = next((r for r in rows if r["method"] == method), None)
    return None if r is None else r["median_tokens_per_s"]


def run_sets(
    sar,
    base_params,
    prompt_sets: dict,
    *,
    k: int,
    common: dict,
    progress: bool,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Part 1: per prompt set, the ``run_ar_suite`` rows of AR / SPACE / n-gram on the SAR
    model and AR on the base model, plus ``speedup_vs_base_ar`` on the SPACE row (median
    tokens/s ratio against ``jaxspec/ar-base`` of the same run)."""
    model, params = sar
    out = {}
    for name, prompts in prompt_sets.items():
        log(f"[space] prompt set {name}: {len(prompts)} prompts")
        systems = [
            JaxspecSystem("ar", model, params, **common),
            JaxspecSystem("space", model, params, **common, options={"mask_groups": k}),
            JaxspecSystem("ngram", model, params, **common),
            JaxspecSystem("ar", model, base_params, **common, label="ar-base"),
        ]
        res = run_ar_suite(systems, prompts, model_name="sar", progress=progress, log=log)
        base = _median_tps(res["rows"], "ar-base")
        for r in res["rows"]:
            r["prompt_set"] = name
            if r["method"] != "ar-base" and base:
                r["speedup_vs_base_ar"] = _num(r["median_tokens_per_s"] / base, 3)
        out[name] = {"rows": res["rows"], "per_prompt": res["per_prompt"]}
        del systems, res
        free_programs(lambda m: log(f"[space] {m}"))
    return out


def run_k_sweep(
    sar,
    prompts: Sequence[BenchPrompt],
    *,
    ks: Sequence[int],
    common: dict,
    progress: bool,
    log: Callable[[str], None],
) -> list[dict]:
    """Part 2 (Fig. 5): AR and SPACE with each ``k`` on the same prompts, interleaved."""
    model, params = sar
    systems = [JaxspecSystem("ar", model, params, **common)] + [
        JaxspecSystem(
            "space", model, params, **common, options={"mask_groups": int(k)}, label=f"space-k{k}"
        )
        for k in ks
    ]
    res = run_ar_suite(systems, prompts, model_name="sar", progress=progress, log=log)
    for r in res["rows"]:
        r["k"] = 0 if r["method"] == "ar" else int(r["method"].split("-k")[1])
    return res["rows"]


def run_batches(
    sar,
    prompts: Sequence[BenchPrompt],
    *,
    k: int,
    sizes: Sequence[int],
    max_new_tokens: int,
    eos_ids,
    pad_id: int,
    log: Callable[[str], None],
) -> list[dict]:
    """Part 3 (Table 3): for each batch size ``B`` the first ``B`` prompts (cycled when there
    are fewer) decoded as one batch by AR and by SPACE after an untimed warm-up each.
    ``tokens_per_s`` counts all rows' tokens over the call's wall clock; ``per_request`` is
    that divided by ``B``."""
    model, params = sar
    rows = []
    for B in sizes:
        batch = [list(prompts[i % len(prompts)].ids) for i in range(B)]
        for method in ("ar", "space"):
            m = get_method(method, "causal")
            cfg = m.configure(max_new_tokens=max_new_tokens, mask_groups=k, strict=False)
            kw = dict(eos_ids=tuple(eos_ids), pad_id=pad_id)
            m.run(model, params, batch, cfg, **kw)  # warm-up: compiles this batch shape
            t0 = time.perf_counter()
            res = m.run(model, params, batch, cfg, **kw)
            wall = time.perf_counter() - t0 - res.compile_s
            toks = sum(len(t) for t in res.tokens)
            rows.append(
                {
                    "batch": B,
                    "method": method,
                    "new_tokens": toks,
                    "seconds": _num(wall, 4),
                    "tokens_per_s": _num(toks / wall, 3),
                    "tokens_per_s_per_request": _num(toks / wall / B, 3),
                    "mat": _num(res.stats.mat, 4),
                    **mean_degeneracy(res.tokens),
                }
            )
            log(f"[space] batch {B} {method}: {toks / wall:.1f} tok/s")
        ar, sp = rows[-2], rows[-1]
        sp["speedup_vs_ar"] = _num(sp["tokens_per_s"] / ar["tokens_per_s"], 3)
    return rows


def run_space_suite(
    sar,
    base_params,
    tok,
    *,
    sets: Sequence[str] = PROMPT_SETS,
    limit: int = 5,
    k: int = 5,
    ks: Sequence[int] = K_SWEEP,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    max_new_tokens: int = 128,
    model_name: str = "smollm2-135m-space",
    quality: Optional[dict] = None,
    config: Optional[dict] = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda m: None,
) -> dict:
    """The whole suite (module docstring).

    Args:
      sar: ``(CausalLM with mask_token_id, params)`` of the SAR-SFT model.
      base_params: the base model's params (same architecture), for ``jaxspec/ar-base``.
      tok: the tokenizer (chat template, EOS).
      sets, limit: prompt sets and prompts per set; ``k``: SPACE's mask groups.
      ks: the k ablation (empty: skipped); batch_sizes: Table 3's sizes (empty: skipped).
      quality: the SAR model's quality figures (recorded and quoted in the report).

    Returns:
      ``{"suite": "space", "date", "machine", "config", "quality", "sets", "k_sweep",
      "batch"}``.

    Raises:
      BenchError: no prompts, or a model without a [MASK] token.
    """
    if sar[0].config.mask_token_id is None:
        raise BenchError("suite space needs a SAR-SFT model (e.g. --model smollm2-135m-space)")
    eos = tuple(tok.eos_token_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    common = dict(max_new_tokens=max_new_tokens, eos_ids=eos, pad_id=pad)
    prompt_sets = suite_prompts(tok, sets, limit)
    first = next(iter(prompt_sets.values()))
    result: dict[str, Any] = {
        "suite": "space",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "model": model_name,
        "config": dict(
            config or {},
            k=k,
            limit=limit,
            max_new_tokens=max_new_tokens,
            sets=list(sets),
            k_sweep=list(ks),
            batch_sizes=list(batch_sizes),
            temperature=0.0,
        ),
        "quality": quality or {},
    }
    result["sets"] = run_sets(
        sar, base_params, prompt_sets, k=k, common=common, progress=progress, log=log
    )
    result["k_sweep"] = (
        run_k_sweep(sar, first, ks=ks, common=common, progress=progress, log=log) if ks else []
    )
    result["batch"] = (
        run_batches(
            sar,
            first,
            k=k,
            sizes=batch_sizes,
            max_new_tokens=max_new_tokens,
            eos_ids=eos,
            pad_id=pad,
            log=log,
        )
        if batch_sizes
        else []
    )
    return result


_SET_COLUMNS = [
    ("prompt_set", "set", "{}"),
    ("method", "method", "{}"),
    ("prompts", "prompts", "{}"),
    ("new_tokens", "tokens", "{}"),
    ("median_tokens_per_s", "median tok/s", "{:.1f}"),
    ("speedup_vs_baseline", "speedup vs SAR AR", "{:.2f}x"),
    ("speedup_vs_base_ar", "vs base AR", "{:.2f}x"),
    ("mat", "MAT", "{:.2f}"),
    ("acceptance_rate", "acceptance", "{:.3f}"),
    ("identical_to_reference", "identical", "{}"),
    ("distinct_token_share", "distinct", "{:.2f}"),
    ("repeated_ngram_rate", "rep. 4-gram", "{:.2f}"),
]
_K_COLUMNS = [
    ("k", "k", "{}"),
    ("median_tokens_per_s", "median tok/s", "{:.1f}"),
    ("speedup_vs_baseline", "speedup", "{:.2f}x"),
    ("mat", "MAT", "{:.2f}"),
    ("acceptance_rate", "acceptance", "{:.3f}"),
    ("identical_to_reference", "identical", "{}"),
]
_B_COLUMNS = [
    ("batch", "batch", "{}"),
    ("method", "method", "{}"),
    ("tokens_per_s", "tok/s (all)", "{:.1f}"),
    ("tokens_per_s_per_request", "tok/s per request", "{:.1f}"),
    ("speedup_vs_ar", "speedup", "{:.2f}x"),
    ("mat", "MAT", "{:.2f}"),
    ("distinct_token_share", "distinct", "{:.2f}"),
]


def markdown_report(result: dict) -> str:
    """The suite's markdown page: machine, quality figures, the three tables, how to read."""
    q = result.get("quality") or {}
    out = report_header(f"Benchmark suite `space` ({result['model']})", result)
    if q:
        out += ["SAR model quality: " + ", ".join(f"`{k}={v}`" for k, v in q.items()), ""]
    rows = [r for s in result["sets"].values() for r in s["rows"]]
    out += [
        "## Prompt sets (batch 1, greedy)",
        "",
        markdown_table({"rows": rows}, _SET_COLUMNS),
        "",
    ]
    if result["k_sweep"]:
        out += [
            "## k ablation (Fig. 5), first prompt set",
            "",
            markdown_table({"rows": result["k_sweep"]}, _K_COLUMNS),
            "",
        ]
    if result["batch"]:
        out += [
            "## Batch sizes (Table 3)",
            "",
            markdown_table({"rows": result["batch"]}, _B_COLUMNS),
            "",
        ]
    out += [
        "How to read this:",
        "",
        f"- {MAT_DEFINITION} Paper anchors (LLaMA-2-7B, A800): MAT 3.54 / 3.18x on "
        "HumanEval, 2.23 / 1.92x on XSum.",
        "- `speedup vs SAR AR`: median per-prompt wall-clock ratio against AR on the same "
        "SAR model; `vs base AR`: median tokens/s against AR on the base model (what a "
        "user switching to the SAR model and SPACE gets).",
        "- A SPACE forward carries (k+1)^2 query rows instead of 1: on a CPU that is not "
        "free, so MAT overstates the wall-clock gain there.",
        "- `distinct` / `rep. 4-gram` are degeneracy figures of the outputs; "
        "`identical` compares with AR greedy decoding of the SAR model (lossless).",
        "",
    ]
    return "\n".join(out) + "\n"


def plot(result: dict, out: Path) -> Path:
    """MAT and speedup against k (left) and tokens/s against batch size (right)."""
    from jaxspec.core.plotting import pyplot

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    ks = [r for r in result["k_sweep"] if r["k"] > 0]
    if ks:
        plot_k_sweep(a, ks, "k (mask tokens per group)", "k ablation")
    for method in ("ar", "space"):
        rs = [r for r in result["batch"] if r["method"] == method]
        if rs:
            b.plot([r["batch"] for r in rs], [r["tokens_per_s"] for r in rs], "o-", label=method)
    b.set_xscale("log", base=2)
    b.set_xlabel("batch size")
    b.set_ylabel("tokens / s (all requests)")
    b.legend()
    b.set_title("batch sizes")
    return save_figure(fig, out, f"SPACE on {result['model']} ({result['machine'].get('cpu')})")


def write_results(result: dict, out: Path) -> tuple[Path, Path]:
    """JSON, markdown and chart (:func:`jaxspec.bench.report.write_results` with this suite's
    report and plot)."""
    from jaxspec.bench.report import write_results as write

    return write(
        result, out, report=markdown_report, plot=plot, caption="k ablation and batch sizes"
    )
