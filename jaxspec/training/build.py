"""What a training run is built from: the model and its initial parameters, the packed
stdlib data and the optimiser.

Models (:func:`build_model`): ``model.init: scratch`` builds the randomly initialised model of the
``model`` section through the model registry (:func:`models.registry.build_scratch`, the same code
that serves ``scratch`` presets such as ``dlm-tiny``); ``model.init: preset`` loads a preset's
causal weights and wraps them as a :class:`models.diffusion.modeling.DiffusionLM`. AS-ARM runs
build their XLNet in :func:`jaxspec.training.asarm.build_asarm`.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Optional

import jax
import optax

from jaxspec.training.config import TrainConfig, TrainConfigError
from jaxspec.training.data import DataError, PackedDataset, stdlib_tokens
from jaxspec.training.distill import MixedWindows, clean_rows, distill_stream, read_distill
from jaxspec.training.sft import SFTMixDataset, distill_samples, stdlib_sft
from models.llama.modeling import CausalLM
from models.registry import build_scratch, load_model
from models.scratch import diffusion_model

SOURCES = ("stdlib", "stdlib-sft", "stdlib+distill", "stdlib-sft+distill")

# the answer budget of the committed self-distillation file (``scripts.distill
# --max-new-tokens``, default 192): an answer this long was cut there, not ended by the model
DISTILL_ANSWER_CAP = 192


def build_model(cfg: TrainConfig, log=lambda m: print(m, file=sys.stderr)):
    """``(DiffusionLM, initial params or base params, tokenizer or None)`` for ``cfg.model``
    (for ``objective.kind: sar`` the preset's ``CausalLM`` with ``mask_token_id`` set).

    Raises:
      TrainConfigError: unknown ``init``, missing ``preset``/``mask_token_id``.
      models.registry.PresetError: scratch init without ``vocab_size`` or ``tokenizer``.
    """
    m = cfg.model
    if m.mask_token_id is None:
        raise TrainConfigError("model.mask_token_id is required")
    if m.init == "scratch":
        return build_scratch(m, cfg.train.seed, log)
    if m.init != "preset":
        raise TrainConfigError(f"model.init must be 'scratch' or 'preset', got {m.init!r}")
    if not m.preset:
        raise TrainConfigError("model.init = preset needs model.preset")
    causal, params, tok, _ = load_model(m.preset, log=log)
    if cfg.objective.kind == "sar":  # SPACE SAR-SFT: the causal LM itself, with a [MASK] id
        sar = dataclasses.replace(causal.config, mask_token_id=int(m.mask_token_id))
        return CausalLM(sar), params, tok
    return diffusion_model(m, causal.config), params, tok


def build_data(
    cfg: TrainConfig, tokenizer, mask_token_id: int, log=lambda m: print(m, file=sys.stderr)
):
    """``(train, val, meta)`` from ``cfg.data``: :class:`PackedDataset` windows for source
    ``stdlib``, :class:`jaxspec.training.sft.SFTMixDataset` for ``stdlib-sft``,
    :class:`jaxspec.training.distill.MixedWindows` for ``stdlib+distill`` (held-out: the
    file's ``val`` rows mixed the same way, or the plain held-out windows if it has none), and
    for ``stdlib-sft+distill`` a three-way :class:`SFTMixDataset`: ``distill_fraction`` of the
    samples are the distillation file's answers as SFT rows
    (:func:`jaxspec.training.sft.distill_samples`, answer budget ``DISTILL_ANSWER_CAP``),
    ``sft_fraction`` stdlib function samples, the rest plain windows (held-out: the file's
    ``val`` rows and the held-out modules, mixed the same way).

    Raises:
      TrainConfigError: unknown source, no tokenizer, a distill source without a readable
        ``data.distill`` file, or ``sft_fraction + distill_fraction > 1``.
    """
    if cfg.data.source not in SOURCES:
        raise TrainConfigError(
            f"unknown data.source {cfg.data.source!r}; expected one of {', '.join(SOURCES)}"
        )
    three = cfg.data.source == "stdlib-sft+distill"
    if three and cfg.data.sft_fraction + cfg.data.distill_fraction > 1.0:
        raise TrainConfigError(
            f"data.sft_fraction + data.distill_fraction must be <= 1, got "
            f"{cfg.data.sft_fraction} + {cfg.data.distill_fraction}"
        )
    reads_distill = cfg.data.source.endswith("distill")
    if not reads_distill and (
        cfg.data.distill_max_repeated_ngram is not None or cfg.data.distill_ended_only
    ):
        raise TrainConfigError(
            f"data.distill_max_repeated_ngram / data.distill_ended_only filter the distilled "
            f"rows: data.source {cfg.data.source} reads none"
        )
    rows, kept = distill_rows(cfg, log) if reads_distill else ([], None)
    if tokenizer is None:
        raise TrainConfigError("the stdlib corpus needs a tokenizer (model.tokenizer or a preset)")
    sep = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else 0
    specials = [
        i
        for i in range(min(tokenizer.vocab_size, 64))
        if (t := tokenizer.id_to_token(i)) and t.startswith("<") and t.endswith(">") and i != sep
    ]
    drop = set(specials) | {mask_token_id}
    train, val, meta = stdlib_tokens(
        tokenizer, cfg.data.holdout, sep_id=sep, drop_ids=drop, log=log
    )
    T, seed = cfg.data.seq_len, cfg.train.seed
    windows = PackedDataset(train, T, seed), PackedDataset(val, T, seed)
    if kept is not None:
        meta = {**meta, "distill_clean": kept}
    if cfg.data.source == "stdlib":
        return (*windows, meta)
    if cfg.data.source == "stdlib+distill":
        return _distill_data(cfg, rows, windows, sep, drop, meta)
    sft = stdlib_sft(tokenizer, cfg.data.holdout, seq_len=T, eos_id=sep, drop_ids=drop, log=log)
    f = cfg.data.sft_fraction
    if three:
        return _sft_distill_data(cfg, rows, sft, windows, sep, mask_token_id, meta)
    return (
        SFTMixDataset(*sft["train"], windows[0], f, seed),
        SFTMixDataset(*sft["val"], windows[1], f, seed),
        {**meta, "sft": sft["meta"]},
    )


def _sft_distill_data(
    cfg: TrainConfig, rows: list[dict], sft: dict, windows, sep: int, mask_token_id: int, meta: dict
):
    """The ``stdlib-sft+distill`` datasets (:func:`build_data`): per split, an outer
    :class:`SFTMixDataset` of distilled SFT rows (``distill_fraction``) around an inner one of
    stdlib function samples and plain windows (``sft_fraction / (1 - distill_fraction)`` of
    the inner samples). Only the [MASK] id is removed from the distilled rows: the chat
    template's special tokens stay, as the model sees them at inference."""
    T, seed = cfg.data.seq_len, cfg.train.seed
    fd, fs = cfg.data.distill_fraction, cfg.data.sft_fraction
    inner_f = min(fs / (1.0 - fd), 1.0) if fd < 1.0 else 0.0
    out, stats = [], {}
    for split, plain in zip(("train", "val"), windows):
        inner = SFTMixDataset(*sft[split], plain, inner_f, seed)
        part = [r for r in rows if r.get("split", "train") == split]
        toks, plen, st = distill_samples(
            part, T, sep, answer_cap=DISTILL_ANSWER_CAP, drop_ids=(mask_token_id,)
        )
        stats[split] = st
        if len(plen) == 0:
            if split == "train":
                raise TrainConfigError(
                    f"data.distill {cfg.data.distill}: no train row gives "
                    f"an SFT sample of seq_len {T}"
                )
            out.append(inner)
            continue
        out.append(SFTMixDataset(toks, plen, inner, fd, seed + 1))
    return (
        out[0],
        out[1],
        {
            **meta,
            "sft": sft["meta"],
            "distill": {
                "path": str(cfg.data.distill),
                "fraction": fd,
                "answer_cap": DISTILL_ANSWER_CAP,
                **stats,
            },
        },
    )


def distill_rows(
    cfg: TrainConfig,
    log=lambda m: print(m, file=sys.stderr),
    answer_cap: int = DISTILL_ANSWER_CAP,
) -> tuple[list[dict], Optional[dict]]:
    """The rows of ``data.distill``, filtered by ``data.distill_max_repeated_ngram`` and
    ``data.distill_ended_only`` (:func:`jaxspec.training.distill.clean_rows`; ``answer_cap``:
    the file's answer budget), and the filter's counts (None when neither is set).

    Raises:
      TrainConfigError: an unreadable file, no rows, or no train row left after the filter."""
    d = cfg.data
    path = d.distill
    try:
        rows = read_distill(path) if path else []
    except DataError as e:
        raise TrainConfigError(f"data.distill: {e}") from None
    if not rows:
        raise TrainConfigError(
            f"data.distill must name a file written by scripts.distill with at least one "
            f"row (data.source {d.source}; got {path!r})"
        )
    if d.distill_max_repeated_ngram is None and not d.distill_ended_only:
        return rows, None
    n_train = sum(r.get("split", "train") == "train" for r in rows)
    rows, stats = clean_rows(
        rows,
        answer_cap=answer_cap,
        max_repeated_ngram=d.distill_max_repeated_ngram,
        ended_only=d.distill_ended_only,
    )
    log(
        f"[data] distill filter: kept {stats['kept']:,} of {stats['rows']:,} rows "
        f"({stats['dropped_looping']:,} looping, {stats['dropped_cut']:,} cut at the budget)"
    )
    if not any(r.get("split", "train") == "train" for r in rows):
        raise TrainConfigError(
            f"data.distill {path}: no train row is left after the filter ({n_train} "
            f"before it; distill_max_repeated_ngram={d.distill_max_repeated_ngram}, "
            f"distill_ended_only={d.distill_ended_only})"
        )
    return rows, stats


def _distill_data(cfg: TrainConfig, rows: list[dict], windows, sep: int, drop, meta: dict):
    """The ``stdlib+distill`` datasets (:func:`build_data`)."""
    path = cfg.data.distill
    T, f, seed = cfg.data.seq_len, cfg.data.distill_fraction, cfg.train.seed
    out, stats = [], {}
    for split, plain in zip(("train", "val"), windows):
        part = [r for r in rows if r.get("split", "train") == split]
        stats[split] = {"rows": len(part), "answer_tokens": sum(len(r["answer"]) for r in part)}
        if not part:
            out.append(plain)
            continue
        try:
            out.append(
                MixedWindows(plain, PackedDataset(distill_stream(part, sep, drop), T, seed), f)
            )
        except DataError as e:
            raise TrainConfigError(f"data.distill {path}: {e}") from None
    return out[0], out[1], {**meta, "distill": {"path": str(path), "fraction": f, **stats}}


def make_optimizer(cfg: TrainConfig):
    """``(optax transform, schedule)``: clip by global norm, then AdamW (weight decay only on
    leaves with ndim >= 2) under a warmup + cosine schedule over ``cfg.train.steps``."""
    o = cfg.optim
    steps = max(cfg.train.steps, 1)
    warm = min(o.warmup_steps, steps - 1) if steps > 1 else 0
    sched = optax.warmup_cosine_decay_schedule(
        init_value=0.0 if warm > 0 else o.lr,
        peak_value=o.lr,
        warmup_steps=warm,
        decay_steps=max(steps, warm + 1),
        end_value=o.lr * o.min_lr_ratio,
    )
    decay_mask = lambda tree: jax.tree.map(lambda x: x.ndim >= 2, tree)
    tx = optax.chain(
        optax.clip_by_global_norm(o.clip_norm),
        optax.adamw(
            sched, b1=o.b1, b2=o.b2, eps=o.adam_eps, weight_decay=o.weight_decay, mask=decay_mask
        ),
    )
    return tx, sched


__all__ = ["build_model", "build_data", "make_optimizer"]
