"""``python -m scripts.generate --infill TEMPLATE``: AS-ARM (XLNet) infilling from the command
line (:func:`infill_cli`, reached through :mod:`scripts.generate`).

The template uses the ``<mask:N>`` syntax of :mod:`jaxspec.asarm.infill`; the shell escapes
``\\n``, ``\\t`` and ``\\\\`` are expanded first. The model is a trained AS-ARM found by name or path
through :func:`models.registry.load_asarm`, or ``--model auto --weights DIR`` for a transformers
XLNet directory (or a jaxspec XLNet file); ``--infill`` with a model of another family is a
one-line error naming the method and the family (exit 2).
"""

from __future__ import annotations

import sys

from jaxspec.asarm.infill import infill_text, unescape_cli
from jaxspec.core.sampling import SamplingConfig
from models.llama.params import WeightFileError
from models.registry import load_asarm
from scripts.common import compare_line


def stats_line(res) -> str:
    """One line: masked tokens, NFE, NFE per token, tokens per iteration, acceptance, times."""
    s = res.stats
    acc = "-" if s.draft_length == 0 else f"{s.acceptance_rate:.3f}"
    return (f"[{s.method}] masked={int(s.new_tokens.sum())} NFE={int(s.target_nfe.sum())} "
            f"NFE/token={s.nfe_per_token:.3f} tokens/iteration={s.extra['tokens_per_iteration']:.2f} "
            f"k={s.extra['k'] if s.extra['k'] is not None else '-'} acceptance={acc} "
            f"lossless={'yes' if s.extra['lossless'] else 'NO (epsilon)'} cache={s.extra['cache']} "
            f"run={res.run_s:.2f}s "
            f"compile={res.compile_s:.1f}s")


def _check_family(args, method: str) -> None:
    """ValueError (one line naming the method and the model's family) when ``--model`` is a
    preset whose model (for ``hf-directory`` / ``auto``: whose ``--weights``) is not an XLNet
    AS-ARM. A ``--model`` that names no preset (a path, a checkpoint name) is left to
    :func:`models.registry.load_asarm`."""
    from jaxspec.methods import methods_of
    from models.registry import FAMILY_WORDS, family_of, get_preset, is_preset

    if method not in methods_of("asarm"):
        raise ValueError(f"--infill applies to the {FAMILY_WORDS['asarm']} methods "
                         f"({', '.join(methods_of('asarm'))}), not to method {method!r}")
    name, weights = getattr(args, "model", None), getattr(args, "weights", None)
    if not is_preset(name):
        return
    preset = get_preset(name)
    if preset.format == "hf_dir" and not weights:
        raise ValueError(f"model {name!r} needs --weights PATH (an XLNet HF directory or a "
                         f"jaxspec AS-ARM file)")
    family = family_of(preset, weights)
    if family != "asarm":
        who = weights if preset.format == "hf_dir" else name
        raise ValueError(f"method {method!r} needs an {FAMILY_WORDS['asarm']} model, but "
                         f"{who!r} is {FAMILY_WORDS[family]}; use --method "
                         f"{', '.join(methods_of(family))} without --infill")


def infill_cli(args) -> int:
    """``scripts.generate`` entry for AS-ARMs: ``--model NAME|PATH --method
    sequential|assd|assd-ngram|assd-fused|assd-fused-ngram --infill TEMPLATE [--draft-length K
    (default 5)] [--temperature T --top-k K --top-p P --seed S] [--epsilon E] [--suppress-unk]
    [--cache none|content] [--compare] [--quiet]``. Prints the infilled
    text and a stats line; ``--compare`` also runs sequential decoding and reports identity
    (greedy: a mismatch exits 1) and the NFE / wall-clock ratios. Exit 2 with one ``error:``
    line on bad input."""
    method = getattr(args, "method", None) or "assd"
    template = getattr(args, "infill", None)
    try:
        _check_family(args, method)
        if template is None:
            raise ValueError(f"method {method!r} infills a template: pass --infill TEXT with "
                             "<mask:N> spans")
        template = unescape_cli(template)
        k = getattr(args, "draft_length", None)
        k = 5 if k is None else k
        if k < 1:
            raise ValueError(f"--draft-length (k) must be >= 1, got {k}")
        sampling = SamplingConfig(getattr(args, "temperature", 0.0), getattr(args, "top_k", 0),
                                  getattr(args, "top_p", 1.0))
        asarm = load_asarm(getattr(args, "weights", None) or args.model)
        cache = getattr(args, "cache", "none") or "none"
        if cache not in ("none", "content"):
            raise ValueError(f"--cache {cache} is a masked-diffusion cache; AS-ARM infilling "
                             "takes --cache none|content")
        kw = dict(k=k, sampling=sampling, seed=getattr(args, "seed", 0),
                  suppress_unk=bool(getattr(args, "suppress_unk", False)), cache=cache)
        text, res, tpl = infill_text(asarm, template, method=method,
                                     epsilon=getattr(args, "epsilon", 0.0) or 0.0, **kw)
        ref = None
        if getattr(args, "compare", False) and method != "sequential":
            _, ref, _ = infill_text(asarm, template, method="sequential", **kw)
    except (WeightFileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not getattr(args, "quiet", False):
        print("=" * 80)
        print(text)
        print("=" * 80)
    print(stats_line(res))
    if ref is not None:
        same = all((a == b).all() for a, b in zip(ref.sequences, res.sequences))
        what = "identical" if same else "DIFFERENT"
        if not sampling.greedy:
            what += " (sampling: only the distribution is guaranteed equal)"
        print(stats_line(ref))
        print(compare_line(method, "sequential", res, ref, what))
        if sampling.greedy and not same:
            return 1
    return 0
