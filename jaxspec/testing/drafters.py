"""A toy *model-based* drafter for tests and forks: it exercises every part of the
:class:`jaxspec.core.drafters.Drafter` protocol that the n-gram drafter does not.

:class:`TableDrafter` is a bigram "draft model" whose parameters are a ``(V, V)`` logits table
(passed as ``drafter_params``, a traced argument of the compiled loop), whose loop state is
an adaptive per-row draft length ``k_t`` (grown by one after a step that accepted every
draft, shrunk to ``accepted + 1`` otherwise; a toy version of DiffuSpec's ADL), and which
reports one draft NFE per drafted token. Draft ``i`` is drawn from
``q_i = softmax(table[x_{i-1}])`` (argmax under greedy decoding).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxspec.core.drafters import Draft, DraftContext, Drafter


@dataclasses.dataclass(frozen=True)
class TableDrafter(Drafter):
    """Bigram-table draft model with an adaptive draft length (module docstring).

    Attributes:
      draft_length: k, the largest draft (static shapes).
      vocab_size: V.
      min_length: the smallest adaptive length (>= 1).
    """

    draft_length: int
    vocab_size: int
    min_length: int = 1
    name = "table"

    def init_state(self, params, ctx: DraftContext):
        """int32 ``(B,)``: every row starts at ``k_t = k``."""
        return jnp.full(ctx.buffer.shape[:1], self.draft_length, jnp.int32)

    def propose(self, params, state, ctx: DraftContext, key, sample: bool):
        table = params["logits"]  # (V, V)
        prev = jnp.take_along_axis(ctx.buffer, (ctx.length - 1)[:, None], axis=1)[:, 0]
        toks, qs = [], []
        for i in range(self.draft_length):
            q = jax.nn.softmax(table[prev], axis=-1)  # (B, V)
            tok = (
                jax.random.categorical(jax.random.fold_in(key, i), jnp.log(q))
                if sample
                else jnp.argmax(q, axis=-1)
            ).astype(jnp.int32)
            toks.append(tok)
            qs.append(q)
            prev = tok
        k_t = state
        return Draft(
            tokens=jnp.stack(toks, 1),
            q=jnp.stack(qs, 1) if sample else None,
            has_draft=jnp.ones_like(ctx.active),
            length=k_t,
            nfe=k_t,
        ), state

    def update(self, params, state, ctx: DraftContext, n_accepted):
        grown = jnp.minimum(state + 1, self.draft_length)
        shrunk = jnp.maximum(n_accepted + 1, self.min_length)
        return jnp.where(ctx.active, jnp.where(n_accepted >= state, grown, shrunk), state)
