"""Quality-gate figures for the trained masked-diffusion models.

Everything here is deterministic given the interpreter's stdlib, the tokenizer and a seed:

* :func:`heldout_snippets` cuts ``n`` windows of ``prompt_len + cont_len`` tokens out of the
  held-out stdlib modules of *this* interpreter (fixed offsets, no randomness): the first
  ``prompt_len`` tokens are the prompt, the next ``cont_len`` the true continuation.
* :func:`masked_accuracy` masks a fixed-seed share of the positions of each window (never
  position 0, which a Dream head cannot predict: its shifted logits row 0 is the unshifted
  row) and scores top-1 predictions at the masked positions. ``DiffusionLM.apply`` already
  returns shifted logits for the ``"dream"`` head, so ``logits[:, i]`` predicts token ``i``.
* :func:`causal_accuracy_at` is the autoregressive reference on the *same* positions
  (``logits[:, i - 1]`` predicts token ``i`` with the full unmasked left context: an easier,
  different task, reported only for scale).
* :func:`completion_figures`: distinct-token share, repeated 4-gram rate, longest run (from
  :mod:`jaxspec.eval.metrics`) and the positional match to the true continuation.
* :func:`is_degenerate`: the gate's "mostly one repeated token" rule.

The AS-ARM infilling gate (``python -m scripts.evaluate --gate asarm-small``):

* :func:`random_mask`: the fixed-seed masks of the gate and of the ``assd`` benchmark suite;
* :func:`infill_figures`: per sequence and averaged, the degeneracy figures, Shannon entropy
  (Eq. 22) and generative perplexity (Eq. 21, from a judge) of the tokens at the masked positions
  of infilled sequences, and the same figures of the true text at the same positions;
* :func:`asarm_gate_checks` / :data:`ASARM_GATE_RULE`: the pass rule;
* :func:`run_asarm_gate`: masks, infills (sampled and greedy), judges and applies the rule.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.asarm.assd import assd_generate
from jaxspec.core.sampling import SamplingConfig
from jaxspec.eval.metrics import degeneracy, mean_degeneracy, shannon_entropy
from jaxspec.training.data import is_heldout, stdlib_files, stdlib_root


class QualityError(ValueError):
    """Not enough held-out text for the requested snippets, or malformed inputs."""


@dataclasses.dataclass(frozen=True)
class Snippet:
    """One held-out window: ``prompt`` (``prompt_len`` ids) + ``target`` (the true next ids)."""

    source: str  # stdlib-relative path
    offset: int  # token offset of the window in that file
    prompt: list[int]
    target: list[int]

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.target


def heldout_snippets(
    tokenizer,
    holdout: Sequence[str],
    n: int = 20,
    *,
    prompt_len: int = 128,
    cont_len: int = 64,
    drop_ids: Sequence[int] = (),
    root: Optional[Path] = None,
) -> list[Snippet]:
    """``n`` deterministic held-out windows.

    Each held-out file (sorted path order) is tokenized on its own (no special tokens). A file
    of ``L`` tokens offers candidate windows at offsets ``0, W, 2W, ...`` (``W = prompt_len +
    cont_len``, non-overlapping) that lie fully inside it and contain no id of ``drop_ids``
    (e.g. the mask token). The candidates are ordered file by file and ``n`` of them are taken
    at evenly spaced indices ``floor(k * C / n)`` (``C`` candidates), so the snippets spread
    over all held-out modules.

    Raises:
      QualityError: ``n < 1``, non-positive lengths, or fewer than ``n`` candidate windows.
    """
    if n < 1 or prompt_len < 1 or cont_len < 1:
        raise QualityError(f"need n, prompt_len, cont_len >= 1, got {n}, {prompt_len}, {cont_len}")
    root = Path(root) if root is not None else stdlib_root()
    files = [f for f in stdlib_files(root) if is_heldout(f, holdout)]
    W = prompt_len + cont_len
    bad = set(int(i) for i in drop_ids)
    cands = []
    for f in files:
        ids = tokenizer.encode((root / f).read_text(encoding="utf-8", errors="replace"))
        for off in range(0, len(ids) - W + 1, W):
            win = [int(t) for t in ids[off : off + W]]
            if bad.intersection(win):
                continue
            cands.append((str(f), off, win))
    if len(cands) < n:
        raise QualityError(
            f"only {len(cands)} held-out windows of {W} tokens ({len(files)} files), need {n}"
        )
    picked = [cands[(k * len(cands)) // n] for k in range(n)]
    return [Snippet(s, o, w[:prompt_len], w[prompt_len:]) for s, o, w in picked]


def mask_positions(T: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Bool ``(T,)``: exactly ``max(1, round(rate * (T - 1)))`` positions among ``1..T-1``
    (position 0 is never masked)."""
    if not 0.0 < rate <= 1.0:
        raise QualityError(f"masking rate must be in (0, 1], got {rate}")
    if T < 2:
        raise QualityError(f"need at least 2 tokens to mask, got {T}")
    k = max(1, int(round(rate * (T - 1))))
    pos = 1 + rng.choice(T - 1, size=k, replace=False)
    m = np.zeros((T,), bool)
    m[pos] = True
    return m


def masked_accuracy(
    model,
    params,
    rows: Sequence[Sequence[int]],
    rate: float,
    *,
    seed: int = 0,
    batch_size: int = 4,
    return_masks: bool = False,
):
    """Top-1 accuracy of a :class:`models.diffusion.modeling.DiffusionLM` at masked positions.

    For row ``b`` (all rows the same length ``T``) the masked set comes from
    :func:`mask_positions` with ``np.random.default_rng([seed, b])``; the masked tokens are
    replaced by ``model.config.mask_token_id``, one bidirectional forward (no padding) scores
    every position, the mask id's logit is excluded (as in decoding) and the arg-max is
    compared with the true token at the masked positions.

    Returns:
      ``{"accuracy", "correct", "masked", "rate"}`` (micro-average over all masked
      positions); with ``return_masks`` also the bool ``(B, T)`` mask array.
    """
    x = np.asarray(rows, np.int32)
    if x.ndim != 2 or x.shape[0] < 1:
        raise QualityError(f"rows must be a non-empty (B, T) array, got shape {x.shape}")
    B, T = x.shape
    masks = np.stack([mask_positions(T, rate, np.random.default_rng([seed, b])) for b in range(B)])
    mask_id = int(model.config.mask_token_id)
    noisy = np.where(masks, mask_id, x).astype(np.int32)
    fwd = jax.jit(model.apply)
    correct = 0
    for s in range(0, B, batch_size):
        tok = jnp.asarray(noisy[s : s + batch_size])
        pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), tok.shape)
        logits, _ = fwd(params, tok, pos)
        logits = logits.at[..., mask_id].set(-jnp.inf)
        pred = np.asarray(jnp.argmax(logits, axis=-1))
        correct += int(((pred == x[s : s + batch_size]) & masks[s : s + batch_size]).sum())
    total = int(masks.sum())
    out = {"accuracy": correct / total, "correct": correct, "masked": total, "rate": rate}
    return (out, masks) if return_masks else out


def causal_accuracy_at(
    model, params, rows: Sequence[Sequence[int]], masks: np.ndarray, *, batch_size: int = 4
) -> dict:
    """Next-token top-1 accuracy of a causal LM at the positions ``masks`` marks
    (``logits[:, i - 1]`` predicts token ``i``; the input is the unmasked row)."""
    x = np.asarray(rows, np.int32)
    masks = np.asarray(masks, bool)
    if masks.shape != x.shape or masks[:, 0].any():
        raise QualityError("masks must have the rows' shape and never mark position 0")
    B, T = x.shape
    causal = jnp.tril(jnp.ones((T, T), bool))

    @jax.jit
    def fwd(p, tok):
        pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), tok.shape)
        att = jnp.broadcast_to(causal, (tok.shape[0], T, T))
        return model.apply({"params": p}, tok, pos, att)

    correct = 0
    for s in range(0, B, batch_size):
        out = fwd(params, jnp.asarray(x[s : s + batch_size]))
        logits = out[0] if isinstance(out, tuple) else out
        pred = np.asarray(jnp.argmax(logits, axis=-1))  # pred[:, i] guesses token i+1
        hit = pred[:, :-1] == x[s : s + batch_size, 1:]
        correct += int((hit & masks[s : s + batch_size, 1:]).sum())
    total = int(masks.sum())
    return {"accuracy": correct / total, "correct": correct, "masked": total}


def continuation_match(generated: Sequence[int], target: Sequence[int]) -> float:
    """Share of the ``len(target)`` positions where the generated token equals the true one
    (position by position; missing generated positions count as misses)."""
    if not len(target):
        raise QualityError("empty target continuation")
    g = list(generated)
    return sum(1 for i, t in enumerate(target) if i < len(g) and int(g[i]) == int(t)) / len(target)


def completion_figures(
    completions: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
) -> dict:
    """Mean distinct-token share, repeated 4-gram rate, max longest run (from
    :func:`jaxspec.eval.metrics.mean_degeneracy`), mean continuation match, and the share of
    completions that :func:`is_degenerate` flags."""
    if len(completions) != len(targets) or not completions:
        raise QualityError(f"{len(completions)} completions for {len(targets)} targets")
    figs = dict(mean_degeneracy(completions, 4))
    figs["continuation_match"] = round(
        float(np.mean([continuation_match(c, t) for c, t in zip(completions, targets)])), 4
    )
    figs["degenerate_share"] = round(float(np.mean([is_degenerate(c) for c in completions])), 4)
    return figs


def is_degenerate(tokens: Sequence[int], share: float = 0.5) -> bool:
    """The gate's rule: a completion is degenerate when one token makes up more than
    ``share`` of it ("mostly one repeated token"); an empty completion is degenerate."""
    t = list(tokens)
    if not t:
        return True
    return max(t.count(v) for v in set(t)) / len(t) > share


#: Thresholds of the benchmark reports' answer-quality flag (:func:`answer_flags`): the
#: figures of a row are flagged as measured on EOS padding when the median answer (tokens
#: before the first EOS) is shorter than ``median_answer_min``, and as measured on a loop when
#: the mean repeated 4-gram rate before the EOS exceeds ``repeated_ngram_rate_max`` or the
#: mean distinct-token share falls below ``distinct_token_share_min``.
ANSWER_FLAG_RULE = {
    "median_answer_min": 32,
    "repeated_ngram_rate_max": 0.2,
    "distinct_token_share_min": 0.4,
}


def answer_flags(
    median_answer: float,
    repeated_ngram_rate: Optional[float],
    distinct_token_share: Optional[float],
    rule: Optional[dict] = None,
) -> list[str]:
    """The flags of one benchmark row from its answer figures (the text before each output's
    first EOS): ``"EOS"`` (the answers are mostly EOS: median answer shorter than
    ``rule["median_answer_min"]``) and / or ``"loop"`` (mean repeated 4-gram rate above
    ``rule["repeated_ngram_rate_max"]`` or mean distinct-token share below
    ``rule["distinct_token_share_min"]``, :func:`jaxspec.eval.metrics.degeneracy`); ``[]`` for
    answers fit to carry a speedup. ``rule`` overrides :data:`ANSWER_FLAG_RULE` keys; a None
    degeneracy figure (no non-empty answer) skips the loop test."""
    r = {**ANSWER_FLAG_RULE, **(rule or {})}
    flags = []
    if median_answer < r["median_answer_min"]:
        flags.append("EOS")
    if (repeated_ngram_rate is not None and repeated_ngram_rate > r["repeated_ngram_rate_max"]) or (
        distinct_token_share is not None and distinct_token_share < r["distinct_token_share_min"]
    ):
        flags.append("loop")
    return flags


def answer_quality(answers: Sequence[Sequence[int]], rule: Optional[dict] = None) -> dict:
    """Answer-quality figures of a row's outputs: ``answers`` are the token ids before each
    output's first EOS (EOS excluded). Returns ``median_answer_tokens``, the means of
    :func:`jaxspec.eval.metrics.mean_degeneracy` over the non-empty answers
    (``distinct_token_share``, ``repeated_ngram_rate``; ``longest_run`` the max; None when
    every answer is empty) and ``answer_flags`` (:func:`answer_flags`)."""
    nonempty = [list(a) for a in answers if len(a)]
    figs = (
        mean_degeneracy(nonempty, 4)
        if nonempty
        else {"distinct_token_share": None, "repeated_ngram_rate": None, "longest_run": None}
    )
    med = float(np.median([len(a) for a in answers])) if len(answers) else 0.0
    return {
        "median_answer_tokens": med,
        **figs,
        "answer_flags": answer_flags(
            med, figs["repeated_ngram_rate"], figs["distinct_token_share"], rule
        ),
    }


# ------------------------------------------------------------------------------ AS-ARM gate
#: Thresholds of the AS-ARM infilling gate (:func:`asarm_gate_checks`). The rule is applied to
#: the gated run (sampling at temperature 1.0, the paper's setting); greedy figures are reported
#: with their own checks for information only (greedy decoding of small LMs loops even when the
#: model is sound). A check fails when:
#:
#: * ``degenerate``: any infill has one token making up more than ``degenerate_token_share``
#:   (50%) of it (:func:`is_degenerate`): "mostly one repeated token";
#: * ``distinct``: the mean distinct-token share of the infills is below ``distinct_ratio`` (1/2)
#:   times the true text's at the same positions;
#: * ``repeated_4gram``: the mean repeated 4-gram rate of the infills exceeds the true text's by
#:   more than ``ngram_excess`` (0.25 absolute; a loop scores near 1). For scale, the true text
#:   of the default gate (20 held-out windows of 256 SmolLM2 ids, 95% masked, seed 0) measured
#:   distinct share 0.44 and repeated 4-gram rate 0.074 at the masked positions, so the bars
#:   are about 0.22 and 0.32;
#: * ``gen_ppl``: the geometric mean over sequences of the judged generative perplexity of the
#:   infilled sequences exceeds ``ppl_ratio`` (10) times the true sequences' (token salad from a
#:   near-untrained model scores hundreds to thousands of times the true text). Skipped (not
#:   failed) when no judge is given.
ASARM_GATE_RULE = {
    "degenerate_token_share": 0.5,
    "distinct_ratio": 0.5,
    "ngram_excess": 0.25,
    "ppl_ratio": 10.0,
}


def random_mask(n: int, rate: float, seed: int) -> np.ndarray:
    """bool ``(n,)`` with ``clip(round(rate * n), 1, n - 1)`` masked positions, drawn with
    ``default_rng(seed)``.

    Raises: QualityError when ``n < 2`` or ``rate`` outside (0, 1)."""
    if n < 2 or not 0.0 < rate < 1.0:
        raise QualityError(f"need a sequence of >= 2 tokens and 0 < mask rate < 1, got {n}, {rate}")
    g = min(max(int(round(rate * n)), 1), n - 1)
    m = np.zeros(n, bool)
    m[np.random.default_rng(seed).choice(n, g, replace=False)] = True
    return m


def infill_tokens(sequence: Sequence[int], masked: Sequence[bool]) -> list[int]:
    """The tokens of ``sequence`` (``(N,)`` ids) at the positions where ``masked`` (bool
    ``(N,)``) is True, in position order (= ASSD's decoding order of the masked part, Eq. 4)."""
    m = np.asarray(masked, bool)
    if len(sequence) != m.shape[0]:
        raise QualityError(f"sequence of {len(sequence)} tokens with a mask of {m.shape[0]}")
    return [int(t) for t, k in zip(sequence, m) if k]


def _geomean(xs) -> Optional[float]:
    xs = [float(x) for x in xs if x is not None and np.isfinite(x) and x > 0]
    return float(np.exp(np.mean(np.log(xs)))) if xs else None


def infill_figures(
    sequences: Sequence[Sequence[int]],
    masks: Sequence[Sequence[bool]],
    gen_ppl: Optional[Sequence[float]] = None,
    *,
    n: int = 4,
    degenerate_share: float = 0.5,
) -> dict:
    """Quality figures of ``B`` infilled (or true) sequences.

    Args:
      sequences: ``B`` id sequences of length ``N_b`` (the whole sequence: visible + infilled).
      masks: ``B`` bool ``(N_b,)``, True at the infilled positions; every figure but ``gen_ppl``
        and ``seq_entropy`` is computed on :func:`infill_tokens` (the masked positions only).
      gen_ppl: optional per-sequence generative perplexity of the whole sequence (Eq. 21, from a
        judge; unitless, >= 1).
      n: n-gram order of the repetition rate. degenerate_share: :func:`is_degenerate` bar.

    Returns:
      ``{"per_sequence": [{distinct_token_share, repeated_ngram_rate, longest_run, entropy,
      seq_entropy, gen_ppl, degenerate, infill_tokens}], "distinct_token_share" (mean),
      "repeated_ngram_rate" (mean), "longest_run" (max), "entropy" (mean bits of the infill's
      token frequencies, Eq. 22), "seq_entropy" (mean bits over whole sequences, as in Table 1),
      "gen_ppl" (mean), "gen_ppl_geomean", "gen_ppl_median", "degenerate_share"}``.

    Raises:
      QualityError: no sequences, mismatched counts or lengths, an empty infill.
    """
    if not sequences or len(sequences) != len(masks):
        raise QualityError(f"{len(sequences)} sequences for {len(masks)} masks")
    if gen_ppl is not None and len(gen_ppl) != len(sequences):
        raise QualityError(f"{len(gen_ppl)} perplexities for {len(sequences)} sequences")
    per = []
    for b, (seq, m) in enumerate(zip(sequences, masks)):
        inf = infill_tokens(seq, m)
        if not inf:
            raise QualityError(f"sequence {b} has no masked position")
        d = degeneracy(inf, n)
        per.append(
            {
                "distinct_token_share": round(d["distinct_token_share"], 4),
                "repeated_ngram_rate": round(d["repeated_ngram_rate"], 4),
                "longest_run": int(d["longest_run"]),
                "entropy": round(shannon_entropy(inf), 4),
                "seq_entropy": round(shannon_entropy([int(t) for t in seq]), 4),
                "gen_ppl": None if gen_ppl is None else round(float(gen_ppl[b]), 4),
                "degenerate": is_degenerate(inf, degenerate_share),
                "infill_tokens": len(inf),
            }
        )
    mean = lambda key: round(float(np.mean([p[key] for p in per])), 4)  # noqa: E731
    ppl = [p["gen_ppl"] for p in per] if gen_ppl is not None else None
    return {
        "per_sequence": per,
        "distinct_token_share": mean("distinct_token_share"),
        "repeated_ngram_rate": mean("repeated_ngram_rate"),
        "longest_run": max(p["longest_run"] for p in per),
        "entropy": mean("entropy"),
        "seq_entropy": mean("seq_entropy"),
        "gen_ppl": None if ppl is None else round(float(np.mean(ppl)), 4),
        "gen_ppl_geomean": None if ppl is None else round(_geomean(ppl), 4),
        "gen_ppl_median": None if ppl is None else round(float(np.median(ppl)), 4),
        "degenerate_share": round(float(np.mean([p["degenerate"] for p in per])), 4),
    }


def asarm_gate_checks(infill: dict, truth: dict, rule: Optional[dict] = None) -> list[dict]:
    """The AS-ARM gate's checks (:data:`ASARM_GATE_RULE`) of :func:`infill_figures` results.

    Args:
      infill: figures of the infilled sequences; truth: figures of the true sequences with the
        same masks. rule: thresholds (default :data:`ASARM_GATE_RULE`).

    Returns:
      ``[{"check", "passed" (True / False / None = not measured), "value", "bar", "text"}]``
      in the order degenerate, distinct, repeated_4gram, gen_ppl; ``text`` says why it failed.
    """
    r = dict(ASARM_GATE_RULE, **(rule or {}))
    out = []
    bad = sum(p["degenerate"] for p in infill["per_sequence"])
    out.append(
        {
            "check": "degenerate",
            "passed": bad == 0,
            "value": bad,
            "bar": 0,
            "text": f"{bad} of {len(infill['per_sequence'])} infills are mostly one token "
            f"(> {r['degenerate_token_share']:.0%} of the infill)",
        }
    )
    bar = round(r["distinct_ratio"] * truth["distinct_token_share"], 4)
    v = infill["distinct_token_share"]
    out.append(
        {
            "check": "distinct",
            "passed": v >= bar,
            "value": v,
            "bar": bar,
            "text": f"distinct-token share {v:.4f} vs bar {bar:.4f} "
            f"(= {r['distinct_ratio']} x true {truth['distinct_token_share']:.4f})",
        }
    )
    bar = round(truth["repeated_ngram_rate"] + r["ngram_excess"], 4)
    v = infill["repeated_ngram_rate"]
    out.append(
        {
            "check": "repeated_4gram",
            "passed": v <= bar,
            "value": v,
            "bar": bar,
            "text": f"repeated 4-gram rate {v:.4f} vs bar {bar:.4f} "
            f"(= true {truth['repeated_ngram_rate']:.4f} + {r['ngram_excess']})",
        }
    )
    gi, gt = infill.get("gen_ppl_geomean"), truth.get("gen_ppl_geomean")
    if gi is None or gt is None:
        out.append(
            {
                "check": "gen_ppl",
                "passed": None,
                "value": gi,
                "bar": None,
                "text": "generative perplexity not measured (no judge)",
            }
        )
    else:
        bar = round(r["ppl_ratio"] * gt, 4)
        out.append(
            {
                "check": "gen_ppl",
                "passed": gi <= bar,
                "value": gi,
                "bar": bar,
                "text": f"judged perplexity (geometric mean) {gi:.3f} vs bar {bar:.3f} "
                f"(= {r['ppl_ratio']} x true {gt:.3f})",
            }
        )
    return out


def gate_verdict(checks: Sequence[dict]) -> str:
    """``"FAIL"`` when any check failed, else ``"PASS"`` (unmeasured checks do not fail)."""
    return "FAIL" if any(c["passed"] is False for c in checks) else "PASS"


def visible_text(sequence: Sequence[int], masked: Sequence[bool], decode) -> str:
    """The prompt as text: maximal runs of visible tokens decoded with ``decode(ids) -> str``,
    each run of ``j`` masked positions written ``[j masked]``."""
    out, run, gap = [], [], 0
    for t, m in zip(sequence, np.asarray(masked, bool)):
        if m:
            if run:
                out.append(decode(run))
                run = []
            gap += 1
        else:
            if gap:
                out.append(f"[{gap} masked]")
                gap = 0
            run.append(int(t))
    out.append(decode(run) if run else f"[{gap} masked]")
    return "".join(out)


def _infill_run(
    model, params, seqs, masks, label, temp, *, batch, seed, method, k, bucket, max_len, log
):
    """One infilling run of every sequence at temperature ``temp``, ``batch`` rows per
    :func:`jaxspec.asarm.assd.assd_generate` call (chunk at row ``s`` seeded ``seed + s``),
    one log line per chunk; returns ``(infilled sequences, target NFE per new token, seconds)``."""
    filled, n_fe, n_tok, t0 = [], 0, 0, time.perf_counter()
    for s in range(0, len(seqs), batch):
        r = assd_generate(
            model,
            params,
            seqs[s : s + batch],
            masks[s : s + batch],
            method=method,
            k=k,
            sampling=SamplingConfig(temp),
            seed=seed + s,
            bucket=bucket,
            max_len=max_len,
        )
        filled += [[int(t) for t in x] for x in r.sequences]
        n_fe += int(r.stats.target_nfe.sum())
        n_tok += int(r.stats.new_tokens.sum())
        log(
            f"[gate] {label}: {len(filled)}/{len(seqs)} sequences infilled "
            f"({time.perf_counter() - t0:.0f}s)"
        )
    return filled, round(n_fe / max(n_tok, 1), 4), round(time.perf_counter() - t0, 1)


def _gate_figures(seqs, outs: dict, masks, to_ext, judge, rule, log) -> dict:
    """:func:`infill_figures` in external ids for the true text and every run (judged by
    ``judge`` when given, one log line each)."""
    ext = {
        "true": [to_ext(s) for s in seqs],
        **{k_: [to_ext(s) for s in v] for k_, v in outs.items()},
    }
    figures = {}
    for label, rows in ext.items():
        ppl = None
        if judge is not None:
            log(f"[gate] judging {label}")
            ppl = list(judge(rows))
        figures[label] = infill_figures(
            rows,
            masks,
            ppl,
            degenerate_share=dict(ASARM_GATE_RULE, **(rule or {}))["degenerate_token_share"],
        )
    return figures


def _gate_config(seqs, masks, mask_rate, seed, method, k, temperature, greedy, batch, judge):
    """The gate's ``config`` record (``k`` None for the sequential method)."""
    return {
        "sequences": len(seqs),
        "seq_len": [len(s) for s in seqs],
        "mask_rate": mask_rate,
        "masked": [int(m.sum()) for m in masks],
        "seed": seed,
        "method": method,
        "k": None if method == "sequential" else k,
        "temperature": temperature,
        "greedy": greedy,
        "batch": batch,
        "judge": judge is not None,
    }


def _gate_samples(seqs, masks, outs: dict, decode, samples: int) -> list[dict]:
    """The first ``samples`` sequences as text: visible prompt, truth and every run."""
    return [
        {
            "index": b,
            "prompt": visible_text(seqs[b], masks[b], decode),
            "true": decode(seqs[b]),
            **{label: decode(outs[label][b]) for label in outs},
        }
        for b in range(min(samples, len(seqs)))
    ]


def run_asarm_gate(
    model,
    params,
    sequences: Sequence[Sequence[int]],
    *,
    to_external=None,
    judge=None,
    decode=None,
    mask_rate: float = 0.95,
    seed: int = 0,
    method: str = "sequential",
    temperature: float = 1.0,
    k: int = 5,
    greedy: bool = True,
    batch: int = 10,
    bucket: int = 64,
    max_len: Optional[int] = None,
    samples: int = 3,
    rule: Optional[dict] = None,
    log=lambda m: None,
) -> dict:
    """The AS-ARM infilling gate on ``B`` sequences (see :data:`ASARM_GATE_RULE`).

    Sequence ``b`` (model ids, ``(N_b,)``) gets the mask
    :func:`random_mask` ``(N_b, mask_rate, seed * 100003 + b)`` (the same masks as
    ``scripts.benchmark --suite assd`` with that seed); its visible tokens are the prompt. The
    masked positions are infilled with :func:`jaxspec.asarm.assd.assd_generate` (``method``,
    ``k``), ``batch`` rows per call, chunk starting at row ``s`` seeded ``seed + s``: once at
    ``temperature`` (the gated run) and, with ``greedy``, once at temperature 0.

    Figures (:func:`infill_figures`) are computed in **external ids** (``to_external``: model ->
    tokenizer ids, UNK -> -1; identity when None) on the masked positions, for each run and for
    the true text (the input sequences, i.e. the truth as the model's vocabulary spells it).
    ``judge(list of external-id sequences) -> per-sequence generative perplexity`` (Eq. 21,
    e.g. :func:`jaxspec.eval.judge.smollm2_judge`) scores the **whole** sequences (prompt +
    infill); None skips perplexity.

    Returns:
      ``{"config", "rule", "checks", "verdict", "figures": {"true", "<run>", ...},
      "greedy_checks", "greedy_verdict", "nfe_per_token", "seconds", "samples"}`` where the
      gated run's label is ``"<method> T=<temperature>"``; ``samples`` holds the first
      ``samples`` sequences as text (``decode``: model ids -> text; omitted when None).

    Raises:
      QualityError: no sequences, a sequence shorter than 2 tokens or a mask rate outside
      (0, 1); ValueError: bad decoding settings (from assd_generate).
    """
    if not sequences:
        raise QualityError("no sequences to gate")
    if batch < 1:
        raise QualityError(f"batch must be >= 1, got {batch}")
    seqs = [[int(t) for t in s] for s in sequences]
    to_ext = to_external or (lambda ids: [int(i) for i in ids])
    masks = [random_mask(len(s), mask_rate, seed * 100003 + b) for b, s in enumerate(seqs)]
    runs = {f"{method} T={temperature:g}": temperature}
    if greedy and temperature != 0:
        runs[f"{method} greedy"] = 0.0
    outs, nfe, secs = {}, {}, {}
    opts = dict(batch=batch, seed=seed, method=method, k=k, bucket=bucket, max_len=max_len)
    for label, temp in runs.items():
        run = _infill_run(model, params, seqs, masks, label, temp, **opts, log=log)
        outs[label], nfe[label], secs[label] = run
    figures = _gate_figures(seqs, outs, masks, to_ext, judge, rule, log)
    gated, *rest = list(runs)
    checks = asarm_gate_checks(figures[gated], figures["true"], rule)
    res = {
        "config": _gate_config(
            seqs, masks, mask_rate, seed, method, k, temperature, bool(rest), batch, judge
        ),
        "rule": dict(ASARM_GATE_RULE, **(rule or {})),
        "gated_run": gated,
        "checks": checks,
        "verdict": gate_verdict(checks),
        "figures": figures,
        "nfe_per_token": nfe,
        "seconds": secs,
    }
    if rest:
        gc = asarm_gate_checks(figures[rest[0]], figures["true"], rule)
        res["greedy_checks"], res["greedy_verdict"] = gc, gate_verdict(gc)
    if decode is not None:
        res["samples"] = _gate_samples(seqs, masks, outs, decode, samples)
    return res


__all__ = [
    "QualityError",
    "Snippet",
    "heldout_snippets",
    "mask_positions",
    "masked_accuracy",
    "causal_accuracy_at",
    "continuation_match",
    "completion_figures",
    "is_degenerate",
    "ASARM_GATE_RULE",
    "random_mask",
    "infill_tokens",
    "infill_figures",
    "asarm_gate_checks",
    "gate_verdict",
    "visible_text",
    "run_asarm_gate",
]


# ----------------------------------------------------------------------------- SPACE SAR model


def heldout_ar_loss(model, params, rows: Sequence[Sequence[int]], batch: int = 4) -> float:
    """Mean next-token cross-entropy (nats) of a causal LM over equal-length ``rows`` (every
    position but the last scored), in batches of ``batch``."""
    import jax
    import jax.numpy as jnp

    x = np.asarray(rows, np.int32)
    T = x.shape[1]
    fwd = jax.jit(
        lambda p, t: model.apply(
            {"params": p},
            t,
            jnp.broadcast_to(jnp.arange(T), t.shape),
            jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (t.shape[0], T, T)),
        )[0]
    )
    ces = []
    for a in range(0, len(x), batch):
        lg = np.asarray(jax.nn.log_softmax(fwd(params, jnp.asarray(x[a : a + batch])), axis=-1))
        tgt = x[a : a + batch, 1:]
        ces.append(-np.take_along_axis(lg[:, :-1], tgt[..., None], axis=-1)[..., 0])
    return float(np.concatenate(ces).mean())


def mask_row_accuracy(
    model, params, rows: Sequence[Sequence[int]], k: int, groups: int = 8, seed: int = 0
) -> list[float]:
    """Top-1 accuracy of a SAR model's mask rows by offset ``j = 0..k-1`` (mask ``j`` of a
    group predicts the token ``j + 1`` places after the verifier's own token): the drafting
    skill SPACE's acceptance rests on. Uses
    :func:`jaxspec.training.objectives.sar_group_inputs`' layout (``groups`` groups per row)."""
    from jaxspec.training.objectives import sar_group_inputs

    x = jnp.asarray(np.asarray(rows, np.int32))
    T = x.shape[1]
    inp, pos, mask, lab, _, _ = sar_group_inputs(
        jax.random.PRNGKey(seed), x, k, groups, model.config.mask_token_id
    )
    logits = model.apply({"params": params}, inp, pos, mask)[0]
    hit = np.asarray(jnp.argmax(logits[:, T:], -1) == lab[:, T:]).reshape(len(rows), groups, k)
    return [float(v) for v in hit.mean(axis=(0, 1))]


def humaneval_pass_at_1(
    model, params, tok, problems: Sequence[dict], max_new_tokens: int = 256, method: str = "ar"
) -> dict:
    """Greedy pass@1 of raw-prompt completions in the sandbox
    (:func:`jaxspec.eval.sandbox.run_program`): the completion is cut at the first top-level line (a
    new ``def`` / ``class`` / ``if __name__`` / unindented code), appended to the prompt, and run
    with the problem's tests.

    Returns ``{"passed", "problems", "pass_at_1"}``."""
    from jaxspec.eval.sandbox import run_program
    from jaxspec.methods import get_method, run

    passed = 0
    for p in problems:
        ids = tok.encode(p["prompt"])
        entry = get_method(method, "causal")
        res = run(
            entry,
            model,
            params,
            [ids],
            entry.configure(max_new_tokens=max_new_tokens),
            eos_ids=tok.eos_token_ids,
            pad_id=tok.pad_token_id or 0,
        )
        passed += run_program(completion_program(p, tok.decode(res.tokens[0])), timeout=10.0).passed
    return {
        "passed": passed,
        "problems": len(problems),
        "pass_at_1": passed / max(len(problems), 1),
    }


def completion_program(problem: dict, completion: str) -> str:
    """The test program of a HumanEval ``problem`` (``prompt``, ``test``, ``entry_point``)
    with a raw-prompt ``completion``: the completion cut at its first top-level line (a new
    ``def`` / ``class`` / unindented code), appended to the prompt, then the tests and
    ``check(entry_point)``."""
    body = []
    for line in completion.split("\n"):
        if line and not line[0].isspace():
            break
        body.append(line)
    return (
        problem["prompt"]
        + "\n".join(body)
        + "\n\n"
        + problem["test"]
        + f"\n\ncheck({problem['entry_point']})\n"
    )
