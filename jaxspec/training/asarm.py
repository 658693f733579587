"""AS-ARM training: the teacher-forced joint loss of ASSD (Eq. 7) on the XLNet of
models/xlnet/modeling.py.

Source: Guo & Ermon, arXiv:2504.20456 (docs/methods/assd.md).

Objective (Eq. 7, Eq. 2, Appendix E.2): per sequence of ``N`` tokens draw a prompt length
``m`` and an order ``sigma`` following the recursive binary lattice (Eq. 4): take a uniform
random permutation, keep its first ``m`` entries as the prompt positions, and sort the prompt
part and the target part each in ascending order. One forward pass with the density mask
(Fig. 1b; :func:`models.xlnet.modeling.density_masks` with the default position order) yields
``log p(x_sigma(i) | x_sigma(<i))`` for every ``i >= m`` at once, so

    loss = - sum_b sum_{i >= m_b} log p(x_sigma(i) | x_sigma(<i)) / (B * N),

i.e. the batch mean of ``-log p(x_sigma(>=m) | x_sigma(<m))`` (Eq. 7) divided by the constant
``N`` (same optimum, loss on a per-token scale). Metrics also report the per-predicted-token
cross-entropy and top-1 accuracy.

Prompt lengths (Appendix E.2, E.3): the masking rate ``r = 1 - m / N`` is drawn from
``U[lo(s), hi(s)]`` where, at step ``s``, the range grows linearly from ``[start, start]`` to
``[mask_min, mask_max]`` over ``mask_warmup_steps`` (the paper: 15 % -> [90 %, 99 %] over 5000
steps). Within a batch the rates use a low-discrepancy (stratified) sampler as in Sahoo et al.
2024 (MDLM): ``t_b = (u + b / B) mod 1`` with one ``u ~ U(0, 1)``. ``m = N - round(r N)`` is
clipped to ``[1, N - 1]`` so every sequence has a prompt and a target.

Vocabulary: SmolLM2's 49152 ids are too many for a model of a few MB, so the model's vocabulary
is the ``asarm.vocab_size - 1`` SmolLM2 ids most frequent in the training split plus one UNK
(:class:`models.xlnet.modeling.CompactVocab`, stored with the weights so the model speaks SmolLM2
ids at its interface). The word embedding (tied to the LM head) can be initialised from a preset's
embedding rows, projected to ``d_model`` by PCA (top principal directions of the kept rows) and
rescaled to std ``asarm.init_std``.

The loop, optimiser, checkpoints (exact resume), metrics and plots are
:mod:`jaxspec.training.loop`'s (``objective.kind: asarm``; the config section ``asarm`` is
:class:`jaxspec.training.config.AsarmSection`); this module holds what is specific to AS-ARMs.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.training.build import build_data
from jaxspec.training.config import AsarmSection, TrainConfigError, config_from_dict
from jaxspec.training.data import PackedDataset
from models.diffusion.delta import load_delta
from models.registry import load_model, load_tokenizer_preset
from models.xlnet.modeling import (
    CompactVocab,
    WeightFileError,
    XLNetConfig,
    XLNetLM,
    density_masks,
    init_params,
    load_xlnet,
    save_xlnet,
)

INIT_RECORD = "init.json"


# --------------------------------------------------------------------------- sampling
def mask_rate_range(step, sec: AsarmSection):
    """``(lo, hi)`` float32 masking-rate bounds at ``step`` (Appendix E.3 linear warmup)."""
    w = max(int(sec.mask_warmup_steps), 1)
    frac = jnp.clip(jnp.asarray(step, jnp.float32) / w, 0.0, 1.0)
    lo = sec.mask_start + (sec.mask_min - sec.mask_start) * frac
    hi = sec.mask_start + (sec.mask_max - sec.mask_start) * frac
    return lo, hi


def low_discrepancy_uniform(key: jax.Array, n: int) -> jax.Array:
    """``float32 (n,)`` stratified uniforms ``(u + i / n) mod 1`` (one ``u ~ U(0, 1)``)."""
    u = jax.random.uniform(key, (), jnp.float32)
    return jnp.mod(u + jnp.arange(n, dtype=jnp.float32) / n, 1.0)


def prompt_lengths(key: jax.Array, batch: int, n: int, lo, hi) -> jax.Array:
    """``int32 (batch,)`` prompt lengths ``m = N - round(r N)``, ``r = lo + (hi - lo) t`` with
    stratified ``t``, clipped to ``[1, N - 1]``."""
    r = lo + (hi - lo) * low_discrepancy_uniform(key, batch)
    m = n - jnp.round(r * n).astype(jnp.int32)
    return jnp.clip(m, 1, n - 1)


def lattice_order(key: jax.Array, m: jax.Array, n: int):
    """Sample the prompt set and the lattice order of Appendix E.2.

    Args:
      key: PRNG key.
      m: ``int32 (B,)`` prompt lengths.
      n: sequence length N.

    Returns:
      ``(sigma int32 (B, N), visible bool (B, N))``: ``sigma_pre`` is a uniform permutation;
      ``visible`` marks its first ``m`` entries; ``sigma`` lists the prompt positions in
      ascending order, then the target positions in ascending order (Eq. 4).
    """
    B = m.shape[0]
    sigma_pre = jnp.argsort(jax.random.uniform(key, (B, n)), axis=-1)
    rank_pre = jnp.argsort(sigma_pre, axis=-1)
    visible = rank_pre < m[:, None]
    pos = jnp.arange(n, dtype=jnp.int32)
    sigma = jnp.argsort(jnp.where(visible, pos, pos + n), axis=-1).astype(jnp.int32)
    return sigma, visible


# --------------------------------------------------------------------------- loss
def joint_loss(model: XLNetLM, params, tokens: jax.Array, visible: jax.Array):
    """Teacher-forced joint loss (Eq. 7) for given prompts, lattice order (Eq. 4).

    Args:
      model: the XLNet.
      params: its parameters.
      tokens: ``int32 (B, N)`` clean tokens (model ids).
      visible: ``bool (B, N)`` prompt positions.

    Returns:
      ``(loss float32, aux)``: ``loss = sum_{masked} -log p(x_i | prompt, earlier masked) /
      (B N)``; ``aux``: ``ce_sum`` (summed over masked positions), ``n_masked``, ``n_correct``
      (argmax hits at masked positions).
    """
    cmask, qmask = density_masks(visible)
    logits, _ = model.apply(params, tokens, cmask, qmask)
    logits = logits.astype(jnp.float32)
    B, N = tokens.shape
    ce = (
        jax.nn.logsumexp(logits, axis=-1)
        - jnp.take_along_axis(logits, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
    )
    tgt = (~visible).astype(jnp.float32)
    hit = (jnp.argmax(logits, axis=-1) == tokens).astype(jnp.float32) * tgt
    aux = {"ce_sum": jnp.sum(ce * tgt), "n_masked": jnp.sum(tgt), "n_correct": jnp.sum(hit)}
    return jnp.sum(ce * tgt) / (B * N), aux


def asarm_loss(model: XLNetLM, params, tokens: jax.Array, key: jax.Array, step, sec: AsarmSection):
    """Sample prompt lengths (schedule at ``step``) and lattice orders, then :func:`joint_loss`."""
    B, N = tokens.shape
    km, ks = jax.random.split(key)
    lo, hi = mask_rate_range(step, sec)
    m = prompt_lengths(km, B, N, lo, hi)
    _, visible = lattice_order(ks, m, N)
    return joint_loss(model, params, tokens, visible)


# --------------------------------------------------------------------------- vocabulary / init
def build_vocab(stream: np.ndarray, vocab_size: int, external_size: int, keep=()) -> CompactVocab:
    """The ``vocab_size - 1`` most frequent ids of ``stream`` (ties: smaller id first), with
    the ids in ``keep`` (e.g. the separator) forced in, plus UNK."""
    counts = np.bincount(np.asarray(stream, np.int64).ravel(), minlength=external_size)
    order = np.argsort(-counts, kind="stable")
    n = vocab_size - 1
    chosen = [int(i) for i in keep]
    for i in order:
        if len(chosen) >= n:
            break
        if int(i) not in chosen:
            chosen.append(int(i))
    return CompactVocab(ids=tuple(chosen[:n]), external_size=int(external_size))


def projected_embeddings(
    big: np.ndarray, ids, d_model: int, std: float, seed: int = 0
) -> np.ndarray:
    """``float32 (len(ids) + 1, d_model)``: rows ``big[ids]`` centred and projected on their
    top ``d_model`` principal directions (PCA by SVD), rescaled to overall std ``std``; the
    last (UNK) row is small random noise. When ``big`` is narrower than ``d_model`` the
    remaining columns are zero before rescaling."""
    rows = np.asarray(big, np.float64)[np.asarray(ids, np.int64)]
    rows = rows - rows.mean(axis=0, keepdims=True)
    _, _, vt = np.linalg.svd(rows, full_matrices=False)
    k = min(d_model, vt.shape[0])
    proj = rows @ vt[:k].T
    out = np.zeros((len(ids), d_model))
    out[:, :k] = proj
    out *= std / max(out[:, :k].std() * np.sqrt(k / d_model), 1e-12)
    unk = np.random.default_rng(seed).normal(0.0, std, (1, d_model))
    return np.concatenate([out, unk]).astype(np.float32)


def xlnet_config(cfg) -> XLNetConfig:
    """:class:`XLNetConfig` from a :class:`jaxspec.training.config.TrainConfig` (model + asarm)."""
    m, a = cfg.model, cfg.asarm or AsarmSection()
    return XLNetConfig(
        vocab_size=int(a.vocab_size),
        d_model=m.hidden_size,
        n_layer=m.num_layers,
        n_head=m.num_heads,
        d_head=m.head_dim,
        d_inner=m.intermediate_size,
        layer_norm_eps=a.layer_norm_eps,
        clamp_len=a.clamp_len,
    )


def build_asarm(cfg, log=lambda m: print(m, file=sys.stderr)):
    """Model, initial params, tokenizer, compact vocabulary and datasets for an AS-ARM run.

    Returns:
      ``(XLNetLM, params, tokenizer, CompactVocab, (train, val) PackedDataset of model ids)``.

    Raises:
      jaxspec.training.config.TrainConfigError: no ``model.tokenizer``, or ``model.init`` not
        scratch.
    """
    a = cfg.asarm or AsarmSection()
    if cfg.model.init != "scratch":
        raise TrainConfigError(
            "objective.kind = asarm trains an XLNet from scratch (model.init: scratch)"
        )
    if not cfg.model.tokenizer:
        raise TrainConfigError("objective.kind = asarm needs model.tokenizer")
    tok = load_tokenizer_preset(cfg.model.tokenizer, log)
    # mask_token_id only selects ids dropped from the corpus; 16 (<empty_output>) is a special
    # token dropped anyway, so the tokenized corpus cache is shared with the diffusion runs.
    train_ds, val_ds, _ = build_data(
        cfg, tok, cfg.model.mask_token_id if cfg.model.mask_token_id is not None else 16, log
    )
    sep = tok.eos_token_ids[0] if tok.eos_token_ids else 0
    vocab = build_vocab(train_ds.seqs, a.vocab_size, tok.vocab_size, keep=[sep])
    table = vocab.to_model_table()
    T = cfg.data.seq_len
    enc = lambda ds: PackedDataset(table[ds.seqs.ravel()], T, cfg.train.seed)
    train_m, val_m = enc(train_ds), enc(val_ds)
    cover = float(np.mean(train_m.seqs != vocab.unk))
    log(f"[asarm] vocabulary {vocab.size} ids (UNK {vocab.unk}); train coverage {cover:.4f}")
    xcfg = xlnet_config(cfg)
    if a.init_weights:
        params = _continued_params(a.init_weights, xcfg, vocab)
        log(f"[asarm] weights initialised from {a.init_weights}")
        return XLNetLM(xcfg), params, tok, vocab, (train_m, val_m)
    params = jax.jit(init_params, static_argnums=(0, 1, 2))(xcfg, cfg.train.seed, a.init_std)
    if a.embed_init:
        _, base, _, _ = load_model(a.embed_init, log=log)
        big = np.asarray(base["embed"], np.float32)
        del base
        if big.shape[0] != tok.vocab_size:
            raise TrainConfigError(
                f"asarm.embed_init {a.embed_init!r} has {big.shape[0]} rows, "
                f"the tokenizer {tok.vocab_size}"
            )
        params["word_embedding"] = jnp.asarray(
            projected_embeddings(big, vocab.ids, xcfg.d_model, a.init_std, cfg.train.seed)
        )
        log(
            f"[asarm] word embedding initialised from {a.embed_init} "
            f"({big.shape[1]} -> {xcfg.d_model} by PCA)"
        )
    return XLNetLM(xcfg), params, tok, vocab, (train_m, val_m)


def _continued_params(path, xcfg: XLNetConfig, vocab: CompactVocab) -> dict:
    """Weights of ``path`` (a :func:`models.xlnet.modeling.save_xlnet` file) for continued training.

    Raises:
      jaxspec.training.config.TrainConfigError: unreadable file, or an architecture or
        vocabulary map that differs from the run's (one line naming the difference).
    """
    try:
        fcfg, params, fvocab, _ = load_xlnet(path)
    except WeightFileError as e:
        raise TrainConfigError(f"asarm.init_weights: {e}") from None
    if fcfg != xcfg:
        diff = {
            k: (getattr(fcfg, k), getattr(xcfg, k))
            for k in dataclasses.asdict(xcfg)
            if getattr(fcfg, k) != getattr(xcfg, k)
        }
        raise TrainConfigError(
            f"asarm.init_weights {path}: architecture differs from the config "
            f"(file, config): {diff}"
        )
    if fvocab is None or fvocab.ids != vocab.ids or fvocab.external_size != vocab.external_size:
        raise TrainConfigError(
            f"asarm.init_weights {path}: its vocabulary map differs from the one "
            "built from this config's training data"
        )
    return params


def prior_training(cfg, run_dir) -> dict:
    """Meta of the weights a continued run started from (``{}`` for a run from scratch).

    The start weights are ``asarm.init_weights`` (AS-ARM) or ``lora.init_delta`` (a LoRA delta).
    The first call of a continued run records the file's meta (``step``, ``tokens_seen``) in
    ``run_dir/init.json``; later calls (resume, export) read that record, so the figures stay
    right if the file is overwritten by the continued run's export.
    """
    rec = Path(run_dir) / INIT_RECORD
    if rec.is_file():
        return json.loads(rec.read_text())
    a = cfg.asarm or AsarmSection()
    delta_path = getattr(cfg.lora, "init_delta", None)
    if a.init_weights:
        path, meta = a.init_weights, dict(load_xlnet(a.init_weights)[3])
    elif delta_path:
        path, meta = delta_path, dict(load_delta(delta_path)[1])
    else:
        return {}
    out = {
        "path": str(path),
        "step": int(meta.get("step", 0)),
        "tokens_seen": int(meta.get("tokens_seen", 0)),
    }
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    rec.write_text(json.dumps(out))
    return out


def run_meta(cfg, run_dir, step: int, tokens_per_step: int) -> dict:
    """The ``meta`` stored with exported AS-ARM weights: ``step`` and ``tokens_seen`` count the
    run this file continues (:func:`prior_training`) as well as this run's steps; ``seq_len`` is
    the training length, which :func:`models.registry.load_asarm` uses as the context limit."""
    prior = prior_training(cfg, run_dir)
    meta = {
        "objective": "asarm",
        "name": cfg.name,
        "step": int(prior.get("step", 0)) + int(step),
        "tokens_seen": int(prior.get("tokens_seen", 0)) + int(step) * int(tokens_per_step),
        "tokenizer": cfg.model.tokenizer,
        "seq_len": int(cfg.data.seq_len),
    }
    if prior:
        meta["continued_from"] = prior
        meta["run_step"] = int(step)
    return meta


def export_checkpoint(run_dir, dest=None, step: Optional[int] = None) -> tuple[int, int]:
    """Write the weights of an AS-ARM run's checkpoint as ``model.safetensors`` (float16,
    :func:`models.xlnet.modeling.save_xlnet`, with the compact vocabulary), e.g. while the run
    goes on.

    Args:
      run_dir: the run's ``--out`` directory (``config.json``, ``vocab.json``, ``checkpoints/``).
      dest: output file (default ``run_dir/model-<step>.safetensors``).
      step: checkpoint step (default the latest).

    Returns:
      ``(step, bytes written)``.

    Raises:
      jaxspec.training.config.TrainConfigError: no checkpoint, or not an AS-ARM run.
    """
    import orbax.checkpoint as ocp

    run = Path(run_dir).resolve()
    cfg = config_from_dict(json.loads((run / "config.json").read_text()))
    if cfg.objective.kind != "asarm":
        raise TrainConfigError(
            f"{run} is not an AS-ARM run (objective.kind={cfg.objective.kind!r})"
        )
    vocab = None
    if (run / "vocab.json").is_file():
        v = json.loads((run / "vocab.json").read_text())
        vocab = CompactVocab(ids=tuple(v["ids"]), external_size=int(v["external_size"]))
    mngr = ocp.CheckpointManager(run / "checkpoints")
    step = mngr.latest_step() if step is None else step
    if step is None:
        raise TrainConfigError(f"{run / 'checkpoints'} holds no checkpoint")
    restored = mngr.restore(step, args=ocp.args.StandardRestore())
    mngr.close()
    params = jax.tree.map(np.asarray, restored["trainable"])
    dest = Path(dest) if dest is not None else run / f"model-{step}.safetensors"
    seq = cfg.optim.grad_accum * cfg.data.batch_size * cfg.data.seq_len
    meta = run_meta(cfg, run, int(step), seq)
    return int(step), save_xlnet(dest, xlnet_config(cfg), params, vocab, meta)


__all__ = [
    "AsarmSection",
    "mask_rate_range",
    "low_discrepancy_uniform",
    "prompt_lengths",
    "lattice_order",
    "joint_loss",
    "asarm_loss",
    "build_vocab",
    "projected_embeddings",
    "xlnet_config",
    "build_asarm",
    "prior_training",
    "run_meta",
    "export_checkpoint",
]
