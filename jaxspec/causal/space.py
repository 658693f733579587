"""SPACE auto-correct decoding: a SAR-SFT causal LM verifies its candidates and drafts the
next ones in the same forward pass (SPACE, arXiv:2402.11809, Sec. 3.2,
Algorithm 1, Eqs. 4-7), exact under sampling.

**One forward per step.** With ``k`` candidates ``c_1..c_k`` from the previous step, the
target pass feeds (Eq. 4) the last emitted token ``x_l``, the candidates, and ``k + 1`` groups
of ``k`` [MASK] tokens, group ``g`` following ``c_g`` (group 0 follows ``x_l``):

* ``x_l, c_1..c_k`` are the ordinary verification rows of the causal chain loop
  (:mod:`jaxspec.causal.decode`): their logits give ``p`` for Algorithm 1 lines 7-17.
* Mask ``j`` (0-based) of group ``g`` sits at position ``P = pos(x_l) + g + 1 + j`` (Eq. 5's
  ``P_i = sum_j A_ij - 1``) and predicts position ``P + 1``: group ``g`` drafts the ``k``
  positions after the token the verifier emits once ``c_1..c_g`` are accepted.

**Attention: the official code's rule, not Eq. 5 as printed.** A mask sees the earlier
non-mask tokens (context, ``x_l``, ``c_1..c_g``) and the earlier masks *of its own group*
only; context and candidate rows never see a mask. Eq. 5 as printed lets a mask see every
mask within ``k`` positions before it (``i - j < k``), which spans into the previous group,
and it tells masks from tokens by id (``I[j] != M``). Here masks are told apart by their
place in the feed (they are :class:`~jaxspec.core.drafters.DraftQueries`, written after the
verification rows), so a generated token that happens to equal the mask id is ordinary text.

**Verification and the next candidates** (Algorithm 1 lines 8-24). The shared chain verifier
accepts ``c_1..c_{i*}``; the emitted token comes from row ``i*`` (correction or bonus). The
next candidates come from mask group ``i*``: its ``k`` rows, processed with the target's
temperature / top-k / top-p, are the draft distributions ``q_1..q_k``, and candidate ``j`` is
drawn from ``q_j`` independently (line 23) -- the argmax under greedy decoding.

**Exact under sampling** (``space_sampling="exact"``, default): group ``i*``'s rows depend on
the accepted history only (context and accepted candidates), and each candidate is drawn from
its row before the next step's uniforms, so the verifier that accepts with ``min(1, p/q)`` and
resamples the residual ``norm(max(0, p - q))`` is exact (Leviathan et al. 2023, Thm. 3.5).
``space_sampling="paper"`` is Algorithm 1 line 18 (and the official code): after a rejection
the extra token is drawn from ``p`` itself. That over-weights the rejected candidate's token
and is **not lossless** (``tests/causal/test_space.py`` shows it). Greedy decoding is exact
under both (the output is identical to AR greedy decoding of the same model).

**First step and the KV cache.** The prefill carries group 0 after the prompt, so the first
token comes with ``k`` candidates and every later step verifies ``k``; Algorithm 1 line 1
spends its first iteration the same way (``P_c = +inf`` rejects the zero candidates). Accepted
candidates never attend to masks, so their keys and values are kept; the masks and rejected
candidates sit past the accepted prefix and are overwritten (the loop's implicit rollback).

Cost per step: ``(k+1) + k(k+1) = (k+1)^2`` query rows (36 at ``k = 5``), one target NFE.

Module order: :class:`SpaceDrafter` (config) -> :class:`SpaceState` -> phases
(:func:`mask_groups`, :func:`pick_group`) -> the drafter protocol methods -> the host wrapper
:func:`space_generate`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.causal.decode import GenerationResult, generate
from jaxspec.core.drafters import Draft, DraftContext, Drafter, DraftQueries
from jaxspec.core.sampling import SamplingConfig, argmax, target_probs

__all__ = [
    "SPACE_SAMPLING",
    "SpaceDrafter",
    "SpaceState",
    "mask_groups",
    "pick_group",
    "space_generate",
]

SPACE_SAMPLING = ("exact", "paper")


@dataclasses.dataclass(frozen=True)
class SpaceDrafter(Drafter):
    """SPACE's mask groups as a :class:`jaxspec.core.drafters.Drafter` with draft queries.

    Attributes:
      draft_length: k, mask tokens per group = candidates per step (>= 1; paper default 5).
      vocab_size: V of the target model.
      mask_id: the [MASK] token id the SAR-SFT model was trained with (``0 <= id < V``).
      sampling: the target's temperature / top-k / top-p (the candidates' ``q``).
      space_sampling: ``"exact"`` (residual resampling, lossless) or ``"paper"``
        (Algorithm 1 line 18, approximate).

    Raises:
      ValueError: ``draft_length < 1``, a mask id outside the vocabulary, an unknown
        ``space_sampling``; at trace time, a ``sampling`` that disagrees with the loop's.
    """

    draft_length: int
    vocab_size: int
    mask_id: int
    sampling: SamplingConfig = SamplingConfig()
    space_sampling: str = "exact"

    name = "space"

    def __post_init__(self):
        if int(self.draft_length) < 1:
            raise ValueError(f"mask group size k must be >= 1, got {self.draft_length}")
        if not 0 <= int(self.mask_id) < int(self.vocab_size):
            raise ValueError(
                f"mask id {self.mask_id} outside the vocabulary of {self.vocab_size} tokens"
            )
        if self.space_sampling not in SPACE_SAMPLING:
            raise ValueError(
                f"unknown space_sampling {self.space_sampling!r}; expected one of {SPACE_SAMPLING}"
            )

    @property
    def resample(self) -> str:
        """The verifier's rule after a rejection (:func:`jaxspec.core.verify.verify_sample`)."""
        return "residual" if self.space_sampling == "exact" else "target"

    @property
    def position_overshoot(self) -> int:
        """How far past the last emitted token the mask rows reach (``2k`` positions): the
        context must hold prompt + budget + this."""
        return 2 * self.draft_length

    @property
    def query_slots(self) -> int:
        """The most mask rows one pass adds: ``k + 1`` groups of ``k``."""
        return (self.draft_length + 1) * self.draft_length

    # -- the protocol: state, queries, absorb, propose, update -----------------------------
    def init_state(self, params, ctx: DraftContext) -> "SpaceState":
        """Empty candidates; the prefill's group 0 fills them (:meth:`absorb`)."""
        B, k = ctx.buffer.shape[0], self.draft_length
        width = 1 if self.sampling.greedy else self.vocab_size
        return SpaceState(
            tokens=jnp.zeros((B, k), jnp.int32), q=jnp.zeros((B, k, width), jnp.float32)
        )

    def draft_queries(self, last_position: jax.Array, n_drafts: int) -> DraftQueries:
        """The ``n_drafts + 1`` mask groups of this pass (:func:`mask_groups`)."""
        return mask_groups(last_position, n_drafts, self.draft_length, self.mask_id)

    def absorb(self, state: "SpaceState", n_accepted: jax.Array, logits: jax.Array):
        """Keep mask group ``n_accepted`` as the next candidates (Algorithm 1 lines 23-24)."""
        rows = pick_group(logits, n_accepted, self.draft_length)
        if self.sampling.greedy:
            return state.replace(tokens=argmax(rows))
        return state.replace(q=target_probs(rows, self.sampling))

    def propose(self, params, state: "SpaceState", ctx: DraftContext, key: jax.Array, sample: bool):
        """The candidates of the last pass's chosen group: argmax (greedy) or one
        independent draw per position from its row (sampled). No draft NFE: they were
        computed inside the target pass."""
        if sample == self.sampling.greedy:
            raise ValueError("SpaceDrafter.sampling must be the decoder's sampling config")
        B, k = state.tokens.shape
        tokens = state.tokens
        if sample:
            tokens = jax.random.categorical(key, jnp.log(state.q), axis=-1).astype(jnp.int32)
        return Draft(
            tokens=tokens,
            q=state.q if sample else None,
            has_draft=jnp.ones((B,), bool),
            length=jnp.full((B,), k, jnp.int32),
            nfe=jnp.zeros((B,), jnp.int32),
        ), state

    def update(self, params, state, ctx: DraftContext, n_accepted: jax.Array):
        """Nothing: :meth:`absorb` already kept the next candidates."""
        return state


@flax.struct.dataclass
class SpaceState:
    """Candidates for the next step.

    Attributes:
      tokens: int32 ``(B, k)`` greedy candidates (argmax of the chosen group's rows).
      q: float32 ``(B, k, V)`` the chosen group's processed distributions under sampling
        (``(B, k, 1)`` zeros under greedy decoding).
    """

    tokens: jax.Array
    q: jax.Array


# ----------------------------------------------------------------------------- phases


def mask_groups(last_position: jax.Array, n_drafts: int, k: int, mask_id: int) -> DraftQueries:
    """The mask rows of one pass (Eqs. 4-5 with the official code's attention rule).

    Args:
      last_position: int32 ``(B,)`` RoPE position of the last emitted token ``x_l``.
      n_drafts: static number of candidates in the pass (``k``, or 0 in the prefill).
      k: mask tokens per group; mask_id: the [MASK] id.

    Returns:
      :class:`~jaxspec.core.drafters.DraftQueries` with ``E = (n_drafts + 1) k`` rows, group
      by group: mask ``j`` of group ``g`` at position ``last_position + g + 1 + j``, seeing
      candidates ``c_1..c_g`` and masks ``0..j`` of its own group.
    """
    G = n_drafts + 1
    g = np.repeat(np.arange(G), k)
    j = np.tile(np.arange(k), G)
    B = last_position.shape[0]
    positions = last_position[:, None] + jnp.asarray(g + 1 + j, jnp.int32)[None]
    sees_draft = np.arange(n_drafts)[None, :] < g[:, None]  # (E, kk)
    sees_query = (g[:, None] == g[None, :]) & (j[None, :] <= j[:, None])  # (E, E)
    return DraftQueries(
        tokens=jnp.full((B, G * k), mask_id, jnp.int32),
        positions=positions.astype(jnp.int32),
        sees_draft=sees_draft,
        sees_query=sees_query,
    )


def pick_group(logits: jax.Array, group: jax.Array, k: int) -> jax.Array:
    """Rows of mask group ``group[b]`` per row: ``(B, E, V)`` -> ``(B, k, V)``."""
    B, E, V = logits.shape
    grouped = logits.reshape(B, E // k, k, V)
    return jnp.take_along_axis(grouped, group[:, None, None, None], axis=1)[:, 0]


# ----------------------------------------------------------------------------- host wrapper


def space_generate(
    model,
    params,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    mask_groups: int = 5,
    sampling: SamplingConfig = SamplingConfig(),
    space_sampling: str = "exact",
    mask_id: Optional[int] = None,
    seed: int = 0,
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
    bucket: int = 64,
) -> GenerationResult:
    """SPACE auto-correct decoding of a batch of prompts (module docstring).

    Args:
      model, params: a SAR-SFT :class:`models.llama.modeling.CausalLM` and its parameters.
      prompts: ``B`` lists of token ids (left-padded internally).
      max_new_tokens: budget per row (>= 1).
      mask_groups: k, candidates per step and masks per group (>= 1).
      sampling: temperature / top-k / top-p (0 = greedy).
      space_sampling: ``"exact"`` (default, lossless) or ``"paper"`` (approximate).
      mask_id: the [MASK] id (default ``model.config.mask_token_id``).
      seed, eos_ids, pad_id, bucket: as :func:`jaxspec.causal.decode.generate`.

    Returns:
      :class:`~jaxspec.causal.decode.GenerationResult`; ``stats.method`` is ``"space"``,
      ``target_nfe`` counts forwards (prefill included), ``draft_nfe`` is 0.

    Raises:
      ValueError: the model has no mask token (not a SAR-SFT model), ``k < 1``, an unknown
        ``space_sampling``.
      DecodeInputError: as :func:`~jaxspec.causal.decode.generate` (the context must also
        hold the ``2k`` positions the mask rows reach past the last token).
    """
    mask_id = model.config.mask_token_id if mask_id is None else mask_id
    if mask_id is None:
        raise ValueError(
            "the model has no mask token: SPACE needs a SAR-SFT model "
            "(e.g. smollm2-135m-space) or an explicit mask_id"
        )
    drafter = SpaceDrafter(
        mask_groups, model.config.vocab_size, int(mask_id), sampling, space_sampling
    )
    return generate(
        model,
        params,
        prompts,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        drafter=drafter,
        seed=seed,
        eos_ids=eos_ids,
        pad_id=pad_id,
        bucket=bucket,
    )
