"""XLNet with two-stream relative attention, as a pure-functional JAX model (AS-ARM body).

An any-subset autoregressive model (AS-ARM; Guo & Ermon, "Reviving Any-Subset Autoregressive
Models ... Any-Subset Speculative Decoding", arXiv:2504.20456,
Sec. 4 and Appendix D) needs two things from one network: parallel prediction of any set of
masked positions from the visible tokens (Fig. 1a) and the density of a whole sequence under
a permuted-causal order in one pass (Fig. 1b, Eq. 6). XLNet (Yang et al. 2019) provides both
with two streams per layer that share all weights:

* the **content stream** ``h``: starts from the word embedding of each token; position ``i``
  attends to the content keys allowed by ``content_mask`` (normally including itself);
* the **query stream** ``g``: starts from the learned ``mask_emb`` vector at every query slot
  (it knows *where*, never *what*); slot ``p`` (at position ``query_pos[p]``) attends to the
  content keys allowed by ``query_mask``. A query must not see its own position's content,
  otherwise it could read the token it predicts (paper Appendix D).

Attention logits follow Transformer-XL / XLNet: ``score = (ac + bd + ef) / sqrt(d_head)`` with
``ac = (q + r_w_bias) . k`` (content), ``bd = (q + r_r_bias) . (R(i - j) W_r)`` (relative
position; ``R(d) = [sin(d f), cos(d f)]``, ``f_k = 10000^(-2k / d_model)``, distance clamped to
``clamp_len`` when that is positive) and ``ef = (q + r_s_bias) . seg_embed[s_ij]`` with
``s_ij = 1`` iff positions ``i`` and ``j`` lie in different segments (0 when no segment ids are
given). Each sub-layer is post-LayerNorm: ``LN(x + Attn(x))`` then ``LN(y + W2 gelu(W1 y + b1) +
b2)``. The LM head is tied to the word embedding plus a bias: ``logits = g E^T + b``. These
facts (tensor names and shapes, formulas) come from transformers ``modeling_xlnet.py``; the
code here is written from them, not copied.

Masks are explicit booleans (True = may attend), which covers ``perm_mask`` /
``target_mapping`` of transformers and any order or query set:

* ``content_mask (B, T, K)``: content row ``t`` may attend key slot ``k``;
* ``query_mask (B, P, K)``: query slot ``p`` may attend key slot ``k``.

A row that may attend nothing gets a zero attention vector (no information leaks through a
uniform average). :func:`parallel_masks` and :func:`density_masks` build the two masks of the
paper's Fig. 1 from a visible set and an order.

Parameter tree (float32 leaves, layer weights stacked on a leading axis ``L``)::

    word_embedding (V, D)   mask_emb (D,)   lm_bias (V,)
    layers/ q, k, v, o, r (L, D, H, Dh); r_w_bias, r_r_bias, r_s_bias (L, H, Dh);
            seg_embed (L, 2, H, Dh); attn_ln_scale, attn_ln_bias (L, D);
            ff_w1 (L, D, F), ff_b1 (L, F), ff_w2 (L, F, D), ff_b2 (L, D);
            ff_ln_scale, ff_ln_bias (L, D)

KV cache (paper Appendix F.4): :class:`XLNetCache` holds each layer's content-stream keys and
values with **slot = position**. A cached call writes the content of its ``T`` new tokens at
their positions, then both streams attend over all slots. This is exact whenever the cached
tokens' content rows would attend to the same keys if recomputed, i.e. the visible prompt
attends only to itself and every later token only to tokens before it in the order (the
density mask of Fig. 1b, grown token by token).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from models.llama.params import WeightFileError

_NEG = -1e30


# --------------------------------------------------------------------------- config
@dataclasses.dataclass(frozen=True)
class XLNetConfig:
    """Architecture of an XLNet LM (names as in transformers' ``XLNetConfig``).

    Attributes:
      vocab_size: V. d_model: D. n_layer: L. n_head: H. d_head: Dh (default ``D // H``).
      d_inner: F, the feed-forward width. layer_norm_eps: LayerNorm epsilon.
      clamp_len: relative distances are clamped to ``[-clamp_len, clamp_len]`` when > 0.
      ff_activation: ``"gelu"`` (exact erf form) or ``"relu"``.

    Raises:
      ValueError: a non-positive size, ``D`` not divisible by ``H``, unknown activation.
    """

    vocab_size: int
    d_model: int = 256
    n_layer: int = 6
    n_head: int = 4
    d_head: Optional[int] = None
    d_inner: int = 1024
    layer_norm_eps: float = 1e-12
    clamp_len: int = -1
    ff_activation: str = "gelu"

    def __post_init__(self):
        for k in ("vocab_size", "d_model", "n_layer", "n_head", "d_inner"):
            if int(getattr(self, k)) <= 0:
                raise ValueError(f"XLNetConfig.{k} must be positive, got {getattr(self, k)}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_head {self.n_head}")
        if self.d_head is None:
            object.__setattr__(self, "d_head", self.d_model // self.n_head)
        if self.ff_activation not in ("gelu", "relu"):
            raise ValueError(
                f"unsupported ff_activation {self.ff_activation!r}; expected gelu or relu"
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def init_params(config: XLNetConfig, seed: int = 0, std: float = 0.02) -> dict:
    """Random parameters (normal(0, ``std``) for matrices, biases and ``mask_emb``; LayerNorm
    scales 1, offsets 0; ``lm_bias`` 0), float32, in the layout of the module docstring."""
    c = config
    L, D, H, Dh, F, V = c.n_layer, c.d_model, c.n_head, c.d_head, c.d_inner, c.vocab_size
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 16))
    n = lambda shape: std * jax.random.normal(next(keys), shape, jnp.float32)
    layers = {name: n((L, D, H, Dh)) for name in ("q", "k", "v", "o", "r")}
    layers.update({name: n((L, H, Dh)) for name in ("r_w_bias", "r_r_bias", "r_s_bias")})
    layers["seg_embed"] = n((L, 2, H, Dh))
    layers.update(
        attn_ln_scale=jnp.ones((L, D)),
        attn_ln_bias=jnp.zeros((L, D)),
        ff_w1=n((L, D, F)),
        ff_b1=jnp.zeros((L, F)),
        ff_w2=n((L, F, D)),
        ff_b2=jnp.zeros((L, D)),
        ff_ln_scale=jnp.ones((L, D)),
        ff_ln_bias=jnp.zeros((L, D)),
    )
    return {
        "word_embedding": n((V, D)),
        "mask_emb": n((D,)),
        "lm_bias": jnp.zeros((V,)),
        "layers": layers,
    }


# --------------------------------------------------------------------------- masks
def order_to_rank(sigma: jax.Array) -> jax.Array:
    """Inverse permutation: ``rank[b, sigma[b, i]] = i``.

    Args:
      sigma: ``int (B, N)``; ``sigma[b, i]`` is the position decoded ``i``-th (paper Sec. 2).
    Returns:
      ``int32 (B, N)`` rank of every position in the order.
    """
    sigma = jnp.asarray(sigma, jnp.int32)
    B, N = sigma.shape
    return (
        jnp.zeros((B, N), jnp.int32)
        .at[jnp.arange(B)[:, None], sigma]
        .set(jnp.broadcast_to(jnp.arange(N, dtype=jnp.int32), (B, N)))
    )


def parallel_masks(visible: jax.Array):
    """Parallel-sampling masks (paper Fig. 1a): every position is conditioned on the visible
    tokens only, so all masked positions are predicted independently in one pass.

    Args:
      visible: ``bool (B, N)``; True for the prompt ``x_sigma(<m)``.
    Returns:
      ``(content_mask, query_mask)``, both ``bool (B, N, N)``: row ``i`` may attend column ``j``
      iff ``visible[j]``; the content mask adds the diagonal, the query mask removes it.
    """
    visible = jnp.asarray(visible, bool)
    N = visible.shape[-1]
    eye = jnp.eye(N, dtype=bool)[None]
    allowed = jnp.broadcast_to(visible[:, None, :], visible.shape[:1] + (N, N))
    return allowed | eye, allowed & ~eye


def density_masks(visible: jax.Array, order: Optional[jax.Array] = None):
    """Density-estimation masks (paper Fig. 1b, Eq. 6 with the lattice order of Eq. 4):
    the visible prompt attends to itself bidirectionally; each masked position is conditioned
    on the prompt plus the masked positions before it in ``order``.

    Args:
      visible: ``bool (B, N)`` prompt positions.
      order: ``int (B, N)`` rank of each position among the masked ones (only its order on
        masked positions matters); default the position itself, i.e. masked positions are
        processed left to right (Eq. 4, the AS-ARM convention). Use :func:`order_to_rank` to
        turn a decoding order ``sigma`` into ranks.
    Returns:
      ``(content_mask, query_mask)``, ``bool (B, N, N)``. For a masked row ``i``:
      ``allowed[i, j] = visible[j] | (~visible[j] & order[j] < order[i])``; for a visible row:
      ``allowed[i, j] = visible[j]``. Content adds the diagonal, query removes it. With these
      masks, query row ``sigma(i)`` (``i >= m``) gives ``p(x_sigma(i) | x_sigma(<i))``.
    """
    visible = jnp.asarray(visible, bool)
    B, N = visible.shape
    if order is None:
        order = jnp.broadcast_to(jnp.arange(N, dtype=jnp.int32), (B, N))
    order = jnp.asarray(order, jnp.int32)
    earlier = order[:, None, :] < order[:, :, None]  # [b, i, j]: j before i
    vis_j = visible[:, None, :]
    allowed = jnp.where(visible[:, :, None], vis_j, vis_j | earlier)
    eye = jnp.eye(N, dtype=bool)[None]
    return allowed | eye, allowed & ~eye


# --------------------------------------------------------------------------- cache
@flax.struct.dataclass
class XLNetCache:
    """Content-stream keys/values of every layer, slot = position (Appendix F.4).

    Attributes:
      k, v: float32 ``(L, B, N, H, Dh)``. Slots never written hold zeros; the caller's masks
        must hide them (and any stale slot).
    """

    k: jax.Array
    v: jax.Array

    @property
    def size(self) -> int:
        return self.k.shape[2]


def init_cache(config: XLNetConfig, batch: int, size: int, dtype=jnp.float32) -> XLNetCache:
    """Zero cache of ``size`` positions: ``k``, ``v`` of shape ``(L, batch, size, H, Dh)``."""
    shape = (config.n_layer, batch, size, config.n_head, config.d_head)
    return XLNetCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))


# --------------------------------------------------------------------------- forward
def _layer_norm(x, scale, bias, eps):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * scale + bias


def _rel_table(K: int, d_model: int, clamp_len: int) -> jax.Array:
    """Sinusoids ``(2K, D)``; row ``p`` encodes relative distance ``K - p`` (query minus key)."""
    rel = (K - jnp.arange(2 * K)).astype(jnp.float32)
    if clamp_len > 0:
        rel = jnp.clip(rel, -clamp_len, clamp_len)
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, d_model, 2, dtype=jnp.float32) / d_model))
    ang = rel[:, None] * inv_freq[None, :]
    return jnp.concatenate([jnp.sin(ang), jnp.cos(ang)], axis=-1)


def _shift(full: jax.Array) -> jax.Array:
    """``full (..., S, 2S)`` indexed by table row ``p`` (distance ``S - p``) -> ``(..., S, S)``
    with ``out[i, j] = full[i, S - i + j]`` (distance ``i - j``), by one reshape: the flat index
    ``i * 2S + S - i + j`` equals ``S + i * (2S - 1) + j``."""
    *lead, S, S2 = full.shape
    flat = full.reshape(*lead, S * S2)[..., S : S + S * (S2 - 1)]
    return flat.reshape(*lead, S, S2 - 1)[..., :S]


def _attend(q, keys, vals, kr, lp, rel_idx, seg_diff, mask, scale):
    """One two-stream attention read. ``q (B, P, H, Dh)`` query heads, ``keys``/``vals``
    ``(B, K, H, Dh)``, ``kr (2K, H, Dh)`` relative-position keys, ``rel_idx (B, P, K)`` table
    rows (None: fast path, positions ``arange`` and ``P == K``), ``seg_diff bool (B, P, K)`` or
    None, ``mask bool (B, P, K)``. Returns the attention vectors ``(B, P, H, Dh)``."""
    ac = jnp.einsum("bpnd,bknd->bnpk", q + lp["r_w_bias"], keys)
    full = jnp.einsum("bpnd,rnd->bnpr", q + lp["r_r_bias"], kr)
    if rel_idx is None:
        bd = _shift(full)
    else:
        bd = jnp.take_along_axis(full, rel_idx[:, None], axis=-1)
    score = ac + bd
    if seg_diff is not None:
        e = jnp.einsum("bpnd,snd->bnps", q + lp["r_s_bias"], lp["seg_embed"])
        score = score + jnp.where(seg_diff[:, None], e[..., 1:2], e[..., 0:1])
    score = jnp.where(mask[:, None], score * scale, _NEG)
    prob = jax.nn.softmax(score, axis=-1)
    prob = prob * jnp.any(mask, axis=-1)[:, None, :, None].astype(prob.dtype)
    return jnp.einsum("bnpk,bknd->bpnd", prob, vals)


def _post(x, vec, lp, config):
    """Output projection + residual + LayerNorm, then the feed-forward sub-layer."""
    eps = config.layer_norm_eps
    y = _layer_norm(
        x + jnp.einsum("bpnd,hnd->bph", vec, lp["o"]), lp["attn_ln_scale"], lp["attn_ln_bias"], eps
    )
    f = y @ lp["ff_w1"] + lp["ff_b1"]
    f = jax.nn.gelu(f, approximate=False) if config.ff_activation == "gelu" else jax.nn.relu(f)
    return _layer_norm(y + f @ lp["ff_w2"] + lp["ff_b2"], lp["ff_ln_scale"], lp["ff_ln_bias"], eps)


@dataclasses.dataclass(frozen=True)
class XLNetLM:
    """XLNet LM head model (two-stream relative attention). Hashable, so ``jax.jit(model.apply,
    static_argnames=...)`` works; parameters live outside (:func:`init_params`,
    :func:`load_hf_xlnet`)."""

    config: XLNetConfig

    def apply(
        self,
        params,
        tokens,
        content_mask,
        query_mask=None,
        *,
        content_pos=None,
        query_pos=None,
        segment_ids=None,
        cache: Optional[XLNetCache] = None,
        content_logits: bool = False,
    ):
        """One forward pass of both streams.

        Args:
          params: the parameter tree (module docstring), float leaves (cast to float32).
          tokens: ``int32 (B, T)`` token ids of the content rows (ids at positions nobody
            attends to are irrelevant).
          content_mask: ``bool (B, T, K)``; content row ``t`` may attend key slot ``k``.
            Without a cache the key slots are the ``T`` content rows themselves (``K = T``);
            with a cache they are the cache's ``N`` positions (``K = N``, slot = position).
          query_mask: ``bool (B, P, K)`` for ``P`` query slots, or None (no query stream).
          content_pos: ``int32 (B, T)`` positions of the content rows; default ``arange(T)``;
            required with a cache (where the new content is written). Positions lie in
            ``[0, K)``.
          query_pos: ``int32 (B, P)`` positions of the query slots; default ``arange(P)``.
          segment_ids: optional ``int (B, T)`` segment of every content row (no cache); the
            segment term is skipped when None (as in transformers without token_type_ids).
          cache: optional :class:`XLNetCache`; the new rows' keys/values are written at
            ``content_pos`` in every layer before attention.
          content_logits: also return the content stream's logits.

        Returns:
          ``(logits, cache)``: ``logits`` is float32 ``(B, P, V)`` from the query stream when
          ``query_mask`` is given, else ``(B, T, V)`` from the content stream; with
          ``content_logits=True`` and a query stream it is the pair
          ``(query_logits (B, P, V), content_logits (B, T, V))``. ``cache`` is the updated
          cache or None.

        Raises:
          ValueError: a mask of the wrong shape, a cache without ``content_pos``, or
            segment ids with a cache.
        """
        c = self.config
        p = params["params"] if "params" in params else params
        p = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), p)
        tokens = jnp.asarray(tokens, jnp.int32)
        B, T = tokens.shape
        content_mask = jnp.asarray(content_mask, bool)
        if cache is not None:
            if content_pos is None:
                raise ValueError("content_pos (B, T) is required with a cache")
            if segment_ids is not None:
                raise ValueError("segment_ids are not supported with a cache")
            K = cache.size
        else:
            K = T
        if content_mask.shape != (B, T, K):
            raise ValueError(f"content_mask has shape {content_mask.shape}, expected {(B, T, K)}")
        P = 0
        if query_mask is not None:
            query_mask = jnp.asarray(query_mask, bool)
            P = query_mask.shape[1]
            if query_mask.shape != (B, P, K):
                raise ValueError(f"query_mask has shape {query_mask.shape}, expected {(B, P, K)}")

        default_c = content_pos is None
        cpos = (
            jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
            if default_c
            else jnp.asarray(content_pos, jnp.int32)
        )
        kpos = (
            jnp.broadcast_to(jnp.arange(K, dtype=jnp.int32), (B, K)) if cache is not None else cpos
        )
        fast_c = cache is None and default_c
        rel = lambda qp: K - (qp[:, :, None] - kpos[:, None, :])
        c_idx = None if fast_c else rel(cpos)
        if query_mask is not None:
            qpos = (
                jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
                if query_pos is None
                else jnp.asarray(query_pos, jnp.int32)
            )
            q_idx = None if (fast_c and query_pos is None and P == K) else rel(qpos)
        seg_c = seg_q = None
        if segment_ids is not None:
            seg = jnp.asarray(segment_ids, jnp.int32)
            seg_c = seg[:, :, None] != seg[:, None, :]
            if query_mask is not None:
                seg_qrow = jnp.take_along_axis(seg, jnp.clip(qpos, 0, T - 1), axis=1)
                seg_q = seg_qrow[:, :, None] != seg[:, None, :]

        table = _rel_table(K, c.d_model, c.clamp_len)
        scale = 1.0 / math.sqrt(c.d_head)
        h = p["word_embedding"][tokens]
        g = jnp.broadcast_to(p["mask_emb"], (B, P, c.d_model)) if query_mask is not None else None
        rows = jnp.arange(B)[:, None]

        def layer(carry, xs):
            h, g = carry
            lp, ck, cv = xs
            kh = jnp.einsum("btd,dnh->btnh", h, lp["k"])
            vh = jnp.einsum("btd,dnh->btnh", h, lp["v"])
            if ck is not None:
                ck = ck.at[rows, cpos].set(kh.astype(ck.dtype))
                cv = cv.at[rows, cpos].set(vh.astype(cv.dtype))
                keys, vals = ck.astype(jnp.float32), cv.astype(jnp.float32)
            else:
                keys, vals = kh, vh
            kr = jnp.einsum("rd,dnh->rnh", table, lp["r"])
            qh = jnp.einsum("btd,dnh->btnh", h, lp["q"])
            h_new = _post(
                h, _attend(qh, keys, vals, kr, lp, c_idx, seg_c, content_mask, scale), lp, c
            )
            if g is not None:
                qg = jnp.einsum("bpd,dnh->bpnh", g, lp["q"])
                g = _post(
                    g, _attend(qg, keys, vals, kr, lp, q_idx, seg_q, query_mask, scale), lp, c
                )
            return (h_new, g), (ck, cv)

        xs = (p["layers"], None if cache is None else cache.k, None if cache is None else cache.v)
        (h, g), (nk, nv) = jax.lax.scan(layer, (h, g), xs)
        new_cache = None if cache is None else XLNetCache(k=nk, v=nv)
        head = lambda x: x @ p["word_embedding"].T + p["lm_bias"]
        if g is None:
            return head(h), new_cache
        if content_logits:
            return (head(g), head(h)), new_cache
        return head(g), new_cache


# --------------------------------------------------------------------------- compact vocabulary
@dataclasses.dataclass(frozen=True)
class CompactVocab:
    """A model vocabulary that is a subset of a larger tokenizer's (e.g. the 8k SmolLM2 ids most
    frequent in the training corpus, plus one UNK id), so a small model can speak the big
    tokenizer's ids at its interface.

    Attributes:
      ids: ``int`` tuple, ``ids[c]`` is the external id of model id ``c`` for ``c < V - 1``;
        the last model id ``V - 1 = len(ids)`` is UNK (every external id not in ``ids``).
      external_size: size of the external vocabulary.
    """

    ids: tuple
    external_size: int

    @property
    def size(self) -> int:
        return len(self.ids) + 1

    @property
    def unk(self) -> int:
        return len(self.ids)

    def to_model_table(self) -> np.ndarray:
        """``int32 (external_size,)`` lookup: external id -> model id (UNK when absent)."""
        t = np.full(self.external_size, self.unk, np.int32)
        t[np.asarray(self.ids, np.int64)] = np.arange(len(self.ids), dtype=np.int32)
        return t

    def to_external_table(self) -> np.ndarray:
        """``int32 (size,)`` lookup: model id -> external id (UNK maps to -1)."""
        return np.concatenate([np.asarray(self.ids, np.int32), np.asarray([-1], np.int32)])

    def encode(self, ext_ids) -> np.ndarray:
        return self.to_model_table()[np.asarray(ext_ids, np.int64)]

    def decode(self, model_ids) -> np.ndarray:
        return self.to_external_table()[np.asarray(model_ids, np.int64)]


# --------------------------------------------------------------------------- native checkpoint
def _flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def save_xlnet(
    path,
    config: XLNetConfig,
    params: dict,
    vocab: Optional[CompactVocab] = None,
    meta: Optional[dict] = None,
    dtype=np.float16,
) -> int:
    """Write ``params`` as one safetensors file (leaves cast to ``dtype``, default float16).
    The header metadata holds ``xlnet_config`` (JSON), the compact vocabulary (``vocab_ids``,
    ``vocab_external_size``) when given, and ``meta`` (JSON). Returns the file size in bytes."""
    from safetensors.numpy import save_file

    path = Path(path)
    tensors = {k: np.asarray(v, np.float32).astype(dtype) for k, v in _flat(params).items()}
    md = {
        "format": "jaxspec-xlnet",
        "xlnet_config": json.dumps(config.to_dict()),
        "meta": json.dumps(meta or {}),
    }
    if vocab is not None:
        md["vocab_ids"] = json.dumps(list(int(i) for i in vocab.ids))
        md["vocab_external_size"] = str(int(vocab.external_size))
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=md)
    tmp.replace(path)
    return path.stat().st_size


def load_xlnet(path) -> tuple[XLNetConfig, dict, Optional[CompactVocab], dict]:
    """Read a file written by :func:`save_xlnet`.

    Returns:
      ``(config, params float32, vocab or None, meta dict)``.

    Raises:
      WeightFileError: missing or unreadable file, not a jaxspec XLNet file, or tensors that
        do not match the stored config (one-line message).
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise WeightFileError(f"{path}: XLNet weight file not found")
    try:
        with safe_open(str(path), framework="numpy") as f:
            md = f.metadata() or {}
            arrays = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - any parse failure means a corrupt file
        raise WeightFileError(
            f"{path}: not a readable safetensors file ({type(e).__name__})"
        ) from None
    if md.get("format") != "jaxspec-xlnet":
        raise WeightFileError(
            f"{path}: not a jaxspec XLNet file (metadata format={md.get('format')!r})"
        )
    try:
        config = XLNetConfig(**json.loads(md["xlnet_config"]))
    except (KeyError, TypeError, ValueError) as e:
        raise WeightFileError(f"{path}: bad xlnet_config metadata ({type(e).__name__})") from None
    want = _flat(jax.eval_shape(lambda: init_params(config)))
    params: dict = {"layers": {}}
    for k, spec in want.items():
        if k not in arrays:
            raise WeightFileError(f"{path}: missing tensor {k}")
        if tuple(arrays[k].shape) != tuple(spec.shape):
            raise WeightFileError(
                f"{path}: tensor {k} has shape {tuple(arrays[k].shape)}, "
                f"expected {tuple(spec.shape)}"
            )
        a = jnp.asarray(arrays[k], jnp.float32)
        if k.startswith("layers."):
            params["layers"][k[len("layers.") :]] = a
        else:
            params[k] = a
    vocab = None
    if "vocab_ids" in md:
        vocab = CompactVocab(
            ids=tuple(json.loads(md["vocab_ids"])), external_size=int(md["vocab_external_size"])
        )
        if vocab.size != config.vocab_size:
            raise WeightFileError(
                f"{path}: vocabulary map has {vocab.size} ids, the model {config.vocab_size}"
            )
    return config, params, vocab, json.loads(md.get("meta", "{}"))


# --------------------------------------------------------------------------- HF loader
_HF_LAYER = {  # ours -> (suffix after "transformer.layer.N.", transpose torch Linear weight)
    "q": ("rel_attn.q", False),
    "k": ("rel_attn.k", False),
    "v": ("rel_attn.v", False),
    "o": ("rel_attn.o", False),
    "r": ("rel_attn.r", False),
    "r_w_bias": ("rel_attn.r_w_bias", False),
    "r_r_bias": ("rel_attn.r_r_bias", False),
    "r_s_bias": ("rel_attn.r_s_bias", False),
    "seg_embed": ("rel_attn.seg_embed", False),
    "attn_ln_scale": ("rel_attn.layer_norm.weight", False),
    "attn_ln_bias": ("rel_attn.layer_norm.bias", False),
    "ff_w1": ("ff.layer_1.weight", True),
    "ff_b1": ("ff.layer_1.bias", False),
    "ff_w2": ("ff.layer_2.weight", True),
    "ff_b2": ("ff.layer_2.bias", False),
    "ff_ln_scale": ("ff.layer_norm.weight", False),
    "ff_ln_bias": ("ff.layer_norm.bias", False),
}


def xlnet_config_from_hf(raw: dict, where: str = "config.json") -> XLNetConfig:
    """:class:`XLNetConfig` from a transformers ``config.json`` dict.

    Raises:
      WeightFileError: a missing key, ``attn_type`` other than ``"bi"``, ``bi_data`` set, or
        invalid sizes (one line naming ``where``).
    """
    try:
        if raw.get("attn_type", "bi") != "bi":
            raise ValueError(f"attn_type {raw.get('attn_type')!r} is not supported (only 'bi')")
        if raw.get("bi_data", False):
            raise ValueError("bi_data=True is not supported")
        return XLNetConfig(
            vocab_size=int(raw["vocab_size"]),
            d_model=int(raw["d_model"]),
            n_layer=int(raw["n_layer"]),
            n_head=int(raw["n_head"]),
            d_head=int(raw.get("d_head") or int(raw["d_model"]) // int(raw["n_head"])),
            d_inner=int(raw["d_inner"]),
            layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
            clamp_len=int(raw.get("clamp_len", -1) if raw.get("clamp_len") is not None else -1),
            ff_activation=str(raw.get("ff_activation", "gelu")),
        )
    except KeyError as e:
        raise WeightFileError(f"{where}: missing key {e.args[0]!r} for an XLNet config") from None
    except (TypeError, ValueError) as e:
        raise WeightFileError(f"{where}: {e}") from None


def _open_state_dict(d: Path):
    """``(get(name) -> np.ndarray | None, names, description)`` for a checkpoint directory:
    ``model.safetensors`` or a sharded ``model.safetensors.index.json`` (read through
    :func:`models.llama.params._dir_source`: a shard the index names but the directory lacks is
    a one-line ``WeightFileError`` naming it), else ``pytorch_model.bin``."""
    from models.llama.params import SAFETENSORS_INDEX, SAFETENSORS_SINGLE, _dir_source

    if (d / SAFETENSORS_INDEX).is_file() or (d / SAFETENSORS_SINGLE).is_file():
        src, where = _dir_source(d)
        names = src.names
        return (lambda name: src.get(name) if name in names else None), set(names), where
    pt = d / "pytorch_model.bin"
    if pt.is_file():
        import torch

        try:
            sd = torch.load(str(pt), map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001
            raise WeightFileError(
                f"{pt}: not a readable PyTorch state dict ({type(e).__name__})"
            ) from None
        return (lambda n: None if n not in sd else sd[n].float().numpy()), set(sd), str(pt)
    raise WeightFileError(
        f"{d}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin"
    )


def load_hf_xlnet(path) -> tuple[XLNetConfig, dict]:
    """Load a transformers XLNet checkpoint directory (``config.json`` + ``model.safetensors``,
    a sharded ``model.safetensors.index.json`` or ``pytorch_model.bin``; xlnet-base-cased /
    xlnet-large-cased layout, ``XLNetLMHeadModel`` or bare ``XLNetModel`` names, with or without the
    ``transformer.`` prefix).

    Returns:
      ``(XLNetConfig, params)`` with float32 leaves; ``lm_bias`` is zero when the checkpoint
      has no ``lm_loss.bias`` (bare ``XLNetModel``).

    Raises:
      WeightFileError: missing directory / file / tensor, unreadable (corrupt) file, or a
        tensor whose shape disagrees with the config; the message is one line.
    """
    d = Path(path)
    if not d.is_dir():
        raise WeightFileError(f"{d}: XLNet checkpoint directory not found")
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise WeightFileError(f"{cfg_path}: missing config.json")
    try:
        raw = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise WeightFileError(f"{cfg_path}: not valid JSON ({type(e).__name__})") from None
    config = xlnet_config_from_hf(raw, str(cfg_path))
    get, names, where = _open_state_dict(d)
    prefix = "transformer." if any(n.startswith("transformer.") for n in names) else ""
    want = jax.eval_shape(lambda: init_params(config))

    def fetch(name, shape, required=True):
        a = get(name)
        if a is None:
            if required:
                raise WeightFileError(f"{where}: missing tensor {name}")
            return None
        a = a.reshape(shape) if name.endswith("mask_emb") and a.size == int(np.prod(shape)) else a
        if tuple(a.shape) != tuple(shape):
            raise WeightFileError(
                f"{where}: tensor {name} has shape {tuple(a.shape)}, "
                f"the config expects {tuple(shape)}"
            )
        return a

    params = {
        "word_embedding": jnp.asarray(
            fetch(prefix + "word_embedding.weight", want["word_embedding"].shape)
        ),
        "mask_emb": jnp.asarray(fetch(prefix + "mask_emb", want["mask_emb"].shape)),
    }
    bias = fetch("lm_loss.bias", want["lm_bias"].shape, required=False)
    params["lm_bias"] = (
        jnp.zeros(want["lm_bias"].shape, jnp.float32) if bias is None else jnp.asarray(bias)
    )
    layers = {}
    for key, spec in want["layers"].items():
        suffix, transpose = _HF_LAYER[key]
        buf = np.empty(spec.shape, np.float32)
        for i in range(config.n_layer):
            name = f"{prefix}layer.{i}.{suffix}"
            shape = spec.shape[1:][::-1] if transpose else spec.shape[1:]
            a = fetch(name, shape)
            buf[i] = a.T if transpose else a
        layers[key] = jnp.asarray(buf)
    params["layers"] = layers
    return config, params


__all__ = [
    "XLNetConfig",
    "XLNetLM",
    "XLNetCache",
    "CompactVocab",
    "init_params",
    "init_cache",
    "save_xlnet",
    "load_xlnet",
    "order_to_rank",
    "parallel_masks",
    "density_masks",
    "load_hf_xlnet",
    "xlnet_config_from_hf",
]
