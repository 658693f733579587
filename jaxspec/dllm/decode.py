"""Reference decoders for masked-diffusion LMs (LLaDA / Dream), jitted with static shapes.

One ``lax.while_loop`` runs every variant. Each loop iteration is one *step*: one model
forward over the padded sequence (prompt + generation slots, full bidirectional attention),
then some still-masked positions of the row's *current block* are *transferred* (unmasked:
their predicted token is written and kept for good) by the reference step of
:mod:`jaxspec.dllm.reference` (stepwise LLaDA / Dream schedules, fixed-k, Fast-dLLM threshold;
the remasking rules, temperature, top-k / top-p, ``alg_temp`` and EOS options are documented
there).

Sources (facts only; the code is our own):

* **LLaDA** (ML-GSAI/LLaDA ``generate.py``, ``generate``): semi-autoregressive blocks of
  ``block_length``; ``steps // num_blocks`` steps per block; classifier-free guidance with the
  prompt replaced by mask tokens, ``logits = un + (cfg + 1)(cond - un)``.
* **Dream** (Dream-org/Dream ``generation_utils.py``, ``DreamGenerationMixin._sample``): with
  one block (``block_length == gen_length``) and ``schedule="dream"`` the loop is Dream's.
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
  to at most 8 distinct widths (:func:`jaxspec.dllm.blocks.prefix_widths`; ``lax.switch``
  over them). Dream's head needs the raw logits of position ``block_start - 1`` for the
  block's first position; in cached steps that row is the one computed by the block's full
  forward. With a cache the rows of a batch move through the blocks in lockstep: a row whose
  block is full waits (no NFE counted) until every row's block is full, exactly as
  Fast-dLLM's batched loop; a row's tokens do not depend on this. ``forward_tokens`` in the
  stats counts the query tokens each row pushed through the model.

Conventions (each documented because it is observable):

* **EOS / EoT.** Like LLaDA, decoding always fills the whole ``gen_length`` (EOS tokens are
  ordinary tokens during decoding). The returned token lists are cut after the first EOS in
  *position* order (the EOS is kept); ``new_tokens`` counts the kept tokens, NFE counts all
  steps.
* **NFE** counts model forwards over a sequence: one per step, two with classifier-free
  guidance (the conditional and the unconditional pass, run as one batched call).
* **Left padding.** Prompts are left-padded to a bucketed length ``P``; padding is excluded
  from attention (:func:`models.diffusion.modeling.bidirectional_mask`) and RoPE position of
  slot ``s`` is ``s - pad``. Generation slots are ``[P, P + G)``. With CFG the unconditional
  row replaces the prompt (not the padding) by mask tokens.
* **Batches.** Rows advance independently (own block and step counters; lockstep with a
  cache); the loop runs until every row is done; a finished row is not counted in NFE.
* **Randomness** comes from :func:`jaxspec.dllm.reference.row_noise` (keyed by seed, batch row
  and the row's step), so a seed reproduces a run exactly and tests can replay the same noise.

Layout of this module: the config (:class:`~jaxspec.dllm.config.DiffusionDecodeConfig`) ->
:class:`Loop` (what a step reads) -> :class:`State` -> the forward phases -> :func:`step` ->
:func:`decode_loop` (one ``lax.while_loop``) -> :func:`diffusion_generate` (host).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.batching import place_batch
from jaxspec.core.runtime import run_compiled
from jaxspec.dllm.blocks import (
    BlockCache,
    BlockCursor,
    Canvas,
    Counters,
    Layout,
    advance_blocks,
    dream_shift,
    prefix_widths,
    prepend_prev,
    window_inputs,
)
from jaxspec.dllm.config import (
    CACHES,
    REMASKING,
    DiffusionDecodeConfig,
    DiffusionResult,
    diffusion_result,
    eos_statics,
    prepare_batch,
    structural,
)
from jaxspec.dllm.reference import Knobs, Rule, reference_step
from models.diffusion.modeling import DiffusionLM
from models.llama.layout import decode_layout


@dataclasses.dataclass(frozen=True, eq=False)
class Loop:
    """What every step of one decode reads and never changes (built inside the jitted loop).

    Attributes:
      model, params: the masked-diffusion LM and its parameters.
      rule: the reference step rule (structural config, traced knobs, mask / EOS ids).
      key: the run's PRNG key.
      pad: int32 ``(B,)`` left padding of each row; prompt_len: ``P``.
      layout: :class:`~jaxspec.dllm.blocks.Layout` over the ``S_c`` cache slots (``S_c = S``
        except for the prefix cache).
    """

    model: DiffusionLM
    params: Any
    rule: Rule
    key: jax.Array
    pad: jax.Array
    prompt_len: int
    layout: Layout

    @property
    def cfg(self) -> DiffusionDecodeConfig:
        return self.rule.cfg

    @property
    def seq_len(self) -> int:
        """``S = P + G``."""
        return self.prompt_len + self.cfg.gen_length

    @property
    def cached(self) -> bool:
        return self.cfg.cache != "none"

    @property
    def use_cfg(self) -> bool:
        return self.cfg.cfg_scale > 0

    @property
    def prefix_branches(self):
        """``cache="prefix"``: the distinct window widths and int32 ``(num_blocks,)`` the
        width index of every block."""
        widths, _ = prefix_widths(self.prompt_len, self.cfg)
        distinct = tuple(sorted(set(widths)))
        return distinct, jnp.asarray([distinct.index(w) for w in widths], jnp.int32)


@flax.struct.dataclass
class State:
    """The decode loop's carry.

    Attributes:
      canvas: tokens int32 ``(B, S)``, masked bool ``(B, G)``, transfer_step int32 ``(B, G)``.
      cursor: current block int32 ``(B,)``, step within it int32 ``(B,)``, lockstep flags.
      cache: the block cache (``kv`` over ``2B`` rows with CFG; ``prev_logits`` float32
        ``(B, V)`` for Dream); ``None`` fields without a cache.
      counters: steps, forwards, transfers-per-step histogram int32 ``(B, L + 1)``, query
        tokens.
    """

    canvas: Canvas
    cursor: BlockCursor
    cache: BlockCache
    counters: Counters


# ----------------------------------------------------------------------------- forwards


def model_rows(loop: Loop, tokens, positions, mask, row0, kv=None, cache_index=None, uncond=None):
    """One model call: raw (unshifted) logits float32 ``(B, L, V)`` of rows ``row0 + [0, L)``
    (CFG: the conditional and the ``uncond`` tokens as one ``2B`` batch, mixed as
    ``un + (cfg + 1)(cond - un)``), and the updated keys/values."""
    B = tokens.shape[0]
    if loop.use_cfg:
        two = lambda a, b_=None: jnp.concatenate([a, a if b_ is None else b_], 0)
        tokens, positions, mask, row0 = two(tokens, uncond), two(positions), two(mask), two(row0)
        if cache_index is not None:
            cache_index = two(cache_index)
    logits, kv = loop.model.apply(
        loop.params,
        tokens,
        positions,
        mask,
        cache=kv,
        cache_index=cache_index,
        shift=False,
        rows=(row0, loop.cfg.block_length),
    )
    logits = logits.astype(jnp.float32)
    if loop.use_cfg:
        cond, unc = logits[:B], logits[B:]
        logits = unc + loop.rule.knobs.cfg_weight * (cond - unc)
    return logits, kv


def full_forward(loop: Loop, st: State, start: jax.Array):
    """Every slot through the model (with a cache: the block's first step, refilling it).

    Returns: ``(rows float32 (B, L, V) scoring the block at slot start int32 (B,), cache,
    query tokens int32 ())``."""
    S, shift, lay = loop.seq_len, dream_shift(loop.model), loop.layout
    tokens = st.canvas.tokens
    is_prompt = lay.valid[:, :S] & (jnp.arange(S)[None] < loop.prompt_len)
    uncond = jnp.where(is_prompt, loop.rule.mask_id, tokens) if loop.use_cfg else None
    positions, attn = lay.positions[:, :S], lay.attn[:, :S]
    if not loop.cached:
        rows, _ = model_rows(loop, tokens, positions, attn, start - shift, uncond=uncond)
        return rows, st.cache, jnp.int32(S)
    rows, kv = model_rows(
        loop,
        tokens,
        positions,
        attn,
        start - shift,
        st.cache.kv,
        jnp.zeros((tokens.shape[0],), jnp.int32),
        uncond,
    )
    prev = rows[:, 0] if shift else st.cache.prev_logits
    return rows, BlockCache(kv, prev), jnp.int32(S)


def window_forward(loop: Loop, st: State, start: jax.Array, width: int):
    """Forward ``width`` tokens from slot ``start`` (the same for every row: lockstep) against
    the block-start cache; returns as :func:`full_forward` (the cache unchanged: the window's
    keys/values are rewritten by every window call before use)."""
    B, S_c = st.canvas.tokens.shape[0], loop.layout.valid.shape[1]
    s0 = start[0]
    toks = jnp.pad(
        st.canvas.tokens, ((0, 0), (0, S_c - loop.seq_len)), constant_values=loop.rule.mask_id
    )
    toks, pos, mask = window_inputs(toks, s0, width, loop.pad, loop.layout.valid)
    raw, _ = model_rows(
        loop,
        toks,
        pos,
        mask,
        jnp.zeros((B,), jnp.int32),
        st.cache.kv,
        jnp.full((B,), s0, jnp.int32),
        toks if loop.use_cfg else None,
    )
    rows = prepend_prev(st.cache.prev_logits, raw) if dream_shift(loop.model) else raw
    return rows, st.cache, jnp.int32(width)


def forward(loop: Loop, st: State, start: jax.Array):
    """The step's forward: full without a cache, or at a block's first step; else the dual
    cache's block window or the prefix cache's (bucketed) suffix window."""
    if not loop.cached:
        return full_forward(loop, st, start)
    L, nb = loop.cfg.block_length, loop.cfg.num_blocks
    if loop.cfg.cache == "dual":
        cached_step = lambda s: window_forward(loop, s, start, L)
    else:
        widths, branch_of_block = loop.prefix_branches
        branches = [lambda s, W=W: window_forward(loop, s, start, W) for W in widths]
        cached_step = lambda s: jax.lax.switch(
            branch_of_block[jnp.minimum(s.cursor.block[0], nb - 1)], branches, s
        )
    return jax.lax.cond(st.cursor.fresh, lambda s: full_forward(loop, s, start), cached_step, st)


# ----------------------------------------------------------------------------- the loop


def step(loop: Loop, st: State) -> State:
    """One reference step of every active row: forward, score the current block, transfer
    (:func:`jaxspec.dllm.reference.reference_step`), advance finished blocks."""
    cfg, P = loop.cfg, loop.prompt_len
    L, nb = cfg.block_length, cfg.num_blocks
    active = st.cursor.active(nb)  # (B,)
    start = st.cursor.start_slot(P, L, nb)  # (B,)
    rows, cache, n_fwd = forward(loop, st, start)
    tok, bmask, tstep = st.canvas.block(start, P, L)  # (B, L) each
    x0, transfer = reference_step(
        loop.rule, rows, bmask, loop.key, st.counters.steps, st.cursor.step_in_block
    )
    transfer = transfer & active[:, None]
    n_tr = jnp.sum(transfer, axis=-1).astype(jnp.int32)
    canvas = st.canvas.put_block(
        start,
        P,
        jnp.where(transfer, x0, tok),
        bmask & ~transfer,
        jnp.where(transfer, st.counters.steps[:, None], tstep),
    )
    if cfg.method == "stepwise":
        block_done = st.cursor.step_in_block + 1 >= cfg.steps_per_block
    else:
        block_done = jnp.sum(bmask, axis=-1) - n_tr == 0
    act = active.astype(jnp.int32)
    cursor = advance_blocks(st.cursor, active, block_done, act, nb, loop.cached)
    counters = st.counters.add(active, act, n_tr, jnp.zeros_like(act), n_fwd)
    return State(canvas=canvas, cursor=cursor, cache=cache, counters=counters)


def decode_loop(
    params,
    prompt: jax.Array,
    pad: jax.Array,
    key: jax.Array,
    knobs: Knobs,
    *,
    model: DiffusionLM,
    cfg: DiffusionDecodeConfig,
    mask_id: int,
    eos_ids: tuple[int, ...] = (),
):
    """The jitted decode: ``cfg`` is the *structural* config
    (:func:`jaxspec.dllm.config.structural`); the numeric settings arrive traced in ``knobs``.

    Args: prompt int32 ``(B, P)`` left-padded, pad int32 ``(B,)``, key the run's PRNG key.

    Returns: ``(tokens int32 (B, G), transfer_step int32 (B, G), Counters)``."""
    B, P = prompt.shape
    S = P + cfg.gen_length
    S_c = prefix_widths(P, cfg)[1] if cfg.cache == "prefix" else S
    loop = Loop(
        model=model,
        params=params,
        rule=Rule(knobs, cfg, mask_id, eos_ids),
        key=key,
        pad=pad,
        prompt_len=P,
        layout=Layout.of(pad, S, S_c),
    )
    cached = cfg.cache != "none"
    st = State(
        canvas=Canvas.start(prompt, cfg.gen_length, mask_id),
        cursor=BlockCursor.start(B),
        cache=BlockCache.start(model, 2 * B if cfg.cfg_scale > 0 else B, S_c, B, cached, params),
        counters=Counters.start(B, cfg.block_length + 1),
    )
    st = jax.lax.while_loop(
        lambda s: jnp.any(s.cursor.block < cfg.num_blocks), lambda s: step(loop, s), st
    )
    return st.canvas.tokens[:, P:], st.canvas.transfer_step, st.counters


_decode_jit = jax.jit(decode_loop, static_argnames=("model", "cfg", "mask_id", "eos_ids"))


def diffusion_generate(
    model: DiffusionLM,
    params,
    prompts: Sequence[Sequence[int]],
    cfg: DiffusionDecodeConfig,
    seed: int = 0,
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
    bucket: int = 16,
    max_context: Optional[int] = None,
) -> DiffusionResult:
    """Decode a batch of prompts with a masked-diffusion LM (see the module docstring).

    Args:
      model: a :class:`models.diffusion.modeling.DiffusionLM` (``"llada"`` or ``"dream"`` head).
      params: its ``CausalLM`` parameter tree.
      prompts: ``B >= 1`` non-empty lists of token ids (left-padded to a multiple of
        ``bucket``).
      cfg: :class:`~jaxspec.dllm.config.DiffusionDecodeConfig`.
      seed: PRNG seed; the same seed reproduces a run exactly.
      eos_ids: tokens after which the returned lists are cut (EOS kept).
      pad_id: filler for left padding (never attended).
      bucket: prompt-length bucket (one compile serves many prompt lengths).
      max_context: context length (default ``config.base.max_position_embeddings``).

    Returns:
      :class:`~jaxspec.dllm.config.DiffusionResult`: tokens, ``full_tokens`` int32 ``(B, G)``,
      ``transfer_step`` int32 ``(B, G)`` and the stats (``target_nfe`` = steps, twice with
      CFG; ``accept_hist[b, j]`` = steps that transferred ``j`` tokens; reference
      ``"stepwise"``).

    Raises:
      ValueError: no prompts or an empty prompt, token ids outside the vocabulary, mask id
        outside the vocabulary, padded prompt + ``gen_length`` longer than the context, EOS
        ids outside the vocabulary, or an EOS option without ``eos_ids``.
    """
    buf, pad, mask_id = prepare_batch(model, prompts, cfg, eos_ids, pad_id, bucket, max_context)
    args = (
        decode_layout(params),
        *place_batch(params, buf, pad),
        jax.random.PRNGKey(seed),
        Knobs.of(cfg),
    )
    statics = dict(
        model=model, cfg=structural(cfg), mask_id=mask_id, eos_ids=eos_statics(cfg, eos_ids)
    )
    (toks, tstep, counters), compile_s, run_s = run_compiled(_decode_jit, args, statics)
    c = jax.tree_util.tree_map(np.asarray, counters)
    nfe = c.steps * (2 if cfg.cfg_scale > 0 else 1)
    return diffusion_result(
        np.asarray(toks),
        np.asarray(tstep),
        eos_ids,
        cfg,
        compile_s,
        run_s,
        method=cfg.method,
        reference="stepwise",
        target_nfe=nfe,
        steps=c.steps,
        accept_hist=c.accept_hist,
        draft_length=0,
        drafts_proposed=np.zeros_like(nfe),
        forward_tokens=c.forward_tokens,
        extra={},
    )


__all__ = [
    "DiffusionDecodeConfig",
    "DiffusionResult",
    "diffusion_generate",
    "decode_loop",
    "Loop",
    "State",
    "step",
    "REMASKING",
    "CACHES",
]
