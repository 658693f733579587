"""Side-by-side benchmark machinery (docs/results.md).

The ``ar`` suite compares greedy batch-1 decoding of one causal model by several *systems*:

* ``jaxspec/ar``: our jitted autoregressive decoder (:func:`jaxspec.causal.decode.generate`), the
  suite's **baseline** and the **reference** every other system's tokens are compared with;
* ``jaxspec/ngram``: our speculative decoder with :class:`jaxspec.core.drafters.NgramDrafter`
  (prompt-lookup suffix matching; steps without a match run as plain AR steps);
* ``jaxspec/ngram-bigram``: the same drafter with the ASSD Eq. 23 bigram fallback, so every
  step verifies k drafts;
* ``transformers/ar``: ``model.generate(do_sample=False)`` of a PyTorch model loaded from the
  same weight file;
* ``transformers/prompt-lookup``: the same with ``prompt_lookup_num_tokens=K``;
* on request, ``jaxspec/ar-int8`` and ``jaxspec/ngram-int8``: AR and n-gram decoding of the
  model with weight-only int8 projection matrices (:func:`models.quant.quantize_params` of the
  loaded weights). They change the model, so their rows report the drift from ``jaxspec/ar``
  (``identical_share``, ``first_divergence``) and, for losslessness, identity with AR of the
  same int8 model (``identical_to_quant_reference``; ``jaxspec/ngram-int8`` always brings
  ``jaxspec/ar-int8`` along as that reference).

Protocol (:func:`run_ar_suite`): every system first runs one warm-up generation (jaxspec's
compilation happens there and is reported as ``compile_s``); then, for each prompt in turn,
every system decodes it (the order rotates from prompt to prompt), so slow drift or noise of
the machine hits all systems alike. Per-prompt throughput is ``new tokens / wall-clock
seconds`` of that call; rows quote the median over prompts, and ``speedup_vs_baseline`` is
the median over prompts of the baseline's seconds per token over the system's
(:func:`per_token_speedup`: ``baseline seconds / system seconds`` when the tokens are the same,
and no credit for stopping earlier when they are not). With the bandwidth ceiling
(``num_params``), each AR system also decodes every prompt with a one-token budget right after
its full run: the time to the first token (``ttft_s``), and ``decode_tokens_per_s``, the rate of
the decode steps alone, which is what the ceiling bounds.

Everything here works on already-loaded models and already-encoded prompts, so tests can run
it on tiny random models; :mod:`scripts.benchmark` adds presets, HumanEval and the CLI.
"""

from __future__ import annotations

import datetime
import gc
import statistics
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from jaxspec.bench.machine import (
    _time_products,
    bandwidth_ceiling,
    check_map_headroom,
    machine_info,
    matvec_probe,
)
from jaxspec.bench.records import (
    BenchError,
    BenchPrompt,
    RunOutput,
    _num,
    _order,
    first_divergence,
)
from jaxspec.bench.report import markdown_table, report_header, save_figure
from jaxspec.bench.report import write_results as _write_results
from jaxspec.bench.systems import BASELINE
from jaxspec.eval.metrics import mean_degeneracy


def _drift(system, outs: dict) -> dict:
    """Row fields comparing ``system``'s outputs with the baseline's (``identical_share``,
    ``first_divergence``: median over the differing prompts) and, for a system with a
    ``quant_reference``, with that system's (``identical_to_quant_reference``; None when it
    did not run or for the reference itself and for float systems)."""
    o = outs[system.name]
    div = [first_divergence(r.tokens, b.tokens) for b, r in zip(outs[BASELINE], o)]
    qref = getattr(system, "quant_reference", None)
    return {
        "identical_share": _num(sum(d is None for d in div) / len(div), 4),
        "first_divergence": (
            None
            if all(d is None for d in div)
            else statistics.median(d for d in div if d is not None)
        ),
        "identical_to_quant_reference": (
            all(r.tokens == b.tokens for b, r in zip(outs[qref], o))
            if qref in outs and qref != system.name
            else None
        ),
    }


def _measures_ttft(system) -> bool:
    """Whether the ``ar`` suite times ``system``'s first token: the autoregressive systems
    (``ar``, ``ar-scan``, ``ar-unrolled``, ``ar-int8``, transformers ``ar``), whose decode
    steps the bandwidth ceiling bounds."""
    return system.method == "ar" or system.method.startswith("ar-")


def _decode_rate(outs: Sequence[RunOutput], ttft: Optional[Sequence[float]]) -> dict:
    """``ttft_s`` (median seconds of a one-token run: prefill + first token) and
    ``decode_tokens_per_s`` (median over prompts of ``(new - 1) / (seconds - ttft)``: the
    decode steps alone, the rate the bandwidth ceiling bounds); None when not measured."""
    if not ttft:
        return {"ttft_s": None, "decode_tokens_per_s": None}
    rates = [r for r in _decode_rates(outs, ttft) if r is not None]
    return {
        "ttft_s": _num(statistics.median(ttft), 4),
        "decode_tokens_per_s": _num(statistics.median(rates), 3) if rates else None,
    }


def _decode_rates(outs: Sequence[RunOutput], ttft: Sequence[float]) -> list[Optional[float]]:
    """Per prompt, ``(new - 1) / (seconds - ttft)`` tokens/s, or None where it is undefined
    (one token, or a first token that took the whole call)."""
    return [
        (len(o.tokens) - 1) / (o.seconds - t) if len(o.tokens) > 1 and o.seconds > t else None
        for o, t in zip(outs, ttft)
    ]


def _paired_share(
    outs: Sequence[RunOutput],
    ttft: Optional[Sequence[float]],
    matvec_s: Sequence[float],
    matrix_bytes: int,
    model_bytes: int,
) -> Optional[float]:
    """Median over prompts of a system's decode rate over the bandwidth ceiling timed right
    after that prompt (``matrix_bytes / matvec_s[i]`` bytes/s over the model's bytes): the
    ceiling share with the machine's drift paired out. None without both measurements."""
    if not ttft or len(matvec_s) != len(outs):
        return None
    shares = [
        rate * model_bytes * t / matrix_bytes
        for rate, t in zip(_decode_rates(outs, ttft), matvec_s)
        if rate is not None
    ]
    return _num(statistics.median(shares), 3) if shares else None


def _on_cpu() -> bool:
    import jax

    return jax.default_backend() == "cpu"


def _interleaved_runs(
    systems: Sequence,
    prompts: Sequence[BenchPrompt],
    time_first: bool,
    progress: bool,
    log: Callable[[str], None],
    between: Optional[Callable[[], None]] = None,
):
    """The ``ar`` suite's protocol (module docstring): one untimed warm-up generation per
    system, then every prompt by every system in rotating order; with ``time_first`` the AR
    systems also rerun each prompt with a one-token budget right after; ``between`` is called
    after each prompt's systems.

    Returns ``(outputs {name: [RunOutput per prompt]}, first-token seconds {name: [...]} of
    the AR systems, compile seconds {name: float})``."""
    names = [s.name for s in systems]
    compile_s = {n: 0.0 for n in names}
    # the warm-up compiles jaxspec's first bucket; the AR systems' one-token budget too (its
    # compile is not counted)
    for s in systems:
        log(f"[bench] warm-up {s.name}")
        check_map_headroom(f"warm-up of {s.name}")
        compile_s[s.name] += s.run(prompts[0].ids).compile_s
        if time_first and _measures_ttft(s):
            s.run(prompts[0].ids, max_new_tokens=1)
    ttft: dict[str, list[float]] = {s.name: [] for s in systems if time_first and _measures_ttft(s)}
    outs: dict[str, list[RunOutput]] = {n: [] for n in names}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(prompts), desc="prompts", unit="prompt", leave=True)
    try:
        for i, p in enumerate(prompts):
            gc.collect()
            check_map_headroom(f"prompt {p.task_id}")
            for s in _order(systems, i):
                o = s.run(p.ids)
                compile_s[s.name] += o.compile_s
                outs[s.name].append(o)
                if s.name in ttft:
                    ttft[s.name].append(s.run(p.ids, max_new_tokens=1).seconds)
            if between is not None:
                between()
            if bar is not None:
                bar.set_postfix_str(
                    " ".join(
                        f"{n.split('/')[0][:3]}/{n.split('/')[1][:5]}="
                        f"{len(outs[n][-1].tokens) / max(outs[n][-1].seconds, 1e-9):.1f}"
                        for n in names
                    )
                )
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return outs, ttft, compile_s


def per_token_speedup(ref, out) -> float:
    """Speedup of one decode ``out`` over the baseline's decode ``ref`` of the same prompt
    (:class:`jaxspec.bench.records.RunOutput` each): the ratio of their seconds per generated
    token, ``(ref.seconds / len(ref.tokens)) / (out.seconds / len(out.tokens))``. For a
    lossless system (the same tokens) this is ``ref.seconds / out.seconds``; a system that
    stops earlier (another dtype's EOS, say) earns nothing from writing less. 0.0 when
    ``out`` generated nothing."""
    if not out.tokens:
        return 0.0
    per_ref = ref.seconds / max(len(ref.tokens), 1)
    return per_ref / max(out.seconds / len(out.tokens), 1e-12)


def _suite_row(
    s,
    outs: dict,
    model_name: str,
    compile_s: dict,
    ttft: Optional[Sequence[float]],
    paired: Optional[float],
) -> dict[str, Any]:
    """One system's row of the ``ar`` suite (:func:`run_ar_suite`) from every system's
    outputs ``outs`` (the baseline's included), its first-token seconds and paired ceiling
    share."""
    o, ref = outs[s.name], outs[BASELINE]
    new = sum(len(r.tokens) for r in o)
    nfe = sum(r.target_nfe for r in o)
    tps = [len(r.tokens) / max(r.seconds, 1e-9) for r in o]
    ratio = [per_token_speedup(b, r) for b, r in zip(ref, o)]
    proposed, accepted = sum(r.proposed for r in o), sum(r.accepted for r in o)
    drafts = s.method != "ar"
    return {
        "system": s.system,
        "method": s.method,
        "model": model_name,
        "prompts": len(o),
        "new_tokens": new,
        "median_tokens_per_s": _num(statistics.median(tps), 3),
        "mean_tokens_per_s": _num(statistics.fmean(tps), 3),
        "nfe_per_token": _num(nfe / max(new, 1)),
        "mat": _num(new / max(nfe, 1)),
        "acceptance_rate": _num(accepted / proposed) if drafts and proposed else None,
        "draft_nfe_per_token": _num(sum(r.draft_nfe for r in o) / max(new, 1)),
        # accepted draft tokens per decode step (the bonus / correction token not counted)
        "mean_accepted_length": (
            _num(accepted / max(sum(r.steps for r in o), 1), 3)
            if drafts and any(r.steps for r in o)
            else None
        ),
        "speedup_vs_baseline": _num(statistics.median(ratio), 3),
        "identical_to_reference": all(r.tokens == b.tokens for b, r in zip(ref, o)),
        **_drift(s, outs),
        "compile_s": _num(compile_s[s.name], 2) if s.system == "jaxspec" else None,
        "verify_layout": o[-1].settings.get("verify_layout"),
        "gate_cost": o[-1].settings.get("verify_cost"),
        **_decode_rate(o, ttft),
        "decode_share_paired": paired,
        **mean_degeneracy([r.tokens for r in o]),
    }


def _per_prompt_records(prompts, names, outs, ttft, decode) -> list[dict[str, Any]]:
    """One record per prompt: each system's tokens, time, target NFE and acceptance counts,
    and whether its tokens equal the baseline's (with the texts where ``decode`` is given)."""
    ref = outs[BASELINE]
    per_prompt = []
    for i, p in enumerate(prompts):
        entry: dict[str, Any] = {"task_id": p.task_id, "prompt_tokens": len(p.ids), "systems": {}}
        for n in names:
            o = outs[n][i]
            same = o.tokens == ref[i].tokens
            entry["systems"][n] = {
                "new_tokens": len(o.tokens),
                "seconds": _num(o.seconds, 5),
                "ttft_s": _num(ttft[n][i], 5) if n in ttft else None,
                "tokens_per_s": _num(len(o.tokens) / max(o.seconds, 1e-9), 3),
                "target_nfe": o.target_nfe,
                "proposed": o.proposed,
                "accepted": o.accepted,
                "identical_to_reference": same,
                "first_divergence": first_divergence(o.tokens, ref[i].tokens),
            }
            if decode is not None and not same:
                entry["systems"][n]["output"] = decode(o.tokens)
        if decode is not None:
            entry["reference_output"] = decode(ref[i].tokens)
        per_prompt.append(entry)
    return per_prompt


def free_programs(log: Callable[[str], None] = lambda m: None) -> int:
    """Drop every compiled program (:func:`jaxspec.core.runtime.clear_compiled`) once a
    prompt set's systems have run, so a suite over several sets does not pile them up.

    Each set pads its prompts to its own buckets, so its programs are new ones, and every XLA
    CPU program holds memory maps of its own: a ``dflash`` suite over three sets with twelve
    rows each ran into the kernel's map limit (``vm.max_map_count``, 65,530) and aborted with
    ``LLVM ERROR: Unable to allocate section memory`` in its third set. The next set compiles
    what it needs again (from the persistent compilation cache where it has them).

    Returns:
      the number of programs dropped."""
    from jaxspec.core.runtime import clear_compiled

    n = clear_compiled()
    gc.collect()
    log(f"freed {n} compiled programs")
    return n


def run_ar_suite(
    systems: Sequence,
    prompts: Sequence[BenchPrompt],
    *,
    model_name: str,
    num_params: Optional[int] = None,
    param_dtype: str = "float32",
    config: Optional[dict] = None,
    progress: bool = True,
    bandwidth_reps: int = 5,
    decode: Optional[Callable[[list[int]], str]] = None,
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Run the ``ar`` suite and return the result document (docs/results.md).

    Args:
      systems: objects with ``system``, ``method``, ``name`` and ``run(ids) -> RunOutput``
        (:class:`~jaxspec.bench.systems.JaxspecSystem`,
        :class:`~jaxspec.bench.systems.TransformersSystem`); one must be the baseline
        ``jaxspec/ar``.
      prompts: the prompts, in order.
      model_name: recorded in every row.
      num_params: target parameter count, for the memory-bandwidth ceiling (skipped if None).
        With it, the AR systems (:func:`_measures_ttft`) also run every prompt with a one-token
        budget, for the time to the first token and the rate of the decode steps alone
        (:func:`_decode_rate`), which the ceiling bounds.
      param_dtype: the target's weight dtype (its bytes per parameter set the ceiling). On CPU
        the ceiling's rate is a numpy float32 product
        (:func:`~jaxspec.bench.machine.matvec_bandwidth`), on an accelerator a jitted product
        in ``param_dtype`` (:func:`~jaxspec.bench.machine.device_matvec_bandwidth`).
      config: recorded as ``config``.
      progress: show a progress bar over prompts (stderr).
      bandwidth_reps: timed matrix-vector products for the bandwidth ceiling.
      decode: token ids -> text; when given, ``per_prompt`` records the reference output text
        (and the text of every system whose tokens differ from it).
      log: receives progress messages.

    Returns:
      ``{"suite", "date", "machine", "config", "bandwidth", "rows", "per_prompt"}``.

    Raises:
      BenchError: no prompts, or the baseline system is missing.
    """
    systems = list(systems)
    if not prompts:
        raise BenchError("no prompts to benchmark")
    names = [s.name for s in systems]
    if BASELINE not in names:
        raise BenchError(f"the baseline {BASELINE} must be among the systems")
    # on the CPU the ceiling's product is also timed after every prompt, to pair each prompt's
    # decode rate with the machine's rate at that moment (a shared machine drifts)
    matvec_s: list[float] = []
    probe, matrix_bytes = matvec_probe(num_params) if num_params and _on_cpu() else (None, 0)

    def time_probe():  # one untimed product (other libraries' threads settle), fastest of 3
        matvec_s.append(_time_products(probe, matrix_bytes, 3)["matvec_s"])

    outs, ttft, compile_s = _interleaved_runs(
        systems, prompts, bool(num_params), progress, log, between=time_probe if probe else None
    )
    model_bytes = int(np.dtype(param_dtype).itemsize) * int(num_params or 0)

    rows = [
        _suite_row(
            s,
            outs,
            model_name,
            compile_s,
            ttft.get(s.name),
            _paired_share(outs[s.name], ttft.get(s.name), matvec_s, matrix_bytes, model_bytes),
        )
        for s in systems
    ]
    per_prompt = _per_prompt_records(prompts, names, outs, ttft, decode)

    bandwidth = bandwidth_ceiling(num_params, param_dtype, bandwidth_reps) if num_params else None
    if bandwidth is not None and matvec_s:
        bandwidth["matvec_per_prompt_ms"] = [_num(t * 1e3, 2) for t in matvec_s]
        bandwidth["matvec_per_prompt_gb_per_s_median"] = _num(
            matrix_bytes / statistics.median(matvec_s) / 1e9, 2
        )
    return {
        "suite": "ar",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "config": dict(config or {}),
        "bandwidth_bound_tokens_per_s": None
        if bandwidth is None
        else bandwidth["bandwidth_bound_tokens_per_s"],
        "bandwidth": bandwidth,
        "rows": rows,
        "per_prompt": per_prompt,
    }


_COLUMNS = [
    ("system", "system", "{}"),
    ("method", "method", "{}"),
    ("prompts", "prompts", "{}"),
    ("new_tokens", "new tokens", "{}"),
    ("median_tokens_per_s", "median tok/s", "{:.1f}"),
    ("decode_tokens_per_s", "decode tok/s", "{:.1f}"),
    ("ttft_s", "TTFT s", "{:.3f}"),
    ("mean_tokens_per_s", "mean tok/s", "{:.1f}"),
    ("speedup_vs_baseline", "speedup", "{:.2f}x"),
    ("nfe_per_token", "NFE/token", "{:.3f}"),
    ("mat", "MAT", "{:.2f}"),
    ("acceptance_rate", "acceptance", "{:.3f}"),
    ("identical_to_reference", "identical", "{}"),
    ("identical_share", "ident. share", "{:.2f}"),
    ("first_divergence", "1st diff", "{:g}"),
    ("identical_to_quant_reference", "= int8 AR", "{}"),
    ("compile_s", "compile s", "{:.1f}"),
    ("verify_layout", "verify layout", "{}"),
    ("gate_cost", "gate cost", "{:.2f}"),
    ("distinct_token_share", "distinct", "{:.2f}"),
    ("repeated_ngram_rate", "rep. 4-gram", "{:.2f}"),
    ("longest_run", "longest run", "{}"),
]


def _ceiling_shares(result: dict) -> str:
    """`` jaxspec/ar's decode steps reach X% of it ...``: each AR system's decode rate (and
    end-to-end rate) as a share of the bandwidth ceiling; empty without decode rates."""
    bound = result.get("bandwidth_bound_tokens_per_s")
    parts = [
        f"`{r['system']}/{r['method']}` {100 * r['decode_tokens_per_s'] / bound:.0f}% "
        f"(end to end, prefill included: {100 * r['median_tokens_per_s'] / bound:.0f}%)"
        for r in result.get("rows", ())
        if bound and r.get("decode_tokens_per_s")
    ]
    paired = [
        f"`{r['system']}/{r['method']}` {100 * r['decode_share_paired']:.0f}%"
        for r in result.get("rows", ())
        if r.get("decode_share_paired")
    ]
    bw = result.get("bandwidth") or {}
    note = (
        (
            " Paired with the same product timed right after each prompt (fastest of 3; median "
            f"{bw.get('matvec_per_prompt_gb_per_s_median')} GB/s; the machine's rate drifts "
            "during a run), the median over prompts of decode rate / that prompt's ceiling: "
            + "; ".join(paired)
            + "."
        )
        if paired
        else ""
    )
    return (
        (
            " Decode steps alone (`decode tok/s`) reach, of this ceiling: "
            + "; ".join(parts)
            + "."
            + note
        )
        if parts
        else ""
    )


def markdown_report(result: dict) -> str:
    """Full markdown page: header, table, the memory-bandwidth ceiling and how to read it."""
    bw = result.get("bandwidth")
    out = report_header(f"Benchmark suite `{result['suite']}`", result, peers=True)
    out += [markdown_table(result, _COLUMNS), ""]
    if bw:
        dt = bw.get("param_dtype", "float32")
        where = "" if bw.get("device", "cpu") == "cpu" else f" on the {bw['device'].upper()}"
        out += [
            f"**Memory-bandwidth ceiling for batch-1 {dt} decoding{where}: "
            f"{bw['bandwidth_bound_tokens_per_s']:.1f} tokens/s** "
            f"({bw.get('model_bytes', bw['model_bytes_f32']) / 1e9:.3g} GB "
            f"of {dt} weights read at {bw['matvec_gb_per_s']:.1f} GB/s, the rate of a "
            f"matrix-vector product over a "
            f"{bw.get('matvec_matrix_bytes', bw['model_bytes_f32']) / 1e9:.3g} GB {dt} "
            f"matrix: fastest of several passes {bw['matvec_ms']:.2f} ms, "
            f"median {bw['matvec_median_ms']:.1f} ms). A decoder that reads every weight "
            f"in {dt} once per token cannot beat it; speculative decoding can, because one "
            f"forward verifies several tokens, and so can the CPU panel kernel on a GGUF "
            f"Q4_1 / Q8_0 model, which reads those weights in their quantized form (0.75 / "
            f"1.125 bytes a weight) and rebuilds them exactly." + _ceiling_shares(result),
            "",
        ]
    out += [
        "How to read this:",
        "",
        "- All systems decode the same token ids greedily at batch 1, in one process, interleaved "
        "prompt by prompt (the order rotates); warm-up and compilation are excluded "
        "(compilation is listed under `compile s`).",
        "- `median tok/s` is the median over prompts of new tokens / wall-clock seconds; "
        "`speedup` is the median over prompts of the per-prompt wall-clock ratio against "
        f"`{BASELINE}` of this same run.",
        "- `decode tok/s` (AR systems) is the median over prompts of (new tokens - 1) / "
        "(seconds - TTFT), where `TTFT s` is the wall-clock time of the same call with a "
        "one-token budget (prefill and first token; its compile not counted): the rate of the "
        "decode steps alone, which the bandwidth ceiling bounds.",
        "- `NFE/token` counts target-model forward passes (the prompt pass included) per "
        "generated token, hardware-independent; `MAT` is its inverse, tokens per forward. "
        "`acceptance` is accepted / verified draft tokens: `jaxspec/ngram` and transformers' "
        "prompt lookup verify K drafts only when a suffix matches (otherwise they run a plain "
        "AR step); `jaxspec/ngram-bigram` always verifies K drafts (bigram fallback).",
        f"- `identical` says whether every prompt's output equals `{BASELINE}`'s token for token "
        "(greedy speculative decoding is lossless; a different implementation in float32 can "
        "still flip a near-tie).",
        "- `ident. share` is the share of prompts whose output equals the reference's; `1st diff` "
        "the median over the other prompts of the first generated position that differs. "
        "The `-int8` systems (weight-only int8 matrices) change the model, so they drift from "
        f"`{BASELINE}`; `= int8 AR` says whether they equal AR decoding of the same int8 model "
        "(losslessness holds within one quantization).",
        "- `distinct`, `rep. 4-gram` and `longest run` are degeneracy figures of the outputs: a "
        "looping model inflates acceptance and speedup.",
        "- Wall-clock ratios are only meaningful within one run; compare NFE across machines.",
    ]
    return "\n".join(out) + "\n"


def plot_per_prompt(result: dict, out: Path) -> Path:
    """Plot per-prompt throughput of every system (dots) with each system's median (line)
    and the memory-bandwidth ceiling; write it as PNG to ``out``."""
    from jaxspec.core.plotting import pyplot

    plt = pyplot()

    prompts = result["per_prompt"]
    names = [f"{r['system']}/{r['method']}" for r in result["rows"]]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(prompts) + 2), 4.2))
    x = np.arange(len(prompts))
    for i, name in enumerate(names):
        y = [p["systems"][name]["tokens_per_s"] for p in prompts]
        line = ax.plot(x + (i - len(names) / 2) * 0.08, y, "o", ms=4, label=name)[0]
        ax.axhline(float(np.median(y)), color=line.get_color(), lw=1, alpha=0.6)
    bound = result.get("bandwidth_bound_tokens_per_s")
    if bound:
        ax.axhline(bound, color="k", ls="--", lw=1, label="f32 bandwidth ceiling (1 forward/token)")
    ax.set_xticks(x, [p["task_id"].split("/")[-1] for p in prompts])
    ax.set_xlabel(f"prompt ({prompts[0]['task_id'].split('/')[0]} index)" if prompts else "prompt")
    ax.set_ylabel("tokens / s (wall clock)")
    ax.set_title(
        f"suite {result['suite']}: {result['rows'][0]['model']}, greedy, batch 1 (lines: medians)"
    )
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    return save_figure(fig, out)


def write_results(result: dict, out: Path) -> tuple[Path, Path]:
    """JSON, markdown and chart of the ``ar`` suite (:func:`jaxspec.bench.report.write_results`
    with :func:`markdown_report` and :func:`plot_per_prompt`)."""
    return _write_results(result, out, report=markdown_report, plot=plot_per_prompt)
