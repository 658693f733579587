"""Load Hugging Face (safetensors) and GGUF checkpoints into the :mod:`models.llama.modeling` tree.

Every loader returns ``(ModelConfig, params)`` where ``params`` is the ``params`` collection
of :class:`models.llama.modeling.CausalLM` (layout in that module's docstring: layer weights stacked
on a leading axis, matrices input-major) holding float32 ``jax.Array`` leaves.

Tensors are streamed one at a time and written into one preallocated float32 numpy array
per stacked parameter, which is handed to JAX as soon as it is complete, so peak host
memory is about the float32 model plus one stacked parameter.

Sources of facts:
  * Hugging Face Llama / Qwen2 checkpoint tensor names (``model.layers.N.self_attn.q_proj``
    ...) and the ``torch.nn.Linear`` ``(out, in)`` weight layout: transformers
    ``modeling_llama.py`` / ``modeling_qwen2.py``.
  * GGUF tensor and metadata key names (``blk.N.attn_q.weight``, ``{arch}.block_count``,
    ``tokenizer.ggml.eos_token_id`` ...): the GGUF specification in ggml-org/ggml
    ``docs/gguf.md`` and ``gguf-py/gguf/constants.py``.
  * llama.cpp's converter stores Llama q/k rows permuted per head from the HF
    "rotate-half" order to interleaved pairs: rows ``(heads, 2, Dh/2)`` become
    ``(heads, Dh/2, 2)``. Its inverse (used here) is the formula in transformers'
    ``modeling_gguf_pytorch_utils.LlamaTensorProcessor``; Qwen2 tensors are not permuted.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from pathlib import Path
from typing import Callable, Iterable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from models.config import ConfigError, ModelConfig

GGUF_MAGIC = b"GGUF"
SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"

# Per-layer parameters of models.llama.modeling._Layers -> (HF suffix after "model.layers.N.",
# GGUF suffix after "blk.N.", whether the tensor is a torch-layout matrix to transpose).
_LAYER_MAP: dict[str, tuple[str, str, bool]] = {
    "attn_norm": ("input_layernorm.weight", "attn_norm.weight", False),
    "wq": ("self_attn.q_proj.weight", "attn_q.weight", True),
    "wk": ("self_attn.k_proj.weight", "attn_k.weight", True),
    "wv": ("self_attn.v_proj.weight", "attn_v.weight", True),
    "wo": ("self_attn.o_proj.weight", "attn_output.weight", True),
    "bq": ("self_attn.q_proj.bias", "attn_q.bias", False),
    "bk": ("self_attn.k_proj.bias", "attn_k.bias", False),
    "bv": ("self_attn.v_proj.bias", "attn_v.bias", False),
    "mlp_norm": ("post_attention_layernorm.weight", "ffn_norm.weight", False),
    "w_gate": ("mlp.gate_proj.weight", "ffn_gate.weight", True),
    "w_up": ("mlp.up_proj.weight", "ffn_up.weight", True),
    "w_down": ("mlp.down_proj.weight", "ffn_down.weight", True),
}
# Top-level parameters -> (HF name, GGUF name, transpose).
_TOP_MAP: dict[str, tuple[str, str, bool]] = {
    "embed": ("model.embed_tokens.weight", "token_embd.weight", False),
    "final_norm": ("model.norm.weight", "output_norm.weight", False),
    "lm_head": ("lm_head.weight", "output.weight", True),
}


class WeightFileError(ValueError):
    """A weight file or directory is missing, truncated, corrupt, of an unknown format,
    lacks a tensor, or holds a tensor whose shape disagrees with the model config.

    The message is one line naming the file and the problem.
    """


# --------------------------------------------------------------------------- placement

_PLACE: contextvars.ContextVar[Optional[Callable[[str, np.ndarray], jax.Array]]] = (
    contextvars.ContextVar("jaxspec_place_params", default=None)
)


@contextlib.contextmanager
def place_params(place: Optional[Callable[[str, np.ndarray], jax.Array]]):
    """Within this context every loader (HF / GGUF / LLaDA / Dream / native checkpoints)
    hands each finished parameter to ``place(path, host_array)`` instead of
    ``jnp.asarray(host_array, float32)``: ``path`` is ``"embed"``, ``"layers/wq"`` ...
    (stacked layer weights), ``host_array`` a float32 numpy array. Used to load a model
    shard by shard straight into its device placement (:func:`models.sharding.placement`),
    so the host never holds more than one stacked parameter. ``None`` keeps the default."""
    token = _PLACE.set(place)
    try:
        yield
    finally:
        _PLACE.reset(token)


def put_param(path: str, arr: np.ndarray) -> jax.Array:
    """One loaded parameter to a JAX array: float32 on the default device, or through the
    active :func:`place_params` hook."""
    place = _PLACE.get()
    return jnp.asarray(arr, dtype=jnp.float32) if place is None else place(path, arr)


# --------------------------------------------------------------------------- helpers


def _expected_shapes(config: ModelConfig) -> dict:
    """Shape tree of ``init_params(config)`` without allocating it (``jax.eval_shape``)."""
    from models.llama.modeling import init_params

    return jax.eval_shape(lambda: init_params(config))


def _assemble(
    config: ModelConfig, fetch: Callable[[str, int | None], tuple[str, np.ndarray]], where: str
) -> dict:
    """Build the params tree by calling ``fetch(key, layer)`` for every leaf.

    ``fetch(key, None)`` returns ``(source tensor name, array)`` for a top-level parameter,
    ``fetch(key, i)`` for layer ``i`` of a stacked one, the array already float32 and in our
    (input-major) layout. Each stacked parameter is filled into one preallocated numpy
    array and converted to a JAX array before the next one is started. Shapes are checked
    against ``jax.eval_shape(init_params)`` so the tree always matches the model.
    """
    shapes = _expected_shapes(config)
    params: dict = {}
    for key, spec in shapes.items():
        if key == "layers":
            continue
        src, arr = fetch(key, None)
        _check_shape(arr.shape, spec.shape, f"{src} (-> {key})", where)
        params[key] = put_param(key, np.asarray(arr, np.float32))
        del arr
    layers = {}
    for key, spec in shapes["layers"].items():
        buf = np.empty(spec.shape, dtype=np.float32)
        for i in range(config.num_layers):
            src, arr = fetch(key, i)
            _check_shape(arr.shape, spec.shape[1:], f"{src} (-> layers/{key}[{i}])", where)
            buf[i] = arr
            del arr
        layers[key] = put_param(f"layers/{key}", buf)
        del buf
    params["layers"] = layers
    return params


def _check_shape(got: Iterable[int], want: Iterable[int], name: str, where: str) -> None:
    got, want = tuple(int(s) for s in got), tuple(int(s) for s in want)
    if got != want:
        raise WeightFileError(
            f"{where}: tensor {name} has shape {got} (after conversion) "
            f"but the config expects {want}"
        )


def _read_magic(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(8)
    except OSError as e:
        raise WeightFileError(f"{path}: cannot read file ({e.strerror or e})") from None


def _reverse_llama_rope_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation for Llama GGUF files.

    ``w`` is ``(n_heads * Dh, ...)`` in torch layout (rows = output features). llama.cpp
    reorders each head's rows from ``(2, Dh/2)`` (HF rotate-half) to ``(Dh/2, 2)``
    (interleaved pairs); viewing rows as ``(n_heads, Dh/2, 2)`` and swapping the last two
    axes restores the HF order. ``n_heads`` is the query head count for q and the KV head
    count for k.
    """
    rows = w.shape[0]
    half = rows // n_heads // 2
    return np.ascontiguousarray(
        w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


# --------------------------------------------------------------------------- safetensors


class _SafetensorsSource:
    """Tensor lookup over one or more safetensors files (handles opened lazily, kept open)."""

    def __init__(self, name_to_file: dict[str, Path], where: str):
        self.where = where
        self._name_to_file = dict(name_to_file)
        self._handles: dict[tuple[Path, str], object] = {}

    @classmethod
    def from_files(cls, paths: list[Path], where: str) -> "_SafetensorsSource":
        src = cls({}, where)
        for p in paths:
            for name in src._open(p).keys():
                src._name_to_file[name] = p
        return src

    def _open(self, file: Path, framework: str = "numpy"):
        from safetensors import safe_open

        key = (file, framework)
        if key not in self._handles:
            if not file.is_file():
                raise WeightFileError(f"{file}: safetensors shard is missing")
            try:
                self._handles[key] = safe_open(str(file), framework=framework)
            except Exception as e:  # SafetensorError: truncated header/data, bad JSON
                raise WeightFileError(
                    f"{file}: not a readable safetensors file (truncated or corrupt: {_short(e)})"
                ) from None
        return self._handles[key]

    @property
    def names(self) -> frozenset[str]:
        """Names of all tensors this source can return."""
        return frozenset(self._name_to_file)

    def get(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a float32 numpy array (BF16 is read through JAX: numpy has
        no bfloat16, so ``safe_open(framework="numpy")`` rejects it)."""
        file = self._name_to_file.get(name)
        if file is None:
            raise WeightFileError(f"{self.where}: missing tensor {name}")
        h = self._open(file)
        try:
            if h.get_slice(name).get_dtype() == "BF16":
                return np.asarray(self._open(file, "flax").get_tensor(name), dtype=np.float32)
            return np.asarray(h.get_tensor(name), dtype=np.float32)
        except WeightFileError:
            raise
        except Exception as e:
            raise WeightFileError(f"{file}: cannot read tensor {name} ({_short(e)})") from None


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise WeightFileError(f"{path}: file is missing") from None
    except (OSError, ValueError) as e:
        raise WeightFileError(f"{path}: not valid JSON ({_short(e)})") from None


def _hf_config(cfg_path: Path) -> ModelConfig:
    raw = _read_json(cfg_path)
    gen = cfg_path.parent / "generation_config.json"
    config = ModelConfig.from_hf_dict(raw)
    if gen.is_file():  # generation_config's eos list (e.g. Qwen2.5 instruct) extends config's
        try:
            g = json.loads(gen.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            g = {}
        eos = g.get("eos_token_id")
        eos = eos if isinstance(eos, list) else ([] if eos is None else [eos])
        merged = tuple(dict.fromkeys([*config.eos_token_ids, *(int(e) for e in eos)]))
        config = config.replace(eos_token_ids=merged)
    return config


def _load_safetensors(config: ModelConfig, src: _SafetensorsSource, where: str) -> dict:
    def fetch(key: str, layer: int | None) -> np.ndarray:
        if layer is None:
            name, _, transpose = _TOP_MAP[key]
        else:
            suffix, _, transpose = _LAYER_MAP[key]
            name = f"model.layers.{layer}.{suffix}"
        arr = src.get(name)
        return name, (np.ascontiguousarray(arr.T) if transpose else arr)

    return _assemble(config, fetch, where)


def load_hf_dir(path) -> tuple[ModelConfig, dict]:
    """Load a Hugging Face Llama / Qwen2 checkpoint directory.

    Args:
      path: directory holding ``config.json`` and either ``model.safetensors`` or a
        sharded ``model.safetensors.index.json`` plus its shards. An optional
        ``generation_config.json`` contributes extra ``eos_token_id`` values.

    Returns:
      ``(config, params)``: params float32 ``jax.Array`` leaves in the
      :mod:`models.llama.modeling` layout (``embed (V, D)``, ``layers/wq (L, D, H*Dh)`` ...).
      Tensor dtypes F32 / F16 / BF16 are all widened to float32. With tied embeddings a
      stored ``lm_head.weight`` is ignored.

    Raises:
      WeightFileError: missing directory or files, truncated/corrupt safetensors, missing
        tensors, or shapes that disagree with ``config.json``.
      ConfigError: ``config.json`` names an unsupported architecture or lacks a field.
    """
    d = Path(path)
    if not d.is_dir():
        raise WeightFileError(f"{d}: checkpoint directory does not exist")
    config = _hf_config(d / "config.json")
    src, where = _dir_source(d)
    return config, _load_safetensors(config, src, where)


def _dir_source(d: Path) -> tuple["_SafetensorsSource", str]:
    """Tensor source of checkpoint directory ``d``: the sharded index when present, else
    the single ``model.safetensors``. Returns ``(source, where)`` (``where`` names the file
    used in error messages).

    Raises:
      WeightFileError: neither file exists or the index has no ``weight_map``.
    """
    index = d / SAFETENSORS_INDEX
    single = d / SAFETENSORS_SINGLE
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise WeightFileError(f"{index}: has no 'weight_map' object")
        return _SafetensorsSource({k: d / v for k, v in weight_map.items()}, str(index)), str(index)
    if single.is_file():
        return _SafetensorsSource.from_files([single], str(single)), str(single)
    raise WeightFileError(
        f"{d}: no {SAFETENSORS_SINGLE} or {SAFETENSORS_INDEX} in the checkpoint directory"
    )


def _load_safetensors_file(path: Path) -> tuple[ModelConfig, dict]:
    cfg = path.parent / "config.json"
    if not cfg.is_file():
        raise WeightFileError(f"{path}: a lone safetensors file needs a config.json beside it")
    config = _hf_config(cfg)
    src = _SafetensorsSource.from_files([path], str(path))
    return config, _load_safetensors(config, src, str(path))


# --------------------------------------------------------------------------- GGUF


def _open_gguf(path) -> "gguf.GGUFReader":  # noqa: F821
    """Open a GGUF file after checking existence, magic and that every tensor fits."""
    import gguf

    p = Path(path)
    if not p.exists():
        raise WeightFileError(f"{p}: file does not exist")
    if not p.is_file():
        raise WeightFileError(f"{p}: is not a file")
    magic = _read_magic(p)
    if magic[:4] != GGUF_MAGIC:
        raise WeightFileError(
            f"{p}: not a GGUF file (magic {magic[:4]!r}, expected {GGUF_MAGIC!r})"
        )
    try:
        reader = gguf.GGUFReader(str(p), "r")
    except Exception as e:  # truncated files fail while the reader maps tensor views
        raise WeightFileError(f"{p}: truncated or corrupt GGUF file ({_short(e)})") from None
    size = p.stat().st_size
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise WeightFileError(
                f"{p}: truncated GGUF file (tensor {t.name} ends at byte {end}, file has {size})"
            )
    return reader


def _gguf_field(reader, key: str, default=None, required: bool = False, where: str = ""):
    field = reader.fields.get(key)
    if field is None:
        if required:
            raise WeightFileError(f"{where}: GGUF metadata key {key} is missing")
        return default
    try:
        return field.contents()
    except Exception as e:
        raise WeightFileError(
            f"{where}: cannot decode GGUF metadata key {key} ({_short(e)})"
        ) from None


def gguf_config(reader, where: str = "") -> ModelConfig:
    """:class:`ModelConfig` from an open ``gguf.GGUFReader``'s metadata.

    Keys read: ``general.architecture`` (``llama`` / ``qwen2``), ``{arch}.block_count``,
    ``{arch}.embedding_length``, ``{arch}.feed_forward_length``,
    ``{arch}.attention.head_count[_kv]``, ``{arch}.attention.key_length`` (optional head
    width), ``{arch}.rope.freq_base`` (default 10000), ``{arch}.attention.layer_norm_rms_epsilon``,
    ``{arch}.context_length``, ``tokenizer.ggml.{bos,eos,eot,eom,padding}_token_id``. The
    vocabulary size is the row count of ``token_embd.weight``; embeddings are tied when
    ``output.weight`` is absent; q/k/v biases are present when ``blk.0.attn_q.bias`` is.

    Raises:
      WeightFileError: required metadata or ``token_embd.weight`` missing.
      ConfigError: unsupported architecture or RoPE scaling.
    """
    arch = _gguf_field(reader, "general.architecture", required=True, where=where)
    if arch not in ("llama", "qwen2"):
        raise ConfigError(f"{where}: GGUF architecture {arch!r} is not supported (llama, qwen2)")
    names = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in names:
        raise WeightFileError(f"{where}: missing tensor token_embd.weight")
    scaling = _gguf_field(reader, f"{arch}.rope.scaling.type", default="none")
    if scaling not in ("none", None, ""):
        raise ConfigError(f"{where}: RoPE scaling {scaling!r} is not supported")

    def req(key):
        return _gguf_field(reader, f"{arch}.{key}", required=True, where=where)

    hidden = int(req("embedding_length"))
    heads = int(req("attention.head_count"))
    kv_heads = int(_gguf_field(reader, f"{arch}.attention.head_count_kv", default=heads))
    head_dim = int(_gguf_field(reader, f"{arch}.attention.key_length", default=hidden // heads))
    eos = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        v = _gguf_field(reader, f"tokenizer.ggml.{key}")
        if v is not None:
            eos.append(int(v))
    bos = _gguf_field(reader, "tokenizer.ggml.bos_token_id")
    pad = _gguf_field(reader, "tokenizer.ggml.padding_token_id")
    return ModelConfig(
        arch=arch,
        vocab_size=int(names["token_embd.weight"].shape[-1]),  # ggml ne = (D, V)
        hidden_size=hidden,
        intermediate_size=int(req("feed_forward_length")),
        num_layers=int(req("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=float(_gguf_field(reader, f"{arch}.rope.freq_base", default=10000.0)),
        rms_norm_eps=float(req("attention.layer_norm_rms_epsilon")),
        tie_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        max_position_embeddings=int(_gguf_field(reader, f"{arch}.context_length", default=2048)),
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=tuple(dict.fromkeys(eos)),
        pad_token_id=None if pad is None else int(pad),
    )


def load_gguf(path) -> tuple[ModelConfig, dict]:
    """Load a Llama / Qwen2 GGUF file, dequantizing every tensor to float32.

    Dequantization uses ``gguf.quants.dequantize`` (numpy; all ggml quant types the
    ``gguf`` package supports, e.g. Q4_0/Q4_1/Q8_0/Q4_K/Q6_K, F16, BF16). For architecture
    ``llama`` the q/k projection rows are un-permuted back to the HF rotate-half layout
    (see :func:`_reverse_llama_rope_permute`); ``qwen2`` files are stored unpermuted.

    Args:
      path: the ``.gguf`` file.

    Returns:
      ``(config, params)`` as :func:`load_hf_dir` (float32 ``jax.Array`` leaves).

    Raises:
      WeightFileError: missing file, bad magic, truncated/corrupt file, missing tensors,
        shapes inconsistent with the metadata.
      ConfigError: unsupported architecture or RoPE scaling.
    """
    import gguf

    where = str(path)
    reader = _open_gguf(path)
    config = gguf_config(reader, where)
    tensors = {t.name: t for t in reader.tensors}

    def read(name: str) -> np.ndarray:
        t = tensors.get(name)
        if t is None:
            raise WeightFileError(f"{where}: missing tensor {name}")
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as e:
            raise WeightFileError(
                f"{where}: cannot dequantize tensor {name} ({t.tensor_type.name}: {_short(e)})"
            ) from None
        return np.asarray(arr, dtype=np.float32)

    def fetch(key: str, layer: int | None) -> np.ndarray:
        if layer is None:
            _, name, transpose = _TOP_MAP[key]
        else:
            _, suffix, transpose = _LAYER_MAP[key]
            name = f"blk.{layer}.{suffix}"
        arr = read(name)  # torch layout: (out, in) for matrices
        if config.arch == "llama" and key in ("wq", "bq"):
            arr = _reverse_llama_rope_permute(arr, config.num_heads)
        elif config.arch == "llama" and key in ("wk", "bk"):
            arr = _reverse_llama_rope_permute(arr, config.num_kv_heads)
        return name, (np.ascontiguousarray(arr.T) if transpose else arr)

    params = _assemble(config, fetch, where)
    del reader
    return config, params


# --------------------------------------------------------------------------- dispatch


def weight_format(path) -> str:
    """``"hf_dir"``, ``"gguf"`` or ``"safetensors"`` for ``path``.

    A directory is an HF checkpoint; a file is GGUF when it starts with the ``GGUF`` magic
    (or is named ``*.gguf``, then the magic is checked on load), safetensors when named
    ``*.safetensors``.

    Raises:
      WeightFileError: the path does not exist or is neither GGUF nor safetensors.
    """
    p = Path(path)
    if p.is_dir():
        return "hf_dir"
    if not p.exists():
        raise WeightFileError(f"{p}: no such file or directory")
    if p.suffix.lower() == ".gguf" or _read_magic(p)[:4] == GGUF_MAGIC:
        return "gguf"
    if p.suffix.lower() == ".safetensors":
        return "safetensors"
    raise WeightFileError(f"{p}: neither a GGUF file (no GGUF magic) nor a .safetensors file")


def load_weights(path) -> tuple[ModelConfig, dict]:
    """Load weights from an HF directory, a GGUF file or a lone ``.safetensors`` file.

    Dispatch (see :func:`weight_format`): directory -> :func:`load_hf_dir`; ``*.gguf`` or
    a file with the GGUF magic -> :func:`load_gguf`; ``*.safetensors`` -> that file with the
    ``config.json`` beside it.

    Returns:
      ``(config, params)`` with float32 ``jax.Array`` leaves.

    Raises:
      WeightFileError, ConfigError: as the individual loaders.
    """
    fmt = weight_format(path)
    if fmt == "hf_dir":
        return load_hf_dir(path)
    if fmt == "gguf":
        return load_gguf(path)
    return _load_safetensors_file(Path(path))


__all__ = [
    "WeightFileError",
    "ConfigError",
    "load_hf_dir",
    "load_gguf",
    "load_weights",
    "gguf_config",
    "weight_format",
    "place_params",
    "put_param",
]
