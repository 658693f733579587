"""The ``dflash`` objective of ``scripts.train``: a DFlash drafter (:mod:`jaxspec.causal.dflash`)
trained against a frozen causal target on the target's own answers, through the shared step
loop, checkpoints and metrics of :mod:`jaxspec.training.loop`.

**Data** (``data.source: distill``): the rows of ``data.distill``, a file written by
``scripts.distill`` (the target's own greedy answers to prompts, each row ``split`` train or
val). A row becomes ``prompt + answer``, plus EOS when the target ended the answer (it is
shorter than ``dflash.answer_cap``), cut to ``data.seq_len`` and right-padded
(:func:`distill_sequences`). The trainable positions (block labels and anchors) are the
answer's tokens and its EOS; padding and prompt are context only, so no row needs dropping
for being short.

**Step** (:func:`compiled_fns`): per micro-batch, the frozen target cut after its deepest
feature layer (:func:`jaxspec.training.dflash.truncated_target`, LM head skipped) gives the
hidden states without gradient; ``dflash.blocks_per_seq`` anchors are drawn per sequence with
the key ``fold_in(fold_in(PRNGKey(seed), step), i)``; the gradient of DFlash's Eq. 4 loss
(:func:`jaxspec.training.dflash.dflash_loss`, position decay ``dflash.gamma``) with respect to
the drafter's own tree is averaged over the ``grad_accum`` micro-batches. Batches and keys
are functions of the step, so ``--resume`` reproduces an uninterrupted run.

**Feature cache** (``dflash.feature_cache: PATH.npy``, off by default): the target's
features do not change during training, so they can be computed once per row instead of
once per step (the DFlash paper: "computed on the fly or cached"). Before the first step,
:func:`build_feature_cache` runs the cut target over every train row, then every val row
(``batch_size`` rows per pass) into a ``.npy`` memory map of shape ``(rows, T, n, D)``
(``dflash.feature_cache_dtype``: ``float16``, the default, 2 bytes per value, or
``float32``) beside a JSON sidecar ``PATH.json`` recording what it was computed from: the
target preset and a sha256 of the cut target's config and weights, ``layer_ids``, the data
file and its sha256, ``seq_len``, the train / val row counts and a sha256 of the rows in
order, the dtype and shape, and ``done``, the rows written. The build is resumable (rows are
flushed before ``done`` counts them; a rerun continues at ``done``) and ``--max-minutes``
counts it: a budget spent on the cache stops the run before its first step. A sidecar of
another run is refused in one line naming the first field that differs (delete the two
files to rebuild). With the cache, batches carry each row's cache index
(:class:`DFlashRows` ``row_base``), the step gathers those rows' features on the host from
the memory map and hands them to the jitted step / eval as ``hidden``; the target's layers
are dropped from memory. Batches, anchors, the loss, the held-out rows, resume and export are
those of the on-the-fly run: a float32 cache reproduces its losses to float32 round-off, a
float16 cache to the rounding of the features (relative ``2^-11``).

**Memory.** The blocks of a sequence attend to one copy of its context keys / values (not one
per block): per micro-batch the drafter holds ``l x N x T`` context rows and ``N x A x B``
block rows, and the logits of the ``N x A x (B - 1)`` draft rows over the vocabulary (with
``batch_size`` 4, 16 blocks of 16 and SmolLM2's 49,152 tokens, 189 MB in float32, several
such arrays with the log-softmax and the gradients), which ``batch_size`` and
``blocks_per_seq`` bound. Measured: peak RSS 2.4 GB for the whole CPU process of
``configs/train/dflash-smollm2-135m.yaml`` (target, data, drafter, optimiser).

**Held-out** (``metrics.jsonl`` eval rows, on ``eval_batches`` fixed batches of the val rows
with fixed anchors): ``val_loss``, ``val_masked_acc`` (argmax accuracy over all draft rows),
``val_acc_pos`` (per draft row ``1 .. B - 1``), ``val_accepted`` (drafts before the first
argmax miss per complete block) and ``val_greedy_tau`` (``1 + val_accepted``): the data are
the target's own greedy answers, so this is the acceptance length (tokens per target pass)
greedy verification would reach on those blocks.

**Export:** ``drafter.safetensors`` (:func:`jaxspec.causal.dflash.save_drafter`, float32, the
spec and the run's step / tokens as metadata), loadable by ``scripts.generate
--dflash-drafter``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxspec.causal.dflash import (
    DFlashSpec,
    check_init_layers,
    init_drafter,
    init_from_target,
    load_drafter,
    save_drafter,
    target_qk_scale,
)
from jaxspec.training.build import distill_rows, make_optimizer
from jaxspec.training.config import TrainConfig, TrainConfigError, config_from_dict
from jaxspec.training.data import DataError
from jaxspec.training.dflash import dflash_loss, sample_anchors, target_features, truncated_target

__all__ = [
    "DFlashRows",
    "FeatureCache",
    "build_feature_cache",
    "build_target",
    "check_feature_cache",
    "compiled_fns",
    "distill_sequences",
    "feature_cache_meta",
    "train_dflash",
]


def distill_sequences(
    rows, seq_len: int, eos_id: int, answer_cap: int, pad_id: Optional[int] = None
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Self-distillation rows ``{"prompt": ids, "answer": ids}`` -> training sequences.

    Returns:
      ``(tokens int32 (N, T), trainable bool (N, T), stats)``: ``prompt + answer (+ EOS when
      len(answer) < answer_cap)`` cut to ``T = seq_len`` and right-padded with ``pad_id``
      (default ``eos_id``); ``trainable`` marks the answer and its EOS. Rows that leave
      fewer than two answer tokens inside ``T`` (a long prompt, or an answer of one token
      with its EOS) are dropped: no anchor with a label. ``stats``: ``rows``, ``kept``,
      ``ended`` (EOS appended and inside ``T``), ``dropped`` (those rows),
      ``trainable_tokens``.

    Raises:
      DataError: ``seq_len`` < 2 or ``answer_cap`` < 1.
    """
    if seq_len < 2 or answer_cap < 1:
        raise DataError(f"seq_len must be >= 2 and answer_cap >= 1, got {seq_len}, {answer_cap}")
    pad = eos_id if pad_id is None else pad_id
    toks, train = [], []
    ended = dropped = 0
    for r in rows:
        p, a = [int(t) for t in r["prompt"]], [int(t) for t in r["answer"]]
        if len(a) < answer_cap:
            a = a + [int(eos_id)]
        if len(p) + 2 > seq_len or len(a) < 2:
            dropped += 1
            continue
        seq = (p + a)[:seq_len]
        ended += int(len(p) + len(a) <= seq_len and len(r["answer"]) < answer_cap)
        row = np.full(seq_len, pad, np.int32)
        row[: len(seq)] = seq
        mask = np.zeros(seq_len, bool)
        mask[len(p) : len(seq)] = True
        toks.append(row)
        train.append(mask)
    tokens = np.stack(toks) if toks else np.zeros((0, seq_len), np.int32)
    trainable = np.stack(train) if train else np.zeros((0, seq_len), bool)
    stats = {
        "rows": len(rows),
        "kept": len(toks),
        "ended": ended,
        "dropped": dropped,
        "trainable_tokens": int(trainable.sum()),
    }
    return tokens, trainable, stats


class DFlashRows:
    """Training sequences as batches ``int32 (n, 2, T)`` = ``[tokens, trainable]``, a pure
    function of ``(seed, step)``: global sample ``k`` is row ``perm_e[k mod N]`` of the
    epoch-``e = k // N`` permutation (seeded by ``seed`` and ``e``).

    With ``row_base`` (an int), batches are ``int32 (n, 3, T)``: the third channel holds
    ``row_base + i`` (``i`` the row's index in ``tokens``) at every position, the row of the
    feature cache that holds its target features (:class:`FeatureCache`).

    Raises:
      DataError: no rows, or ``tokens`` and ``trainable`` of different shapes."""

    def __init__(
        self,
        tokens: np.ndarray,
        trainable: np.ndarray,
        seed: int = 0,
        row_base: Optional[int] = None,
    ):
        tokens, trainable = np.asarray(tokens), np.asarray(trainable)
        if tokens.ndim != 2 or len(tokens) == 0 or trainable.shape != tokens.shape:
            raise DataError(
                f"DFlash rows must be (N, T) tokens and trainable with N > 0, got "
                f"{tokens.shape} and {trainable.shape}"
            )
        self.tokens, self.trainable, self.seed = tokens, trainable, int(seed)
        self.seq_len = tokens.shape[1]
        self.row_base = None if row_base is None else int(row_base)
        self._perms: dict[int, np.ndarray] = {}

    def _rows(self, idx: list[int]) -> np.ndarray:
        parts = [self.tokens[idx], self.trainable[idx].astype(np.int32)]
        if self.row_base is not None:
            rows = self.row_base + np.asarray(idx, np.int32)
            parts.append(np.broadcast_to(rows[:, None], (len(idx), self.seq_len)))
        return np.stack(parts, axis=1).astype(np.int32)

    def _row(self, k: int) -> int:
        n = len(self.tokens)
        e = k // n
        if e not in self._perms:
            if len(self._perms) > 4:
                self._perms.clear()
            self._perms[e] = np.random.default_rng([self.seed, 4241, e]).permutation(n)
        return int(self._perms[e][k % n])

    def batch(self, step: int, samples_per_step: int) -> np.ndarray:
        """``int32 (samples_per_step, 2 or 3, T)``: the batch of ``step``."""
        idx = [self._row(k) for k in range(step * samples_per_step, (step + 1) * samples_per_step)]
        return self._rows(idx)

    def fixed_batches(self, num: int, batch_size: int) -> list[np.ndarray]:
        """``num`` evaluation batches of the rows in file order (wrapping around)."""
        n = len(self.tokens)
        out = []
        for i in range(num):
            out.append(self._rows([(i * batch_size + j) % n for j in range(batch_size)]))
        return out


def build_target(cfg: TrainConfig, log=lambda m: print(m, file=sys.stderr), model_and_params=None):
    """``(target CausalLM, params, tokenizer or None, DFlashSpec)`` of a ``dflash`` run: the
    preset of ``model.preset`` (frozen) and the drafter's spec from the ``dflash`` section
    (``model_and_params`` replaces the preset, e.g. a tiny target in tests).

    Raises:
      TrainConfigError: no preset, a target that is not a causal LM, a spec out of range.
    """
    from models.llama.modeling import CausalLM
    from models.registry import load_model

    tok = None
    if model_and_params is None:
        m = cfg.model
        if m.init != "preset" or not m.preset:
            raise TrainConfigError(
                "objective.kind = dflash needs model.init: preset and model.preset (the target)"
            )
        target, params, tok, _ = load_model(m.preset, log=log)
    else:
        target, params = model_and_params
    if not isinstance(target, CausalLM):
        raise TrainConfigError(
            f"the DFlash target must be a causal LM, {cfg.model.preset!r} is a "
            f"{type(target).__name__}"
        )
    d = cfg.dflash
    try:
        spec = DFlashSpec.for_target(
            target.config,
            block_size=d.block_size,
            num_layers=d.num_layers,
            layer_ids=d.layer_ids,
            intermediate_size=d.intermediate_size,
        )
    except ValueError as e:
        raise TrainConfigError(f"dflash: {e}") from None
    return target, params, tok, spec


def build_rows(cfg: TrainConfig, eos_id: int, log=lambda m: print(m, file=sys.stderr)):
    """``(train DFlashRows, val DFlashRows or None, meta)`` from ``data.distill`` (rows read
    and filtered by :func:`jaxspec.training.build.distill_rows`).

    Raises:
      TrainConfigError: another ``data.source``, a missing / unreadable file, no train row
        left by the distill filter or that fits ``seq_len``."""
    if cfg.data.source != "distill":
        raise TrainConfigError(
            f"objective.kind = dflash trains on the target's own answers: data.source must be "
            f"'distill' (with data.distill, a file of scripts.distill), got {cfg.data.source!r}"
        )
    rows, kept = distill_rows(cfg, log, cfg.dflash.answer_cap)
    out, stats = [], {}
    for split in ("train", "val"):
        part = [r for r in rows if r.get("split", "train") == split]
        toks, mask, st = distill_sequences(part, cfg.data.seq_len, eos_id, cfg.dflash.answer_cap)
        stats[split] = st
        out.append(DFlashRows(toks, mask, cfg.train.seed) if len(toks) else None)
    if out[0] is None:
        raise TrainConfigError(
            f"data.distill {cfg.data.distill}: no train row leaves an answer inside "
            f"seq_len {cfg.data.seq_len}"
        )
    if out[1] is None:
        log("[train] no val rows in data.distill: no held-out evaluation")
    clean = {} if kept is None else {"clean": kept}
    return out[0], out[1], {"distill": {"path": str(cfg.data.distill), **clean, **stats}}


# ----------------------------------------------------------------------- the feature cache
FEATURE_CACHE_FORMAT = "jaxspec-dflash-features/1"
FEATURE_CACHE_DTYPES = ("float16", "float32")
# sidecar fields that must equal the run's (in this order: the first that differs is named);
# data_file (the path as given) and done (rows written) are recorded, not compared
CACHE_IDENTITY = (
    "format",
    "dtype",
    "layer_ids",
    "seq_len",
    "target",
    "target_sha256",
    "data_sha256",
    "train_rows",
    "val_rows",
    "rows_sha256",
    "shape",
)


def _sha256_file(path) -> Optional[str]:
    p = Path(path)
    if not p.is_file():
        return None
    h = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def params_sha256(model, params) -> str:
    """sha256 of a model's config and every parameter (path, dtype, shape, bytes): the
    identity of the (cut) target a feature cache was computed with."""
    h = hashlib.sha256()
    conf = model.config
    desc = dataclasses.asdict(conf) if dataclasses.is_dataclass(conf) else repr(conf)
    h.update(json.dumps(desc, sort_keys=True, default=str).encode())
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
        a = np.asarray(leaf)
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype}|{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _rows_sha256(datasets) -> str:
    h = hashlib.sha256()
    for ds in datasets:
        for a in (ds.tokens, ds.trainable):
            a = np.ascontiguousarray(a)
            h.update(f"{a.dtype}|{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def feature_cache_meta(cfg: TrainConfig, spec: DFlashSpec, fmodel, fparams, train_ds, val_ds):
    """The sidecar a feature cache of this run must carry (:data:`CACHE_IDENTITY` plus
    ``data_file`` and ``done``): the rows are the train rows, then the val rows, in the order
    of :func:`build_rows`; ``shape`` is ``(rows, T, len(layer_ids), D)``."""
    parts = [train_ds] + ([val_ds] if val_ds is not None else [])
    rows = sum(len(ds.tokens) for ds in parts)
    return {
        "format": FEATURE_CACHE_FORMAT,
        "dtype": cfg.dflash.feature_cache_dtype,
        "layer_ids": list(spec.layer_ids),
        "seq_len": int(train_ds.seq_len),
        "target": cfg.model.preset,
        "target_sha256": params_sha256(fmodel, fparams),
        "data_file": cfg.data.distill,
        "data_sha256": _sha256_file(cfg.data.distill) if cfg.data.distill else None,
        "train_rows": len(train_ds.tokens),
        "val_rows": 0 if val_ds is None else len(val_ds.tokens),
        "rows_sha256": _rows_sha256(parts),
        "shape": [rows, int(train_ds.seq_len), len(spec.layer_ids), int(spec.target_hidden)],
        "done": 0,
    }


def _sidecar(path: Path) -> Path:
    return path.with_suffix(".json")


def _write_sidecar(path: Path, meta: dict) -> None:
    tmp = _sidecar(path).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, _sidecar(path))


def _short(v):
    return f"{v[:12]}..." if isinstance(v, str) and len(v) == 64 else v


def check_feature_cache(path, meta: dict) -> int:
    """Rows of the cache at ``path`` already written for this run (0: none yet, or no usable
    file): its sidecar must equal ``meta`` (:func:`feature_cache_meta`) on every
    :data:`CACHE_IDENTITY` field.

    Raises:
      TrainConfigError: ``path`` does not end in ``.npy``, an unreadable sidecar, or one
        whose field differs from this run's (one line naming the first such field)."""
    path = Path(path)
    if path.suffix != ".npy":
        raise TrainConfigError(f"dflash.feature_cache must name a .npy file, got {str(path)!r}")
    side = _sidecar(path)
    if not side.is_file():
        return 0
    try:
        stored = json.loads(side.read_text())
    except (OSError, ValueError) as e:
        raise TrainConfigError(f"dflash.feature_cache sidecar {side} is unreadable ({e})") from None
    for k in CACHE_IDENTITY:
        if stored.get(k) != meta[k]:
            raise TrainConfigError(
                f"dflash.feature_cache {path} was built for another {k} "
                f"({_short(stored.get(k))!r}; this run: {_short(meta[k])!r}): delete {path.name} "
                f"and {side.name} or name another file"
            )
    if not path.is_file():
        return 0
    try:
        mm = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return 0
    if list(mm.shape) != meta["shape"] or str(mm.dtype) != meta["dtype"]:
        return 0
    return int(stored.get("done", 0))


def build_feature_cache(
    path,
    meta: dict,
    fmodel,
    fparams,
    tokens: np.ndarray,
    batch_size: int,
    *,
    progress: bool = True,
    max_seconds: Optional[float] = None,
    flush_every_s: float = 30.0,
    log=lambda m: print(m, file=sys.stderr),
) -> bool:
    """Write the target features of ``tokens`` int32 ``(rows, T)`` (:func:`target_features`
    after ``meta["layer_ids"]``, one pass of the cut target ``fmodel`` per ``batch_size``
    rows) into the ``.npy`` memory map ``path`` (``meta["shape"]``, ``meta["dtype"]``) and
    its JSON sidecar (``path`` with ``.json``; ``meta`` plus ``done``, the rows written).

    Resumable: rows are flushed to disk before ``done`` counts them (every
    ``flush_every_s`` seconds, past ``max_seconds``, at the end and when an exception such
    as ``KeyboardInterrupt`` stops the build), so a stopped or killed build continues at
    ``done`` (:func:`check_feature_cache`; a killed one recomputes at most the last
    ``flush_every_s`` seconds); without a usable file it starts at row 0. Past
    ``max_seconds`` it stops after the batch in hand.

    Returns:
      True when all rows are written, False when it stopped at ``max_seconds``.

    Raises:
      TrainConfigError: a sidecar for another run (:func:`check_feature_cache`), a feature
        that is not finite once cast to ``meta["dtype"]`` (float16 overflows past 65504).
    """
    from numpy.lib.format import open_memmap
    from tqdm.auto import tqdm

    path = Path(path)
    rows, dtype = meta["shape"][0], np.dtype(meta["dtype"])
    if len(tokens) != rows:
        raise ValueError(f"tokens has {len(tokens)} rows, the cache {rows}")
    done = check_feature_cache(path, meta)
    if done >= rows:
        return True
    path.parent.mkdir(parents=True, exist_ok=True)
    if done == 0:
        mm = open_memmap(path, mode="w+", dtype=dtype, shape=tuple(meta["shape"]))
        _write_sidecar(path, {**meta, "done": 0})
    else:
        mm = open_memmap(path, mode="r+")
    gb = mm.nbytes / 1e9
    log(
        f"[train] feature cache {path}: rows {done}..{rows - 1} of {rows} to compute "
        f"({tuple(meta['shape'])} {dtype.name}, {gb:.2f} GB; the target's layers "
        f"{meta['layer_ids']})"
    )
    layer_ids = tuple(meta["layer_ids"])
    feats = jax.jit(lambda p, t: target_features(fmodel, p, t, layer_ids))
    t0 = t_flush = time.perf_counter()
    bar = tqdm(total=rows, initial=done, disable=not progress, desc="features", unit="row")
    complete, written, recorded = True, done, done
    try:
        for s in range(done, rows, batch_size):
            e = min(s + batch_size, rows)
            tok = tokens[s:e]
            if e - s < batch_size:  # one static shape: pad the last batch with its last row
                tok = np.concatenate([tok, np.repeat(tok[-1:], batch_size - (e - s), 0)])
            h = np.asarray(feats(fparams, jnp.asarray(tok, jnp.int32)))[: e - s].astype(dtype)
            if not np.all(np.isfinite(h)):
                raise TrainConfigError(
                    f"dflash.feature_cache: a target feature of rows {s}..{e - 1} is not "
                    f"finite as {dtype.name} (beyond its range): use feature_cache_dtype "
                    f"float32"
                )
            mm[s:e] = h
            written = e
            bar.update(e - s)
            now = time.perf_counter()
            late = max_seconds is not None and now - t0 >= max_seconds
            if e == rows or late or now - t_flush >= flush_every_s:
                mm.flush()
                _write_sidecar(path, {**meta, "done": e})
                recorded, t_flush = e, now
            if late and e < rows:
                complete = False
                log(
                    f"[train] time budget spent: feature cache at {e} of {rows} rows "
                    f"(rerun to continue)"
                )
                break
    finally:  # an exception (Ctrl-C included) keeps the rows written so far
        bar.close()
        if written > recorded:
            mm.flush()
            _write_sidecar(path, {**meta, "done": written})
        del mm
    spent = time.perf_counter() - t0
    log(
        f"[train] feature cache: rows {done}..{written - 1} in {spent:.1f} s "
        f"({spent / max(written - done, 1):.3f} s per row, compile included)"
    )
    return complete


class FeatureCache:
    """Read side of a complete feature cache: ``take(rows int (...)) -> (..., T, n, D)`` of
    the stored dtype, gathered on the host from the memory map."""

    def __init__(self, path):
        self.path = Path(path)
        self.features = np.load(self.path, mmap_mode="r")

    def take(self, rows) -> np.ndarray:
        rows = np.asarray(rows)
        return np.asarray(self.features[rows.reshape(-1)]).reshape(
            *rows.shape, *self.features.shape[1:]
        )


def _with_features(fn, cache: FeatureCache, batch_arg: int):
    """``fn`` (a jitted step or eval of :func:`compiled_fns`) for batches that carry the
    cache row in channel 2 (:class:`DFlashRows` ``row_base``): the rows' features come from
    ``cache`` and go in as ``hidden``."""

    def call(*args):
        b = np.asarray(args[batch_arg])
        args = list(args)
        args[batch_arg] = b[..., :2, :]
        return fn(*args, hidden=cache.take(b[..., 2, 0]))

    return call


@functools.lru_cache(maxsize=4)
def compiled_fns(spec: DFlashSpec, feature_model, cfg_json: str):
    """``(jitted train step, jitted eval, optax transform, schedule)`` of a ``dflash`` run.

    The step ``(own, opt_state, base, batch int32 (accum, N, 2, T), step, hidden=None) ->
    (own, opt_state, stats)`` (``base``: ``{"target": the cut target's params, "shared":
    embed / lm_head}``) averages the micro-batches' gradients and applies one update
    (donating ``own`` and ``opt_state``); ``stats``: ``loss``, ``grad_norm``, ``masked_acc``.
    The eval ``(own, base, batch (N, 2, T), i, hidden=None) -> (loss, metrics)`` draws its
    anchors with the fixed key ``fold_in(PRNGKey(seed + 1), i)``. ``hidden``: the target
    features of the batch's rows, float16 / float32 ``(accum, N, T, n, D)`` (step) or
    ``(N, T, n, D)`` (eval), from a :class:`FeatureCache`; None: the target computes them
    (``base["target"]`` is then unused)."""
    cfg = config_from_dict(json.loads(cfg_json))
    seed, accum, d = cfg.train.seed, cfg.optim.grad_accum, cfg.dflash
    tx, sched = make_optimizer(cfg)

    def loss_on(own, base, batch, key, hidden=None):
        tokens, trainable = batch[:, 0], batch[:, 1].astype(bool)
        if hidden is None:
            hidden = target_features(feature_model, base["target"], tokens, spec.layer_ids)
        anchors, ok = sample_anchors(key, trainable, d.blocks_per_seq)
        return dflash_loss(
            spec, own, base["shared"], tokens, hidden, trainable, anchors, ok, d.gamma
        )

    def step_fn(own, opt, base, batch, step, hidden=None):
        key = jax.random.fold_in(jax.random.PRNGKey(seed), step)

        def micro(carry, xs):
            gsum, lsum, hits, scored = carry
            mb, i, hid = xs
            (loss, m), g = jax.value_and_grad(loss_on, has_aux=True)(
                own, base, mb, jax.random.fold_in(key, i), hid
            )
            return (
                jax.tree.map(jnp.add, gsum, g),
                lsum + loss,
                hits + jnp.sum(m["hits"]),
                scored + jnp.sum(m["scored"]),
            ), None

        zero = jnp.float32(0)
        init = (jax.tree.map(jnp.zeros_like, own), zero, zero, zero)
        (g, lsum, hits, scored), _ = jax.lax.scan(
            micro, init, (batch, jnp.arange(accum, dtype=jnp.int32), hidden)
        )
        g = jax.tree.map(lambda x: x / accum, g)
        gnorm = optax.tree.norm(g)
        upd, opt = tx.update(g, opt, own)
        own = optax.apply_updates(own, upd)
        stats = {
            "loss": lsum / accum,
            "grad_norm": gnorm,
            "masked_acc": hits / jnp.maximum(scored, 1.0),
        }
        return own, opt, stats

    def eval_fn(own, base, batch, i, hidden=None):
        key = jax.random.fold_in(jax.random.PRNGKey(seed + 1), i)
        return loss_on(own, base, batch, key, hidden)

    return jax.jit(step_fn, donate_argnums=(0, 1)), jax.jit(eval_fn), tx, sched


def evaluate(eval_fn, own, base, val_batches) -> dict:
    """The held-out row of ``metrics.jsonl`` (module docstring) over ``val_batches``."""
    loss, hits, scored, acc_n, blocks = 0.0, 0.0, 0.0, 0.0, 0.0
    for i, vb in enumerate(val_batches):
        lv, m = eval_fn(own, base, jnp.asarray(vb), jnp.int32(i))
        loss += float(lv)
        hits = hits + np.asarray(m["hits"], np.float64)
        scored = scored + np.asarray(m["scored"], np.float64)
        acc_n += float(m["accepted"])
        blocks += float(m["blocks"])
    n = max(len(val_batches), 1)
    accepted = acc_n / blocks if blocks else float("nan")
    return {
        "val_loss": loss / n,
        "val_masked_acc": float(np.sum(hits) / max(np.sum(scored), 1.0)),
        "val_acc_pos": [round(float(x), 4) for x in np.asarray(hits) / np.maximum(scored, 1.0)],
        "val_accepted": accepted,
        "val_greedy_tau": 1.0 + accepted,
    }


def _first_features(cfg: TrainConfig, spec: DFlashSpec, fmodel, fparams, train_ds) -> jax.Array:
    """The target's states after ``spec.layer_ids`` on the first training batch, float
    ``(batch, T, n, D)`` (``init_target_layers``' query / key norm scale)."""
    tokens = jnp.asarray(train_ds.batch(0, cfg.data.batch_size)[:, 0])
    return target_features(fmodel, fparams, tokens, spec.layer_ids)


def _start_weights(cfg: TrainConfig, spec: DFlashSpec, target_params=None, features=None):
    """The drafter tree (float32) a run starts from: ``dflash.init_weights``, the target's
    layers ``dflash.init_target_layers`` (:func:`init_from_target`, the query / key norms set
    from ``features()``, e.g. :func:`_first_features`) or a fresh init.

    The start drafter's spec must equal the run's except perhaps its ``block_size``: the
    drafter's weights do not depend on the block size (no position embedding; RoPE is
    relative; the mask embedding is one vector), so a drafter trained at block 16 starts the
    runs that train block 8 or 4 (the block-size sweep).

    Raises:
      TrainConfigError: an unreadable file, a spec that differs in anything else, or target
        layers the drafter cannot start from."""
    return jax.tree.map(
        lambda x: jnp.array(x, jnp.float32), _start_tree(cfg, spec, target_params, features)
    )


def _start_tree(cfg: TrainConfig, spec: DFlashSpec, target_params, features):
    """:func:`_start_weights` before the cast to float32."""
    path = cfg.dflash.init_weights
    if cfg.dflash.init_target_layers:
        try:
            layers = check_init_layers(spec, cfg.dflash.init_target_layers)
            scale = target_qk_scale(spec, target_params, features(), layers[0])
            return init_from_target(spec, target_params, layers, cfg.train.seed, scale)
        except ValueError as e:
            raise TrainConfigError(f"dflash.init_target_layers: {e}") from None
    if not path:
        return init_drafter(spec, cfg.train.seed)
    try:
        stored_spec, own = load_drafter(path)
    except ValueError as e:
        raise TrainConfigError(f"dflash.init_weights: {e}") from None
    if dataclasses.replace(stored_spec, block_size=spec.block_size) != spec:
        raise TrainConfigError(
            f"dflash.init_weights {path}: its spec differs from this config's ({stored_spec} "
            f"vs {spec})"
        )
    return own


def _checked_cache(cfg: TrainConfig, spec, fmodel, fparams, train_ds, val_ds):
    """The feature cache's sidecar for this run, checked against ``dflash.feature_cache``'s
    (:func:`check_feature_cache`), and the rows renumbered as cache rows (train rows first,
    then val). Returns ``(meta, train_ds, val_ds)``.

    Raises:
      TrainConfigError: an unknown ``feature_cache_dtype``, or a cache of another run."""
    if cfg.dflash.feature_cache_dtype not in FEATURE_CACHE_DTYPES:
        raise TrainConfigError(
            f"dflash.feature_cache_dtype must be one of {FEATURE_CACHE_DTYPES}, got "
            f"{cfg.dflash.feature_cache_dtype!r}"
        )
    meta = feature_cache_meta(cfg, spec, fmodel, fparams, train_ds, val_ds)
    check_feature_cache(cfg.dflash.feature_cache, meta)
    train_ds = DFlashRows(train_ds.tokens, train_ds.trainable, train_ds.seed, row_base=0)
    if val_ds is not None:
        val_ds = DFlashRows(
            val_ds.tokens, val_ds.trainable, val_ds.seed, row_base=len(train_ds.tokens)
        )
    return meta, train_ds, val_ds


def _drafter_meta(cfg: TrainConfig, step: int, tokens_per_step: int) -> dict:
    """What the exported ``drafter.safetensors`` records of its training."""
    return {
        "target_preset": cfg.model.preset,
        "config": cfg.name,
        "objective": "dflash",
        "gamma": cfg.dflash.gamma,
        "blocks_per_seq": cfg.dflash.blocks_per_seq,
        "step": step,
        "tokens_seen": step * tokens_per_step,
    }


def _eos_id(tok, config) -> int:
    """The EOS id the rows end with: the tokenizer's first, else the target config's, else 0."""
    if tok is not None and tok.eos_token_ids:
        return tok.eos_token_ids[0]
    return config.eos_token_ids[0] if config.eos_token_ids else 0


def train_dflash(
    cfg: TrainConfig,
    out_dir,
    *,
    resume: bool = False,
    stop_after: Optional[int] = None,
    max_seconds: Optional[float] = None,
    datasets=None,
    model_and_params=None,
    progress: bool = True,
    log=lambda m: print(m, file=sys.stderr),
) -> dict:
    """What :func:`jaxspec.training.loop.train` is for the other objectives, for
    ``objective.kind: dflash`` (scripts.train calls it; same arguments,
    files and metrics rows, module docstring for the held-out columns); ``datasets``: optional
    ``(train, val)`` :class:`DFlashRows`; ``model_and_params``: the frozen target. Writes
    ``drafter.safetensors`` at the stop; the result also has ``drafter_bytes``. With
    ``dflash.feature_cache``, the cache is built or completed first (module docstring); when
    ``max_seconds`` runs out during the build the run stops before any step (``step`` the
    checkpoint it started from, ``stopped_early`` True, no ``drafter_bytes``).

    Raises:
      TrainConfigError: ``out_dir`` holds checkpoints and ``resume`` is False; bad config
        or data (:func:`build_target`, :func:`build_rows`); a feature cache of another run
        or a bad ``feature_cache`` / ``feature_cache_dtype`` (:func:`check_feature_cache`)."""
    from jaxspec.training.loop import _compile_key, _drive, _open_out_dir, _open_run, _result, _Run

    out = _open_out_dir(out_dir, resume)
    target, params, tok, spec = build_target(cfg, log, model_and_params)
    if datasets is None:
        datasets = build_rows(cfg, _eos_id(tok, target.config), log)[:2]
    train_ds, val_ds = datasets
    fmodel, fparams = truncated_target(target, params, spec.layer_ids)
    shared = {k: params[k] for k in ("embed", "lm_head") if k in params}
    base = {"target": fparams, "shared": shared}
    cache_path = cfg.dflash.feature_cache
    if cache_path:  # every check before the run opens
        cache_meta, train_ds, val_ds = _checked_cache(cfg, spec, fmodel, fparams, train_ds, val_ds)
    first = functools.partial(_first_features, cfg, spec, fmodel, fparams, train_ds)
    own = _start_weights(cfg, spec, params, first)
    jstep, eval_fn, tx, sched = compiled_fns(spec, fmodel, _compile_key(cfg))
    opt_state = tx.init(own)
    bs = cfg.data.batch_size
    val_batches = val_ds.fixed_batches(cfg.train.eval_batches, bs) if val_ds is not None else []
    log(
        f"[train] DFlash drafter: {sum(x.size for x in jax.tree.leaves(own)):,} parameters, "
        f"block {spec.block_size}, {spec.num_layers} layer(s), target layers {spec.layer_ids} "
        f"(the target runs {fmodel.config.num_layers} of its {target.config.num_layers} layers"
        + (", once per row into the feature cache)" if cache_path else " every step)")
    )

    mngr, start, own, opt_state = _open_run(cfg, out, own, opt_state, resume=resume, log=log)
    end = cfg.train.steps if stop_after is None else min(cfg.train.steps, stop_after)
    if cache_path:
        t0 = time.perf_counter()
        rows = [train_ds.tokens] + ([val_ds.tokens] if val_ds is not None else [])
        complete = build_feature_cache(
            cache_path,
            cache_meta,
            fmodel,
            fparams,
            np.concatenate(rows),
            bs,
            progress=progress,
            max_seconds=max_seconds,
            log=log,
        )
        if max_seconds is not None:
            max_seconds = max(0.0, max_seconds - (time.perf_counter() - t0))
        if not complete:  # the budget went to the cache: no step this time
            mngr.close()
            # the budget ran out while the feature cache was built: no step, no export
            return _result(cfg, start, True, own, {}, time.perf_counter() - t0, [])
        cache = FeatureCache(cache_path)
        base = {"target": {}, "shared": shared}  # the target is not run any more
        del fparams, params
        jstep, eval_fn = _with_features(jstep, cache, 3), _with_features(eval_fn, cache, 2)
        log(f"[train] target features from {cache_path} ({cache.features.dtype})")
    run = _Run(
        cfg=cfg,
        step_fn=jstep,
        eval_fn=eval_fn,
        sched=sched,
        base=base,
        train_ds=train_ds,
        val_batches=val_batches,
        mngr=mngr,
        evaluate=evaluate,
    )
    result = _drive(
        run,
        own,
        opt_state,
        start,
        end,
        out=out,
        progress=progress,
        max_seconds=max_seconds,
        log=log,
    )
    meta = _drafter_meta(cfg, result["step"], run.tokens_per_step)
    result["drafter_bytes"] = save_drafter(
        out / "drafter.safetensors", spec, result["trainable"], meta=meta
    )
    return result
