"""Training configuration: the sections of ``configs/train/*.yaml`` and how they are read.

A config is a YAML mapping of sections (``name`` plus ``model``, ``data``, ``objective``,
``optim``, ``train``, optionally ``lora`` and ``asarm``), each a dataclass below; an unknown
section or key is an error, and ``section.key=value`` overrides (values parsed as YAML) are
applied before the sections are built (:func:`load_config`). The ``model`` section's schema
lives with the models (:class:`models.scratch.ModelSection`): the model registry builds
``scratch`` presets from the same section.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from models.diffusion.delta import LORA_TARGETS
from models.scratch import ModelSection


class TrainConfigError(ValueError):
    """Malformed training config (unknown section or key, bad value) or unusable out dir."""


@dataclasses.dataclass
class LoraSection:
    """LoRA delta over a frozen preset. ``init_delta``: an exported ``delta.safetensors``
    (:func:`models.diffusion.delta.save_delta`) whose values start the run instead of a fresh
    delta: continued training with a fresh optimiser and schedule (the orbax state of the earlier
    run is gone, e.g. on a new machine); its rank, targets and shapes must equal this config's."""

    rank: int = 16
    alpha: float = 32.0
    targets: tuple = LORA_TARGETS
    train_norms: bool = True
    train_mask_embed: bool = True
    init_delta: Optional[str] = None


@dataclasses.dataclass
class DataSection:
    """``source``: ``"stdlib"`` (plain windows, :mod:`jaxspec.training.data`) or
    ``"stdlib-sft"`` (the v2 diffusion recipe: LLaDA-SFT-style function samples with EOS
    padding mixed with plain windows, :mod:`jaxspec.training.sft`; ``sft_fraction`` of the
    samples are SFT) or ``"stdlib+distill"`` (SPACE self-distillation: windows of the base
    model's own answers, the JSON-lines file ``distill`` written by ``scripts.distill``,
    interleaved with plain windows, ``distill_fraction`` of them distilled;
    :mod:`jaxspec.training.distill`). ``batch_size`` sequences per micro-batch of ``seq_len``
    tokens; ``holdout``: validation modules. ``distill_max_repeated_ngram`` (None: no bound)
    and ``distill_ended_only`` keep only the distilled rows whose answers do not loop / that
    the base model ended (:func:`jaxspec.training.distill.clean_rows`)."""

    source: str = "stdlib"
    seq_len: int = 128
    batch_size: int = 8
    holdout: tuple = ()
    sft_fraction: float = 0.5
    distill: Optional[str] = None
    distill_fraction: float = 0.5
    distill_max_repeated_ngram: Optional[float] = None
    distill_ended_only: bool = False


OBJECTIVES = ("diffusion", "asarm", "sar", "dflash")


@dataclasses.dataclass
class ObjectiveSection:
    """``kind``: ``"diffusion"`` (LLaDA / Dream masked diffusion, ``eps``), ``"asarm"`` (ASSD
    Eq. 7 on an XLNet; settings in the ``asarm`` section) or ``"sar"`` (SPACE SAR-SFT, Eqs. 1-3,
    on a causal LM: ``sar_k`` masks per group, AR samples with probability ``p_ar``; with
    ``sar_groups > 0`` every row instead carries that many mask groups beside its AR terms,
    :func:`jaxspec.training.objectives.sar_group_inputs`) or ``"dflash"`` (a DFlash block
    drafter on a frozen causal target; settings in the ``dflash`` section,
    :mod:`jaxspec.training.dflash_run`)."""

    kind: str = "diffusion"
    eps: float = 1e-3
    sar_k: int = 5
    p_ar: float = 0.5
    sar_groups: int = 0


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
class AsarmSection:
    """Config section ``asarm`` (used when ``objective.kind == "asarm"``).

    ``vocab_size``: model vocabulary (kept ids + 1 UNK). ``embed_init``: preset whose token
    embedding initialises the kept rows (None: random). ``layer_norm_eps``, ``clamp_len``:
    XLNet settings. ``mask_*``: the masking-rate schedule of Appendix E.3. The transformer sizes
    come from ``model`` (``hidden_size`` = d_model, ``intermediate_size`` = d_inner,
    ``num_layers``, ``num_heads``, ``head_dim``). ``init_weights``: a file written by
    :func:`models.xlnet.modeling.save_xlnet` (e.g. an exported ``model.safetensors``) whose weights
    start the run instead of a random init (continued training with a fresh optimiser and schedule);
    its architecture and vocabulary map must equal this config's."""

    vocab_size: int = 8192
    embed_init: Optional[str] = None
    init_std: float = 0.02
    layer_norm_eps: float = 1e-12
    clamp_len: int = -1
    mask_start: float = 0.15
    mask_min: float = 0.90
    mask_max: float = 0.99
    mask_warmup_steps: int = 5000
    init_weights: Optional[str] = None


@dataclasses.dataclass
class DFlashSection:
    """Config section ``dflash`` (used when ``objective.kind == "dflash"``): the drafter
    (:class:`jaxspec.causal.dflash.DFlashSpec`: ``block_size``, ``num_layers``, ``layer_ids``
    (None: DFlash's default rule), ``intermediate_size`` (None: the target's)) and its
    objective (:mod:`jaxspec.training.dflash`): ``blocks_per_seq`` masked blocks (anchors) per
    sequence, ``gamma`` the position decay of DFlash Eq. 4 (None: uniform weights).
    ``answer_cap``: the answer budget the distillation file was written with (an answer this
    long was cut, not ended). ``init_weights``: a drafter file (``save_drafter``) whose
    weights start the run; its spec must equal this config's. ``init_target_layers``: target
    layer ids (one per drafter layer) whose weights start the drafter's layers instead of a
    random init (:func:`jaxspec.causal.dflash.init_from_target`; not with ``init_weights``).
    ``feature_cache``: a ``.npy``
    file of the target's feature-layer states of every row, built once before the first
    step and then read instead of running the target (None: computed on the fly every
    step); ``feature_cache_dtype``: ``float16`` or ``float32``
    (:mod:`jaxspec.training.dflash_run`)."""

    block_size: int = 16
    num_layers: int = 1
    layer_ids: Optional[tuple] = None
    intermediate_size: Optional[int] = None
    blocks_per_seq: int = 16
    gamma: Optional[float] = 7.0
    answer_cap: int = 192
    init_weights: Optional[str] = None
    init_target_layers: Optional[tuple] = None
    feature_cache: Optional[str] = None
    feature_cache_dtype: str = "float16"


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
    dflash: Optional[DFlashSection] = None

    def to_dict(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self)))


_SECTIONS = {
    "model": ModelSection,
    "data": DataSection,
    "objective": ObjectiveSection,
    "optim": OptimSection,
    "train": TrainSection,
    "lora": LoraSection,
    "asarm": AsarmSection,
    "dflash": DFlashSection,
}


_TYPE_NAMES = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    tuple: "a list",
}

# (section, key) -> (least, greatest): values outside are an error (None: unbounded)
_RANGES = {
    ("train", "steps"): (1, None),
    ("train", "ckpt_every"): (1, None),
    ("train", "eval_every"): (1, None),
    ("train", "eval_batches"): (0, None),
    ("train", "log_every"): (1, None),
    ("train", "keep_checkpoints"): (1, None),
    ("data", "seq_len"): (2, None),
    ("data", "batch_size"): (1, None),
    ("data", "sft_fraction"): (0, 1),
    ("data", "distill_fraction"): (0, 1),
    ("data", "distill_max_repeated_ngram"): (0, 1),
    ("optim", "warmup_steps"): (0, None),
    ("optim", "grad_accum"): (1, None),
    ("optim", "min_lr_ratio"): (0, 1),
    ("optim", "weight_decay"): (0, None),
    ("lora", "rank"): (1, None),
    ("dflash", "block_size"): (2, None),
    ("dflash", "num_layers"): (1, 5),
    ("dflash", "blocks_per_seq"): (1, None),
    ("dflash", "answer_cap"): (1, None),
}


def _typed(sec: str, key: str, value, hint):
    """``value`` checked against the field's type ``hint`` (``int``, ``float``, ``bool``,
    ``str``, ``tuple`` or ``Optional`` of one); lists become tuples, integers and numeric
    strings (YAML reads ``3e-4`` as a string) become floats for float fields.

    Raises:
      TrainConfigError: a value of another type, naming the key and the expected type.
    """
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union and type(None) in args:
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
    if isinstance(value, list):
        value = tuple(value)
    ok = {
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        bool: lambda v: isinstance(v, bool),
        str: lambda v: isinstance(v, str),
        tuple: lambda v: isinstance(v, tuple),
    }.get(hint)
    if ok is None:
        return value
    if hint is float and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if not ok(value):
        raise TrainConfigError(f"{sec}.{key} must be {_TYPE_NAMES[hint]}, got {value!r}")
    if hint is float:
        value = float(value)
    lo, hi = _RANGES.get((sec, key), (None, None))
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        where = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise TrainConfigError(f"{sec}.{key} must be {where}, got {value!r}")
    return value


def config_from_dict(d: dict) -> TrainConfig:
    """Build a :class:`TrainConfig`; lists become tuples, every value is checked against its
    field's type and, for counts and fractions, its range.

    Raises:
      TrainConfigError: unknown section or key, a section that is not a mapping, a value of
        the wrong type or out of range (one line naming ``section.key`` and what it must be).
    """
    if d is not None and not isinstance(d, dict):
        raise TrainConfigError(
            f"a training config must be a mapping of sections, got {type(d).__name__}"
        )
    d = dict(d or {})
    kw: dict[str, Any] = {"name": str(d.pop("name", "unnamed"))}
    for sec, val in d.items():
        if sec not in _SECTIONS:
            raise TrainConfigError(
                f"unknown config section {sec!r}; expected {', '.join(_SECTIONS)}"
            )
        if val is None:
            kw[sec] = None
            continue
        if not isinstance(val, dict):
            raise TrainConfigError(f"config section {sec!r} must be a mapping of keys, got {val!r}")
        cls = _SECTIONS[sec]
        names = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(val) - names)
        if bad:
            raise TrainConfigError(
                f"unknown key(s) {bad} in section {sec!r}; expected {sorted(names)}"
            )
        hints = typing.get_type_hints(cls)
        kw[sec] = cls(**{k: _typed(sec, k, v, hints[k]) for k, v in val.items()})
    cfg = TrainConfig(**kw)
    if cfg.objective.kind not in OBJECTIVES:
        raise TrainConfigError(
            f"unknown objective.kind {cfg.objective.kind!r}; expected one of {OBJECTIVES}"
        )
    if cfg.objective.kind == "asarm":
        if cfg.asarm is None:
            cfg.asarm = AsarmSection()
        if cfg.lora is not None:
            raise TrainConfigError("objective.kind = asarm does not support a lora section")
    if cfg.objective.kind == "dflash":
        if cfg.dflash is None:
            cfg.dflash = DFlashSection()
        if cfg.lora is not None:
            raise TrainConfigError("objective.kind = dflash does not support a lora section")
        if cfg.dflash.gamma is not None and not cfg.dflash.gamma > 0:
            raise TrainConfigError(
                f"dflash.gamma must be > 0 (or null: uniform weights), got {cfg.dflash.gamma}"
            )
        if cfg.dflash.init_weights and cfg.dflash.init_target_layers:
            raise TrainConfigError(
                "dflash.init_weights and dflash.init_target_layers exclude each other "
                "(both say where the drafter starts)"
            )
    if cfg.objective.kind == "sar" and (
        int(cfg.objective.sar_k) < 1 or not 0.0 <= float(cfg.objective.p_ar) <= 1.0
    ):
        raise TrainConfigError(
            f"objective.sar_k must be >= 1 and p_ar in [0, 1], got "
            f"{cfg.objective.sar_k} and {cfg.objective.p_ar}"
        )
    if int(cfg.train.data_offset) < 0:
        raise TrainConfigError(f"train.data_offset must be >= 0, got {cfg.train.data_offset}")
    if cfg.asarm is not None and cfg.asarm.init_weights and cfg.asarm.embed_init:
        raise TrainConfigError(
            "asarm.init_weights and asarm.embed_init exclude each other "
            "(the start weights already hold the embedding)"
        )
    return cfg


def load_config(path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a YAML config and apply ``section.key=value`` overrides (values parsed as YAML).

    Raises:
      TrainConfigError: missing file, malformed override, unknown key.
    """
    path = Path(path)
    if not path.is_file():
        raise TrainConfigError(f"config file {path} not found")
    try:
        d = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise TrainConfigError(f"{path} is not valid YAML: {_yaml_problem(e)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TrainConfigError(f"cannot read config file {path}: {e}") from None
    if not isinstance(d, dict):
        raise TrainConfigError(
            f"{path} must hold a mapping of sections (name, model, data, "
            f"...), got {type(d).__name__}"
        )
    for ov in overrides:
        if "=" not in ov or "." not in ov.split("=", 1)[0]:
            raise TrainConfigError(f"override {ov!r} is not of the form section.key=value")
        k, v = ov.split("=", 1)
        sec, key = k.split(".", 1)
        if d.get(sec) is None:
            d[sec] = {}
        if not isinstance(d[sec], dict):
            raise TrainConfigError(f"override {ov!r}: section {sec!r} is not a mapping")
        try:
            d[sec][key] = yaml.safe_load(v)
        except yaml.YAMLError as e:
            raise TrainConfigError(
                f"override {ov!r}: the value is not valid YAML: {_yaml_problem(e)}"
            ) from None
    return config_from_dict(d)


def _yaml_problem(e: Exception) -> str:
    """A YAML error in one line: what and where (line and column, 1-based)."""
    mark = getattr(e, "problem_mark", None)
    what = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{what} at line {mark.line + 1}, column {mark.column + 1}" if mark else what


__all__ = [
    "TrainConfigError",
    "ModelSection",
    "LoraSection",
    "DataSection",
    "OBJECTIVES",
    "ObjectiveSection",
    "OptimSection",
    "TrainSection",
    "AsarmSection",
    "DFlashSection",
    "TrainConfig",
    "config_from_dict",
    "load_config",
]
