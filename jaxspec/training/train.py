"""Training masked-diffusion LMs: objective, LoRA delta, train loop, checkpoints, metrics.

Objective (LLaDA, Nie et al. 2025, "Large Language Diffusion Models", Eq. 3 and the
ML-GSAI/LLaDA ``GUIDELINES.md`` pre-training / SFT snippets): per sequence draw
``t ~ U(0, 1)`` and set ``p = (1 - eps) * t + eps`` (so ``p`` lies in ``(eps, 1]``; ``eps``
= 1e-3 as in the guidelines, keeping ``1/p`` bounded); mask every maskable token
independently with probability ``p``; the loss is the cross-entropy of the masked tokens,
each weighted by ``1/p``:

* pre-training: ``sum_{masked} CE / p`` divided by ``B * T`` (all tokens of the batch);
* SFT (``response_mask`` given): only response tokens are maskable, and each sequence's sum is
  divided by its response length, then averaged over the batch.

Dream variant (Dream 7B, Ye et al. 2025): the model is an adapted autoregressive LM whose raw
logits at ``i`` predict token ``i + 1``; :class:`models.diffusion.modeling.DiffusionLM` with head
``"dream"`` already shifts them right by one, so row ``i`` scores token ``i`` and the same loss
code applies. Position 0 has no predicting row after the shift and is never masked (Dream's
sampler asserts the same). Dream's context-adaptive noise rescheduling (CART) is not
implemented: the plain LLaDA ``1/p`` weighting is used for both heads.

Parameter-efficient adaptation (for ``dream-smollm2-135m``): the trainable *delta* is

* LoRA factors ``a (L, in, r)`` (Gaussian, std ``1/sqrt(in)``) and ``b (L, r, out)`` (zeros) for
  each targeted stacked matrix of ``params["layers"]`` (``wq wk wv wo w_gate w_up w_down``);
  the merged weight is ``W + (alpha / r) * a @ b`` per layer (Hu et al. 2021, LoRA);
* ``mask_embed (D,)``: the embedding row of the mask token (initialised from the base row);
* ``norms``: ``attn_norm (L, D)``, ``mlp_norm (L, D)``, ``final_norm (D,)``.

Only the delta and its optimiser state are checkpointed; the frozen base is reloaded from
its preset. :func:`merge_delta` builds the full inference tree; :func:`save_delta` /
:func:`load_delta` store the delta as safetensors (all three live in :mod:`models.diffusion.delta`).

AS-ARM objective (``objective.kind: asarm``): the teacher-forced joint loss of ASSD (Eq. 7) on
an XLNet (:mod:`models.xlnet.modeling`), with the lattice order, prompt-length sampler and masking-rate
warmup of :mod:`jaxspec.training.asarm` (config section ``asarm``). The same loop, optimiser,
checkpoints and metrics serve both objectives; an AS-ARM run also writes ``vocab.json`` and, at
the stop, ``model.safetensors`` (float16, :func:`models.xlnet.modeling.save_xlnet`).

Exact resume: the masking key of step ``s`` is ``fold_in(PRNGKey(seed), s)`` and its batch is
``PackedDataset.batch(s, ...)``, both pure functions of ``s``; checkpoints (orbax) hold the
trainable tree, the optimiser state and the step count, so a resumed run reproduces the
uninterrupted run bit for bit on the same machine.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import yaml

from jaxspec.training.asarm import AsarmSection
from models.config import ModelConfig
from models.diffusion.modeling import DiffusionConfig, DiffusionLM

# The delta format lives in models.diffusion.delta (model presets merge deltas without importing jaxspec);
# re-exported here under the same names.
from models.diffusion.delta import LORA_TARGETS, NORM_NAMES, _flatten, load_delta, merge_delta, save_delta  # noqa: E402,F401


class TrainConfigError(ValueError):
    """Malformed training config (unknown section or key, bad value) or unusable out dir."""


# --------------------------------------------------------------------------- config
@dataclasses.dataclass
class ModelSection:
    """``init``: ``"scratch"`` (random init from the fields below) or ``"preset"`` (weights of
    ``preset`` from ``configs/models``). ``tokenizer``: preset whose tokenizer encodes the
    data (defaults to ``preset``). ``vocab_size`` None means the tokenizer's."""

    init: str = "scratch"
    preset: Optional[str] = None
    tokenizer: Optional[str] = None
    head: str = "llada"
    mask_token_id: Optional[int] = None
    arch: str = "llama"
    vocab_size: Optional[int] = None
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = True
    max_position_embeddings: int = 2048


@dataclasses.dataclass
class LoraSection:
    rank: int = 16
    alpha: float = 32.0
    targets: tuple = LORA_TARGETS
    train_norms: bool = True
    train_mask_embed: bool = True


@dataclasses.dataclass
class DataSection:
    """``source``: ``"stdlib"`` (see :mod:`jaxspec.training.data`). ``batch_size`` sequences per
    micro-batch of ``seq_len`` tokens; ``holdout``: validation modules."""

    source: str = "stdlib"
    seq_len: int = 128
    batch_size: int = 8
    holdout: tuple = ()


OBJECTIVES = ("diffusion", "asarm")


@dataclasses.dataclass
class ObjectiveSection:
    """``kind``: ``"diffusion"`` (LLaDA / Dream masked diffusion, ``eps``) or ``"asarm"`` (ASSD
    Eq. 7 on an XLNet; settings in the ``asarm`` section)."""

    kind: str = "diffusion"
    eps: float = 1e-3


@dataclasses.dataclass
class OptimSection:
    """AdamW with linear warmup then cosine decay to ``lr * min_lr_ratio`` at the last step;
    global-norm clipping; ``grad_accum`` micro-batches averaged per update."""

    lr: float = 1e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.95
    adam_eps: float = 1e-8
    clip_norm: float = 1.0
    grad_accum: int = 1


@dataclasses.dataclass
class TrainSection:
    steps: int = 1000
    seed: int = 0
    ckpt_every: int = 100
    eval_every: int = 100
    eval_batches: int = 4
    log_every: int = 10
    keep_checkpoints: int = 2
    ckpt_every_s: Optional[float] = None  # also checkpoint when this many wall seconds passed
    # steps of an earlier run this one continues (asarm.init_weights): step s draws the data
    # batch, masking keys and masking-rate schedule of step s + data_offset, so the continued
    # run sees new batches and masks instead of replaying the earlier run's
    data_offset: int = 0


@dataclasses.dataclass
class TrainConfig:
    name: str = "unnamed"
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    data: DataSection = dataclasses.field(default_factory=DataSection)
    objective: ObjectiveSection = dataclasses.field(default_factory=ObjectiveSection)
    optim: OptimSection = dataclasses.field(default_factory=OptimSection)
    train: TrainSection = dataclasses.field(default_factory=TrainSection)
    lora: Optional[LoraSection] = None
    asarm: Optional[AsarmSection] = None

    def to_dict(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self)))


_SECTIONS = {"model": ModelSection, "data": DataSection, "objective": ObjectiveSection,
             "optim": OptimSection, "train": TrainSection, "lora": LoraSection,
             "asarm": AsarmSection}


def config_from_dict(d: dict) -> TrainConfig:
    """Build a :class:`TrainConfig`; lists become tuples.

    Raises:
      TrainConfigError: unknown section or key.
    """
    d = dict(d or {})
    kw: dict[str, Any] = {"name": str(d.pop("name", "unnamed"))}
    for sec, val in d.items():
        if sec not in _SECTIONS:
            raise TrainConfigError(f"unknown config section {sec!r}; expected {', '.join(_SECTIONS)}")
        if val is None:
            kw[sec] = None
            continue
        cls = _SECTIONS[sec]
        names = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(val) - names)
        if bad:
            raise TrainConfigError(f"unknown key(s) {bad} in section {sec!r}; expected {sorted(names)}")
        kw[sec] = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in val.items()})
    cfg = TrainConfig(**kw)
    if cfg.objective.kind not in OBJECTIVES:
        raise TrainConfigError(f"unknown objective.kind {cfg.objective.kind!r}; expected one of {OBJECTIVES}")
    if cfg.objective.kind == "asarm":
        if cfg.asarm is None:
            cfg.asarm = AsarmSection()
        if cfg.lora is not None:
            raise TrainConfigError("objective.kind = asarm does not support a lora section")
    if int(cfg.train.data_offset) < 0:
        raise TrainConfigError(f"train.data_offset must be >= 0, got {cfg.train.data_offset}")
    if cfg.asarm is not None and cfg.asarm.init_weights and cfg.asarm.embed_init:
        raise TrainConfigError("asarm.init_weights and asarm.embed_init exclude each other "
                               "(the start weights already hold the embedding)")
    return cfg


def load_config(path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a YAML config and apply ``section.key=value`` overrides (values parsed as YAML).

    Raises:
      TrainConfigError: missing file, malformed override, unknown key.
    """
    path = Path(path)
    if not path.is_file():
        raise TrainConfigError(f"config file {path} not found")
    d = yaml.safe_load(path.read_text()) or {}
    for ov in overrides:
        if "=" not in ov or "." not in ov.split("=", 1)[0]:
            raise TrainConfigError(f"override {ov!r} is not of the form section.key=value")
        k, v = ov.split("=", 1)
        sec, key = k.split(".", 1)
        if d.get(sec) is None:
            d[sec] = {}
        d[sec][key] = yaml.safe_load(v)
    return config_from_dict(d)


# --------------------------------------------------------------------------- objective
def forward_process(key: jax.Array, tokens: jax.Array, mask_token_id: int,
                    maskable: Optional[jax.Array] = None, eps: float = 1e-3):
    """LLaDA forward (noising) process.

    Args:
      key: PRNG key.
      tokens: ``int32 (B, T)`` clean tokens.
      mask_token_id: id written at masked positions.
      maskable: ``bool (B, T)``; positions that may be masked (default all).
      eps: lower bound of the mask probability.

    Returns:
      ``(noisy int32 (B, T), masked bool (B, T), p float32 (B,))`` with
      ``p = (1 - eps) * t + eps``, ``t ~ U(0, 1)`` per sequence.
    """
    B, T = tokens.shape
    kt, km = jax.random.split(key)
    t = jax.random.uniform(kt, (B,), jnp.float32)
    p = (1.0 - eps) * t + eps
    masked = jax.random.uniform(km, (B, T), jnp.float32) < p[:, None]
    if maskable is not None:
        masked = masked & maskable
    noisy = jnp.where(masked, jnp.int32(mask_token_id), tokens.astype(jnp.int32))
    return noisy, masked, p


def masked_diffusion_loss(logits: jax.Array, targets: jax.Array, masked: jax.Array,
                          p_mask: jax.Array, response_len: Optional[jax.Array] = None):
    """LLaDA's weighted masked cross-entropy.

    Args:
      logits: ``float (B, T, V)``; row ``i`` scores the token at position ``i`` (for Dream,
        the already shifted logits).
      targets: ``int32 (B, T)`` clean tokens.
      masked: ``bool (B, T)`` masked positions (the only ones scored).
      p_mask: ``float32 (B,)`` mask probability of each sequence.
      response_len: ``(B,)`` response lengths in SFT mode, or None (pre-training).

    Returns:
      ``(loss float32 scalar, aux)`` with ``loss = sum_masked CE / p / (B * T)`` (pre-training)
      or ``mean_b [sum_{masked in b} CE / p_b / response_len_b]`` (SFT); ``aux`` holds
      ``ce_sum`` (unweighted CE summed over masked tokens), ``n_masked`` and ``n_correct``
      (argmax hits at masked positions).
    """
    B, T = targets.shape
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    tgt = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    ce = lse - tgt
    m = masked.astype(jnp.float32)
    weighted = ce * m / p_mask[:, None]
    if response_len is None:
        loss = jnp.sum(weighted) / (B * T)
    else:
        loss = jnp.mean(jnp.sum(weighted, axis=1) / jnp.maximum(response_len.astype(jnp.float32), 1.0))
    hit = (jnp.argmax(logits, axis=-1) == targets) & masked
    aux = {"ce_sum": jnp.sum(ce * m), "n_masked": jnp.sum(m), "n_correct": jnp.sum(hit.astype(jnp.float32))}
    return loss, aux


def maskable_positions(config: DiffusionConfig, shape, response_mask=None) -> jax.Array:
    """``bool (B, T)``: positions the forward process may mask (response tokens in SFT mode;
    never position 0 for the Dream head, which has no row predicting it)."""
    B, T = shape
    m = jnp.ones((B, T), bool) if response_mask is None else jnp.asarray(response_mask, bool)
    if config.head == "dream":
        m = m.at[:, 0].set(False)
    return m


def diffusion_loss(model: DiffusionLM, params, tokens: jax.Array, key: jax.Array,
                   eps: float = 1e-3, response_mask: Optional[jax.Array] = None):
    """Noise ``tokens`` (``int32 (B, T)``), run ``model`` bidirectionally and score the masked
    tokens with :func:`masked_diffusion_loss`. ``response_mask`` (``bool (B, T)``) selects
    SFT mode. Returns ``(loss, aux)``."""
    cfg = model.config
    B, T = tokens.shape
    maskable = maskable_positions(cfg, (B, T), response_mask)
    noisy, masked, p = forward_process(key, tokens, cfg.mask_token_id, maskable, eps)
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    logits, _ = model.apply(params, noisy, positions)
    rlen = None if response_mask is None else jnp.sum(jnp.asarray(response_mask, jnp.float32), axis=1)
    return masked_diffusion_loss(logits, tokens, masked, p, rlen)


# --------------------------------------------------------------------------- LoRA delta
def init_delta(base, lora: LoraSection, mask_token_id: int, key: jax.Array):
    """Initial trainable delta for ``base`` (the ``CausalLM`` params tree).

    Returns a dict ``{"lora": {name: {"a": (L, in, r), "b": (L, r, out)}}, "mask_embed": (D,),
    "norms": {...}}`` (float32); ``b`` is zero so the merged model equals the base.

    Raises:
      TrainConfigError: an unknown LoRA target or a non-positive rank.
    """
    if lora.rank <= 0:
        raise TrainConfigError(f"lora.rank must be positive, got {lora.rank}")
    layers = base["layers"]
    delta: dict[str, Any] = {"lora": {}}
    for i, name in enumerate(lora.targets):
        if name not in LORA_TARGETS or name not in layers:
            raise TrainConfigError(f"unknown LoRA target {name!r}; expected some of {LORA_TARGETS}")
        L, din, dout = layers[name].shape
        a = jax.random.normal(jax.random.fold_in(key, i), (L, din, lora.rank), jnp.float32) / math.sqrt(din)
        delta["lora"][name] = {"a": a, "b": jnp.zeros((L, lora.rank, dout), jnp.float32)}
    if lora.train_mask_embed:
        delta["mask_embed"] = jnp.array(base["embed"][mask_token_id], jnp.float32, copy=True)
    if lora.train_norms:
        copy = lambda x: jnp.array(x, jnp.float32, copy=True)  # never alias the base
        delta["norms"] = {"attn_norm": copy(layers["attn_norm"]), "mlp_norm": copy(layers["mlp_norm"]),
                          "final_norm": copy(base["final_norm"])}
    return delta


# --------------------------------------------------------------------------- setup
def build_model(cfg: TrainConfig, log=lambda m: print(m, file=sys.stderr)):
    """``(DiffusionLM, initial params or base params, tokenizer or None)`` for ``cfg.model``.

    Raises:
      TrainConfigError: unknown ``init``, missing ``preset``/``mask_token_id``/``vocab_size``.
    """
    m = cfg.model
    if m.mask_token_id is None:
        raise TrainConfigError("model.mask_token_id is required")
    tok = None
    if m.init == "preset":
        if not m.preset:
            raise TrainConfigError("model.init = preset needs model.preset")
        from models.registry import load_model

        causal, params, tok, _ = load_model(m.preset, log=log)
        base = causal.config
    elif m.init == "scratch":
        from models.llama.modeling import init_params

        vocab = m.vocab_size
        if m.tokenizer:
            tok = load_tokenizer_preset(m.tokenizer, log)
            vocab = vocab or tok.vocab_size
        if vocab is None:
            raise TrainConfigError("model.vocab_size or model.tokenizer is required for scratch init")
        base = ModelConfig(arch=m.arch, vocab_size=int(vocab), hidden_size=m.hidden_size,
                           intermediate_size=m.intermediate_size, num_layers=m.num_layers,
                           num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
                           rope_theta=m.rope_theta, rms_norm_eps=m.rms_norm_eps,
                           tie_embeddings=m.tie_embeddings, qkv_bias=(m.arch == "qwen2"),
                           max_position_embeddings=m.max_position_embeddings)
        params = init_params(base, cfg.train.seed)
    else:
        raise TrainConfigError(f"model.init must be 'scratch' or 'preset', got {m.init!r}")
    dcfg = DiffusionConfig(base=base, head=m.head, mask_token_id=int(m.mask_token_id))
    return DiffusionLM(dcfg), params, tok


def load_tokenizer_preset(name: str, log):
    from models.registry import fetch
    from models.tokenizer import load_tokenizer

    return load_tokenizer(fetch(name, log=log))


def build_data(cfg: TrainConfig, tokenizer, mask_token_id: int, log=lambda m: print(m, file=sys.stderr)):
    """``(train PackedDataset, val PackedDataset, meta)`` from ``cfg.data``.

    Raises:
      TrainConfigError: unknown source, or no tokenizer.
    """
    from jaxspec.training.data import PackedDataset, stdlib_tokens

    if cfg.data.source != "stdlib":
        raise TrainConfigError(f"unknown data.source {cfg.data.source!r}; expected 'stdlib'")
    if tokenizer is None:
        raise TrainConfigError("the stdlib corpus needs a tokenizer (model.tokenizer or a preset)")
    sep = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else 0
    specials = [i for i in range(min(tokenizer.vocab_size, 64))
                if (t := tokenizer.id_to_token(i)) and t.startswith("<") and t.endswith(">") and i != sep]
    drop = set(specials) | {mask_token_id}
    train, val, meta = stdlib_tokens(tokenizer, cfg.data.holdout, sep_id=sep, drop_ids=drop, log=log)
    return (PackedDataset(train, cfg.data.seq_len, cfg.train.seed),
            PackedDataset(val, cfg.data.seq_len, cfg.train.seed), meta)


def make_optimizer(cfg: TrainConfig):
    """``(optax transform, schedule)``: clip by global norm, then AdamW (weight decay only on
    leaves with ndim >= 2) under a warmup + cosine schedule over ``cfg.train.steps``."""
    o = cfg.optim
    steps = max(cfg.train.steps, 1)
    warm = min(o.warmup_steps, steps - 1) if steps > 1 else 0
    sched = optax.warmup_cosine_decay_schedule(
        init_value=0.0 if warm > 0 else o.lr, peak_value=o.lr, warmup_steps=warm,
        decay_steps=max(steps, warm + 1), end_value=o.lr * o.min_lr_ratio)
    decay_mask = lambda tree: jax.tree.map(lambda x: x.ndim >= 2, tree)
    tx = optax.chain(optax.clip_by_global_norm(o.clip_norm),
                     optax.adamw(sched, b1=o.b1, b2=o.b2, eps=o.adam_eps,
                                 weight_decay=o.weight_decay, mask=decay_mask))
    return tx, sched


# --------------------------------------------------------------------------- train loop
def _read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_metrics(metrics_path, png_path, title: str = "") -> None:
    """Loss curve (train loss per logged step, held-out loss per eval) as a PNG."""
    from jaxspec.core.plotting import pyplot

    plt = pyplot()

    rows = _read_metrics(Path(metrics_path))
    tr = [(r["step"], r["loss"]) for r in rows if r.get("kind") == "train"]
    va = [(r["step"], r["val_loss"]) for r in rows if r.get("kind") == "eval"]
    fig, ax = plt.subplots(figsize=(6, 4))
    if tr:
        ax.plot(*zip(*tr), label="train loss", lw=1)
    if va:
        ax.plot(*zip(*va), "o-", label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (objective: see config)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


@functools.lru_cache(maxsize=8)
def _compiled_fns(model: DiffusionLM, cfg_json: str):
    """``(jitted train step, jitted eval loss, optax transform, schedule)`` for a model and
    config; cached so repeated :func:`train` calls in one process (resume, tests) compile once.

    The step ``(trainable, opt_state, base, batch (A, B, T), step) -> (trainable, opt_state,
    stats)`` averages the gradients of the ``A`` micro-batches (key of micro-batch ``i``:
    ``fold_in(fold_in(PRNGKey(seed), step), i)``) and applies one optimiser update; it donates
    ``trainable`` and ``opt_state``.
    """
    cfg = config_from_dict({**json.loads(cfg_json)})
    seed, eps, accum = cfg.train.seed, cfg.objective.eps, cfg.optim.grad_accum
    asarm = cfg.objective.kind == "asarm"
    if asarm:
        full = lambda tr, b: tr
    elif cfg.lora is not None:
        rank, alpha, mid = cfg.lora.rank, cfg.lora.alpha, model.config.mask_token_id
        full = lambda tr, b: merge_delta(b, tr, alpha=alpha, rank=rank, mask_token_id=mid)
    else:
        full = lambda tr, b: tr
    tx, sched = make_optimizer(cfg)

    def loss_fn(tr, b, tokens, key, step):
        if asarm:
            from jaxspec.training.asarm import asarm_loss

            return asarm_loss(model, tr, tokens, key, step, cfg.asarm)
        return diffusion_loss(model, full(tr, b), tokens, key, eps)

    def step_fn(tr, opt, b, batch, step):
        key = jax.random.fold_in(jax.random.PRNGKey(seed), step)

        def micro(carry, xs):
            gsum, lsum, asum = carry
            mb, i = xs
            (loss, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(tr, b, mb, jax.random.fold_in(key, i), step)
            return (jax.tree.map(jnp.add, gsum, g), lsum + loss, jax.tree.map(jnp.add, asum, aux)), None

        zeros = jax.tree.map(jnp.zeros_like, tr)
        azero = {k: jnp.float32(0) for k in ("ce_sum", "n_masked", "n_correct")}
        (g, lsum, asum), _ = jax.lax.scan(micro, (zeros, jnp.float32(0), azero),
                                          (batch, jnp.arange(accum, dtype=jnp.int32)))
        g = jax.tree.map(lambda x: x / accum, g)
        gnorm = optax.tree.norm(g)
        upd, opt = tx.update(g, opt, tr)
        tr = optax.apply_updates(tr, upd)
        stats = {"loss": lsum / accum, "grad_norm": gnorm,
                 "masked_acc": asum["n_correct"] / jnp.maximum(asum["n_masked"], 1.0)}
        return tr, opt, stats

    # held-out loss at the end-of-warmup masking range for AS-ARMs (fixed keys per batch)
    eval_step = cfg.asarm.mask_warmup_steps if asarm else 0

    def eval_fn(tr, b, tokens, i):
        return loss_fn(tr, b, tokens, jax.random.fold_in(jax.random.PRNGKey(seed + 1), i), eval_step)

    return jax.jit(step_fn, donate_argnums=(0, 1)), jax.jit(eval_fn), tx, sched


def train(cfg: TrainConfig, out_dir, *, resume: bool = False, stop_after: Optional[int] = None,
          datasets=None, model_and_params=None, progress: bool = True,
          log=lambda m: print(m, file=sys.stderr)) -> dict:
    """Train (or resume) per ``cfg``; writes under ``out_dir``:

    ``config.json``, ``checkpoints/<step>/`` (orbax; trainable tree + optimiser state + step;
    every ``ckpt_every`` steps and at the stop), ``metrics.jsonl``, ``loss.png``, and for LoRA
    runs ``delta.safetensors``.

    ``metrics.jsonl`` rows: ``{"kind": "train", "step", "loss", "grad_norm", "masked_acc",
    "lr", "tokens_seen", "sec_per_step", "tokens_per_sec"}`` every ``log_every`` steps (the
    first interval includes compilation) and ``{"kind": "eval", "step", "val_loss",
    "val_masked_acc"}`` every ``eval_every`` steps on ``eval_batches`` fixed held-out batches
    with fixed masking keys. On resume, rows after the restored step are dropped first.

    Args:
      cfg: the config; ``cfg.train.steps`` fixes the schedule.
      out_dir: output directory.
      resume: continue from the latest checkpoint in ``out_dir`` (fresh start if none).
      stop_after: stop once this many steps are done (simulates an interruption; the
        schedule still spans ``cfg.train.steps``).
      datasets: optional ``(train, val)`` :class:`jaxspec.training.data.PackedDataset` (tests);
        default builds the corpus of ``cfg.data``.
      model_and_params: optional ``(DiffusionLM, params)`` replacing :func:`build_model`.
      progress: show a tqdm progress bar.

    Returns:
      dict with ``step`` (steps done), ``trainable`` (final trainable tree), ``losses``
      (``{step: loss}`` of this run's logged steps), ``delta_bytes`` (LoRA) and timing.

    Raises:
      TrainConfigError: ``out_dir`` already has checkpoints and ``resume`` is False.
    """
    import orbax.checkpoint as ocp
    from tqdm.auto import tqdm

    out = Path(out_dir).resolve()
    ckdir = out / "checkpoints"
    mpath = out / "metrics.jsonl"
    if ckdir.exists() and any(ckdir.iterdir()) and not resume:
        raise TrainConfigError(f"{out} already holds checkpoints: pass --resume or another --out")
    out.mkdir(parents=True, exist_ok=True)

    tok = None
    asarm = cfg.objective.kind == "asarm"
    vocab = None
    if asarm:
        if model_and_params is None or datasets is None:
            from jaxspec.training.asarm import build_asarm

            model, params, tok, vocab, built = build_asarm(cfg, log)
            train_ds, val_ds = datasets if datasets is not None else built
            if model_and_params is not None:
                model, params = model_and_params
        else:
            model, params = model_and_params
            train_ds, val_ds = datasets
        from jaxspec.training.asarm import prior_training

        prior_training(cfg, out)  # records the start weights' step / tokens (continued runs)
        if vocab is not None:
            (out / "vocab.json").write_text(json.dumps({"ids": list(vocab.ids),
                                                         "external_size": vocab.external_size}))
    else:
        if model_and_params is None:
            model, params, tok = build_model(cfg, log)
        else:
            model, params = model_and_params
        if datasets is None:
            train_ds, val_ds, _ = build_data(cfg, tok, model.config.mask_token_id, log)
        else:
            train_ds, val_ds = datasets
    dcfg = model.config

    seed = cfg.train.seed
    if cfg.lora is not None:
        base = params
        trainable = init_delta(base, cfg.lora, dcfg.mask_token_id, jax.random.PRNGKey(seed + 7))
    else:
        base = {}
        trainable = params
    trainable = jax.tree.map(jnp.copy, trainable)  # the step donates its input buffers
    key = cfg.to_dict()
    for k in ("ckpt_every", "eval_every", "eval_batches", "log_every", "keep_checkpoints", "ckpt_every_s",
              "data_offset"):
        key["train"].pop(k)  # bookkeeping only: not part of the compiled computation
    jstep, eval_fn, tx, sched = _compiled_fns(model, json.dumps(key, sort_keys=True))
    opt_state = tx.init(trainable)
    accum, bs, T = cfg.optim.grad_accum, cfg.data.batch_size, cfg.data.seq_len

    val_batches = val_ds.fixed_batches(cfg.train.eval_batches, bs) if val_ds is not None else []

    def evaluate(tr):
        ls, nm, nc = 0.0, 0.0, 0.0
        for i, vb in enumerate(val_batches):
            loss, aux = eval_fn(tr, base, jnp.asarray(vb), jnp.int32(i))
            ls += float(loss)
            nm += float(aux["n_masked"])
            nc += float(aux["n_correct"])
        n = max(len(val_batches), 1)
        return {"val_loss": ls / n, "val_masked_acc": nc / max(nm, 1.0)}

    mngr = ocp.CheckpointManager(ckdir, options=ocp.CheckpointManagerOptions(
        max_to_keep=cfg.train.keep_checkpoints, create=True))
    start = 0
    if resume and mngr.latest_step() is not None:
        start = int(mngr.latest_step())
        target = {"trainable": trainable, "opt_state": opt_state, "step": np.asarray(0, np.int64)}
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        restored = mngr.restore(start, args=ocp.args.StandardRestore(abstract))
        trainable, opt_state = restored["trainable"], restored["opt_state"]
        if int(restored["step"]) != start:
            raise TrainConfigError(f"checkpoint {start} records step {int(restored['step'])}")
        kept = [r for r in _read_metrics(mpath) if r["step"] <= start]
        mpath.write_text("".join(json.dumps(r) + "\n" for r in kept))
        log(f"[train] resumed from step {start} ({ckdir / str(start)})")
    else:
        mpath.write_text("")
    cfg_path = out / "config.json"
    if resume and cfg_path.is_file() and json.loads(cfg_path.read_text()) != cfg.to_dict():
        log("[train] warning: config differs from the one this run started with; resume may not be exact")
    cfg_path.write_text(json.dumps(cfg.to_dict(), indent=1))

    def save(step):
        mngr.save(step, args=ocp.args.StandardSave(
            {"trainable": trainable, "opt_state": opt_state, "step": np.asarray(step, np.int64)}))
        mngr.wait_until_finished()  # the next step donates these buffers

    total = cfg.train.steps
    end = total if stop_after is None else min(total, stop_after)
    tokens_per_step = accum * bs * T
    losses: dict[int, float] = {}
    bar = tqdm(total=total, initial=start, disable=not progress, desc=cfg.name, dynamic_ncols=True)
    t_run = time.perf_counter()
    t_last, last_logged = time.perf_counter(), start
    t_saved = time.perf_counter()
    step_times = []
    with mpath.open("a") as mf:
        for s in range(start, end):
            t0 = time.perf_counter()
            sd = s + cfg.train.data_offset  # data / masking step (the lr schedule counts s)
            batch = train_ds.batch(sd, accum * bs).reshape(accum, bs, T)
            trainable, opt_state, stats = jstep(trainable, opt_state, base, jnp.asarray(batch), jnp.int32(sd))
            done = s + 1
            if done % cfg.train.log_every == 0 or done == end:
                stats = {k: float(v) for k, v in stats.items()}
                now = time.perf_counter()
                sps = (now - t_last) / (done - last_logged)
                t_last, last_logged = now, done
                rec = {"kind": "train", "step": done, **stats, "lr": float(sched(s)),
                       "tokens_seen": done * tokens_per_step, "sec_per_step": sps,
                       "tokens_per_sec": tokens_per_step / sps if sps > 0 else None}
                mf.write(json.dumps(rec) + "\n")
                mf.flush()
                losses[done] = stats["loss"]
                bar.set_postfix(loss=f"{stats['loss']:.4f}", acc=f"{stats['masked_acc']:.3f}")
            else:
                jax.block_until_ready(stats)
            step_times.append(time.perf_counter() - t0)
            bar.update(1)
            if val_batches and (done % cfg.train.eval_every == 0 or done == total):
                mf.write(json.dumps({"kind": "eval", "step": done, **evaluate(trainable)}) + "\n")
                mf.flush()
            timed = cfg.train.ckpt_every_s is not None and time.perf_counter() - t_saved >= cfg.train.ckpt_every_s
            if done % cfg.train.ckpt_every == 0 or done == end or timed:
                save(done)
                t_saved = time.perf_counter()
    bar.close()
    mngr.wait_until_finished()
    mngr.close()
    wall = time.perf_counter() - t_run
    plot_metrics(mpath, out / "loss.png", cfg.name)
    result = {"step": max(end, start), "trainable": trainable, "losses": losses, "wall_s": wall,
              "step_times": step_times, "tokens_per_step": tokens_per_step}
    if cfg.lora is not None:
        meta = {"base_preset": cfg.model.preset, "rank": cfg.lora.rank, "alpha": cfg.lora.alpha,
                "mask_token_id": dcfg.mask_token_id, "head": dcfg.head, "step": result["step"],
                "tokens_seen": result["step"] * tokens_per_step}
        result["delta_bytes"] = save_delta(out / "delta.safetensors", trainable, meta)
    if asarm:
        from models.xlnet.modeling import save_xlnet

        from jaxspec.training.asarm import run_meta

        meta = run_meta(cfg, out, result["step"], tokens_per_step)
        result["model_bytes"] = save_xlnet(out / "model.safetensors", dcfg, trainable, vocab, meta)
    return result


__all__ = ["TrainConfig", "TrainConfigError", "load_config", "config_from_dict", "forward_process",
           "masked_diffusion_loss", "maskable_positions", "diffusion_loss", "init_delta",
           "merge_delta", "save_delta", "load_delta", "build_model", "build_data",
           "make_optimizer", "plot_metrics", "train", "LORA_TARGETS"]
