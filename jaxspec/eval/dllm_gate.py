"""The v2 masked-diffusion gate: does the model answer, stop, and not loop at the
papers' generation length?

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


def v2_gate_checks(mean: dict, rule: Optional[dict] = None) -> list[dict]:
    """The pass checks of :data:`V2_GATE_RULE` on :func:`eos_completion_figures` means:
    ``[{"check", "value", "bound", "passed"}]``."""
    r = {**V2_GATE_RULE, **(rule or {})}
    return [
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
    from jaxspec.eval.quality import completion_program
    from jaxspec.eval.sandbox import run_program

    eos = set(tok.eos_token_ids)
    passed = 0
    for p in problems:
        (c,) = stepwise_completions(
            model,
            params,
            [tok.encode(p["prompt"])],
            gen_length=gen_length,
            block_length=block_length,
            cache=cache,
            eos_ids=tok.eos_token_ids,
            pad_id=tok.pad_token_id or 0,
        )
        first = next((i for i, t in enumerate(c) if t in eos), len(c))
        passed += run_program(completion_program(p, tok.decode(c[:first])), timeout=10.0).passed
    return {
        "passed": passed,
        "problems": len(problems),
        "pass_at_1": passed / max(len(problems), 1),
    }


def run_v2_gate(
    model,
    params,
    tok,
    holdout: Sequence[str],
    *,
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
    """The whole v2 gate of a masked-diffusion ``model`` (module docstring).

    Args:
      model, params, tok: the :class:`models.diffusion.modeling.DiffusionLM`, its params and
        tokenizer; ``causal`` / ``base``: the AR base model for the HumanEval column (optional).
      holdout: held-out stdlib modules (the training config's ``data.holdout``).
      prompts: held-out function prompts completed; gen_length / block_length / cache: the
        stepwise decoding (one token per step, greedy, low-confidence remasking).
      humaneval: HumanEval problems for pass@1 (0 skips it); masked_rows: held-out 256-token
        windows for masked accuracy at 15% / 50%.

    Returns:
      JSON-ready dict: ``settings``, ``completion_figures`` (means), ``checks``, ``verdict``
      (``PASS`` / ``FAIL``), ``masked_accuracy``, ``humaneval`` and decoded ``samples``.
    """
    import time

    from jaxspec.eval import quality as Q
    from jaxspec.eval.datasets import humaneval_problems

    t0 = time.perf_counter()
    mask_id = model.config.mask_token_id
    eos = tuple(tok.eos_token_ids)
    specials = {
        i
        for i in range(min(tok.vocab_size, 64))
        if (t := tok.id_to_token(i)) and t.startswith("<") and t.endswith(">")
    }
    ctx = model.config.base.max_position_embeddings
    ps = heldout_function_prompts(
        tok,
        holdout,
        prompts,
        seq_len=256,
        eos_id=eos[0],
        drop_ids=(specials - set(eos)) | {mask_id},
        max_len=ctx - gen_length,
    )
    comps = stepwise_completions(
        model,
        params,
        ps,
        gen_length=gen_length,
        block_length=block_length,
        cache=cache,
        eos_ids=eos,
        pad_id=tok.pad_token_id or 0,
        batch=batch,
    )
    figs = eos_completion_figures(comps, eos, gen_length)
    checks = v2_gate_checks(figs["mean"])
    log(f"[gate] {len(ps)} completions in {time.perf_counter() - t0:.0f}s: {figs['mean']}")
    out = {
        "settings": {
            "prompts": len(ps),
            "gen_length": gen_length,
            "block_length": block_length,
            "steps": gen_length,
            "cache": cache,
            "remasking": "low_confidence",
            "temperature": 0.0,
            "rule": V2_GATE_RULE,
        },
        "completion_figures": figs["mean"],
        "checks": checks,
        "verdict": "PASS" if all(c["passed"] for c in checks) else "FAIL",
        "samples": [
            {
                "prompt": tok.decode(p),
                "completion": tok.decode(c[: f["answer_tokens"]]),
                "ends_with_eos": f["ends_with_eos"],
            }
            for p, c, f in list(zip(ps, comps, figs["per_completion"]))[:samples]
        ],
    }
    if masked_rows:
        rows = [
            sn.tokens
            for sn in Q.heldout_snippets(
                tok,
                holdout,
                masked_rows,
                prompt_len=128,
                cont_len=128,
                drop_ids=specials | {mask_id},
            )
        ]
        out["masked_accuracy"] = {
            f"{r:.2f}": Q.masked_accuracy(model, params, rows, r, batch_size=batch)["accuracy"]
            for r in (0.15, 0.5)
        }
        log(f"[gate] masked accuracy {out['masked_accuracy']}")
    if humaneval:
        probs = humaneval_problems()[:humaneval]
        out["humaneval"] = {
            "stepwise": humaneval_dllm_pass_at_1(
                model,
                params,
                tok,
                probs,
                gen_length=gen_length,
                block_length=block_length,
                cache=cache,
            )
        }
        if causal is not None:
            out["humaneval"]["base_ar"] = Q.humaneval_pass_at_1(
                causal, base, tok, probs, gen_length
            )
        log(f"[gate] HumanEval {out['humaneval']}")
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


__all__ = [
    "V2_GATE_RULE",
    "run_v2_gate",
    "heldout_function_prompts",
    "eos_completion_figures",
    "v2_gate_checks",
    "stepwise_completions",
    "humaneval_dllm_pass_at_1",
]
