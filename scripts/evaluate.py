"""Measure the quality gate of a trained model: a masked-diffusion delta, an AS-ARM or a
SAR-SFT model.

**AS-ARM** (any gate whose ``configs/train/<gate>.yaml`` has ``objective.kind: asarm``):

``python -m scripts.evaluate --gate asarm-small [--weights PATH] [--sequences 20] [--seq-len 256]
[--mask-rate 0.95] [--method sequential] [--temperature 1.0] [--out PATH]``

Loads the AS-ARM (:func:`models.registry.load_asarm`; default ``checkpoints/<gate>/
model.safetensors``), cuts ``--sequences`` windows of ``--seq-len`` tokenizer ids out of the
held-out stdlib modules of the training config (``data.holdout``, never the training split;
:func:`jaxspec.eval.quality.heldout_snippets`), masks ``--mask-rate`` of each with a fixed seed (the
visible rest is the prompt), infills them (``--method``, sampling at ``--temperature``, the
paper's 1.0, and greedy) and compares with the true text at the same positions: distinct-token
share, repeated 4-gram rate, longest run, Shannon entropy (Eq. 22) and generative perplexity
judged by SmolLM2-135M (Eq. 21) (:func:`jaxspec.eval.quality.run_asarm_gate`). Pass rule
(:data:`jaxspec.eval.quality.ASARM_GATE_RULE`, on the sampled run): FAIL when any infill is mostly
one token (> 50%), when the infills' distinct-token share is below half the true text's, when
their repeated 4-gram rate exceeds the true text's by more than 0.25, or when their judged
perplexity (geometric mean) exceeds 10x the true text's. Writes ``gate.json`` next to the weights
(or ``--out``) with all figures and decoded samples and prints a table and the failed checks.

**Masked diffusion**:

``python -m scripts.evaluate --gate dream-smollm2-135m-v1 [--prompts 20 --gen-length 64]
[--out checkpoints/dream-smollm2-135m-v1/gate.json]``

Reads ``configs/train/<gate>.yaml`` (base preset, head, mask id, held-out modules) and
``checkpoints/<gate>/delta.safetensors``, builds ``--prompts`` held-out stdlib snippets
(:func:`jaxspec.eval.quality.heldout_snippets`: 128-token prompt + true next ``--gen-length``
tokens), and reports, next to the base model run autoregressively (greedy) on the same prompts:

* masked-token top-1 accuracy at 15% and 50% masking (the AR column is the base model's
  next-token accuracy at the same positions with the full unmasked left context);
* for greedy stepwise completions (block ``--block``, steps = gen length, low_confidence,
  temperature 0; EOS not cut, all ``--gen-length`` positions scored): distinct-token share,
  repeated 4-gram rate, longest run, match to the true continuation, share of degenerate
  completions (one token > 50% of a completion).

Verdict: FAIL when any diffusion completion is degenerate, PASS otherwise (the figures are
reported for comparison; the gate sets no numeric bar beyond non-degeneracy).
**EOS gate** (``--eos-gate``, the default for configs with ``data.source:
stdlib-sft`` such as ``dream-smollm2-135m-v2``): ``python -m scripts.evaluate --gate NAME
--eos-gate --gen-length 256 --block 32 [--prompts 20 --humaneval 20]``: greedy stepwise
completions of held-out function prompts (signature + docstring) scored before the first EOS,
with the pass rule of :data:`jaxspec.eval.dllm_gate.V2_GATE_RULE` (repeated 4-gram rate <= 0.3,
distinct share >= 0.3, >= 80% end with EOS), masked accuracy at 15% / 50%, and HumanEval pass@1
stepwise beside the base model's AR; writes ``checkpoints/NAME/eos-gate.json`` (or ``--out``).
``--gate-rule v3`` (the default for ``data.source: stdlib-sft+distill``, e.g.
``dream-smollm2-135m-v3``; :data:`jaxspec.eval.dllm_gate.V3_GATE_RULE`): the HumanEval prompts'
completions are scored with the held-out ones, and the bounds are 4-gram rate <= 0.2, distinct
share >= 0.4, >= 80% end with EOS, masked accuracy >= 0.65 at 15% / >= 0.45 at 50%, median
answer length >= half the base model's greedy AR answers to the same prompts; run it at
``--block 8`` and ``--block 32``.

**SPACE SAR-SFT** (``objective.kind: sar``, e.g. ``--gate smollm2-135m-space``):
held-out AR loss of the SAR model and its base, the mask rows' top-1 accuracy by offset, and
HumanEval pass@1 of both (``--humaneval`` problems, greedy, ``--gen-length`` tokens):
:func:`sar_main`.

**Any checkpoint directory** (``--model auto --weights DIR``, ``hf-directory`` the same; optional
``--gate NAME`` for that config's held-out modules): the family is read from the checkpoint
(:func:`models.registry.weights_family`). A LLaDA / Dream directory (or a diffusion jaxspec
checkpoint) gets the masked-diffusion figures above without the AR columns (no base model); an
XLNet directory (or a jaxspec XLNet file) the AS-ARM gate. A causal checkpoint is a one-line
error naming its family (no gate measures a plain causal model; the SAR gate takes presets).

Prints a table and writes JSON to ``--out``. Exit code 2 with one ``error:`` line on bad input.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from jaxspec.methods import methods_of

ROOT = Path(__file__).resolve().parent.parent


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m scripts.evaluate", description=__doc__.split("\n\n")[0].replace("\n", " ")
    )
    _add_target_args(ap)
    _add_diffusion_args(ap)
    _add_asarm_args(ap.add_argument_group("AS-ARM gate (objective.kind: asarm)"))
    return ap


def _add_target_args(ap: argparse.ArgumentParser) -> None:
    """What is gated: a trained config's name, or a checkpoint read by its family."""
    ap.add_argument(
        "--gate",
        default=None,
        help="trained model name (configs/train/<name>.yaml, "
        "checkpoints/<name>/delta.safetensors); with --model: the config whose "
        "held-out modules to use",
    )
    ap.add_argument(
        "--model",
        default=None,
        help="auto / hf-directory with --weights DIR (or a preset): gate a checkpoint "
        "by its family: masked diffusion (LLaDA / Dream) or AS-ARM (XLNet)",
    )


def _add_diffusion_args(ap: argparse.ArgumentParser) -> None:
    """The masked-diffusion, EOS and SAR gates: prompts, lengths, batch, output, rules."""
    ap.add_argument("--prompts", type=int, default=20, help="held-out snippets (default 20)")
    ap.add_argument(
        "--gen-prompts",
        type=int,
        default=None,
        help="how many of them get completions (default: all); masked accuracy "
        "always uses all --prompts",
    )
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--prompt-length", type=int, default=128)
    ap.add_argument("--block", type=int, default=8, help="block length (default 8)")
    ap.add_argument(
        "--batch",
        type=int,
        default=None,
        help="rows per forward / decode batch (default 4; AS-ARM gate 10)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--delta", default=None, help="override checkpoints/<gate>/delta.safetensors")
    ap.add_argument(
        "--out",
        default=None,
        help="JSON output path (AS-ARM gate: default gate.json next to the weights)",
    )
    ap.add_argument(
        "--eos-gate",
        action="store_true",
        help="masked diffusion: the EOS gate (answers end with EOS, no loop "
        "before it; the default for configs with data.source stdlib-sft or "
        "stdlib-sft+distill); use with --gen-length 256 --block 32 (and --block 8 for v3)",
    )
    ap.add_argument(
        "--gate-rule",
        choices=("auto", "v2", "v3"),
        default="auto",
        help="EOS gate: pass rule (jaxspec.eval.dllm_gate.GATE_RULES); auto = v3 for configs "
        "trained on self-distilled answers (data.source stdlib-sft+distill), else v2",
    )
    ap.add_argument(
        "--cache",
        default="dual",
        choices=("none", "prefix", "dual"),
        help="EOS gate: block cache of the stepwise completions (default dual)",
    )
    ap.add_argument(
        "--humaneval",
        type=int,
        default=20,
        help="SAR gate: HumanEval problems for pass@1 (default 20; 0 = skip)",
    )


def _add_asarm_args(g) -> None:
    """The AS-ARM gate: weights, sequences, masking, the infilling method and the judge."""
    g.add_argument(
        "--weights",
        default=None,
        help="AS-ARM .safetensors or XLNet directory "
        "(default checkpoints/<gate>/model.safetensors); with --model auto: any "
        "LLaDA / Dream / XLNet checkpoint directory",
    )
    g.add_argument("--sequences", type=int, default=20, help="held-out sequences (default 20)")
    g.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="tokens per sequence (default: the config's data.seq_len, else 256)",
    )
    g.add_argument("--mask-rate", type=float, default=0.95, help="share of positions infilled")
    asarm = methods_of("asarm")
    g.add_argument(
        "--method",
        default=asarm[0],
        choices=asarm,
        help=f"infilling method of the method registry: {', '.join(asarm)} (default "
        f"{asarm[0]}, the reference; the ASSD ones are lossless against it)",
    )
    g.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature of the gated run (default 1.0, the paper's)",
    )
    g.add_argument("--k", type=int, default=5, help="ASSD draft length (default 5)")
    g.add_argument("--no-greedy", action="store_true", help="skip the greedy run")
    g.add_argument(
        "--no-judge", action="store_true", help="skip generative perplexity (no SmolLM2-135M judge)"
    )
    g.add_argument("--samples", type=int, default=3, help="decoded samples kept in the JSON")


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def _objective_kind(cfg_path: Path) -> str:
    import yaml

    try:
        doc = yaml.safe_load(cfg_path.read_text()) or {}
        return str((doc.get("objective") or {}).get("kind") or "")
    except (OSError, yaml.YAMLError, AttributeError):
        return ""


def _fmt(x) -> str:
    if x is None:
        return "-"
    return f"{x:.4f}" if isinstance(x, float) else str(x)


class _Refused(Exception):
    """Bad input found while a gate loads: its one-line message is the ``error:`` line."""


@dataclass
class _AsarmInputs:
    """What the AS-ARM gate runs on: the loaded model (:func:`models.registry.load_asarm`),
    the held-out modules and windows (model ids), and the judge (None with ``--no-judge``)."""

    asarm: object
    seq_len: int
    holdout: list
    snips: list
    seqs: list
    judge: object


def _asarm_flag_error(args, weights: Path, batch: int) -> str | None:
    """The first bad AS-ARM gate flag as a one-line message, or None (checked before loading)."""
    if not weights.exists():
        return (
            f"AS-ARM weights not found: {weights} (export them with "
            f"jaxspec.training.asarm.export_checkpoint)"
        )
    for name, v in (("sequences", args.sequences), ("batch", batch), ("k", args.k)):
        if v < 1:
            return f"--{name} must be >= 1, got {v}"
    if args.samples < 0:
        return f"--samples must be >= 0, got {args.samples}"
    if not 0.0 < args.mask_rate < 1.0:
        return f"--mask-rate must be in (0, 1), got {args.mask_rate}"
    if not args.temperature >= 0:
        return f"--temperature must be >= 0, got {args.temperature}"
    return None


def _asarm_load(args, cfg_path, weights: Path, t_start: float, log) -> _AsarmInputs:
    """Load phase of the AS-ARM gate: the held-out modules and ``--seq-len`` (of the config,
    or the defaults without one), the model, ``--sequences`` held-out windows and the judge.

    Raises:
      _Refused: ``--seq-len`` < 2 or past the model's context, no held-out modules.
      QualityError / WeightFileError / ValueError / OSError / KeyError: from the loaders.
    """
    from jaxspec.eval import judge as judges
    from jaxspec.eval import quality as Q
    from jaxspec.training.config import load_config
    from models.registry import load_asarm

    if cfg_path is not None:
        cfg = load_config(cfg_path)
        seq_len = args.seq_len or int(getattr(cfg.data, "seq_len", 0) or 256)
        holdout = list(cfg.data.holdout)
    else:  # --model auto --weights DIR without --gate
        from jaxspec.bench.assd import DEFAULT_HOLDOUT

        seq_len, holdout = args.seq_len or 256, list(DEFAULT_HOLDOUT)
    if seq_len < 2:
        raise _Refused(f"--seq-len must be >= 2, got {seq_len}")
    if not holdout:
        raise _Refused(f"{cfg_path}: data.holdout is empty (no held-out modules to gate on)")
    asarm = load_asarm(str(weights), log=log)
    if asarm.max_len is not None and seq_len > asarm.max_len:
        raise _Refused(f"--seq-len {seq_len} exceeds the model's context {asarm.max_len}")
    snips = Q.heldout_snippets(
        asarm.tokenizer, holdout, args.sequences, prompt_len=seq_len - 1, cont_len=1
    )
    seqs = [asarm.to_model(s.tokens) for s in snips]
    judge = None if args.no_judge else judges.smollm2_judge(log)
    log(
        f"[evaluate] {len(seqs)} held-out sequences of {seq_len} tokens from "
        f"{len(set(s.source for s in snips))} files; loaded in "
        f"{time.perf_counter() - t_start:.1f}s"
    )
    return _AsarmInputs(asarm, seq_len, holdout, snips, seqs, judge)


def _asarm_run(args, inp: _AsarmInputs, batch: int, log):
    """Run phase of the AS-ARM gate: :func:`jaxspec.eval.quality.run_asarm_gate` on the
    windows, and the judge's perplexities of the true windows (None without a judge)."""
    from jaxspec.eval import quality as Q

    asarm = inp.asarm
    res = Q.run_asarm_gate(
        asarm.model,
        asarm.params,
        inp.seqs,
        to_external=asarm.to_external,
        judge=inp.judge,
        decode=asarm.decode,
        mask_rate=args.mask_rate,
        seed=args.seed,
        method=args.method,
        temperature=args.temperature,
        k=args.k,
        greedy=not args.no_greedy,
        batch=batch,
        max_len=asarm.max_len,
        samples=args.samples,
        log=log,
    )
    raw_ppl = inp.judge([s.tokens for s in inp.snips]) if inp.judge is not None else None
    return res, raw_ppl


def _asarm_result(args, weights: Path, inp: _AsarmInputs, res: dict, raw_ppl, t_start) -> dict:
    """The AS-ARM gate's JSON record: provenance, the gate's figures, wall time and table."""
    import jax

    from jaxspec.eval import quality as Q

    rel = lambda p: str(p.relative_to(ROOT) if p.resolve().is_relative_to(ROOT) else p)  # noqa: E731
    unk = [sum(1 for t in inp.asarm.to_external(s) if t < 0) / len(s) for s in inp.seqs]
    result = {
        "gate": args.gate or weights.name,
        "weights": rel(weights.resolve()),
        "meta": inp.asarm.meta,
        "python": platform.python_version(),
        "jax": jax.__version__,
        "device": str(jax.devices()[0]),
        "holdout": inp.holdout,
        "snippets": [{"source": s.source, "offset": s.offset} for s in inp.snips],
        "judge": None if inp.judge is None else "smollm2-135m-instruct",
        "true_unk_share": round(float(sum(unk) / len(unk)), 4),
        "true_raw_gen_ppl_geomean": None if raw_ppl is None else round(Q._geomean(raw_ppl), 4),
        **res,
    }
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    result["table_md"] = _asarm_table(result)
    return result


def _asarm_table(result: dict) -> str:
    """The markdown table of the AS-ARM gate's figures, one column per run."""
    labels = list(result["figures"])
    rows = (
        ("distinct_token_share", "distinct-token share (mean)"),
        ("repeated_ngram_rate", "repeated 4-gram rate (mean)"),
        ("longest_run", "longest run (max)"),
        ("entropy", "entropy of the infill, bits"),
        ("seq_entropy", "entropy of the sequence, bits (Eq. 22)"),
        ("gen_ppl_geomean", "gen. PPL, SmolLM2 (geo. mean)"),
        ("gen_ppl_median", "gen. PPL, SmolLM2 (median)"),
        ("degenerate_share", "degenerate infills (share)"),
    )
    lines = ["| figure | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for key, label in rows:
        lines.append(
            f"| {label} | " + " | ".join(_fmt(result["figures"][x][key]) for x in labels) + " |"
        )
    lines.append(
        "| NFE per token | - | "
        + " | ".join(_fmt(result["nfe_per_token"][x]) for x in labels[1:])
        + " |"
    )
    return "\n".join(lines)


def _asarm_report(args, result: dict, n_seqs: int, seq_len: int) -> None:
    """Print the AS-ARM gate's heading, table, checks and verdict."""
    print(
        f"gate {result['gate']}: {n_seqs} held-out sequences x {seq_len} tokens, "
        f"{args.mask_rate:.0%} masked, seed {args.seed}; figures on the masked positions, "
        f"PPL on whole sequences"
    )
    print(result["table_md"])
    for c in result["checks"]:
        tag = {True: "pass", False: "FAIL", None: "skip"}[c["passed"]]
        print(f"  [{tag}] {c['check']}: {c['text']}")
    if "greedy_verdict" in result:
        failed = [c["check"] for c in result["greedy_checks"] if c["passed"] is False]
        print(
            f"greedy (informational): {result['greedy_verdict']}"
            + (f" ({', '.join(failed)})" if failed else "")
        )
    failed = [c["check"] for c in result["checks"] if c["passed"] is False]
    print(
        f"verdict: {result['verdict']} on {result['gated_run']}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + f"; wall {result['wall_s']}s"
    )


def asarm_main(args, cfg_path) -> int:
    """``--gate`` of an AS-ARM config (module docstring), or of an XLNet checkpoint given with
    ``--model auto --weights PATH`` (``cfg_path`` None: the default held-out modules,
    :data:`jaxspec.bench.assd.DEFAULT_HOLDOUT`, and ``--seq-len`` or 256). Exit 0 after writing
    the JSON (PASS or FAIL: the verdict is in the output), 2 with one ``error:`` line on bad
    input."""
    weights = (
        Path(args.weights)
        if args.weights
        else ROOT / "checkpoints" / args.gate / "model.safetensors"
    )
    batch = 10 if args.batch is None else args.batch
    bad = _asarm_flag_error(args, weights, batch)
    if bad is not None:
        return _fail(bad)

    t_start = time.perf_counter()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    from jaxspec.bench.records import BenchError
    from jaxspec.eval import quality as Q
    from models.llama.params import WeightFileError

    try:
        inp = _asarm_load(args, cfg_path, weights, t_start, log)
        res, raw_ppl = _asarm_run(args, inp, batch, log)
    except _Refused as e:
        return _fail(str(e))
    except (Q.QualityError, BenchError, WeightFileError, ValueError, OSError, KeyError) as e:
        return _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)

    result = _asarm_result(args, weights, inp, res, raw_ppl, t_start)
    _asarm_report(args, result, len(inp.seqs), inp.seq_len)
    out = (
        Path(args.out)
        if args.out
        else (weights if weights.is_dir() else weights.parent) / "gate.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    log(f"[evaluate] wrote {out}")
    return 0


def sar_main(args, cfg_path: Path) -> int:
    """``--gate`` of a SPACE SAR-SFT config (``objective.kind: sar``): what SAR-SFT costs in
    quality and what it buys in drafting. On ``--prompts`` held-out stdlib windows of
    ``--prompt-length + --gen-length`` tokens: held-out AR loss (nats/token) of the SAR model
    and of its base model, and the SAR model's mask-row top-1 accuracy by offset (k of the
    config); HumanEval pass@1 of greedy raw-prompt completions (``--humaneval`` problems,
    ``--gen-length`` tokens, the project's sandbox) for both. Writes ``--out`` (default
    ``checkpoints/<gate>/quality.json``)."""
    from jaxspec.bench.machine import cpu_model
    from jaxspec.eval import quality as Q
    from jaxspec.eval.datasets import humaneval_problems
    from jaxspec.training.config import load_config
    from models.llama.params import WeightFileError
    from models.registry import PresetError, load_model

    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        cfg = load_config(cfg_path)
        sar, sar_params, tok, _ = load_model(args.gate, log=log)
        _, base_params, _, _ = load_model(cfg.model.preset, log=log)
        snips = Q.heldout_snippets(
            tok,
            cfg.data.holdout,
            args.prompts,
            prompt_len=args.prompt_length,
            cont_len=args.gen_length,
            drop_ids=[cfg.model.mask_token_id],
        )
    except (PresetError, WeightFileError, ValueError, OSError) as e:
        return _fail(str(e))
    rows = [s.tokens for s in snips]
    t0 = time.perf_counter()
    out = {
        "gate": args.gate,
        "machine": cpu_model(),
        "heldout_windows": len(rows),
        "window_tokens": len(rows[0]),
        "heldout_ar_loss_sar": Q.heldout_ar_loss(sar, sar_params, rows, args.batch),
        "heldout_ar_loss_base": Q.heldout_ar_loss(sar, base_params, rows, args.batch),
        "mask_row_accuracy_by_offset": Q.mask_row_accuracy(
            sar, sar_params, rows, cfg.objective.sar_k, seed=args.seed
        ),
    }
    probs = humaneval_problems()[: args.humaneval]
    if probs:
        out["humaneval_pass_at_1_sar"] = Q.humaneval_pass_at_1(
            sar, sar_params, tok, probs, args.gen_length
        )
        out["humaneval_pass_at_1_base"] = Q.humaneval_pass_at_1(
            sar, base_params, tok, probs, args.gen_length
        )
    out["seconds"] = round(time.perf_counter() - t0, 1)
    dest = Path(args.out) if args.out else ROOT / "checkpoints" / args.gate / "quality.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


def checkpoint_main(args) -> int:
    """``--model auto|hf-directory --weights DIR`` (or any preset with ``--model``): the gate of
    the checkpoint's family (:func:`models.registry.require_family`). A masked-diffusion
    checkpoint (LLaDA / Dream directory, diffusion jaxspec checkpoint) gets the diffusion
    figures of :func:`diffusion_gate` without the AR columns (there is no base model); an
    XLNet AS-ARM (HF directory or jaxspec file) the AS-ARM gate (:func:`asarm_main`). The
    held-out modules and sequence length come from ``configs/train/<--gate>.yaml`` when
    ``--gate`` is given, else :data:`jaxspec.bench.assd.DEFAULT_HOLDOUT`. A causal checkpoint
    is a one-line error (exit 2): no gate measures a plain causal model."""
    from models.llama.params import WeightFileError
    from models.registry import PresetError, require_family

    try:
        family = require_family(
            args.model,
            args.weights,
            ("dllm", "asarm"),
            "scripts.evaluate (the masked-diffusion and AS-ARM gates)",
        )
    except (PresetError, WeightFileError, ValueError) as e:
        return _fail(str(e))
    cfg_path = None
    if args.gate is not None:
        cfg_path = ROOT / "configs" / "train" / f"{args.gate}.yaml"
        if not cfg_path.is_file():
            return _fail(f"unknown gate {args.gate!r}: {cfg_path} not found")
    if family == "asarm":
        if args.weights is None:  # an asarm preset: its committed checkpoint
            from models.registry import get_preset

            args.weights = str(ROOT / get_preset(args.model).checkpoint)
        return asarm_main(args, cfg_path)
    if args.batch is None:
        args.batch = 4
    bad = _check_diffusion_args(args)
    if bad is not None:
        return bad
    from jaxspec.bench.assd import DEFAULT_HOLDOUT
    from jaxspec.training.config import load_config
    from models.registry import load_model

    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t_start = time.perf_counter()
    try:
        holdout = list(load_config(cfg_path).data.holdout) if cfg_path else list(DEFAULT_HOLDOUT)
        model, params, tok, _ = load_model(args.model, args.weights, log=lambda m: None)
    except (PresetError, WeightFileError, ValueError, OSError, KeyError) as e:
        return _fail(str(e))
    name = args.gate or Path(args.weights or args.model).name
    info = {"weights": str(args.weights or args.model), "head": model.config.head}
    if args.eos_gate:
        if args.out is None:
            return _fail("--eos-gate with --model needs --out PATH (no checkpoints/<gate> folder)")
        return eos_gate(
            args,
            name=name,
            model=model,
            params=params,
            tok=tok,
            holdout=holdout,
            info=info,
            causal=None,
            base=None,
            log=log,
        )
    return diffusion_gate(
        args,
        name=name,
        model=model,
        params=params,
        tok=tok,
        mask_id=int(model.config.mask_token_id),
        holdout=holdout,
        info=info,
        t_start=t_start,
        log=log,
    )


def _check_diffusion_args(args):
    """None, or the exit code of a one-line error for bad diffusion-gate flags."""
    for name in ("prompts", "gen_length", "prompt_length", "block", "batch"):
        if getattr(args, name) < 1:
            return _fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    gen_prompts = args.prompts if args.gen_prompts is None else args.gen_prompts
    if not 0 <= gen_prompts <= args.prompts:
        return _fail(f"--gen-prompts must be in [0, --prompts], got {gen_prompts}")
    if args.gen_length % args.block:
        return _fail(f"--gen-length {args.gen_length} is not a multiple of --block {args.block}")
    return None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from jaxspec.core.compile_cache import enable_persistent_cache

    enable_persistent_cache()  # compiled loops are reused by the next run (JAXSPEC_COMPILE_CACHE)
    if args.model is not None:
        return checkpoint_main(args)
    if args.gate is None:
        return _fail(
            "give --gate NAME (a trained model, configs/train/NAME.yaml) or --model "
            "auto --weights DIR (a checkpoint directory)"
        )
    cfg_path = ROOT / "configs" / "train" / f"{args.gate}.yaml"
    if cfg_path.is_file() and _objective_kind(cfg_path) == "asarm":
        return asarm_main(args, cfg_path)
    if cfg_path.is_file() and _objective_kind(cfg_path) == "sar":
        if args.batch is None:
            args.batch = 4
        return sar_main(args, cfg_path)
    if args.batch is None:
        args.batch = 4
    delta_path = (
        Path(args.delta) if args.delta else ROOT / "checkpoints" / args.gate / "delta.safetensors"
    )
    if not cfg_path.is_file():
        return _fail(f"unknown gate {args.gate!r}: {cfg_path} not found")
    if not delta_path.is_file():
        return _fail(f"delta not found: {delta_path}")
    bad = _check_diffusion_args(args)
    if bad is not None:
        return bad

    from jaxspec.training.config import load_config
    from models.diffusion.delta import load_delta, merge_delta
    from models.diffusion.modeling import DiffusionConfig, DiffusionLM
    from models.registry import load_model

    t_start = time.perf_counter()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        cfg = load_config(cfg_path)
        if cfg.model.init != "preset" or not cfg.model.preset:
            return _fail(f"{cfg_path}: only preset-initialised models can be gated")
        mask_id = int(cfg.model.mask_token_id)
        causal, base, tok, _ = load_model(cfg.model.preset, log=lambda m: None)
        delta, meta = load_delta(str(delta_path))
        params = merge_delta(
            base, delta, alpha=float(meta["alpha"]), rank=int(meta["rank"]), mask_token_id=mask_id
        )
        model = DiffusionLM(
            DiffusionConfig(base=causal.config, head=cfg.model.head, mask_token_id=mask_id)
        )
    except (ValueError, OSError, KeyError) as e:
        return _fail(str(e))
    info = {
        "delta": str(
            delta_path.relative_to(ROOT) if delta_path.is_relative_to(ROOT) else delta_path
        ),
        "base_preset": cfg.model.preset,
        "head": cfg.model.head,
    }
    if args.gate_rule == "auto":
        args.gate_rule = "v3" if "distill" in cfg.data.source else "v2"
    if args.eos_gate or cfg.data.source in ("stdlib-sft", "stdlib-sft+distill"):
        return eos_gate(
            args,
            name=args.gate,
            model=model,
            params=params,
            tok=tok,
            holdout=list(cfg.data.holdout),
            info=info,
            causal=causal,
            base=base,
            log=log,
        )
    return diffusion_gate(
        args,
        name=args.gate,
        model=model,
        params=params,
        tok=tok,
        mask_id=mask_id,
        holdout=list(cfg.data.holdout),
        info=info,
        causal=causal,
        base=base,
        base_name=cfg.model.preset,
        t_start=t_start,
        log=log,
    )


def eos_gate(args, *, name, model, params, tok, holdout, info: dict, causal, base, log) -> int:
    """The EOS gate (:func:`jaxspec.eval.dllm_gate.run_eos_gate`, rule ``--gate-rule``):
    greedy stepwise
    completions of ``--prompts`` held-out function prompts at ``--gen-length`` (256 for the
    gate) and ``--block`` (32), scored before the first EOS; masked accuracy; HumanEval pass@1
    of ``--humaneval`` problems, stepwise beside the base model's AR. Prints the checks and the
    verdict, writes ``--out``. Exit 0 (the verdict is in the output), 2 on bad input."""
    import jax

    from jaxspec.bench.machine import cpu_model
    from jaxspec.eval.dllm_gate import run_eos_gate

    rule = "v2" if args.gate_rule == "auto" else args.gate_rule
    try:
        res = run_eos_gate(
            model,
            params,
            tok,
            holdout,
            rule=rule,
            causal=causal,
            base=base,
            prompts=args.prompts,
            gen_length=args.gen_length,
            block_length=args.block,
            cache=args.cache,
            humaneval=args.humaneval,
            masked_rows=args.prompts,
            batch=args.batch,
            log=log,
        )
    except (ValueError, OSError, KeyError) as e:
        return _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    res = {
        "gate": name,
        **info,
        "python": platform.python_version(),
        "jax": jax.__version__,
        "cpu": cpu_model(),
        "holdout": holdout,
        **res,
    }
    f = res["completion_figures"]
    print(
        f"eos gate {name}: {res['settings']['prompts']} held-out function prompts, gen "
        f"{args.gen_length}, block {args.block}, cache {args.cache}, greedy stepwise, "
        f"rule {rule}"
    )
    print(
        f"  answer tokens (before EOS) {f['answer_tokens']:.1f}, EOS positions "
        f"{f['eos_share']:.3f}, longest run {f['longest_run']:.1f}"
    )
    for c in res["checks"]:
        print(
            f"  [{'pass' if c['passed'] else 'FAIL'}] {c['check']}: {c['value']:.3f} "
            f"(bound {c['bound']})"
        )
    if "answer_length" in res:
        a = res["answer_length"]
        print(f"  median answer tokens {a['median']:.1f} (base AR {a['ar_median']:.1f})")
        f_ar = a["ar_completion_figures"]
        print(
            f"  base AR on the same prompts: repeated 4-gram rate "
            f"{f_ar['repeated_ngram_rate']:.3f}, distinct share "
            f"{f_ar['distinct_token_share']:.3f}, ending with EOS {f_ar['ends_with_eos']:.3f}"
        )
    for k, v in (res.get("masked_accuracy") or {}).items():
        print(f"  masked accuracy at {float(k):.0%}: {v:.4f}")
    for k, v in (res.get("humaneval") or {}).items():
        print(f"  HumanEval pass@1 {k}: {v['passed']}/{v['problems']}")
    print(f"verdict: {res['verdict']}; wall {res['wall_s']}s")
    out = Path(args.out) if args.out else ROOT / "checkpoints" / name / "eos-gate.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    log(f"[evaluate] wrote {out}")
    return 0


@dataclass
class _Completions:
    """Greedy completions of the diffusion gate: token rows of the diffusion model and of the
    AR base model (empty without one), and the seconds each took."""

    diffusion: list
    ar: list
    diffusion_s: float
    ar_s: float


def _gate_snippets(args, tok, holdout, mask_id: int) -> list:
    """``--prompts`` held-out windows (prompt + true continuation), with no special token
    (``<...>`` among the first 64 ids) and no mask id in them.

    Raises:
      ValueError / OSError / KeyError: too few held-out windows, unreadable modules.
    """
    from jaxspec.eval import quality as Q

    specials = [
        i
        for i in range(min(tok.vocab_size, 64))
        if (t := tok.id_to_token(i)) and t.startswith("<") and t.endswith(">")
    ]
    return Q.heldout_snippets(
        tok,
        holdout,
        args.prompts,
        prompt_len=args.prompt_length,
        cont_len=args.gen_length,
        drop_ids=set(specials) | {mask_id},
    )


def _masked_figures(args, model, params, rows, causal, base, log) -> dict:
    """Masked-token top-1 accuracy at 15% and 50% masking, beside the AR base model's
    next-token accuracy at the same positions (None without a base model)."""
    from jaxspec.eval import quality as Q

    masked = {}
    for rate in (0.15, 0.5):
        t0 = time.perf_counter()
        d, masks = Q.masked_accuracy(
            model, params, rows, rate, seed=args.seed, batch_size=args.batch, return_masks=True
        )
        a = (
            None
            if causal is None
            else Q.causal_accuracy_at(causal, base, rows, masks, batch_size=args.batch)
        )
        masked[f"{rate:.2f}"] = {"diffusion": d, "ar_next_token_same_positions": a}
        log(
            f"[evaluate] masked {rate:.0%}: diffusion {d['accuracy']:.4f}"
            + ("" if a is None else f", AR next-token {a['accuracy']:.4f}")
            + f" ({d['masked']} positions, {time.perf_counter() - t0:.1f}s)"
        )
    return masked


def _gate_decode_config(args, mask_id: int):
    """The gate's diffusion decode: greedy stepwise (one token per step), low_confidence."""
    from jaxspec.dllm import DiffusionDecodeConfig

    return DiffusionDecodeConfig(
        gen_length=args.gen_length,
        block_length=args.block,
        steps=args.gen_length,
        remasking="low_confidence",
        temperature=0.0,
        mask_id=mask_id,
    )


def _gate_completions(args, model, params, prompts, dcfg, causal, base, log) -> _Completions:
    """Greedy completions of ``prompts`` in batches of ``--batch``: the diffusion model's
    (``dcfg``) and, with a base model, its AR ones of ``--gen-length`` tokens.

    Raises:
      ValueError: a prompt plus the gen length past the context (DecodeInputError).
    """
    import numpy as np

    from jaxspec.causal.decode import generate
    from jaxspec.dllm import diffusion_generate

    c = _Completions([], [], 0.0, 0.0)
    for s in range(0, len(prompts), args.batch):
        t0 = time.perf_counter()
        r = diffusion_generate(model, params, prompts[s : s + args.batch], dcfg, seed=args.seed)
        c.diffusion += [[int(t) for t in row] for row in np.asarray(r.full_tokens)]
        c.diffusion_s += time.perf_counter() - t0
        if causal is not None:
            t0 = time.perf_counter()
            g = generate(
                causal,
                base,
                prompts[s : s + args.batch],
                max_new_tokens=args.gen_length,
                seed=args.seed,
            )
            c.ar += [list(map(int, row)) for row in g.tokens]
            c.ar_s += time.perf_counter() - t0
        log(
            f"[evaluate] completions {min(s + args.batch, len(prompts))}/{len(prompts)} "
            f"(diffusion {c.diffusion_s:.0f}s"
            + ("" if causal is None else f", AR {c.ar_s:.0f}s")
            + " so far)"
        )
    return c


def _gate_record(args, *, name, info, mask_id, holdout, snippets, masked, dcfg, ar, n_gen):
    """The head of the diffusion gate's JSON record: provenance, settings, masked accuracy."""
    import jax

    return {
        "gate": name,
        **info,
        "mask_token_id": mask_id,
        "python": platform.python_version(),
        "jax": jax.__version__,
        "device": str(jax.devices()[0]),
        "holdout": list(holdout),
        "snippets": [{"source": s.source, "offset": s.offset} for s in snippets],
        "prompt_length": args.prompt_length,
        "gen_length": args.gen_length,
        "seed": args.seed,
        "masked_accuracy": masked,
        "decode": {
            "diffusion": {
                "gen_length": dcfg.gen_length,
                "block_length": dcfg.block_length,
                "steps": dcfg.steps,
                "remasking": dcfg.remasking,
                "temperature": dcfg.temperature,
                "eos_cut": False,
            },
            "ar": None
            if not ar
            else {"greedy": True, "max_new_tokens": args.gen_length, "eos_ids": []},
        },
        "completion_prompts": n_gen,
    }


def _gate_verdict(result: dict, comp: _Completions, targets, ar: bool):
    """Add the completion figures, samples and verdict to ``result`` (NOT MEASURED without
    completions); returns the diffusion and AR figures (None where not measured)."""
    from jaxspec.eval import quality as Q

    if not targets:
        result["verdict"] = "NOT MEASURED (no completions)"
        return None, None
    dfig = Q.completion_figures(comp.diffusion, targets)
    afig = Q.completion_figures(comp.ar, targets) if ar else None
    result["completions"] = {
        "diffusion": dfig,
        "ar": afig,
        "diffusion_s": round(comp.diffusion_s, 1),
        "ar_s": None if not ar else round(comp.ar_s, 1),
    }
    result["samples"] = {"diffusion": comp.diffusion, "ar": comp.ar if ar else None}
    result["verdict"] = "FAIL" if dfig["degenerate_share"] > 0 else "PASS"
    return dfig, afig


def _gate_table(name, base_name, masked: dict, dfig, afig, ar: bool) -> str:
    """The markdown table of the diffusion gate: the model's column and, with ``ar``, the
    base model's (``dfig`` None: masked accuracy only)."""

    def f(x):
        return f"{x:.4f}" if isinstance(x, float) else str(x)

    lines = [
        f"| figure | {name} |" + (f" {base_name} (AR) |" if ar else ""),
        "|---|---|" + ("---|" if ar else ""),
    ]
    for k, v in masked.items():
        lines.append(
            f"| masked acc. {float(k):.0%} | {f(v['diffusion']['accuracy'])} |"
            + (
                f" {f(v['ar_next_token_same_positions']['accuracy'])} (next-token, same "
                f"positions) |"
                if ar
                else ""
            )
        )
    if dfig is not None:
        for key, label in (
            ("distinct_token_share", "distinct-token share"),
            ("repeated_ngram_rate", "repeated 4-gram rate"),
            ("continuation_match", "continuation match"),
            ("longest_run", "longest run (max)"),
            ("degenerate_share", "degenerate completions"),
        ):
            lines.append(f"| {label} | {f(dfig[key])} |" + (f" {f(afig[key])} |" if ar else ""))
    return "\n".join(lines)


def diffusion_gate(
    args,
    *,
    name,
    model,
    params,
    tok,
    mask_id: int,
    holdout,
    info: dict,
    causal=None,
    base=None,
    base_name=None,
    t_start: float,
    log,
) -> int:
    """The masked-diffusion figures (module docstring) of ``model`` / ``params`` (a
    :class:`models.diffusion.modeling.DiffusionLM`) on ``--prompts`` held-out windows of the
    stdlib modules ``holdout``; with ``causal`` / ``base`` (the AR base model and its params)
    also the AR columns. Prints the table and the verdict, writes ``--out``; exit 0, or 2 with
    one ``error:`` line on bad input (too few held-out windows, prompts past the context)."""
    gen_prompts = args.prompts if args.gen_prompts is None else args.gen_prompts
    try:
        snippets = _gate_snippets(args, tok, holdout, mask_id)
    except (ValueError, OSError, KeyError) as e:
        return _fail(str(e))
    log(
        f"[evaluate] {len(snippets)} snippets from "
        f"{len(set(s.source for s in snippets))} held-out files; loaded in "
        f"{time.perf_counter() - t_start:.1f}s"
    )
    gen = snippets[:gen_prompts]
    try:
        masked = _masked_figures(
            args, model, params, [s.tokens for s in snippets], causal, base, log
        )
        dcfg = _gate_decode_config(args, mask_id)
        comp = _gate_completions(
            args, model, params, [s.prompt for s in gen], dcfg, causal, base, log
        )
    except ValueError as e:  # DecodeInputError: prompt + gen length past the context
        return _fail(str(e))

    ar = causal is not None
    result = _gate_record(
        args,
        name=name,
        info=info,
        mask_id=mask_id,
        holdout=holdout,
        snippets=snippets,
        masked=masked,
        dcfg=dcfg,
        ar=ar,
        n_gen=len(gen),
    )
    dfig, afig = _gate_verdict(result, comp, [s.target for s in gen], ar)
    result["rule"] = (
        "FAIL if any diffusion completion is degenerate (one token > 50% of its "
        "gen_length tokens); otherwise PASS"
    )
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    result["table_md"] = _gate_table(name, base_name, masked, dfig, afig, ar)
    print(result["table_md"])
    print(f"verdict: {result['verdict']} ({result['rule']}); wall {result['wall_s']}s")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        log(f"[evaluate] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
