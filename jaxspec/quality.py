"""Quality-gate figures for the trained masked-diffusion models (issue 3).

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
  :mod:`jaxspec.metrics`) and the positional match to the true continuation.
* :func:`is_degenerate`: the gate's "mostly one repeated token" rule.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.data import is_heldout, stdlib_files, stdlib_root
from jaxspec.metrics import mean_degeneracy


class QualityError(ValueError):
    """Not enough held-out text for the requested snippets, or malformed inputs."""


@dataclasses.dataclass(frozen=True)
class Snippet:
    """One held-out window: ``prompt`` (``prompt_len`` ids) + ``target`` (the true next ids)."""

    source: str          # stdlib-relative path
    offset: int          # token offset of the window in that file
    prompt: list[int]
    target: list[int]

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.target


def heldout_snippets(tokenizer, holdout: Sequence[str], n: int = 20, *, prompt_len: int = 128,
                     cont_len: int = 64, drop_ids: Sequence[int] = (),
                     root: Optional[Path] = None) -> list[Snippet]:
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
            win = [int(t) for t in ids[off:off + W]]
            if bad.intersection(win):
                continue
            cands.append((str(f), off, win))
    if len(cands) < n:
        raise QualityError(f"only {len(cands)} held-out windows of {W} tokens "
                           f"({len(files)} files), need {n}")
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


def masked_accuracy(model, params, rows: Sequence[Sequence[int]], rate: float, *, seed: int = 0,
                    batch_size: int = 4, return_masks: bool = False):
    """Top-1 accuracy of a :class:`models.diffusion.DiffusionLM` at masked positions.

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
        tok = jnp.asarray(noisy[s:s + batch_size])
        pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), tok.shape)
        logits, _ = fwd(params, tok, pos)
        logits = logits.at[..., mask_id].set(-jnp.inf)
        pred = np.asarray(jnp.argmax(logits, axis=-1))
        correct += int(((pred == x[s:s + batch_size]) & masks[s:s + batch_size]).sum())
    total = int(masks.sum())
    out = {"accuracy": correct / total, "correct": correct, "masked": total, "rate": rate}
    return (out, masks) if return_masks else out


def causal_accuracy_at(model, params, rows: Sequence[Sequence[int]], masks: np.ndarray, *,
                       batch_size: int = 4) -> dict:
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
        out = fwd(params, jnp.asarray(x[s:s + batch_size]))
        logits = out[0] if isinstance(out, tuple) else out
        pred = np.asarray(jnp.argmax(logits, axis=-1))          # pred[:, i] guesses token i+1
        hit = pred[:, :-1] == x[s:s + batch_size, 1:]
        correct += int((hit & masks[s:s + batch_size, 1:]).sum())
    total = int(masks.sum())
    return {"accuracy": correct / total, "correct": correct, "masked": total}


def continuation_match(generated: Sequence[int], target: Sequence[int]) -> float:
    """Share of the ``len(target)`` positions where the generated token equals the true one
    (position by position; missing generated positions count as misses)."""
    if not len(target):
        raise QualityError("empty target continuation")
    g = list(generated)
    return sum(1 for i, t in enumerate(target) if i < len(g) and int(g[i]) == int(t)) / len(target)


def completion_figures(completions: Sequence[Sequence[int]],
                       targets: Sequence[Sequence[int]]) -> dict:
    """Mean distinct-token share, repeated 4-gram rate, max longest run (from
    :func:`jaxspec.metrics.mean_degeneracy`), mean continuation match, and the share of
    completions that :func:`is_degenerate` flags."""
    if len(completions) != len(targets) or not completions:
        raise QualityError(f"{len(completions)} completions for {len(targets)} targets")
    figs = dict(mean_degeneracy(completions, 4))
    figs["continuation_match"] = round(
        float(np.mean([continuation_match(c, t) for c, t in zip(completions, targets)])), 4)
    figs["degenerate_share"] = round(float(np.mean([is_degenerate(c) for c in completions])), 4)
    return figs


def is_degenerate(tokens: Sequence[int], share: float = 0.5) -> bool:
    """The gate's rule: a completion is degenerate when one token makes up more than
    ``share`` of it ("mostly one repeated token"); an empty completion is degenerate."""
    t = list(tokens)
    if not t:
        return True
    return max(t.count(v) for v in set(t)) / len(t) > share


__all__ = ["QualityError", "Snippet", "heldout_snippets", "mask_positions", "masked_accuracy",
           "causal_accuracy_at", "continuation_match", "completion_figures", "is_degenerate"]
