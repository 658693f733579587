"""The vehicles and prompts of the device run, and the pack that carries them.

A vehicle is a model plus its parameters, one per slot (``causal``, ``space``: the SpACE model,
``dllm``, ``asarm``): tiny random ones for a smoke run (:func:`smoke_vehicles`,
:func:`smoke_prompts`), else the presets on the SmolLM2 GGUF (:data:`REAL_VEHICLES`,
:func:`real_prompts`). :func:`build_pack` packs them on the CPU machine
(:mod:`jaxspec.bench.device.pack`); :func:`load_vehicles` builds them on the device.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from jaxspec.bench.device.pack import (
    JAX_CACHE_ARTIFACT,
    JAX_CACHE_MAX_BYTES,
    MANIFEST,
    PACK_FORMAT,
    PART_MAX_BYTES,
    PROMPTS,
    MiB,
    PackError,
    join_returned_cache,
    sha256_file,
    split_file,
)
from jaxspec.bench.device.pages import now_iso

#: the optional artifact of the committed trained DFlash drafter for the SmolLM2 vehicle (the
#: run's ``dflash`` rows use it; without it they time a random drafter of block 16)
DFLASH_ARTIFACT = "dflash-drafter"
TRAINED_DFLASH = "checkpoints/dflash-smollm2-135m/drafter.safetensors"


# ----------------------------------------------------------------------------- params


def save_params(params, path: Path) -> None:
    """Write a parameter tree (nested dicts of arrays) as one safetensors file, keys joined
    with ``/``."""
    import numpy as np
    from flax.traverse_util import flatten_dict
    from safetensors.numpy import save_file

    flat = flatten_dict(dict(params), sep="/")
    save_file({k: np.asarray(v) for k, v in flat.items()}, str(path))


def load_params(path: Path):
    """The parameter tree :func:`save_params` wrote (numpy arrays in nested dicts)."""
    from flax.traverse_util import unflatten_dict
    from safetensors.numpy import load_file

    return unflatten_dict(load_file(str(path)), sep="/")


# ----------------------------------------------------------------------------- vehicles

# The smoke vehicles' vocabulary when transformers cannot build the tiny HF model (the HF one
# has 300 ids: jaxspec.testing.hf.TINY_DIMS).
SMOKE_VOCAB = 64
# Real vehicles: presets whose weights are the SmolLM2 GGUF (packed) plus deltas and the
# AS-ARM checkpoint committed in the tree.
REAL_VEHICLES = {
    "causal": "smollm2-135m-instruct",
    "space": "smollm2-135m-space",
    "dllm": "dream-smollm2-135m",
    "asarm": "asarm-small",
}
REAL_GGUF_PRESET = "smollm2-135m-instruct"


@dataclasses.dataclass
class Vehicle:
    """A loaded test vehicle: model, params, the family it runs, and the ids that end or pad
    its outputs; ``hf_path`` is the same weights for transformers (causal vehicles)."""

    name: str
    family: str
    model: Any
    params: Any
    eos_ids: tuple = ()
    pad_id: int = 0
    hf_path: Optional[Path] = None
    extra: dict = dataclasses.field(default_factory=dict)


def dflash_drafter(vehicle: Vehicle) -> tuple:
    """The ``(DFlashSpec, weights)`` the vehicle's ``dflash`` rows use, loaded once: the
    trained drafter the pack carried (``extra["dflash_file"]``, :data:`DFLASH_ARTIFACT`), else
    a random one of block 16, which times the drafter's forward and checks identity (its
    acceptance is near 0 and its MAT says nothing).

    Raises:
      ValueError: the carried drafter was trained for another target
        (:meth:`jaxspec.causal.dflash.DFlashSpec.check_target`) or its file is unreadable."""
    from jaxspec.causal.dflash import DFlashSpec, init_drafter, load_drafter

    if "dflash_drafter" not in vehicle.extra:
        if vehicle.extra.get("dflash_file"):
            spec, own = load_drafter(vehicle.extra["dflash_file"])
            spec.check_target(vehicle.model.config)
        else:
            spec = DFlashSpec.for_target(vehicle.model.config, block_size=16)
            own = init_drafter(spec, seed=0)
        vehicle.extra["dflash_drafter"] = (spec, own)
    return vehicle.extra["dflash_drafter"]


def _tiny_factories():
    from jaxspec.testing.tiny import tiny_diffusion_model, tiny_model, tiny_xlnet

    return {
        "tiny_model": tiny_model,
        "tiny_diffusion_model": tiny_diffusion_model,
        "tiny_xlnet": tiny_xlnet,
    }


def smoke_vehicles(work: Path, *, hf: bool = True) -> tuple[list[tuple[str, Path, str]], dict]:
    """Build the smoke pack's tiny random vehicles in ``work``.

    The causal vehicle is a tiny Hugging Face Llama directory (:func:`jaxspec.testing.hf.
    build_tiny_hf`, so the transformers peers read the same weights) when ``hf`` and
    transformers can build it locally, else a tiny jaxspec model; the SAR (SPACE),
    masked-diffusion (Dream head) and XLNet AS-ARM vehicles are jaxspec tiny models saved as
    safetensors. Returns ``([(artifact name, file, dest)], vehicles manifest entry)``."""
    files, vehicles = [], {}
    vocab = SMOKE_VOCAB
    if hf:
        try:
            from jaxspec.testing.hf import TINY_DIMS, build_tiny_hf

            d = work / "causal-hf"
            build_tiny_hf(d, arch="llama", seed=0)
            vocab = TINY_DIMS["vocab_size"]
            for f in sorted(d.iterdir()):
                if f.is_file():
                    files.append((f"causal-{f.name}", f, f"vehicles/causal/{f.name}"))
            vehicles["causal"] = {"kind": "hf-dir", "family": "causal", "dir": "vehicles/causal"}
        except ImportError:
            hf = False
    specs = {
        "space": ("tiny_model", {"vocab": vocab, "mask_token_id": vocab - 1, "seed": 3}),
        "dllm": ("tiny_diffusion_model", {"head": "dream", "vocab": vocab, "ctx": 128}),
        "asarm": ("tiny_xlnet", {"vocab": 11}),
    }
    if not hf:
        specs["causal"] = ("tiny_model", {"vocab": vocab, "seed": 0})
    fam = {"causal": "causal", "space": "causal", "dllm": "dllm", "asarm": "asarm"}
    for name, (factory, kwargs) in specs.items():
        _, params = _tiny_factories()[factory](**kwargs)
        path = work / f"{name}.safetensors"
        save_params(params, path)
        files.append((name, path, f"vehicles/{name}.safetensors"))
        vehicles[name] = {
            "kind": "tiny",
            "family": fam[name],
            "factory": factory,
            "kwargs": kwargs,
            "file": f"vehicles/{name}.safetensors",
        }
    vehicles["vocab"] = vocab
    return files, vehicles


def smoke_prompts(vocab: int, n: int = 8, seed: int = 0) -> dict:
    """Random prompt ids for the smoke run: causal / dllm prompts of 6-12 tokens (ids 3..),
    XLNet infilling tasks of 12 tokens with a seeded mask."""
    import numpy as np

    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, vocab - 1, int(rng.integers(6, 13))).tolist() for _ in range(n)]
    tasks = []
    for _ in range(n):
        toks = rng.integers(1, 10, 12).tolist()
        masked = [bool(i >= 3 and rng.random() < 0.7) for i in range(12)]
        masked[-1] = True
        tasks.append({"tokens": toks, "masked": masked})
    return {
        "task_ids": [f"smoke/{i}" for i in range(n)],
        "causal": prompts,
        "dllm": prompts,
        "asarm": tasks,
        "eos_ids": [2],
        "pad_id": 0,
    }


def real_prompts(
    gguf: Path, n: int = 8, asarm_len: int = 64, mask_rate: float = 0.9, seed: int = 0
) -> dict:
    """Token ids of the first ``n`` HumanEval prompts for the real vehicles: raw stubs for the
    causal suites (the ``ar`` suite's prompts), chat-wrapped for the instruct dLLM, and XLNet
    infilling tasks (the first ``asarm_len`` ids of each stub mapped to asarm-small's compact
    vocabulary, positions after the first 8 masked with probability ``mask_rate``)."""
    import numpy as np

    from jaxspec.eval.datasets import humaneval_problems, humaneval_prompt
    from models.registry import load_asarm
    from models.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(gguf)
    probs = humaneval_problems()[:n]
    causal = [tok.encode(humaneval_prompt(p, tok, False)) for p in probs]
    dllm = [tok.encode(humaneval_prompt(p, tok, True)) for p in probs]
    asarm = load_asarm(REAL_VEHICLES["asarm"], log=lambda m: None)
    rng = np.random.default_rng(seed)
    tasks = []
    for ids in causal:
        toks = [int(t) for t in asarm.to_model(ids[:asarm_len])]
        masked = [bool(i >= 8 and rng.random() < mask_rate) for i in range(len(toks))]
        tasks.append({"tokens": toks, "masked": masked})
    eos = [int(e) for e in tok.eos_token_ids]
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    return {
        "task_ids": [p["task_id"] for p in probs],
        "causal": causal,
        "dllm": dllm,
        "asarm": tasks,
        "eos_ids": eos,
        "pad_id": int(pad),
    }


def build_pack(
    pack_dir: Path,
    *,
    smoke: bool = False,
    part_max: int = PART_MAX_BYTES,
    wheels: Sequence[Path] = (),
    gguf: Optional[Path] = None,
    hf: bool = True,
    jax_cache_from: Optional[Path] = None,
    jax_cache_max_bytes: int = JAX_CACHE_MAX_BYTES,
    log: Callable[[str], None] = print,
) -> dict:
    """Build the pack in ``pack_dir`` (emptied first): artifacts in parts, prompts, wheels,
    manifest; with ``jax_cache_from`` (a JAX compilation cache a device run returned:
    :func:`join_returned_cache`) also the optional artifact ``jax-cache``, which the run
    extracts into its cache folder
    (:func:`~jaxspec.bench.device.run.run_device_bench`). ``smoke``: tiny random
    vehicles (seconds); else the SmolLM2 GGUF (``gguf``, the fetched preset file by default;
    the other real vehicles are committed deltas and checkpoints that travel with the tree)
    and the HumanEval prompts.

    Returns the manifest (``total_bytes``: the pack's size).

    Raises:
      PackError: a missing file, a bad part size."""
    import tempfile

    pack_dir = Path(pack_dir)
    if pack_dir.exists():
        shutil.rmtree(pack_dir)
    pack_dir.mkdir(parents=True)
    artifacts, vehicles = [], {}
    with tempfile.TemporaryDirectory(prefix="jaxspec-pack-") as td:
        if smoke:
            files, vehicles = smoke_vehicles(Path(td), hf=hf)
            prompts = smoke_prompts(vehicles["vocab"])
        else:
            from models.registry import fetch, get_preset

            preset = get_preset(REAL_GGUF_PRESET)
            gguf = Path(gguf) if gguf else fetch(preset, log=log)
            files = [("smollm2-gguf", gguf, f"cache/{preset.file}")]
            vehicles = {
                k: {"kind": "preset", "family": _REAL_FAMILY[k], "preset": v}
                for k, v in REAL_VEHICLES.items()
            }
            vehicles["cache"] = "cache"
            prompts = real_prompts(gguf)
            drafter = Path(__file__).resolve().parents[3] / TRAINED_DFLASH
            if drafter.is_file():
                files.append((DFLASH_ARTIFACT, drafter, "dflash/drafter.safetensors"))
        cache_meta = None
        if jax_cache_from is not None:
            tar = Path(td) / "jax-cache.tar"
            info = join_returned_cache(Path(jax_cache_from), tar, jax_cache_max_bytes)
            cache_meta = {k: info.get(k) for k in ("jax", "accelerator", "entries")}
            files.append((JAX_CACHE_ARTIFACT, tar, "jax-cache.tar"))
        from jaxspec.bench.peers import FASTDLLM_ARTIFACT, pack_fastdllm

        if pack_fastdllm(Path(td) / "fastdllm.tar.gz") is not None:  # the official peer code
            files.append((FASTDLLM_ARTIFACT, Path(td) / "fastdllm.tar.gz", "fastdllm.tar.gz"))
        for name, path, dest in files:
            artifacts.append(split_file(path, pack_dir, name, dest, part_max))
            if name == JAX_CACHE_ARTIFACT:
                artifacts[-1].update(optional=True, kind="jax-cache", meta=cache_meta)
            if name == FASTDLLM_ARTIFACT:
                artifacts[-1].update(optional=True, kind="fastdllm")
            if name == DFLASH_ARTIFACT:
                artifacts[-1].update(optional=True, kind="dflash-drafter")
            log(
                f"[pack] {name}: {Path(path).stat().st_size / MiB:.2f} MiB in "
                f"{len(artifacts[-1]['parts'])} part(s)"
            )
    return write_manifest(pack_dir, artifacts, prompts, vehicles, wheels, smoke=smoke)


def write_manifest(
    pack_dir: Path,
    artifacts: list[dict],
    prompts: dict,
    vehicles: dict,
    wheels: Sequence[Path] = (),
    *,
    smoke: bool = False,
) -> dict:
    """Write ``prompts.json``, copy ``wheels`` under ``wheels/`` and write the manifest of
    ``artifacts`` (entries of :func:`split_file`). Returns the manifest."""
    pack_dir = Path(pack_dir)
    (pack_dir / PROMPTS).write_text(json.dumps(prompts) + "\n")
    wheel_entries = []
    for w in wheels:
        dst = pack_dir / "wheels" / Path(w).name
        dst.parent.mkdir(exist_ok=True)
        shutil.copyfile(w, dst)
        wheel_entries.append(
            {"file": f"wheels/{dst.name}", "size": dst.stat().st_size, "sha256": sha256_file(dst)}
        )
    manifest = {
        "format": PACK_FORMAT,
        "smoke": smoke,
        "created": now_iso(),
        "artifacts": artifacts,
        "vehicles": vehicles,
        "wheels": wheel_entries,
        "prompts": {
            "file": PROMPTS,
            "size": (pack_dir / PROMPTS).stat().st_size,
            "sha256": sha256_file(pack_dir / PROMPTS),
        },
    }
    manifest["total_bytes"] = (
        sum(a["size"] for a in artifacts)
        + sum(w["size"] for w in wheel_entries)
        + manifest["prompts"]["size"]
    )
    (pack_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


_REAL_FAMILY = {"causal": "causal", "space": "causal", "dllm": "dllm", "asarm": "asarm"}


def load_vehicles(
    manifest: dict, root: Path, log: Callable[[str], None] = print, dtype: str = "auto"
) -> dict[str, Vehicle]:
    """Load the pack's vehicles from the unpacked folder ``root`` (real presets through
    :func:`models.registry.load_model` with ``$JAXSPEC_CACHE`` pointed at the unpacked GGUF)."""
    from models.registry import load_asarm, load_model

    vs = manifest["vehicles"]
    prompts = json.loads((root / PROMPTS).read_text()) if (root / PROMPTS).is_file() else {}
    eos = tuple(prompts.get("eos_ids", ()))
    pad = int(prompts.get("pad_id", 0))
    out = {}
    if "cache" in vs:
        os.environ["JAXSPEC_CACHE"] = str(root / vs["cache"])
    for name, v in vs.items():
        if not isinstance(v, dict):
            continue
        if v["kind"] == "hf-dir":
            model, params, tok, _ = load_model(
                "hf-directory", str(root / v["dir"]), log=log, dtype=dtype
            )
            out[name] = Vehicle(name, v["family"], model, params, eos, pad, root / v["dir"])
        elif v["kind"] == "tiny":
            import jax

            model, template = _tiny_factories()[v["factory"]](**v["kwargs"])
            loaded = load_params(root / v["file"])
            params = jax.tree_util.tree_map(
                lambda t, x: jax.numpy.asarray(x, t.dtype), template, _as_tree(template, loaded)
            )
            out[name] = Vehicle(name, v["family"], model, params, eos, pad)
        elif v["kind"] == "preset":
            if v["family"] == "asarm":
                a = load_asarm(v["preset"], log=log)
                out[name] = Vehicle(name, "asarm", a.model, a.params, eos, pad, extra={"asarm": a})
            else:
                model, params, tok, preset = load_model(v["preset"], log=log, dtype=dtype)
                from models.registry import fetch

                out[name] = Vehicle(
                    name,
                    v["family"],
                    model,
                    params,
                    eos,
                    pad,
                    fetch(preset, log=log) if name == "causal" else None,
                )
        else:
            raise PackError(f"vehicle {name}: unknown kind {v['kind']!r}")
    return out


def _as_tree(template, loaded):
    """``loaded`` (nested dicts) in ``template``'s container types (flax FrozenDicts etc.)."""
    import jax

    leaves = []
    for path, _ in jax.tree_util.tree_flatten_with_path(template)[0]:
        node = loaded
        for k in path:
            node = node[getattr(k, "key", getattr(k, "name", k))]
        leaves.append(node)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), leaves)
