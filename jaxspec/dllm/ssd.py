"""SSD: lossless self-speculative decoding for masked-diffusion LMs.

Source: "Self Speculative Decoding for Diffusion Large Language Models"
(Gao et al., arXiv:2510.04147; docs/methods/ssd.md): Sec. 3.2 and Algorithm 1
(Appendix A), the mix-order tree of Sec. 5.2 and the acceptance-limit analysis of Sec. 5.1.

**Reference.** SSD is lossless against *stepwise* decoding with one token per step
(:func:`jaxspec.dllm.decode.diffusion_generate` with ``steps == gen_length``; same remasking rule,
temperature, top-k/top-p, seed and cache policy): it returns the same tokens, transferred in
the same order. Each reference step is :func:`jaxspec.dllm.reference.score_block` on the state's
current block (rank 0 is transferred) with the random numbers of that step
(:func:`jaxspec.dllm.reference.row_noise` keyed by row and step), so with temperature > 0 SSD
reproduces the stepwise *sample path* for a seed, not only its distribution.

**One iteration** (Algorithm 1 lines 7-14):

1. *Select* (line 7, Sec. 3.2.2): from the drafts ``d, c`` (token and confidence per masked
   position, from the last verification pass), take up to ``N`` candidates
   ``C_1..C_N``: the current block's positions by decreasing confidence, then (only when the
   current block has fewer than ``N`` left) the next block's. Ties go to the lower position.
2. *Build the tree* (line 11, Sec. 3.2.3): the greedy chain has ``N + 1`` nodes,
   ``n_i = x + {C_1..C_i}`` for ``i = 0..N`` (``n_0`` is the current state). The mix-order
   tree (Sec. 5.2) adds ``m_i = n_{i-1} + {C_{i+1}}`` for ``i = 1..N-1``: the state after the
   out-of-order step that takes ``C_{i+1}`` before ``C_i``; from ``m_i`` the in-order step
   ``C_i`` leads to ``n_{i+1}``, back on the chain. That is ``2N`` nodes (Table 3 lists
   batch sizes 6 / 8 / 10 for N = 3 / 4 / 5; the text's "2N - 1" does not count the root).
3. *Verify* (line 12, Eq. 5): every node runs in **one batched forward**. Walking from
   ``n_0``: the reference step computed on node ``n_i`` is compared with the next draft
   ``C_{i+1}`` (position and token); on a match the draft is accepted and the walk moves to
   ``n_{i+1}``; with mix-order, a step equal to ``C_{i+2}`` is accepted and the walk tries
   ``m_{i+1}`` -> ``n_{i+2}``. At the first node whose step matches nothing, that step itself
   is accepted (it *is* the reference's next step) and the iteration ends; at ``n_N`` the
   leaf's step is accepted. So 1 to ``N + 1`` tokens per forward, every one equal to what
   stepwise decoding does in that state.
4. *Update drafts* (line 14): the predictions of the node the walk stopped at become the
   drafts of the next iteration (no extra forward; they are one token stale).

**Fallback** (Algorithm 1 lines 8-9): the very first iteration has no drafts, and near the
end fewer than ``N`` masked positions remain. Instead of switching algorithms we run the same
chain with ``n_c = min(N, draftable positions)`` live candidates; an iteration with no
candidate at all forwards only ``n_0`` (a plain stepwise step).

**Dual cache** (Fast-dLLM, as in :mod:`jaxspec.dllm.decode`; the paper's baseline uses it): at a
block's first step the reference runs one full forward and caches keys/values; every later
step forwards only the block against that cache. SSD does the same: a block's first
iteration is a one-node full forward; later iterations forward every node's block window
against the block-start cache (tiled per node). Because the first step of the *next* block
needs a new full forward, chains do not cross a block boundary with the cache (candidates
come from the current block only). Rows of a batch move through the blocks in lockstep.
Without a cache every node is a full forward and chains may spill into the next block.

NFE counts batched verification forwards (one per iteration, whatever the node count);
``forward_tokens`` counts query tokens (nodes x tokens), which is what CPU time follows.

**Multi-device verification** (``mesh``): the ``B x nodes`` verification sequences of an
iteration are one batch, so they are sharded over the devices of a 1-D
:class:`jax.sharding.Mesh` with a ``"draft"`` axis (:func:`jaxspec.dllm.nodes.draft_mesh`); XLA
partitions the forward (GSPMD). :func:`jaxspec.dllm.nodes.shard_params` additionally splits every
weight matrix over the same devices (last axis) for checkpoints too big for one device. The decoded
tokens do not depend on the mesh (tested with 4 fake CPU devices). On a TPU slice:
``ssd_generate(..., mesh=draft_mesh())`` and ``params = shard_params(params, mesh)``.

Layout of this module: :class:`SSDConfig` -> :class:`Loop` (what an iteration reads) ->
:class:`State` -> the phases (:func:`select_row`, :func:`build_nodes`, :func:`node_steps`,
:func:`walk_row`, :func:`commit`, :func:`next_drafts`) -> :func:`step` -> :func:`ssd_loop` (one
``lax.while_loop``) -> :func:`ssd_generate` (host); then the Sec. 5.1 analysis tools.
The batched node forwards are :mod:`jaxspec.dllm.nodes` (shared with Spiffy).
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
from jaxspec.dllm.blocks import (
    BlockCache,
    BlockCursor,
    Canvas,
    Counters,
    Layout,
    advance_blocks,
    block_window,
    put_window,
)
from jaxspec.dllm.config import (
    DiffusionDecodeConfig,
    DiffusionResult,
    diffusion_result,
    eos_statics,
    prepare_batch,
    structural,
)
from jaxspec.dllm.decode import diffusion_generate
from jaxspec.dllm.nodes import NodeForwards, check_mesh, draft_mesh, shard_params
from jaxspec.dllm.reference import Knobs, Rule, row_noise, score_block
from models.diffusion.modeling import DiffusionLM
from models.llama.layout import decode_layout

TREES = ("chain", "mix-order")


@dataclasses.dataclass(frozen=True)
class SSDConfig:
    """SSD settings (frozen, hashable).

    Attributes:
      decode: the stepwise reference: ``steps == gen_length`` (one token per step), LLaDA
        schedule, a ranking remasking rule (not ``"origin"``), ``cache`` ``"none"`` or
        ``"dual"``, no CFG.
      draft_length: ``k`` (the paper's ``N``), candidates verified per iteration,
        ``1 <= k <= block_length``.
      tree: ``"chain"`` (greedy, ``k + 1`` nodes) or ``"mix-order"`` (``2k`` nodes).

    Raises:
      ValueError: any of the above violated, naming the setting.
    """

    decode: DiffusionDecodeConfig
    draft_length: int = 3
    tree: str = "chain"

    def __post_init__(self):
        d = self.decode
        if not isinstance(d, DiffusionDecodeConfig):
            raise ValueError("decode must be a DiffusionDecodeConfig")
        if d.method != "stepwise" or d.steps != d.gen_length or d.schedule != "llada":
            raise ValueError(
                "SSD's reference is stepwise decoding with one token per step: "
                f"need steps == gen_length ({d.gen_length}), the llada schedule and "
                "no tokens_per_step / threshold"
            )
        if d.remasking == "origin":
            raise ValueError(
                "remasking 'origin' transfers a random number of tokens per step; "
                "SSD needs one token per step"
            )
        if d.cfg_scale > 0:
            raise ValueError("SSD does not support classifier-free guidance")
        if d.cache not in ("none", "dual"):
            raise ValueError(f"SSD supports cache 'none' or 'dual', not {d.cache!r}")
        if (
            isinstance(self.draft_length, bool)
            or not isinstance(self.draft_length, int)
            or not 1 <= self.draft_length <= d.block_length
        ):
            raise ValueError(
                f"draft_length must be an int in [1, block_length={d.block_length}], "
                f"got {self.draft_length!r}"
            )
        if self.tree not in TREES:
            raise ValueError(f"unknown tree {self.tree!r}; expected one of {', '.join(TREES)}")

    @property
    def num_nodes(self) -> int:
        """``M``: ``k + 1`` (chain) or ``2k`` (mix-order) nodes per row."""
        return self.draft_length + 1 if self.tree == "chain" else 2 * self.draft_length


def tree_inclusion(draft_length: int, tree: str) -> np.ndarray:
    """bool ``(M, k)``: ``inc[j, c]`` = node ``j`` holds candidate ``C_{c+1}``.

    Nodes ``0..k`` are the chain ``n_0..n_k``; with ``"mix-order"`` node ``k + i`` is
    ``m_i = n_{i-1} + {C_{i+1}}`` for ``i = 1..k-1`` (module docstring)."""
    N = draft_length
    inc = [[k < j for k in range(N)] for j in range(N + 1)]
    if tree == "mix-order":
        inc += [[k < i - 1 or k == i for k in range(N)] for i in range(1, N)]
    return np.array(inc, bool).reshape(-1, N)


@dataclasses.dataclass(frozen=True, eq=False)
class Loop:
    """What every SSD iteration reads and never changes (built inside the jitted loop).

    Attributes:
      cfg: the (structural) :class:`SSDConfig`; rule: the reference step rule; key: the
      run's PRNG key; prompt_len: ``P``; forwards: the batched node forwards (window ``W``:
      the current block, and without a cache the next one too).
    """

    cfg: SSDConfig
    rule: Rule
    key: jax.Array
    prompt_len: int
    forwards: NodeForwards

    @property
    def cached(self) -> bool:
        return self.cfg.decode.cache == "dual"

    @property
    def window(self) -> int:
        """``W``: draft / score window from the current block's start (``L`` or ``2L``)."""
        return self.forwards.window

    @property
    def inclusion(self) -> jax.Array:
        """bool ``(M, k)`` :func:`tree_inclusion`."""
        return jnp.asarray(tree_inclusion(self.cfg.draft_length, self.cfg.tree))


@flax.struct.dataclass
class Drafts:
    """The drafts of every generation position (Algorithm 1 line 14).

    Attributes:
      tokens: int32 ``(B, G_ext)`` draft token per position.
      confidence: float32 ``(B, G_ext)`` its confidence (``-inf``: no draft).
    """

    tokens: jax.Array
    confidence: jax.Array


@flax.struct.dataclass
class State:
    """The SSD loop's carry.

    Attributes:
      canvas: tokens int32 ``(B, S_ext)``, masked bool ``(B, G_ext)`` (the ``L`` extension
        slots of uncached decoding are never masked), transfer_step int32 ``(B, G)``.
      drafts: :class:`Drafts`.
      cursor: dual cache: the lockstep block; unused without a cache.
      cache: the dual cache (``prev_logits`` float32 ``(B, V)`` for Dream).
      counters: reference steps, verification forwards, accepted-tokens histogram int32
        ``(B, k + 2)``, candidates verified, query tokens.
    """

    canvas: Canvas
    drafts: Drafts
    cursor: BlockCursor
    cache: BlockCache
    counters: Counters


# ----------------------------------------------------------------------------- phases


def current_block(loop: Loop, st: State):
    """``(block int32 (B,), active bool (B,))``: with the cache the lockstep block; without,
    each row's first block that still has a masked position."""
    d = loop.cfg.decode
    nb = d.num_blocks
    if loop.cached:
        return jnp.minimum(st.cursor.block, nb - 1), st.cursor.active(nb)
    B = st.canvas.masked.shape[0]
    bm = st.canvas.masked[:, : d.gen_length].reshape(B, nb, d.block_length).any(-1)
    return jnp.argmax(bm, axis=-1).astype(jnp.int32), bm.any(-1)


def select_row(dtok_w: jax.Array, dconf_w: jax.Array, mask_w: jax.Array, L: int, N: int):
    """Candidates of one row from its draft window of ``W`` positions (Sec. 3.2.2): the
    current block by decreasing confidence, then the next block; ties to the lower position.

    Returns: ``(idx int32 (k,), tok int32 (k,), n_c int32 ())``: window indices, their draft
    tokens, and how many are live."""
    W = mask_w.shape[0]
    ok = mask_w & (dconf_w > -jnp.inf)
    half = jnp.where(ok, jnp.arange(W) // L, 2)
    c = jnp.where(ok, dconf_w, 0.0)
    idx = jnp.arange(W)
    hi, hj, ci, cj = half[:, None], half[None, :], c[:, None], c[None, :]
    before = (hj < hi) | ((hj == hi) & ((cj > ci) | ((cj == ci) & (idx[None, :] < idx[:, None]))))
    rank = jnp.sum(before, axis=-1)
    n_c = jnp.minimum(N, jnp.sum(ok))
    sel = rank[None, :] == jnp.arange(N)[:, None]  # (k, W)
    cand = jnp.sum(jnp.where(sel, idx[None, :], 0), axis=-1).astype(jnp.int32)
    return cand, dtok_w[cand], n_c.astype(jnp.int32)


def build_nodes(
    inc: jax.Array,
    canvas: Canvas,
    start: jax.Array,
    prompt_len: int,
    W: int,
    cand: jax.Array,
    ctok: jax.Array,
    n_c: jax.Array,
):
    """The node sequences of every row (Sec. 3.2.3): node ``j`` is the current state with the
    live candidates ``inc[j]`` written in.

    Args: inc bool ``(M, k)``; start int32 ``(B,)`` the block's first slot; cand, ctok int32
    ``(B, k)`` window indices and tokens; n_c int32 ``(B,)`` live candidates.

    Returns: ``(tokens int32 (B, M, S_ext), masked bool (B, M, W))``: the node sequences and
    their still-masked window positions."""
    N = cand.shape[1]
    slots = jnp.arange(canvas.tokens.shape[1], dtype=jnp.int32)[None]
    live = jnp.arange(N)[None] < n_c[:, None]  # (B, k)
    at = start[:, None] + cand  # (B, k) absolute slots
    onehot = (slots[:, None, :] == at[:, :, None]) & live[:, :, None]  # (B, k, S_ext)
    fill = jnp.einsum("mn,bns->bms", inc.astype(jnp.int32), onehot.astype(jnp.int32)) > 0
    val = jnp.sum(jnp.where(onehot, ctok[:, :, None], 0), axis=1)  # (B, S_ext)
    toks = jnp.where(fill, val[:, None, :], canvas.tokens[:, None, :])
    mwin = block_window(canvas.masked, start - prompt_len, W)
    fwin = block_window(fill, start, W, axis=1)
    return toks, mwin[:, None, :] & ~fwin


def node_steps(loop: Loop, rows: jax.Array, nmask: jax.Array, steps: jax.Array):
    """The reference step of every node (on the node's current block) and its predictions
    over the whole window.

    Args: rows float32 ``(B, M, W, V)``; nmask bool ``(B, M, W)``; steps int32 ``(B,)`` the
    rows' reference steps (node ``j`` at depth ``d`` uses the noise of step ``steps + d``).

    Returns: ``(x0 int32 (B, M, W), conf float32 (B, M, W), pos int32 (B, M), tok int32 (B, M),
    has bool (B, M))``: predictions, confidences, each node's step (window index, token) and
    whether the node has a step at all."""
    B, M, W, V = rows.shape
    L = loop.cfg.decode.block_length
    H = W // L
    depth = jnp.sum(loop.inclusion, axis=1).astype(jnp.int32)  # (M,)
    u_tok, u_pos = jax.vmap(
        lambda b_, s: jax.vmap(lambda dd: row_noise(loop.key, b_, s + dd, L, V, loop.rule.sampled))(
            depth
        )
    )(jnp.arange(B), steps)
    bm_h = nmask.reshape(B, M, H, L)
    x0, conf, rank = score_block(
        rows.reshape(B, M, H, L, V),
        bm_h,
        None if u_tok is None else jnp.broadcast_to(u_tok[:, :, None], (B, M, H, L, V)),
        jnp.broadcast_to(u_pos[:, :, None], (B, M, H, L)),
        loop.rule,
    )
    h = jnp.argmax(bm_h.any(-1), axis=-1)  # (B, M) node's block half
    take = lambda a: jnp.take_along_axis(a, h[:, :, None, None], axis=2)[:, :, 0]
    r_h, x_h = take(rank), take(x0)  # (B, M, L)
    has = jnp.take_along_axis(bm_h.any(-1), h[:, :, None], axis=2)[:, :, 0]
    if loop.cached:  # a node whose block is full has no step inside the block
        has = has & (h == 0)
    j = jnp.argmin(r_h, axis=-1).astype(jnp.int32)  # rank 0 position
    pos = h.astype(jnp.int32) * L + j  # window index
    tok = jnp.take_along_axis(x_h, j[:, :, None], axis=2)[:, :, 0]
    return x0.reshape(B, M, W), conf.reshape(B, M, W), pos, tok, has


@flax.struct.dataclass
class Chain:
    """The verification walk of one row (module docstring, step 3).

    Attributes:
      node: int32 ``()`` the chain node ``n_i`` the walk stands on.
      done: bool ``()`` the walk has ended.
      stop: int32 ``()`` the node whose predictions become the next drafts.
      n_acc: int32 ``()`` accepted steps so far.
      pos, tok: int32 ``(k + 1,)`` the accepted steps in order (window index, token).
    """

    node: jax.Array
    done: jax.Array
    stop: jax.Array
    n_acc: jax.Array
    pos: jax.Array
    tok: jax.Array

    def accept(self, pos, tok, cond) -> "Chain":
        """Append the step ``(pos, tok)`` where ``cond``."""
        n = self.n_acc
        return self.replace(
            pos=jnp.where(cond, self.pos.at[n].set(pos), self.pos),
            tok=jnp.where(cond, self.tok.at[n].set(tok), self.tok),
            n_acc=n + cond.astype(jnp.int32),
        )


def walk_row(cand, ctok, n_c, p, t, has, N: int, mix: bool) -> Chain:
    """Walk one row's nodes from ``n_0`` (module docstring, step 3).

    Args: candidates ``cand``/``ctok`` int32 ``(k,)`` and their live count ``n_c``; every
    node's reference step ``p``/``t`` int32 ``(M,)`` (window index, token) and whether it has
    one ``has`` bool ``(M,)``.

    Returns: the final :class:`Chain` (1 to ``k + 1`` accepted steps, in reference order)."""

    def match(j, k):
        kc = jnp.minimum(k, N - 1)
        return (k < n_c) & has[j] & (p[j] == cand[kc]) & (t[j] == ctok[kc])

    def advance(_, ch: Chain) -> Chain:
        i, live = ch.node, ~ch.done
        kc, kc1 = jnp.minimum(i, N - 1), jnp.minimum(i + 1, N - 1)
        nxt = live & match(i, i)
        if mix:
            jm = jnp.minimum(N + i + 1, 2 * N - 1)
            skip = live & ~nxt & (i + 1 < N) & match(i, i + 1)
            back = skip & match(jm, i)
        else:
            jm, skip, back = i, jnp.bool_(False), jnp.bool_(False)
        # accepted drafts: C_{i+1} (in order) or C_{i+2} (out of order) ...
        ch = ch.accept(
            jnp.where(nxt, cand[kc], cand[kc1]), jnp.where(nxt, ctok[kc], ctok[kc1]), nxt | skip
        )
        ch = ch.accept(cand[kc], ctok[kc], back)  # ... then C_{i+1}
        fail_m = skip & ~back  # m_{i+1}'s own step
        ch = ch.accept(p[jm], t[jm], fail_m & has[jm])
        fail_n = live & ~nxt & ~skip  # n_i's own step
        ch = ch.accept(p[i], t[i], fail_n & has[i])
        return ch.replace(
            node=jnp.where(nxt, i + 1, jnp.where(back, i + 2, i)),
            done=ch.done | fail_m | fail_n,
            stop=jnp.where(fail_m, jm, jnp.where(fail_n, i, ch.stop)),
        )

    zeros = jnp.zeros(N + 1, jnp.int32)
    start = Chain(
        node=jnp.int32(0),
        done=jnp.bool_(False),
        stop=jnp.int32(0),
        n_acc=jnp.int32(0),
        pos=zeros,
        tok=zeros,
    )
    return jax.lax.fori_loop(0, N + 1, advance, start)


def commit(
    canvas: Canvas, off: jax.Array, prompt_len: int, chain: Chain, steps: jax.Array
) -> Canvas:
    """Write the accepted steps (reference order: the ``n``-th gets step ``steps + n``).

    Args: off int32 ``(B,)`` the block's first generation index; chain: the batched
    :class:`Chain` (``n_acc`` already 0 for inactive rows); steps int32 ``(B,)``."""
    P, G = prompt_len, canvas.transfer_step.shape[1]
    G_ext = canvas.masked.shape[1]
    k = jnp.arange(chain.pos.shape[1])[None]
    ok = k < chain.n_acc[:, None]  # (B, k+1)
    g_pos = off[:, None] + chain.pos  # gen index
    oh = (jnp.arange(G_ext)[None, None] == g_pos[:, :, None]) & ok[:, :, None]  # (B, k+1, G_ext)
    hit = oh.any(1)
    tokv = jnp.sum(jnp.where(oh, chain.tok[:, :, None], 0), axis=1)
    stepv = jnp.sum(jnp.where(oh, steps[:, None, None] + k[:, :, None], 0), axis=1)
    gen_tokens = jnp.where(hit, tokv, canvas.tokens[:, P:])
    return Canvas(
        tokens=jnp.concatenate([canvas.tokens[:, :P], gen_tokens], axis=1),
        masked=canvas.masked & ~hit,
        transfer_step=jnp.where(hit[:, :G], stepv[:, :G], canvas.transfer_step),
    )


def next_drafts(
    drafts: Drafts,
    x0: jax.Array,
    conf: jax.Array,
    stop: jax.Array,
    off: jax.Array,
    active: jax.Array,
) -> Drafts:
    """Algorithm 1 line 14: the stop node's window predictions ``x0``/``conf`` ``(B, M, W)``
    become the drafts of active rows."""
    sel = lambda a: jnp.take_along_axis(a, stop[:, None, None], axis=1)[:, 0]
    upd = active[:, None]
    return Drafts(
        tokens=jnp.where(upd, put_window(drafts.tokens, sel(x0), off), drafts.tokens),
        confidence=jnp.where(upd, put_window(drafts.confidence, sel(conf), off), drafts.confidence),
    )


# ----------------------------------------------------------------------------- the loop


def step(loop: Loop, st: State) -> State:
    """One SSD iteration (Algorithm 1 lines 7-14): select, build the nodes, one batched
    forward, walk, commit, update the drafts."""
    d, P, W = loop.cfg.decode, loop.prompt_len, loop.window
    L, N = d.block_length, loop.cfg.draft_length
    block, active = current_block(loop, st)
    start = P + block * L
    off = start - P
    win = lambda a: block_window(a, off, W)
    cand, ctok, n_c = jax.vmap(lambda a, b_, c: select_row(a, b_, c, L, N))(
        win(st.drafts.tokens), win(st.drafts.confidence), win(st.canvas.masked)
    )
    root_only = st.cursor.fresh if loop.cached else jnp.all(n_c == 0)
    n_c = jnp.where(root_only | ~active, 0, n_c)
    toks, nmask = build_nodes(loop.inclusion, st.canvas, start, P, W, cand, ctok, n_c)
    rows, cache = loop.forwards(root_only, st.canvas.tokens, toks, st.cache, start)
    x0, conf, p, t, has = node_steps(loop, rows, nmask, st.counters.steps)
    chain = jax.vmap(
        lambda a, b_, c, e, f, g: walk_row(a, b_, c, e, f, g, N, loop.cfg.tree == "mix-order")
    )(cand, ctok, n_c, p, t, has)
    chain = chain.replace(n_acc=jnp.where(active, chain.n_acc, 0))
    canvas = commit(st.canvas, off, P, chain, st.counters.steps)
    drafts = next_drafts(st.drafts, x0, conf, chain.stop, off, active)
    counters = st.counters.add(
        active,
        chain.n_acc,
        chain.n_acc,
        n_c,
        loop.forwards.query_tokens(root_only, P + d.gen_length),
    )
    cursor = st.cursor
    if loop.cached:
        bfull = ~block_window(canvas.masked, off, L).any(-1)
        cursor = advance_blocks(cursor, active, bfull, chain.n_acc, d.num_blocks, True)
    return State(canvas=canvas, drafts=drafts, cursor=cursor, cache=cache, counters=counters)


def ssd_loop(
    params,
    prompt: jax.Array,
    pad: jax.Array,
    key: jax.Array,
    knobs: Knobs,
    *,
    model: DiffusionLM,
    cfg: SSDConfig,
    mask_id: int,
    eos_ids: tuple[int, ...] = (),
    mesh: Optional[Mesh] = None,
):
    """The jitted SSD loop (``cfg.decode`` structural, the numbers traced in ``knobs``).

    Args: prompt int32 ``(B, P)`` left-padded, pad int32 ``(B,)``, key the run's PRNG key.

    Returns: ``(tokens int32 (B, G), transfer_step int32 (B, G), Counters)``."""
    d = cfg.decode
    B, P = prompt.shape
    G, L, nb = d.gen_length, d.block_length, d.num_blocks
    cached = d.cache == "dual"
    W = L if cached else 2 * L  # draft / score window from the current block
    X = 0 if cached else L  # extension slots (never attended)
    S, S_ext = P + G, P + G + X
    forwards = NodeForwards(
        model, params, pad, Layout.of(pad, S, S_ext), cfg.num_nodes, L, W, cached, mesh
    )
    loop = Loop(
        cfg=cfg, rule=Rule(knobs, d, mask_id, eos_ids), key=key, prompt_len=P, forwards=forwards
    )
    st = State(
        canvas=Canvas.start(prompt, G, mask_id, X),
        drafts=Drafts(
            tokens=jnp.zeros((B, G + X), jnp.int32), confidence=jnp.full((B, G + X), -jnp.inf)
        ),
        cursor=BlockCursor.start(B),
        cache=BlockCache.start(model, B, S_ext, B, cached, params),
        counters=Counters.start(B, cfg.draft_length + 2, G),
    )
    more = (
        (lambda s: jnp.any(s.cursor.block < nb)) if cached else (lambda s: jnp.any(s.canvas.masked))
    )
    st = jax.lax.while_loop(more, lambda s: step(loop, s), st)
    return st.canvas.tokens[:, P:S], st.canvas.transfer_step, st.counters


_ssd_jit = jax.jit(ssd_loop, static_argnames=("model", "cfg", "mask_id", "eos_ids", "mesh"))


def ssd_generate(
    model: DiffusionLM,
    params,
    prompts: Sequence[Sequence[int]],
    cfg: SSDConfig,
    seed: int = 0,
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
    bucket: int = 16,
    max_context: Optional[int] = None,
    mesh: Optional[Mesh] = None,
) -> DiffusionResult:
    """Decode a batch with SSD (module docstring, Algorithm 1); lossless against
    ``diffusion_generate(model, params, prompts, cfg.decode, seed, ...)``.

    Args: as :func:`jaxspec.dllm.decode.diffusion_generate`, with ``cfg`` an :class:`SSDConfig`;
      ``mesh``: optional :func:`jaxspec.dllm.nodes.draft_mesh` to shard the verification
      batch over devices (``len(prompts) * cfg.num_nodes`` must divide by its size).

    Returns:
      :class:`~jaxspec.dllm.config.DiffusionResult`: ``full_tokens`` / ``transfer_step`` int32
      ``(B, G)``; ``stats.method`` is ``"ssd"``, ``target_nfe`` the batched verification
      forwards, ``steps`` the reference steps replayed (= gen length), ``accept_hist[b, j]``
      the iterations that accepted ``j`` tokens, ``draft_length`` ``k``, ``drafts_proposed``
      the candidates verified; ``extra`` has ``tree``, ``nodes``, ``cache``,
      ``forward_tokens`` and ``step_reduction`` (``1 - NFE / reference steps``).

    Raises:
      ValueError: as :func:`jaxspec.dllm.decode.diffusion_generate` (bad prompts, context, ids),
        or a mesh whose size does not divide the verification batch.
    """
    d = cfg.decode
    check_mesh(mesh, len(prompts), cfg.num_nodes)
    buf, pad, mask_id = prepare_batch(model, prompts, d, eos_ids, pad_id, bucket, max_context)
    statics = dict(
        model=model,
        cfg=dataclasses.replace(cfg, decode=structural(d)),
        mask_id=mask_id,
        eos_ids=eos_statics(d, eos_ids),
        mesh=mesh,
    )
    args = (
        decode_layout(params),
        *place_batch(params, buf, pad),
        jax.random.PRNGKey(seed),
        Knobs.of(d),
    )
    (toks, tstep, counters), compile_s, run_s = run_compiled(_ssd_jit, args, statics)
    c = jax.tree_util.tree_map(np.asarray, counters)
    return diffusion_result(
        np.asarray(toks),
        np.asarray(tstep),
        eos_ids,
        d,
        compile_s,
        run_s,
        method="ssd",
        reference="stepwise",
        target_nfe=c.nfe,
        steps=c.steps,
        accept_hist=c.accept_hist,
        draft_length=cfg.draft_length,
        drafts_proposed=c.proposed,
        forward_tokens=c.forward_tokens,
        steps_by_nfe=c.steps_by_nfe,
        extra={
            "tree": cfg.tree,
            "nodes": cfg.num_nodes,
            "step_reduction": float(1.0 - c.nfe.sum() / max(c.steps.sum(), 1)),
        },
    )


# ----------------------------------------------------------------------------- Sec. 5.1


def stepwise_topk(
    model: DiffusionLM,
    params,
    prompt: Sequence[int],
    decode: DiffusionDecodeConfig,
    top_k: int = 5,
    batch: int = 8,
    pad_id: int = 0,
):
    """Record a stepwise run for the acceptance-limit analysis (Sec. 5.1).

    Runs :func:`jaxspec.dllm.decode.diffusion_generate` (greedy, one token per step, no cache)
    on one prompt, rebuilds the state before every step from the transfer order, and re-runs
    the model on every state (``batch`` states per forward) to record the ``top_k`` tokens at
    every generation position.

    Returns:
      ``(pos int32 (G,), tok int32 (G,), topk int32 (G, G, top_k))``: the position and token
      transferred at step ``s``, and the top-k tokens (mask token excluded) at every position
      in the state before step ``s``.

    Raises:
      ValueError: ``decode`` is not greedy one-token-per-step stepwise without a cache.
    """
    if (
        decode.temperature != 0
        or decode.steps != decode.gen_length
        or decode.cache != "none"
        or decode.method != "stepwise"
    ):
        raise ValueError(
            "the acceptance-limit analysis records greedy one-token-per-step "
            "stepwise runs without a cache"
        )
    G = decode.gen_length
    res = diffusion_generate(model, params, [list(prompt)], decode, pad_id=pad_id)
    order = np.argsort(res.transfer_step[0])
    pos, tok = order.astype(np.int32), res.full_tokens[0][order]
    mask_id = model.config.mask_token_id if decode.mask_id is None else decode.mask_id
    n = len(prompt)
    states = np.full((G, n + G), mask_id, np.int32)
    states[:, :n] = prompt
    for s in range(1, G):
        states[s] = states[s - 1]
        states[s, n + pos[s - 1]] = tok[s - 1]
    posn = np.arange(n + G)[None]

    @jax.jit
    def top(x):
        lg = model.apply(params, x, np.broadcast_to(posn, x.shape))[0][:, n:]
        lg = lg.at[..., mask_id].set(-jnp.inf)
        return jax.lax.top_k(lg, top_k)[1]

    out = np.zeros((G, G, top_k), np.int32)
    for a in range(0, G, batch):
        chunk = states[a : a + batch]
        if len(chunk) < batch:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - len(chunk), 0)])
        out[a : a + batch] = np.asarray(top(jnp.asarray(chunk)))[: G - a]
    return pos, tok, out


def acceptance_limit(
    pos: np.ndarray, tok: np.ndarray, topk: np.ndarray, draft_length: int, k: int
) -> float:
    """Step reduction an ideal verifier could reach (Sec. 5.1, Table 2).

    Rounds start at a stepwise step ``s`` with the draft of the state before it (its top-``k``
    tokens per position). The round takes step ``s`` plus the following steps as long as each
    transferred token is among the draft's top-``k`` at its position, at most ``draft_length``
    of them (at most ``N + 1`` tokens per round, in any order); the next round starts after.

    Args: ``pos``, ``tok``, ``topk`` from :func:`stepwise_topk`.

    Returns: ``1 - rounds / steps`` (upper bound ``N / (N + 1)``).
    """
    G = len(pos)
    s = rounds = 0
    while s < G:
        rounds += 1
        m = 0
        while m < draft_length and s + 1 + m < G and tok[s + 1 + m] in topk[s, pos[s + 1 + m], :k]:
            m += 1
        s += m + 1
    return 1.0 - rounds / G


__all__ = [
    "SSDConfig",
    "TREES",
    "ssd_generate",
    "ssd_loop",
    "tree_inclusion",
    "select_row",
    "build_nodes",
    "node_steps",
    "walk_row",
    "commit",
    "next_drafts",
    "step",
    "Chain",
    "Drafts",
    "State",
    "Loop",
    "stepwise_topk",
    "acceptance_limit",
    "draft_mesh",
    "shard_params",
]
