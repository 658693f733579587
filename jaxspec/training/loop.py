"""The training loop shared by every objective: compiled train step, held-out evaluation,
checkpoints with exact resume, metrics and the loss plot.

Objectives (``objective.kind``): ``diffusion`` (LLaDA / Dream masked diffusion,
:mod:`jaxspec.training.objectives`; with a ``lora`` section the trainable tree is the LoRA delta
and the run writes ``delta.safetensors``) and ``asarm`` (ASSD Eq. 7 on an XLNet,
:mod:`jaxspec.training.asarm`; the run also writes ``vocab.json`` and, at the stop,
``model.safetensors``, float16, :func:`models.xlnet.modeling.save_xlnet`), and ``sar`` (SPACE
SAR-SFT of a causal LM, :func:`jaxspec.training.objectives.sar_loss`, with the same LoRA delta),
and ``dflash`` (a DFlash drafter on a frozen causal target: its own model, data and export
around this module's step loop, :func:`jaxspec.training.dflash_run.train_dflash`). The same
loop, optimiser, checkpoints and metrics serve all four.

Exact resume: the masking key of step ``s`` is ``fold_in(PRNGKey(seed), s)`` and its batch is
``PackedDataset.batch(s, ...)``, both pure functions of ``s``; checkpoints (orbax) hold the
trainable tree, the optimiser state and the step count, so a resumed run reproduces the
uninterrupted run bit for bit on the same machine.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxspec.core.plotting import pyplot
from jaxspec.training.asarm import asarm_loss, build_asarm, prior_training, run_meta
from jaxspec.training.build import build_data, build_model, make_optimizer
from jaxspec.training.config import TrainConfig, TrainConfigError, config_from_dict
from jaxspec.training.objectives import diffusion_loss, init_delta, sar_loss
from models.diffusion.delta import load_delta, merge_delta, save_delta
from models.diffusion.modeling import DiffusionLM
from models.llama.params import WeightFileError
from models.xlnet.modeling import save_xlnet

# train-section keys that are bookkeeping only: not part of the compiled computation
_BOOKKEEPING = (
    "ckpt_every",
    "eval_every",
    "eval_batches",
    "log_every",
    "keep_checkpoints",
    "ckpt_every_s",
    "data_offset",
)


# --------------------------------------------------------------------------- metrics
def _read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_metrics(metrics_path, png_path, title: str = "") -> None:
    """Loss curve (train loss per logged step, held-out loss per eval) as a PNG."""
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


# --------------------------------------------------------------------------- compiled step
@functools.lru_cache(maxsize=8)
def _compiled_fns(model: DiffusionLM, cfg_json: str):
    """``(jitted train step, jitted eval loss, optax transform, schedule)`` for a model and
    config; cached so repeated :func:`train` calls in one process (resume, tests) compile once.

    The step ``(trainable, opt_state, base, batch (A, B, T) or SFT (A, B, 2, T), step) ->
    (trainable, opt_state, stats)`` averages the gradients of the ``A`` micro-batches (key of
    micro-batch ``i``: ``fold_in(fold_in(PRNGKey(seed), step), i)``) and applies one optimiser
    update; it donates ``trainable`` and ``opt_state``.
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
            return asarm_loss(model, tr, tokens, key, step, cfg.asarm)
        if cfg.objective.kind == "sar":
            o = cfg.objective
            return sar_loss(model, full(tr, b), tokens, key, o.sar_k, o.p_ar, o.sar_groups)
        if tokens.ndim == 3:  # SFT data (jaxspec.training.sft): [tokens; response mask]
            return diffusion_loss(
                model, full(tr, b), tokens[:, 0], key, eps, response_mask=tokens[:, 1].astype(bool)
            )
        return diffusion_loss(model, full(tr, b), tokens, key, eps)

    def step_fn(tr, opt, b, batch, step):
        key = jax.random.fold_in(jax.random.PRNGKey(seed), step)

        def micro(carry, xs):
            gsum, lsum, asum = carry
            mb, i = xs
            (loss, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(
                tr, b, mb, jax.random.fold_in(key, i), step
            )
            return (
                jax.tree.map(jnp.add, gsum, g),
                lsum + loss,
                jax.tree.map(jnp.add, asum, aux),
            ), None

        zeros = jax.tree.map(jnp.zeros_like, tr)
        azero = {k: jnp.float32(0) for k in ("ce_sum", "n_masked", "n_correct")}
        (g, lsum, asum), _ = jax.lax.scan(
            micro, (zeros, jnp.float32(0), azero), (batch, jnp.arange(accum, dtype=jnp.int32))
        )
        g = jax.tree.map(lambda x: x / accum, g)
        gnorm = optax.tree.norm(g)
        upd, opt = tx.update(g, opt, tr)
        tr = optax.apply_updates(tr, upd)
        stats = {
            "loss": lsum / accum,
            "grad_norm": gnorm,
            "masked_acc": asum["n_correct"] / jnp.maximum(asum["n_masked"], 1.0),
        }
        return tr, opt, stats

    # held-out loss at the end-of-warmup masking range for AS-ARMs (fixed keys per batch)
    eval_step = cfg.asarm.mask_warmup_steps if asarm else 0

    def eval_fn(tr, b, tokens, i):
        return loss_fn(
            tr, b, tokens, jax.random.fold_in(jax.random.PRNGKey(seed + 1), i), eval_step
        )

    return jax.jit(step_fn, donate_argnums=(0, 1)), jax.jit(eval_fn), tx, sched


# --------------------------------------------------------------------------- run setup
def _model_and_data(cfg: TrainConfig, out: Path, datasets, model_and_params, log):
    """``(model, params, train_ds, val_ds, vocab)`` of a run (vocab: AS-ARM runs built here);
    an AS-ARM run also records its start weights and writes ``vocab.json``."""
    if cfg.objective.kind != "asarm":
        model, params, tok = (
            build_model(cfg, log) if model_and_params is None else (*model_and_params, None)
        )
        if datasets is None:
            datasets = build_data(cfg, tok, model.config.mask_token_id, log)[:2]
        prior_training(cfg, out)  # records the start delta's step / tokens (continued runs)
        return (model, params, *datasets, None)
    vocab = None
    if model_and_params is None or datasets is None:
        model, params, tok, vocab, built = build_asarm(cfg, log)
        datasets = datasets if datasets is not None else built
        if model_and_params is not None:
            model, params = model_and_params
    else:
        model, params = model_and_params
    prior_training(cfg, out)  # records the start weights' step / tokens (continued runs)
    if vocab is not None:
        (out / "vocab.json").write_text(
            json.dumps({"ids": list(vocab.ids), "external_size": vocab.external_size})
        )
    return (model, params, *datasets, vocab)


def _initial_trainable(cfg: TrainConfig, model, params):
    """``(trainable, base)``: a fresh LoRA delta over the frozen ``params`` (``lora`` section),
    else the params themselves with an empty base. The trainable tree is copied: the compiled
    step donates its buffers."""
    base, trainable = params, params
    if cfg.lora is not None:
        trainable = init_delta(
            base, cfg.lora, model.config.mask_token_id, jax.random.PRNGKey(cfg.train.seed + 7)
        )
        if cfg.lora.init_delta:
            trainable = _start_delta(cfg.lora.init_delta, trainable)
    else:
        base = {}
    return jax.tree.map(jnp.copy, trainable), base


def _start_delta(path, fresh):
    """The delta stored at ``path`` (``lora.init_delta``) in place of the ``fresh`` one.

    Raises:
      TrainConfigError: unreadable file, or a tree / shape that differs from the config's delta.
    """
    try:
        stored, _ = load_delta(path)
    except WeightFileError as e:
        raise TrainConfigError(f"lora.init_delta: {e}") from None
    want = {k: v.shape for k, v in _flat_items(fresh)}
    got = {k: tuple(v.shape) for k, v in _flat_items(stored)}
    if want != got:
        diff = sorted(set(want.items()) ^ set(got.items()))[:3]
        raise TrainConfigError(
            f"lora.init_delta {path}: its tensors differ from this config's "
            f"delta (rank / targets / norms / mask row), e.g. {diff}"
        )
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), stored)


def _flat_items(tree, prefix=""):
    """``(dotted name, leaf)`` pairs of a nested dict."""
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _flat_items(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _compile_key(cfg: TrainConfig) -> str:
    """The config as sorted JSON without the bookkeeping keys (the :func:`_compiled_fns` key)."""
    key = cfg.to_dict()
    for k in _BOOKKEEPING:
        key["train"].pop(k)
    return json.dumps(key, sort_keys=True)


def _evaluate(eval_fn, trainable, base, val_batches) -> dict:
    """Held-out loss and masked accuracy over the fixed ``val_batches``."""
    ls, nm, nc = 0.0, 0.0, 0.0
    for i, vb in enumerate(val_batches):
        loss, aux = eval_fn(trainable, base, jnp.asarray(vb), jnp.int32(i))
        ls += float(loss)
        nm += float(aux["n_masked"])
        nc += float(aux["n_correct"])
    n = max(len(val_batches), 1)
    return {"val_loss": ls / n, "val_masked_acc": nc / max(nm, 1.0)}


def _restore(mngr, ckdir: Path, trainable, opt_state, mpath: Path, log):
    """``(start step, trainable, opt_state)`` from the latest checkpoint; metrics rows after it
    are dropped."""
    import orbax.checkpoint as ocp

    start = int(mngr.latest_step())
    target = {"trainable": trainable, "opt_state": opt_state, "step": np.asarray(0, np.int64)}
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    restored = mngr.restore(start, args=ocp.args.StandardRestore(abstract))
    if int(restored["step"]) != start:
        raise TrainConfigError(f"checkpoint {start} records step {int(restored['step'])}")
    kept = [r for r in _read_metrics(mpath) if r["step"] <= start]
    mpath.write_text("".join(json.dumps(r) + "\n" for r in kept))
    log(f"[train] resumed from step {start} ({ckdir / str(start)})")
    return start, restored["trainable"], restored["opt_state"]


def _export(cfg: TrainConfig, out: Path, result: dict, model_config, vocab) -> None:
    """Write the run's deliverable: the LoRA delta or the AS-ARM weights (sizes into ``result``)."""
    trainable, tokens_per_step = result["trainable"], result["tokens_per_step"]
    if cfg.lora is not None:
        meta = {
            "base_preset": cfg.model.preset,
            "rank": cfg.lora.rank,
            "alpha": cfg.lora.alpha,
            "mask_token_id": model_config.mask_token_id,
            "head": getattr(model_config, "head", "causal"),
            "objective": cfg.objective.kind,
            "step": result["step"],
            "tokens_seen": result["step"] * tokens_per_step,
        }
        prior = prior_training(cfg, out)
        if prior:  # a continued run (lora.init_delta) counts the run it continues
            meta.update(
                step=prior["step"] + result["step"],
                run_step=result["step"],
                tokens_seen=prior["tokens_seen"] + result["step"] * tokens_per_step,
                continued_from=prior,
            )
        result["delta_bytes"] = save_delta(out / "delta.safetensors", trainable, meta)
    if cfg.objective.kind == "asarm":
        meta = run_meta(cfg, out, result["step"], tokens_per_step)
        result["model_bytes"] = save_xlnet(
            out / "model.safetensors", model_config, trainable, vocab, meta
        )


# --------------------------------------------------------------------------- the loop
@dataclasses.dataclass
class _Run:
    """What the step loop needs besides the trainable tree and the optimiser state."""

    cfg: TrainConfig
    step_fn: Callable  # jitted (trainable, opt_state, base, batch, step) -> (.., .., stats)
    eval_fn: Callable  # jitted (trainable, base, tokens, i) -> (loss, aux)
    sched: Callable  # learning rate of step s
    base: Any  # frozen base params (LoRA) or {}
    train_ds: Any  # PackedDataset
    val_batches: list  # fixed held-out batches
    mngr: Any  # orbax CheckpointManager
    # (eval_fn, trainable, base, batches) -> the eval row (None: _evaluate)
    evaluate: Optional[Callable] = None

    @property
    def tokens_per_step(self) -> int:
        return _tokens_per_step(self.cfg)


def _tokens_per_step(cfg: TrainConfig) -> int:
    return cfg.optim.grad_accum * cfg.data.batch_size * cfg.data.seq_len


def _result(cfg: TrainConfig, step: int, stopped_early: bool, state, losses, wall_s, step_times):
    """A training run's result dict (:func:`train`, :func:`_drive`)."""
    return {
        "step": step,
        "stopped_early": stopped_early,
        "trainable": state,
        "losses": losses,
        "wall_s": wall_s,
        "step_times": step_times,
        "tokens_per_step": _tokens_per_step(cfg),
    }


def _save(mngr, step: int, trainable, opt_state) -> None:
    import orbax.checkpoint as ocp

    mngr.save(
        step,
        args=ocp.args.StandardSave(
            {"trainable": trainable, "opt_state": opt_state, "step": np.asarray(step, np.int64)}
        ),
    )
    mngr.wait_until_finished()  # the next step donates these buffers


def _run_steps(
    run: _Run, trainable, opt_state, start: int, end: int, mf, bar, deadline: Optional[float] = None
):
    """Steps ``start .. end - 1``: one update each; train rows of ``metrics.jsonl`` every
    ``log_every`` steps and at ``end``, eval rows every ``eval_every`` steps and at the last
    step of the schedule, checkpoints every ``ckpt_every`` steps (or ``ckpt_every_s``
    seconds) and at ``end``. Past ``deadline`` (a ``time.perf_counter()`` value) the run ends
    at the step in hand as if it were ``end`` (train row, eval row, checkpoint).

    Returns ``(trainable, opt_state, losses {step: loss}, step_times, steps done)``."""
    c = run.cfg.train
    accum, bs = run.cfg.optim.grad_accum, run.cfg.data.batch_size
    losses: dict[int, float] = {}
    step_times = []
    t_last, last_logged = time.perf_counter(), start
    t_saved = time.perf_counter()
    done = start
    for s in range(start, end):
        t0 = time.perf_counter()
        sd = s + c.data_offset  # data / masking step (the lr schedule counts s)
        batch = run.train_ds.batch(sd, accum * bs)
        batch = batch.reshape(accum, bs, *batch.shape[1:])  # (.., T) or SFT (.., 2, T)
        trainable, opt_state, stats = run.step_fn(
            trainable, opt_state, run.base, jnp.asarray(batch), jnp.int32(sd)
        )
        jax.block_until_ready(stats)  # the step is done: the clock below counts it
        done = s + 1
        spent = deadline is not None and time.perf_counter() >= deadline and done < end
        last = done == end or spent
        if done % c.log_every == 0 or last:
            stats = {k: float(v) for k, v in stats.items()}
            now = time.perf_counter()
            sps = (now - t_last) / (done - last_logged)
            t_last, last_logged = now, done
            rec = {
                "kind": "train",
                "step": done,
                **stats,
                "lr": float(run.sched(s)),
                "tokens_seen": done * run.tokens_per_step,
                "sec_per_step": sps,
                "tokens_per_sec": run.tokens_per_step / sps if sps > 0 else None,
            }
            mf.write(json.dumps(rec) + "\n")
            mf.flush()
            losses[done] = stats["loss"]
            bar.set_postfix(loss=f"{stats['loss']:.4f}", acc=f"{stats['masked_acc']:.3f}")
        step_times.append(time.perf_counter() - t0)
        bar.update(1)
        if run.val_batches and (done % c.eval_every == 0 or done == c.steps or spent):
            rec = {
                "kind": "eval",
                "step": done,
                **(run.evaluate or _evaluate)(run.eval_fn, trainable, run.base, run.val_batches),
            }
            mf.write(json.dumps(rec) + "\n")
            mf.flush()
        timed = c.ckpt_every_s is not None and time.perf_counter() - t_saved >= c.ckpt_every_s
        if done % c.ckpt_every == 0 or last or timed:
            _save(run.mngr, done, trainable, opt_state)
            t_saved = time.perf_counter()
        if spent:
            break
    return trainable, opt_state, losses, step_times, done


def _changed_keys(saved: dict, cfg: TrainConfig) -> list[str]:
    """``section.key`` names whose value in ``cfg`` differs from the ``saved`` config.json.
    The saved config is read through today's schema first, so a key added to the schema since
    (absent from the file, at its default now) is not a change; an unreadable saved config is
    one change, ``config.json``."""
    try:
        old = config_from_dict(saved).to_dict()
    except TrainConfigError:
        return ["config.json"]
    new = cfg.to_dict()
    out = []
    for sec in sorted(set(old) | set(new)):
        a, b = old.get(sec), new.get(sec)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{sec}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif a != b:
            out.append(sec)
    return out


def _open_run(cfg: TrainConfig, out: Path, state, opt_state, *, resume: bool, log):
    """The run's orbax checkpoint manager under ``out/checkpoints``, the step to start from
    and the state (restored from the newest checkpoint with ``resume``, else fresh, with an
    empty ``metrics.jsonl``), and ``out/config.json`` written (a warning when a resumed run's
    config differs). Returns ``(manager, start, state, opt_state)``."""
    import orbax.checkpoint as ocp

    ckdir, mpath = out / "checkpoints", out / "metrics.jsonl"
    mngr = ocp.CheckpointManager(
        ckdir,
        options=ocp.CheckpointManagerOptions(max_to_keep=cfg.train.keep_checkpoints, create=True),
    )
    start = 0
    if resume and mngr.latest_step() is not None:
        start, state, opt_state = _restore(mngr, ckdir, state, opt_state, mpath, log)
    else:
        mpath.write_text("")
    cfg_path = out / "config.json"
    changed = _changed_keys(json.loads(cfg_path.read_text()), cfg) if cfg_path.is_file() else []
    if resume and changed:
        log(
            "[train] warning: config differs from the one this run started with "
            f"({', '.join(changed)}); resume may not be exact"
        )
    cfg_path.write_text(json.dumps(cfg.to_dict(), indent=1))
    return mngr, start, state, opt_state


def _drive(run, state, opt_state, start: int, end: int, *, out: Path, progress, max_seconds, log):
    """Steps ``start .. end`` of ``run`` (:func:`_run_steps`) with a progress bar, appending
    to ``out/metrics.jsonl`` and stopping after the step that passes ``max_seconds``; then
    the checkpoints are flushed and ``out/loss.png`` drawn. Returns the run's result: ``step``
    (steps done), ``stopped_early``, ``trainable`` (the final ``state``), ``losses`` (``{step:
    loss}`` of the logged steps), ``wall_s``, ``step_times`` and ``tokens_per_step``."""
    from tqdm.auto import tqdm

    cfg, mpath = run.cfg, out / "metrics.jsonl"
    bar = tqdm(
        total=cfg.train.steps,
        initial=start,
        disable=not progress,
        desc=cfg.name,
        dynamic_ncols=True,
    )
    t_run = time.perf_counter()
    deadline = None if max_seconds is None else t_run + float(max_seconds)
    with mpath.open("a") as mf:
        state, opt_state, losses, step_times, done = _run_steps(
            run, state, opt_state, start, end, mf, bar, deadline
        )
    bar.close()
    run.mngr.wait_until_finished()
    run.mngr.close()
    wall = time.perf_counter() - t_run
    plot_metrics(mpath, out / "loss.png", cfg.name)
    if done < end:
        log(
            f"[train] time budget of {max_seconds} s spent: stopped at step {done} of {end} "
            f"(--resume continues)"
        )
    return _result(cfg, max(done, start), done < end, state, losses, wall, step_times)


def _open_out_dir(out_dir, resume: bool) -> Path:
    """``out_dir`` resolved and created.

    Raises:
      TrainConfigError: it already holds checkpoints and ``resume`` is False."""
    out = Path(out_dir).resolve()
    ckdir = out / "checkpoints"
    if ckdir.exists() and any(ckdir.iterdir()) and not resume:
        raise TrainConfigError(f"{out} already holds checkpoints: pass --resume or another --out")
    out.mkdir(parents=True, exist_ok=True)
    return out


def train(
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
      max_seconds: wall-clock budget of the step loop (compilation included): the first
        step that ends past it is the last (metrics, eval row, checkpoint, delta as at the
        end), so a session with a time limit (Colab, a lent GPU) stops cleanly and
        ``resume`` continues the same schedule exactly.
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
    if cfg.objective.kind == "dflash":  # its own target, data and export, around _run_steps
        raise TrainConfigError(
            "objective.kind = dflash trains through jaxspec.training.dflash_run.train_dflash"
        )
    out = _open_out_dir(out_dir, resume)
    model, params, train_ds, val_ds, vocab = _model_and_data(
        cfg, out, datasets, model_and_params, log
    )
    trainable, base = _initial_trainable(cfg, model, params)
    jstep, eval_fn, tx, sched = _compiled_fns(model, _compile_key(cfg))
    opt_state = tx.init(trainable)
    bs = cfg.data.batch_size
    val_batches = val_ds.fixed_batches(cfg.train.eval_batches, bs) if val_ds is not None else []

    mngr, start, trainable, opt_state = _open_run(
        cfg, out, trainable, opt_state, resume=resume, log=log
    )
    end = cfg.train.steps if stop_after is None else min(cfg.train.steps, stop_after)
    run = _Run(
        cfg=cfg,
        step_fn=jstep,
        eval_fn=eval_fn,
        sched=sched,
        base=base,
        train_ds=train_ds,
        val_batches=val_batches,
        mngr=mngr,
    )
    result = _drive(
        run,
        trainable,
        opt_state,
        start,
        end,
        out=out,
        progress=progress,
        max_seconds=max_seconds,
        log=log,
    )
    _export(cfg, out, result, model.config, vocab)
    return result


__all__ = ["plot_metrics", "train"]
