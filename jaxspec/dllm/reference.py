"""The stepwise reference step of masked-diffusion decoding (LLaDA / Dream), in pieces that
run inside or outside any loop.

One reference step, on the logits scoring a block of ``L`` positions:

1. :func:`processed_logits`: the mask token (and, with ``logits_eos_inf``, every EOS id) can
   never be predicted; temperature scaling and top-k / top-p filtering.
2. :func:`score_block`: the predicted tokens ``x0`` (arg-max or Gumbel-max sample), their
   confidence under the remasking rule (:func:`block_confidence`) and the transfer rank.
3. :func:`transfer_rule`: which masked positions the step transfers (unmasks): the stepwise
   schedule (:func:`transfer_schedule`, :func:`num_transfer_tokens`, Dream's ``1 - s/t``
   fractions :func:`origin_probs`), fixed-k or Fast-dLLM's threshold.
4. The random numbers of the step: :func:`row_noise` / :func:`step_noise`, keyed by batch row
   and the row's step, so SSD and Spiffy replay exactly the reference's randomness.

:func:`reference_step` chains them. The decode loop (:mod:`jaxspec.dllm.decode`), SSD and
Spiffy all call these pieces; a config's numeric settings arrive traced in :class:`Knobs`
(bundled with the structural config as a :class:`Rule`).

Sources (facts only; the code is our own):

* **LLaDA stepwise decoding**, ML-GSAI/LLaDA ``generate.py``: ``get_num_transfer_tokens`` (per
  block ``mask_count // steps`` tokens per step, the remainder spread +1 over the first
  steps); ``remasking="low_confidence"`` ranks masked positions of the current block by the
  softmax probability of the predicted token, ``"random"`` by uniform noise;
  ``add_gumbel_noise`` for temperature.
* **Dream unmasking rules**, Dream-org/Dream ``generation_utils.py`` (``sample_tokens`` and
  ``DreamGenerationMixin._sample``): ``"maskgit_plus"`` confidence = probability of the
  sampled token under ``softmax(logits / T)``; ``"topk_margin"`` = top-1 minus top-2 of that
  distribution; ``"entropy"`` = ``sum p log(p + 1e-10)`` (negative entropy, higher = more
  certain); ``"origin"`` = every masked position is revealed independently with probability
  ``1 - s/t`` on the time grid ``linspace(1, eps, steps + 1)``, all remaining ones at the
  last step. Dream's own count rule (``schedule="dream"``): ``int(n_masked * (1 - s/t))``
  tokens at step ``i < steps - 1`` of a block (``n_masked`` = masked positions left in the
  block, float32 product truncated), all the rest at the last step. Dream's ``alg_temp``
  (``torch.multinomial(softmax(confidence / alg_temp), k)``: the ``k`` positions drawn
  without replacement) is implemented as Gumbel-top-k, ``top_k(confidence / alg_temp + g)``,
  which has the same distribution over ordered draws. ``top_k`` / ``top_p`` filter the
  (temperature-scaled) logits before sampling and before Dream's confidences, as Dream's
  ``sample_tokens`` does (top-k, then top-p, the Hugging Face order; Dream applies top-p
  first; they agree when only one is set). LLaDA's ``"low_confidence"`` keeps its
  unfiltered ``softmax(logits)[x0]``.
* **Parallel decoding**: ``tokens_per_step = k`` transfers the ``k`` most confident masked
  positions (fewer when fewer remain). ``threshold`` is Fast-dLLM's rule (NVlabs/Fast-dLLM
  ``llada/generate.py``, ``get_transfer_index`` with ``threshold``): transfer every masked
  position whose confidence is ``>= threshold``, and always at least the most confident one.
* **Fast-dLLM's Dream block rule** (``block_start="first-position"``; NVlabs/Fast-dLLM
  ``dream/model/generation_utils_block.py``, ``_sample``): each block's first (full) forward
  writes the prediction of the block's first position only, whatever its confidence; the
  cached steps after it apply the threshold rule, or (non-threshold branch) Dream's count
  rule from the time grid's second point on.

Conventions (each documented because it is observable):

* **Temperature.** ``x0 = argmax(logits / T + g)`` with ``g = -log(-log u)`` standard Gumbel
  noise, ``u ~ U(0, 1)``. LLaDA computes ``argmax(exp(logits) / (-log u)^T)``; taking the
  log gives the same arg-max for the same ``u`` (Gumbel-max). float32 (LLaDA: float64).
  ``T = 0`` is plain arg-max.
* **Confidence for ``"low_confidence"``** is ``softmax(logits)[x0]`` (no temperature), as in
  LLaDA; Dream's rules use ``softmax(logits / T)`` (``T = 0``: ``softmax(logits)``).
* **Ties** in the ranking go to the lower position (a stable sort of ``-confidence``).
* **The mask token is never predicted**: its logit is ``-inf`` before sampling ``x0``. The
  confidence softmax keeps it by default (``confidence_softmax="official"``: LLaDA
  ``generate.py`` ``F.softmax(logits)``, Fast-dLLM ``get_transfer_index``, Dream
  ``sample_tokens`` all score confidence over the whole vocabulary, [MASK] included);
  ``"renormalized"`` drops it there too (confidence ``p / (1 - p_mask)``, jaxspec's earlier
  rule; a threshold between the two flips decisions).
* **EOS options** (LLaDA ``generate.py``, paper Appendix B.4): ``logits_eos_inf`` sets the
  logits of every id in ``eos_ids`` to ``-inf`` before sampling; ``confidence_eos_eot_inf``
  ranks masked positions whose prediction is in ``eos_ids`` after all others (their
  confidence becomes the lowest finite float32). Pass both the EOS and the EoT id.
"""

from __future__ import annotations

from typing import Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.sampling import argmax, filter_top_k_top_p
from jaxspec.dllm.config import DiffusionDecodeConfig, structural

ENTROPY_EPS = 1e-10  # Dream's epsilon inside log(p + eps)


# ----------------------------------------------------------------------------- settings


def num_transfer_tokens(mask_count: int, steps: int) -> np.ndarray:
    """LLaDA's per-step transfer counts for one block.

    Source: ML-GSAI/LLaDA ``generate.py``, ``get_num_transfer_tokens``: ``mask_count // steps``
    per step, the remainder ``mask_count % steps`` spread +1 over the first steps.

    Returns: int32 ``(steps,)`` summing to ``mask_count``.
    """
    out = np.full((steps,), mask_count // steps, np.int32)
    out[: mask_count % steps] += 1
    return out


def origin_probs(steps: int, eps: float) -> np.ndarray:
    """Dream ``"origin"`` reveal probabilities per step: ``1 - s/t`` with ``t, s`` consecutive
    points of ``linspace(1, eps, steps + 1)``, and 1 at the last step. float32 ``(steps,)``.

    Source: Dream-org/Dream ``generation_utils.py``, ``_sample`` (``timesteps``)."""
    t = np.linspace(1.0, eps, steps + 1)
    p = 1.0 - t[1:] / t[:-1]
    p[-1] = 1.0
    return p.astype(np.float32)


def transfer_schedule(cfg: DiffusionDecodeConfig) -> jax.Array:
    """int32 ``(steps_per_block,)`` LLaDA transfer counts of a stepwise block (``(1,)`` zeros
    for fixed-k / threshold)."""
    if cfg.method == "stepwise":
        return jnp.asarray(num_transfer_tokens(cfg.block_length, cfg.steps_per_block))
    return jnp.zeros((1,), jnp.int32)


@flax.struct.dataclass
class Knobs:
    """The numeric settings of a :class:`~jaxspec.dllm.config.DiffusionDecodeConfig`, as
    traced arrays, so that sweeping them reuses one compiled loop (:func:`Knobs.of`).

    Attributes:
      temperature: float32 ``()`` ``T`` (1.0 when greedy: never divided by then).
      cfg_weight: float32 ``()`` ``cfg_scale + 1``, the conditional pass's weight.
      threshold: float32 ``()`` Fast-dLLM threshold (0 when off).
      tokens_per_step: float32 ``()`` the fixed-k count (0 when off).
      alg_temp: float32 ``()`` Dream's ``alg_temp`` (1.0 when off).
      origin: float32 ``(steps_per_block,)`` the ``1 - s/t`` fractions of ``"origin"`` and
        the Dream schedule (:func:`origin_probs`); ``(1,)`` zeros when neither is used.
    """

    temperature: jax.Array
    cfg_weight: jax.Array
    threshold: jax.Array
    tokens_per_step: jax.Array
    alg_temp: jax.Array
    origin: jax.Array

    @classmethod
    def of(cls, cfg: DiffusionDecodeConfig) -> "Knobs":
        f32 = lambda x: jnp.asarray(np.float32(x))
        uses_origin = cfg.method == "stepwise" and (
            cfg.remasking == "origin" or cfg.schedule == "dream"
        )
        origin = (
            origin_probs(cfg.steps_per_block, cfg.eps) if uses_origin else np.zeros(1, np.float32)
        )
        return cls(
            temperature=f32(cfg.temperature if cfg.temperature > 0 else 1.0),
            cfg_weight=f32(cfg.cfg_scale + 1.0),
            threshold=f32(cfg.threshold or 0.0),
            tokens_per_step=f32(cfg.tokens_per_step or 0),
            alg_temp=f32(cfg.alg_temp if cfg.alg_temp > 0 else 1.0),
            origin=jnp.asarray(origin),
        )


@flax.struct.dataclass
class Rule:
    """The reference step rule: the structural config (static), the traced :class:`Knobs`,
    the mask token id and the EOS ids the EOS options use (static).

    Build one with :func:`Rule.of` outside a loop; the jitted loops rebuild it from their
    static and traced arguments.
    """

    knobs: Knobs
    cfg: DiffusionDecodeConfig = flax.struct.field(pytree_node=False)
    mask_id: int = flax.struct.field(pytree_node=False)
    eos_ids: tuple = flax.struct.field(pytree_node=False, default=())

    @classmethod
    def of(cls, cfg: DiffusionDecodeConfig, mask_id: int, eos_ids=()) -> "Rule":
        return cls(
            knobs=Knobs.of(cfg),
            cfg=structural(cfg),
            mask_id=int(mask_id),
            eos_ids=tuple(sorted({int(e) for e in eos_ids})),
        )

    @property
    def sampled(self) -> bool:
        """Temperature > 0: tokens are sampled (Gumbel-max) and need token noise."""
        return self.cfg.temperature > 0


# ----------------------------------------------------------------------------- noise


def row_noise(key: jax.Array, row, step, block_length: int, vocab: int, with_tokens: bool):
    """The random numbers of one batch row at one of its steps (shared with test oracles).

    Args:
      key: the run's PRNG key (``PRNGKey(seed)``).
      row: int, the batch row; step: int, the row's 0-based step.
      block_length, vocab: ``L`` and ``V``; with_tokens: also draw the token noise.

    Returns:
      ``(u_tok, u_pos)``: ``u_tok`` float32 ``(L, V)`` uniforms in ``[tiny, 1)`` for the
      Gumbel noise of the token samples (``None`` when ``with_tokens`` is False); ``u_pos``
      float32 ``(L,)`` uniforms in ``[tiny, 1)`` for ``"random"`` / ``"origin"`` remasking and
      ``alg_temp``; both index the current block.
    """
    tiny = jnp.finfo(jnp.float32).tiny
    kt, kp = jax.random.split(jax.random.fold_in(jax.random.fold_in(key, row), step))
    u_pos = jax.random.uniform(kp, (block_length,), jnp.float32, minval=tiny)
    u_tok = (
        jax.random.uniform(kt, (block_length, vocab), jnp.float32, minval=tiny)
        if with_tokens
        else None
    )
    return u_tok, u_pos


def step_noise(key: jax.Array, steps: jax.Array, block_length: int, vocab: int, with_tokens: bool):
    """:func:`row_noise` for every row: ``steps`` int32 ``(B,)`` -> ``(u_tok (B, L, V) or
    None, u_pos (B, L))``."""
    rows = jnp.arange(steps.shape[0])
    return jax.vmap(lambda r, s: row_noise(key, r, s, block_length, vocab, with_tokens))(
        rows, steps
    )


# ----------------------------------------------------------------------------- scoring


def processed_logits(
    blk: jax.Array, rule: Rule, keep_mask: bool = False, scale: bool = True
) -> tuple[jax.Array, Optional[jax.Array]]:
    """The logits the reference samples from (``keep_mask``: the ones its official confidence
    softmax reads, the [MASK] logit left in).

    Args:
      blk: float32 ``(..., L, V)`` raw logits scoring the block's positions.
      rule: the :class:`Rule`.
      keep_mask: leave the mask logit as it is.
      scale: compute ``scaled`` (False: return None for it and skip the top-k / top-p sort).

    Returns:
      ``(blk, scaled)``: ``blk`` with the mask logit (unless ``keep_mask``; and with
      ``logits_eos_inf`` every EOS logit) set to ``-inf``; ``scaled`` = that divided by the
      temperature (when sampling) and top-k / top-p filtered (when set). Both float32
      ``(..., L, V)``.
    """
    cfg = rule.cfg
    if not keep_mask:
        blk = blk.at[..., rule.mask_id].set(-jnp.inf)
    if cfg.logits_eos_inf:
        blk = blk.at[..., list(rule.eos_ids)].set(-jnp.inf)
    if not scale:
        return blk, None
    scaled = blk / rule.knobs.temperature if rule.sampled else blk
    if cfg.top_k > 0 or cfg.top_p < 1.0:
        scaled = filter_top_k_top_p(scaled, cfg.top_k, cfg.top_p)
    return blk, scaled


def block_confidence(
    logits: jax.Array, x0: jax.Array, u_pos: jax.Array, remasking: str, temperature: float
) -> jax.Array:
    """Confidence of each block position under a remasking rule (higher = transfer first).

    Args:
      logits: float32 ``(B, L, V)`` (mask logit already ``-inf``).
      x0: int32 ``(B, L)`` predicted tokens.
      u_pos: float32 ``(B, L)`` uniforms (the ``"random"`` confidence).
      remasking: a name in :data:`~jaxspec.dllm.config.REMASKING` (``"origin"`` returns
        ``u_pos``, unused).
      temperature: Dream's rules use ``softmax(logits / T)``; a Python ``0`` means no
        scaling (a traced value is always divided by).

    Returns: float32 ``(B, L)``.

    Raises: ValueError: an unknown ``remasking``.
    """
    if remasking in ("random", "origin"):
        return u_pos
    if remasking == "low_confidence":
        p = jax.nn.softmax(logits, axis=-1)
        return jnp.take_along_axis(p, x0[..., None], axis=-1)[..., 0]
    greedy = isinstance(temperature, (int, float)) and temperature == 0
    scaled = logits if greedy else logits / temperature
    p = jax.nn.softmax(scaled, axis=-1)
    if remasking == "maskgit_plus":
        return jnp.take_along_axis(p, x0[..., None], axis=-1)[..., 0]
    if remasking == "topk_margin":
        top2 = jax.lax.top_k(p, 2)[0]
        return top2[..., 0] - top2[..., 1]
    if remasking == "entropy":
        return jnp.sum(p * jnp.log(p + ENTROPY_EPS), axis=-1)
    raise ValueError(f"unknown remasking {remasking!r}")


def transfer_rank(conf: jax.Array) -> jax.Array:
    """int32 ``(..., L)``: 0 for the most confident position; ties go to the lower index."""
    L = conf.shape[-1]
    ci, cj = conf[..., :, None], conf[..., None, :]
    idx = jnp.arange(L)
    before = (cj > ci) | ((cj == ci) & (idx[None, :] < idx[:, None]))
    return jnp.sum(before, axis=-1).astype(jnp.int32)


def score_block(
    blk: jax.Array, bmask: jax.Array, u_tok: Optional[jax.Array], u_pos: jax.Array, rule: Rule
):
    """One step's predictions and transfer ranking on a block (the reference step rule).

    Args:
      blk: float32 ``(..., L, V)`` logits scoring the block's positions.
      bmask: bool ``(..., L)``: the position is still masked.
      u_tok: float32 ``(..., L, V)`` uniforms (Gumbel noise) or None when greedy;
        u_pos: float32 ``(..., L)`` uniforms (:func:`row_noise`).
      rule: the :class:`Rule` (temperature on/off, top-k/top-p, remasking, EOS options,
        alg_temp on/off; the traced temperature and alg_temp).

    Returns:
      ``(x0 int32 (..., L), conf float32 (..., L), rank int32 (..., L))``: the predicted
      tokens, their confidence (``-inf`` where not masked) and the transfer rank (0 = first;
      unmasked positions rank after every masked one).
    """
    cfg, knobs = rule.cfg, rule.knobs
    raw = blk
    blk, scaled = processed_logits(raw, rule)
    filtered = cfg.top_k > 0 or cfg.top_p < 1.0
    if rule.sampled:
        x0 = argmax(scaled - jnp.log(-jnp.log(u_tok)))
    else:
        x0 = argmax(scaled)
    dream_filtered = filtered and cfg.remasking != "low_confidence"
    if cfg.confidence_softmax == "official":  # the confidence softmax keeps the [MASK] logit
        # scaled is read again only by Dream's filtered rules: skip the second sort otherwise
        blk, scaled = processed_logits(raw, rule, keep_mask=True, scale=dream_filtered)
    if not dream_filtered:
        conf = block_confidence(
            blk, x0, u_pos, cfg.remasking, knobs.temperature if rule.sampled else 0.0
        )
    else:  # Dream's rules on the filtered (already temperature-scaled) distribution
        conf = block_confidence(scaled, x0, u_pos, cfg.remasking, 0.0)
    if cfg.confidence_eos_eot_inf:
        conf = jnp.where(
            jnp.isin(x0, jnp.asarray(rule.eos_ids, jnp.int32)), jnp.finfo(jnp.float32).min, conf
        )
    conf = jnp.where(bmask, conf, -jnp.inf)
    if cfg.alg_temp > 0:  # Gumbel-top-k == multinomial without replacement (Dream)
        gumbel = conf / knobs.alg_temp - jnp.log(-jnp.log(u_pos))
        rank = transfer_rank(jnp.where(bmask, gumbel, -jnp.inf))
    else:
        rank = transfer_rank(conf)
    return x0, conf, rank


# ----------------------------------------------------------------------------- transfer


def transfer_rule(
    rule: Rule,
    bmask: jax.Array,
    conf: jax.Array,
    rank: jax.Array,
    u_pos: jax.Array,
    step_in_block: jax.Array,
) -> jax.Array:
    """Which masked block positions one reference step transfers (the unmasking rate ``S_t``).

    Args:
      rule: the :class:`Rule` (method, schedule, remasking; traced fixed-k count, threshold
        and ``1 - s/t`` fractions).
      bmask: bool ``(B, L)`` still masked; conf, rank: from :func:`score_block`;
      u_pos: float32 ``(B, L)`` the step's position uniforms (``"origin"``).
      step_in_block: int32 ``(B,)`` the step's index within its block.

    Returns: bool ``(B, L)``: stepwise = the ``sched[step]`` (LLaDA) or ``int(n * (1 - s/t))``
    (Dream) best-ranked positions, ``"origin"`` = independent reveals, fixed-k = the ``k``
    best, threshold = every position with ``conf >= threshold`` plus the best one; with
    ``block_start="first-position"`` a block's first step transfers its first position only
    (Fast-dLLM's Dream block decoder).
    """
    rest = _rule_transfer(rule, bmask, conf, rank, u_pos, step_in_block)
    if rule.cfg.block_start != "first-position":
        return rest
    first = bmask & (jnp.arange(bmask.shape[-1]) == 0)[None]
    return jnp.where((step_in_block == 0)[:, None], first, rest)


def _rule_transfer(rule, bmask, conf, rank, u_pos, step_in_block) -> jax.Array:
    """:func:`transfer_rule` at every step (``block_start="rule"``)."""
    cfg, knobs = rule.cfg, rule.knobs
    spb = cfg.steps_per_block
    method = cfg.method
    n_masked = jnp.sum(bmask, axis=-1)
    sib = jnp.minimum(step_in_block, spb - 1) if method == "stepwise" else step_in_block
    if cfg.remasking == "origin":
        last = sib == spb - 1
        return bmask & ((u_pos < knobs.origin[sib][:, None]) | last[:, None])
    if method == "stepwise" and cfg.schedule == "dream":
        k = jnp.floor(n_masked.astype(jnp.float32) * knobs.origin[sib]).astype(jnp.int32)
        k = jnp.where(sib == spb - 1, n_masked, k)
        return bmask & (rank < k[:, None])
    if method == "stepwise":
        return bmask & (rank < transfer_schedule(cfg)[sib][:, None])
    if method == "fixed-k":
        return bmask & (rank < knobs.tokens_per_step)
    return bmask & ((conf >= knobs.threshold) | (rank == 0))


def reference_step(
    rule: Rule,
    blk: jax.Array,
    bmask: jax.Array,
    key: jax.Array,
    steps: jax.Array,
    step_in_block: jax.Array,
):
    """One whole reference step on every row's block: noise, scoring, transfer.

    Args:
      rule: the :class:`Rule`; blk: float32 ``(B, L, V)`` logits scoring the block;
      bmask: bool ``(B, L)`` still masked; key: the run's PRNG key;
      steps: int32 ``(B,)`` the rows' step counters (the noise index, :func:`step_noise`);
      step_in_block: int32 ``(B,)`` the step's index within the block.

    Returns:
      ``(x0 int32 (B, L), transfer bool (B, L))``: the predictions and the positions the
      step transfers (:func:`transfer_rule`).
    """
    L, V = blk.shape[-2:]
    u_tok, u_pos = step_noise(key, steps, L, V, rule.sampled)
    x0, conf, rank = score_block(blk, bmask, u_tok, u_pos, rule)
    return x0, transfer_rule(rule, bmask, conf, rank, u_pos, step_in_block)


__all__ = [
    "Knobs",
    "Rule",
    "num_transfer_tokens",
    "origin_probs",
    "transfer_schedule",
    "row_noise",
    "step_noise",
    "processed_logits",
    "block_confidence",
    "transfer_rank",
    "score_block",
    "transfer_rule",
    "reference_step",
    "ENTROPY_EPS",
]
