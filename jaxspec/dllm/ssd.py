"""SSD: lossless self-speculative decoding for masked-diffusion LMs.

Source: "Self Speculative Decoding for Diffusion Large Language Models"
(``../shared/papers/ssd-self-speculative-decoding-dllm.txt``): Sec. 3.2 and Algorithm 1
(Appendix A), the mix-order tree of Sec. 5.2 and the acceptance-limit analysis of Sec. 5.1.

**Reference.** SSD is lossless against *stepwise* decoding with one token per step
(:func:`jaxspec.dllm.decode.diffusion_generate` with ``steps == gen_length``; same remasking rule,
temperature, top-k/top-p, seed and cache policy): it returns the same tokens, transferred in
the same order. Each reference step is :func:`jaxspec.dllm.decode.score_block` on the state's
current block (rank 0 is transferred) with the random numbers of that step
(:func:`jaxspec.dllm.decode.row_noise` keyed by row and step), so with temperature > 0 SSD
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
:class:`jax.sharding.Mesh` with a ``"draft"`` axis (:func:`draft_mesh`); XLA partitions the
forward (GSPMD). :func:`shard_params` additionally splits every weight matrix over the same
devices (last axis) for checkpoints too big for one device. The decoded tokens do not depend
on the mesh (tested with 4 fake CPU devices). On a TPU slice:
``ssd_generate(..., mesh=draft_mesh())`` and ``params = shard_params(params, mesh)``.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.dllm.decode import (DiffusionDecodeConfig, DiffusionResult, _structural, cut_after_eos,
                          prepare_batch, row_noise, score_block)
from jaxspec.core.runtime import run_compiled
from jaxspec.core.stats import DecodeStats
from models.diffusion.modeling import DiffusionLM, bidirectional_mask
from models.llama.modeling import KVCache, init_cache
from jax.sharding import Mesh, NamedSharding, PartitionSpec

TREES = ("chain", "mix-order")


@dataclasses.dataclass(frozen=True)
class SSDConfig:
    """SSD settings (frozen, hashable).

    Attributes:
      decode: the stepwise reference: ``steps == gen_length`` (one token per step), LLaDA
        schedule, a ranking remasking rule (not ``"origin"``), ``cache`` ``"none"`` or
        ``"dual"``, no CFG.
      draft_length: ``N``, candidates verified per iteration, ``1 <= N <= block_length``.
      tree: ``"chain"`` (greedy, ``N + 1`` nodes) or ``"mix-order"`` (``2N`` nodes).

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
            raise ValueError("SSD's reference is stepwise decoding with one token per step: "
                             f"need steps == gen_length ({d.gen_length}), the llada schedule and "
                             "no tokens_per_step / threshold")
        if d.remasking == "origin":
            raise ValueError("remasking 'origin' transfers a random number of tokens per step; "
                             "SSD needs one token per step")
        if d.cfg_scale > 0:
            raise ValueError("SSD does not support classifier-free guidance")
        if d.cache not in ("none", "dual"):
            raise ValueError(f"SSD supports cache 'none' or 'dual', not {d.cache!r}")
        if isinstance(self.draft_length, bool) or not isinstance(self.draft_length, int) \
                or not 1 <= self.draft_length <= d.block_length:
            raise ValueError(f"draft_length must be an int in [1, block_length={d.block_length}], "
                             f"got {self.draft_length!r}")
        if self.tree not in TREES:
            raise ValueError(f"unknown tree {self.tree!r}; expected one of {', '.join(TREES)}")

    @property
    def num_nodes(self) -> int:
        return self.draft_length + 1 if self.tree == "chain" else 2 * self.draft_length


def tree_inclusion(draft_length: int, tree: str) -> np.ndarray:
    """bool ``(M, N)``: ``inc[j, k]`` = node ``j`` holds candidate ``C_{k+1}``.

    Nodes ``0..N`` are the chain ``n_0..n_N``; with ``"mix-order"`` node ``N + i`` is
    ``m_i = n_{i-1} + {C_{i+1}}`` for ``i = 1..N-1`` (module docstring)."""
    N = draft_length
    inc = [[k < j for k in range(N)] for j in range(N + 1)]
    if tree == "mix-order":
        inc += [[k < i - 1 or k == i for k in range(N)] for i in range(1, N)]
    return np.array(inc, bool).reshape(-1, N)


@flax.struct.dataclass
class _State:
    tokens: jax.Array    # int32 (B, S_ext)
    masked: jax.Array    # bool (B, G_ext); the L extension slots are never masked
    tstep: jax.Array     # int32 (B, G)
    dtok: jax.Array      # int32 (B, G_ext) draft token per position
    dconf: jax.Array     # float32 (B, G_ext) draft confidence (-inf: no draft)
    steps: jax.Array     # int32 (B,) reference steps done (= tokens transferred)
    nfe: jax.Array       # int32 (B,) verification forwards while active
    hist: jax.Array      # int32 (B, N+2) iterations that accepted j tokens
    proposed: jax.Array  # int32 (B,) candidates sent to verification
    ftok: jax.Array      # int32 (B,) query tokens through the model
    block: jax.Array     # int32 (B,) dual cache: lockstep block; none: unused
    wait: jax.Array      # bool (B,) dual cache: this row's block is full, others' not
    fresh: jax.Array     # bool () dual cache: the block has not had its full forward
    cache: Optional[KVCache]
    prev: Optional[jax.Array]  # float32 (B, V) Dream + cache: raw logits at block_start - 1


def _select(dtok_w, dconf_w, mask_w, L: int, N: int):
    """Candidates of one row from its draft window (Sec. 3.2.2): current block by confidence,
    then the next block. Returns ``(idx (N,), tok (N,), n_c)`` (window indices)."""
    W = mask_w.shape[0]
    ok = mask_w & (dconf_w > -jnp.inf)
    half = jnp.where(ok, jnp.arange(W) // L, 2)
    c = jnp.where(ok, dconf_w, 0.0)
    idx = jnp.arange(W)
    hi, hj, ci, cj = half[:, None], half[None, :], c[:, None], c[None, :]
    before = (hj < hi) | ((hj == hi) & ((cj > ci) | ((cj == ci) & (idx[None, :] < idx[:, None]))))
    rank = jnp.sum(before, axis=-1)
    n_c = jnp.minimum(N, jnp.sum(ok))
    sel = rank[None, :] == jnp.arange(N)[:, None]                     # (N, W)
    cand = jnp.sum(jnp.where(sel, idx[None, :], 0), axis=-1).astype(jnp.int32)
    return cand, dtok_w[cand], n_c.astype(jnp.int32)


def _walk(cand, ctok, n_c, p, t, sv, N: int, mix: bool):
    """The verification walk of one row (module docstring, step 3).

    Args: candidates ``cand``/``ctok`` ``(N,)`` and their live count ``n_c``; every node's
    reference step ``p``/``t`` ``(M,)`` (window index, token) and whether it has one ``sv``.
    Returns ``(pos (N+1,), tok (N+1,), n_acc, stop_node)``: the accepted steps in order."""
    def match(j, k):
        kc = jnp.minimum(k, N - 1)
        return (k < n_c) & sv[j] & (p[j] == cand[kc]) & (t[j] == ctok[kc])

    def put(arrs, n, pos, tok, cond):
        apos, atok = arrs
        apos = jnp.where(cond, apos.at[n].set(pos), apos)
        atok = jnp.where(cond, atok.at[n].set(tok), atok)
        return (apos, atok), n + cond.astype(jnp.int32)

    def it(_, c):
        i, done, stop, n, arrs = c
        live = ~done
        kc, kc1 = jnp.minimum(i, N - 1), jnp.minimum(i + 1, N - 1)
        nxt = live & match(i, i)
        if mix:
            jm = jnp.minimum(N + i + 1, 2 * N - 1)
            skip = live & ~nxt & (i + 1 < N) & match(i, i + 1)
            back = skip & match(jm, i)
        else:
            jm, skip, back = i, jnp.bool_(False), jnp.bool_(False)
        # accepted drafts: C_{i+1} (in order) or C_{i+2} (out of order)
        arrs, n = put(arrs, n, jnp.where(nxt, cand[kc], cand[kc1]), jnp.where(nxt, ctok[kc], ctok[kc1]),
                      nxt | skip)
        arrs, n = put(arrs, n, cand[kc], ctok[kc], back)              # ... then C_{i+1}
        fail_m = skip & ~back                                          # m_{i+1}'s own step
        arrs, n = put(arrs, n, p[jm], t[jm], fail_m & sv[jm])
        fail_n = live & ~nxt & ~skip                                   # n_i's own step
        arrs, n = put(arrs, n, p[i], t[i], fail_n & sv[i])
        stop = jnp.where(fail_m, jm, jnp.where(fail_n, i, stop))
        done = done | fail_m | fail_n
        i = jnp.where(nxt, i + 1, jnp.where(back, i + 2, i))
        return i, done, stop, n, arrs

    init = (jnp.int32(0), jnp.bool_(False), jnp.int32(0), jnp.int32(0),
            (jnp.zeros(N + 1, jnp.int32), jnp.zeros(N + 1, jnp.int32)))
    i, done, stop, n, (apos, atok) = jax.lax.fori_loop(0, N + 1, it, init)
    return apos, atok, n, stop


def draft_mesh(n_devices: Optional[int] = None, devices=None) -> Mesh:
    """A 1-D mesh with axis ``"draft"`` over the first ``n_devices`` devices (default all).

    Raises: ValueError when fewer devices exist than asked for."""
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices) if n_devices is None else n_devices
    if not 1 <= n <= len(devices):
        raise ValueError(f"asked for {n} devices, {len(devices)} available")
    return Mesh(np.array(devices[:n]), ("draft",))


def shard_params(params, mesh: Mesh):
    """Place ``params`` on ``mesh``: every matrix (ndim >= 2) whose last axis divides by the
    device count is split along it; everything else is replicated. Returns the placed tree."""
    n = mesh.size

    def place(x):
        x = jnp.asarray(x)
        spec = (PartitionSpec(*([None] * (x.ndim - 1)), "draft")
                if x.ndim >= 2 and x.shape[-1] % n == 0 else PartitionSpec())
        return jax.device_put(x, NamedSharding(mesh, spec))
    return jax.tree_util.tree_map(place, params)


def node_forwards(model: DiffusionLM, params, pad: jax.Array, *, P: int, S: int, S_ext: int,
                  M: int, L: int, W: int, cached: bool, mesh: Optional[Mesh] = None):
    """The two verification forwards shared by SSD and Spiffy (one batched call each).

    Every node (a candidate state of the sequence) is one batch row, so a node attends only to
    itself: the block-diagonal attention of Spiffy's Fig. 2 / SSD's Eq. 5 with the node's
    block at the block's own position ids. Without a cache every node is a full sequence
    (the other blocks' hidden states are recomputed with the node's block, which is what
    ``p(. | X'; node)`` means under bidirectional attention); with the dual cache every node
    forwards only its block window against the block-start keys/values, tiled per node.

    Args:
      pad: int32 ``(B,)`` left padding; ``P`` padded prompt length, ``S = P + gen_length``,
      ``S_ext >= S`` slots (the extra ones are never attended), ``M`` nodes per row, ``L``
      block length, ``W`` scored window (rows ``start + [0, W)``), ``cached``: dual cache.
      mesh: optional draft mesh; the ``B * M`` node rows are sharded over it.

    Returns:
      ``(forward_root, forward_nodes)``. ``forward_root(tokens (B, S_ext), cache, prev,
      start (B,))`` forwards only the current state (with the cache: the block's full forward,
      refilling the cache and Dream's ``prev`` row); ``forward_nodes(toks (B, M, S_ext), cache,
      prev, start)`` forwards every node. Both return ``(rows float32 (B, M, W, V), cache,
      prev)``: the (Dream: shifted) logits scoring each node's window.
    """
    B = pad.shape[0]
    V = model.config.vocab_size
    shift = 1 if model.config.head == "dream" else 0
    slots = jnp.arange(S_ext, dtype=jnp.int32)[None]
    valid = (slots >= pad[:, None]) & (slots < S)                     # (B, S_ext)
    positions = jnp.maximum(slots - pad[:, None], 0)
    attn = bidirectional_mask(valid)                                  # (B, S_ext, S_ext)
    rep = lambda a: jnp.repeat(a, M, axis=0)                          # (B, ...) -> (B*M, ...)

    def shard(x, axis: int = 0):
        """Split the verification batch (axis ``axis``) over the mesh's draft axis."""
        if mesh is None:
            return x
        spec = PartitionSpec(*([None] * axis), "draft")
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    def forward_nodes(toks, cache, prev, start):
        if not cached:
            lg, _ = model.apply(params, shard(toks.reshape(B * M, S_ext)), shard(rep(positions)),
                                shard(rep(attn)), shift=False, rows=(shard(rep(start - shift)), W))
            return lg.reshape(B, M, W, V), cache, prev
        s0 = start[0]
        win = jax.lax.dynamic_slice_in_dim(toks, s0, L, 2).reshape(B * M, L)
        pos = rep(s0 + jnp.arange(L, dtype=jnp.int32)[None] - pad[:, None])
        mask = jnp.broadcast_to(rep(valid)[:, None, :], (B * M, L, S_ext))
        tiled = KVCache(k=shard(jnp.repeat(cache.k, M, axis=1), 1),
                        v=shard(jnp.repeat(cache.v, M, axis=1), 1))
        raw, _ = model.apply(params, shard(win), shard(pos), shard(mask), cache=tiled,
                             cache_index=jnp.full((B * M,), s0, jnp.int32), shift=False,
                             rows=(jnp.zeros((B * M,), jnp.int32), L))
        raw = raw.reshape(B, M, L, V)
        if shift:
            raw = jnp.concatenate([jnp.broadcast_to(prev[:, None, None], (B, M, 1, V)),
                                   raw[:, :, :L - 1]], axis=2)
        return raw, cache, prev

    def forward_root(tokens, cache, prev, start):
        if not cached:
            lg, _ = model.apply(params, tokens, positions, attn, shift=False,
                                rows=(start - shift, W))
            return jnp.broadcast_to(lg[:, None], (B, M, W, V)), cache, prev
        lg, cache = model.apply(params, tokens, positions, attn, cache=cache,
                                cache_index=jnp.zeros((B,), jnp.int32), shift=False,
                                rows=(start - shift, L))
        prev = lg[:, 0] if shift else prev
        return jnp.broadcast_to(lg[:, None], (B, M, L, V)), cache, prev

    return forward_root, forward_nodes


def _decode(params, prompt, pad, key, nums, *, model: DiffusionLM, cfg: SSDConfig, mask_id: int,
            eos_ids: tuple[int, ...] = (), mesh: Optional[Mesh] = None):
    """The jitted SSD loop. ``nums`` = float32 ``[temperature, alg_temp]`` (traced)."""
    temperature, alg_temp = nums[0], nums[1]
    d = cfg.decode
    N, M = cfg.draft_length, cfg.num_nodes
    B, P = prompt.shape
    G, L = d.gen_length, d.block_length
    nb = d.num_blocks
    V = model.config.vocab_size
    cached = d.cache == "dual"
    W = L if cached else 2 * L                  # draft / score window from the current block
    X = 0 if cached else L                      # extension slots (never attended)
    S, S_ext, G_ext = P + G, P + G + X, G + X
    shift = 1 if model.config.head == "dream" else 0
    sampled = d.temperature > 0
    inc = jnp.asarray(tree_inclusion(N, cfg.tree))                    # (M, N)
    depth = jnp.sum(inc, axis=1).astype(jnp.int32)                    # (M,)
    slots = jnp.arange(S_ext, dtype=jnp.int32)[None]
    forward_root, forward_nodes = node_forwards(model, params, pad, P=P, S=S, S_ext=S_ext, M=M,
                                                L=L, W=W, cached=cached, mesh=mesh)

    def node_tokens(st, start, cand, ctok, n_c):
        """(B, M, S_ext) node sequences and (B, M, W) their masked windows."""
        live = jnp.arange(N)[None] < n_c[:, None]                      # (B, N)
        at = (start[:, None] + cand)                                   # (B, N) absolute slots
        onehot = (slots[:, None, :] == at[:, :, None]) & live[:, :, None]    # (B, N, S_ext)
        fill = jnp.einsum("mn,bns->bms", inc.astype(jnp.int32), onehot.astype(jnp.int32)) > 0
        val = jnp.sum(jnp.where(onehot, ctok[:, :, None], 0), axis=1)  # (B, S_ext)
        toks = jnp.where(fill, val[:, None, :], st.tokens[:, None, :])
        off = start - P
        mwin = jax.vmap(lambda m, o: jax.lax.dynamic_slice_in_dim(m, o, W, 0))(st.masked, off)
        fwin = jax.vmap(lambda f, s: jax.lax.dynamic_slice_in_dim(f, s, W, 1))(fill, start)
        return toks, mwin[:, None, :] & ~fwin

    def body(st: _State) -> _State:
        if cached:
            block = jnp.minimum(st.block, nb - 1)
            active = (st.block < nb) & ~st.wait
        else:
            bm = st.masked[:, :G].reshape(B, nb, L).any(-1)
            block = jnp.argmax(bm, axis=-1).astype(jnp.int32)
            active = bm.any(-1)
        start = P + block * L
        off = start - P
        win = lambda a: jax.vmap(lambda r, o: jax.lax.dynamic_slice_in_dim(r, o, W, 0))(a, off)
        cand, ctok, n_c = jax.vmap(lambda a, b_, c: _select(a, b_, c, L, N))(
            win(st.dtok), win(st.dconf), win(st.masked))
        root_only = st.fresh if cached else jnp.all(n_c == 0)
        n_c = jnp.where(root_only | ~active, 0, n_c)
        toks, nmask = node_tokens(st, start, cand, ctok, n_c)
        rows, cache, prev = jax.lax.cond(
            root_only, lambda: forward_root(st.tokens, st.cache, st.prev, start),
            lambda: forward_nodes(toks, st.cache, st.prev, start))

        # every node's reference step (on its current block) and drafts (whole window)
        H = W // L
        u = jax.vmap(lambda b_, s: jax.vmap(
            lambda dd: row_noise(key, b_, s + dd, L, V, sampled))(depth))(jnp.arange(B), st.steps)
        u_tok, u_pos = u
        bm_h = nmask.reshape(B, M, H, L)
        x0, conf, rank = score_block(
            rows.reshape(B, M, H, L, V), bm_h,
            None if u_tok is None else jnp.broadcast_to(u_tok[:, :, None], (B, M, H, L, V)),
            jnp.broadcast_to(u_pos[:, :, None], (B, M, H, L)), d, mask_id, temperature,
            alg_temp, eos_ids)
        h = jnp.argmax(bm_h.any(-1), axis=-1)                          # (B, M) node's block half
        take = lambda a: jnp.take_along_axis(a, h[:, :, None, None], axis=2)[:, :, 0]
        r_h, x_h = take(rank), take(x0)                                # (B, M, L)
        sv = jnp.take_along_axis(bm_h.any(-1), h[:, :, None], axis=2)[:, :, 0]
        if cached:   # a node whose block is full has no step inside the block
            sv = sv & (h == 0)
        j = jnp.argmin(r_h, axis=-1).astype(jnp.int32)                 # rank 0 position
        p = h.astype(jnp.int32) * L + j                                # window index
        t = jnp.take_along_axis(x_h, j[:, :, None], axis=2)[:, :, 0]
        apos, atok, n_acc, stop = jax.vmap(
            lambda a, b_, c, e, f, g: _walk(a, b_, c, e, f, g, N, cfg.tree == "mix-order"))(
            cand, ctok, n_c, p, t, sv)
        n_acc = jnp.where(active, n_acc, 0)

        # commit the accepted steps (reference order) and take the stop node's drafts
        k = jnp.arange(N + 1)[None]
        ok = k < n_acc[:, None]                                         # (B, N+1)
        g_pos = off[:, None] + apos                                     # gen index
        oh = (jnp.arange(G_ext)[None, None] == g_pos[:, :, None]) & ok[:, :, None]   # (B, N+1, G_ext)
        hit = oh.any(1)
        tokv = jnp.sum(jnp.where(oh, atok[:, :, None], 0), axis=1)
        stepv = jnp.sum(jnp.where(oh, st.steps[:, None, None] + k[:, :, None], 0), axis=1)
        gen_tokens = jnp.where(hit, tokv, st.tokens[:, P:])
        tokens = jnp.concatenate([st.tokens[:, :P], gen_tokens], axis=1)
        masked = st.masked & ~hit
        tstep = jnp.where(hit[:, :G], stepv[:, :G], st.tstep)
        sel = lambda a: jnp.take_along_axis(a, stop[:, None, None, None], axis=1)[:, 0]
        dx = sel(x0).reshape(B, W)
        dc = sel(conf).reshape(B, W)
        put = lambda a, v: jax.vmap(lambda r, x_, o: jax.lax.dynamic_update_slice_in_dim(r, x_, o, 0))(a, v, off)
        upd = active[:, None]
        dtok = jnp.where(upd, put(st.dtok, dx), st.dtok)
        dconf = jnp.where(upd, put(st.dconf, dc), st.dconf)
        act = active.astype(jnp.int32)
        n_nodes = jnp.where(root_only, 1, M)
        width = S if not cached else jnp.where(root_only, S, L)
        new = dict(tokens=tokens, masked=masked, tstep=tstep, dtok=dtok, dconf=dconf,
                   steps=st.steps + n_acc, nfe=st.nfe + act,
                   hist=st.hist + act[:, None] * jax.nn.one_hot(n_acc, N + 2, dtype=jnp.int32),
                   proposed=st.proposed + n_c, ftok=st.ftok + act * n_nodes * width,
                   cache=cache, prev=prev)
        if cached:
            bfull = ~jax.vmap(lambda m, o: jax.lax.dynamic_slice_in_dim(m, o, L, 0))(masked, off).any(-1)
            done = st.wait | (active & bfull) | (st.block >= nb)
            adv = jnp.all(done)
            new.update(block=jnp.where(adv, st.block + 1, st.block), wait=done & ~adv,
                       fresh=adv)
        else:
            new.update(block=st.block, wait=st.wait, fresh=st.fresh)
        return _State(**new)

    def more(st):
        if cached:
            return jnp.any(st.block < nb)
        return jnp.any(st.masked)

    tokens = jnp.concatenate([prompt, jnp.full((B, G + X), mask_id, jnp.int32)], axis=1)
    masked = jnp.concatenate([jnp.ones((B, G), bool), jnp.zeros((B, X), bool)], axis=1)
    st = _State(tokens=tokens, masked=masked, tstep=jnp.full((B, G), -1, jnp.int32),
                dtok=jnp.zeros((B, G_ext), jnp.int32), dconf=jnp.full((B, G_ext), -jnp.inf),
                steps=jnp.zeros((B,), jnp.int32), nfe=jnp.zeros((B,), jnp.int32),
                hist=jnp.zeros((B, N + 2), jnp.int32), proposed=jnp.zeros((B,), jnp.int32),
                ftok=jnp.zeros((B,), jnp.int32), block=jnp.zeros((B,), jnp.int32),
                wait=jnp.zeros((B,), bool), fresh=jnp.bool_(True),
                cache=init_cache(model.config.base, B, S_ext) if cached else None,
                prev=jnp.zeros((B, V), jnp.float32) if cached and shift else None)
    st = jax.lax.while_loop(more, body, st)
    return st.tokens[:, P:S], st.tstep, st.steps, st.nfe, st.hist, st.proposed, st.ftok


_decode_jit = jax.jit(_decode, static_argnames=("model", "cfg", "mask_id", "eos_ids", "mesh"))


def ssd_generate(model: DiffusionLM, params, prompts: Sequence[Sequence[int]], cfg: SSDConfig,
                 seed: int = 0, eos_ids: Sequence[int] = (), pad_id: int = 0, bucket: int = 16,
                 max_context: Optional[int] = None, mesh: Optional[Mesh] = None) -> DiffusionResult:
    """Decode a batch with SSD (module docstring); lossless against
    ``diffusion_generate(model, params, prompts, cfg.decode, seed, ...)``.

    Args: as :func:`jaxspec.dllm.decode.diffusion_generate`, with ``cfg`` an :class:`SSDConfig`;
      ``mesh``: optional :func:`draft_mesh` to shard the verification batch over devices
      (``len(prompts) * cfg.num_nodes`` must divide by its size).

    Returns:
      :class:`jaxspec.dllm.decode.DiffusionResult`; ``stats.method`` is ``"ssd"``, ``target_nfe``
      the batched verification forwards, ``steps`` the reference steps replayed (= gen
      length), ``accept_hist[b, j]`` the iterations that accepted ``j`` tokens,
      ``draft_length`` ``N``, ``drafts_proposed`` the candidates verified; ``extra`` has
      ``tree``, ``nodes``, ``cache``, ``forward_tokens`` and ``step_reduction``
      (``1 - NFE / reference steps``).

    Raises:
      ValueError: as :func:`jaxspec.dllm.decode.diffusion_generate` (bad prompts, context, ids), or a
        mesh whose size does not divide the verification batch.
    """
    d = cfg.decode
    if mesh is not None and (len(prompts) * cfg.num_nodes) % mesh.size:
        raise ValueError(f"the verification batch ({len(prompts)} prompts x {cfg.num_nodes} "
                         f"nodes) does not divide over the mesh's {mesh.size} devices")
    buf, pad, mask_id = prepare_batch(model, prompts, d, eos_ids, pad_id, bucket, max_context)
    nums = jnp.asarray([d.temperature if d.temperature > 0 else 1.0,
                        d.alg_temp if d.alg_temp > 0 else 1.0], jnp.float32)
    scfg = dataclasses.replace(cfg, decode=_structural(d))
    uses_eos = d.logits_eos_inf or d.confidence_eos_eot_inf
    statics = dict(model=model, cfg=scfg, mask_id=mask_id,
                   eos_ids=tuple(sorted({int(e) for e in eos_ids})) if uses_eos else (), mesh=mesh)
    args = (params, jnp.asarray(buf), jnp.asarray(pad), jax.random.PRNGKey(seed), nums)
    out, compile_s, run_s = run_compiled(_decode_jit, args, statics)
    toks, tstep, steps, nfe, hist, proposed, ftok = (np.asarray(x) for x in out)
    rows = cut_after_eos(toks, eos_ids)
    stats = DecodeStats(
        method="ssd", reference="stepwise", target_nfe=nfe, draft_nfe=np.zeros_like(nfe),
        steps=steps, accept_hist=hist, new_tokens=np.array([len(r) for r in rows]),
        draft_length=cfg.draft_length, drafts_proposed=proposed,
        extra={"tree": cfg.tree, "nodes": cfg.num_nodes, "cache": d.cache,
               "remasking": d.remasking, "gen_length": d.gen_length,
               "block_length": d.block_length, "forward_tokens": int(ftok.sum()),
               "step_reduction": float(1.0 - nfe.sum() / max(steps.sum(), 1))})
    return DiffusionResult(tokens=rows, full_tokens=toks, transfer_step=tstep, stats=stats,
                           compile_s=compile_s, run_s=run_s)


def stepwise_topk(model: DiffusionLM, params, prompt: Sequence[int], decode: DiffusionDecodeConfig,
                  top_k: int = 5, batch: int = 8, pad_id: int = 0):
    """Record a stepwise run for the acceptance-limit analysis (Sec. 5.1).

    Runs :func:`jaxspec.dllm.decode.diffusion_generate` (greedy, one token per step, no cache) on one
    prompt, rebuilds the state before every step from the transfer order, and re-runs the
    model on every state (``batch`` states per forward) to record the ``top_k`` tokens at
    every generation position.

    Returns:
      ``(pos (G,), tok (G,), topk (G, G, top_k))``: the position and token transferred at step
      ``s``, and the top-k tokens (mask token excluded) at every position in the state before
      step ``s``.

    Raises:
      ValueError: ``decode`` is not greedy one-token-per-step stepwise without a cache.
    """
    if decode.temperature != 0 or decode.steps != decode.gen_length or decode.cache != "none" \
            or decode.method != "stepwise":
        raise ValueError("the acceptance-limit analysis records greedy one-token-per-step "
                         "stepwise runs without a cache")
    from jaxspec.dllm.decode import diffusion_generate

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
        chunk = states[a:a + batch]
        if len(chunk) < batch:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - len(chunk), 0)])
        out[a:a + batch] = np.asarray(top(jnp.asarray(chunk)))[:G - a]
    return pos, tok, out


def acceptance_limit(pos: np.ndarray, tok: np.ndarray, topk: np.ndarray, draft_length: int,
                     k: int) -> float:
    """Step reduction an ideal verifier could reach (Sec. 5.1, Table 2).

    Rounds start at a stepwise step ``s`` with the draft of the state before it (its top-``k``
    tokens per position). The round takes step ``s`` plus the following steps as long as each
    transferred token is among the draft's top-``k`` at its position, at most ``draft_length``
    of them (at most ``N + 1`` tokens per round, in any order); the next round starts after.

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


__all__ = ["SSDConfig", "TREES", "ssd_generate", "tree_inclusion", "stepwise_topk",
           "acceptance_limit", "draft_mesh", "shard_params"]
