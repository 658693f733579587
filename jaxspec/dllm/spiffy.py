"""Spiffy: lossless speculative decoding of masked-diffusion LMs with directed draft graphs.

Source: "Spiffy: Multiplying Diffusion LLM Acceleration via Lossless Speculative Decoding"
(``../shared/papers/spiffy-draft-graphs-dllm.txt``): draft blocks (Sec. 4.1), verification
(Sec. 4.2, Eqs. 2-3, Algorithm 1), draft graphs and drafting by (position rank, vocabulary
rank) (Sec. 4.3, Eqs. 6-13), calibration (Algorithm 2, Eq. 24, Appendix E), composition with
parallel decoding (Sec. 5.2, Table 2).

**Reference.** Spiffy is lossless against the reference decoder of :mod:`jaxspec.dllm.decode` with
the same :class:`~jaxspec.dllm.decode.DiffusionDecodeConfig`: stepwise (any steps per block, LLaDA or
Dream schedule), fixed-k (``tokens_per_step``) or Fast-dLLM ``threshold`` decoding -- the
unmasking rate ``S_t`` of the paper is whatever that rule transfers -- with any remasking
rule, temperature, top-k/top-p, ``alg_temp``, seed and cache policy ``"none"`` / ``"dual"``.
Every step Spiffy takes is :func:`jaxspec.dllm.decode.score_block` + :func:`jaxspec.dllm.decode.transfer_rule`
on the state the reference would be in, with that step's random numbers
(:func:`jaxspec.dllm.decode.row_noise`, keyed by row and step), so it returns the reference's tokens
*and* transfer order; sampled runs reproduce the reference's sample path for a seed.

**Draft formulas and graphs** (Sec. 4.3). A draft formula is a set of pairs ``(i, j)``,
1-based: "unmask the position of position rank ``i`` with its vocabulary-rank-``j`` token".
Position ranks order the block's still-masked positions by the top-1 probability of the
drafting distribution (Eqs. 10, 12; ties to the lower position), vocabulary ranks order tokens
by probability (Eqs. 11, 13). The distribution is the (mask-free, EOS-filtered,
temperature-scaled, top-k/top-p filtered) one the reference samples from. A graph is ``D``
formulas (:class:`DraftGraph`); formula ``A`` is a parent of ``B`` when ``B`` adds exactly
one pair to ``A`` (Eqs. 6-8 at the calibration rate ``S = 1``); size-1 formulas are children
of the current state. A node can have several parents.

**One iteration** (one model forward, Algorithm 1):

1. *Draft* (Sec. 4.3): the drafting distribution is the last one computed: that of the state
   the previous iteration's last step was taken from (one step stale; the current state's
   own distribution is what this forward computes). Each formula gives a draft block: the
   current block with the formula's tokens unmasked. A formula naming a position rank past
   the masked count gives no draft.
2. *Verify* (Sec. 4.2, Eqs. 2-3): the current state and the ``D`` drafts run in one batched
   forward; each draft is its own row, attending to the rest of the sequence ``X'`` and to
   itself, at the block's position ids (the block attention of Fig. 2).
3. *Walk* (Algorithm 1 steps 1-5): take the reference step on the current state (steps 1-4:
   ``X(t-1)``). If a draft block equals ``X(t-1)`` (same unmasked positions, same tokens), its
   distribution *is* ``p_TD(t-1)`` (Appendix A.1, Eqs. 19-23): take the next reference step from
   it and look again. Stop when no draft matches or the block is complete. So one forward
   gives ``1 + accepted`` reference steps.

Matching whole block states generalises Algorithm 1's ``t_m == t`` test to any ``S_t``: a
draft can only equal a state with as many unmasked tokens, so with ``tokens_per_step = 2`` a
graph calibrated at ``S = 1`` contributes through its even-sized formulas (Sec. 5.2 reuses the
``S = 1`` graphs this way). Drafts stay inside the current block; the first step of a block
has no drafting distribution for it and runs the current state alone (with the dual cache it
is the block's full forward anyway, as in Fast-dLLM). With the dual cache rows move through
blocks in lockstep, as in the reference.

NFE counts batched forwards; ``forward_tokens`` counts query tokens (nodes x tokens), which is
what the CPU time follows (Appendix B, Fig. 5: inference time grows with ``D``).

**Calibration** (Algorithm 2): :func:`record_calibration` runs the reference (Spiffy with an
empty graph) and records, for every step, the drafting ranks; :func:`calibration_counts` turns
the runs into ``count(w)`` of every look-ahead set ``w`` (Part 1-2); :func:`select_graph`
picks the size-``D`` subgraph that maximises degree-1 accumulation (Eq. 24), degree-0 (Eq. 26)
or total accumulation (Eqs. 27-28) (Part 3). ``python -m scripts.calibrate`` drives them.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Iterable, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.dllm.decode import (DiffusionDecodeConfig, DiffusionResult, _numeric_args, _rank, _structural,
                          cut_after_eos, prepare_batch, score_block, step_noise, transfer_rule,
                          transfer_schedule)
from jaxspec.core.runtime import run_compiled
from jaxspec.core.sampling import filter_top_k_top_p
from jaxspec.dllm.ssd import node_forwards
from jaxspec.core.stats import DecodeStats
from models.diffusion.modeling import DiffusionLM
from models.llama.modeling import KVCache, init_cache
from jax.sharding import Mesh

STRATEGIES = ("degree-1", "degree-0", "total")


class GraphError(ValueError):
    """A draft graph that does not parse or violates Eqs. 6-8."""


@dataclasses.dataclass(frozen=True)
class DraftGraph:
    """A directed draft graph: ``D`` draft formulas (frozen, hashable).

    Attributes:
      formulas: ``D`` formulas, each a sorted tuple of 1-based ``(position rank i, vocabulary
        rank j)`` pairs, with distinct ``i`` inside a formula.
      counts: optional calibration ``count(w)`` per formula (same order), for the picture.
      meta: free-form provenance (calibration settings) as sorted ``(key, value)`` pairs.

    Raises:
      GraphError: an empty formula, a pair that is not two positive ints, a repeated position
        rank inside a formula, a repeated formula, or a formula of size ``k > 1`` with no
        parent (a size ``k - 1`` subset) in the graph (Eqs. 6-8).
    """

    formulas: tuple
    counts: tuple = ()
    meta: tuple = ()

    def __post_init__(self):
        forms = []
        for f in self.formulas:
            pairs = []
            for pr in f:
                if (not isinstance(pr, (tuple, list)) or len(pr) != 2
                        or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1
                               for x in pr)):
                    raise GraphError(f"draft formula {list(f)}: every pair must be two positive "
                                     f"integers (i, j), got {pr!r}")
                pairs.append((int(pr[0]), int(pr[1])))
            if not pairs:
                raise GraphError("a draft formula is empty (it must unmask at least one token)")
            if len({i for i, _ in pairs}) != len(pairs):
                raise GraphError(f"draft formula {pairs}: a position rank i appears twice")
            forms.append(tuple(sorted(pairs)))
        if len(set(forms)) != len(forms):
            raise GraphError("the graph repeats a draft formula")
        have = set(forms)
        for f in forms:
            if len(f) > 1 and not any(tuple(p for p in f if p != q) in have for q in f):
                raise GraphError(f"draft formula {list(f)} (level {len(f)}) has no parent in the "
                                 f"graph: Eqs. 6-8 need a level-{len(f) - 1} formula that it "
                                 "extends by one pair")
        object.__setattr__(self, "formulas", tuple(forms))
        if self.counts and len(self.counts) != len(forms):
            raise GraphError(f"{len(self.counts)} counts for {len(forms)} formulas")
        object.__setattr__(self, "counts", tuple(int(c) for c in self.counts))
        object.__setattr__(self, "meta", tuple(sorted(dict(self.meta).items())))

    @property
    def size(self) -> int:
        """``D``, the number of draft blocks."""
        return len(self.formulas)

    @property
    def max_pairs(self) -> int:
        return max((len(f) for f in self.formulas), default=0)

    @property
    def max_vocab_rank(self) -> int:
        return max((j for f in self.formulas for _, j in f), default=1)

    def parents(self, q: int) -> list[int]:
        """Indices of the parents of formula ``q`` (Eqs. 6-8 at ``S = 1``)."""
        f = set(self.formulas[q])
        return [p for p, g in enumerate(self.formulas)
                if len(g) + 1 == len(f) and set(g) < f]

    def check_block(self, block_length: int) -> None:
        """Raises GraphError when a position rank exceeds ``block_length``."""
        bad = [f for f in self.formulas if max(i for i, _ in f) > block_length]
        if bad:
            raise GraphError(f"draft formula {list(bad[0])} names a position rank above the "
                             f"block length {block_length}")

    def to_json(self) -> dict:
        return {"D": self.size, "formulas": [[list(p) for p in f] for f in self.formulas],
                "counts": list(self.counts), "meta": dict(self.meta)}


def load_graph(path) -> DraftGraph:
    """Read a graph written by :func:`save_graph` (``{"formulas": [[[i, j], ...], ...]}``).

    Raises: GraphError naming the file when it is missing, not JSON, has no ``formulas`` list,
    has no formula, or violates Eqs. 6-8."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise GraphError(f"draft graph file {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GraphError(f"draft graph file {path} is not valid JSON: {e}") from None
    if not isinstance(d, dict) or not isinstance(d.get("formulas"), list):
        raise GraphError(f"draft graph file {path}: expected an object with a 'formulas' list")
    if not d["formulas"]:
        raise GraphError(f"draft graph file {path} has no draft formula")
    try:
        return DraftGraph(tuple(tuple(tuple(p) if isinstance(p, list) else p for p in f)
                                if isinstance(f, list) else f for f in d["formulas"]),
                          tuple(d.get("counts") or ()), tuple((d.get("meta") or {}).items()))
    except GraphError as e:
        raise GraphError(f"draft graph file {path}: {e}") from None
    except TypeError as e:
        raise GraphError(f"draft graph file {path}: malformed formulas ({e})") from None


def save_graph(graph: DraftGraph, path) -> None:
    Path(path).write_text(json.dumps(graph.to_json(), indent=1) + "\n")


@dataclasses.dataclass(frozen=True)
class SpiffyConfig:
    """Spiffy settings (frozen, hashable).

    Attributes:
      decode: the reference (:mod:`jaxspec.dllm.decode`): stepwise / fixed-k / threshold, cache
        ``"none"`` or ``"dual"``, no classifier-free guidance.
      graph: the :class:`DraftGraph` (``D = 0`` is the reference itself).

    Raises:
      ValueError: a cache other than none/dual, CFG, or a graph position rank above the block
        length (:class:`GraphError`).
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
        return self.graph.size + 1


def _formula_arrays(graph: DraftGraph):
    """int32 ``(D, K)`` 0-based position ranks and vocabulary ranks, bool ``(D, K)`` live."""
    D, K = graph.size, max(graph.max_pairs, 1)
    fi = np.zeros((max(D, 1), K), np.int32)
    fj = np.zeros((max(D, 1), K), np.int32)
    fv = np.zeros((max(D, 1), K), bool)
    for m, f in enumerate(graph.formulas):
        for k, (i, j) in enumerate(f):
            fi[m, k], fj[m, k], fv[m, k] = i - 1, j - 1, True
    return fi[:D], fj[:D], fv[:D]


def draft_ranks(blk: jax.Array, bmask: jax.Array, cfg: DiffusionDecodeConfig, mask_id: int,
                temperature, eos_ids: tuple[int, ...], J: int):
    """Position ranks (Eqs. 10, 12) and the top-``J`` tokens (Eqs. 11, 13) of a drafting
    distribution.

    Args:
      blk: float32 ``(..., L, V)`` logits scoring the block; bmask: bool ``(..., L)`` masked.
      cfg, mask_id, temperature, eos_ids: as :func:`jaxspec.dllm.decode.score_block` (the same
        distribution the reference samples from).
      J: vocabulary ranks kept.

    Returns: ``(rank int32 (..., L), top int32 (..., L, J))``: rank 0 is the masked position
    with the highest top-1 probability (unmasked positions rank after every masked one).
    """
    blk = blk.at[..., mask_id].set(-jnp.inf)
    if cfg.logits_eos_inf:
        blk = blk.at[..., list(eos_ids)].set(-jnp.inf)
    if cfg.temperature > 0:
        blk = blk / temperature
    if cfg.top_k > 0 or cfg.top_p < 1.0:
        blk = filter_top_k_top_p(blk, cfg.top_k, cfg.top_p)
    lp = jax.nn.log_softmax(blk, axis=-1)
    top_lp, top = jax.lax.top_k(lp, J)
    rank = _rank(jnp.where(bmask, top_lp[..., 0], -jnp.inf))
    return rank, top.astype(jnp.int32)


def draft_blocks(tok: jax.Array, msk: jax.Array, rank: jax.Array, top: jax.Array,
                 fi: np.ndarray, fj: np.ndarray, fv: np.ndarray):
    """The draft blocks of one state (Sec. 4.3): the block with each formula's ``c_ij``
    unmasked.

    Args:
      tok, msk: int32 / bool ``(B, L)`` the current block; rank, top: :func:`draft_ranks`
        of the drafting distribution; fi, fj, fv: :func:`_formula_arrays`.

    Returns: ``(tokens int32 (B, D, L), masked bool (B, D, L), ok bool (B, D))``: ``ok`` is
    False where a formula names a position rank at or past the masked count.
    """
    L = tok.shape[-1]
    n_masked = jnp.sum(msk, axis=-1)                                   # (B,)
    pos_of = jnp.argmax(rank[:, None, :] == jnp.arange(L)[None, :, None], axis=-1)  # (B, L)
    fi, fj, fv = jnp.asarray(fi), jnp.asarray(fj), jnp.asarray(fv)
    pos = pos_of[:, fi]                                                # (B, D, K)
    B, J = top.shape[0], top.shape[-1]
    flat = (pos * J + fj[None]).reshape(B, -1)                         # top[b, pos, j]
    val = jnp.take_along_axis(top.reshape(B, L * J), flat, axis=1).reshape(pos.shape)
    ok = jnp.all(~fv[None] | (fi[None] < n_masked[:, None, None]), axis=-1)      # (B, D)
    oh = (jnp.arange(L)[None, None, None] == pos[..., None]) & fv[None, :, :, None]  # (B, D, K, L)
    fill = oh.any(2)
    v = jnp.sum(jnp.where(oh, val[..., None], 0), axis=2)
    return jnp.where(fill, v, tok[:, None]), msk[:, None] & ~fill, ok


@flax.struct.dataclass
class _State:
    tokens: jax.Array    # int32 (B, S)
    masked: jax.Array    # bool (B, G)
    tstep: jax.Array     # int32 (B, G) the reference step that transferred the position
    block: jax.Array     # int32 (B,) current block (dual cache: lockstep)
    sib: jax.Array       # int32 (B,) reference step within the block
    steps: jax.Array     # int32 (B,) reference steps done
    nfe: jax.Array       # int32 (B,) forwards while active
    hist: jax.Array      # int32 (B, D+2) forwards that took j reference steps
    proposed: jax.Array  # int32 (B,) drafts verified
    ftok: jax.Array      # int32 (B,) query tokens through the model
    have: jax.Array      # bool (B,) a drafting distribution exists for the current block
    drank: jax.Array     # int32 (B, L) its position ranks
    dtop: jax.Array      # int32 (B, L, J) its top-J tokens
    wait: jax.Array      # bool (B,) dual cache: block full, others' not
    fresh: jax.Array     # bool () dual cache: the block has not had its full forward
    cache: Optional[KVCache]
    prev: Optional[jax.Array]
    rec_rank: Optional[jax.Array]  # int32 (B, G, L) calibration: drafting ranks before each step
    rec_top: Optional[jax.Array]   # int32 (B, G, L, J)
    rec_ok: Optional[jax.Array]    # bool (B, G)


def _decode(params, prompt, pad, key, nums, p_origin, *, model: DiffusionLM, cfg: SpiffyConfig,
            mask_id: int, eos_ids: tuple[int, ...] = (), mesh: Optional[Mesh] = None,
            record: int = 0):
    """The jitted Spiffy loop; ``nums``/``p_origin`` as :func:`jaxspec.dllm.decode._decode`.
    ``record > 0``: also record the drafting ranks (top-``record`` tokens) before every step."""
    temperature, threshold, k_fixed, alg_temp = nums[0], nums[2], nums[3], nums[4]
    d = cfg.decode
    D, M = cfg.graph.size, cfg.num_nodes
    J = max(cfg.graph.max_vocab_rank, record, 1)
    B, P = prompt.shape
    G, L = d.gen_length, d.block_length
    nb, spb = d.num_blocks, d.steps_per_block
    S, V = P + G, model.config.vocab_size
    cached = d.cache == "dual"
    sampled = d.temperature > 0
    sched = transfer_schedule(d)
    fi, fj, fv = _formula_arrays(cfg.graph)
    forward_root, forward_nodes = node_forwards(model, params, pad, P=P, S=S, S_ext=S, M=M, L=L,
                                                W=L, cached=cached, mesh=mesh)
    rows_b = jnp.arange(B)

    def window(a, off, n=L):
        return jax.vmap(lambda r, o: jax.lax.dynamic_slice_in_dim(r, o, n, 0))(a, off)

    def put(a, v, off):
        return jax.vmap(lambda r, x, o: jax.lax.dynamic_update_slice_in_dim(r, x, o, 0))(a, v, off)

    def ranks_of(blk, bmask):
        return draft_ranks(blk, bmask, d, mask_id, temperature, eos_ids, J)

    def body(st: _State) -> _State:
        active = (st.block < nb) & ~st.wait
        start = P + jnp.minimum(st.block, nb - 1) * L
        off = start - P
        tok0, msk0 = window(st.tokens, start), window(st.masked, off)
        if D:
            dtok, dmsk, dok = draft_blocks(tok0, msk0, st.drank, st.dtop, fi, fj, fv)
            dok = dok & (st.have & active)[:, None]
            ntok = jnp.concatenate([tok0[:, None], jnp.where(dok[..., None], dtok, tok0[:, None])], 1)
            nmsk = jnp.concatenate([msk0[:, None], jnp.where(dok[..., None], dmsk, msk0[:, None])], 1)
            nok = jnp.concatenate([jnp.ones((B, 1), bool), dok], 1)                 # (B, M)
        else:
            ntok, nmsk, nok = tok0[:, None], msk0[:, None], jnp.ones((B, 1), bool)
        root_only = st.fresh if cached else ~jnp.any(nok[:, 1:])
        nok = nok.at[:, 1:].set(nok[:, 1:] & ~root_only)
        seqs = jax.vmap(lambda r, w, s: jax.vmap(
            lambda x: jax.lax.dynamic_update_slice_in_dim(r, x, s, 0))(w))(st.tokens, ntok, start)
        rows, cache, prev = jax.lax.cond(
            root_only, lambda: forward_root(st.tokens, st.cache, st.prev, start),
            lambda: forward_nodes(seqs, st.cache, st.prev, start))

        # ---- the walk (Algorithm 1): reference steps from the current node, draft matching
        def walk(dd, c):
            cur, alive, wtok, wmsk, wts, n_st, n_acc, stop, pr, pt, pok, rr, rt, rk = c
            blk = rows[rows_b, cur]                                        # (B, L, V)
            u_tok, u_pos = step_noise(key, st.steps + dd, L, V, sampled)
            x0, conf, rank = score_block(blk, wmsk, u_tok, u_pos, d, mask_id, temperature,
                                         alg_temp, eos_ids)
            tr = transfer_rule(d, wmsk, conf, rank, u_pos, st.sib + dd, sched, p_origin,
                               k_fixed, threshold) & alive[:, None]
            ntk = jnp.where(tr, x0, wtok)
            nmk = wmsk & ~tr
            if record:   # drafting ranks in force before this step (Algorithm 2, Part 1)
                at = jnp.clip(st.steps + dd, 0, G - 1)
                rr = rr.at[rows_b, at].set(jnp.where(alive[:, None], pr, rr[rows_b, at]))
                rt = rt.at[rows_b, at].set(jnp.where(alive[:, None, None], pt, rt[rows_b, at]))
                rk = rk.at[rows_b, at].set(jnp.where(alive, pok, rk[rows_b, at]))
                pr, pt = ranks_of(blk, nmk)          # this node's: drafts the next step
                pok = jnp.ones_like(pok)
            nts = jnp.where(tr, (st.steps + dd)[:, None], wts)
            stop = jnp.where(alive, cur, stop)
            n_st = n_st + alive.astype(jnp.int32)
            if d.method == "stepwise":
                full = st.sib + dd + 1 >= spb
            else:
                full = ~jnp.any(nmk, axis=-1)
            eq = nok & jnp.all(ntok == ntk[:, None], -1) & jnp.all(nmsk == nmk[:, None], -1)
            eq = eq.at[:, 0].set(False)
            found = jnp.any(eq, axis=-1)
            go = alive & found & ~full
            cur = jnp.where(go, jnp.argmax(eq, axis=-1).astype(jnp.int32), cur)
            return (cur, go, ntk, nmk, nts, n_st, n_acc + go.astype(jnp.int32), stop,
                    pr, pt, pok, rr, rt, rk)

        zi = jnp.zeros((B,), jnp.int32)
        init = (zi, active, tok0, msk0, window(st.tstep, off), zi, zi, zi,
                st.drank, st.dtop, st.have,
                st.rec_rank if record else None, st.rec_top if record else None,
                st.rec_ok if record else None)
        (_, _, wtok, wmsk, wts, n_st, n_acc, stop, _, _, _, rr, rt, rk) = jax.lax.fori_loop(
            0, 1 if D == 0 else D + 1, walk, init)

        tokens = put(st.tokens, wtok, start)
        masked = put(st.masked, wmsk, off)
        tstep = put(st.tstep, wts, off)
        nrank, ntop = ranks_of(rows[rows_b, stop], wmsk)
        sib = st.sib + n_st
        block_done = (sib >= spb) if d.method == "stepwise" else ~jnp.any(wmsk, axis=-1)
        act = active.astype(jnp.int32)
        n_nodes = jnp.where(root_only, 1, M)
        width = S if not cached else jnp.where(root_only, S, L)
        new = dict(tokens=tokens, masked=masked, tstep=tstep, steps=st.steps + n_st,
                   nfe=st.nfe + act,
                   hist=st.hist + act[:, None] * jax.nn.one_hot(n_acc + 1, D + 2, dtype=jnp.int32),
                   proposed=st.proposed + jnp.where(root_only, 0, jnp.sum(nok[:, 1:], -1)) * act,
                   ftok=st.ftok + act * n_nodes * width,
                   have=active & ~block_done | (st.have & ~active),
                   drank=jnp.where(active[:, None], nrank, st.drank),
                   dtop=jnp.where(active[:, None, None], ntop, st.dtop),
                   cache=cache, prev=prev, rec_rank=rr, rec_top=rt, rec_ok=rk)
        if cached:
            done = st.wait | (active & block_done) | (st.block >= nb)
            adv = jnp.all(done)
            new.update(block=jnp.where(adv, st.block + 1, st.block),
                       sib=jnp.where(adv, 0, jnp.where(active, sib, st.sib)),
                       wait=done & ~adv, fresh=adv)
            new["have"] = new["have"] & ~adv
        else:
            new.update(block=jnp.where(active & block_done, st.block + 1, st.block),
                       sib=jnp.where(active & block_done, 0, jnp.where(active, sib, st.sib)),
                       wait=st.wait, fresh=st.fresh)
        return _State(**new)

    tokens = jnp.concatenate([prompt, jnp.full((B, G), mask_id, jnp.int32)], axis=1)
    st = _State(tokens=tokens, masked=jnp.ones((B, G), bool), tstep=jnp.full((B, G), -1, jnp.int32),
                block=jnp.zeros((B,), jnp.int32), sib=jnp.zeros((B,), jnp.int32),
                steps=jnp.zeros((B,), jnp.int32), nfe=jnp.zeros((B,), jnp.int32),
                hist=jnp.zeros((B, D + 2), jnp.int32), proposed=jnp.zeros((B,), jnp.int32),
                ftok=jnp.zeros((B,), jnp.int32), have=jnp.zeros((B,), bool),
                drank=jnp.zeros((B, L), jnp.int32), dtop=jnp.zeros((B, L, J), jnp.int32),
                wait=jnp.zeros((B,), bool), fresh=jnp.bool_(True),
                cache=init_cache(model.config.base, B, S) if cached else None,
                prev=(jnp.zeros((B, V), jnp.float32)
                      if cached and model.config.head == "dream" else None),
                rec_rank=jnp.zeros((B, G, L), jnp.int32) if record else None,
                rec_top=jnp.zeros((B, G, L, J), jnp.int32) if record else None,
                rec_ok=jnp.zeros((B, G), bool) if record else None)
    st = jax.lax.while_loop(lambda s: jnp.any(s.block < nb), body, st)
    out = (st.tokens[:, P:], st.tstep, st.steps, st.nfe, st.hist, st.proposed, st.ftok)
    if record:
        out = out + (st.rec_rank, st.rec_top[..., :record], st.rec_ok)
    return out


_decode_jit = jax.jit(_decode, static_argnames=("model", "cfg", "mask_id", "eos_ids", "mesh",
                                                "record"))


def _run(model, params, prompts, cfg: SpiffyConfig, seed, eos_ids, pad_id, bucket, max_context,
         mesh, record: int):
    d = cfg.decode
    if mesh is not None and (len(prompts) * cfg.num_nodes) % mesh.size:
        raise ValueError(f"the verification batch ({len(prompts)} prompts x {cfg.num_nodes} "
                         f"nodes) does not divide over the mesh's {mesh.size} devices")
    buf, pad, mask_id = prepare_batch(model, prompts, d, eos_ids, pad_id, bucket, max_context)
    nums, p_origin = _numeric_args(d)
    scfg = dataclasses.replace(cfg, decode=_structural(d),
                               graph=DraftGraph(cfg.graph.formulas))
    uses_eos = d.logits_eos_inf or d.confidence_eos_eot_inf
    statics = dict(model=model, cfg=scfg, mask_id=mask_id,
                   eos_ids=tuple(sorted({int(e) for e in eos_ids})) if uses_eos else (),
                   mesh=mesh, record=record)
    args = (params, jnp.asarray(buf), jnp.asarray(pad), jax.random.PRNGKey(seed), nums, p_origin)
    out, compile_s, run_s = run_compiled(_decode_jit, args, statics)
    return [np.asarray(x) for x in out], compile_s, run_s


def spiffy_generate(model: DiffusionLM, params, prompts: Sequence[Sequence[int]],
                    cfg: SpiffyConfig, seed: int = 0, eos_ids: Sequence[int] = (),
                    pad_id: int = 0, bucket: int = 16, max_context: Optional[int] = None,
                    mesh: Optional[Mesh] = None) -> DiffusionResult:
    """Decode a batch with Spiffy (module docstring); lossless against
    ``diffusion_generate(model, params, prompts, cfg.decode, seed, ...)``.

    Args: as :func:`jaxspec.dllm.decode.diffusion_generate`, with ``cfg`` a :class:`SpiffyConfig`;
      ``mesh``: optional :func:`jaxspec.dllm.ssd.draft_mesh` sharding the ``B * (D + 1)`` rows of
      each verification forward over devices (must divide).

    Returns:
      :class:`jaxspec.dllm.decode.DiffusionResult`; ``stats.method`` is ``"spiffy"``,
      ``target_nfe`` the batched forwards, ``steps`` the reference steps replayed (the
      reference's NFE), ``accept_hist[b, j]`` forwards that took ``j`` reference steps
      (``j - 1`` accepted drafts; the :class:`~jaxspec.core.stats.DecodeStats` convention),
      ``draft_length`` ``D``, ``drafts_proposed`` the draft blocks verified; ``extra`` has
      ``graph_D``, ``nodes``, ``unmasking`` (the reference rule), ``cache``,
      ``forward_tokens``, ``nfe_speedup`` (reference NFE / Spiffy NFE, Eq. 14) and
      ``step_reduction`` (``1 - NFE / reference NFE``).

    Raises:
      ValueError: as :func:`jaxspec.dllm.decode.diffusion_generate`, or a mesh that does not divide
        the verification batch.
    """
    d = cfg.decode
    out, compile_s, run_s = _run(model, params, prompts, cfg, seed, eos_ids, pad_id, bucket,
                                 max_context, mesh, 0)
    toks, tstep, steps, nfe, hist, proposed, ftok = out
    rows = cut_after_eos(toks, eos_ids)
    unmasking = {"stepwise": f"stepwise-{d.steps}", "fixed-k": f"fixed-{d.tokens_per_step}",
                 "threshold": f"threshold-{d.threshold}"}[d.method]
    stats = DecodeStats(
        method="spiffy", reference=d.method, target_nfe=nfe, draft_nfe=np.zeros_like(nfe),
        steps=steps, accept_hist=hist, new_tokens=np.array([len(r) for r in rows]),
        draft_length=cfg.graph.size, drafts_proposed=proposed,
        extra={"graph_D": cfg.graph.size, "nodes": cfg.num_nodes, "unmasking": unmasking,
               "cache": d.cache, "remasking": d.remasking, "gen_length": d.gen_length,
               "block_length": d.block_length, "forward_tokens": int(ftok.sum()),
               "nfe_speedup": float(steps.sum() / max(nfe.sum(), 1)),
               "step_reduction": float(1.0 - nfe.sum() / max(steps.sum(), 1))})
    return DiffusionResult(tokens=rows, full_tokens=toks, transfer_step=tstep, stats=stats,
                           compile_s=compile_s, run_s=run_s)


# ----------------------------------------------------------------------------- calibration

@dataclasses.dataclass
class CalibrationRecord:
    """One reference run, recorded for Algorithm 2 (Part 1).

    Attributes:
      transfer_step: int32 ``(B, G)`` the step that unmasked each position.
      tokens: int32 ``(B, G)`` the generated tokens.
      rank: int32 ``(B, G, L)`` before step ``s``: the position rank (0-based, Eq. 12) of every
        position of the step's block under the drafting distribution (the last one computed).
      top: int32 ``(B, G, L, J)`` its top-``J`` tokens per position (Eq. 13).
      ok: bool ``(B, G)`` step ``s`` had a drafting distribution (not a block's first step).
      block_length: ``L``.
    """

    transfer_step: np.ndarray
    tokens: np.ndarray
    rank: np.ndarray
    top: np.ndarray
    ok: np.ndarray
    block_length: int


def record_calibration(model: DiffusionLM, params, prompts: Sequence[Sequence[int]],
                       decode: DiffusionDecodeConfig, max_vocab_rank: int = 3, seed: int = 0,
                       eos_ids: Sequence[int] = (), pad_id: int = 0,
                       max_context: Optional[int] = None) -> CalibrationRecord:
    """Run the reference (Spiffy with an empty graph: the vanilla decoder) and record, before
    every step, the drafting ranks (Algorithm 2, Part 1).

    Raises: ValueError: no prompts, or as :func:`spiffy_generate`."""
    if not prompts:
        raise ValueError("the calibration set has no samples")
    cfg = SpiffyConfig(decode, DraftGraph(()))
    out, _, _ = _run(model, params, prompts, cfg, seed, eos_ids, pad_id, 16, max_context, None,
                     max_vocab_rank)
    toks, tstep, _, _, _, _, _, rank, top, ok = out
    return CalibrationRecord(tstep, toks, rank, top, ok, decode.block_length)


def calibration_counts(records: Iterable[CalibrationRecord], lookahead: int) -> list[Counter]:
    """``count(w)`` of every look-ahead set (Algorithm 2, Parts 1-2).

    For every recorded step ``s`` with a drafting distribution and every look-ahead
    ``k = 1..lookahead`` whose steps ``s .. s+k-1`` stay in ``s``'s block, the set ``w`` of
    ``(i, j)`` pairs (1-based, Eqs. 12-13, relative to the drafting distribution before step
    ``s``) of the tokens unmasked in those steps is counted at level ``k``. Sets with a token
    outside the recorded top-``J`` are not representable and are skipped.

    Returns: ``counts[k - 1]`` a Counter of frozensets at look-ahead ``k``.

    Raises: ValueError: no recorded step had a drafting distribution (no samples).
    """
    counts = [Counter() for _ in range(lookahead)]
    seen = 0
    for rec in records:
        L = rec.block_length
        for b in range(rec.tokens.shape[0]):
            ts = rec.transfer_step[b]
            order = {}
            for p in np.argsort(ts, kind="stable"):
                order.setdefault(int(ts[p]), []).append(int(p))
            for s, pos0 in order.items():
                if not rec.ok[b, s]:
                    continue
                seen += 1
                blk = pos0[0] // L
                pairs = set()
                for k in range(lookahead):
                    ps = order.get(s + k)
                    if ps is None or ps[0] // L != blk:
                        break
                    good = True
                    for p in ps:
                        hit = np.nonzero(rec.top[b, s, p % L] == rec.tokens[b, p])[0]
                        if not len(hit):
                            good = False
                            break
                        pairs.add((int(rec.rank[b, s, p % L]) + 1, int(hit[0]) + 1))
                    if not good:
                        break
                    counts[k][frozenset(pairs)] += 1
    if not seen:
        raise ValueError("the calibration set has no samples (no step with a drafting "
                         "distribution was recorded)")
    return counts


def candidate_graph(counts: Sequence[Counter], per_level: int = 3):
    """Part 2: the top-``per_level`` most frequent sets of every look-ahead level.

    Returns: ``(levels, count)``: ``levels[k]`` the chosen frozensets of level ``k + 1`` and
    ``count`` a dict set -> frequency."""
    levels, count = [], {}
    for c in counts:
        top = sorted(c.items(), key=lambda kv: (-kv[1], sorted(kv[0])))[:per_level]
        levels.append([w for w, _ in top])
        count.update(top)
    return levels, count


def select_graph(counts: Sequence[Counter], D: int, strategy: str = "degree-1",
                 per_level: int = 3, meta: Optional[dict] = None) -> DraftGraph:
    """Part 3: the size-``D`` subgraph of the candidate graph that satisfies Eqs. 6-8 and
    maximises the calibration score.

    ``strategy``: ``"degree-1"`` (Eq. 24: ``count(q) + sum of count(p)`` over ``q``'s parents
    in the subgraph), ``"degree-0"`` (Eq. 26) or ``"total"`` (Eqs. 27-28, recursive). A valid
    subgraph takes, level by level, a non-empty subset of each level's candidates in which
    every member has a parent among the previous level's chosen ones. Exhaustive search over
    those subsets (at most 7 per level with 3 candidates); ties keep the first found.

    Raises: ValueError: unknown strategy, ``D < 1``, or fewer than ``D`` reachable candidates.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown calibration strategy {strategy!r}; expected one of "
                         f"{', '.join(STRATEGIES)}")
    if D < 1:
        raise ValueError(f"D must be >= 1, got {D}")
    levels, count = candidate_graph(counts, per_level)
    best = [-1.0, None]

    def subsets(cands):
        n = len(cands)
        for mask in range(1, 1 << n):
            yield [cands[t] for t in range(n) if mask >> t & 1]

    def rec(k, prev, prev_tot, chosen, score, left):
        if left == 0:
            if score > best[0]:
                best[0], best[1] = score, list(chosen)
            return
        if k >= len(levels):
            return
        for sub in subsets(levels[k]):
            if len(sub) > left:
                continue
            tot, sc, ok = {}, 0.0, True
            for q in sub:
                par = [p for p in prev if len(p) + 1 == len(q) and p < q] if k else []
                if k and not par:
                    ok = False
                    break
                if strategy == "degree-0":
                    tot[q] = count[q]
                elif strategy == "degree-1":
                    tot[q] = count[q] + sum(count[p] for p in par)
                else:
                    tot[q] = count[q] + sum(prev_tot[p] for p in par)
                sc += tot[q]
            if ok:
                rec(k + 1, sub, tot, chosen + sub, score + sc, left - len(sub))

    rec(0, [], {}, [], 0.0, D)
    if best[1] is None:
        n = sum(len(v) for v in levels)
        raise ValueError(f"only {n} candidate draft formulas were found; cannot pick D={D} "
                         "(record more calibration samples or a longer look-ahead)")
    chosen = best[1]
    forms = tuple(tuple(sorted(w)) for w in chosen)
    info = dict(meta or {}, strategy=strategy, score=best[0])
    return DraftGraph(forms, tuple(count[w] for w in chosen), tuple(info.items()))


def plot_graph(graph: DraftGraph, path, title: str = "") -> None:
    """Draw the graph (levels left to right, parent -> child edges, ``count`` per node) as a
    PNG (the style of the paper's Fig. 4)."""
    from jaxspec.core.plotting import pyplot

    plt = pyplot()

    by_level: dict = {}
    for q, f in enumerate(graph.formulas):
        by_level.setdefault(len(f), []).append(q)
    n_lv = max(by_level) if by_level else 1
    height = max(len(v) for v in by_level.values()) if by_level else 1
    fig, ax = plt.subplots(figsize=(2.3 * (n_lv + 1), 1.2 * height + 1.2))
    xy = {-1: (0.0, 0.0)}
    for lv, qs in by_level.items():
        for r, q in enumerate(qs):
            xy[q] = (float(lv), (len(qs) - 1) / 2.0 - r)
    for q, f in enumerate(graph.formulas):
        pars = graph.parents(q) if len(f) > 1 else [-1]
        for p in pars:
            ax.annotate("", xy=xy[q], xytext=xy[p],
                        arrowprops=dict(arrowstyle="->", color="0.5", shrinkA=22, shrinkB=22))
    ax.text(*xy[-1], "X(t)", ha="center", va="center",
            bbox=dict(boxstyle="round", fc="0.85", ec="0.3"))
    for q, f in enumerate(graph.formulas):
        label = "\n".join(f"c{i},{j}" for i, j in f)
        if graph.counts:
            label += f"\n[{graph.counts[q]}]"
        ax.text(*xy[q], label, ha="center", va="center", fontsize=7,
                bbox=dict(boxstyle="round", fc="#dbe9f6", ec="#2b6ca3"))
    ax.set_xlim(-0.6, n_lv + 0.6)
    ax.set_ylim(-height / 2.0 - 0.6, height / 2.0 + 0.6)
    ax.set_xticks(range(n_lv + 1))
    ax.set_xticklabels(["state"] + [f"level {k}" for k in range(1, n_lv + 1)])
    ax.set_yticks([])
    for s in ("top", "right", "left"):
        ax.spines[s].set_visible(False)
    ax.set_title(title or f"Spiffy draft graph, D = {graph.size} (c_i,j; [count])")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["DraftGraph", "GraphError", "SpiffyConfig", "spiffy_generate", "load_graph",
           "save_graph", "draft_ranks", "draft_blocks", "record_calibration",
           "CalibrationRecord", "calibration_counts", "candidate_graph", "select_graph",
           "plot_graph", "STRATEGIES"]
