"""Autoregressive and chain-speculative decoding for causal LMs (jitted, static shapes).

One ``lax.while_loop`` serves both:

* **AR baseline** (``drafter=None``): prefill, then one KV-cached target pass per token.
* **Speculative decoding** (a :class:`jaxspec.core.drafters.Drafter` proposes ``k`` tokens):
  one KV-cached target pass scores the last accepted token plus the ``k`` drafts (``k+1``
  query rows), then the chain verifier (:mod:`jaxspec.core.verify`) accepts a prefix and
  emits one target token (correction or bonus). The cache is rolled back implicitly: each
  row's write pointer moves to the end of the accepted prefix and the next pass overwrites
  the rejected slots (masked meanwhile).

Lossless contract (DESIGN.md): greedy output is identical to the AR baseline, and sampled
output has the AR baseline's distribution (the same processed target distribution ``p`` in
:func:`jaxspec.core.verify.verify_sample`).

Layout (:mod:`jaxspec.core.batching`): prompts are left-padded to a bucketed length ``P``;
row ``b`` of the token buffer holds its prompt in ``[pad[b], P)`` and generated tokens from
slot ``P`` on. RoPE position of slot ``s`` is ``s - pad[b]``. The buffer (and cache) has
``S = P + max_new_tokens + k + 1`` slots (plus the drafter's ``query_slots``), so drafts that
overshoot the budget still fit; outputs are cut to the budget and after the first EOS.

Draft queries (:class:`jaxspec.core.drafters.DraftQueries`; SPACE): a drafter may append
query rows to every target pass, the prefill included. They are written after the
verification rows, which therefore never see them (causal mask), and their logits go to the
drafter's ``absorb`` after the acceptance.

Target features (DFlash, :mod:`jaxspec.causal.dflash`): a drafter with ``feature_layers``
gets the hidden states of those target layers from every target pass (the prompt pass and
each verification or one-token pass; ``CausalLM``'s ``hidden_layers``, no extra pass) through
its ``absorb_features(state, first_slot, hidden)``; rows past the accepted prefix are stale,
like the cache's.

Per-machine choices (a :class:`models.llama.layout.DecodePlan`, computed once by
:func:`decode_plan` or given): the layer loop and weight layouts of the target's verification
passes and one-token steps, and the optional cost gate that verifies drafts only while they pay
for the pass. None of them changes the output distribution.

The module reads top to bottom: :class:`LoopConfig` (statics) -> :class:`DecodeState` ->
phases (:func:`prefill`, :func:`target_pass`, :func:`accept`, :func:`commit`) ->
:func:`step` -> :func:`decode_loop` -> :func:`decode_plan` -> the host wrapper
:func:`generate`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.batching import (
    DecodeInputError,
    check_prompts,
    cut_after_eos,
    is_eos,
    left_pad,
    place_batch,
)
from jaxspec.core.compile_cache import timing_store
from jaxspec.core.drafters import CostGate, Draft, DraftContext, Drafter, DraftQueries, NgramDrafter
from jaxspec.core.results import DecodeResult
from jaxspec.core.runtime import run_compiled
from jaxspec.core.sampling import SamplingConfig, sample_from_logits, target_probs
from jaxspec.core.stats import DecodeStats
from jaxspec.core.verify import verify_greedy, verify_sample
from models.llama import layout
from models.llama.layout import DecodePlan
from models.llama.modeling import grow_cache, init_cache, param_dtype

__all__ = [
    "DecodeInputError",
    "DecodePlan",
    "GenerationResult",
    "LoopConfig",
    "DecodeState",
    "decode_plan",
    "generate",
]


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Static settings of one compiled loop (hashable).

    Attributes:
      model: the :class:`models.llama.modeling.CausalLM` (its config fixes shapes).
      max_new: generation budget per row (>= 1).
      sampling: temperature / top-k / top-p of the target distribution.
      drafter: a :class:`~jaxspec.core.drafters.Drafter`, or ``None`` for AR decoding.
      eos_ids: tokens that end a row.
    """

    model: Any
    max_new: int
    sampling: SamplingConfig
    drafter: Optional[Drafter]
    eos_ids: tuple[int, ...]

    @property
    def k(self) -> int:
        """Draft length (0 for AR decoding)."""
        return 0 if self.drafter is None else self.drafter.draft_length

    @property
    def queries(self) -> bool:
        """True when the drafter appends draft queries to every target pass (SPACE)."""
        return self.drafter is not None and self.drafter.query_slots > 0

    @property
    def features(self) -> tuple[int, ...]:
        """Target layers whose hidden states the drafter reads from every target pass
        (``feature_layers``, DFlash: :mod:`jaxspec.causal.dflash`); empty for other drafters
        (a cost gate refuses such a drafter: :class:`~jaxspec.core.drafters.CostGate`)."""
        return () if self.drafter is None else tuple(self.drafter.feature_layers)

    @property
    def query_slots(self) -> int:
        """Cache slots reserved after the verification rows for the drafter's queries."""
        return int(self.drafter.query_slots) if self.queries else 0


@flax.struct.dataclass
class DecodeState:
    buffer: jax.Array  # int32 (B, S)
    length: jax.Array  # int32 (B,) filled slots (pad + prompt + generated)
    cache: Any  # KVCache; slots [0, length-1) hold valid keys/values
    done: jax.Array  # bool (B,)
    n_new: jax.Array  # int32 (B,) generated tokens so far (may overshoot the budget)
    target_nfe: jax.Array  # int32 (B,)
    draft_nfe: jax.Array  # int32 (B,) drafter forward passes (Draft.nfe while active)
    steps: jax.Array  # int32 (B,)
    hist: jax.Array  # int32 (B, k+2) steps that produced j tokens
    proposed: jax.Array  # int32 (B,) draft tokens sent to verification
    it: jax.Array  # int32 () loop iteration
    key: jax.Array
    drafter_state: Any  # the drafter's own pytree (() for model-free drafters)


# ----------------------------------------------------------------------------- phases


def causal_mask(q_slots: jax.Array, pad: jax.Array, S: int) -> jax.Array:
    """bool ``(B, T, S)``: the query at slot ``q`` sees slots ``pad <= s <= q`` (and itself
    if it is padding)."""
    s = jnp.arange(S)[None, None, :]
    q = q_slots[:, :, None]
    return ((s >= pad[:, None, None]) & (s <= q)) | (s == q)


def write_rows(buffer: jax.Array, tokens: jax.Array, start: jax.Array) -> jax.Array:
    """Write ``tokens (B, T)`` into ``buffer (B, S)`` at per-row slot ``start (B,)``."""
    return jax.vmap(lambda b, t, i: jax.lax.dynamic_update_slice(b, t, (i,)))(buffer, tokens, start)


def model_pass(
    model,
    params,
    feed: jax.Array,
    first_slot: jax.Array,
    pad: jax.Array,
    cache,
    S: int,
    last_rows: Optional[int] = None,
    hidden_layers: tuple = (),
):
    """One KV-cached forward of a causal LM over ``feed int32 (B, T)`` written into its
    ``S``-slot cache from slot ``first_slot (B,)``, in the loop's slot layout (RoPE position
    of slot ``s`` is ``s - pad``). Used for the target and for a draft model
    (:mod:`jaxspec.causal.sps`).

    Returns ``(logits float32 (B, T, V), cache)``; with ``last_rows`` (static) the logits of
    the last ``last_rows`` rows only, ``(B, last_rows, V)`` (the LM head skips the others);
    with ``hidden_layers`` (static) also the hidden states of those layers, all ``T`` rows,
    ``(B, T, n, D)``, as a third output."""
    q_slots = first_slot[:, None] + jnp.arange(feed.shape[1], dtype=jnp.int32)[None]
    positions = jnp.maximum(q_slots - pad[:, None], 0)  # padding slots sit at position 0
    return model.apply(
        {"params": params},
        feed,
        positions,
        causal_mask(q_slots, pad, S),
        cache=cache,
        cache_index=first_slot,
        last_rows=last_rows,
        hidden_layers=hidden_layers,
    )


def query_mask(
    last_slot: jax.Array, pad: jax.Array, S: int, n_drafts: int, queries: DraftQueries
) -> jax.Array:
    """bool ``(B, E, S)``: what the draft queries see. The feed is ``[..., last token (slot
    last_slot), d_1..d_kk, queries]``; query ``e`` sees slots ``pad .. last_slot``, draft ``i``
    where ``sees_draft[e, i]`` and query ``e'`` where ``sees_query[e, e']``."""
    E = queries.tokens.shape[1]
    table = np.concatenate(
        [
            np.asarray(queries.sees_draft, bool).reshape(E, n_drafts),
            np.asarray(queries.sees_query, bool),
        ],
        axis=1,
    )  # (E, kk + E)
    s = jnp.arange(S)[None, None, :]
    rel = s - (last_slot + 1)[:, None, None]  # draft i at rel i, query e' at rel kk + e'
    later = jnp.asarray(table)[jnp.arange(E)[None, :, None], jnp.clip(rel, 0, table.shape[1] - 1)]
    prefix = (s >= pad[:, None, None]) & (s <= last_slot[:, None, None])
    return prefix | ((rel >= 0) & (rel < table.shape[1]) & later)


def target_pass(
    cfg: LoopConfig,
    params,
    feed: jax.Array,
    first_slot: jax.Array,
    pad: jax.Array,
    cache,
    S: int,
    queries: Optional[DraftQueries] = None,
    n_drafts: int = 0,
    last_only: bool = False,
    hidden_layers: tuple = (),
):
    """One KV-cached target forward of ``feed (B, T)`` = ``[context, last token, d_1..d_kk]``
    (``kk = n_drafts``) written from slot ``first_slot``, with the drafter's
    :class:`~jaxspec.core.drafters.DraftQueries` appended when given.

    Returns ``(logits float32 (B, T, V), query_logits (B, E, V) or None, cache)``; with
    ``last_only`` (static; the prompt pass) ``logits`` holds the feed's last row only,
    ``(B, 1, V)``, and the LM head skips the rows before it. With ``hidden_layers`` (no draft
    queries) a fourth output: those layers' hidden states ``(B, T, n, D)``."""
    if queries is None:
        out = model_pass(
            cfg.model,
            params,
            feed,
            first_slot,
            pad,
            cache,
            S,
            1 if last_only else None,
            hidden_layers,
        )
        return (out[0], None) + tuple(out[1:])
    T, E = feed.shape[1], queries.tokens.shape[1]
    q_slots = first_slot[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
    positions = jnp.concatenate([jnp.maximum(q_slots - pad[:, None], 0), queries.positions], 1)
    last_slot = first_slot + T - 1 - n_drafts
    mask = jnp.concatenate(
        [causal_mask(q_slots, pad, S), query_mask(last_slot, pad, S, n_drafts, queries)], axis=1
    )
    logits, cache = cfg.model.apply(
        {"params": params},
        jnp.concatenate([feed, queries.tokens], 1),
        positions,
        mask,
        cache=cache,
        cache_index=first_slot,
        last_rows=E + 1 if last_only else None,
    )
    rows = 1 if last_only else T  # the feed's rows among the returned logits
    return logits[:, :rows], logits[:, rows:], cache


def prefill(
    cfg: LoopConfig, params, drafter_params, prompt: jax.Array, pad: jax.Array, key: jax.Array
) -> DecodeState:
    """One target pass over the prompt; the first token comes from its last row."""
    B, P = prompt.shape
    k = cfg.k
    S = P + cfg.max_new + k + 1 + cfg.query_slots
    buffer = jnp.zeros((B, S), jnp.int32).at[:, :P].set(prompt)
    slots = jnp.zeros((B,), jnp.int32)
    queries = cfg.drafter.draft_queries(P - 1 - pad, 0) if cfg.queries else None
    # the prompt pass attends over the slots it writes only (P, plus the draft queries'), not
    # the whole S-slot buffer; the cache then grows to S (slots keep their places). Its LM head
    # multiplies the last prompt row (and the queries) only: the other rows' logits are unused
    S_p = P + (0 if queries is None else queries.tokens.shape[1])
    logits, qlogits, cache, *feats = target_pass(
        cfg,
        params,
        prompt,
        slots,
        pad,
        init_cache(cfg.model.config, B, S_p, param_dtype(params)),
        S_p,
        queries,
        last_only=True,
        hidden_layers=cfg.features,
    )
    cache = grow_cache(cache, S)
    key, k0 = jax.random.split(key)
    first = sample_from_logits(k0, logits[:, -1], cfg.sampling)
    buffer = buffer.at[:, P].set(first)
    length = jnp.full((B,), P + 1, jnp.int32)
    done = is_eos(first, cfg.eos_ids) | (cfg.max_new <= 1)
    z = jnp.zeros((B,), jnp.int32)
    drafter_state = (
        ()
        if cfg.drafter is None
        else cfg.drafter.init_state(
            drafter_params,
            DraftContext(buffer=buffer, length=length, pad=pad, active=~done, filled=P + 1),
        )
    )
    if cfg.queries:
        drafter_state = cfg.drafter.absorb(drafter_state, jnp.zeros((B,), jnp.int32), qlogits)
    if cfg.features:  # the prompt's hidden states, slots [0, P)
        drafter_state = cfg.drafter.absorb_features(drafter_state, slots, feats[0])
    return DecodeState(
        buffer=buffer,
        length=length,
        cache=cache,
        done=done,
        n_new=jnp.ones((B,), jnp.int32),
        target_nfe=jnp.ones((B,), jnp.int32),
        draft_nfe=z,
        steps=z,
        hist=jnp.zeros((B, k + 2), jnp.int32),
        proposed=z,
        it=jnp.array(0, jnp.int32),
        key=key,
        drafter_state=drafter_state,
    )


def accept(cfg: LoopConfig, key: jax.Array, logits: jax.Array, draft: Draft):
    """The chain verifier on one target pass: ``(n_accepted (B,), next_token (B,))``."""
    length = draft.length if draft.tokens.shape[1] > 0 else None
    if cfg.sampling.greedy:
        return verify_greedy(logits, draft.tokens, draft_len=length)
    return verify_sample(
        key,
        target_probs(logits, cfg.sampling),
        draft.tokens,
        draft.q,
        draft_len=length,
        resample="residual" if cfg.drafter is None else cfg.drafter.resample,
    )


def commit(
    cfg: LoopConfig, st: DecodeState, draft: Draft, n: jax.Array, nxt: jax.Array, cache
) -> DecodeState:
    """Write the accepted drafts and the emitted token, advance the counters and mark rows
    that hit EOS or the budget as done."""
    B, kk = draft.tokens.shape
    L = st.length
    j = jnp.arange(kk + 1)[None]
    padded_draft = jnp.concatenate([draft.tokens, jnp.zeros((B, 1), jnp.int32)], axis=1)
    new = jnp.where(j < n[:, None], padded_draft, jnp.where(j == n[:, None], nxt[:, None], 0))
    produced = n + 1
    active = ~st.done
    buffer = jnp.where(active[:, None], write_rows(st.buffer, new, L), st.buffer)
    hit_eos = jnp.any(is_eos(new, cfg.eos_ids) & (j <= n[:, None]), axis=1)
    n_new = st.n_new + jnp.where(active, produced, 0)
    act = active.astype(jnp.int32)
    proposed = act * (kk if kk == 0 else draft.length)
    return st.replace(
        buffer=buffer,
        length=L + act * produced,
        cache=cache,
        done=st.done | hit_eos | (n_new >= cfg.max_new),
        n_new=n_new,
        target_nfe=st.target_nfe + act,
        draft_nfe=st.draft_nfe + act * draft.nfe,
        steps=st.steps + act,
        hist=st.hist + act[:, None] * jax.nn.one_hot(produced, cfg.k + 2, dtype=jnp.int32),
        proposed=st.proposed + proposed,
        it=st.it + 1,
    )


def verify_step(
    cfg: LoopConfig, params, st: DecodeState, draft: Draft, key: jax.Array, pad: jax.Array
) -> DecodeState:
    """One target pass over ``[last token, drafts]`` (plus the drafter's draft queries), the
    acceptance rule and the commit. ``draft.tokens`` is ``(B, kk)`` with ``kk`` in ``{0, k}``
    (static); ``kk = 0`` is a plain autoregressive step."""
    kk = draft.tokens.shape[1]
    last = jnp.take_along_axis(st.buffer, (st.length - 1)[:, None], axis=1)  # (B, 1)
    feed = jnp.concatenate([last, draft.tokens], axis=1)  # (B, kk+1)
    queries = cfg.drafter.draft_queries(st.length - 1 - pad, kk) if cfg.queries else None
    logits, qlogits, cache, *feats = target_pass(
        cfg,
        params,
        feed,
        st.length - 1,
        pad,
        st.cache,
        st.buffer.shape[1],
        queries,
        kk,
        hidden_layers=cfg.features,
    )
    n, nxt = accept(cfg, key, logits, draft)
    first_slot = st.length - 1
    st = commit(cfg, st, draft, n, nxt, cache)
    if cfg.features:  # the fed rows' hidden states; those past the accepted prefix are stale
        st = st.replace(
            drafter_state=cfg.drafter.absorb_features(st.drafter_state, first_slot, feats[0])
        )
    if cfg.queries:
        st = st.replace(drafter_state=cfg.drafter.absorb(st.drafter_state, n, qlogits))
    return st


def _no_draft(B: int) -> Draft:
    z = jnp.zeros((B,), jnp.int32)
    return Draft(
        tokens=jnp.zeros((B, 0), jnp.int32),
        q=None,
        has_draft=jnp.zeros((B,), bool),
        length=z,
        nfe=z,
    )


# ----------------------------------------------------------------------------- step and loop


def step(cfg: LoopConfig, params, drafter_params, pad: jax.Array, st: DecodeState) -> DecodeState:
    """One decode-loop iteration: draft, verify (or a plain AR step), tell the drafter.

    ``params`` is the pair ``(verify, one_token)``: the target's weights in the layout of its
    verification passes and in the layout of its one-token AR steps (the same tree, or its
    output-major copy: :attr:`DecodePlan.step_layout`). Both compute the same model."""
    verify_params, step_params = params
    B = st.buffer.shape[0]
    kd, kv = jax.random.split(jax.random.fold_in(st.key, st.it))
    if cfg.drafter is None:
        return verify_step(cfg, step_params, st, _no_draft(B), kv, pad)
    ctx = DraftContext(buffer=st.buffer, length=st.length, pad=pad, active=~st.done)
    draft, dstate = cfg.drafter.propose(
        drafter_params, st.drafter_state, ctx, kd, not cfg.sampling.greedy
    )
    st = st.replace(drafter_state=dstate)
    # Skip the (k+1)-token verification when no active row has a draft: an AR step costs
    # less and verifying nothing is trivially lossless. The drafter's NFE is spent anyway.
    no_draft = _no_draft(B).replace(nfe=draft.nfe)
    st = jax.lax.cond(
        jnp.any(draft.has_draft & ~st.done),
        lambda s: verify_step(cfg, verify_params, s, draft, kv, pad),
        lambda s: verify_step(cfg, step_params, s, no_draft, kv, pad),
        st,
    )
    n_accepted = jnp.maximum(st.length - ctx.length - 1, 0)
    ctx = ctx.replace(buffer=st.buffer, length=st.length)
    return st.replace(
        drafter_state=cfg.drafter.update(drafter_params, st.drafter_state, ctx, n_accepted)
    )


def decode_loop(
    params, drafter_params, prompt: jax.Array, pad: jax.Array, key: jax.Array, *, cfg: LoopConfig
):
    """The jitted program: prefill + ``lax.while_loop`` of :func:`step` until every row is
    done. ``params`` is :func:`step`'s ``(verify, one_token)`` pair; the prompt pass runs on
    the first. Returns ``(tokens (B, max_new), n_new, target_nfe, draft_nfe, steps, hist,
    proposed)``."""
    P = prompt.shape[1]
    st = prefill(cfg, params[0], drafter_params, prompt, pad, key)
    st = jax.lax.while_loop(
        lambda s: ~jnp.all(s.done), lambda s: step(cfg, params, drafter_params, pad, s), st
    )
    return (
        st.buffer[:, P : P + cfg.max_new],
        st.n_new,
        st.target_nfe,
        st.draft_nfe,
        st.steps,
        st.hist,
        st.proposed,
    )


_decode_jit = jax.jit(decode_loop, static_argnames=("cfg",))


# ----------------------------------------------------------------------------- the plan


def decode_plan(
    model,
    params,
    drafter: Optional[Drafter] = None,
    drafter_params: Any = (),
    *,
    batch: int = 1,
    cache_slots: int = 256,
    gate: "str | float" = "off",
    layer_loop: str = "auto",
    verify_layout: str = "auto",
) -> DecodePlan:
    """The :class:`~models.llama.layout.DecodePlan` of :func:`generate` on this machine
    (:func:`models.llama.layout.plan`, which times what is ``"auto"``, once per process), from
    the drafter's capabilities (:class:`~jaxspec.core.drafters.Drafter`): ``k + 1``
    verification rows, multi-row steps with draft queries, an output-major draft model for
    ``one_token_steps``. Compute it once and pass it to every :func:`generate` call of the
    same model and batch size; ``generate`` computes it itself when given none.

    Args:
      drafter: ``None`` for autoregressive decoding; drafter_params: its parameters.
      batch: rows per call; cache_slots: cache slots of a timed pass (about the prompt +
        budget + ``k + 1``).
      gate: the cost gate (:class:`~jaxspec.core.drafters.CostGate`): ``"off"``, a pass cost
        in one-token steps (>= 1), or ``"auto"``: measured for an
        :class:`~jaxspec.core.drafters.NgramDrafter` (a draft model's own cost is not saved by
        the gate), off for other drafters.
      layer_loop: ``"auto"``, ``"scan"`` or ``"unrolled"``; verify_layout: ``"auto"`` (timed
        once per machine: the timings are kept beside the compile cache,
        :func:`jaxspec.core.compile_cache.timing_store`), ``"stored"`` or ``"output-major"``.

    Raises:
      ValueError: as :func:`models.llama.layout.plan`.
    """
    speculative = drafter is not None
    if gate == "auto" and not isinstance(drafter, NgramDrafter):
        gate = "off"
    return layout.plan(
        model,
        params,
        batch=batch,
        cache_slots=cache_slots,
        verify_rows=drafter.draft_length + 1 if speculative else 1,
        multi_row_steps=speculative and drafter.query_slots > 0,
        draft_params=drafter_params,
        draft_output_major=speculative and drafter.one_token_steps,
        gate=gate,
        layer_loop=layer_loop,
        verify_layout=verify_layout,
        store=timing_store(),
    )


# ----------------------------------------------------------------------------- host wrapper


@dataclasses.dataclass
class GenerationResult(DecodeResult):
    """Output of :func:`generate`.

    Attributes:
      tokens: per row, the generated token ids (cut at the budget and after the first EOS,
        which is kept).
      stats: :class:`jaxspec.core.stats.DecodeStats`.
      compile_s: seconds spent compiling (0 when a cached executable was reused).
      run_s: wall-clock seconds of the decode itself (excluding compilation).
      settings: the decode plan's choices (:attr:`DecodePlan.settings`; empty for AR).
    """

    tokens: list[list[int]]
    stats: DecodeStats
    compile_s: float
    run_s: float
    settings: dict = dataclasses.field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return float(sum(len(t) for t in self.tokens) / max(self.run_s, 1e-9))


def check_request(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    max_context: Optional[int] = None,
    overshoot: int = 0,
) -> list[int]:
    """Validate a causal decoding request; returns the prompt lengths.

    Raises:
      DecodeInputError: no prompts or an empty one, ``max_new_tokens < 1``, ids outside the
        vocabulary, or prompt + budget (+ ``overshoot`` draft positions) longer than the
        context (``max_context``, default the model's ``max_position_embeddings``).
    """
    if not prompts:
        raise DecodeInputError("no prompts given")
    if max_new_tokens < 1:
        raise DecodeInputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    lens = check_prompts(prompts, model.config.vocab_size)
    ctx = max_context or model.config.max_position_embeddings
    if max(lens) + max_new_tokens + overshoot > ctx:
        extra = f" + {overshoot} draft positions" if overshoot else ""
        raise DecodeInputError(
            f"prompt of {max(lens)} tokens + {max_new_tokens} new tokens{extra} exceeds the "
            f"model's context of {ctx} tokens"
        )
    return lens


def check_drafted_request(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    drafter: Optional[Drafter],
    max_context: Optional[int] = None,
) -> None:
    """:func:`check_request` plus the drafter's limits: its vocabulary, the positions its
    query rows reach past the budget (``position_overshoot``, SPACE's mask groups) and a draft
    model's context (``context_length``: prompt + budget + ``k`` must fit).

    Raises:
      DecodeInputError: as :func:`check_request`, or past the draft model's context.
      ValueError: the drafter's vocabulary differs from the model's.
    """
    if drafter is None:
        check_request(model, prompts, max_new_tokens, max_context)
        return
    lens = check_request(model, prompts, max_new_tokens, max_context, drafter.position_overshoot)
    V, k, dctx = model.config.vocab_size, drafter.draft_length, drafter.context_length
    if drafter.vocab_size != V:
        raise ValueError(
            f"vocabulary mismatch: drafter has {drafter.vocab_size} tokens, target model has {V}"
        )
    if dctx is not None and max(lens) + max_new_tokens + k > dctx:
        raise DecodeInputError(
            f"prompt of {max(lens)} tokens + {max_new_tokens} new tokens + {k} "
            f"drafts exceeds the draft model's context of {dctx} tokens"
        )


def generate(
    model,
    params,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    sampling: SamplingConfig = SamplingConfig(),
    drafter: Optional[Drafter] = None,
    drafter_params: Any = (),
    seed: int = 0,
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
    bucket: int = 64,
    max_context: Optional[int] = None,
    gate: "str | float" = "off",
    plan: Optional[DecodePlan] = None,
) -> GenerationResult:
    """Generate continuations for a batch of prompts (AR, or speculative with ``drafter``).

    Args:
      model: a :class:`models.llama.modeling.CausalLM` (hashable; its config fixes shapes).
      params: its parameter tree (``variables["params"]``).
      prompts: ``B`` lists of token ids (different lengths allowed: left padding).
      max_new_tokens: generation budget per row (>= 1).
      sampling: temperature / top-k / top-p; temperature 0 = greedy.
      drafter: ``None`` for the autoregressive baseline, or a
        :class:`jaxspec.core.drafters.Drafter` such as
        :class:`~jaxspec.core.drafters.NgramDrafter`. When no active row has a draft the
        step falls back to a single-token AR pass.
      drafter_params: the drafter's parameters (a draft model's weights; ``()`` for none),
        a traced argument of the compiled loop, laid out as the plan says
        (:attr:`DecodePlan.draft_layout`).
      seed: PRNG seed; the same seed reproduces a run exactly.
      eos_ids: tokens that end a row.
      pad_id: filler for left padding (never attended).
      bucket: prompt lengths are rounded up to a multiple of this.
      max_context: the model's context length (defaults to ``config.max_position_embeddings``).
      gate: with no ``plan``, the cost gate to plan (:func:`decode_plan`: ``"off"``,
        ``"auto"`` or a pass cost in one-token steps). Lossless either way.
      plan: the layer loop, weight layouts and gate (:func:`decode_plan`, or written out);
        None: :func:`decode_plan` for this call (its one-time timing, on the first call per
        model and batch size, is counted in ``compile_s``).

    Returns:
      :class:`GenerationResult`; ``stats.draft_nfe`` counts the drafter's forward passes.
      With a drafter, ``settings`` holds the plan's choices (:attr:`DecodePlan.settings`).

    Raises:
      DecodeInputError: empty prompt list or prompt, ``max_new_tokens < 1``, ids outside the
        vocabulary, or prompt + budget longer than the target's (or a draft model's) context.
      ValueError: the drafter's vocabulary differs from the model's; an unknown gate; a gate
        together with a plan (the plan holds its gate); a plan whose layouts differ from the
        ones the weights were split in place in.
    """
    k = 0 if drafter is None else drafter.draft_length
    check_drafted_request(model, prompts, max_new_tokens, drafter, max_context)
    buf, pad = left_pad(prompts, bucket, pad_id)
    tune_s = 0.0
    if plan is None:
        t0, timed = time.perf_counter(), layout.passes_timed()
        S = buf.shape[1] + max_new_tokens + k + 1 + (0 if drafter is None else drafter.query_slots)
        plan = decode_plan(
            model, params, drafter, drafter_params, batch=len(prompts), cache_slots=S, gate=gate
        )
        # counted like compilation when passes were timed (a cached choice costs nothing)
        tune_s = time.perf_counter() - t0 if layout.passes_timed() > timed else 0.0
    elif gate != "off":
        raise ValueError(
            f"gate={gate!r} given with a plan: the plan holds the gate "
            "(decode_plan(..., gate=...) or DecodePlan(verify_cost=...))"
        )
    if drafter is not None and plan.verify_cost is not None:
        drafter = CostGate(drafter, plan.verify_cost)
    loop = LoopConfig(
        model=layout.plan_model(model, plan),
        max_new=int(max_new_tokens),
        sampling=sampling,
        drafter=drafter,
        eos_ids=tuple(int(e) for e in eos_ids),
    )
    args = (
        layout.plan_trees(params, plan),
        layout.plan_draft_tree(drafter_params, plan),
        *place_batch(params, buf, pad),
        jax.random.PRNGKey(seed),
    )
    out, compile_s, run_s = run_compiled(_decode_jit, args, dict(cfg=loop))
    toks, n_new, nfe, dnfe, steps, hist, proposed = (np.asarray(x) for x in out)
    rows = cut_after_eos(toks, loop.eos_ids, budget=np.minimum(n_new, max_new_tokens))
    stats = DecodeStats(
        method="ar" if drafter is None else drafter.name,
        reference="ar",
        target_nfe=nfe,
        draft_nfe=dnfe,
        steps=steps,
        accept_hist=hist,
        new_tokens=np.array([len(r) for r in rows]),
        draft_length=loop.k,
        drafts_proposed=proposed,
    )
    return GenerationResult(
        tokens=rows,
        stats=stats,
        compile_s=compile_s + tune_s,
        run_s=run_s,
        settings={} if drafter is None else plan.settings,
    )
