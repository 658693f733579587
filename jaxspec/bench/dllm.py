"""Benchmark suite ``dllm``: masked-diffusion decoding on one model, every unmasking method
under every Fast-dLLM cache policy.

Rows are ``(method, cache)`` pairs: ``method`` in ``stepwise`` (one token per step,
``steps = gen_length``), ``fixed-K`` (K tokens per step) and ``threshold-T`` (Fast-dLLM
confidence threshold), ``cache`` in ``none`` / ``prefix`` / ``dual``
(:class:`jaxspec.dllm.decode.DiffusionDecodeConfig`). Every prompt runs alone (batch 1); for each
prompt every row's configuration runs in turn, the order rotating from prompt to prompt, so
slow drift of the machine hits all rows alike. The first call of each configuration compiles
it (``compile_s``, excluded from the timing: :func:`jaxspec.core.runtime.run_compiled`).

Figures per row:

* ``nfe`` (model forwards per prompt, mean), ``steps``, ``forward_tokens`` (query tokens
  pushed through the model per prompt, mean: what a cache saves);
* ``tokens_per_s``: median over prompts of ``gen_length`` decoded positions / wall-clock
  seconds (a diffusion decoder always fills every position; ``new_tokens`` counts those kept
  after the first EOS);
* ``speedup_vs_stepwise``: median per-prompt wall-clock ratio against the ``stepwise`` row of
  the same cache policy; ``speedup_vs_reference``: against ``stepwise`` with no cache;
* ``identical_fraction``: share of prompts whose decoded positions equal the ``stepwise``
  row's with the same cache policy (caches are approximate, so each policy is its own
  reference);
* ``loop_overhead`` (stepwise rows): ``run_s / sum(forward costs) - 1``, median over prompts,
  where each forward the loop issued (the full pass at a block's first step, the cached
  window passes after it) is timed alone as a jitted call on the same shapes
  (:func:`forward_costs`);
* degeneracy figures of the text before each output's first EOS, the mean answer length and
  the share of EOS positions (:func:`jaxspec.eval.metrics.answer_degeneracy`);
* the answer-based figures (:mod:`jaxspec.bench.answers`), which the report shows first:
  ``answer_nfe``, ``answer_tokens_per_nfe``, ``answer_tokens_per_s`` (the forwards and
  estimated seconds until each output's answer, up to and including its first EOS, was
  committed), ``answer_speedup_vs_stepwise`` / ``answer_speedup_vs_reference`` (median
  per-prompt ratio of answer seconds to the same references as above) and
  ``answer_nfe_speedup_vs_*``; ``answer_flag`` marks a row whose answers are mostly EOS or
  loop (:func:`jaxspec.eval.quality.answer_flags`), and ``prompt_set`` names the prompt set.
"""

from __future__ import annotations

import datetime
import gc
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.bench import answers as ans
from jaxspec.bench import report
from jaxspec.bench.machine import machine_info
from jaxspec.bench.records import BenchError, BenchPrompt, _num, _order
from jaxspec.bench.report import save_figure
from jaxspec.dllm import CACHES, DiffusionDecodeConfig, diffusion_generate, prefix_widths
from jaxspec.eval.metrics import answer_degeneracy
from models.diffusion.modeling import bidirectional_mask
from models.llama.layout import decode_layout
from models.llama.modeling import init_cache, param_dtype

DLLM_METHODS = ("stepwise", "fixed-2", "fixed-4", "threshold-0.9")


def method_config(
    name: str, *, gen_length: int, block_length: int, cache: str, remasking: str = "low_confidence"
) -> DiffusionDecodeConfig:
    """The decode config of a row name: ``stepwise``, ``fixed-K`` or ``threshold-T``.

    Raises:
      BenchError: an unknown method name or a non-numeric K / T (invalid values raise the
        config's own ``ValueError``).
    """
    common = dict(
        gen_length=gen_length,
        block_length=block_length,
        steps=gen_length,
        remasking=remasking,
        cache=cache,
    )
    try:
        if name == "stepwise":
            return DiffusionDecodeConfig(**common)
        if name.startswith("fixed-"):
            return DiffusionDecodeConfig(tokens_per_step=int(name[6:]), **common)
        if name.startswith("threshold-"):
            return DiffusionDecodeConfig(threshold=float(name[10:]), **common)
    except ValueError as e:
        if "invalid literal" in str(e) or "could not convert" in str(e):
            raise BenchError(
                f"bad method {name!r}: expected stepwise, fixed-K or threshold-T"
            ) from None
        raise
    raise BenchError(
        f"unknown method {name!r}; expected stepwise, fixed-K (e.g. fixed-2) or "
        f"threshold-T (e.g. threshold-0.9)"
    )


def _median_time(f, args, reps: int) -> float:
    jax.block_until_ready(f(*args))  # compile + warm
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t0)
    return float(statistics.median(ts))


def forward_costs(
    model, params, prompt_len: int, cfg: DiffusionDecodeConfig, *, bucket: int = 16, reps: int = 3
) -> dict[str, float]:
    """Seconds of each kind of forward :func:`jaxspec.dllm.decode.diffusion_generate` issues for a
    batch-1 prompt of ``prompt_len`` tokens, each timed alone (jitted, median of ``reps``).

    Returns: ``{"full": s}`` plus, with a cache, ``{"window_W": s}`` for every window width
    ``W`` the loop uses (``block_length`` for ``"dual"``; :func:`jaxspec.dllm.blocks.prefix_widths`
    for ``"prefix"``). Every call computes the LM head on ``block_length`` rows, as the loop, and
    the parameters are in the loop's layout (:func:`models.llama.layout.decode_layout`).
    """
    params = decode_layout(params)
    P = max(bucket, -(-prompt_len // bucket) * bucket)
    G, L = cfg.gen_length, cfg.block_length
    S = P + G
    pad = P - prompt_len
    valid = jnp.arange(S)[None] >= pad
    pos = jnp.maximum(jnp.arange(S)[None] - pad, 0).astype(jnp.int32)
    tokens = jnp.zeros((1, S), jnp.int32)
    row0 = jnp.zeros((1,), jnp.int32)
    if cfg.cache == "none":
        f = jax.jit(
            lambda p, t: model.apply(
                p, t, pos, bidirectional_mask(valid), shift=False, rows=(row0 + P, L)
            )[0]
        )
        return {"full": _median_time(f, (params, tokens), reps)}
    widths = {L} if cfg.cache == "dual" else set(prefix_widths(P, cfg)[0])
    S_c = S if cfg.cache == "dual" else prefix_widths(P, cfg)[1]
    full_mask = jnp.pad(bidirectional_mask(valid), ((0, 0), (0, 0), (0, S_c - S)))
    cache0 = init_cache(model.config.base, 1, S_c, param_dtype(params))  # the loop's dtype
    full = jax.jit(
        lambda p, t, c: model.apply(
            p, t, pos, full_mask, cache=c, cache_index=row0, shift=False, rows=(row0 + P, L)
        )
    )
    out = {"full": _median_time(lambda *a: full(*a)[0], (params, tokens, cache0), reps)}
    cache = full(params, tokens, cache0)[1]
    key_valid = jnp.pad(valid, ((0, 0), (0, S_c - S)))
    for W in sorted(widths):
        wpos = P + jnp.arange(W, dtype=jnp.int32)[None] - pad
        wmask = jnp.broadcast_to(key_valid[:, None, :], (1, W, S_c))
        win = jax.jit(
            lambda p, t, c, wpos=wpos, wmask=wmask: model.apply(
                p, t, wpos, wmask, cache=c, cache_index=row0 + P, shift=False, rows=(row0, L)
            )[0]
        )
        out[f"window_{W}"] = _median_time(win, (params, jnp.zeros((1, W), jnp.int32), cache), reps)
    return out


def stepwise_forward_seconds(
    costs: dict[str, float], prompt_len: int, cfg: DiffusionDecodeConfig, *, bucket: int = 16
) -> float:
    """Sum of the forward costs one stepwise decode issues (``cfg.method == "stepwise"``):
    every step a full pass without a cache; with one, a full pass at each block's first step
    and ``steps_per_block - 1`` window passes after it."""
    nb, spb = cfg.num_blocks, cfg.steps_per_block
    if cfg.cache == "none":
        return nb * spb * costs["full"]
    if cfg.cache == "dual":
        return nb * (costs["full"] + (spb - 1) * costs[f"window_{cfg.block_length}"])
    P = max(bucket, -(-prompt_len // bucket) * bucket)
    widths = prefix_widths(P, cfg)[0]
    return sum(costs["full"] + (spb - 1) * costs[f"window_{w}"] for w in widths)


def run_interleaved(
    runs: dict,
    prompts: Sequence[BenchPrompt],
    gen_length: int,
    progress: bool,
    desc: str,
    warmup: bool = True,
):
    """Run every ``runs[key](ids) -> DiffusionResult`` on every prompt, prompt by prompt, the
    order of the keys rotating from prompt to prompt. Returns ``(outs, compile_s)``: per key
    the list of results (prompt order) and the summed compile seconds.

    ``warmup``: first run every key once on the first prompt and discard the result (its
    compile seconds are kept). The first execution of a freshly compiled decode loop ran up
    to 40% slower than the next ones on a 2-core CPU (a dual-cache stepwise decode of
    ``dream-smollm2-135m``: 28.1 s, then 18.9-21.1 s), so without it every row's first prompt
    was timed cold."""
    keys = list(runs)
    outs: dict = {k: [] for k in keys}
    compile_s = {k: 0.0 for k in keys}
    bar = None
    if progress:
        from tqdm import tqdm

        total = (len(prompts) + (1 if warmup and prompts else 0)) * len(keys)
        bar = tqdm(total=total, desc=desc, unit="run", leave=True)
    try:
        if warmup and prompts:
            for k in keys:
                compile_s[k] += runs[k](prompts[0].ids).compile_s
                if bar is not None:
                    bar.set_postfix_str(f"warm-up {'/'.join(map(str, k))}")
                    bar.update(1)
        for i, p in enumerate(prompts):
            gc.collect()
            for k in _order(keys, i):
                r = runs[k](p.ids)
                compile_s[k] += r.compile_s
                outs[k].append(r)
                if bar is not None:
                    bar.set_postfix_str(
                        f"{p.task_id} {'/'.join(map(str, k))} "
                        f"{gen_length / max(r.run_s, 1e-9):.1f} tok/s"
                    )
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return outs, compile_s


def _loop_overheads(model, params, prompts, cfgs, outs, caches, reps, log):
    """Per cache policy, the stepwise loop's time over the sum of its lone forwards minus 1
    (one value per prompt), and per prompt the lone forwards' seconds; empty when ``reps``
    is 0."""
    overhead: dict[str, list] = {c: [] for c in caches}
    costs_per_prompt: list[dict] = [dict() for _ in prompts]
    if reps <= 0:
        return overhead, costs_per_prompt
    for c in caches:
        cfg = cfgs[("stepwise", c)]
        for i, p in enumerate(prompts):
            log(f"[bench] timing lone forwards: cache={c} prompt {p.task_id}")
            costs = forward_costs(model, params, len(p.ids), cfg, reps=reps)
            costs_per_prompt[i][c] = {w: _num(t, 5) for w, t in costs.items()}
            expect = stepwise_forward_seconds(costs, len(p.ids), cfg)
            overhead[c].append(outs[("stepwise", c)][i].run_s / expect - 1.0)
    return overhead, costs_per_prompt


def _median_ratio(refs, runs) -> float:
    """Median over prompts of the reference's seconds over the run's."""
    return _num(statistics.median(a.run_s / max(r.run_s, 1e-9) for a, r in zip(refs, runs)), 3)


def _suite_row(
    m, c, outs, answers, overhead, compile_s, gen_length, block_length, eos, common, flag_rule
) -> dict:
    """One ``dllm`` row: method ``m`` under cache policy ``c`` over every prompt, the
    answer-based figures first (:mod:`jaxspec.bench.answers`)."""
    o = outs[(m, c)]
    ref_c, ref_0 = outs[("stepwise", c)], outs.get(("stepwise", "none"))
    a_0 = answers.get(("stepwise", "none"))
    nfe = statistics.fmean(int(r.stats.target_nfe.sum()) for r in o)
    return {
        "method": m,
        "cache": c,
        "model": common["model"],
        "remasking": common["remasking"],
        "prompt_set": common["prompt_set"],
        "prompts": len(o),
        "gen_length": gen_length,
        "block_length": block_length,
        **ans.answer_figures(answers[(m, c)], rule=flag_rule),
        **ans.answer_speedups(answers[(m, c)], answers[("stepwise", c)], "_vs_stepwise"),
        **(ans.answer_speedups(answers[(m, c)], a_0, "_vs_reference") if a_0 else {}),
        "nfe": _num(nfe, 2),
        "steps": _num(statistics.fmean(int(r.stats.steps.sum()) for r in o), 2),
        "tokens_per_nfe": _num(gen_length / nfe, 3),
        "forward_tokens": _num(statistics.fmean(r.stats.extra["forward_tokens"] for r in o), 1),
        "tokens_per_s": _num(statistics.median(gen_length / max(r.run_s, 1e-9) for r in o), 3),
        "new_tokens": int(sum(len(r.tokens[0]) for r in o)),
        "speedup_vs_stepwise": _median_ratio(ref_c, o),
        "speedup_vs_reference": None if ref_0 is None else _median_ratio(ref_0, o),
        "identical_fraction": _num(
            statistics.fmean(
                float(np.array_equal(a.full_tokens, r.full_tokens)) for a, r in zip(ref_c, o)
            ),
            3,
        ),
        "loop_overhead": (
            _num(statistics.median(overhead), 4) if m == "stepwise" and overhead else None
        ),
        "compile_s": _num(compile_s, 2),
        **answer_degeneracy([r.full_tokens[0] for r in o], eos, gen_length),
    }


def _per_prompt(prompts, keys, outs, answers, costs_per_prompt, caches, gen_length, decode):
    """The ``per_prompt`` records: each run's NFE, seconds, answer figures and identity to
    stepwise; the lone forwards' seconds; with ``decode``, the stepwise outputs' text."""
    per_prompt = []
    for i, p in enumerate(prompts):
        e: dict[str, Any] = {"task_id": p.task_id, "prompt_tokens": len(p.ids), "runs": {}}
        for m, c in keys:
            r = outs[(m, c)][i]
            e["runs"][f"{m}/{c}"] = {
                "nfe": int(r.stats.target_nfe.sum()),
                "seconds": _num(r.run_s, 4),
                **answers[(m, c)][i].entry(),
                "tokens_per_s": _num(gen_length / max(r.run_s, 1e-9), 3),
                "new_tokens": len(r.tokens[0]),
                "identical_to_stepwise": bool(
                    np.array_equal(r.full_tokens, outs[("stepwise", c)][i].full_tokens)
                ),
            }
        if costs_per_prompt[i]:
            e["forward_seconds"] = costs_per_prompt[i]
        if decode is not None:
            e["stepwise_outputs"] = {c: decode(outs[("stepwise", c)][i].tokens[0]) for c in caches}
        per_prompt.append(e)
    return per_prompt


def run_dllm_suite(
    model,
    params,
    prompts: Sequence[BenchPrompt],
    *,
    model_name: str,
    gen_length: int = 256,
    block_length: int = 32,
    methods: Sequence[str] = DLLM_METHODS,
    caches: Sequence[str] = CACHES,
    remasking: str = "low_confidence",
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
    config: Optional[dict] = None,
    progress: bool = True,
    overhead_reps: int = 3,
    decode: Optional[Callable[[list[int]], str]] = None,
    prompt_set: Optional[str] = None,
    flag_rule: Optional[dict] = None,
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Run the ``dllm`` suite (module docstring) and return the result document.

    Args:
      model, params: a :class:`models.diffusion.modeling.DiffusionLM` and its parameters.
      prompts: the prompts (token ids), each decoded alone.
      model_name: recorded in every row.
      gen_length, block_length: decoded positions and block size of every row.
      methods: row method names (``stepwise`` is added when missing: it is each cache
        policy's reference).
      caches: cache policies, a subset of :data:`jaxspec.dllm.decode.CACHES`.
      remasking: the confidence rule of every row.
      eos_ids: outputs are cut after the first of these (EOS kept) for ``new_tokens`` and
        the degeneracy figures.
      overhead_reps: timed repetitions of each forward for ``loop_overhead`` (0 = skip).
      decode: token ids -> text; when given, ``per_prompt`` records each reference output.
      prompt_set: the prompt set's name (``long`` / ``chat``), recorded in every row.
      flag_rule: overrides of :data:`jaxspec.eval.quality.ANSWER_FLAG_RULE`.

    Returns:
      ``{"suite": "dllm", "date", "machine", "config", "prompt_set", "answer_flag_rule",
      "rows", "per_prompt"}``.

    Raises:
      BenchError: no prompts, an unknown method or cache policy.
      ValueError: invalid decode settings (from :class:`DiffusionDecodeConfig`) or a prompt
        too long for the context (from :func:`diffusion_generate`).
    """
    if not prompts:
        raise BenchError("no prompts to benchmark")
    bad = [c for c in caches if c not in CACHES]
    if bad:
        raise BenchError(f"unknown cache policy {bad[0]!r}; expected {', '.join(CACHES)}")
    methods = ["stepwise"] + [m for m in methods if m != "stepwise"]
    cfgs = {
        (m, c): method_config(
            m, gen_length=gen_length, block_length=block_length, cache=c, remasking=remasking
        )
        for c in caches
        for m in methods
    }
    keys = list(cfgs)
    eos = tuple(int(e) for e in eos_ids)
    outs, compile_s = run_interleaved(
        {
            k: (
                lambda ids, c=cfgs[k]: diffusion_generate(
                    model, params, [ids], c, eos_ids=eos, pad_id=pad_id
                )
            )
            for k in keys
        },
        prompts,
        gen_length,
        progress,
        "dllm runs",
    )

    overhead, costs_per_prompt = _loop_overheads(
        model, params, prompts, cfgs, outs, caches, overhead_reps, log
    )
    answers = {k: [ans.diffusion_answer(r, eos) for r in o] for k, o in outs.items()}
    common = dict(model=model_name, remasking=remasking, prompt_set=prompt_set)
    rows = [
        _suite_row(
            m,
            c,
            outs,
            answers,
            overhead[c],
            compile_s[(m, c)],
            gen_length,
            block_length,
            eos,
            common,
            flag_rule,
        )
        for m, c in keys
    ]
    per_prompt = _per_prompt(
        prompts, keys, outs, answers, costs_per_prompt, caches, gen_length, decode
    )
    return {
        "suite": "dllm",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "config": dict(config or {}),
        "prompt_set": prompt_set,
        "answer_flag_rule": dict(flag_rule or {}),
        "rows": rows,
        "per_prompt": per_prompt,
    }


_COLUMNS = [
    ("method", "method", "{}"),
    ("cache", "cache", "{}"),
    ("prompt_set", "set", "{}"),
    ("prompts", "prompts", "{}"),
    *ans.ANSWER_LEAD,
    ("answer_speedup_vs_stepwise", "answer vs stepwise", "{:.2f}x"),
    ("answer_speedup_vs_reference", "answer vs none/stepwise", "{:.2f}x"),
    ans.FLAG_COLUMN,
    ("nfe", "NFE", "{:.1f}"),
    ("tokens_per_nfe", "tokens/NFE", "{:.2f}"),
    ("forward_tokens", "fwd tokens", "{:.0f}"),
    ("tokens_per_s", "tok/s", "{:.2f}"),
    ("speedup_vs_stepwise", "vs stepwise", "{:.2f}x"),
    ("speedup_vs_reference", "vs none/stepwise", "{:.2f}x"),
    ("identical_fraction", "identical", "{:.2f}"),
    ("loop_overhead", "loop overhead", "{:+.1%}"),
    ("compile_s", "compile s", "{:.1f}"),
    *report.ANSWER_COLUMNS,
]


def markdown_report(result: dict) -> str:
    """Markdown page of a ``dllm`` result: header, table and how to read it."""
    r0 = result["rows"][0]
    out = [
        *report.report_header("Benchmark suite `dllm`", result),
        *ans.header_lines(result, ("method", "cache")),
        f"Model `{r0['model']}`, {r0['prompts']} prompts (batch 1), gen length "
        f"{r0['gen_length']}, block {r0['block_length']}, remasking `{r0['remasking']}`, "
        "greedy.",
        "",
    ]
    out += [
        ans.markdown_table(result["rows"], _COLUMNS),
        "",
        "How to read this:",
        "",
        ans.ANSWER_ACCOUNTING_NOTE,
        "- `answer vs stepwise` / `answer vs none/stepwise`: median over prompts of the "
        "reference's answer seconds over this row's (each decoder's own answer).",
        "- `stepwise` transfers one token per step (steps = gen length); `fixed-K` "
        "K per step; `threshold-T` every position with confidence >= T (at least "
        "one). `cache`: Fast-dLLM prefix / dual KV cache (approximate: each cache "
        "policy is its own reference).",
        "- `tok/s` = decoded positions / wall-clock seconds (median over prompts); "
        "`vs stepwise` is the per-prompt wall-clock ratio to the same cache's "
        "stepwise row, `vs none/stepwise` to the uncached stepwise row.",
        "- `identical` = share of prompts whose output equals the stepwise row's "
        "with the same cache policy (parallel decoding and caches are not lossless).",
        "- `fwd tokens` = query tokens pushed through the model per prompt; "
        "`loop overhead` = decode wall clock over the sum of its forwards, each "
        "timed alone on the same shapes (stepwise rows).",
        report.ANSWER_NOTE,
    ]
    return "\n".join(out) + "\n"


def plot_rows(result: dict, out: Path) -> Path:
    """Grouped bar chart: answer tokens/s (left) and answer NFE (right) per method, one bar
    per cache (:mod:`jaxspec.bench.answers`)."""
    from jaxspec.core.plotting import pyplot

    plt = pyplot()

    rows = result["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    caches = list(dict.fromkeys(r["cache"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    x = np.arange(len(methods))
    w = 0.8 / len(caches)
    for j, c in enumerate(caches):
        by = {r["method"]: r for r in rows if r["cache"] == c}
        for ax, key in zip(axes, ("answer_tokens_per_s", "answer_nfe")):
            ax.bar(
                x + (j - (len(caches) - 1) / 2) * w,
                [by[m][key] or 0.0 for m in methods],
                w,
                label=f"cache={c}",
            )
    for ax, lab in zip(axes, ("answer tokens / s", "NFE until the answer is complete")):
        ax.set_xticks(x, methods)
        ax.set_ylabel(lab)
    axes[0].legend(fontsize=8)
    r0 = rows[0]
    flagged = sum(bool(r.get("answer_flag")) for r in rows)
    fig.suptitle(
        f"dllm: {r0['model']}, gen {r0['gen_length']}, block {r0['block_length']}, "
        f"{r0['prompts']} prompts ({r0.get('prompt_set') or 'set not recorded'})"
        + (f"; {flagged} rows flagged (EOS / loop)" if flagged else "")
    )
    return save_figure(fig, out)


def write_results(result: dict, out: Path) -> tuple[Path, Path]:
    """Write the JSON, the markdown report (``.md``) and the chart (``.png``)."""
    return report.write_results(
        result,
        out,
        report=markdown_report,
        plot=plot_rows,
        caption="answer tokens/s and answer NFE",
    )
