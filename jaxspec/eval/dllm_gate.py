"""The masked-diffusion EOS gates (v2, v3): does the model answer, stop, not loop, and answer
at its AR parent's length at the papers' generation length?

A v1-style model trained on plain windows fills any budget by repeating itself; instruct
LLaDA / Dream models answer and pad the rest of the block with EOS. The gate decodes greedy
stepwise completions (one token per step, low-confidence remasking) of held-out
HumanEval-style prompts, i.e. the signature + docstring of functions from the held-out stdlib
modules (:func:`heldout_function_prompts`, never the benchmark's HumanEval prompts), at gen
length 256, block 32, and scores each completion **before its first EOS**
(:func:`eos_completion_figures`). Pass rule (:data:`V2_GATE_RULE`):

* repeated 4-gram rate <= 0.3 and distinct-token share >= 0.3 (means over completions, on the
  text before the first EOS);
* at least 80% of the completions contain an EOS within the budget.

Masked-token accuracy at 15% / 50% and HumanEval pass@1 of stepwise completions
(:func:`humaneval_dllm_pass_at_1`) are reported beside it, with the base model run AR on the
same problems.

The v3 rule (:data:`V3_GATE_RULE`, for a delta trained on its AR parent's own answers) scores
the held-out function prompts **and** the HumanEval prompts together (20 + 10 in the gate's
command), at block 8 and at block 32, and adds bounds: repeated 4-gram rate <= 0.2, distinct
share >= 0.4, >= 80% end with EOS, masked accuracy >= 0.65 at 15% and >= 0.45 at 50%, and a
median answer length at least half the base model's greedy AR answers to the same prompts.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from jaxspec.eval.metrics import eos_completion_figures
from jaxspec.training.sft import stdlib_sft

V2_GATE_RULE = {
    "repeated_ngram_rate_max": 0.3,
    "distinct_token_share_min": 0.3,
    "ends_with_eos_min": 0.8,
}

V3_GATE_RULE = {
    "repeated_ngram_rate_max": 0.2,
    "distinct_token_share_min": 0.4,
    "ends_with_eos_min": 0.8,
    "masked_accuracy_min": {"0.15": 0.65, "0.50": 0.45},
    "answer_length_vs_ar_min": 0.5,
    "score_humaneval": True,
}

GATE_RULES = {"v2": V2_GATE_RULE, "v3": V3_GATE_RULE}


def heldout_function_prompts(
    tokenizer,
    holdout: Sequence[str],
    n: int,
    *,
    seq_len: int = 256,
    eos_id: int,
    drop_ids=(),
    max_len: Optional[int] = None,
) -> list[list[int]]:
    """The first ``n`` held-out SFT prompts (signature + docstring of functions in the
    held-out modules; :func:`jaxspec.training.sft.stdlib_sft`), as token id lists, in a
    fixed order (every ``len // n``-th sample, so many modules are represented)."""
    toks, plen = stdlib_sft(tokenizer, holdout, seq_len=seq_len, eos_id=eos_id, drop_ids=drop_ids)[
        "val"
    ]
    if max_len is not None:  # prompts that leave room for the completion in the context
        keep = np.flatnonzero(plen <= max_len)
        toks, plen = toks[keep], plen[keep]
    if len(plen) < n:
        raise ValueError(
            f"only {len(plen)} held-out function prompts fit seq_len {seq_len}; {n} requested"
        )
    idx = np.unique(np.linspace(0, len(plen) - 1, n).astype(int))
    return [toks[i, : plen[i]].astype(int).tolist() for i in idx]


def gate_checks(
    mean: dict,
    rule: Optional[dict] = None,
    *,
    masked_accuracy: Optional[dict] = None,
    median_answer: Optional[float] = None,
    ar_median_answer: Optional[float] = None,
) -> list[dict]:
    """The pass checks of a gate rule (:data:`V2_GATE_RULE` by default, :data:`V3_GATE_RULE`)
    on :func:`eos_completion_figures` means: ``[{"check", "value", "bound", "passed"}]``.

    A rule with ``masked_accuracy_min`` (``{"0.15": bound, ...}``) checks ``masked_accuracy``
    (the same keys; a missing figure fails); one with ``answer_length_vs_ar_min`` checks
    ``median_answer / ar_median_answer`` (median answer tokens before EOS, the model's over the
    base model's AR on the same prompts; missing AR figures fail)."""
    r = {**V2_GATE_RULE, **(rule or {})}
    checks = [
        {
            "check": "repeated 4-gram rate before EOS",
            "value": mean["repeated_ngram_rate"],
            "bound": f"<= {r['repeated_ngram_rate_max']}",
            "passed": mean["repeated_ngram_rate"] <= r["repeated_ngram_rate_max"],
        },
        {
            "check": "distinct-token share before EOS",
            "value": mean["distinct_token_share"],
            "bound": f">= {r['distinct_token_share_min']}",
            "passed": mean["distinct_token_share"] >= r["distinct_token_share_min"],
        },
        {
            "check": "completions ending with EOS",
            "value": mean["ends_with_eos"],
            "bound": f">= {r['ends_with_eos_min']}",
            "passed": mean["ends_with_eos"] >= r["ends_with_eos_min"],
        },
    ]
    for rate, bound in (r.get("masked_accuracy_min") or {}).items():
        v = (masked_accuracy or {}).get(rate)
        checks.append(
            {
                "check": f"masked accuracy at {float(rate):.0%} masking",
                "value": float("nan") if v is None else float(v),
                "bound": f">= {bound}",
                "passed": v is not None and v >= bound,
            }
        )
    if "answer_length_vs_ar_min" in r:
        ok = median_answer is not None and ar_median_answer
        ratio = median_answer / ar_median_answer if ok else float("nan")
        checks.append(
            {
                "check": "median answer length / AR's on the same prompts",
                "value": ratio,
                "bound": f">= {r['answer_length_vs_ar_min']}",
                "passed": bool(ok) and ratio >= r["answer_length_vs_ar_min"],
            }
        )
    return checks


def v2_gate_checks(mean: dict, rule: Optional[dict] = None) -> list[dict]:
    """:func:`gate_checks` under :data:`V2_GATE_RULE` (``rule`` overrides its bounds)."""
    return gate_checks(mean, {**V2_GATE_RULE, **(rule or {})})


def ar_completions(
    causal,
    base,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_ids,
    pad_id: int,
    batch: int = 4,
) -> list[list[int]]:
    """Greedy AR completions of the base causal model (``jaxspec.methods`` ``ar``), each cut
    after its first EOS (:class:`jaxspec.causal.decode.GenerationResult`), in batches of
    ``batch`` prompts: the reference answer lengths of the v3 gate."""
    from jaxspec.methods import get_method, run

    entry = get_method("ar", "causal")
    cfg = entry.configure(max_new_tokens=max_new_tokens)
    out: list[list[int]] = []
    for i in range(0, len(prompts), batch):
        res = run(
            entry,
            causal,
            base,
            [list(p) for p in prompts[i : i + batch]],
            cfg,
            eos_ids=tuple(eos_ids),
            pad_id=pad_id,
        )
        out += [[int(t) for t in r] for r in res.tokens]
    return out


def stepwise_completions(
    model,
    params,
    prompts: Sequence[Sequence[int]],
    *,
    gen_length: int,
    block_length: int,
    cache: str,
    eos_ids: Sequence[int],
    pad_id: int,
    batch: int = 4,
) -> list[list[int]]:
    """Greedy one-token-per-step stepwise completions (``gen_length`` tokens each, EOS tails
    kept) in batches of ``batch`` prompts."""
    from jaxspec.dllm import DiffusionDecodeConfig, diffusion_generate

    cfg = DiffusionDecodeConfig(
        gen_length=gen_length, block_length=block_length, steps=gen_length, cache=cache
    )
    out = []
    for i in range(0, len(prompts), batch):
        res = diffusion_generate(
            model, params, list(prompts[i : i + batch]), cfg, eos_ids=tuple(eos_ids), pad_id=pad_id
        )
        out += np.asarray(res.full_tokens).astype(int).tolist()
    return out


def humaneval_dllm_pass_at_1(
    model, params, tok, problems: Sequence[dict], *, gen_length: int, block_length: int, cache: str
) -> dict:
    """Greedy stepwise pass@1 in the project's sandbox: each completion is cut at its first
    EOS and at the first top-level line, appended to the prompt and run with the problem's
    tests (as :func:`jaxspec.eval.quality.humaneval_pass_at_1` does for AR).

    Returns ``{"passed", "problems", "pass_at_1"}``."""
    comps = [
        stepwise_completions(
            model,
            params,
            [tok.encode(p["prompt"])],
            gen_length=gen_length,
            block_length=block_length,
            cache=cache,
            eos_ids=tok.eos_token_ids,
            pad_id=tok.pad_token_id or 0,
        )[0]
        for p in problems
    ]
    return humaneval_pass_from_completions(tok, problems, comps)


def humaneval_pass_from_completions(
    tok, problems: Sequence[dict], completions: Sequence[Sequence[int]]
) -> dict:
    """pass@1 of given completions (token ids, one per problem, EOS tails allowed): each is
    cut at its first EOS, decoded, cut at the first top-level line and run with the problem's
    tests in the sandbox. Returns ``{"passed", "problems", "pass_at_1"}``."""
    from jaxspec.eval.quality import completion_program
    from jaxspec.eval.sandbox import run_program

    eos = set(tok.eos_token_ids)
    passed = 0
    for p, c in zip(problems, completions):
        first = next((i for i, t in enumerate(c) if t in eos), len(c))
        passed += run_program(completion_program(p, tok.decode(c[:first])), timeout=10.0).passed
    return {
        "passed": passed,
        "problems": len(problems),
        "pass_at_1": passed / max(len(problems), 1),
    }


def _gate_prompts(tok, model, holdout, prompts: int, humaneval: int, gen_length: int):
    """The stdlib held-out function prompts, the first ``humaneval`` HumanEval problems and
    their prompts (token ids), and the special ids dropped from the held-out rows."""
    from jaxspec.eval.datasets import humaneval_problems

    mask_id = model.config.mask_token_id
    eos = tuple(tok.eos_token_ids)
    specials = {
        i
        for i in range(min(tok.vocab_size, 64))
        if (t := tok.id_to_token(i)) and t.startswith("<") and t.endswith(">")
    }
    ps = heldout_function_prompts(
        tok,
        holdout,
        prompts,
        seq_len=256,
        eos_id=eos[0],
        drop_ids=(specials - set(eos)) | {mask_id},
        max_len=model.config.base.max_position_embeddings - gen_length,
    )
    probs = humaneval_problems()[:humaneval] if humaneval else []
    return ps, probs, [tok.encode(p["prompt"]) for p in probs], specials


def _gate_rule(rule: str, causal) -> dict:
    """The rule ``rule`` names; ValueError for an unknown one or, when it compares answer
    lengths with AR, for a missing AR base model."""
    if rule not in GATE_RULES:
        raise ValueError(f"gate rule {rule!r}: expected one of {sorted(GATE_RULES)}")
    r = GATE_RULES[rule]
    if "answer_length_vs_ar_min" in r and causal is None:
        raise ValueError(f"the {rule} gate compares answer lengths with AR: it needs the base")
    return r


def _gate_settings(scored, ps, gen_length, block_length, cache, rule: str, r: dict) -> dict:
    """The gate's ``settings`` record (stepwise, greedy, low-confidence remasking)."""
    return {
        "prompts": len(scored),
        "stdlib_prompts": len(ps),
        "humaneval_prompts_scored": len(scored) - len(ps),
        "gen_length": gen_length,
        "block_length": block_length,
        "steps": gen_length,
        "cache": cache,
        "remasking": "low_confidence",
        "temperature": 0.0,
        "rule_name": rule,
        "rule": r,
    }


def _answer_lengths(causal, base, scored, figs: dict, eos, pad, gen_length, batch, log):
    """The AR base model's completions of ``scored``; returns ``(answer_length record, median
    answer tokens, AR median)`` and logs the two medians."""
    ar = ar_completions(
        causal, base, scored, max_new_tokens=gen_length, eos_ids=eos, pad_id=pad, batch=batch
    )
    ar_figs = eos_completion_figures(ar, eos, gen_length)
    median = float(np.median([c["answer_tokens"] for c in figs["per_completion"]]))
    ar_median = float(np.median([c["answer_tokens"] for c in ar_figs["per_completion"]]))
    record = {"median": median, "ar_median": ar_median, "ar_completion_figures": ar_figs["mean"]}
    log(f"[gate] median answer tokens {median} vs AR {ar_median}")
    return record, median, ar_median


def _masked_accuracies(model, params, tok, holdout, masked_rows, specials, batch, log) -> dict:
    """Masked accuracy at 15% / 50% on ``masked_rows`` held-out 256-token windows (logged)."""
    from jaxspec.eval import quality as Q

    rows = [
        sn.tokens
        for sn in Q.heldout_snippets(
            tok,
            holdout,
            masked_rows,
            prompt_len=128,
            cont_len=128,
            drop_ids=specials | {model.config.mask_token_id},
        )
    ]
    acc = {
        f"{m:.2f}": Q.masked_accuracy(model, params, rows, m, batch_size=batch)["accuracy"]
        for m in (0.15, 0.5)
    }
    log(f"[gate] masked accuracy {acc}")
    return acc


def _humaneval(model, params, tok, probs, he, causal, base, gen_length, log) -> dict:
    """HumanEval pass@1 of the stepwise completions ``he`` and, with ``causal``, of the AR base
    model (logged)."""
    from jaxspec.eval import quality as Q

    out = {"stepwise": humaneval_pass_from_completions(tok, probs, he)}
    if causal is not None:
        out["base_ar"] = Q.humaneval_pass_at_1(causal, base, tok, probs, gen_length)
    log(f"[gate] HumanEval {out}")
    return out


def _gate_samples(tok, scored, comps, figs: dict, samples: int) -> list[dict]:
    """The first ``samples`` completions decoded, cut after their answer."""
    return [
        {
            "prompt": tok.decode(p),
            "completion": tok.decode(c[: f["answer_tokens"]]),
            "ends_with_eos": f["ends_with_eos"],
        }
        for p, c, f in list(zip(scored, comps, figs["per_completion"]))[:samples]
    ]


def run_eos_gate(
    model,
    params,
    tok,
    holdout: Sequence[str],
    *,
    rule: str = "v2",
    causal=None,
    base=None,
    prompts: int = 20,
    gen_length: int = 256,
    block_length: int = 32,
    cache: str = "dual",
    humaneval: int = 20,
    masked_rows: int = 20,
    batch: int = 4,
    samples: int = 3,
    log=lambda m: None,
) -> dict:
    """The whole EOS gate of a masked-diffusion ``model`` under ``rule`` (``"v2"`` or
    ``"v3"``; module docstring).

    Args:
      model, params, tok: the :class:`models.diffusion.modeling.DiffusionLM`, its params and
        tokenizer; ``causal`` / ``base``: the AR base model (HumanEval column; under v3 also
        the reference answer lengths, required).
      holdout: held-out stdlib modules (the training config's ``data.holdout``).
      prompts: held-out function prompts completed; gen_length / block_length / cache: the
        stepwise decoding (one token per step, greedy, low-confidence remasking).
      humaneval: HumanEval problems for pass@1 (0 skips it; under v3 their completions are
        scored with the held-out ones); masked_rows: held-out 256-token windows for masked
        accuracy at 15% / 50%.

    Returns:
      JSON-ready dict: ``settings``, ``completion_figures`` (means), ``checks``, ``verdict``
      (``PASS`` / ``FAIL``), ``masked_accuracy``, ``humaneval``, ``answer_length`` (medians,
      v3) and decoded ``samples``.

    Raises:
      ValueError: an unknown ``rule``, or the v3 rule without the AR base model."""
    import time

    r = _gate_rule(rule, causal)
    t0 = time.perf_counter()
    eos = tuple(tok.eos_token_ids)
    pad = tok.pad_token_id or 0
    ps, probs, he_ps, specials = _gate_prompts(tok, model, holdout, prompts, humaneval, gen_length)
    scored = ps + he_ps if r.get("score_humaneval") else ps
    decode = dict(gen_length=gen_length, block_length=block_length, cache=cache, batch=batch)
    comps = stepwise_completions(model, params, scored, eos_ids=eos, pad_id=pad, **decode)
    figs = eos_completion_figures(comps, eos, gen_length)
    log(f"[gate] {len(scored)} completions in {time.perf_counter() - t0:.0f}s: {figs['mean']}")
    out = {
        "settings": _gate_settings(scored, ps, gen_length, block_length, cache, rule, r),
        "completion_figures": figs["mean"],
    }
    median = ar_median = None
    if "answer_length_vs_ar_min" in r:
        out["answer_length"], median, ar_median = _answer_lengths(
            causal, base, scored, figs, eos, pad, gen_length, batch, log
        )
    if masked_rows:
        out["masked_accuracy"] = _masked_accuracies(
            model, params, tok, holdout, masked_rows, specials, batch, log
        )
    if probs:
        he = (
            comps[len(ps) :]
            if r.get("score_humaneval")
            else stepwise_completions(model, params, he_ps, eos_ids=eos, pad_id=pad, **decode)
        )
        out["humaneval"] = _humaneval(model, params, tok, probs, he, causal, base, gen_length, log)
    out["checks"] = gate_checks(
        figs["mean"],
        r,
        masked_accuracy=out.get("masked_accuracy"),
        median_answer=median,
        ar_median_answer=ar_median,
    )
    out["verdict"] = "PASS" if all(c["passed"] for c in out["checks"]) else "FAIL"
    out["samples"] = _gate_samples(tok, scored, comps, figs, samples)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


__all__ = [
    "GATE_RULES",
    "V2_GATE_RULE",
    "V3_GATE_RULE",
    "ar_completions",
    "gate_checks",
    "humaneval_pass_from_completions",
    "run_eos_gate",
    "heldout_function_prompts",
    "eos_completion_figures",
    "v2_gate_checks",
    "stepwise_completions",
    "humaneval_dllm_pass_at_1",
]
