"""Drafting across vocabularies: a drafter whose tokenizer differs from the target's
(DiffuSpec, arXiv:2510.02358 App. E; Timor et al. 2025, "universal assisted generation").

The drafter works in its own token ids; its draft is turned into text, and the text into
target ids, which the target verifies as point masses (:mod:`jaxspec.core.verify`: accept
``x`` with probability ``p(x)``, on rejection sample ``p`` without ``x``; greedy: accept
while ``x`` is the argmax). The translated draft is a deterministic function of the target's
history (the drafter sees the history as text, its proposal is deterministic: CPS / argmax),
so the output keeps the target's AR distribution exactly, whatever the tokenizers do to the
text. Translation (:func:`translate_draft`):

1. ``text`` = the drafter's draft decoded, cut at its first EOS.
2. The last ``lookbehind`` target ids of the context are decoded to ``head``; ``head + text``
   is encoded with the target tokenizer. If that re-encoding starts with those same ids, the
   ids after them are the draft (the boundary between context and draft is re-segmented as
   the target tokenizer would, e.g. a space merged into the next word).
3. Otherwise ``text`` alone is encoded. The draft is cut to ``k`` target ids.

Retokenization is host work (Python tokenizers), so unlike :func:`jaxspec.causal.decode.generate`
this is a host loop around jitted pieces: the target's prefill and verification step
(:func:`jaxspec.causal.decode.prefill` / :func:`~jaxspec.causal.decode.verify_step`, one compile
each) and the drafter's ``propose`` (one compile per drafter-context bucket). Batches of any
size: every row is translated on the host, all rows are verified in one target pass.

Module order: :class:`ExternalDrafts` (the target loop's view) -> phases
(:func:`translate_draft`, :func:`drafter_contexts`) -> :func:`hetero_step` -> the host wrapper
:func:`hetero_generate`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.causal.decode import GenerationResult, LoopConfig, check_request, prefill, verify_step
from jaxspec.core.batching import cut_after_eos, left_pad, place_batch
from jaxspec.core.drafters import Draft, DraftContext, Drafter
from jaxspec.core.sampling import SamplingConfig
from jaxspec.core.stats import DecodeStats
from models.llama.layout import decode_layout

__all__ = ["ExternalDrafts", "translate_draft", "drafter_contexts", "hetero_generate"]


@dataclasses.dataclass(frozen=True)
class ExternalDrafts(Drafter):
    """The target loop's drafter slot when drafts come from the host: it only fixes the
    static draft width ``draft_length`` (target ids per verification) and owns no state."""

    draft_length: int
    name: str = "diffuspec-hetero"

    def init_state(self, params, ctx: DraftContext):
        return ()


def _decode(tok, ids: Sequence[int]) -> str:
    """Text of ``ids`` with special tokens kept (so chat markers survive the round trip)."""
    try:
        return tok.decode(list(ids), skip_special_tokens=False)
    except TypeError:  # a tokenizer without the flag (test stand-ins)
        return tok.decode(list(ids))


# ----------------------------------------------------------------------------- phases


def translate_draft(
    target_tok,
    drafter_tok,
    context: Sequence[int],
    draft: Sequence[int],
    k: int,
    *,
    drafter_eos: Optional[int] = None,
    lookbehind: int = 8,
) -> list[int]:
    """The drafter's ``draft`` (drafter ids) as at most ``k`` target ids continuing the
    target ``context`` (module docstring, steps 1-3). Deterministic in its arguments.

    Args:
      target_tok, drafter_tok: objects with ``encode(text) -> list[int]`` and
        ``decode(ids) -> str`` (:class:`models.tokenizer.Tokenizer`).
      context: the target ids so far (prompt and generated).
      draft: the drafter's draft ids; cut before ``drafter_eos`` when given.
      k: the most target ids to return; lookbehind: context ids re-encoded with the draft.
    """
    draft = list(draft)
    if drafter_eos is not None and drafter_eos in draft:
        draft = draft[: draft.index(drafter_eos)]
    text = _decode(drafter_tok, draft)
    if not text or k < 1:
        return []
    tail = list(context[-lookbehind:]) if lookbehind > 0 else []
    ids = target_tok.encode(_decode(target_tok, tail) + text)
    out = ids[len(tail) :] if ids[: len(tail)] == tail else target_tok.encode(text)
    return [int(t) for t in out[:k]]


def drafter_contexts(
    target_tok,
    drafter_tok,
    rows: Sequence[Sequence[int]],
    width_extra: int,
    pad_id: int,
    bucket: int = 64,
) -> DraftContext:
    """Each row's target ids re-encoded as drafter ids, left-padded into one drafter buffer
    with ``width_extra`` free slots after the longest row (rounded up to ``bucket``)."""
    ids = [drafter_tok.encode(_decode(target_tok, r)) or [pad_id] for r in rows]
    longest = max(len(r) for r in ids)
    width = -(-(longest + width_extra) // bucket) * bucket
    buf = np.full((len(ids), width), pad_id, np.int32)
    pad = np.zeros((len(ids),), np.int32)
    for b, r in enumerate(ids):
        pad[b] = longest - len(r)
        buf[b, pad[b] : longest] = r
    return DraftContext(
        buffer=jnp.asarray(buf),
        length=jnp.full((len(ids),), longest, jnp.int32),
        pad=jnp.asarray(pad),
        active=jnp.ones((len(ids),), bool),
    )


def _propose(drafter, dparams, dstate, ctx, key, sample):
    return drafter.propose(dparams, dstate, ctx, key, sample)


def _update(drafter, dparams, dstate, ctx, n_accepted):
    return drafter.update(dparams, dstate, ctx, n_accepted)


_propose_jit = jax.jit(_propose, static_argnames=("drafter", "sample"))
_update_jit = jax.jit(_update, static_argnames=("drafter",))
_prefill_jit = jax.jit(prefill, static_argnames=("cfg",))
_verify_jit = jax.jit(verify_step, static_argnames=("cfg",))


# ----------------------------------------------------------------------------- step


def hetero_step(
    cfg: LoopConfig,
    params,
    drafter,
    dparams,
    dstate,
    st,
    pad,
    tokens_of,
    *,
    target_tok,
    drafter_tok,
    drafter_pad: int,
):
    """One iteration: the drafter proposes on every row's history (as its own ids), the host
    translates the drafts (:func:`translate_draft`), the target verifies them in one pass.

    ``tokens_of(st) -> list[list[int]]`` gives each row's target ids so far. Returns
    ``(st, dstate)``."""
    B, K = st.buffer.shape[0], cfg.k
    rows = tokens_of(st)
    dctx = drafter_contexts(target_tok, drafter_tok, rows, drafter.draft_length, drafter_pad)
    kd, kv = jax.random.split(jax.random.fold_in(st.key, st.it))
    draft, dstate = _propose_jit(drafter, dparams, dstate, dctx, kd, not cfg.sampling.greedy)
    if draft.q is not None:
        raise ValueError(
            f"drafter {type(drafter).__name__} proposes from a distribution q: a "
            f"drafter of another vocabulary must propose deterministically (q "
            f"cannot be carried over to the target's tokens)"
        )
    dtoks, dlen = np.asarray(draft.tokens), np.asarray(draft.length)
    done = np.asarray(st.done)
    tokens = np.zeros((B, K), np.int32)
    length = np.zeros((B,), np.int32)
    for b in range(B):
        if not done[b]:
            t = translate_draft(
                target_tok, drafter_tok, rows[b], dtoks[b, : dlen[b]], K, drafter_eos=drafter.eos_id
            )
            tokens[b, : len(t)], length[b] = t, len(t)
    nfe = np.where(done, 0, np.asarray(draft.nfe)).astype(np.int32)
    ext = Draft(
        tokens=jnp.asarray(tokens),
        q=None,
        has_draft=jnp.asarray(length > 0),
        length=jnp.asarray(length),
        nfe=jnp.asarray(nfe),
    )
    before = st.length
    st = _verify_jit(cfg, params, st, ext, kv, pad)
    n_acc = jnp.maximum(st.length - before - 1, 0)
    return st, _update_jit(drafter, dparams, dstate, dctx, n_acc)


# ----------------------------------------------------------------------------- host wrapper


def hetero_generate(
    model,
    params,
    prompts: Sequence[Sequence[int]],
    *,
    drafter,
    drafter_params,
    target_tokenizer,
    drafter_tokenizer,
    max_new_tokens: int,
    sampling: SamplingConfig = SamplingConfig(),
    seed: int = 0,
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
    drafter_pad_id: int = 0,
    bucket: int = 64,
) -> GenerationResult:
    """Speculative decoding with a drafter of another vocabulary (module docstring).

    Args:
      model, params: the causal target (:class:`models.llama.modeling.CausalLM`).
      prompts: ``B`` lists of target token ids.
      drafter: a drafter in its own vocabulary with a deterministic proposal, e.g.
        :class:`jaxspec.causal.diffuspec.DiffusionDrafter` (its ``draft_length`` is also the
        most target ids verified per step); drafter_params: its parameters.
      target_tokenizer, drafter_tokenizer: ``encode`` / ``decode`` of each side.
      max_new_tokens, sampling, seed, eos_ids, pad_id, bucket: as
        :func:`jaxspec.causal.decode.generate`; drafter_pad_id: filler of the drafter buffer.

    Returns:
      :class:`jaxspec.causal.decode.GenerationResult` (``stats.method`` ``"diffuspec-hetero"``,
      reference ``"ar"``; ``run_s`` includes the host translation and, on the first call of a
      shape, the compilation of the jitted pieces: ``compile_s`` is reported as 0).

    Raises:
      DecodeInputError: as :func:`jaxspec.causal.decode.generate` (empty prompts, ids outside
        the vocabulary, prompt + budget past the target's context).
      ValueError: a drafter whose proposals carry a draft distribution ``q`` (a sampled
        draft's q cannot be translated: only deterministic drafters are allowed).
    """
    check_request(model, prompts, max_new_tokens)
    K = int(drafter.draft_length)
    buf, pad = left_pad(prompts, bucket, pad_id)
    P = buf.shape[1]
    cfg = LoopConfig(
        model=model,
        max_new=int(max_new_tokens),
        sampling=sampling,
        drafter=ExternalDrafts(K),
        eos_ids=tuple(int(e) for e in eos_ids),
    )
    tparams, dparams = decode_layout(params), decode_layout(drafter_params)
    buf_d, pad_d = place_batch(params, buf, pad)
    t0 = time.perf_counter()
    st = _prefill_jit(cfg, tparams, (), buf_d, pad_d, jax.random.PRNGKey(seed))
    pad_np = np.asarray(pad)

    def tokens_of(s):
        b, L = np.asarray(s.buffer), np.asarray(s.length)
        return [b[i, pad_np[i] : L[i]].tolist() for i in range(len(L))]

    dctx = drafter_contexts(target_tokenizer, drafter_tokenizer, tokens_of(st), K, drafter_pad_id)
    dstate = drafter.init_state(dparams, dctx)
    while not bool(np.all(np.asarray(st.done))):
        st, dstate = hetero_step(
            cfg,
            tparams,
            drafter,
            dparams,
            dstate,
            st,
            pad_d,
            tokens_of,
            target_tok=target_tokenizer,
            drafter_tok=drafter_tokenizer,
            drafter_pad=drafter_pad_id,
        )
    run_s = time.perf_counter() - t0
    toks = np.asarray(st.buffer[:, P : P + cfg.max_new])
    n_new = np.asarray(st.n_new)
    rows = cut_after_eos(toks, cfg.eos_ids, budget=np.minimum(n_new, max_new_tokens))
    stats = DecodeStats(
        method="diffuspec-hetero",
        reference="ar",
        target_nfe=np.asarray(st.target_nfe),
        draft_nfe=np.asarray(st.draft_nfe),
        steps=np.asarray(st.steps),
        accept_hist=np.asarray(st.hist),
        new_tokens=np.array([len(r) for r in rows]),
        draft_length=K,
        drafts_proposed=np.asarray(st.proposed),
    )
    return GenerationResult(tokens=rows, stats=stats, compile_s=0.0, run_s=run_s)
