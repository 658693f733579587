"""Reference decoders for masked-diffusion LMs (LLaDA / Dream), jitted with static shapes.

One ``lax.while_loop`` runs every variant. Each loop iteration is one *step*: one model
forward over the whole padded sequence (prompt + generation slots, full bidirectional
attention, no KV cache), then some still-masked positions of the row's *current block* are
*transferred* (unmasked: their predicted token is written and kept for good).

Sources (facts only; the code is our own):

* **LLaDA stepwise decoding**, ML-GSAI/LLaDA ``generate.py``: ``generate`` (semi-
  autoregressive blocks of ``block_length``; ``steps // num_blocks`` steps per block;
  ``get_num_transfer_tokens``: per block ``mask_count // steps`` tokens per step, the
  remainder spread +1 over the first steps; ``remasking="low_confidence"`` ranks masked
  positions of the current block by the softmax probability of the predicted token,
  ``"random"`` by uniform noise; ``add_gumbel_noise`` for temperature; classifier-free
  guidance with the prompt replaced by mask tokens, ``logits = un + (cfg + 1)(cond - un)``).
* **Dream unmasking rules**, Dream-org/Dream ``generation_utils.py`` (``sample_tokens`` and
  ``DreamGenerationMixin._sample``): ``"maskgit_plus"`` confidence = probability of the
  sampled token under ``softmax(logits / T)``; ``"topk_margin"`` = top-1 minus top-2 of that
  distribution; ``"entropy"`` = ``sum p log(p + 1e-10)`` (negative entropy, higher = more
  certain); ``"origin"`` = every masked position is revealed independently with probability
  ``1 - s/t`` on the time grid ``linspace(1, eps, steps + 1)``, all remaining ones at the
  last step. They run on LLaDA's loop (blocks) with LLaDA's transfer-count schedule, or with
  Dream's own count rule (``schedule="dream"``): ``int(n_masked * (1 - s/t))`` tokens at
  step ``i < steps - 1`` of a block (``n_masked`` = masked positions left in the block,
  float32 product truncated), all the rest at the last step; with one block
  (``block_length == gen_length``) that is Dream's ``_sample`` loop. Dream's ``alg_temp``
  (``torch.multinomial(softmax(confidence / alg_temp), k)``: the ``k`` positions drawn
  without replacement) is implemented as Gumbel-top-k, ``top_k(confidence / alg_temp + g)``,
  which has the same distribution over ordered draws. ``top_k`` / ``top_p`` filter the
  (temperature-scaled) logits before sampling and before Dream's confidences, as Dream's
  ``sample_tokens`` does (we apply top-k, then top-p, the Hugging Face order; Dream applies
  top-p first; they agree when only one is set). LLaDA's ``"low_confidence"`` keeps its
  unfiltered ``softmax(logits)[x0]``.
* **Parallel decoding**: ``tokens_per_step = k`` transfers the ``k`` most confident masked
  positions of the current block per step (fewer when fewer remain) and moves to the next
  block when the current one is full. ``threshold`` is Fast-dLLM's rule (NVlabs/Fast-dLLM
  ``llada/generate.py``, ``get_transfer_index`` with ``threshold``): transfer every masked
  position of the current block whose confidence is ``>= threshold`` (Fast-dLLM drops the
  ranked candidates with confidence ``< threshold``), and always at least the most
  confident one.

* **KV caches** (Fast-dLLM, Wu et al. 2025, Sec. 3.2; NVlabs/Fast-dLLM ``llada/generate.py``
  ``generate_with_prefix_cache`` / ``generate_with_dual_cache``). Both run one full forward at
  the first step of every block and keep its keys/values:

  - ``cache="prefix"``: later steps of the block forward only ``x[block_start:]`` (the
    block and the masked suffix), attending to the cached prefix ``[0, block_start)`` and to
    themselves (fresh keys/values).
  - ``cache="dual"``: later steps forward only the block ``x[block_start:block_end]``; the
    prefix *and* the suffix come from the cache, and the block's fresh keys/values replace
    its cached ones (``replace_position``).

  The cached keys/values are those of the block's first step, so cached decoding is an
  approximation of uncached decoding; each cache policy is its own reference. Static shapes:
  the prefix cache's window ``S - block_start`` shrinks block by block, so it is rounded up
  to at most 8 distinct widths (``lax.switch`` over them; the extra slots past the sequence
  are hidden from attention, so the result is the unpadded computation). Dream's head needs
  the raw logits of position ``block_start - 1`` for the block's first position; in cached
  steps that row is the one computed by the block's full forward (the prefix's hidden states
  are cached along with its keys/values). With a cache the rows of a batch move through the
  blocks in lockstep: a row whose block is full waits (no NFE counted) until every row's
  block is full, exactly as Fast-dLLM's batched loop; a row's tokens do not depend on this.
  ``forward_tokens`` in the stats counts the query tokens each row pushed through the model.

Conventions and deliberate choices (each documented because it is observable):

* **Temperature.** ``x0 = argmax(logits / T + g)`` with ``g = -log(-log u)`` standard Gumbel
  noise, ``u ~ U(0, 1)``. LLaDA computes ``argmax(exp(logits) / (-log u)^T)``; taking the
  log gives ``argmax(logits - T log(-log u)) = argmax(T (logits / T + g))``, the same
  arg-max for the same ``u``, i.e. a sample from ``softmax(logits / T)`` (Gumbel-max). We
  compute in float32 (LLaDA in float64). ``T = 0`` is plain arg-max.
* **Confidence for ``"low_confidence"``** is ``softmax(logits)[x0]`` (no temperature), as in
  LLaDA; Dream's rules use ``softmax(logits / T)`` (``T = 0``: ``softmax(logits)``).
* **Ties** in the ranking go to the lower position (a stable sort of ``-confidence``);
  ``torch.topk`` leaves tie order unspecified.
* **The mask token is never predicted**: its logit is set to ``-inf`` before sampling and
  confidences (LLaDA could in principle write ``[MASK]`` and then re-predict that position,
  which breaks the transfer-count bookkeeping; a trained model puts almost no mass there).
* **EOS / EoT.** Like LLaDA, decoding always fills the whole ``gen_length`` (EOS tokens are
  ordinary tokens during decoding; LLaDA-Instruct fills the tail with ``<|eot_id|>`` /
  ``<|endoftext|>``). The returned token lists are cut after the first EOS in *position*
  order (the EOS is kept); ``new_tokens`` counts the kept tokens, NFE counts all steps.
* **Optional EOS suppression** (LLaDA ``generate.py`` options of the same names, from the
  paper's Appendix B.4): ``logits_eos_inf`` sets the logits of every id in ``eos_ids`` to
  ``-inf`` before sampling (EOS is never generated). ``confidence_eos_eot_inf`` ranks masked
  positions whose prediction is in ``eos_ids`` after all others (their confidence becomes the
  lowest finite float32), so EOS/EoT are placed last. LLaDA's literal code sets the EoT
  logit (126348) to ``-inf`` after sampling, which gives predicted-EoT positions confidence 0
  and renormalises the others, and leaves EOS (126081) untouched; we apply the documented
  intent to every id in ``eos_ids`` and keep the other confidences unchanged. Pass both the
  EOS and the EoT id in ``eos_ids``.
* **NFE** counts model forwards over a sequence: one per step, two with classifier-free
  guidance (the conditional and the unconditional pass, run as one batched call).
* **Left padding.** Prompts are left-padded to a bucketed length ``P``; padding is excluded
  from attention (:func:`models.diffusion.modeling.bidirectional_mask`) and RoPE position of slot
  ``s`` is ``s - pad``. Generation slots are ``[P, P + gen_length)``. With CFG the
  unconditional row replaces the prompt (not the padding) by mask tokens.
* **Batches.** Rows advance independently (own block and step counters); the loop runs until
  every row is done; a finished row is not counted in NFE afterwards.
* **Randomness** comes from :func:`row_noise` (``jax.random`` keyed by seed, batch row and
  the row's step), so a seed reproduces a run exactly and tests can replay the same noise.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.stats import DecodeStats
from jaxspec.core.runtime import run_compiled
from jaxspec.core.sampling import filter_top_k_top_p
from models.diffusion.modeling import DiffusionLM, bidirectional_mask
from models.llama.modeling import KVCache, init_cache

REMASKING = ("low_confidence", "random", "origin", "maskgit_plus", "topk_margin", "entropy")
CACHES = ("none", "prefix", "dual")
MAX_PREFIX_WIDTHS = 8  # distinct window widths compiled for cache="prefix"
ENTROPY_EPS = 1e-10  # Dream's epsilon inside log(p + eps)


@dataclasses.dataclass(frozen=True)
class DiffusionDecodeConfig:
    """How to decode a masked-diffusion LM (frozen, hashable: a static jit argument).

    Attributes:
      gen_length: number of generated positions (all start masked).
      block_length: semi-autoregressive block size; ``gen_length % block_length == 0``.
        ``block_length == gen_length`` is a single block (no semi-AR).
      steps: total steps for the stepwise schedule (``"stepwise"`` method); must be
        divisible by ``num_blocks``. Ignored by fixed-k and threshold decoding.
      remasking: which masked positions to transfer: one of :data:`REMASKING`
        (``"low_confidence"``/``"random"``: LLaDA; the others: Dream's rule names).
      temperature: 0 = arg-max; > 0 samples ``x0`` from ``softmax(logits / T)`` (Gumbel-max).
      cfg_scale: classifier-free guidance scale (0 = off).
      tokens_per_step: fixed-k parallel decoding (``None`` = off).
      threshold: Fast-dLLM confidence-threshold parallel decoding (``None`` = off).
      mask_id: override of the model's ``mask_token_id`` (``None`` = the model's).
      eps: Dream's final time for ``"origin"`` (time grid ``linspace(1, eps, steps + 1)``).
      logits_eos_inf: never generate an id of ``eos_ids`` (LLaDA option; module docstring).
      confidence_eos_eot_inf: transfer predicted ``eos_ids`` last (LLaDA option; module
        docstring).
      schedule: stepwise transfer counts: ``"llada"`` (``get_num_transfer_tokens``) or
        ``"dream"`` (``int(n_masked * (1 - s/t))``, the rest at the last step).
      cache: ``"none"``, ``"prefix"`` or ``"dual"`` (Fast-dLLM KV caches; module docstring).
      top_k: keep the ``top_k`` most likely tokens before sampling (0 = off).
      top_p: nucleus filter before sampling (1.0 = off), in ``(0, 1]``.
      alg_temp: Dream's ``alg_temp``: > 0 draws the transferred positions from
        ``softmax(confidence / alg_temp)`` instead of taking the most confident (stepwise and
        fixed-k only; 0 = off).

    Raises:
      ValueError: non-positive lengths/steps, ``gen_length % block_length != 0``, ``steps``
        not divisible by the number of blocks (stepwise), unknown ``remasking``, negative
        temperature or cfg scale, ``tokens_per_step < 1``, both ``tokens_per_step`` and
        ``threshold`` set, a non-finite threshold, ``"origin"`` with parallel decoding,
        an unknown ``cache``, ``top_k < 0``, ``top_p`` outside ``(0, 1]``, a negative
        ``alg_temp``, or ``alg_temp`` with ``threshold`` / ``"origin"`` / ``"random"``.
    """

    gen_length: int = 16
    block_length: int = 16
    steps: int = 16
    remasking: str = "low_confidence"
    temperature: float = 0.0
    cfg_scale: float = 0.0
    tokens_per_step: Optional[int] = None
    threshold: Optional[float] = None
    mask_id: Optional[int] = None
    eps: float = 1e-3
    logits_eos_inf: bool = False
    confidence_eos_eot_inf: bool = False
    schedule: str = "llada"
    cache: str = "none"
    top_k: int = 0
    top_p: float = 1.0
    alg_temp: float = 0.0

    def __post_init__(self):
        if self.cache not in CACHES:
            raise ValueError(f"unknown cache {self.cache!r}; expected one of {', '.join(CACHES)}")
        if int(self.top_k) < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if not self.alg_temp >= 0.0:
            raise ValueError(f"alg_temp must be >= 0, got {self.alg_temp}")
        if self.alg_temp > 0 and (self.threshold is not None
                                  or self.remasking in ("origin", "random")):
            raise ValueError("alg_temp samples positions by confidence; it works with stepwise "
                             "or fixed-k decoding and a confidence rule (not threshold, "
                             "'origin' or 'random')")
        if self.gen_length < 1 or self.block_length < 1:
            raise ValueError(f"gen_length and block_length must be >= 1, got "
                             f"{self.gen_length} and {self.block_length}")
        if self.gen_length % self.block_length:
            raise ValueError(f"gen_length {self.gen_length} is not a multiple of block_length "
                             f"{self.block_length}")
        if self.schedule not in ("llada", "dream"):
            raise ValueError(f"unknown schedule {self.schedule!r}; expected 'llada' or 'dream'")
        if self.remasking not in REMASKING:
            raise ValueError(f"unknown remasking {self.remasking!r}; expected one of "
                             f"{', '.join(REMASKING)}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not self.cfg_scale >= 0.0:
            raise ValueError(f"cfg_scale must be >= 0, got {self.cfg_scale}")
        if self.tokens_per_step is not None and self.threshold is not None:
            raise ValueError("tokens_per_step and threshold are exclusive; set at most one")
        if self.tokens_per_step is not None and self.tokens_per_step < 1:
            raise ValueError(f"tokens_per_step must be >= 1, got {self.tokens_per_step}")
        if self.threshold is not None and not np.isfinite(self.threshold):
            raise ValueError(f"threshold must be finite, got {self.threshold}")
        if self.method == "stepwise":
            if self.steps < 1:
                raise ValueError(f"steps must be >= 1, got {self.steps}")
            if self.steps % self.num_blocks:
                raise ValueError(f"steps {self.steps} is not divisible by the number of blocks "
                                 f"{self.num_blocks} (gen_length / block_length)")
        elif self.remasking == "origin":
            raise ValueError("remasking 'origin' has its own random transfer count; it only "
                             "works with stepwise decoding (no tokens_per_step / threshold)")

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.num_blocks

    @property
    def method(self) -> str:
        """``"stepwise"``, ``"fixed-k"`` or ``"threshold"`` (the stats' method name)."""
        if self.tokens_per_step is not None:
            return "fixed-k"
        if self.threshold is not None:
            return "threshold"
        return "stepwise"


def num_transfer_tokens(mask_count: int, steps: int) -> np.ndarray:
    """LLaDA's per-step transfer counts for one block.

    Source: ML-GSAI/LLaDA ``generate.py``, ``get_num_transfer_tokens``: ``mask_count // steps``
    per step, the remainder ``mask_count % steps`` spread +1 over the first steps.

    Returns: int32 ``(steps,)`` summing to ``mask_count``.
    """
    out = np.full((steps,), mask_count // steps, np.int32)
    out[:mask_count % steps] += 1
    return out


def origin_probs(steps: int, eps: float) -> np.ndarray:
    """Dream ``"origin"`` reveal probabilities per step: ``1 - s/t`` with ``t, s`` consecutive
    points of ``linspace(1, eps, steps + 1)``, and 1 at the last step. float32 ``(steps,)``."""
    t = np.linspace(1.0, eps, steps + 1)
    p = 1.0 - t[1:] / t[:-1]
    p[-1] = 1.0
    return p.astype(np.float32)


def row_noise(key: jax.Array, row, step, block_length: int, vocab: int, with_tokens: bool):
    """The random numbers of one batch row at one of its steps (shared with test oracles).

    Args:
      key: the run's PRNG key (``PRNGKey(seed)``).
      row: int, the batch row; step: int, the row's 0-based step.

    Returns:
      ``(u_tok, u_pos)``: ``u_tok`` float32 ``(block_length, vocab)`` uniforms in
      ``[tiny, 1)`` for the Gumbel noise of the token samples (``None`` when ``with_tokens``
      is False); ``u_pos`` float32 ``(block_length,)`` uniforms in ``[tiny, 1)`` for
      ``"random"`` / ``"origin"`` remasking and ``alg_temp``; both index the current block.
    """
    tiny = jnp.finfo(jnp.float32).tiny
    kt, kp = jax.random.split(jax.random.fold_in(jax.random.fold_in(key, row), step))
    u_pos = jax.random.uniform(kp, (block_length,), jnp.float32, minval=tiny)
    u_tok = (jax.random.uniform(kt, (block_length, vocab), jnp.float32, minval=tiny)
             if with_tokens else None)
    return u_tok, u_pos


def step_noise(key: jax.Array, steps: jax.Array, block_length: int, vocab: int,
               with_tokens: bool):
    """:func:`row_noise` for every row: ``steps`` int32 ``(B,)`` -> ``(u_tok (B, L, V) or
    None, u_pos (B, L))``."""
    rows = jnp.arange(steps.shape[0])
    return jax.vmap(lambda r, s: row_noise(key, r, s, block_length, vocab, with_tokens))(rows, steps)


def block_confidence(logits: jax.Array, x0: jax.Array, u_pos: jax.Array, remasking: str,
                     temperature: float) -> jax.Array:
    """Confidence of each block position under a remasking rule (higher = transfer first).

    Args:
      logits: float32 ``(B, L, V)`` (mask logit already ``-inf``).
      x0: int32 ``(B, L)`` predicted tokens.
      u_pos: float32 ``(B, L)`` uniforms (the ``"random"`` confidence).
      remasking: a name in :data:`REMASKING` (``"origin"`` returns ``u_pos``, unused).
      temperature: Dream's rules use ``softmax(logits / T)``; a Python ``0`` means no
        scaling (a traced value is always divided by).

    Returns: float32 ``(B, L)``.
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


def _rank(conf: jax.Array) -> jax.Array:
    """int32 ``(..., L)``: 0 for the most confident position; ties go to the lower index."""
    L = conf.shape[-1]
    ci, cj = conf[..., :, None], conf[..., None, :]
    idx = jnp.arange(L)
    before = (cj > ci) | ((cj == ci) & (idx[None, :] < idx[:, None]))
    return jnp.sum(before, axis=-1).astype(jnp.int32)


def score_block(blk: jax.Array, bmask: jax.Array, u_tok: Optional[jax.Array], u_pos: jax.Array,
                cfg: DiffusionDecodeConfig, mask_id: int, temperature, alg_temp=1.0,
                eos_ids: tuple[int, ...] = ()):
    """One step's predictions and transfer ranking on a block (the reference step rule).

    Args:
      blk: float32 ``(..., L, V)`` logits scoring the block's positions.
      bmask: bool ``(..., L)``: the position is still masked.
      u_tok: float32 ``(..., L, V)`` uniforms (Gumbel noise) or None when greedy;
        u_pos: float32 ``(..., L)`` uniforms (:func:`row_noise`).
      cfg: the (structural) decode config: temperature on/off, top-k/top-p, remasking, EOS
        options, alg_temp on/off.
      mask_id: never predicted (its logit is set to ``-inf``).
      temperature, alg_temp: traced values (used when ``cfg`` turns them on).

    Returns:
      ``(x0 int32 (..., L), conf float32 (..., L), rank int32 (..., L))``: the predicted
      tokens, their confidence (``-inf`` where not masked) and the transfer rank (0 = first;
      unmasked positions rank after every masked one).
    """
    blk = blk.at[..., mask_id].set(-jnp.inf)
    if cfg.logits_eos_inf:
        blk = blk.at[..., list(eos_ids)].set(-jnp.inf)
    sampled = cfg.temperature > 0
    filt = cfg.top_k > 0 or cfg.top_p < 1.0
    scaled = blk / temperature if sampled else blk
    if filt:
        scaled = filter_top_k_top_p(scaled, cfg.top_k, cfg.top_p)
    if sampled:
        x0 = jnp.argmax(scaled - jnp.log(-jnp.log(u_tok)), axis=-1).astype(jnp.int32)
    else:
        x0 = jnp.argmax(scaled, axis=-1).astype(jnp.int32)
    if cfg.remasking == "low_confidence" or not filt:
        conf = block_confidence(blk, x0, u_pos, cfg.remasking, temperature if sampled else 0.0)
    else:  # Dream's rules on the filtered (already temperature-scaled) distribution
        conf = block_confidence(scaled, x0, u_pos, cfg.remasking, 0.0)
    if cfg.confidence_eos_eot_inf:
        conf = jnp.where(jnp.isin(x0, jnp.asarray(eos_ids, jnp.int32)),
                         jnp.finfo(jnp.float32).min, conf)
    conf = jnp.where(bmask, conf, -jnp.inf)
    if cfg.alg_temp > 0:   # Gumbel-top-k == multinomial without replacement (Dream)
        rank = _rank(jnp.where(bmask, conf / alg_temp - jnp.log(-jnp.log(u_pos)), -jnp.inf))
    else:
        rank = _rank(conf)
    return x0, conf, rank


@flax.struct.dataclass
class _State:
    tokens: jax.Array    # int32 (B, S) the sequence (prompt, then generation slots)
    masked: jax.Array    # bool (B, G) generation position still masked
    tstep: jax.Array     # int32 (B, G) step at which the position was transferred (-1: not yet)
    block: jax.Array     # int32 (B,) current block
    sib: jax.Array       # int32 (B,) step within the current block
    steps: jax.Array     # int32 (B,) steps taken (forwards while active)
    hist: jax.Array      # int32 (B, L+1) steps that transferred j tokens
    ftok: jax.Array      # int32 (B,) query tokens pushed through the model
    wait: jax.Array      # bool (B,) cached modes: the row's block is full, others' are not
    cache: Optional[KVCache]  # cached modes: keys/values of the block's first step
    prev: Optional[jax.Array]  # float32 (B, V) Dream + cache: raw logits at block_start - 1


def prefix_widths(prompt_len: int, cfg: "DiffusionDecodeConfig") -> tuple[tuple[int, ...], int]:
    """Window widths of ``cache="prefix"`` and the cache size they need.

    The exact window of block ``b`` is ``gen_length - b * block_length`` tokens; it is
    rounded up to a multiple of ``chunk = block_length * ceil(num_blocks / 8)`` so that at
    most :data:`MAX_PREFIX_WIDTHS` distinct widths are compiled.

    Returns: ``(width per block, cache size)`` with cache size ``>= prompt_len + gen_length``.
    """
    G, L, nb = cfg.gen_length, cfg.block_length, cfg.num_blocks
    chunk = L * -(-nb // MAX_PREFIX_WIDTHS)
    widths = tuple(-(-(G - b * L) // chunk) * chunk for b in range(nb))
    return widths, max(prompt_len + b * L + w for b, w in enumerate(widths))


def transfer_schedule(cfg: DiffusionDecodeConfig) -> jax.Array:
    """int32 ``(steps_per_block,)`` LLaDA transfer counts of a stepwise block (``(1,)`` zeros for
    fixed-k / threshold): the ``sched`` argument of :func:`transfer_rule`."""
    if cfg.method == "stepwise":
        return jnp.asarray(num_transfer_tokens(cfg.block_length, cfg.steps_per_block))
    return jnp.zeros((1,), jnp.int32)


def transfer_rule(cfg: DiffusionDecodeConfig, bmask: jax.Array, conf: jax.Array, rank: jax.Array,
                  u_pos: jax.Array, sib: jax.Array, sched: jax.Array, p_origin: jax.Array,
                  k_fixed, threshold) -> jax.Array:
    """Which masked block positions one reference step transfers (the unmasking rate ``S_t``).

    Args:
      cfg: the structural decode config (method, schedule, remasking).
      bmask: bool ``(B, L)`` still masked; conf, rank: from :func:`score_block`;
      u_pos: float32 ``(B, L)`` the step's position uniforms (``"origin"``).
      sib: int32 ``(B,)`` the step's index within its block.
      sched: :func:`transfer_schedule`; p_origin: float32 ``(steps_per_block,)`` the
        ``1 - s/t`` fractions (``"origin"`` and the Dream schedule).
      k_fixed, threshold: traced fixed-k count and Fast-dLLM threshold.

    Returns: bool ``(B, L)``: stepwise = the ``sched[sib]`` (LLaDA) or ``int(n * (1 - s/t))``
    (Dream) best-ranked positions, ``"origin"`` = independent reveals, fixed-k = the ``k``
    best, threshold = every position with ``conf >= threshold`` plus the best one.
    """
    spb = cfg.steps_per_block
    method = cfg.method
    n_masked = jnp.sum(bmask, axis=-1)
    sib = jnp.minimum(sib, spb - 1) if method == "stepwise" else sib
    if cfg.remasking == "origin":
        last = sib == spb - 1
        return bmask & ((u_pos < p_origin[sib][:, None]) | last[:, None])
    if method == "stepwise" and cfg.schedule == "dream":
        k = jnp.floor(n_masked.astype(jnp.float32) * p_origin[sib]).astype(jnp.int32)
        k = jnp.where(sib == spb - 1, n_masked, k)
        return bmask & (rank < k[:, None])
    if method == "stepwise":
        return bmask & (rank < sched[sib][:, None])
    if method == "fixed-k":
        return bmask & (rank < k_fixed)
    return bmask & ((conf >= threshold) | (rank == 0))


def _decode(params, prompt: jax.Array, pad: jax.Array, key: jax.Array, nums: jax.Array,
            p_origin: jax.Array, *, model: DiffusionLM, cfg: DiffusionDecodeConfig, mask_id: int,
            eos_ids: tuple[int, ...] = ()):
    """The jitted body. ``cfg`` is the *structural* config (:func:`_structural`); the
    numeric knobs arrive traced in ``nums`` = float32 ``[temperature, cfg_scale + 1,
    threshold, tokens_per_step, alg_temp]`` and ``p_origin`` float32 ``(steps_per_block,)``
    (the ``1 - s/t`` fractions of "origin" and the Dream schedule), so sweeping them reuses
    one executable."""
    temperature, cfg_w, threshold, k_fixed, alg_temp = (nums[i] for i in range(5))
    B, P = prompt.shape
    G, L = cfg.gen_length, cfg.block_length
    S, V = P + G, model.config.vocab_size
    nb, spb = cfg.num_blocks, cfg.steps_per_block
    method = cfg.method
    cached = cfg.cache != "none"
    shift = 1 if model.config.head == "dream" else 0
    sampled = cfg.temperature > 0
    slots = jnp.arange(S, dtype=jnp.int32)[None]
    valid = slots >= pad[:, None]                                   # (B, S)
    positions = jnp.maximum(slots - pad[:, None], 0)
    attn = bidirectional_mask(valid)
    is_prompt = valid & (slots < P)
    sched = transfer_schedule(cfg)
    use_cfg = cfg.cfg_scale > 0
    if cfg.cache == "prefix":
        widths, S_c = prefix_widths(P, cfg)
        branch_widths = tuple(sorted(set(widths)))
        branch_of_block = jnp.asarray([branch_widths.index(w) for w in widths], jnp.int32)
    else:
        S_c = S
    key_valid = jnp.pad(valid, ((0, 0), (0, S_c - S)))                # (B, S_c)

    def run(tokens, pos, mask, row0, cache=None, idx=None, uncond=None):
        """Raw (unshifted) logits float32 (B, L, V) of rows ``row0 + [0, L)``, with CFG
        mixing; and the cache."""
        if use_cfg:
            two = lambda a, b_=None: jnp.concatenate([a, a if b_ is None else b_], 0)
            tokens, pos, mask, row0 = two(tokens, uncond), two(pos), two(mask), two(row0)
            if idx is not None:
                idx = two(idx)
        logits, cache = model.apply(params, tokens, pos, mask, cache=cache, cache_index=idx,
                                    shift=False, rows=(row0, L))
        logits = logits.astype(jnp.float32)
        if use_cfg:
            cond, unc = logits[:B], logits[B:]
            logits = unc + cfg_w * (cond - unc)
        return logits, cache

    def full_forward(st: _State, start):
        """Every slot through the model; the block's rows (B, L, V) (Dream: raw rows
        ``start - 1 + [0, L)``)."""
        uncond = jnp.where(is_prompt, mask_id, st.tokens) if use_cfg else None
        if not cached:
            rows, _ = run(st.tokens, positions, attn, start - shift, uncond=uncond)
            return rows, st.cache, st.prev, S
        mask = jnp.pad(attn, ((0, 0), (0, 0), (0, S_c - S)))
        rows, cache = run(st.tokens, positions, mask, start - shift, st.cache,
                          jnp.zeros((B,), jnp.int32), uncond)
        return rows, cache, (rows[:, 0] if shift else st.prev), S

    def window_forward(st: _State, start, W: int):
        """Forward ``W`` tokens from slot ``start`` (the same for every row: lockstep)
        against the cache; returns the block's rows as full_forward does."""
        s0 = start[0]
        toks = jnp.pad(st.tokens, ((0, 0), (0, S_c - S)), constant_values=mask_id)
        toks = jax.lax.dynamic_slice_in_dim(toks, s0, W, 1)
        pos = s0 + jnp.arange(W, dtype=jnp.int32)[None] - pad[:, None]
        mask = jnp.broadcast_to(key_valid[:, None, :], (B, W, S_c))
        raw, _ = run(toks, pos, mask, jnp.zeros((B,), jnp.int32), st.cache,
                     jnp.full((B,), s0, jnp.int32), toks if use_cfg else None)
        rows = raw if not shift else jnp.concatenate([st.prev[:, None], raw[:, :L - 1]], 1)
        # the window's keys/values are rewritten by every window call before use, so the
        # block-start cache is kept unchanged (no updated cache leaves the branch)
        return rows, st.cache, st.prev, W

    def forward(st: _State, start):
        if not cached:
            return full_forward(st, start)
        if cfg.cache == "dual":
            step = lambda s: window_forward(s, start, L)
        else:
            branches = [lambda s, W=W: window_forward(s, start, W) for W in branch_widths]
            step = lambda s: jax.lax.switch(branch_of_block[jnp.minimum(s.block[0], nb - 1)],
                                            branches, s)
        def as32(f):
            def g(s):
                rows, cache, prev, n = f(s)
                return rows, cache, prev, jnp.int32(n)
            return g
        return jax.lax.cond(jnp.all(st.sib == 0), as32(lambda s: full_forward(s, start)),
                            as32(step), st)

    def body(st: _State) -> _State:
        active = (st.block < nb) & ~st.wait                           # (B,)
        start = P + jnp.minimum(st.block, nb - 1) * L                # (B,)
        blk, cache, prev, n_fwd = forward(st, start)
        u_tok, u_pos = step_noise(key, st.steps, L, V, sampled)
        off = start - P
        bmask = jax.vmap(lambda m, o: jax.lax.dynamic_slice_in_dim(m, o, L, 0))(st.masked, off)
        x0, conf, rank = score_block(blk, bmask, u_tok, u_pos, cfg, mask_id, temperature,
                                     alg_temp, eos_ids)
        n_masked = jnp.sum(bmask, axis=-1)
        transfer = transfer_rule(cfg, bmask, conf, rank, u_pos, st.sib, sched, p_origin, k_fixed,
                                 threshold) & active[:, None]
        n_tr = jnp.sum(transfer, axis=-1).astype(jnp.int32)

        def write(row, new, tr, s):
            cur = jax.lax.dynamic_slice_in_dim(row, s, L, 0)
            return jax.lax.dynamic_update_slice_in_dim(row, jnp.where(tr, new, cur), s, 0)

        tokens = jax.vmap(write)(st.tokens, x0, transfer, start)
        masked = jax.vmap(write)(st.masked, jnp.zeros_like(transfer), transfer, off)
        tstep = jax.vmap(write)(st.tstep, jnp.broadcast_to(st.steps[:, None], (B, L)), transfer, off)
        if method == "stepwise":
            block_done = st.sib + 1 >= spb
        else:
            block_done = n_masked - n_tr == 0
        act = active.astype(jnp.int32)
        if cached:   # lockstep: advance together once every row's block is full
            done = st.wait | (active & block_done) | (st.block >= nb)
            adv = jnp.all(done)
            nxt_block = jnp.where(adv, st.block + 1, st.block)
            nxt_sib = jnp.where(adv, 0, st.sib + act)
            wait = done & ~adv
        else:
            nxt_block = jnp.where(active & block_done, st.block + 1, st.block)
            nxt_sib = jnp.where(active & block_done, 0, st.sib + act)
            wait = st.wait
        return _State(tokens=tokens, masked=masked, tstep=tstep, block=nxt_block, sib=nxt_sib,
                      steps=st.steps + act,
                      hist=st.hist + act[:, None] * jax.nn.one_hot(n_tr, L + 1, dtype=jnp.int32),
                      ftok=st.ftok + act * n_fwd, wait=wait, cache=cache, prev=prev)

    tokens = jnp.concatenate([prompt, jnp.full((B, G), mask_id, jnp.int32)], axis=1)
    R = 2 * B if use_cfg else B
    st = _State(tokens=tokens, masked=jnp.ones((B, G), bool), tstep=jnp.full((B, G), -1, jnp.int32),
                block=jnp.zeros((B,), jnp.int32), sib=jnp.zeros((B,), jnp.int32),
                steps=jnp.zeros((B,), jnp.int32), hist=jnp.zeros((B, L + 1), jnp.int32),
                ftok=jnp.zeros((B,), jnp.int32), wait=jnp.zeros((B,), bool),
                cache=init_cache(model.config.base, R, S_c) if cached else None,
                prev=jnp.zeros((B, V), jnp.float32) if cached and shift else None)
    st = jax.lax.while_loop(lambda s: jnp.any(s.block < nb), body, st)
    return st.tokens[:, P:], st.tstep, st.steps, st.hist, st.ftok


_decode_jit = jax.jit(_decode, static_argnames=("model", "cfg", "mask_id", "eos_ids"))


def _structural(cfg: DiffusionDecodeConfig) -> DiffusionDecodeConfig:
    """``cfg`` with its numeric knobs replaced by placeholders that keep only what changes
    the compiled program (whether temperature / CFG / alg_temp are on, which method)."""
    return dataclasses.replace(
        cfg, temperature=1.0 if cfg.temperature > 0 else 0.0,
        cfg_scale=1.0 if cfg.cfg_scale > 0 else 0.0,
        threshold=None if cfg.threshold is None else 0.0,
        tokens_per_step=None if cfg.tokens_per_step is None else 1, eps=1e-3, mask_id=None,
        alg_temp=1.0 if cfg.alg_temp > 0 else 0.0)


def _numeric_args(cfg: DiffusionDecodeConfig):
    nums = np.array([cfg.temperature if cfg.temperature > 0 else 1.0, cfg.cfg_scale + 1.0,
                     cfg.threshold or 0.0, cfg.tokens_per_step or 0,
                     cfg.alg_temp if cfg.alg_temp > 0 else 1.0], np.float32)
    p_origin = (origin_probs(cfg.steps_per_block, cfg.eps)
                if cfg.method == "stepwise" and (cfg.remasking == "origin" or cfg.schedule == "dream")
                else np.zeros(1, np.float32))
    return jnp.asarray(nums), jnp.asarray(p_origin)


@dataclasses.dataclass
class DiffusionResult:
    """Output of :func:`diffusion_generate`.

    Attributes:
      tokens: per row, the generated ids cut after the first EOS (kept).
      full_tokens: int32 ``(B, gen_length)`` every generated position (no cut).
      transfer_step: int32 ``(B, gen_length)``: the 0-based step (of that row) at which each
        generation position was unmasked; the transfer order.
      stats: :class:`jaxspec.core.stats.DecodeStats` (``target_nfe`` = forwards, ``steps``,
        ``accept_hist[b, j]`` = steps of row ``b`` that transferred ``j`` tokens,
        ``draft_length`` 0, reference ``"stepwise"``).
      compile_s: seconds spent compiling (0 when a cached executable was reused).
      run_s: wall-clock seconds of the decode itself.
    """

    tokens: list[list[int]]
    full_tokens: np.ndarray
    transfer_step: np.ndarray
    stats: DecodeStats
    compile_s: float
    run_s: float


def prepare_batch(model: DiffusionLM, prompts: Sequence[Sequence[int]],
                  cfg: DiffusionDecodeConfig, eos_ids: Sequence[int] = (), pad_id: int = 0,
                  bucket: int = 16, max_context: Optional[int] = None):
    """Check a decode request and left-pad the prompts (shared by every diffusion decoder).

    Returns:
      ``(buf int32 (B, P), pad int32 (B,), mask_id)``: prompts left-padded with ``pad_id``
      to ``P`` (a multiple of ``bucket``), the padding count per row, the mask token id.

    Raises:
      ValueError: see :func:`diffusion_generate`.
    """
    base = model.config.base
    V = base.vocab_size
    mask_id = model.config.mask_token_id if cfg.mask_id is None else int(cfg.mask_id)
    if not 0 <= mask_id < V:
        raise ValueError(f"mask id {mask_id} is outside the vocabulary [0, {V})")
    if (cfg.logits_eos_inf or cfg.confidence_eos_eot_inf) and not eos_ids:
        raise ValueError("logits_eos_inf / confidence_eos_eot_inf need eos_ids")
    if any(not 0 <= int(e) < V for e in eos_ids):
        raise ValueError(f"eos_ids must lie in [0, {V})")
    if not prompts or min(len(p) for p in prompts) == 0:
        raise ValueError("need at least one prompt, and every prompt needs at least one token")
    for p in prompts:
        if min(p) < 0 or max(p) >= V:
            raise ValueError(f"prompt token ids must lie in [0, {V})")
    lens = [len(p) for p in prompts]
    P = max(bucket, -(-max(lens) // bucket) * bucket)
    ctx = max_context or base.max_position_embeddings
    if max(lens) + cfg.gen_length > ctx or P + cfg.gen_length > ctx:
        raise ValueError(f"prompt ({max(lens)} tokens, padded to {P}) + gen_length "
                         f"{cfg.gen_length} exceeds the context of {ctx} tokens")
    buf = np.full((len(prompts), P), pad_id, np.int32)
    for i, p in enumerate(prompts):
        buf[i, P - len(p):] = p
    return buf, np.array([P - n for n in lens], np.int32), mask_id


def cut_after_eos(tokens: np.ndarray, eos_ids: Sequence[int]) -> list[list[int]]:
    """Rows of ``tokens`` ``(B, G)`` as lists, each cut after its first EOS (kept)."""
    eos = {int(e) for e in eos_ids}
    rows = []
    for row in np.asarray(tokens).tolist():
        for i, t in enumerate(row):
            if t in eos:
                row = row[:i + 1]
                break
        rows.append(row)
    return rows


def diffusion_generate(model: DiffusionLM, params, prompts: Sequence[Sequence[int]],
                       cfg: DiffusionDecodeConfig, seed: int = 0, eos_ids: Sequence[int] = (),
                       pad_id: int = 0, bucket: int = 16,
                       max_context: Optional[int] = None) -> DiffusionResult:
    """Decode a batch of prompts with a masked-diffusion LM (see the module docstring).

    Args:
      model: a :class:`models.diffusion.modeling.DiffusionLM` (``"llada"`` or ``"dream"`` head).
      params: its ``CausalLM`` parameter tree.
      prompts: ``B >= 1`` non-empty lists of token ids (left-padded to a multiple of
        ``bucket``).
      cfg: :class:`DiffusionDecodeConfig`.
      seed: PRNG seed; the same seed reproduces a run exactly.
      eos_ids: tokens after which the returned lists are cut (EOS kept).
      pad_id: filler for left padding (never attended).
      bucket: prompt-length bucket (one compile serves many prompt lengths).
      max_context: context length (default ``config.base.max_position_embeddings``).

    Returns:
      :class:`DiffusionResult`.

    Raises:
      ValueError: no prompts or an empty prompt, token ids outside the vocabulary, mask id
        outside the vocabulary, padded prompt + ``gen_length`` longer than the context, EOS
        ids outside the vocabulary, or an EOS option without ``eos_ids``.
    """
    buf, pad, mask_id = prepare_batch(model, prompts, cfg, eos_ids, pad_id, bucket, max_context)
    args = (params, jnp.asarray(buf), jnp.asarray(pad), jax.random.PRNGKey(seed),
            *_numeric_args(cfg))
    scfg = _structural(cfg)
    uses_eos = cfg.logits_eos_inf or cfg.confidence_eos_eot_inf
    statics = dict(model=model, cfg=scfg, mask_id=mask_id,
                   eos_ids=tuple(sorted({int(e) for e in eos_ids})) if uses_eos else ())
    out, compile_s, run_s = run_compiled(_decode_jit, args, statics)
    toks, tstep, steps, hist, ftok = (np.asarray(x) for x in out)
    rows = cut_after_eos(toks, eos_ids)
    nfe = steps * (2 if cfg.cfg_scale > 0 else 1)
    stats = DecodeStats(
        method=cfg.method, reference="stepwise", target_nfe=nfe, draft_nfe=np.zeros_like(nfe),
        steps=steps, accept_hist=hist, new_tokens=np.array([len(r) for r in rows]),
        draft_length=0, drafts_proposed=np.zeros_like(nfe),
        extra={"remasking": cfg.remasking, "gen_length": cfg.gen_length,
               "block_length": cfg.block_length, "cache": cfg.cache,
               "forward_tokens": int(ftok.sum())})
    return DiffusionResult(tokens=rows, full_tokens=toks, transfer_step=tstep, stats=stats,
                           compile_s=compile_s, run_s=run_s)


__all__ = ["DiffusionDecodeConfig", "DiffusionResult", "diffusion_generate", "num_transfer_tokens",
           "origin_probs", "row_noise", "transfer_rule", "transfer_schedule", "step_noise", "block_confidence", "prefix_widths", "score_block",
           "REMASKING", "CACHES"]
