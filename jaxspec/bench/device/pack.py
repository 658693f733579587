"""The device pack: the files a device call carries, split, checked and unpacked.

A lent GPU machine has no network and receives at most 64 MiB per call, so what the device run
needs is packed on the CPU machine into an ignored folder of parts, each with its sha256, and
joined and checked on the device before use.

Pack layout (``device_pack/`` by default)::

    manifest.json        artifacts (each split into parts <= 60 MiB, sha256 per part and per
                         whole file), vehicles, prompts, wheels, sizes
    parts/<artifact>.NN  the parts
    wheels/*.whl         Python packages the device image lacks
    prompts.json         prompt token ids (so the device needs no tokenizer or data set)

The persistent JAX compilation cache travels the same way: exported under ``$OUT`` in parts
(:func:`export_jax_cache`), joined and checked here (:func:`join_returned_cache`), carried in
the next pack and extracted on the device (:func:`extract_jax_cache`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Optional, Sequence

MiB = 1 << 20
PART_MAX_BYTES = 60 * MiB
PACK_DIR = "device_pack"
MANIFEST = "manifest.json"
PROMPTS = "prompts.json"
PACK_FORMAT = 1
# Returned JAX compilation cache: files of at most this size come back under $OUT
# (jax-cache.tar.NN), at most JAX_CACHE_MAX_BYTES in all, described by jax-cache.json.
RETURN_PART_BYTES = 16 * MiB
JAX_CACHE_MAX_BYTES = 48 * MiB
JAX_CACHE_JSON = "jax-cache.json"
JAX_CACHE_ARTIFACT = "jax-cache"
# What the device image lacks (/work/.library/device/KINDS.md lists its packages: jax 0.11.2,
# flax, optax, orbax, chex, safetensors, tokenizers, transformers 5.17, torch 2.11 are there).
# gguf reads the SmolLM2 weight file, for jaxspec and for transformers' GGUF loader alike;
# einops is imported by the official Fast-dLLM LLaDA modeling code (the peers suite).
DEVICE_WHEELS = ("gguf==0.19.0", "einops==0.8.2")


class PackError(ValueError):
    """A pack that cannot be built, is incomplete, or fails its sha256 check (one line)."""


# ----------------------------------------------------------------------------- files


def sha256_file(path: Path, chunk: int = 4 * MiB) -> str:
    """Hex sha256 of a file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def split_file(
    src: Path, pack_dir: Path, name: str, dest: str, part_max: int = PART_MAX_BYTES
) -> dict:
    """Split ``src`` into parts of at most ``part_max`` bytes under ``pack_dir/parts``.

    Returns the manifest entry ``{name, dest, size, sha256, parts: [{file, size, sha256}]}``
    (``dest``: where :func:`unpack` puts the joined file, relative to its target folder).

    Raises:
      PackError: ``part_max`` outside 1..60 MiB or a missing source file.
    """
    if not 1 <= part_max <= PART_MAX_BYTES:
        raise PackError(f"part size must be 1..{PART_MAX_BYTES} bytes, got {part_max}")
    src = Path(src)
    if not src.is_file():
        raise PackError(f"cannot pack {src}: no such file")
    parts_dir = pack_dir / "parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    whole = hashlib.sha256()
    parts = []
    with open(src, "rb") as f:
        i = 0
        while True:
            block = f.read(part_max)
            if not block and i > 0:
                break
            whole.update(block)
            rel = f"parts/{name}.{i:02d}"
            (pack_dir / rel).write_bytes(block)
            parts.append(
                {"file": rel, "size": len(block), "sha256": hashlib.sha256(block).hexdigest()}
            )
            i += 1
            if len(block) < part_max:
                break
    return {
        "name": name,
        "dest": dest,
        "size": src.stat().st_size,
        "sha256": whole.hexdigest(),
        "parts": parts,
    }


def read_manifest(pack_dir: Path) -> dict:
    """The pack's manifest.

    Raises:
      PackError: no manifest (run ``python -m scripts.device_bench pack`` first), or one of
        another format."""
    path = Path(pack_dir) / MANIFEST
    if not path.is_file():
        raise PackError(
            f"no pack at {pack_dir} (missing {MANIFEST}); build it with "
            "`python -m scripts.device_bench pack`"
        )
    m = json.loads(path.read_text())
    if m.get("format") != PACK_FORMAT:
        raise PackError(f"{path}: pack format {m.get('format')!r}, expected {PACK_FORMAT}")
    return m


def _find_part(rel: str, dirs: Sequence[Path]) -> Optional[Path]:
    for d in dirs:
        if (Path(d) / rel).is_file():
            return Path(d) / rel
    return None


def verify_pack(pack_dir: Path, stage_dirs: Sequence[Path] = ()) -> dict:
    """Check that every part of every artifact and every wheel is present with its size and
    sha256. Parts are looked for in ``pack_dir`` first, then in ``stage_dirs`` (where
    earlier calls of a multi-call plan left theirs: :func:`stage_parts`). An ``optional``
    artifact (the JAX compilation cache) with a part missing is left out, not an error.

    Returns the manifest, its ``artifacts`` those that are complete, ``left_out`` the names of
    the optional ones left out.

    Raises:
      PackError: one line naming the first missing or corrupt file and the two digests.
    """
    m = read_manifest(pack_dir)
    dirs = [Path(pack_dir), *map(Path, stage_dirs)]
    # an optional artifact (the returned JAX compilation cache) that did not travel is left out
    m["left_out"] = [
        a["name"]
        for a in m["artifacts"]
        if a.get("optional") and any(_find_part(p["file"], dirs) is None for p in a["parts"])
    ]
    m["artifacts"] = [a for a in m["artifacts"] if a["name"] not in m["left_out"]]
    files = [(p, a["name"]) for a in m["artifacts"] for p in a["parts"]]
    files += [(w, "wheels") for w in m.get("wheels", [])]
    files += [(m["prompts"], "prompts")]
    for entry, what in files:
        path = _find_part(entry["file"], dirs)
        if path is None:
            where = ", ".join(map(str, dirs))
            raise PackError(f"{what}: part {entry['file']} missing from {where}")
        size = path.stat().st_size
        if size != entry["size"]:
            raise PackError(f"{what}: {path} has {size} bytes, the manifest says {entry['size']}")
        got = sha256_file(path)
        if got != entry["sha256"]:
            raise PackError(
                f"{what}: {path} fails its sha256 check (got {got[:16]}..., "
                f"manifest {entry['sha256'][:16]}...)"
            )
    return m


def unpack(
    pack_dir: Path, dest: Path, stage_dirs: Sequence[Path] = (), manifest: Optional[dict] = None
) -> dict[str, Path]:
    """Join each artifact's parts into ``dest / artifact["dest"]`` and check the whole file's
    sha256 (after :func:`verify_pack` has checked the parts; it runs here unless
    ``manifest`` is given). A file already there with the right sha256 is kept.

    Returns ``{artifact name: joined path}``.

    Raises:
      PackError: as :func:`verify_pack`, or a joined file whose sha256 differs.
    """
    m = manifest or verify_pack(pack_dir, stage_dirs)
    dirs = [Path(pack_dir), *map(Path, stage_dirs)]
    out = {}
    for a in m["artifacts"]:
        path = Path(dest) / a["dest"]
        path.parent.mkdir(parents=True, exist_ok=True)
        if not (
            path.is_file() and path.stat().st_size == a["size"] and sha256_file(path) == a["sha256"]
        ):
            tmp = path.with_name(path.name + ".joining")
            with open(tmp, "wb") as f:
                for p in a["parts"]:
                    with open(_find_part(p["file"], dirs), "rb") as src:
                        shutil.copyfileobj(src, f, 4 * MiB)
            got = sha256_file(tmp)
            if got != a["sha256"]:
                tmp.unlink()
                raise PackError(
                    f"{a['name']}: joined file fails its sha256 check (got "
                    f"{got[:16]}..., manifest {a['sha256'][:16]}...)"
                )
            tmp.replace(path)
        out[a["name"]] = path
    return out


def stage_parts(pack_dir: Path, stage_dir: Path) -> list[str]:
    """Copy the parts present in ``pack_dir`` (checked against the manifest part by part) to
    ``stage_dir``, outside the working tree: what one call of a multi-call plan does, so the
    last call finds every part (:func:`verify_pack` ``stage_dirs``). Returns the copied parts.

    Raises:
      PackError: a part that is present but corrupt."""
    m = read_manifest(pack_dir)
    copied = []
    for a in m["artifacts"]:
        for p in a["parts"]:
            src = Path(pack_dir) / p["file"]
            if not src.is_file():
                continue
            if sha256_file(src) != p["sha256"]:
                raise PackError(f"{a['name']}: {src} fails its sha256 check")
            dst = Path(stage_dir) / p["file"]
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            copied.append(p["file"])
    return copied


def install_wheels(pack_dir: Path, target: Path, manifest: dict) -> list[str]:
    """``pip install --no-index --no-deps --target target`` the pack's wheels and put
    ``target`` first on ``sys.path`` (the device has no network). Returns the wheel names.

    Raises:
      PackError: pip fails (its last line is quoted)."""
    wheels = [str(Path(pack_dir) / w["file"]) for w in manifest.get("wheels", [])]
    if not wheels:
        return []
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--upgrade",
            "--target",
            str(target),
            *wheels,
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise PackError(f"pip could not install the pack's wheels: {last}")
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(target)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    return [Path(w).name for w in wheels]


def download_wheels(specs: Sequence[str], dest: Path) -> list[Path]:
    """``pip download`` ``specs`` as CPython 3.12 x86-64 wheels without dependencies (the
    device image's interpreter; /work/.library/device/README.md) into ``dest``.

    Raises:
      PackError: pip finds no matching wheel (its last line is quoted)."""
    dest.mkdir(parents=True, exist_ok=True)
    plats = [
        f"--platform={p}"
        for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
    ]
    before = set(dest.glob("*.whl"))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            *plats,
            "-d",
            str(dest),
            *specs,
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise PackError(f"pip download {' '.join(specs)} failed: {last}")
    return sorted(set(dest.glob("*.whl")) - before) or sorted(before)


# ----------------------------------------------------------------------------- the JAX cache


def _cache_files(cache_dir: Path) -> list[Path]:
    """The cache's files in the order they are kept when the size bound bites: the decode
    plan's pass timings first, then the oldest entries (the run's first stage) first."""
    from jaxspec.core.compile_cache import TIMINGS_FILE

    files = [f for f in Path(cache_dir).rglob("*") if f.is_file() and not f.is_symlink()]
    return sorted(files, key=lambda f: (f.name != TIMINGS_FILE, f.stat().st_mtime, f.name))


def export_jax_cache(
    cache_dir: Path,
    out_dir: Path,
    *,
    max_bytes: int = JAX_CACHE_MAX_BYTES,
    part_bytes: int = RETURN_PART_BYTES,
    meta: Optional[dict] = None,
) -> dict:
    """Put the persistent JAX compilation cache ``cache_dir`` into ``out_dir`` as an
    uncompressed tar (XLA's entries are compressed already) in parts ``jax-cache.tar.NN`` of
    at most ``part_bytes`` (what a device call returns), with ``jax-cache.json`` (parts and
    their sha256, entries kept and left out, ``meta``: JAX version, accelerator). Entries are
    kept in :func:`_cache_files` order while the tar stays within ``max_bytes``; parts of an
    earlier export beyond the new count are removed. Returns the json's content.

    Raises:
      PackError: ``max_bytes`` or ``part_bytes`` < 1 MiB."""
    import tempfile

    if max_bytes < MiB or part_bytes < MiB:
        raise PackError(f"cache bound and part size must be >= 1 MiB, got {max_bytes}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    kept, left_out, size = [], 0, 1024  # tar end blocks
    for f in _cache_files(cache_dir):
        need = 512 + -(-f.stat().st_size // 512) * 512
        if size + need > max_bytes:
            left_out += 1
            continue
        kept.append(f)
        size += need
    with tempfile.TemporaryDirectory(prefix="jaxspec-cache-") as td:
        tar = Path(td) / "jax-cache.tar"
        with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as tf:
            for f in kept:
                tf.add(f, arcname=str(f.relative_to(cache_dir)))
        parts = []
        with open(tar, "rb") as src:
            while block := src.read(part_bytes):
                name = f"jax-cache.tar.{len(parts):02d}"
                tmp = out_dir / (name + ".tmp")
                tmp.write_bytes(block)
                tmp.replace(out_dir / name)
                parts.append(
                    {"file": name, "size": len(block), "sha256": hashlib.sha256(block).hexdigest()}
                )
        whole = sha256_file(tar)
        total = tar.stat().st_size
    for old in out_dir.glob("jax-cache.tar.*"):
        if old.name not in {p["file"] for p in parts}:
            old.unlink()
    info = {
        "format": 1,
        "entries": len(kept),
        "left_out": left_out,
        "bytes": total,
        "sha256": whole,
        "parts": parts,
        **(meta or {}),
    }
    tmp = out_dir / (JAX_CACHE_JSON + ".tmp")
    tmp.write_text(json.dumps(info, indent=1) + "\n")
    tmp.replace(out_dir / JAX_CACHE_JSON)
    return info


def join_returned_cache(src: Path, dest: Path, max_bytes: int = JAX_CACHE_MAX_BYTES) -> dict:
    """Join the returned cache at ``src`` (a folder with ``jax-cache.json`` and its parts, or
    the json file) into the tar ``dest``, checking each part's and the whole tar's sha256.
    Returns the json's content.

    Raises:
      PackError: no json, a missing or corrupt part, or a cache over ``max_bytes``."""
    src = Path(src)
    js = src / JAX_CACHE_JSON if src.is_dir() else src
    if not js.is_file():
        raise PackError(f"no returned JAX cache at {src} (missing {JAX_CACHE_JSON})")
    info = json.loads(js.read_text())
    if info.get("bytes", 0) > max_bytes:
        raise PackError(
            f"the returned JAX cache is {info['bytes'] / MiB:.1f} MiB, over the "
            f"{max_bytes / MiB:.0f} MiB bound (--jax-cache-max-mib)"
        )
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out:
        for p in info["parts"]:
            part = js.parent / p["file"]
            if not part.is_file():
                raise PackError(f"jax cache: part {part} missing")
            data = part.read_bytes()
            if hashlib.sha256(data).hexdigest() != p["sha256"]:
                raise PackError(f"jax cache: {part} fails its sha256 check")
            out.write(data)
    if sha256_file(dest) != info["sha256"]:
        raise PackError(f"jax cache: the joined {dest.name} fails its sha256 check")
    return info


def extract_jax_cache(tar_path: Path, cache_dir: Path) -> int:
    """Extract a cache tar into ``cache_dir`` (files already there are kept). Returns the
    number of files extracted."""
    n = 0
    cache_dir = Path(cache_dir)
    with tarfile.open(tar_path, "r") as tf:
        for m in tf.getmembers():
            if m.isfile() and not (cache_dir / m.name).exists():
                tf.extract(m, cache_dir, filter="data")
                n += 1
    return n


def default_jax_cache(stage_dirs: Sequence[Path]) -> Path:
    """Where the device run keeps its JAX compilation cache by default: ``jax-cache`` under
    the first stage folder (outside the tree, kept while the machine stays warm), else
    ``/tmp/jaxspec-jax-cache``."""
    return Path(stage_dirs[0]) / "jax-cache" if stage_dirs else Path("/tmp/jaxspec-jax-cache")
