"""Generate text with any registered decoding method: a causal LM (autoregressive or lossless
speculative decoding), a masked-diffusion LM (stepwise, fixed-k or threshold unmasking, SSD,
Spiffy) or an any-order AS-ARM (infilling, sequential or ASSD).

    python -m scripts.generate --model smollm2-135m-instruct --method ngram [--compare]
    python -m scripts.generate --model dream-smollm2-135m --method ssd --gen-length 64
    python -m scripts.generate --model asarm-small --method assd \\
        --infill "def add(a, b):\\n    <mask:8>\\n"

Every method is an entry of the registry (:mod:`jaxspec.methods`); ``--method`` lists them, and
the options below set the fields of the method's config (``--draft-length`` is
``draft_length``); an option the method does not take is an error naming the methods that take
it. Without ``--method`` a model runs its family's default (n-gram, stepwise, ASSD; a
masked-diffusion model given ``--tokens-per-step`` / ``--threshold`` runs fixed-k /
threshold). Methods that need a draft model take ``--draft-model NAME [--draft-weights PATH]``
(SPS: a causal model with the target's tokenizer; DiffuSpec / SpecDiff: a masked-diffusion
model, of another vocabulary too). With no ``--prompt`` the first ``--limit`` HumanEval
prompts are used; ``--infill`` takes a template whose ``<mask:N>`` spans the AS-ARM fills
(``\\n``, ``\\t`` and ``\\\\`` typed in the template are expanded).

Prints each output and the method's stats line (NFE, MAT, acceptance, tokens/s, compile time,
degeneracy figures). ``--compare`` also runs the reference the method is lossless against
(AR; one-token-per-step stepwise, or for Spiffy the decoder it accelerates; sequential
any-order decoding) and reports whether the outputs are identical and the speedup; a greedy
mismatch of a lossless method exits with code 1. ``--quant int8`` decodes with weight-only int8
projection matrices (:mod:`models.quant`), the reference too.

Every bad input (unknown model or method, a method of another family, an option the method does
not take, a value out of its range, a prompt that is empty or not UTF-8, missing or corrupt
weights, a prompt longer than the context) is one ``error:`` line and exit code 2, checked
before any model loads where the model is not needed to check it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxspec.methods import (
    FAMILY_WORDS,
    METHODS,
    default_method,
    get_method,
    methods_of,
    reference_of,
    run,
)
from jaxspec.methods import check_needs as check_model_needs
from jaxspec.methods.dllm import DEFAULT_GRAPH
from scripts.common import add_compile_cache_flag, compare_line, setup_compile_cache

GENERAL = (
    "model",
    "weights",
    "dtype",
    "quant",
    "mesh",
    "method",
    "prompt",
    "limit",
    "start",
    "chat",
    "seed",
    "draft_name",
    "draft_weights",
    "infill",
    "compare",
    "quiet",
    "no_compile_cache",
    "keep_unk",
)
"""Options of the command itself; every other option sets a field of the method's config."""


def _presets() -> str:
    from models.registry import available

    return ", ".join(available())


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m scripts.generate",
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog="methods: " + "; ".join(f"{n}: {m.summary}" for n, m in METHODS.items()),
    )
    _add_model_args(ap)
    _add_run_args(ap)
    add_compile_cache_flag(ap)
    # the method options: default None = the method config's default
    _add_sampling_args(ap)
    cg = ap.add_argument_group("causal methods")
    _add_causal_args(cg)
    _add_causal_drafter_args(cg)
    _add_diffusion_args(ap.add_argument_group("masked-diffusion methods"))
    _add_asarm_args(
        ap.add_argument_group("AS-ARM infilling (XLNet checkpoints, e.g. --model asarm-small)")
    )
    return ap


def _add_model_args(ap: argparse.ArgumentParser) -> None:
    """The target model: preset, weights, dtype, quantization and device mesh."""
    ap.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help=f"model preset (default smollm2-135m-instruct): {_presets()}; "
        "'auto' / 'hf-directory' load --weights",
    )
    ap.add_argument(
        "--weights", default=None, help="GGUF file or HF directory (overrides the preset)"
    )
    ap.add_argument(
        "--dtype",
        default="auto",
        help="parameter / activation dtype: auto "
        "(float32 on CPU, bfloat16 on GPU/TPU), float32 or bfloat16; the draft "
        "model and the --compare reference use the same",
    )
    ap.add_argument(
        "--quant",
        default="none",
        help="weight-only quantization: none or int8 "
        "(per-output-channel int8 projection matrices, models.quant; activations "
        "and KV caches stay in --dtype; Llama / Qwen2-layout models). The draft "
        "model and the --compare reference use the same, so --compare checks "
        "losslessness against AR of the int8 model",
    )
    ap.add_argument(
        "--mesh",
        default=None,
        metavar="DATAxMODEL",
        help="shard the model over a DATAxMODEL device mesh (e.g. 1x8: weights split "
        "over 8 devices; 2x4: also the batch over 2): models.sharding",
    )


def _add_run_args(ap: argparse.ArgumentParser) -> None:
    """The method, the prompts, the draft model and what is printed."""
    methods = "; ".join(f"{n} ({m.family})" for n, m in METHODS.items())
    defaults = ", ".join(default_method(f).name for f in FAMILY_WORDS)
    ap.add_argument(
        "--method",
        default=None,
        help=f"decoding method: {methods} (default: the model family's: {defaults})",
    )
    ap.add_argument(
        "--prompt",
        action="append",
        default=None,
        help="prompt text (repeat for a batch); default: HumanEval prompts",
    )
    ap.add_argument(
        "--limit", type=int, default=1, help="number of HumanEval prompts when no --prompt (>= 1)"
    )
    ap.add_argument("--start", type=int, default=0, help="first HumanEval problem index")
    ap.add_argument("--chat", action="store_true", help="wrap prompts in the model's chat template")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--draft-model",
        dest="draft_name",
        default=None,
        metavar="NAME",
        help="the draft model preset of the methods that take one (sps: a causal "
        "model with the target's tokenizer, e.g. qwen2.5-coder-0.5b-instruct "
        "for the 1.5b target; diffuspec / specdiff: a masked-diffusion model, "
        "e.g. dream-smollm2-135m)",
    )
    ap.add_argument(
        "--draft-weights",
        default=None,
        help="GGUF file or HF directory of the draft model (overrides its preset)",
    )
    ap.add_argument(
        "--compare",
        action="store_true",
        help="also run the method's reference and check identity / speedup",
    )
    ap.add_argument("--quiet", action="store_true", help="print only the stats lines")


def _add_sampling_args(ap: argparse.ArgumentParser) -> None:
    """Sampling options every method takes (default None: the method config's default)."""
    sg = ap.add_argument_group("sampling (every method)")
    sg.add_argument("--temperature", type=float, default=None, help="0 = greedy (default)")
    sg.add_argument("--top-k", type=int, default=None, help="0 = off (default)")
    sg.add_argument("--top-p", type=float, default=None, help="in (0, 1]; 1.0 = off (default)")


def _add_causal_args(cg) -> None:
    """Causal methods: token budget, DFlash drafter, draft length, n-gram, gate, SpACE."""
    cg.add_argument("--max-new-tokens", type=int, default=None, help="budget per row (default 128)")
    cg.add_argument(
        "--dflash-drafter",
        dest="drafter_model",
        default=None,
        metavar="FILE",
        help="dflash: a trained drafter's safetensors file (jaxspec.causal.dflash.save_drafter), "
        "built for this target and a block of --draft-length + 1",
    )
    cg.add_argument(
        "--dflash-draft-vocab",
        dest="draft_vocab",
        default=None,
        metavar="FILE",
        help="dflash: a draft vocabulary (.npy of token ids, scripts.draft_vocab): the "
        "drafter's LM head runs on those ids only (exact either way)",
    )
    cg.add_argument(
        "--draft-length",
        type=int,
        default=None,
        help="k, draft tokens per step (default: ngram 8, sps 5, diffuspec / specdiff "
        "30 (k_max), ssd 3, assd 5)",
    )
    cg.add_argument(
        "--ngram-first",
        action="store_const",
        const=True,
        default=None,
        help="dflash: rows whose last tokens occurred before in their context draft the "
        "n-gram copy; the drafter drafts the others (skipped when every row copies); exact "
        "either way",
    )
    cg.add_argument(
        "--max-ngram",
        type=int,
        default=None,
        help="ngram, dflash --ngram-first: longest suffix matched (default 3)",
    )
    cg.add_argument(
        "--min-ngram",
        type=int,
        default=None,
        help="ngram, dflash --ngram-first: shortest suffix matched, <= --max-ngram (default 2)",
    )
    cg.add_argument(
        "--fallback",
        choices=("none", "bigram"),
        default=None,
        help="ngram: when no suffix matches: 'none' (default) runs a plain AR step, "
        "'bigram' drafts from the ASSD Eq. 23 context bigram model",
    )
    cg.add_argument(
        "--gate",
        default=None,
        help="speculative methods: verify drafts only while their expected accepted "
        "length pays for the verification pass: off (default), auto (the pass "
        "cost measured on the CPU; off on GPU/TPU) or the pass cost in "
        "one-token steps (lossless either way)",
    )
    cg.add_argument(
        "--mask-groups",
        type=int,
        default=None,
        help="space: k, candidates per step = [MASK] tokens per group (default 5)",
    )
    cg.add_argument(
        "--space-sampling",
        choices=("exact", "paper"),
        default=None,
        help="space: 'exact' (default) resamples the residual (lossless); 'paper' "
        "draws the extra token from p as Algorithm 1 line 18 does (approximate)",
    )


def _add_causal_drafter_args(cg) -> None:
    """Causal methods with a masked-diffusion drafter (DiffuSpec / SpecDiff)."""
    cg.add_argument(
        "--k-min",
        type=int,
        default=None,
        help="diffuspec: ADL's shortest draft (default 20; --draft-length is k_max)",
    )
    cg.add_argument(
        "--refine-steps",
        type=int,
        default=None,
        help="diffuspec / specdiff: drafter refinement steps S per draft (default 1)",
    )
    cg.add_argument(
        "--no-cps",
        dest="cps",
        action="store_const",
        const=False,
        default=None,
        help="diffuspec: argmax drafts instead of the CPS path search (Table 2 ablation)",
    )
    cg.add_argument(
        "--no-adl",
        dest="adl",
        action="store_const",
        const=False,
        default=None,
        help="diffuspec: fixed draft length k_max instead of ADL (Table 2 ablation)",
    )
    cg.add_argument(
        "--drafter-cache",
        choices=("none", "prefix"),
        default=None,
        help="diffuspec / specdiff: 'prefix' keeps the drafter's context keys / values "
        "(Fast-dLLM prefix cache; drafts change, output does not); same "
        "vocabulary only (default none)",
    )


def _add_diffusion_args(dg) -> None:
    """Masked-diffusion methods: lengths, steps, unmasking rule, cache, SSD / Spiffy."""
    dg.add_argument("--gen-length", type=int, default=None, help="generated positions (default 64)")
    dg.add_argument(
        "--block-length", type=int, default=None, help="semi-autoregressive block size (default 8)"
    )
    dg.add_argument(
        "--steps",
        type=int,
        default=None,
        help="stepwise / spiffy: steps (default: gen length, one token per step)",
    )
    dg.add_argument(
        "--remasking",
        default=None,
        help="low_confidence (default), random, origin, maskgit_plus, topk_margin or entropy",
    )
    dg.add_argument(
        "--tokens-per-step",
        type=int,
        default=None,
        help="fixed-k (and spiffy over fixed-k): K tokens per step",
    )
    dg.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="threshold (and spiffy over threshold): unmask every position with "
        "confidence >= T, T in (0, 1] (at least one per step)",
    )
    dg.add_argument(
        "--cache",
        choices=("none", "prefix", "dual", "content"),
        default=None,
        help="masked diffusion: Fast-dLLM KV cache none (default) | prefix | dual "
        "(approximate; --compare uses the same policy); AS-ARM: none | content "
        "(the content-stream cache)",
    )
    dg.add_argument(
        "--tree",
        choices=("chain", "mix-order"),
        default=None,
        help="ssd verification tree: greedy chain (default, N+1 nodes) or mix-order (2N)",
    )
    dg.add_argument(
        "--graph",
        default=None,
        help=f"spiffy draft graph JSON (default {DEFAULT_GRAPH}, pruned to the block)",
    )
    _add_diffusion_confidence_args(dg)


def _add_diffusion_confidence_args(dg) -> None:
    """Masked-diffusion confidence details: Dream's alg_temp, the softmax, a block's start."""
    dg.add_argument(
        "--alg-temp",
        type=float,
        default=None,
        help="Dream's alg_temp: sample the unmasked positions from "
        "softmax(confidence / alg_temp) (default 0: most confident first)",
    )
    dg.add_argument(
        "--confidence-softmax",
        choices=("official", "renormalized"),
        default=None,
        help="official (default): the [MASK] logit stays in the confidence softmax "
        "(LLaDA, Fast-dLLM, Dream); renormalized: it is dropped "
        "(p / (1 - p_mask))",
    )
    dg.add_argument(
        "--block-start",
        choices=("rule", "first-position"),
        default=None,
        help="threshold: what a block's first step commits: rule (default) or "
        "first-position (Fast-dLLM's Dream block decoder: the block's first position only)",
    )


def _add_asarm_args(ag) -> None:
    """AS-ARM infilling: the template, ASSD's tolerance and the UNK id."""
    ag.add_argument(
        "--infill", default=None, help="template with <mask:N> spans; \\n, \\t, \\\\ are expanded"
    )
    ag.add_argument(
        "--epsilon",
        type=float,
        default=None,
        help="ASSD acceptance tolerance (Appendix F.5; > 0 is NOT lossless; needs "
        "--temperature > 0)",
    )
    ag.add_argument(
        "--suppress-unk",
        dest="suppress",
        action="store_const",
        const=True,
        default=None,
        help="never generate the AS-ARM's UNK id (the default; the --compare reference "
        "suppresses it too)",
    )
    ag.add_argument(
        "--keep-unk",
        action="store_true",
        help="let the AS-ARM generate its UNK id (as scripts.benchmark --assd-keep-unk)",
    )


# ----------------------------------------------------------------------------- checks


def _utf8(what: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} is not valid UTF-8 (byte {ord(text[e.start]) & 0xFF:#04x} at "
            f"character {e.start})"
        ) from None


def _check_command(args) -> None:
    """The checks of the command's own options (ValueError, one line)."""
    for i, p in enumerate(args.prompt or ()):
        _utf8(f"--prompt {i + 1}", p)
        if not p.strip():
            raise ValueError(f"--prompt {i + 1} is empty: give some text")
    if args.infill is not None:
        _utf8("--infill", args.infill)
    if args.limit < 1:
        raise ValueError(f"--limit must be >= 1 (HumanEval prompts), got {args.limit}")
    if args.start < 0:
        raise ValueError(f"--start must be >= 0, got {args.start}")
    if args.draft_weights and not args.draft_name:
        raise ValueError("--draft-weights needs --draft-model NAME")
    if args.drafter_model is not None and not Path(args.drafter_model).is_file():
        raise ValueError(f"--dflash-drafter {args.drafter_model}: no such file")
    if args.draft_vocab is not None and not Path(args.draft_vocab).is_file():
        raise ValueError(f"--dflash-draft-vocab {args.draft_vocab}: no such file")


def _given(args) -> dict:
    """The method options given on the command line (``{config field: value}``)."""
    return {k: v for k, v in vars(args).items() if k not in GENERAL and v is not None}


def _family(args) -> tuple[str, str]:
    """``(family, who)`` of ``--model`` (``--weights`` for ``hf-directory`` / ``auto``); a
    ``--model`` that names no preset is an AS-ARM path or checkpoint name when infilling."""
    from models.registry import PresetError, family_of, get_preset, is_preset

    asarm_method = args.method in methods_of("asarm")
    if not is_preset(args.model) and (args.infill is not None or asarm_method):
        return "asarm", repr(args.model)
    preset = get_preset(args.model)
    if preset.format == "hf_dir" and not args.weights:
        raise PresetError(
            f"model {args.model!r} needs --weights PATH (an HF directory, jaxspec "
            "checkpoint or GGUF file)"
        )
    who = repr(args.weights if preset.format == "hf_dir" else preset.name)
    return family_of(preset, args.weights), who


def choose_method(args, family: str, who: str, options: dict):
    """The registry entry to run (``--method`` or the family's default), checked against
    the model's family."""
    fits = ", ".join(methods_of(family))
    if args.method is None:  # a draft model alone does not pick a method
        method = default_method(family, {k: v for k, v in options.items() if k != "draft_model"})
    else:
        method = get_method(args.method)
    if method.family != family:
        infill = " with --infill TEMPLATE" if family == "asarm" else ""
        word = FAMILY_WORDS[method.family]
        raise ValueError(
            f"method {method.name!r} needs {'an' if word[0] in 'aeiou' else 'a'} "
            f"{word} model, but {who} is {FAMILY_WORDS[family]}; use --method "
            f"{fits}{infill}"
        )
    if family == "asarm" and args.infill is None:
        raise ValueError(
            f"{who} is an {FAMILY_WORDS[family]} model: give a template with "
            f"--infill (methods {fits}); method {method.name!r} infills a template "
            "with <mask:N> spans: pass --infill TEXT"
        )
    if family != "asarm" and args.infill is not None:
        raise ValueError(
            f"--infill needs an {FAMILY_WORDS['asarm']} model, but {who} is {FAMILY_WORDS[family]}"
        )
    if family == "asarm" and args.quant != "none":
        raise ValueError(
            f"--quant {args.quant} applies to Llama / Qwen2-layout models (causal "
            "and masked-diffusion), not to AS-ARM infilling"
        )
    return method


def _draft_key(method) -> str:
    return method.needs.draft_field if method.needs.draft_family else "draft_model"


def check_needs(args, method) -> None:
    """What the method needs (:class:`jaxspec.core.method_config.Needs`), checked on the
    presets before any model loads."""
    from models.registry import family_of, get_preset, is_preset

    needs = method.needs
    if needs.draft_family:
        words = FAMILY_WORDS[needs.draft_family]
        if not args.draft_name:
            vocab = " with the target's tokenizer" if needs.same_vocabulary else ""
            raise ValueError(
                f"method {method.name!r} needs --draft-model NAME (a {words} "
                f"model{vocab}, e.g. {needs.example})"
            )
        dfam = family_of(get_preset(args.draft_name), args.draft_weights)
        if dfam != needs.draft_family:
            raise ValueError(
                f"--draft-model {args.draft_name!r} is not a {words} model "
                f"(method {method.name!r} needs one)"
            )
    if needs.mask_token and is_preset(args.model):
        preset = get_preset(args.model)
        if preset.format != "hf_dir" and preset.mask_token_id is None:
            raise ValueError(
                f"method {method.name!r} needs a SAR-SFT model with a [MASK] token "
                f"(e.g. --model {needs.example}); {args.model!r} has none"
            )


def plan(args):
    """Every check that needs no model: ``(method, options, family)``; the options hold
    placeholders for what is loaded later (the draft model, the UNK id)."""
    _check_command(args)
    family, who = _family(args)
    options = _given(args)
    if args.draft_name:
        options["draft_model"] = None
    method = choose_method(args, family, who, options)
    if "draft_model" in options:
        options[_draft_key(method)] = options.pop("draft_model")
    if args.keep_unk and options.get("suppress"):
        raise ValueError("--keep-unk and --suppress-unk contradict each other; give one")
    if family == "asarm" and not args.keep_unk:
        options["suppress"] = True  # the default, as in the benchmark's assd suite
    if options.get("suppress"):
        options["suppress"] = ()  # the UNK id is known once the AS-ARM loads
    method.configure(options)  # every option taken and in range, before any model loads
    check_needs(args, method)
    return method, options, family


# ----------------------------------------------------------------------------- loading


def _mesh(args):
    """The ``--mesh`` device mesh (None without it); MeshError (a ValueError) when bad."""
    if not args.mesh:
        return None
    from models.sharding import make_mesh

    return make_mesh(args.mesh)


def _draft_fields(args, method, tok) -> dict:
    """The config fields of ``--draft-model``: the ``(model, params)`` pair; for a
    masked-diffusion drafter also the CPS proxy, its EOS and, for another vocabulary, the
    adapter (:func:`jaxspec.bench.diffuspec.diffuspec_drafter_options`)."""
    if not method.needs.draft_family:
        return {}
    from models.llama.layout import decode_layout_in_place
    from models.registry import load_model

    dmodel, dparams, dtok, _ = load_model(
        args.draft_name, args.draft_weights, dtype=args.dtype, mesh=_mesh(args), quant=args.quant
    )
    # one copy on a GPU; a causal draft model drafts in one-token steps: the AR layout
    causal = method.needs.draft_family == "causal"
    dparams = decode_layout_in_place(dparams, output_major=causal)
    if method.needs.same_vocabulary and not tok.same_vocabulary(dtok):
        raise ValueError(
            f"draft model {args.draft_name!r} has a different tokenizer than the "
            f"target {args.model!r} ({dtok.vocab_size} vs {tok.vocab_size} ids): "
            f"{method.name} needs the same vocabulary"
        )
    if causal:
        return {method.needs.draft_field: (dmodel, dparams)}
    from jaxspec.bench.diffuspec import diffuspec_drafter_options

    # another vocabulary: drafts are translated through text (jaxspec.causal.hetero)
    return diffuspec_drafter_options((dmodel, dparams), dtok, tok)


def _texts(args, tok):
    from jaxspec.eval.datasets import humaneval_problems, humaneval_prompt

    if args.prompt:
        return [
            tok.apply_chat_template([{"role": "user", "content": p}]) if args.chat else p
            for p in args.prompt
        ]
    probs = humaneval_problems()[args.start : args.start + args.limit]
    if not probs:
        raise ValueError(f"--start {args.start} is past the last HumanEval problem")
    return [humaneval_prompt(p, tok, args.chat) for p in probs]


def load(args, method, options, family):
    """Load the model(s) and make the inputs: ``(model, params, inputs, config, show, tok)``;
    ``show(result)`` gives the output texts, ``tok`` is the tokenizer of a prompt model (None
    for AS-ARM infilling, :func:`scripts.infill.load_infill`)."""
    if family == "asarm":
        from scripts.infill import load_infill

        return (*load_infill(args, method, options), None)
    from models.llama.layout import decode_layout_in_place
    from models.registry import load_model

    model, params, tok, _ = load_model(
        args.model, args.weights, dtype=args.dtype, mesh=_mesh(args), quant=args.quant
    )
    # on a GPU the decoders' unrolled layer loop reads per-layer weights: split them once, in
    # place; AR (the causal reference) runs fastest on output-major matrices, the other
    # decoders read the stored layout unless an output-major verification layout is asked for
    params = decode_layout_in_place(params, output_major=_output_major(method))
    if isinstance(options.get("drafter_model"), str):  # --dflash-drafter FILE
        from jaxspec.causal.dflash import load_drafter

        options = {**options, "drafter_model": load_drafter(options["drafter_model"])}
    if isinstance(options.get("draft_vocab"), str):  # --dflash-draft-vocab FILE
        from jaxspec.causal.dflash import load_draft_vocab

        vocab = load_draft_vocab(options["draft_vocab"], model.config.vocab_size)
        options = {**options, "draft_vocab": vocab}
    config = method.configure({**options, **_draft_fields(args, method, tok)})
    texts = _texts(args, tok)
    inputs = [tok.encode(t) for t in texts]
    for i, ids in enumerate(inputs):
        if not ids:
            raise ValueError(f"prompt {i + 1} encodes to no tokens")
    check_model_needs(method, model, config)  # before the drafter is built for the plan
    config = _with_plan(config, model, params, len(inputs))
    show = lambda res: [t + _bold(tok.decode(out)) for t, out in zip(texts, res.tokens)]  # noqa
    return model, params, inputs, config, show, tok


def _with_plan(config, model, params, batch: int):
    """``config`` with the decode plan of $JAXSPEC_LAYER_LOOP / $JAXSPEC_VERIFY_LAYOUT (the
    command line's defaults, :func:`models.llama.layout.env_defaults`) for a method that takes
    one (causal methods verifying in the target's vocabulary); unchanged when both are
    ``auto`` (the decoder then plans itself)."""
    from models.llama.layout import env_defaults

    chosen = env_defaults()
    if not hasattr(config, "plan") or set(chosen.values()) == {"auto"} or config.adapter():
        return config
    import dataclasses

    from jaxspec.causal.decode import decode_plan

    plan = decode_plan(
        model,
        params,
        config.drafter(model.config),
        config.drafter_params(params),
        batch=batch,
        gate=config.gate_cost,
        **chosen,
    )
    return dataclasses.replace(config, plan=plan)


def _output_major(method) -> bool:
    """The layout the target's weights are split in on a GPU: output-major for the causal
    reference (AR) and for an output-major verification layout ($JAXSPEC_VERIFY_LAYOUT, the
    command-line default), else stored."""
    from models.llama.layout import env_defaults

    ar = method.family == "causal" and method.name == method.reference
    return ar or env_defaults()["verify_layout"] == "output-major"


def _bold(text: str) -> str:
    return "\033[1m" + text + "\033[0m" if sys.stdout.isatty() else text


# ----------------------------------------------------------------------------- main


def _lines(config, label, res, tok) -> list[str]:
    lines = config.report(label, res)
    if tok is not None:  # prompts: degeneracy figures of the generated text
        from jaxspec.eval.metrics import mean_degeneracy

        d = mean_degeneracy(res.tokens)
        lines[0] += f" distinct={d['distinct_token_share']:.2f} rep4={d['repeated_ngram_rate']:.2f}"
    return lines


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from jaxspec.core.batching import DecodeInputError
    from models.llama.params import WeightFileError
    from models.registry import PresetError

    try:
        method, options, family = plan(args)
    except (PresetError, WeightFileError, ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    setup_compile_cache(args)  # compiled loops are reused by the next run
    try:
        model, params, inputs, config, show, tok = load(args, method, options, family)
        kw = dict(seed=args.seed)
        if tok is not None:
            kw.update(eos_ids=tuple(tok.eos_token_ids), pad_id=tok.pad_token_id or 0)
        res = run(method, model, params, inputs, config, **kw)
        ref_method, ref_cfg = reference_of(method, config) if args.compare else (None, None)
        same_run = ref_method is method and ref_cfg == config
        ref = (
            run(ref_method, model, params, inputs, ref_cfg, **kw)
            if args.compare and not same_run
            else None
        )
    except (PresetError, WeightFileError, DecodeInputError, ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    if not args.quiet:
        for text in show(res):
            print("=" * 80)
            print(text)
        print("=" * 80)
    for line in _lines(config, method.name, res, tok):
        print(line)
    name = f"{method.name} {config.describe()}".strip()
    if ref is None:
        if args.compare:  # the reference itself (AR, one-token-per-step stepwise, sequential)
            print(f"[compare] {name} is its own reference: nothing to compare")
        return 0
    for line in _lines(ref_cfg, ref_method.name, ref, tok):
        print(line)
    same = ref.tokens == res.tokens
    greedy = config.sampling.greedy
    what = "identical" if same else "DIFFERENT"
    if not greedy and not config.replays_samples:
        what += (
            " (sampling: only the distribution is guaranteed equal, not the tokens)"
            if not same
            else " (sampling: the distribution is what is guaranteed equal)"
        )
    elif not same and not config.lossless:
        what += f" ({method.name} is not lossless against {ref_method.name})"
    print(compare_line(name, f"{ref_method.name} {ref_cfg.describe()}".strip(), res, ref, what))
    return 1 if config.lossless and greedy and not same else 0


if __name__ == "__main__":
    sys.exit(main())
