"""Autoregressive and chain-speculative decoding for causal LMs (jitted, static shapes).

One ``lax.while_loop`` serves both:

* **AR baseline** (``drafter=None``): prefill, then one KV-cached target pass per token.
* **Speculative decoding** (``drafter`` proposes ``k`` tokens): one KV-cached target pass
  scores the last accepted token plus the ``k`` drafts (``k+1`` query rows), then
  :mod:`jaxspec.core.verify` accepts a prefix and emits one target token (correction or bonus).
  The cache is rolled back implicitly: each row's write pointer moves to the end of the
  accepted prefix and the next pass overwrites the rejected slots (masked meanwhile).

Lossless contract (DESIGN.md): greedy output is identical to the AR baseline, and sampled
output has the AR baseline's distribution (same processed target distribution ``p`` in
:func:`jaxspec.core.verify.verify_sample`).

Layout: prompts are left-padded to a bucketed length ``P``; row ``b`` of the token buffer
holds its prompt in ``[pad[b], P)`` and generated tokens from slot ``P`` on. RoPE position
of slot ``s`` is ``s - pad[b]``. The buffer (and cache) has ``P + max_new_tokens + k + 1``
slots, so drafts that overshoot the budget still fit; outputs are cut to the budget and
after the first EOS.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.sampling import SamplingConfig, sample_from_logits, target_probs
from jaxspec.core.stats import DecodeStats
from jaxspec.core.runtime import run_compiled
from jaxspec.core.verify import verify_greedy, verify_sample
from models.llama.modeling import init_cache


class DecodeInputError(ValueError):
    """Bad decoding input: empty prompt, prompt longer than the context, bad budget."""


@flax.struct.dataclass
class _State:
    buffer: jax.Array      # int32 (B, S)
    length: jax.Array      # int32 (B,) filled slots (pad + prompt + generated)
    cache: Any             # KVCache; slots [0, length-1) hold valid keys/values
    done: jax.Array        # bool (B,)
    n_new: jax.Array       # int32 (B,) generated tokens so far (may overshoot the budget)
    target_nfe: jax.Array  # int32 (B,)
    steps: jax.Array       # int32 (B,)
    hist: jax.Array        # int32 (B, k+2)
    proposed: jax.Array    # int32 (B,) draft tokens sent to verification
    it: jax.Array          # int32 () loop iteration
    key: jax.Array


def _causal_mask(q_slots: jax.Array, pad: jax.Array, S: int) -> jax.Array:
    """bool ``(B, T, S)``: query at slot ``q`` sees slots ``pad <= s <= q`` (itself if padding)."""
    s = jnp.arange(S)[None, None, :]
    q = q_slots[:, :, None]
    return ((s >= pad[:, None, None]) & (s <= q)) | (s == q)


def _write_rows(buffer: jax.Array, tokens: jax.Array, start: jax.Array) -> jax.Array:
    return jax.vmap(lambda b, t, i: jax.lax.dynamic_update_slice(b, t, (i,)))(buffer, tokens, start)


def _is_eos(tokens: jax.Array, eos_ids: tuple[int, ...]) -> jax.Array:
    out = jnp.zeros(tokens.shape, bool)
    for e in eos_ids:
        out = out | (tokens == e)
    return out


def _decode(params, prompt: jax.Array, pad: jax.Array, key: jax.Array, *,
            model, max_new: int, sampling: SamplingConfig, drafter, eos_ids: tuple[int, ...]):
    """The jitted body: prefill + while loop. See module docstring for the layout."""
    B, P = prompt.shape
    k = 0 if drafter is None else drafter.draft_length
    S = P + max_new + k + 1
    apply = lambda toks, pos, mask, cache, idx: model.apply(  # noqa: E731
        {"params": params}, toks, pos, mask, cache=cache, cache_index=idx)

    buffer = jnp.zeros((B, S), jnp.int32).at[:, :P].set(prompt)
    cache = init_cache(model.config, B, S)
    # ---- prefill: one target pass over the prompt, first token from its last row
    slots = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
    logits, cache = apply(prompt, jnp.maximum(slots - pad[:, None], 0),
                          _causal_mask(slots, pad, S), cache, jnp.zeros((B,), jnp.int32))
    key, k0 = jax.random.split(key)
    first = sample_from_logits(k0, logits[:, -1], sampling)
    buffer = buffer.at[:, P].set(first)
    state = _State(
        buffer=buffer, length=jnp.full((B,), P + 1, jnp.int32), cache=cache,
        done=_is_eos(first, eos_ids) | (max_new <= 1), n_new=jnp.ones((B,), jnp.int32),
        target_nfe=jnp.ones((B,), jnp.int32), steps=jnp.zeros((B,), jnp.int32),
        hist=jnp.zeros((B, k + 2), jnp.int32), proposed=jnp.zeros((B,), jnp.int32),
        it=jnp.array(0, jnp.int32), key=key)

    def verify_step(st: _State, draft, q, kv) -> _State:
        """One target pass over [last token, drafts] and the acceptance rule.

        ``draft`` is ``(B, kk)`` with ``kk`` in ``{0, k}`` (static); ``kk = 0`` is a plain
        autoregressive step (used when no row has a draft worth verifying)."""
        kk = draft.shape[1]
        L = st.length
        last = jnp.take_along_axis(st.buffer, (L - 1)[:, None], axis=1)  # (B, 1)
        feed = jnp.concatenate([last, draft], axis=1)                      # (B, kk+1)
        q_slots = (L - 1)[:, None] + jnp.arange(kk + 1, dtype=jnp.int32)[None]
        logits, cache = apply(feed, q_slots - pad[:, None], _causal_mask(q_slots, pad, S),
                              st.cache, L - 1)
        if sampling.greedy:
            n, nxt = verify_greedy(logits, draft)
        else:
            n, nxt = verify_sample(kv, target_probs(logits, sampling), draft, q)
        j = jnp.arange(kk + 1)[None]
        padded_draft = jnp.concatenate([draft, jnp.zeros((B, 1), jnp.int32)], axis=1)
        new = jnp.where(j < n[:, None], padded_draft, jnp.where(j == n[:, None], nxt[:, None], 0))
        produced = n + 1
        active = ~st.done
        buffer = jnp.where(active[:, None], _write_rows(st.buffer, new, L), st.buffer)
        hit_eos = jnp.any(_is_eos(new, eos_ids) & (j <= n[:, None]), axis=1)
        n_new = st.n_new + jnp.where(active, produced, 0)
        act = active.astype(jnp.int32)
        return _State(
            buffer=buffer, length=L + act * produced, cache=cache,
            done=st.done | hit_eos | (n_new >= max_new), n_new=n_new,
            target_nfe=st.target_nfe + act, steps=st.steps + act,
            hist=st.hist + act[:, None] * jax.nn.one_hot(produced, k + 2, dtype=jnp.int32),
            proposed=st.proposed + act * kk, it=st.it + 1, key=st.key)

    no_draft = jnp.zeros((B, 0), jnp.int32)

    def body(st: _State) -> _State:
        kd, kv = jax.random.split(jax.random.fold_in(st.key, st.it))
        if k == 0:
            return verify_step(st, no_draft, None, kv)
        draft, q, has_draft = drafter(kd, st.buffer, st.length, pad, not sampling.greedy)
        # Skip the (k+1)-token verification when no active row has a draft: an AR step
        # costs less and verifying nothing is trivially lossless.
        return jax.lax.cond(jnp.any(has_draft & ~st.done),
                            lambda s: verify_step(s, draft, q, kv),
                            lambda s: verify_step(s, no_draft, None, kv), st)

    st = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
    return st.buffer[:, P:P + max_new], st.n_new, st.target_nfe, st.steps, st.hist, st.proposed


_decode_jit = jax.jit(_decode, static_argnames=("model", "max_new", "sampling", "drafter", "eos_ids"))


@dataclasses.dataclass
class GenerationResult:
    """Output of :func:`generate`.

    Attributes:
      tokens: per row, the generated token ids (cut at the budget and after the first EOS,
        which is kept).
      stats: :class:`jaxspec.core.stats.DecodeStats`.
      compile_s: seconds spent compiling (0 when a cached executable was reused).
      run_s: wall-clock seconds of the decode itself (excluding compilation).
    """

    tokens: list[list[int]]
    stats: DecodeStats
    compile_s: float
    run_s: float

    @property
    def tokens_per_s(self) -> float:
        return float(sum(len(t) for t in self.tokens) / max(self.run_s, 1e-9))




def bucket_length(n: int, bucket: int) -> int:
    """Round ``n`` up to a multiple of ``bucket`` (so one compile serves many prompts)."""
    return max(bucket, -(-n // bucket) * bucket)


def generate(model, params, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
             sampling: SamplingConfig = SamplingConfig(), drafter=None, seed: int = 0,
             eos_ids: Sequence[int] = (), pad_id: int = 0, bucket: int = 64,
             max_context: Optional[int] = None) -> GenerationResult:
    """Generate continuations for a batch of prompts (AR, or speculative with ``drafter``).

    Args:
      model: a :class:`models.llama.modeling.CausalLM` (hashable; its config fixes shapes).
      params: its parameter tree (``variables["params"]``).
      prompts: ``B`` lists of token ids (different lengths allowed: left padding).
      max_new_tokens: generation budget per row (>= 1).
      sampling: temperature / top-k / top-p; temperature 0 = greedy.
      drafter: ``None`` for the autoregressive baseline, or a drafter such as
        :class:`jaxspec.core.drafters.NgramDrafter` (callable
        ``(key, buffer, length, pad, sample) -> (draft (B,k), q (B,k,V) | None,
        has_draft bool (B,))`` with ``draft_length`` and ``vocab_size`` attributes). When no
        active row has a draft the step falls back to a single-token AR pass.
      seed: PRNG seed; the same seed reproduces a run exactly.
      eos_ids: tokens that end a row.
      pad_id: filler for left padding (never attended).
      bucket: prompt lengths are rounded up to a multiple of this.
      max_context: the model's context length (defaults to ``config.max_position_embeddings``).

    Returns:
      :class:`GenerationResult`.

    Raises:
      DecodeInputError: empty prompt list or prompt, ``max_new_tokens < 1``, or prompt +
        budget longer than the context.
      ValueError: drafter vocabulary differs from the model's.
    """
    cfg = model.config
    if not prompts:
        raise DecodeInputError("no prompts given")
    if max_new_tokens < 1:
        raise DecodeInputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    lens = [len(p) for p in prompts]
    if min(lens) == 0:
        raise DecodeInputError("empty prompt: every prompt needs at least one token")
    ctx = max_context or cfg.max_position_embeddings
    if max(lens) + max_new_tokens > ctx:
        raise DecodeInputError(
            f"prompt of {max(lens)} tokens + {max_new_tokens} new tokens exceeds the model's "
            f"context of {ctx} tokens")
    for p in prompts:
        if min(p) < 0 or max(p) >= cfg.vocab_size:
            raise DecodeInputError(f"prompt token ids must lie in [0, {cfg.vocab_size})")
    if drafter is not None and getattr(drafter, "vocab_size", cfg.vocab_size) != cfg.vocab_size:
        raise ValueError(f"vocabulary mismatch: drafter has {drafter.vocab_size} tokens, "
                         f"target model has {cfg.vocab_size}")
    P = bucket_length(max(lens), bucket)
    buf = np.full((len(prompts), P), pad_id, np.int32)
    for i, p in enumerate(prompts):
        buf[i, P - len(p):] = p
    pad = np.array([P - n for n in lens], np.int32)
    args = (params, jnp.asarray(buf), jnp.asarray(pad), jax.random.PRNGKey(seed))
    statics = dict(model=model, max_new=int(max_new_tokens), sampling=sampling,
                   drafter=drafter, eos_ids=tuple(int(e) for e in eos_ids))
    out, compile_s, run_s = run_compiled(_decode_jit, args, statics)
    toks, n_new, nfe, steps, hist, proposed = (np.asarray(x) for x in out)
    eos = set(statics["eos_ids"])
    rows = []
    for b in range(len(prompts)):
        row = toks[b, :min(int(n_new[b]), max_new_tokens)].tolist()
        for i, t in enumerate(row):
            if t in eos:
                row = row[:i + 1]
                break
        rows.append(row)
    k = 0 if drafter is None else drafter.draft_length
    stats = DecodeStats(
        method="ar" if drafter is None else getattr(drafter, "name", type(drafter).__name__),
        reference="ar", target_nfe=nfe, draft_nfe=np.zeros_like(nfe), steps=steps,
        accept_hist=hist, new_tokens=np.array([len(r) for r in rows]), draft_length=k,
        drafts_proposed=proposed)
    return GenerationResult(tokens=rows, stats=stats, compile_s=compile_s, run_s=run_s)
