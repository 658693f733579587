"""DFlash: a block-diffusion drafter conditioned on the target's hidden states.

Chen, Liang, Liu, "DFlash: Block Diffusion for Flash Speculative Decoding" (arXiv 2602.06036);
architecture facts from the authors' released drafter (z-lab/dflash, ``dflash/model.py``).

**Drafter.** A small transformer (1-5 layers) of the target's hidden width ``D`` that shares
the target's token embedding and LM head (frozen; they are the target's arrays, passed in
:func:`drafter_params`). Its input is one *block* of ``B`` rows (block size, default 16): the
anchor (the last emitted token, whose target hidden state is not known yet) followed by
``B - 1`` mask rows (a learned mask embedding: our targets have no mask token). Attention
inside the block is bidirectional; every drafter layer's keys and values also hold the
*context features* of the accepted prefix:

1. the target's hidden states after layers ``layer_ids`` (the residual stream; DFlash takes
   ``hidden_states[i + 1]`` of the HF model for layer id ``i``), concatenated per token,
   ``(n * D,)``;
2. fused by a bias-free projection ``fc: n * D -> D`` and an RMSNorm (``hidden_norm``);
3. projected by each drafter layer's own key / value matrices (with the per-head key norm and
   RoPE at the token's position) and put before the block's own keys / values.

The block's last ``B - 1`` rows go through a final RMSNorm and the target's LM head: one
forward drafts ``k = B - 1`` tokens and their distributions ``q`` (every ``q_i`` depends on the
accepted context only, so the drafts can be drawn independently). Default target layers
(DFlash's rule): one drafter layer reads the middle layer ``L // 2``; ``n > 1`` drafter layers
read ``n`` layers spread evenly from layer 1 to layer ``L - 3``.

**In the decode loop** (:mod:`jaxspec.causal.decode`): the drafter declares
``feature_layers``; every target pass (the prompt pass and each verification pass) then also
returns those layers' hidden states (:class:`models.llama.modeling.CausalLM`'s
``hidden_layers``, the same pass) and hands them to :meth:`DFlashDrafter.absorb_features`,
which projects them once into the drafter's own per-layer context key / value cache
(:class:`DFlashState`), in the target's slot layout. Slots past the accepted prefix hold
stale features that the next proposal masks (context = slots ``[pad, length - 1)``; the anchor
at slot ``length - 1`` enters as a token), like the target's KV cache rollback.

**Draft vocabulary** (optional; FR-Spec's frequency-ranked draft vocabulary, Zhao et al.,
arXiv 2502.14856, ACL 2025): the drafter's LM head may run on a subset of ``V_d`` token ids
only (:func:`drafter_params`'s ``draft_vocab``, e.g. the target's most frequent answer tokens,
:func:`build_draft_vocab`): the rows of the target's head for those ids, logits ``-inf``
elsewhere. On the CPU the LM head over the whole vocabulary is most of a small drafter's
forward. ``q`` is then zero outside the subset and the drafts never leave it, so the verifier
below stays exact; only acceptance can change.

**Exactness.** Verification is the shared chain verifier (:func:`jaxspec.core.verify.
verify_sample`, residual resampling and a bonus token): greedy output equals AR's and sampled
output has AR's distribution, for any drafter weights (Leviathan et al. 2023, Theorem 3.5):
each ``d_i`` is drawn from ``q_i`` (the drafter's distribution after the target's
temperature / top-k / top-p) before the verifier's uniforms, and that ``q_i`` is what the
verifier gets.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, ClassVar, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.causal.config import DraftedConfig, check_ngram_range
from jaxspec.core.drafters import Draft, DraftContext, Drafter, LookupFirst
from jaxspec.core.method_config import Needs
from jaxspec.core.sampling import SamplingConfig, argmax, sample_from_probs, target_probs
from models.llama.layout import head_panels
from models.llama.modeling import (
    HEAD_PANELS,
    apply_rope,
    layer_entry,
    lm_logits,
    proj,
    rms_norm,
    rope_tables,
)
from models.llama.panels import pack, pack_exact, packable, panel_product, panels_active

__all__ = [
    "Config",
    "DFlashDrafter",
    "DFlashSpec",
    "DFlashState",
    "default_layer_ids",
    "drafter_params",
    "panel_layout",
    "build_draft_vocab",
    "check_draft_vocab",
    "load_draft_vocab",
    "init_drafter",
    "init_from_target",
    "check_init_layers",
    "target_qk_scale",
    "block_logits",
    "block_frame",
    "draw_drafts",
    "context_kv",
    "save_drafter",
    "load_drafter",
]

#: drafter depth allowed (DFlash drafters are lightweight: 1-5 layers)
MAX_LAYERS = 5


def default_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """DFlash's default target layers: ``(L // 2,)`` for one drafter layer, else
    ``num_draft_layers`` ids spread evenly (rounded) over ``1 .. L - 3``, clipped to
    ``0 .. L - 1`` and deduplicated (tiny targets)."""
    L, n = int(num_target_layers), int(num_draft_layers)
    if n == 1:
        return (L // 2,)
    lo, hi = 1, L - 3
    ids = [min(max(int(round(lo + i * (hi - lo) / (n - 1))), 0), L - 1) for i in range(n)]
    return tuple(sorted(set(ids)))


@dataclasses.dataclass(frozen=True)
class DFlashSpec:
    """The drafter's architecture and the target it was built for (hashable).

    Attributes:
      target_hidden: the target's hidden width ``D`` (also the drafter's: it shares the
        target's embedding and LM head).
      target_layers: the target's number of layers.
      vocab_size: the target's vocabulary ``V``.
      layer_ids: target layers whose hidden states are fused (each in ``0..target_layers-1``).
      block_size: ``B`` rows per drafter forward (anchor + ``B - 1`` drafts), >= 2.
      num_layers: drafter layers, ``1..5``.
      num_heads, num_kv_heads, head_dim: attention shape (``num_kv_heads`` divides
        ``num_heads``); intermediate_size: SwiGLU width; rope_theta, rms_norm_eps.

    Raises:
      ValueError: any field outside its range (one line naming it).
    """

    target_hidden: int
    target_layers: int
    vocab_size: int
    layer_ids: tuple[int, ...]
    block_size: int = 16
    num_layers: int = 1
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 8
    intermediate_size: int = 64
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    def __post_init__(self):
        object.__setattr__(self, "layer_ids", tuple(int(i) for i in self.layer_ids))
        if not 1 <= self.num_layers <= MAX_LAYERS:
            raise ValueError(f"num_layers must be in 1..{MAX_LAYERS}, got {self.num_layers}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (anchor + drafts), got {self.block_size}")
        if not self.layer_ids or len(set(self.layer_ids)) != len(self.layer_ids):
            raise ValueError(f"layer_ids must be non-empty and distinct, got {self.layer_ids}")
        bad = [i for i in self.layer_ids if not 0 <= i < self.target_layers]
        if bad:
            raise ValueError(
                f"layer_ids {bad} outside the target's layers 0..{self.target_layers - 1}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads {self.num_kv_heads} must divide num_heads {self.num_heads}"
            )

    @classmethod
    def for_target(
        cls,
        target_config,
        *,
        block_size: int = 16,
        num_layers: int = 1,
        layer_ids: Optional[tuple[int, ...]] = None,
        intermediate_size: Optional[int] = None,
    ) -> "DFlashSpec":
        """A spec for ``target_config`` (:class:`models.config.ModelConfig`): the target's
        width, attention shape and RoPE base, :func:`default_layer_ids` unless given, and the
        target's MLP width unless given."""
        c = target_config
        return cls(
            target_hidden=c.hidden_size,
            target_layers=c.num_layers,
            vocab_size=c.vocab_size,
            layer_ids=tuple(layer_ids)
            if layer_ids is not None
            else default_layer_ids(c.num_layers, num_layers),
            block_size=block_size,
            num_layers=num_layers,
            num_heads=c.num_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            intermediate_size=intermediate_size or c.intermediate_size,
            rope_theta=c.rope_theta,
            rms_norm_eps=c.rms_norm_eps,
        )

    def check_target(self, target_config) -> None:
        """One-line ``ValueError`` when the target differs from the one the drafter was built
        for: hidden width, number of layers (the layer ids would mean other layers) or
        vocabulary."""
        c = target_config
        for what, mine, theirs in (
            ("hidden width", self.target_hidden, c.hidden_size),
            ("number of layers", self.target_layers, c.num_layers),
            ("vocabulary", self.vocab_size, c.vocab_size),
        ):
            if mine != theirs:
                raise ValueError(
                    f"DFlash drafter built for a target with {what} {mine}, the target has {theirs}"
                )


def init_drafter(spec: DFlashSpec, seed: int = 0, dtype=jnp.float32) -> dict:
    """Random drafter weights (normal std 0.02, norms 1), the drafter's own tree::

        fc (n*D, D), hidden_norm (D,), mask_embed (D,), final_norm (D,)
        blocks/ attn_norm (l, D), wq (l, D, H*Dh), wk / wv (l, D, K*Dh), q_norm / k_norm
                (l, Dh), wo (l, H*Dh, D), mlp_norm (l, D), w_gate / w_up (l, D, F),
                w_down (l, F, D)

    (``blocks``, not ``layers``: the decode plan re-lays out trees with a Llama ``layers``
    entry, :func:`models.llama.layout.decode_layout`.)
    """
    s, D, l = spec, spec.target_hidden, spec.num_layers
    qd, kd, F = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.intermediate_size
    shapes = {
        "wq": (l, D, qd),
        "wk": (l, D, kd),
        "wv": (l, D, kd),
        "wo": (l, qd, D),
        "w_gate": (l, D, F),
        "w_up": (l, D, F),
        "w_down": (l, F, D),
    }
    keys = jax.random.split(jax.random.PRNGKey(seed), len(shapes) + 2)
    layers = {n: 0.02 * jax.random.normal(k, sh, dtype) for (n, sh), k in zip(shapes.items(), keys)}
    ones = lambda *sh: jnp.ones(sh, dtype)  # noqa: E731
    layers.update(
        attn_norm=ones(l, D),
        mlp_norm=ones(l, D),
        q_norm=ones(l, s.head_dim),
        k_norm=ones(l, s.head_dim),
    )
    return {
        "fc": 0.02 * jax.random.normal(keys[-2], (len(s.layer_ids) * D, D), dtype),
        "hidden_norm": ones(D),
        "mask_embed": 0.02 * jax.random.normal(keys[-1], (D,), dtype),
        "final_norm": ones(D),
        "blocks": layers,
    }


def init_from_target(
    spec: DFlashSpec,
    target_params: dict,
    target_layers: tuple[int, ...],
    seed: int = 0,
    qk_scale: tuple[float, float] = (1.0, 1.0),
) -> dict:
    """A drafter tree whose layers start as copies of target layers (not DFlash's recipe,
    which trains the drafter from a random init: an option to try, a warm start).

    Drafter layer ``i`` gets target layer ``target_layers[i]``'s norms and projection
    matrices (attention and SwiGLU; the target's q / k / v biases, where it has them, are
    dropped: the drafter has none). The context path is set so that the first copied layer
    sees what the target's own layer saw: ``fc`` passes the hidden state of layer id
    ``target_layers[0] - 1`` (its input residual) through and zeroes the other feature
    layers, ``hidden_norm`` is that layer's ``attn_norm``; so the drafter's first-layer
    context keys / values are the target's at that layer up to the per-head key norm. The
    per-head query / key RMSNorms (the drafter has them, a Llama target does not) start at
    ``qk_scale`` (the typical per-head RMS of the target's queries and keys there, so that the
    attention logits keep their scale); ``final_norm`` is the target's. The mask embedding
    is random (normal std 0.02, ``seed``).

    Args:
      target_params: the target's tree (:mod:`models.llama.modeling`; stacked ``layers``).
      target_layers: ``spec.num_layers`` target layer ids.
      qk_scale: ``(q, k)`` start values of ``q_norm`` / ``k_norm``.

    Raises:
      ValueError: ``target_layers`` of another length than ``spec.num_layers`` or outside the
        target, layer id ``target_layers[0] - 1`` not among ``spec.layer_ids``, or a target
        whose layer shapes differ from the drafter's (intermediate size, heads)."""
    layers = check_init_layers(spec, target_layers)
    own = init_drafter(spec, seed)
    tl = target_params["layers"]
    idx = jnp.asarray(layers)
    blocks = dict(own["blocks"])
    for name in ("attn_norm", "mlp_norm", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
        src = jnp.take(jnp.asarray(tl[name], jnp.float32), idx, axis=0)
        if src.shape != blocks[name].shape:
            raise ValueError(
                f"init_target_layers: the target's {name} is {tuple(src.shape[1:])}, the "
                f"drafter's {tuple(blocks[name].shape[1:])} (intermediate_size or heads differ)"
            )
        blocks[name] = src
    blocks["q_norm"] = jnp.full_like(blocks["q_norm"], float(qk_scale[0]))
    blocks["k_norm"] = jnp.full_like(blocks["k_norm"], float(qk_scale[1]))
    D, j = spec.target_hidden, spec.layer_ids.index(layers[0] - 1)
    fc = jnp.zeros((len(spec.layer_ids) * D, D), jnp.float32)
    fc = fc.at[j * D : (j + 1) * D].set(jnp.eye(D, dtype=jnp.float32))
    return {
        **own,
        "fc": fc,
        "hidden_norm": jnp.asarray(tl["attn_norm"][layers[0]], jnp.float32),
        "final_norm": jnp.asarray(target_params["final_norm"], jnp.float32),
        "blocks": blocks,
    }


def check_init_layers(spec: DFlashSpec, target_layers) -> tuple[int, ...]:
    """``target_layers`` as a tuple of ints, checked for :func:`init_from_target`.

    Raises:
      ValueError: another length than ``spec.num_layers``, ids outside the target, or layer id
        ``target_layers[0] - 1`` not among ``spec.layer_ids`` (one line naming it)."""
    layers = tuple(int(i) for i in target_layers)
    if len(layers) != spec.num_layers:
        raise ValueError(
            f"init_target_layers {layers}: need one target layer per drafter layer "
            f"({spec.num_layers})"
        )
    if not all(0 <= i < spec.target_layers for i in layers):
        raise ValueError(
            f"init_target_layers {layers} outside the target's layers 0..{spec.target_layers - 1}"
        )
    if layers[0] - 1 not in spec.layer_ids:
        raise ValueError(
            f"init_target_layers {layers}: the first copied layer's input, layer id "
            f"{layers[0] - 1}, must be among the feature layer_ids {spec.layer_ids}"
        )
    return layers


def target_qk_scale(spec: DFlashSpec, target_params: dict, hidden: jax.Array, layer: int):
    """The median per-head RMS of target layer ``layer``'s queries and keys on ``hidden``
    (float ``(B, T, n, D)``, the target's states after ``spec.layer_ids``; the input of
    ``layer`` is layer id ``layer - 1``), a ``(q, k)`` pair of floats for
    :func:`init_from_target`."""
    tl = target_params["layers"]
    x = hidden[..., spec.layer_ids.index(layer - 1), :].astype(jnp.float32)
    a = rms_norm(x, jnp.asarray(tl["attn_norm"][layer], jnp.float32), spec.rms_norm_eps)
    out = []
    for name, n in (("wq", spec.num_heads), ("wk", spec.num_kv_heads)):
        h = _heads(a @ jnp.asarray(tl[name][layer], jnp.float32), n, spec.head_dim)
        out.append(float(jnp.median(jnp.sqrt(jnp.mean(h * h, axis=-1)))))
    return tuple(out)


def drafter_params(own: dict, target_params: dict, draft_vocab: Any = None) -> dict:
    """The drafter's parameters for :func:`jaxspec.causal.decode.generate`: its own tree and
    the target's (frozen, shared, not copied) token embedding and LM head (absent when the
    target ties them).

    With ``draft_vocab`` (token ids, int ``(V_d,)``; module docstring) the tree also holds
    ``vocab`` int32 ``(V_d,)`` and ``vocab_head`` ``(V_d, D)``, the target head's rows for
    those ids (a copy, in the target's dtype), and the drafter's LM head runs on them only.

    Raises:
      ValueError: ``draft_vocab`` not a non-empty set of distinct ids of the target's
        vocabulary (:func:`check_draft_vocab`)."""
    shared = {"embed": target_params["embed"]}
    if "lm_head" in target_params:
        shared["lm_head"] = target_params["lm_head"]
    if draft_vocab is not None:
        ids = check_draft_vocab(draft_vocab, target_params["embed"].shape[0])
        if "lm_head" in target_params:  # (D, V): the columns of the ids
            head = jnp.take(target_params["lm_head"], jnp.asarray(ids), axis=1).T
        else:
            head = jnp.take(target_params["embed"], jnp.asarray(ids), axis=0)
        shared.update(vocab=jnp.asarray(ids), vocab_head=head)
    out = {"draft": own, **shared}
    return panel_layout(out, target_params) if panels_active() else out


#: the entries of a drafter layer that project the target's features into keys / values
_KV_ENTRIES = ("wk", "wk_p", "wv", "wv_p", "k_norm")


def panel_layout(params: dict, target_params: Optional[dict] = None) -> dict:
    """:func:`drafter_params`'s tree for decoding on the CPU panel kernel
    (:mod:`models.llama.panels`; :func:`drafter_params` applies it where the kernel is active):
    the drafter's layers split into a tuple of per-layer dicts (the forward unrolls them) whose
    float32 projection matrices are packed in panels (``name + "_p"``), ``fc`` as ``fc_p``, the
    draft vocabulary's head as ``vocab_head_p`` (rows of the target's embedding: Q8_0 panels
    where that is a Q8_0 tensor, :func:`models.llama.panels.pack_exact`) and the target's
    head as ``head_p`` (cached
    with the target's own, :func:`models.llama.layout.head_panels`). A drafter forward has
    ``B`` block rows and a verification pass feeds it ``k + 1`` feature rows: few-row products,
    which the kernel runs at about the cost of one row. The drafter computes the same function
    (float32 sums in another order); training keeps the stacked tree."""
    own = params["draft"]
    blocks = own["blocks"]
    if isinstance(blocks, tuple):
        return params  # already laid out
    n = blocks["wq"].shape[0]
    layers = tuple(
        dict(layer_entry(name, w, i, panels=True) for name, w in blocks.items()) for i in range(n)
    )
    draft = {**own, "blocks": layers}
    if packable(own["fc"]):
        draft = {k: v for k, v in draft.items() if k != "fc"} | {"fc_p": pack(own["fc"])}
    out = {**params, "draft": draft}
    if "vocab_head" in params and packable(params["vocab_head"].T):
        out["vocab_head_p"] = pack_exact(params["vocab_head"].T)
    elif "vocab" not in params:
        head = head_panels(params if target_params is None else target_params)
        if head is not None:
            out[HEAD_PANELS] = head
    return out


def check_draft_vocab(draft_vocab: Any, vocab_size: int) -> np.ndarray:
    """``draft_vocab`` as a sorted int32 array, checked.

    Raises:
      ValueError: not a 1-D array of integers, empty, ids repeated, or ids outside
        ``0 .. vocab_size - 1`` (one line naming the problem)."""
    ids = np.asarray(draft_vocab)
    if ids.size == 0:
        raise ValueError("the draft vocabulary is empty")
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"a draft vocabulary is a 1-D array of token ids, got shape {ids.shape} of {ids.dtype}"
        )
    if np.unique(ids).size != ids.size:
        raise ValueError(f"the draft vocabulary repeats {ids.size - np.unique(ids).size} ids")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(
            f"draft vocabulary ids {int(ids.min())}..{int(ids.max())} outside the target's "
            f"vocabulary 0..{vocab_size - 1}"
        )
    return np.sort(ids).astype(np.int32)


def build_draft_vocab(sequences, size: int, always=()) -> np.ndarray:
    """The ``size`` most frequent token ids of ``sequences`` (iterables of ids, e.g. the
    target's answers in a self-distillation file; ties to the lower id), with the ids in
    ``always`` (e.g. EOS) among them: sorted int32 ``(min(size, distinct ids + always),)``.

    Raises:
      ValueError: ``size`` smaller than ``len(always)`` or < 1."""
    from collections import Counter

    always = sorted({int(t) for t in always})
    if size < max(1, len(always)):
        raise ValueError(
            f"draft vocabulary size {size} must be >= 1 and hold the {len(always)} always ids"
        )
    counts = Counter()
    for seq in sequences:
        counts.update(int(t) for t in seq)
    for t in always:
        counts.pop(t, None)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ids = always + [t for t, _ in ranked[: size - len(always)]]
    return np.sort(np.asarray(ids, np.int32))


def load_draft_vocab(path, vocab_size: int) -> np.ndarray:
    """A draft vocabulary saved with ``numpy.save`` (``.npy``), checked against the target's
    ``vocab_size`` (:func:`check_draft_vocab`).

    Raises:
      ValueError: a missing or unreadable file, or a bad vocabulary (one line naming the
        file)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: draft vocabulary file does not exist")
    try:
        ids = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(f"{path}: not a readable .npy draft vocabulary ({e})") from None
    try:
        return check_draft_vocab(ids, vocab_size)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


#: the safetensors metadata key that holds the drafter's spec (JSON)
SPEC_KEY = "dflash_spec"


def save_drafter(
    path, spec: DFlashSpec, own: dict, meta: Optional[dict] = None, dtype: str = "float32"
) -> int:
    """Write the drafter's own tree as safetensors (keys ``fc``, ``blocks.wq``, ...; ``dtype``
    ``"float32"`` or ``"float16"``, half the bytes for a committed drafter) with its
    :class:`DFlashSpec` as JSON metadata (``dflash_spec``) and, when given, ``meta`` (e.g. how
    it was trained) as JSON under ``dflash_meta``. Returns the file size in bytes. The
    target's embedding and LM head are not stored.

    Raises:
      ValueError: another ``dtype``."""
    from safetensors.numpy import save_file

    if dtype not in ("float32", "float16"):
        raise ValueError(f"drafter dtype must be 'float32' or 'float16', got {dtype!r}")
    flat = {
        ".".join(str(getattr(k, "key", k)) for k in path_): np.asarray(x, np.float32).astype(dtype)
        for path_, x in jax.tree_util.tree_flatten_with_path(own)[0]
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    info = {SPEC_KEY: json.dumps(dataclasses.asdict(spec))}
    if meta:
        info["dflash_meta"] = json.dumps(meta)
    save_file(flat, str(path), metadata=info)
    return path.stat().st_size


def load_drafter(path) -> tuple[DFlashSpec, dict]:
    """Inverse of :func:`save_drafter`: ``(spec, own tree of jnp float32 arrays)`` (a float16
    file is widened to float32).

    Raises:
      ValueError: a missing or unreadable file, or one without the drafter's spec (one line
        naming the file).
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: DFlash drafter file does not exist")
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            flat = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: not a readable safetensors drafter ({msg})") from None
    if SPEC_KEY not in meta:
        raise ValueError(f"{path}: no DFlash drafter config (metadata {SPEC_KEY!r} missing)")
    try:
        spec = DFlashSpec(**json.loads(meta[SPEC_KEY]))
    except (TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: bad DFlash drafter config ({e})") from None
    own: dict = {}
    for k, v in flat.items():
        *outer, last = k.split(".")
        node = own
        for part in outer:
            node = node.setdefault(part, {})
        node[last] = jnp.asarray(v, jnp.float32)
    return spec, own


# ----------------------------------------------------------------------------- the forward


def _heads(x, n, Dh):
    return x.reshape(x.shape[:-1] + (n, Dh))


def context_kv(spec: DFlashSpec, own: dict, hidden: jax.Array, positions: jax.Array):
    """Project target hidden states into every drafter layer's context keys / values.

    Args:
      hidden: ``(B, T, n, D)`` the target's hidden states after ``spec.layer_ids``.
      positions: int32 ``(B, T)`` their RoPE positions.

    Returns:
      ``(k, v)``, each ``(l, B, K, T, Dh)`` (RoPE applied to ``k``).
    """
    B, T = hidden.shape[:2]
    c = proj(hidden.reshape(B, T, -1), own, "fc")
    c = rms_norm(c, own["hidden_norm"], spec.rms_norm_eps)
    cos, sin = rope_tables(positions, spec.head_dim, spec.rope_theta)
    K, Dh = spec.num_kv_heads, spec.head_dim

    def one(lp):
        k = rms_norm(_heads(proj(c, lp, "wk"), K, Dh), lp["k_norm"], spec.rms_norm_eps)
        k = apply_rope(k, cos, sin)
        v = _heads(proj(c, lp, "wv"), K, Dh)
        return jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)

    blocks = own["blocks"]
    if isinstance(blocks, tuple):  # per-layer (panel_layout): unrolled
        ks, vs = zip(*map(one, blocks))
        return jnp.stack(ks), jnp.stack(vs)
    return jax.lax.map(one, {n: blocks[n] for n in ("wk", "wv", "k_norm")})


def block_logits(
    spec: DFlashSpec,
    params: dict,
    anchor: jax.Array,
    positions: jax.Array,
    ctx_k: jax.Array,
    ctx_v: jax.Array,
    ctx_mask: jax.Array,
    rows: Optional[int] = None,
) -> jax.Array:
    """One drafter forward over blocks ``[anchor, mask * (B - 1)]``, ``A`` blocks per context.

    Each block sees its context's slots where ``ctx_mask`` allows and all rows of its own
    block (bidirectional), never another block: the decode loop runs one block per row
    (``A = 1``); training runs ``A`` blocks of one sequence against that sequence's context
    keys / values, which are not repeated per block (:mod:`jaxspec.training.dflash`).

    Args:
      params: :func:`drafter_params` (``draft``, ``embed``, optional ``lm_head``; with a
        draft vocabulary ``vocab`` and ``vocab_head``: logits ``-inf`` outside it).
      anchor: int32 ``(R,)`` anchor tokens (one block per row ``r``), or ``(R, A)``.
      positions: int32 ``(R, B)`` the block rows' RoPE positions, or ``(R, A, B)``.
      ctx_k, ctx_v: ``(l, R, K, S, Dh)`` context keys / values (:func:`context_kv`).
      ctx_mask: bool ``(R, S)`` context slots each block sees, or ``(R, A, S)``.
      rows: static ``int`` in ``1..B-1`` or None: the LM head runs on the first ``rows`` draft
        rows only (their logits equal the full block's: the whole block still goes through
        the drafter's layers). None: all ``B - 1``.

    Returns:
      float32 ``(R, B - 1, V)`` (or ``(R, A, B - 1, V)``; ``rows`` in place of ``B - 1``):
      logits of the blocks' draft rows.
    """
    if anchor.ndim == 1:
        out = block_logits(
            spec,
            params,
            anchor[:, None],
            positions[:, None],
            ctx_k,
            ctx_v,
            ctx_mask[:, None],
            rows,
        )
        return out[:, 0]
    own, s = params["draft"], spec
    R, A, Bk = positions.shape
    H, K, Dh = s.num_heads, s.num_kv_heads, s.head_dim
    G = H // K
    x = jnp.concatenate(
        [
            jnp.take(params["embed"], anchor, axis=0)[:, :, None],
            jnp.broadcast_to(
                own["mask_embed"].astype(params["embed"].dtype),
                (R, A, Bk - 1, s.target_hidden),
            ),
        ],
        axis=2,
    ).reshape(R, A * Bk, s.target_hidden)
    cos, sin = rope_tables(positions.reshape(R, A * Bk), Dh, s.rope_theta)
    neg = jnp.finfo(jnp.float32).min
    ctx_bias = jnp.where(ctx_mask, 0.0, neg)[:, :, None, None, None, :]  # (R, A, 1, 1, 1, S)

    def layer(x, lp_kv):
        lp, kc, vc = lp_kv  # kc, vc: (R, K, S, Dh)
        a = rms_norm(x, lp["attn_norm"], s.rms_norm_eps)
        q = rms_norm(_heads(proj(a, lp, "wq"), H, Dh), lp["q_norm"], s.rms_norm_eps)
        k = rms_norm(_heads(proj(a, lp, "wk"), K, Dh), lp["k_norm"], s.rms_norm_eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = _heads(proj(a, lp, "wv"), K, Dh)
        q = q.reshape(R, A, Bk, K, G, Dh) / math.sqrt(Dh)
        kb, vb = k.reshape(R, A, Bk, K, Dh), v.reshape(R, A, Bk, K, Dh)
        sc = jnp.einsum("rabkgd,rksd->rakgbs", q, kc).astype(jnp.float32) + ctx_bias
        sb = jnp.einsum("rabkgd,rackd->rakgbc", q, kb).astype(jnp.float32)
        w = jax.nn.softmax(jnp.concatenate([sc, sb], axis=-1), axis=-1).astype(vc.dtype)
        S = kc.shape[2]
        o = jnp.einsum("rakgbs,rksd->rabkgd", w[..., :S], vc) + jnp.einsum(
            "rakgbc,rackd->rabkgd", w[..., S:], vb
        )
        x = x + proj(o.reshape(R, A * Bk, H * Dh), lp, "wo")
        m = rms_norm(x, lp["mlp_norm"], s.rms_norm_eps)
        x = x + proj(jax.nn.silu(proj(m, lp, "w_gate")) * proj(m, lp, "w_up"), lp, "w_down")
        return x, None

    if isinstance(own["blocks"], tuple):  # per-layer (panel_layout): unrolled
        for i, lp in enumerate(own["blocks"]):
            x, _ = layer(x, (lp, ctx_k[i], ctx_v[i]))
    else:
        x, _ = jax.lax.scan(layer, x, (own["blocks"], ctx_k, ctx_v))
    x = x.reshape(R, A, Bk, s.target_hidden)[:, :, 1 : Bk if rows is None else 1 + rows]
    x = rms_norm(x, own["final_norm"], s.rms_norm_eps)
    if "vocab" in params:  # the draft vocabulary's rows only (module docstring)
        if "vocab_head_p" in params:
            sub = panel_product(x, params["vocab_head_p"]).astype(jnp.float32)
        else:
            sub = (x @ params["vocab_head"].T).astype(jnp.float32)
        full = jnp.full(sub.shape[:-1] + (s.vocab_size,), -jnp.inf, jnp.float32)
        return full.at[..., params["vocab"]].set(sub)
    return lm_logits(x, params["embed"], params.get("lm_head"), params.get(HEAD_PANELS))


def block_frame(ctx: DraftContext, block_size: int):
    """Where the next block sits (the decode loop's phase before :func:`block_logits`).

    Returns ``(anchor int32 (B,), positions int32 (B, block_size), ctx_mask bool (B, S))``:
    the anchor is the last emitted token (slot ``length - 1``), the block's rows take RoPE
    positions ``length - 1 - pad ..``, and the context is the accepted prefix before the
    anchor, slots ``[pad, length - 1)`` (the anchor's own hidden state is not known yet)."""
    S = ctx.buffer.shape[1]
    L = ctx.length
    anchor = jnp.take_along_axis(ctx.buffer, (L - 1)[:, None], axis=1)[:, 0]
    pos = (L - 1 - ctx.pad)[:, None] + jnp.arange(block_size, dtype=jnp.int32)[None]
    slot = jnp.arange(S)[None]
    ctx_mask = (slot >= ctx.pad[:, None]) & (slot < (L - 1)[:, None])
    return anchor, pos, ctx_mask


def draw_drafts(key: jax.Array, logits: jax.Array, sampling: SamplingConfig, sample: bool):
    """The drafts and the ``q`` the verifier gets, from the block's logits ``(B, k, V)``.

    Sampled: ``q_i`` = the drafter's distribution after the target's temperature / top-k /
    top-p, each ``d_i`` drawn from its own ``q_i`` (independent draws: every ``q_i`` depends on
    the accepted context only). Greedy: ``d_i = argmax``, ``q`` None.

    Returns ``(tokens int32 (B, k), q float32 (B, k, V) or None)``."""
    if not sample:
        return argmax(logits).astype(jnp.int32), None
    q = target_probs(logits, sampling)
    return sample_from_probs(key, q).astype(jnp.int32), q


# ----------------------------------------------------------------------------- the drafter


@flax.struct.dataclass
class DFlashState:
    """The drafter's loop state.

    Attributes:
      ctx_k, ctx_v: ``(l, B, K, S, Dh)`` per-layer context keys / values in the target's
        slot layout (slot ``s`` holds the features of the token at slot ``s``; valid for
        ``[pad, length - 1)``, stale slots masked).
      pad: int32 ``(B,)`` the rows' left padding (RoPE position of slot ``s`` is ``s - pad``).
      proj: the drafter weights that project features (``fc``, ``hidden_norm``, per-layer
        ``wk``, ``wv``, ``k_norm``): :meth:`DFlashDrafter.absorb_features` runs inside the
        target's pass, where the loop passes no drafter parameters.
    """

    ctx_k: jax.Array
    ctx_v: jax.Array
    pad: jax.Array
    proj: Any


@dataclasses.dataclass(frozen=True)
class DFlashDrafter(Drafter):
    """The DFlash drafter (module docstring) as a :class:`~jaxspec.core.drafters.Drafter`.

    Attributes:
      spec: the drafter's :class:`DFlashSpec`; its weights are ``drafter_params``
        (:func:`drafter_params`), traced.
      sampling: the target's temperature / top-k / top-p (drafts are sampled from the
        drafter's distribution after the same processing); ignored under greedy decoding.
      block_size: the block size asked for (None: the spec's).
      verify_length: drafts verified per step, ``1 .. B - 1`` (None: ``B - 1``): the drafter
        still forwards its whole trained block and the verifier checks its first
        ``verify_length`` drafts (a shorter verification pass where the later positions are
        rarely accepted; the LM head runs on those rows only). Exactness is unchanged.

    Capabilities: ``feature_layers`` (the spec's ``layer_ids``) and
    :meth:`absorb_features`, read by :mod:`jaxspec.causal.decode`.

    Raises:
      ValueError: a block size the drafter was not built for, a ``verify_length`` outside
        ``1 .. B - 1``; at trace time, target hidden
        states whose width or layer count differ from the spec's, or sampled decoding with a
        greedy ``sampling``.
    """

    spec: DFlashSpec
    sampling: SamplingConfig = SamplingConfig()
    block_size: Optional[int] = None
    verify_length: Optional[int] = None

    name = "dflash"
    proposal_skippable = True  # propose keeps the state; the features come from the target

    def __post_init__(self):
        B = self.spec.block_size
        if self.block_size is not None and self.block_size != B:
            raise ValueError(
                f"block size {self.block_size}: this DFlash drafter was built for block size {B}"
            )
        if self.verify_length is not None and not 1 <= self.verify_length <= B - 1:
            raise ValueError(
                f"draft length {self.verify_length} (block size {self.verify_length + 1}): "
                f"this DFlash drafter was built for block size {B}, which drafts 1 to "
                f"{B - 1} tokens per step"
            )

    @property
    def draft_length(self) -> int:
        """``k``: ``verify_length``, else ``B - 1`` (the block's anchor is the last emitted
        token)."""
        return self.spec.block_size - 1 if self.verify_length is None else self.verify_length

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """Target layers whose hidden states every target pass returns to the drafter."""
        return self.spec.layer_ids

    # -- the Drafter protocol -------------------------------------------------------------
    def init_state(self, params, ctx: DraftContext) -> DFlashState:
        """An empty context cache of ``S`` slots (the prompt pass fills it)."""
        s, own = self.spec, params["draft"]
        B, S = ctx.buffer.shape
        z = jnp.zeros((s.num_layers, B, s.num_kv_heads, S, s.head_dim), own["hidden_norm"].dtype)
        blocks = own["blocks"]
        if isinstance(blocks, tuple):  # per-layer panels (panel_layout)
            blocks = tuple({n: lp[n] for n in _KV_ENTRIES if n in lp} for lp in blocks)
        else:
            blocks = {n: blocks[n] for n in ("wk", "wv", "k_norm")}
        fc = {n: own[n] for n in ("fc", "fc_p") if n in own}
        features = {**fc, "hidden_norm": own["hidden_norm"], "blocks": blocks}
        return DFlashState(ctx_k=z, ctx_v=z, pad=ctx.pad, proj=features)

    def absorb_features(
        self, state: DFlashState, first_slot: jax.Array, hidden: jax.Array
    ) -> DFlashState:
        """Project a target pass's hidden states ``(B, T, n, D)``, fed from slot
        ``first_slot (B,)``, into the context cache (slots ``first_slot .. + T``)."""
        s = self.spec
        if hidden.shape[2:] != (len(s.layer_ids), s.target_hidden):
            raise ValueError(
                f"target hidden states of shape {hidden.shape[2:]} (layers, width); "
                f"the DFlash drafter was built for "
                f"{(len(s.layer_ids), s.target_hidden)}"
            )
        T = hidden.shape[1]
        slots = first_slot[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
        k, v = context_kv(
            s,
            state.proj,
            hidden.astype(state.ctx_k.dtype),
            jnp.maximum(slots - state.pad[:, None], 0),
        )

        def write(cache, new):  # (l, B, K, S, Dh) <- (l, B, K, T, Dh) at per-row slots
            return jax.vmap(
                lambda c, n, i: jax.lax.dynamic_update_slice(c, n, (0, 0, i, 0)),
                in_axes=(1, 1, 0),
                out_axes=1,
            )(cache, new.astype(cache.dtype), first_slot)

        return state.replace(ctx_k=write(state.ctx_k, k), ctx_v=write(state.ctx_v, v))

    def update(self, params, state, ctx: DraftContext, n_accepted: jax.Array):
        """Nothing to do: the verification pass's features arrived via
        :meth:`absorb_features`, and the next proposal masks the stale ones."""
        return state

    def propose(self, params, state: DFlashState, ctx: DraftContext, key: jax.Array, sample: bool):
        """One drafter forward over the trained block of ``B`` rows: ``k`` drafts per row
        (:attr:`draft_length`).

        Returns:
          ``(Draft, state)``: tokens int32 ``(B, k)``; ``q`` float32 ``(B, k, V)`` (``None``
          when greedy); ``has_draft`` all True; ``length`` ``k``; ``nfe`` 1.
        """
        if sample and self.sampling.greedy:
            raise ValueError(
                "sampled decoding needs the drafter's sampling config (temperature "
                "> 0): build DFlashDrafter with the target's SamplingConfig"
            )
        B, k = ctx.buffer.shape[0], self.draft_length
        # phases looked up at trace time (jaxspec.testing.mutants swaps them in tests)
        anchor, pos, ctx_mask = block_frame(ctx, self.spec.block_size)
        logits = block_logits(
            self.spec, params, anchor, pos, state.ctx_k, state.ctx_v, ctx_mask, rows=k
        )
        tokens, q = draw_drafts(key, logits, self.sampling, sample)
        ones = jnp.ones((B,), jnp.int32)
        return Draft(
            tokens=tokens,
            q=q,
            has_draft=jnp.ones((B,), bool),
            length=k * ones,
            nfe=ones,
        ), state


# ----------------------------------------------------------------------------- registry entry


@dataclasses.dataclass(frozen=True)
class Config(DraftedConfig):
    """The ``dflash`` method (the registry's entry; :class:`DraftedConfig` has the shared
    knobs). ``draft_length`` is ``B - 1`` of the drafter's block (default 15: ``B = 16``) or
    fewer: the verifier then checks the block's first ``draft_length`` drafts
    (:attr:`DFlashDrafter.verify_length`).

    Attributes:
      drafter_model: ``(DFlashSpec, own weights)`` of a trained drafter
        (:func:`load_drafter`); not compared or hashed.
      target_params: the target's parameters, whose embedding and LM head the drafter
        shares, when :meth:`drafter_params` is called without them (the decoders pass
        theirs); not compared or hashed.
      draft_vocab: token ids the drafter's LM head runs on (module docstring;
        :func:`load_draft_vocab`), or None for the whole vocabulary; not compared or hashed.
      ngram_first: rows whose context has a suffix match draft the n-gram copy instead, and
        the drafter's forward is skipped when every row has one
        (:class:`~jaxspec.core.drafters.LookupFirst`; not in the DFlash paper). Exact either
        way.
      max_ngram, min_ngram: the suffix lengths the lookup tries (``ngram_first`` only).

    Raises:
      ValueError: a drafter built for another target (:meth:`DFlashSpec.check_target`), a
        draft length above its block's ``B - 1``; :meth:`drafter_params` without the target's
        parameters or with a bad draft vocabulary (:func:`check_draft_vocab`).
    """

    drafter_model: Any = dataclasses.field(default=None, compare=False)
    target_params: Any = dataclasses.field(default=None, compare=False)
    draft_vocab: Any = dataclasses.field(default=None, compare=False)
    ngram_first: bool = False
    max_ngram: int = 3
    min_ngram: int = 2

    default_draft_length: ClassVar[int] = 15
    needs: ClassVar[Needs] = Needs()

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.ngram_first, bool):
            raise TypeError(f"--ngram-first must be a bool, got {self.ngram_first!r}")
        check_ngram_range(self.max_ngram, self.min_ngram)
        if not self.ngram_first and (self.max_ngram, self.min_ngram) != (3, 2):
            raise ValueError("--max-ngram / --min-ngram apply to dflash with --ngram-first only")

    def drafter(self, target_config) -> Drafter:
        """The :class:`DFlashDrafter` for ``target_config`` (behind the n-gram lookup with
        ``ngram_first``)."""
        if self.drafter_model is None:
            raise ValueError("the dflash method needs a trained drafter (drafter_model)")
        spec = self.drafter_model[0]
        spec.check_target(target_config)
        d = DFlashDrafter(spec, self.sampling, verify_length=self.k)
        if self.ngram_first:
            return LookupFirst(d, max_ngram=self.max_ngram, min_ngram=self.min_ngram)
        return d

    def describe(self) -> str:
        if not self.ngram_first:
            return ""
        return f"(ngram first, suffix {self.min_ngram}..{self.max_ngram})"

    def drafter_params(self, target_params: Any = None) -> Any:
        """The drafter's own weights and the target's embedding / LM head, from
        ``target_params`` (the decoders pass theirs) or the config's ``target_params``."""
        shared = self.target_params if target_params is None else target_params
        if shared is None:
            raise ValueError(
                "the DFlash drafter shares the target's embedding and LM head: "
                "pass the target's parameters"
            )
        return drafter_params(self.drafter_model[1], shared, self.draft_vocab)
