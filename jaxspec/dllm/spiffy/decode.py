"""Spiffy decoding: draft blocks from a directed draft graph, verified in one batched forward.

Source: "Spiffy: Multiplying Diffusion LLM Acceleration via Lossless Speculative Decoding"
(arXiv:2509.18085; docs/methods/spiffy.md): draft blocks (Sec. 4.1), verification
(Sec. 4.2, Eqs. 2-3, Algorithm 1), drafting by (position rank, vocabulary rank) (Sec. 4.3,
Eqs. 10-13), composition with parallel decoding (Sec. 5.2, Table 2).

**Reference.** Spiffy is lossless against the reference decoder of :mod:`jaxspec.dllm.decode`
with the same :class:`~jaxspec.dllm.config.DiffusionDecodeConfig`: stepwise (any steps per
block, LLaDA or Dream schedule), fixed-k (``tokens_per_step``) or Fast-dLLM ``threshold``
decoding -- the unmasking rate ``S_t`` of the paper is whatever that rule transfers -- with
any remasking rule, temperature, top-k/top-p, ``alg_temp``, seed and cache policy ``"none"``
/ ``"dual"``. Every step Spiffy takes is :func:`jaxspec.dllm.reference.reference_step`
(:func:`~jaxspec.dllm.reference.score_block` + :func:`~jaxspec.dllm.reference.transfer_rule`)
on the state the reference would be in, with that step's random numbers
(:func:`jaxspec.dllm.reference.row_noise`, keyed by row and step), so it returns the
reference's tokens *and* transfer order; sampled runs reproduce the reference's sample path.

**Drafting** (Sec. 4.3). Position ranks order the block's still-masked positions by the top-1
probability of the drafting distribution (Eqs. 10, 12; ties to the lower position),
vocabulary ranks order tokens by probability (Eqs. 11, 13). The distribution is the
(mask-free, EOS-filtered, temperature-scaled, top-k/top-p filtered) one the reference samples
from (:func:`jaxspec.dllm.reference.processed_logits`). A graph is ``D`` formulas
(:class:`~jaxspec.dllm.spiffy.graph.DraftGraph`).

**One iteration** (one model forward, Algorithm 1):

1. *Draft* (Sec. 4.3): the drafting distribution is the last one computed: that of the state
   the previous iteration's last step was taken from (one step stale; the current state's
   own distribution is what this forward computes). Each formula gives a draft block: the
   current block with the formula's tokens unmasked. A formula naming a position rank past
   the masked count gives no draft.
2. *Verify* (Sec. 4.2, Eqs. 2-3): the current state and the ``D`` drafts run in one batched
   forward (:class:`jaxspec.dllm.nodes.NodeForwards`); each draft is its own row, attending
   to the rest of the sequence ``X'`` and to itself, at the block's position ids (Fig. 2).
3. *Walk* (Algorithm 1 steps 1-5): take the reference step on the current state (steps 1-4:
   ``X(t-1)``). If a draft block equals ``X(t-1)`` (same unmasked positions, same tokens), its
   distribution *is* ``p_TD(t-1)`` (Appendix A.1, Eqs. 19-23): take the next reference step
   from it and look again. Stop when no draft matches or the block is complete. So one
   forward gives ``1 + accepted`` reference steps.

Matching whole block states generalises Algorithm 1's ``t_m == t`` test to any ``S_t``: a
draft can only equal a state with as many unmasked tokens, so with ``tokens_per_step = 2`` a
graph calibrated at ``S = 1`` contributes through its even-sized formulas (Sec. 5.2 reuses the
``S = 1`` graphs this way). Drafts stay inside the current block; the first step of a block
has no drafting distribution for it and runs the current state alone (with the dual cache it
is the block's full forward anyway, as in Fast-dLLM). With the dual cache rows move through
blocks in lockstep, as in the reference.

NFE counts batched forwards; ``forward_tokens`` counts query tokens (nodes x tokens), which is
what the CPU time follows (Appendix B, Fig. 5: inference time grows with ``D``).

Layout of this module: :class:`SpiffyConfig` -> :class:`Loop` (what an iteration reads) ->
:class:`State` -> the phases (:func:`draft_ranks`, :func:`draft_blocks`, :func:`build_nodes`,
:func:`walk_step` / :func:`walk`, :func:`commit`) -> :func:`step` -> :func:`spiffy_loop` (one
``lax.while_loop``) -> :func:`run_spiffy` / :func:`spiffy_generate` (host).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxspec.core.batching import place_batch
from jaxspec.core.runtime import run_compiled
from jaxspec.dllm.blocks import BlockCache, BlockCursor, Canvas, Counters, Layout, advance_blocks
from jaxspec.dllm.config import (
    DiffusionDecodeConfig,
    DiffusionResult,
    diffusion_result,
    eos_statics,
    prepare_batch,
    structural,
)
from jaxspec.dllm.nodes import NodeForwards, check_mesh
from jaxspec.dllm.reference import Knobs, Rule, processed_logits, reference_step, transfer_rank
from jaxspec.dllm.spiffy.graph import DraftGraph, formula_arrays
from models.diffusion.modeling import DiffusionLM
from models.llama.layout import decode_layout


@dataclasses.dataclass(frozen=True)
class SpiffyConfig:
    """Spiffy settings (frozen, hashable).

    Attributes:
      decode: the reference (:mod:`jaxspec.dllm.decode`): stepwise / fixed-k / threshold, cache
        ``"none"`` or ``"dual"``, no classifier-free guidance.
      graph: the :class:`~jaxspec.dllm.spiffy.graph.DraftGraph` (``D = 0`` is the reference
        itself).

    Raises:
      ValueError: a cache other than none/dual, CFG, or a graph position rank above the block
        length (:class:`~jaxspec.dllm.spiffy.graph.GraphError`).
    """

    decode: DiffusionDecodeConfig
    graph: DraftGraph

    def __post_init__(self):
        d = self.decode
        if not isinstance(d, DiffusionDecodeConfig):
            raise ValueError("decode must be a DiffusionDecodeConfig")
        if not isinstance(self.graph, DraftGraph):
            raise ValueError("graph must be a DraftGraph (see load_graph)")
        if d.cache not in ("none", "dual"):
            raise ValueError(f"Spiffy supports cache 'none' or 'dual', not {d.cache!r}")
        if d.cfg_scale > 0:
            raise ValueError("Spiffy does not support classifier-free guidance")
        self.graph.check_block(d.block_length)

    @property
    def num_nodes(self) -> int:
        """``D + 1``: the current state and one node per draft formula."""
        return self.graph.size + 1


@dataclasses.dataclass(frozen=True, eq=False)
class Loop:
    """What every Spiffy iteration reads and never changes (built inside the jitted loop).

    Attributes:
      cfg: the (structural) :class:`SpiffyConfig`; rule: the reference step rule; key: the
      run's PRNG key; prompt_len: ``P``; forwards: the batched node forwards (window ``L``);
      record: > 0: record the drafting ranks (top-``record`` tokens) before every step.
    """

    cfg: SpiffyConfig
    rule: Rule
    key: jax.Array
    prompt_len: int
    forwards: NodeForwards
    record: int = 0

    @property
    def cached(self) -> bool:
        return self.cfg.decode.cache == "dual"

    @property
    def vocab_ranks(self) -> int:
        """``J``: vocabulary ranks kept per position."""
        return max(self.cfg.graph.max_vocab_rank, self.record, 1)

    def ranks(self, blk: jax.Array, bmask: jax.Array):
        """:func:`draft_ranks` of ``blk`` under this loop's rule."""
        return draft_ranks(blk, bmask, self.rule, self.vocab_ranks)


@flax.struct.dataclass
class Drafting:
    """The drafting distribution in force (the last one computed, Sec. 4.3).

    Attributes:
      have: bool ``(B,)`` one exists for the current block.
      rank: int32 ``(B, L)`` its position ranks (Eq. 12).
      top: int32 ``(B, L, J)`` its top-``J`` tokens per position (Eq. 13).
    """

    have: jax.Array
    rank: jax.Array
    top: jax.Array


@flax.struct.dataclass
class Record:
    """Calibration (Algorithm 2, Part 1): the drafting distribution before every step.

    Attributes:
      rank: int32 ``(B, G, L)`` position ranks before step ``s``.
      top: int32 ``(B, G, L, J)`` top-``J`` tokens before step ``s``.
      ok: bool ``(B, G)`` step ``s`` had a drafting distribution.
    """

    rank: jax.Array
    top: jax.Array
    ok: jax.Array

    def write(self, at: jax.Array, alive: jax.Array, drafting: Drafting) -> "Record":
        """Store ``drafting`` at step ``at`` int32 ``(B,)`` of the rows that are ``alive``."""
        rows = jnp.arange(at.shape[0])
        put = lambda a, v, cond: a.at[rows, at].set(jnp.where(cond, v, a[rows, at]))
        return Record(
            rank=put(self.rank, drafting.rank, alive[:, None]),
            top=put(self.top, drafting.top, alive[:, None, None]),
            ok=put(self.ok, drafting.have, alive),
        )


@flax.struct.dataclass
class State:
    """The Spiffy loop's carry.

    Attributes:
      canvas: tokens int32 ``(B, S)``, masked bool ``(B, G)``, transfer_step int32 ``(B, G)``.
      cursor: current block and reference step within it (lockstep with the dual cache).
      cache: the dual cache (``prev_logits`` float32 ``(B, V)`` for Dream).
      counters: reference steps, forwards, histogram int32 ``(B, D + 2)`` of reference steps
        per forward, draft blocks verified, query tokens.
      drafting: the drafting distribution of the current block.
      record: calibration record (``None`` unless recording).
    """

    canvas: Canvas
    cursor: BlockCursor
    cache: BlockCache
    counters: Counters
    drafting: Drafting
    record: Optional[Record]


# ----------------------------------------------------------------------------- drafting


def draft_ranks(blk: jax.Array, bmask: jax.Array, rule: Rule, J: int):
    """Position ranks (Eqs. 10, 12) and the top-``J`` tokens (Eqs. 11, 13) of a drafting
    distribution.

    Args:
      blk: float32 ``(..., L, V)`` logits scoring the block; bmask: bool ``(..., L)`` masked.
      rule: the reference :class:`~jaxspec.dllm.reference.Rule` (the distribution is the one
        the reference samples from, :func:`~jaxspec.dllm.reference.processed_logits`).
      J: vocabulary ranks kept.

    Returns: ``(rank int32 (..., L), top int32 (..., L, J))``: rank 0 is the masked position
    with the highest top-1 probability (unmasked positions rank after every masked one).
    """
    _, scaled = processed_logits(blk, rule)
    lp = jax.nn.log_softmax(scaled, axis=-1)
    top_lp, top = jax.lax.top_k(lp, J)
    rank = transfer_rank(jnp.where(bmask, top_lp[..., 0], -jnp.inf))
    return rank, top.astype(jnp.int32)


def draft_blocks(
    tok: jax.Array,
    msk: jax.Array,
    rank: jax.Array,
    top: jax.Array,
    fi: np.ndarray,
    fj: np.ndarray,
    fv: np.ndarray,
):
    """The draft blocks of one state (Sec. 4.3): the block with each formula's ``c_ij``
    unmasked.

    Args:
      tok, msk: int32 / bool ``(B, L)`` the current block; rank, top: :func:`draft_ranks`
        of the drafting distribution; fi, fj, fv: int32 / int32 / bool ``(D, K)``
        :func:`~jaxspec.dllm.spiffy.graph.formula_arrays`.

    Returns: ``(tokens int32 (B, D, L), masked bool (B, D, L), ok bool (B, D))``: ``ok`` is
    False where a formula names a position rank at or past the masked count.
    """
    L = tok.shape[-1]
    n_masked = jnp.sum(msk, axis=-1)  # (B,)
    pos_of = jnp.argmax(rank[:, None, :] == jnp.arange(L)[None, :, None], axis=-1)  # (B, L)
    fi, fj, fv = jnp.asarray(fi), jnp.asarray(fj), jnp.asarray(fv)
    pos = pos_of[:, fi]  # (B, D, K)
    B, J = top.shape[0], top.shape[-1]
    flat = (pos * J + fj[None]).reshape(B, -1)  # top[b, pos, j]
    val = jnp.take_along_axis(top.reshape(B, L * J), flat, axis=1).reshape(pos.shape)
    ok = jnp.all(~fv[None] | (fi[None] < n_masked[:, None, None]), axis=-1)  # (B, D)
    oh = (jnp.arange(L)[None, None, None] == pos[..., None]) & fv[None, :, :, None]  # (B, D, K, L)
    fill = oh.any(2)
    v = jnp.sum(jnp.where(oh, val[..., None], 0), axis=2)
    return jnp.where(fill, v, tok[:, None]), msk[:, None] & ~fill, ok


@flax.struct.dataclass
class Nodes:
    """The current block (node 0) and its draft blocks (nodes ``1..D``).

    Attributes:
      tokens: int32 ``(B, M, L)``; masked: bool ``(B, M, L)``;
      ok: bool ``(B, M)`` the node is a real draft (node 0 always).
    """

    tokens: jax.Array
    masked: jax.Array
    ok: jax.Array


def build_nodes(loop: Loop, st: State, tok0: jax.Array, msk0: jax.Array, active: jax.Array):
    """Step 1 (Draft): the nodes of every row and whether only the root runs.

    Args: tok0, msk0: int32 / bool ``(B, L)`` the current block; active: bool ``(B,)``.

    Returns: ``(Nodes, root_only bool ())``: without a cache the root runs alone when no row
    has a draft; with the cache at a block's first iteration."""
    B = tok0.shape[0]
    if loop.cfg.graph.size:
        dtok, dmsk, dok = draft_blocks(
            tok0, msk0, st.drafting.rank, st.drafting.top, *formula_arrays(loop.cfg.graph)
        )
        dok = dok & (st.drafting.have & active)[:, None]
        ntok = jnp.concatenate([tok0[:, None], jnp.where(dok[..., None], dtok, tok0[:, None])], 1)
        nmsk = jnp.concatenate([msk0[:, None], jnp.where(dok[..., None], dmsk, msk0[:, None])], 1)
        nok = jnp.concatenate([jnp.ones((B, 1), bool), dok], 1)  # (B, M)
    else:
        ntok, nmsk, nok = tok0[:, None], msk0[:, None], jnp.ones((B, 1), bool)
    root_only = st.cursor.fresh if loop.cached else ~jnp.any(nok[:, 1:])
    nok = nok.at[:, 1:].set(nok[:, 1:] & ~root_only)
    return Nodes(tokens=ntok, masked=nmsk, ok=nok), root_only


# ----------------------------------------------------------------------------- the walk


@flax.struct.dataclass
class Walk:
    """The verification walk of every row (step 3).

    Attributes:
      node: int32 ``(B,)`` the node whose distribution scores the next step (0 = current).
      alive: bool ``(B,)`` the row takes the next step.
      tokens, masked, transfer_step: int32 / bool / int32 ``(B, L)`` the block after the steps
        taken so far.
      steps_taken: int32 ``(B,)`` reference steps taken; accepted: int32 ``(B,)`` drafts
        matched; stop: int32 ``(B,)`` the node of the last step.
      drafting: the drafting distribution in force before the next step (recording only).
      record: the calibration record (``None`` unless recording).
    """

    node: jax.Array
    alive: jax.Array
    tokens: jax.Array
    masked: jax.Array
    transfer_step: jax.Array
    steps_taken: jax.Array
    accepted: jax.Array
    stop: jax.Array
    drafting: Drafting
    record: Optional[Record]


def walk_step(loop: Loop, st: State, rows: jax.Array, nodes: Nodes, dd, w: Walk) -> Walk:
    """Reference step ``dd`` of the walk, taken from node ``w.node``'s distribution; then move
    to the draft node equal to the new state, if any (Algorithm 1 steps 1-5).

    Args: rows float32 ``(B, M, L, V)`` every node's logits; dd int32 ``()`` the step's index
    in this iteration."""
    d = loop.cfg.decode
    blk = rows[jnp.arange(rows.shape[0]), w.node]  # (B, L, V)
    steps, sib = st.counters.steps + dd, st.cursor.step_in_block + dd
    x0, tr = reference_step(loop.rule, blk, w.masked, loop.key, steps, sib)
    tr = tr & w.alive[:, None]
    tokens, masked = jnp.where(tr, x0, w.tokens), w.masked & ~tr
    drafting, record = w.drafting, w.record
    if loop.record:  # drafting ranks in force before this step (Algorithm 2, Part 1)
        record = record.write(jnp.clip(steps, 0, d.gen_length - 1), w.alive, drafting)
        rank, top = loop.ranks(blk, masked)  # this node's: drafts the next step
        drafting = Drafting(have=jnp.ones_like(drafting.have), rank=rank, top=top)
    if d.method == "stepwise":
        full = sib + 1 >= d.steps_per_block
    else:
        full = ~jnp.any(masked, axis=-1)
    eq = (
        nodes.ok
        & jnp.all(nodes.tokens == tokens[:, None], -1)
        & jnp.all(nodes.masked == masked[:, None], -1)
    )
    eq = eq.at[:, 0].set(False)
    go = w.alive & jnp.any(eq, axis=-1) & ~full
    return Walk(
        node=jnp.where(go, jnp.argmax(eq, axis=-1).astype(jnp.int32), w.node),
        alive=go,
        tokens=tokens,
        masked=masked,
        transfer_step=jnp.where(tr, steps[:, None], w.transfer_step),
        steps_taken=w.steps_taken + w.alive.astype(jnp.int32),
        accepted=w.accepted + go.astype(jnp.int32),
        stop=jnp.where(w.alive, w.node, w.stop),
        drafting=drafting,
        record=record,
    )


def walk(
    loop: Loop, st: State, rows: jax.Array, nodes: Nodes, active: jax.Array, tstep0: jax.Array
) -> Walk:
    """Up to ``D + 1`` reference steps from the current node (one for ``D = 0``)."""
    zeros = jnp.zeros_like(active, jnp.int32)
    start = Walk(
        node=zeros,
        alive=active,
        tokens=nodes.tokens[:, 0],
        masked=nodes.masked[:, 0],
        transfer_step=tstep0,
        steps_taken=zeros,
        accepted=zeros,
        stop=zeros,
        drafting=st.drafting,
        record=st.record,
    )
    D = loop.cfg.graph.size
    return jax.lax.fori_loop(
        0, 1 if D == 0 else D + 1, lambda dd, w: walk_step(loop, st, rows, nodes, dd, w), start
    )


def next_drafting(
    loop: Loop, st: State, rows: jax.Array, w: Walk, active: jax.Array, block_done: jax.Array
) -> Drafting:
    """The distribution of the node the walk stopped at drafts the next iteration (one step
    stale); a row whose block is complete has none for its next block."""
    rank, top = loop.ranks(rows[jnp.arange(rows.shape[0]), w.stop], w.masked)
    old = st.drafting
    return Drafting(
        have=active & ~block_done | (old.have & ~active),
        rank=jnp.where(active[:, None], rank, old.rank),
        top=jnp.where(active[:, None, None], top, old.top),
    )


# ----------------------------------------------------------------------------- the loop


def step(loop: Loop, st: State) -> State:
    """One Spiffy iteration: draft, one batched forward, walk, commit."""
    d, P = loop.cfg.decode, loop.prompt_len
    L, nb = d.block_length, d.num_blocks
    active = st.cursor.active(nb)
    start = st.cursor.start_slot(P, L, nb)
    tok0, msk0, tstep0 = st.canvas.block(start, P, L)
    nodes, root_only = build_nodes(loop, st, tok0, msk0, active)
    seqs = jax.vmap(
        lambda r, w, s: jax.vmap(lambda x: jax.lax.dynamic_update_slice_in_dim(r, x, s, 0))(w)
    )(st.canvas.tokens, nodes.tokens, start)  # (B, M, S)
    rows, cache = loop.forwards(root_only, st.canvas.tokens, seqs, st.cache, start)
    w = walk(loop, st, rows, nodes, active, tstep0)
    canvas = st.canvas.put_block(start, P, w.tokens, w.masked, w.transfer_step)
    sib = st.cursor.step_in_block + w.steps_taken
    block_done = (
        (sib >= d.steps_per_block) if d.method == "stepwise" else ~jnp.any(w.masked, axis=-1)
    )
    drafting = next_drafting(loop, st, rows, w, active, block_done)
    cursor = advance_blocks(st.cursor, active, block_done, w.steps_taken, nb, loop.cached)
    if loop.cached:
        drafting = drafting.replace(have=drafting.have & ~cursor.fresh)
    proposed = jnp.where(root_only, 0, jnp.sum(nodes.ok[:, 1:], -1)) * active.astype(jnp.int32)
    counters = st.counters.add(
        active,
        w.steps_taken,
        w.accepted + 1,
        proposed,
        loop.forwards.query_tokens(root_only, P + d.gen_length),
    )
    return State(
        canvas=canvas,
        cursor=cursor,
        cache=cache,
        counters=counters,
        drafting=drafting,
        record=w.record,
    )


def spiffy_loop(
    params,
    prompt: jax.Array,
    pad: jax.Array,
    key: jax.Array,
    knobs: Knobs,
    *,
    model: DiffusionLM,
    cfg: SpiffyConfig,
    mask_id: int,
    eos_ids: tuple[int, ...] = (),
    mesh: Optional[Mesh] = None,
    record: int = 0,
):
    """The jitted Spiffy loop (``cfg.decode`` structural, the numbers traced in ``knobs``).

    Args: prompt int32 ``(B, P)`` left-padded, pad int32 ``(B,)``, key the run's PRNG key;
    record > 0: also record the drafting ranks (top-``record`` tokens) before every step.

    Returns: ``(tokens int32 (B, G), transfer_step int32 (B, G), Counters, Record or None)``."""
    d = cfg.decode
    B, P = prompt.shape
    G, L = d.gen_length, d.block_length
    S, cached = P + G, d.cache == "dual"
    forwards = NodeForwards(
        model, params, pad, Layout.of(pad, S), cfg.num_nodes, L, L, cached, mesh
    )
    loop = Loop(
        cfg=cfg,
        rule=Rule(knobs, d, mask_id, eos_ids),
        key=key,
        prompt_len=P,
        forwards=forwards,
        record=record,
    )
    J = loop.vocab_ranks
    st = State(
        canvas=Canvas.start(prompt, G, mask_id),
        cursor=BlockCursor.start(B),
        cache=BlockCache.start(model, B, S, B, cached, params),
        counters=Counters.start(B, cfg.graph.size + 2, G),
        drafting=Drafting(
            have=jnp.zeros((B,), bool),
            rank=jnp.zeros((B, L), jnp.int32),
            top=jnp.zeros((B, L, J), jnp.int32),
        ),
        record=Record(
            rank=jnp.zeros((B, G, L), jnp.int32),
            top=jnp.zeros((B, G, L, J), jnp.int32),
            ok=jnp.zeros((B, G), bool),
        )
        if record
        else None,
    )
    st = jax.lax.while_loop(
        lambda s: jnp.any(s.cursor.block < d.num_blocks), lambda s: step(loop, s), st
    )
    rec = st.record.replace(top=st.record.top[..., :record]) if record else None
    return st.canvas.tokens[:, P:], st.canvas.transfer_step, st.counters, rec


_spiffy_jit = jax.jit(
    spiffy_loop, static_argnames=("model", "cfg", "mask_id", "eos_ids", "mesh", "record")
)


def run_spiffy(
    model: DiffusionLM,
    params,
    prompts: Sequence[Sequence[int]],
    cfg: SpiffyConfig,
    seed: int = 0,
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
    bucket: int = 16,
    max_context: Optional[int] = None,
    mesh: Optional[Mesh] = None,
    record: int = 0,
):
    """Check, pad, compile (cached) and run :func:`spiffy_loop` on the host.

    Returns: ``(tokens, transfer_step, Counters, Record or None)`` as numpy, ``compile_s``,
    ``run_s``.

    Raises: ValueError: as :func:`spiffy_generate`."""
    d = cfg.decode
    check_mesh(mesh, len(prompts), cfg.num_nodes)
    buf, pad, mask_id = prepare_batch(model, prompts, d, eos_ids, pad_id, bucket, max_context)
    scfg = dataclasses.replace(cfg, decode=structural(d), graph=DraftGraph(cfg.graph.formulas))
    statics = dict(
        model=model,
        cfg=scfg,
        mask_id=mask_id,
        eos_ids=eos_statics(d, eos_ids),
        mesh=mesh,
        record=record,
    )
    args = (
        decode_layout(params),
        *place_batch(params, buf, pad),
        jax.random.PRNGKey(seed),
        Knobs.of(d),
    )
    out, compile_s, run_s = run_compiled(_spiffy_jit, args, statics)
    return jax.tree_util.tree_map(np.asarray, out), compile_s, run_s


def spiffy_generate(
    model: DiffusionLM,
    params,
    prompts: Sequence[Sequence[int]],
    cfg: SpiffyConfig,
    seed: int = 0,
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
    bucket: int = 16,
    max_context: Optional[int] = None,
    mesh: Optional[Mesh] = None,
) -> DiffusionResult:
    """Decode a batch with Spiffy (module docstring, Algorithm 1); lossless against
    ``diffusion_generate(model, params, prompts, cfg.decode, seed, ...)``.

    Args: as :func:`jaxspec.dllm.decode.diffusion_generate`, with ``cfg`` a :class:`SpiffyConfig`;
      ``mesh``: optional :func:`jaxspec.dllm.nodes.draft_mesh` sharding the ``B * (D + 1)``
      rows of each verification forward over devices (must divide).

    Returns:
      :class:`~jaxspec.dllm.config.DiffusionResult`: ``full_tokens`` / ``transfer_step`` int32
      ``(B, G)``; ``stats.method`` is ``"spiffy"``, ``target_nfe`` the batched forwards,
      ``steps`` the reference steps replayed (the reference's NFE), ``accept_hist[b, j]``
      forwards that took ``j`` reference steps (``j - 1`` accepted drafts; the
      :class:`~jaxspec.core.stats.DecodeStats` convention), ``draft_length`` ``D``,
      ``drafts_proposed`` the draft blocks verified; ``extra`` has ``graph_D``, ``nodes``,
      ``unmasking`` (the reference rule), ``cache``, ``forward_tokens``, ``nfe_speedup``
      (reference NFE / Spiffy NFE, Eq. 14) and ``step_reduction`` (``1 - NFE / reference
      NFE``).

    Raises:
      ValueError: as :func:`jaxspec.dllm.decode.diffusion_generate`, or a mesh that does not
        divide the verification batch.
    """
    d = cfg.decode
    (toks, tstep, c, _), compile_s, run_s = run_spiffy(
        model, params, prompts, cfg, seed, eos_ids, pad_id, bucket, max_context, mesh
    )
    unmasking = {
        "stepwise": f"stepwise-{d.steps}",
        "fixed-k": f"fixed-{d.tokens_per_step}",
        "threshold": f"threshold-{d.threshold}",
    }[d.method]
    return diffusion_result(
        toks,
        tstep,
        eos_ids,
        d,
        compile_s,
        run_s,
        method="spiffy",
        reference=d.method,
        target_nfe=c.nfe,
        steps=c.steps,
        accept_hist=c.accept_hist,
        draft_length=cfg.graph.size,
        drafts_proposed=c.proposed,
        forward_tokens=c.forward_tokens,
        steps_by_nfe=c.steps_by_nfe,
        extra={
            "graph_D": cfg.graph.size,
            "nodes": cfg.num_nodes,
            "unmasking": unmasking,
            "nfe_speedup": float(c.steps.sum() / max(c.nfe.sum(), 1)),
            "step_reduction": float(1.0 - c.nfe.sum() / max(c.steps.sum(), 1)),
        },
    )


__all__ = [
    "SpiffyConfig",
    "spiffy_generate",
    "run_spiffy",
    "spiffy_loop",
    "draft_ranks",
    "draft_blocks",
    "build_nodes",
    "walk_step",
    "walk",
    "next_drafting",
    "step",
    "Loop",
    "State",
    "Drafting",
    "Record",
    "Nodes",
    "Walk",
]
