"""n-gram speculative decoding's draft length on the CPU: AR and n-gram with K = 2 .. 8 drafts,
with and without the cost gate, interleaved in one process on the real SmolLM2-135M-Instruct
weights (a 9-row verification pass costs about two one-token steps on these CPUs, so
the default K = 8 may not be the fastest here).

    python benchmarks/probes/ngram-k/k_sweep.py [--ks 2 3 4 6 8] [--limit 8] [--reps 2]
        [--out-dir DIR]

Systems are the ``ar`` suite's (:class:`jaxspec.bench.systems.JaxspecSystem`: greedy, batch 1,
128 new tokens, HumanEval prompts, CPU decode layout, the verification layout timed per K).
Every prompt runs ``--reps`` rounds, each timing every system once in a rotating order;
compilation happens in an untimed first round. Writes ``results/ngram-k/k_sweep.md`` (median
tok/s, median of per-prompt speedups over AR, MAT, acceptance, identical to AR, the outputs'
degeneracy) and ``k_sweep.png`` (MAT and speedup against K).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import jax

from jaxspec.bench.ab import emit_lines
from jaxspec.bench.machine import cpu_model
from jaxspec.bench.prompts import suite_prompts
from jaxspec.bench.report import plot_k_sweep, save_figure
from jaxspec.bench.systems import JaxspecSystem
from jaxspec.core.plotting import pyplot
from jaxspec.eval.metrics import mean_degeneracy
from models.registry import load_model

RESULTS = Path(__file__).resolve().parents[3] / "results" / "ngram-k"  # the outputs live there


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 3, 4, 6, 8])
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--out-dir", default=str(RESULTS))
    args = ap.parse_args(argv)
    model, params, tok, _ = load_model("smollm2-135m-instruct", log=lambda m: None)
    prompts = [p.ids for p in suite_prompts(tok, ["humaneval"], args.limit)["humaneval"]]
    common = dict(max_new_tokens=args.new, eos_ids=(2,), pad_id=0)
    systems = {"ar": JaxspecSystem("ar", model, params, **common)}
    for k in args.ks:
        for gate in ("", "-gate"):
            systems[f"ngram{gate} K={k}"] = JaxspecSystem(
                f"ngram{gate}", model, params, draft_length=k, **common
            )
    names = list(systems)
    secs = {n: [[] for _ in prompts] for n in names}
    outs = {n: [None] * len(prompts) for n in names}
    for i, ids in enumerate(prompts):
        for n in names:  # untimed: compiles (and times the verification layouts once per K)
            outs[n][i] = systems[n].run(ids)
        for r in range(args.reps):
            order = names[(i + r) % len(names) :] + names[: (i + r) % len(names)]
            for n in order:
                out = systems[n].run(ids)
                secs[n][i].append(out.seconds)
        print(f"prompt {i + 1}/{len(prompts)} done", flush=True)
    ref = [o.tokens for o in outs["ar"]]
    deg = mean_degeneracy(ref)
    lines = [
        f"{cpu_model()}, jax {jax.__version__}, SmolLM2-135M-Instruct float32, greedy, "
        f"batch 1, {args.new} new tokens, {len(prompts)} HumanEval prompts x {args.reps} "
        f"interleaved reps. Degeneracy of the (AR) outputs: distinct "
        f"{deg['distinct_token_share']:.2f}, repeated 4-gram rate "
        f"{deg['repeated_ngram_rate']:.2f}, longest run {deg['longest_run']}.",
        "",
        "| system | median tok/s | median of per-prompt speedups vs AR | MAT | acceptance "
        "| identical to AR |",
        "|---|---|---|---|---|---|",
    ]
    rows = {}
    for n in names:
        med = [statistics.median(s) for s in secs[n]]
        toks = [len(o.tokens) for o in outs[n]]
        tps = statistics.median(t / s for t, s in zip(toks, med))
        speed = statistics.median(statistics.median(a) / b for a, b in zip(secs["ar"], med))
        mat = sum(toks) / sum(o.target_nfe for o in outs[n])
        prop = sum(o.proposed for o in outs[n])
        acc = sum(o.accepted for o in outs[n]) / prop if prop else float("nan")
        same = all(o.tokens == r for o, r in zip(outs[n], ref))
        rows[n] = dict(mat=mat, speedup_vs_baseline=speed)
        lines.append(
            f"| {n} | {tps:.1f} | {speed:.2f}x | {mat:.2f} | "
            f"{'-' if n == 'ar' else f'{acc:.3f}'} | {'yes' if same else 'NO'} |"
        )
    out_dir = Path(args.out_dir)
    emit_lines(lines, str(out_dir / "k_sweep.md"))
    fig, axes = pyplot().subplots(1, 2, figsize=(9, 3.4), sharey=True)
    for ax, gate in zip(axes, ("", "-gate")):
        plot_k_sweep(
            ax,
            [dict(k=k, **rows[f"ngram{gate} K={k}"]) for k in args.ks],
            "draft length K",
            "n-gram" + (" + cost gate" if gate else ""),
        )
    save_figure(fig, out_dir / "k_sweep.png", f"n-gram draft length, {cpu_model()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
