"""Generate text with a causal LM (autoregressive or lossless speculative decoding) or a
masked-diffusion LM (stepwise, fixed-k or threshold unmasking).

    python -m scripts.generate --model smollm2-135m-instruct --method ngram \
        [--prompt TEXT] [--max-new-tokens N] [--temperature T] [--top-p P] [--top-k K] \
        [--seed S] [--draft-length K] [--fallback none|bigram] [--gate off|auto|COST] [--chat] [--weights PATH]
        [--dtype auto|float32|bfloat16] [--quant none|int8] [--compare]

``--quant int8`` decodes with weight-only int8 projection matrices (:mod:`models.quant`); the
``--compare`` reference is AR decoding of the same int8 model (losslessness is measured in the
same quantization; the drift from float32 is what ``jaxspec/ar-int8`` in the ``ar`` benchmark
reports).

``--method sps --draft-model NAME [--draft-weights PATH] [--draft-length K (default 5)]``
runs draft-model speculative sampling (:mod:`jaxspec.causal.sps`); the draft model must share
the target's tokenizer (e.g. ``--model qwen2.5-coder-1.5b-instruct --draft-model
qwen2.5-coder-0.5b-instruct``).
``--method diffuspec --draft-model dream-smollm2-135m [--draft-length K_MAX (default 30)]
[--k-min 20] [--refine-steps S] [--no-cps] [--no-adl]``
runs DiffuSpec (:mod:`jaxspec.causal.diffuspec`: one diffusion-LM forward drafts a block, CPS
with a 3-gram proxy fitted on the tokenized stdlib, ADL; exact under sampling through
point-mass verification); ``--method specdiff`` is its argmax, fixed-length baseline.
``--method space [--mask-groups K (default 5)] [--space-sampling exact|paper]`` runs SPACE
auto-correct decoding (:mod:`jaxspec.causal.space`) on a SAR-SFT model
(``--model smollm2-135m-space``); ``paper`` is the paper's approximate sampling rule.

With no ``--prompt`` the first ``--limit`` HumanEval prompts are used. Prints each output
and one stats line (NFE, MAT, acceptance, tokens/s, compile time, degeneracy figures).
``--compare`` also runs the AR reference on the same prompts and reports whether the
outputs are identical (greedy) and the wall-clock speedup.

Masked-diffusion presets (``dream-smollm2-135m``) use the diffusion decoder
(:func:`jaxspec.dllm.decode.diffusion_generate`):

    python -m scripts.generate --model dream-smollm2-135m --method stepwise \
        [--gen-length 64] [--block-length 8] [--steps N (default: gen length)] \
        [--remasking low_confidence|random|origin|maskgit_plus|topk_margin|entropy] \
        [--tokens-per-step K | --threshold T] [--cache none|prefix|dual] \
        [--temperature T] [--top-k K] [--top-p P] [--alg-temp A] [--seed S] [--compare]

``--method ssd [--draft-length N (default 3)] [--tree chain|mix-order]`` runs SSD
(:mod:`jaxspec.dllm.ssd`), lossless against one-token-per-step stepwise decoding with the same cache
policy (``--cache none|dual``); with ``--compare`` a greedy mismatch exits with code 1.
``--method spiffy [--graph PATH]`` runs Spiffy (:mod:`jaxspec.dllm.spiffy`) with a calibrated draft
graph (default ``configs/graphs/dream-smollm2-135m/D10.json``, made by ``scripts.calibrate``);
it is lossless against the decoder it accelerates: stepwise (any ``--steps``), or with
``--tokens-per-step K`` / ``--threshold T`` the fixed-k / threshold decoder (``--compare`` runs
exactly that reference; a greedy mismatch exits with code 1).
``--tokens-per-step K`` selects fixed-k parallel decoding and ``--threshold T`` Fast-dLLM
threshold decoding (``--method fixed-k`` / ``--method threshold`` name them explicitly and
require the flag). ``--cache`` selects a Fast-dLLM KV cache (approximate; each cache policy
is its own reference). ``--compare`` also runs the one-token-per-step stepwise reference
(``steps = gen length``, same remasking rule, temperature, cache policy and seed) and reports whether the
outputs are identical; parallel decoding is not lossless, so a difference is reported, not
an error. Without ``--method`` a causal model uses ``ngram`` and a diffusion model ``stepwise``.

AS-ARM (XLNet) infilling with ``asarm-small`` (:mod:`jaxspec.asarm.assd`, :mod:`jaxspec.asarm.infill`):

    python -m scripts.generate --model asarm-small --method assd|assd-ngram|sequential \
        --infill "def add(a, b):\\n    <mask:8>\\n" [--draft-length K] [--temperature T] [--compare]

``<mask:N>`` writes N masked tokens inline (``\\n``, ``\\t`` and ``\\\\`` typed in the template are
expanded); the output is the infilled text and a stats line.

Exit code 2 with a one-line ``error:`` message on bad input (unknown model or method,
a diffusion method with a causal model or ar/ngram with a diffusion model, prompt longer than
the context, draft length < 1, temperature < 0, top-p outside (0, 1], invalid diffusion
lengths/steps/remasking, corrupt or missing weight files).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from jaxspec.methods import DEFAULT_GRAPH, METHODS, methods_of
from scripts.common import compare_line

CAUSAL_METHODS = methods_of("causal")
DIFFUSION_METHODS = methods_of("dllm")
ASARM_METHODS = methods_of("asarm")
FAMILY_WORDS = {"causal": "causal", "dllm": "masked-diffusion", "asarm": "any-order (XLNet AS-ARM)"}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m scripts.generate", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="model preset name")
    ap.add_argument("--weights", default=None, help="GGUF file or HF directory (overrides the preset)")
    ap.add_argument("--dtype", default="auto", help="parameter / activation dtype: auto "
                    "(float32 on CPU, bfloat16 on GPU/TPU), float32 or bfloat16; the draft "
                    "model and the --compare reference use the same")
    ap.add_argument("--quant", default="none", help="weight-only quantization: none or int8 "
                    "(per-output-channel int8 projection matrices, models.quant; activations "
                    "and KV caches stay in --dtype; Llama / Qwen2-layout models). The draft "
                    "model and the --compare reference use the same, so --compare checks "
                    "losslessness against AR of the int8 model")
    ap.add_argument("--mesh", default=None, metavar="DATAxMODEL",
                    help="shard the model over a DATAxMODEL device mesh (e.g. 1x8: weights split "
                         "over 8 devices; 2x4: also the batch over 2): models.sharding")
    ap.add_argument("--method", default=None,
                    help=f"decoding method: {', '.join(METHODS)} (default: ngram for causal "
                         f"models, stepwise for diffusion models)")
    ap.add_argument("--prompt", action="append", default=None,
                    help="prompt text (repeat for a batch); default: HumanEval prompts")
    ap.add_argument("--limit", type=int, default=1, help="number of HumanEval prompts when no --prompt")
    ap.add_argument("--start", type=int, default=0, help="first HumanEval problem index")
    ap.add_argument("--chat", action="store_true", help="wrap prompts in the model's chat template")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-k", type=int, default=0, help="0 = off")
    ap.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--draft-length", type=int, default=None,
                    help="k, draft tokens per step (default 8 for ngram, 3 for ssd)")
    ap.add_argument("--max-ngram", type=int, default=3, help="longest suffix the n-gram drafter matches")
    ap.add_argument("--min-ngram", type=int, default=2, help="shortest suffix before the bigram fallback")
    ap.add_argument("--draft-model", default=None,
                    help="sps: the draft model preset (a causal model with the target's "
                         "tokenizer, e.g. qwen2.5-coder-0.5b-instruct for the 1.5b target)")
    ap.add_argument("--draft-weights", default=None,
                    help="sps: GGUF file or HF directory of the draft model (overrides its preset)")
    ap.add_argument("--k-min", type=int, default=20,
                    help="diffuspec: ADL's shortest draft (default 20; --draft-length is k_max)")
    ap.add_argument("--refine-steps", type=int, default=1,
                    help="diffuspec / specdiff: drafter refinement steps S per draft (default 1)")
    ap.add_argument("--no-cps", action="store_true",
                    help="diffuspec: argmax drafts instead of the CPS path search (Table 2 ablation)")
    ap.add_argument("--no-adl", action="store_true",
                    help="diffuspec: fixed draft length k_max instead of ADL (Table 2 ablation)")
    ap.add_argument("--drafter-cache", choices=("none", "prefix"), default="none",
                    help="diffuspec / specdiff: 'prefix' keeps the drafter's context keys / values "
                         "(Fast-dLLM prefix cache; each drafter forward runs 2 k_max + 2 slots, "
                         "drafts change, output does not); same vocabulary only")
    ap.add_argument("--mask-groups", type=int, default=5,
                    help="space: k, candidates per step = [MASK] tokens per group (default 5)")
    ap.add_argument("--space-sampling", choices=("exact", "paper"), default="exact",
                    help="space: 'exact' resamples the residual (lossless); 'paper' draws the "
                         "extra token from p as Algorithm 1 line 18 does (approximate)")
    ap.add_argument("--fallback", choices=("none", "bigram"), default="none",
                    help="when no suffix matches: 'none' runs a plain AR step, 'bigram' drafts "
                         "from the ASSD Eq. 23 context bigram model")
    ap.add_argument("--gate", default="off",
                    help="ngram: verify drafts only while their expected accepted length pays "
                         "for the verification pass: off (default), auto (the pass cost "
                         "measured on the CPU; off on GPU/TPU) or the pass cost in one-token "
                         "steps (lossless either way)")
    dg = ap.add_argument_group("masked-diffusion decoding (diffusion models only)")
    dg.add_argument("--gen-length", type=int, default=64, help="generated positions")
    dg.add_argument("--block-length", type=int, default=8, help="semi-autoregressive block size")
    dg.add_argument("--steps", type=int, default=None, help="stepwise steps (default: gen length)")
    dg.add_argument("--remasking", default="low_confidence",
                    help="low_confidence, random, origin, maskgit_plus, topk_margin or entropy")
    dg.add_argument("--tokens-per-step", type=int, default=None, help="fixed-k: K tokens per step")
    dg.add_argument("--threshold", type=float, default=None,
                    help="threshold: unmask every position with confidence >= T (at least one)")
    dg.add_argument("--cache", choices=("none", "prefix", "dual", "content"), default="none",
                    help="Fast-dLLM KV cache prefix | dual (approximate; --compare uses the same "
                         "policy); content: the AS-ARM content-stream cache (--infill)")
    dg.add_argument("--tree", choices=("chain", "mix-order"), default="chain",
                    help="ssd verification tree: greedy chain (N+1 nodes) or mix-order (2N)")
    dg.add_argument("--graph", default=None,
                    help=f"spiffy draft graph JSON (default {DEFAULT_GRAPH})")
    dg.add_argument("--alg-temp", type=float, default=0.0,
                    help="Dream's alg_temp: sample the unmasked positions from "
                         "softmax(confidence / alg_temp) (0 = most confident first)")
    dg.add_argument("--confidence-softmax", choices=("official", "renormalized"),
                    default="official",
                    help="official: the [MASK] logit stays in the confidence softmax (LLaDA, "
                         "Fast-dLLM, Dream); renormalized: it is dropped (p / (1 - p_mask))")
    ag = ap.add_argument_group("AS-ARM infilling (XLNet checkpoints, e.g. --model asarm-small)")
    ag.add_argument("--infill", default=None,
                    help="template with <mask:N> spans; \\n, \\t, \\\\ are expanded (methods "
                         "sequential, assd, assd-ngram, assd-fused, assd-fused-ngram; k = "
                         "--draft-length, default 5)")
    ag.add_argument("--epsilon", type=float, default=0.0,
                    help="ASSD acceptance tolerance (Appendix F.5; > 0 is NOT lossless)")
    ag.add_argument("--suppress-unk", action="store_true",
                    help="never generate the AS-ARM's UNK id (the reference --compare runs "
                         "suppresses it too)")
    ap.add_argument("--compare", action="store_true",
                    help="also run the reference (AR, or one-token-per-step stepwise) and check "
                         "identity / speedup")
    ap.add_argument("--quiet", action="store_true", help="print only the stats lines")
    return ap


def stats_line(label, res, degen) -> str:
    s = res.stats
    acc = "-" if s.draft_length == 0 else f"{s.acceptance_rate:.3f}"
    return (f"[{label}] tokens={int(s.new_tokens.sum())} NFE={int(s.target_nfe.sum())} "
            f"MAT={s.mat:.2f} acceptance={acc} tokens/s={res.tokens_per_s:.1f} "
            f"run={res.run_s:.2f}s compile={res.compile_s:.1f}s "
            f"distinct={degen['distinct_token_share']:.2f} rep4={degen['repeated_ngram_rate']:.2f}"
            + tuning_note(getattr(res, "settings", {})))


def tuning_note(settings: dict) -> str:
    """The per-machine choices of a speculative decode (verification layout, the layout of
    its one-token steps, gate cost)."""
    out = f" verify-layout={settings['verify_layout']}" if "verify_layout" in settings else ""
    if settings.get("step_layout", settings.get("verify_layout")) != settings.get("verify_layout"):
        out += f" step-layout={settings['step_layout']}"
    if "verify_cost" in settings:
        out += f" gate-cost={settings['verify_cost']:.2f}"
    return out


def diffusion_stats_line(label, res, degen) -> str:
    s = res.stats
    toks = int(s.new_tokens.sum())
    return (f"[{label}] tokens={toks} gen={int(res.full_tokens.size)} NFE={int(s.target_nfe.sum())} "
            f"tokens/NFE={res.full_tokens.size / max(int(s.target_nfe.sum()), 1):.2f} "
            f"tokens/s={toks / max(res.run_s, 1e-9):.1f} run={res.run_s:.2f}s "
            f"compile={res.compile_s:.1f}s "
            f"distinct={degen['distinct_token_share']:.2f} rep4={degen['repeated_ngram_rate']:.2f}")


def _options(args, draft=None):
    """The :class:`jaxspec.methods.DecodeOptions` of the command line (``draft``: the fields
    of ``--draft-model``, :func:`_draft_options`)."""
    from jaxspec.methods import DecodeOptions

    return DecodeOptions(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, draft_length=args.draft_length, max_ngram=args.max_ngram,
        min_ngram=args.min_ngram, fallback=args.fallback, gate=args.gate, gen_length=args.gen_length,
        block_length=args.block_length, steps=args.steps, remasking=args.remasking,
        tokens_per_step=args.tokens_per_step, threshold=args.threshold, cache=args.cache,
        alg_temp=args.alg_temp, confidence_softmax=args.confidence_softmax, tree=args.tree, graph=args.graph, epsilon=args.epsilon,
        mask_groups=args.mask_groups, space_sampling=args.space_sampling, k_min=args.k_min,
        refine_steps=args.refine_steps, cps=not args.no_cps, adl=not args.no_adl,
        drafter_cache=args.drafter_cache, **(draft or {}))


def _check_method(args, preset):
    """The registry entry to run for ``preset`` (resolving the default); ValueError naming
    the problem when the method does not fit the model or its flags."""
    from models.registry import family_of

    family = family_of(preset, args.weights)  # hf-directory: what the weights hold
    who = repr(args.weights if preset.format == "hf_dir" and args.weights else preset.name)
    if family == "asarm":
        if args.method in METHODS:  # a causal / dLLM method (AS-ARM ones went to --infill)
            raise ValueError(f"method {args.method!r} needs a "
                             f"{FAMILY_WORDS[METHODS[args.method].family]} model, but {who} is "
                             f"{FAMILY_WORDS[family]}; use --method {', '.join(ASARM_METHODS)} "
                             f"with --infill TEMPLATE")
        raise ValueError(f"{who} is an {FAMILY_WORDS[family]} model: give a template "
                         f"with --infill (methods {', '.join(ASARM_METHODS)})")
    name = args.method or ("ngram" if family == "causal" else "fixed-k" if args.tokens_per_step
                           is not None else "threshold" if args.threshold is not None
                           else "stepwise")
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(METHODS)}")
    method = METHODS[name]
    if method.family != family:
        fits = ", ".join(methods_of(family))
        raise ValueError(f"method {name!r} needs a {FAMILY_WORDS[method.family]} model, but "
                         f"{who} is {FAMILY_WORDS[family]}; use --method {fits}")
    if name != "spiffy" and args.graph is not None:
        raise ValueError("--graph only applies to --method spiffy")
    drafted = {"sps": "causal", "diffuspec": "dllm", "specdiff": "dllm"}
    if name not in drafted and (args.draft_model or args.draft_weights):
        raise ValueError("--draft-model / --draft-weights only apply to --method "
                         + " / ".join(drafted))
    if name in drafted and not args.draft_model:
        raise ValueError(f"method {name!r} needs --draft-model NAME (a "
                         f"{FAMILY_WORDS[drafted[name]]} model with the target's tokenizer)")
    if name in drafted:
        from models.registry import family_of, get_preset

        dfam = family_of(get_preset(args.draft_model), args.draft_weights)
        if dfam != drafted[name]:
            raise ValueError(f"--draft-model {args.draft_model!r} is not a "
                             f"{FAMILY_WORDS[drafted[name]]} model (method {name!r} needs one)")
    if args.cache == "content":
        raise ValueError("--cache content is the AS-ARM content-stream cache (--infill); "
                         "masked-diffusion methods take --cache none|prefix|dual")
    if family == "causal":
        used = [f for f, v in (("--tokens-per-step", args.tokens_per_step),
                               ("--threshold", args.threshold), ("--steps", args.steps),
                               ("--cache", None if args.cache == "none" else args.cache),
                               ("--alg-temp", args.alg_temp or None),
                               ("--confidence-softmax", None if args.confidence_softmax == "official"
                                else args.confidence_softmax)) if v is not None]
        if used:
            raise ValueError(f"{', '.join(used)} only apply to masked-diffusion methods")
    return method


def _mesh(args):
    """The ``--mesh`` device mesh (None without it); MeshError (a ValueError) when bad."""
    if not args.mesh:
        return None
    from models.sharding import make_mesh

    return make_mesh(args.mesh)


def _output_major(method) -> bool:
    """The layout the target's weights are split in on a GPU: output-major for AR and for an
    output-major verification layout, else stored (input-major)."""
    from jaxspec.core.runtime import resolve_verify_layout

    return method.name == "ar" or resolve_verify_layout() == "output-major"


def _draft_options(args, tok) -> dict:
    """The :class:`~jaxspec.methods.DecodeOptions` fields of ``--draft-model`` (empty without
    it): ``draft_model`` for SPS; ``dllm_drafter``, the 3-gram ``proxy`` (fitted on the
    tokenized stdlib, cached), ``eos_id`` and, for a drafter of another vocabulary, the
    ``vocab_adapter`` for DiffuSpec / SpecDiff. ValueError when an SPS draft model's
    tokenizer differs from the target's ``tok``."""
    if not args.draft_model:
        return {}
    from jaxspec.core.runtime import decode_layout_in_place
    from models.registry import load_model

    dmodel, dparams, dtok, _ = load_model(args.draft_model, args.draft_weights,
                                          dtype=args.dtype, mesh=_mesh(args), quant=args.quant)
    # one copy on a GPU; an SPS draft model drafts in one-token steps: the AR layout
    dparams = decode_layout_in_place(dparams, output_major=args.method == "sps")
    if args.method == "sps":
        if not tok.same_vocabulary(dtok):
            raise ValueError(f"draft model {args.draft_model!r} has a different tokenizer than "
                             f"the target {args.model!r} ({dtok.vocab_size} vs {tok.vocab_size} "
                             f"ids): sps needs the same vocabulary (diffuspec translates drafts "
                             f"between vocabularies; sps does not)")
        return {"draft_model": (dmodel, dparams)}
    from jaxspec.bench.diffuspec import diffuspec_drafter_options

    # another vocabulary: drafts are translated through text (jaxspec.causal.hetero)
    return diffuspec_drafter_options((dmodel, dparams), dtok, tok)


def _texts(args, tok):
    from jaxspec.eval.datasets import humaneval_problems, humaneval_prompt

    if args.prompt:
        return [tok.apply_chat_template([{"role": "user", "content": p}]) if args.chat else p
                for p in args.prompt]
    probs = humaneval_problems()[args.start:args.start + args.limit]
    return [humaneval_prompt(p, tok, args.chat) for p in probs]


def _print_outputs(args, texts, rows, tok) -> None:
    if args.quiet:
        return
    for text, out in zip(texts, rows):
        print("=" * 80)
        print(text + "\033[1m" + tok.decode(out) + "\033[0m" if sys.stdout.isatty()
              else text + tok.decode(out))
    print("=" * 80)


def _method_lines(method, res) -> list[str]:
    """Method-specific stats lines (SSD tree, Spiffy graph)."""
    s = res.stats
    if method.name == "ssd":
        return [f"[ssd] draft_length={s.draft_length} tree={s.extra['tree']} "
                f"nodes={s.extra['nodes']} step_reduction={s.extra['step_reduction']:.3f} "
                f"acceptance={s.acceptance_rate:.3f} accept_hist={s.accept_hist.sum(0).tolist()}"]
    if method.name == "spiffy":
        return [f"[spiffy] D={s.extra['graph_D']} unmasking={s.extra['unmasking']} "
                f"reference_nfe={int(s.steps.sum())} nfe_speedup={s.extra['nfe_speedup']:.2f}x "
                f"steps_per_forward_hist={s.accept_hist.sum(0).tolist()}"]
    return []


def _same(family: str, res, ref) -> bool:
    if family == "dllm":
        return bool(np.array_equal(ref.full_tokens, res.full_tokens))
    return ref.tokens == res.tokens


def _reference_label(method, ref_cfg) -> str:
    """How ``--compare`` names the reference decoder."""
    if method.family == "causal":
        return "ar"
    steps = ref_cfg.steps if ref_cfg.method == "stepwise" else "-"
    if method.name == "spiffy":
        return f"its reference, {ref_cfg.method} (steps={steps}, cache={ref_cfg.cache})"
    return f"one-token-per-step stepwise (cache={ref_cfg.cache})"


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from jaxspec.core.runtime import enable_persistent_cache

    enable_persistent_cache()  # compiled loops are reused by the next run (JAXSPEC_COMPILE_CACHE)
    if args.infill is not None or args.method in ASARM_METHODS:
        if args.quant != "none":
            print(f"error: --quant {args.quant} applies to Llama / Qwen2-layout models (causal "
                  f"and masked-diffusion), not to AS-ARM infilling", file=sys.stderr)
            return 2
        from scripts.infill import infill_cli

        return infill_cli(args)
    from jaxspec.core.batching import DecodeInputError
    from jaxspec.core.runtime import decode_layout_in_place
    from jaxspec.eval.metrics import mean_degeneracy
    from jaxspec.methods import reference_run
    from models.llama.params import WeightFileError
    from models.registry import PresetError, get_preset, load_model

    try:
        preset = get_preset(args.model)
        method = _check_method(args, preset)
        if method.name not in ("sps", "diffuspec", "specdiff"):  # bad flags fail early
            method.build(_options(args))
        model, params, tok, preset = load_model(args.model, args.weights, dtype=args.dtype,
                                                mesh=_mesh(args), quant=args.quant)
        # on a GPU the decoders' unrolled layer loop reads per-layer weights: split them once,
        # in place, instead of holding a stacked and a per-layer copy (README "GPU"); AR runs
        # fastest on output-major matrices, the other decoders read the stored layout unless
        # an output-major verification layout is asked for
        params = decode_layout_in_place(params, output_major=_output_major(method))
        options = _options(args, _draft_options(args, tok))
        config = method.build(options)
        ref_method, ref_cfg = reference_run(method, options) if args.compare else (None, None)
        texts = _texts(args, tok)
        prompts = [tok.encode(t) for t in texts]
        kw = dict(seed=args.seed, eos_ids=tuple(tok.eos_token_ids), pad_id=tok.pad_token_id or 0)
        res = method.run(model, params, prompts, config, **kw)
        # a reference decoder is compared with itself only for dLLMs, whose reference is
        # one-token-per-step stepwise decoding (the user's stepwise run may use fewer steps)
        compare = args.compare and (ref_method.name != method.name or method.family == "dllm")
        ref = ref_method.run(model, params, prompts, ref_cfg, **kw) if compare else None
    except (PresetError, WeightFileError, DecodeInputError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    _print_outputs(args, texts, res.tokens, tok)
    diffusion = method.family == "dllm"
    line = diffusion_stats_line if diffusion else stats_line
    print(line(res.stats.method, res, mean_degeneracy(res.tokens)))
    for extra in _method_lines(method, res):
        print(extra)
    if ref is None:
        return 0
    ref_label = ("stepwise-1" if diffusion and method.name != "spiffy"
                 else ref_cfg.method if diffusion else ref_method.name)
    print(line(ref_label, ref, mean_degeneracy(ref.tokens)))
    same = _same(method.family, res, ref)
    what = "identical" if same else "DIFFERENT"
    if method.family == "causal" and not options.sampling.greedy:
        what += " (sampling: only the distribution is guaranteed equal)"
    name = method.name
    if method.name in ("stepwise", "fixed-k", "threshold"):
        steps = config.steps if config.method == "stepwise" else "-"
        name = f"{config.method} (steps={steps}, cache={config.cache})"
    print(compare_line(name, _reference_label(method, ref_cfg), res, ref, what))
    greedy = options.sampling.greedy
    if method.lossless and method.name not in ("stepwise",) and not same and greedy:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
