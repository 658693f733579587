"""Training data: the Python standard library as a token stream, packed and batched by step.

Corpus: every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]`` (or ``$JAXSPEC_STDLIB_ROOT``,
e.g. a copy of another Python's stdlib, to build the same corpus on a machine whose interpreter
differs, such as a GPU image with a newer Python) except test
directories (``test``, ``tests``, ``idle_test``) and ``site-packages``, in sorted path order.
Each file is tokenized on its own (no special tokens added) and followed by one separator id
(``<|endoftext|>`` for SmolLM2); the files are concatenated into one stream per split.

Split: a file belongs to validation when its dotted module name equals, or lies inside, one of
the held-out module names (e.g. ``"json"`` holds out ``json/__init__.py``, ``json/decoder.py``
...); the list lives in the training config (``data.holdout``).

Cache: the two streams are saved as ``uint16``/``uint32`` ``.npy`` files under
``$JAXSPEC_CACHE/data`` (default ``~/.cache/jaxspec/data``), named by a hash of the Python
version, the stdlib root, the file list, the hold-out list and the tokenizer vocabulary, so a
changed input never reuses a stale cache.

Batching: the stream is cut into ``n = len // seq_len`` non-overlapping sequences ("packing":
sequences cross file boundaries, separated by the separator id). The sequence drawn for
global sample ``k`` (``k = step * samples_per_step + j``) is ``perm_e[k mod n]`` with epoch
``e = k // n`` and ``perm_e`` a permutation seeded by ``(seed, e)``. A batch is therefore a pure
function of ``(seed, step)``: resuming at step ``s`` sees exactly the batches an
uninterrupted run would have seen.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__"})


class DataError(ValueError):
    """Empty corpus or split, or a sequence length the stream cannot fill."""


def stdlib_root() -> Path:
    """The standard-library directory of the corpus: ``$JAXSPEC_STDLIB_ROOT`` when set (a copy
    of another interpreter's stdlib), else the running interpreter's.

    Raises:
      DataError: ``$JAXSPEC_STDLIB_ROOT`` is set but is not a directory.
    """
    env = os.environ.get("JAXSPEC_STDLIB_ROOT")
    if env:
        if not Path(env).is_dir():
            raise DataError(f"JAXSPEC_STDLIB_ROOT={env} is not a directory")
        return Path(env)
    return Path(sysconfig.get_paths()["stdlib"])


def module_name(rel: Path) -> str:
    """Dotted module name of a path relative to the stdlib root
    (``json/decoder.py`` -> ``json.decoder``, ``json/__init__.py`` -> ``json``)."""
    parts = list(rel.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def stdlib_files(root: Optional[Path] = None) -> list[Path]:
    """Sorted relative paths of the stdlib ``*.py`` files, test directories excluded."""
    root = Path(root) if root is not None else stdlib_root()
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in EXCLUDED_DIRS)
        for f in files:
            if f.endswith(".py"):
                out.append(Path(d, f).relative_to(root))
    return sorted(out)


def is_heldout(rel: Path, holdout: Iterable[str]) -> bool:
    """True when the module of ``rel`` is, or lies inside, one of the ``holdout`` modules."""
    name = module_name(rel)
    return any(name == h or name.startswith(h + ".") for h in holdout)


def split_files(files: Sequence[Path], holdout: Sequence[str]) -> tuple[list[Path], list[Path]]:
    """``(train, val)`` file lists.

    Raises:
      DataError: a hold-out module matches no file, or a split is empty.
    """
    missing = [h for h in holdout if not any(is_heldout(f, [h]) for f in files)]
    if missing:
        raise DataError(f"held-out modules not found in the stdlib: {', '.join(missing)}")
    val = [f for f in files if is_heldout(f, holdout)]
    train = [f for f in files if not is_heldout(f, holdout)]
    if not train or not val:
        raise DataError(f"empty split: {len(train)} train files, {len(val)} validation files")
    return train, val


def cache_dir() -> Path:
    """``$JAXSPEC_CACHE/data`` (default ``~/.cache/jaxspec/data``), created if missing."""
    d = Path(os.environ.get("JAXSPEC_CACHE", Path.home() / ".cache" / "jaxspec")) / "data"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _tokenize_files(
    tokenizer, root: Path, files: Sequence[Path], sep_id: int, drop_ids: frozenset[int], dtype
) -> tuple[np.ndarray, int]:
    texts = [(root / f).read_text(encoding="utf-8", errors="replace") for f in files]
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        ids = [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    else:
        ids = [tokenizer.encode(t) for t in texts]
    dropped = 0
    chunks = []
    for row in ids:
        a = np.asarray(row, np.int64)
        if drop_ids:
            keep = ~np.isin(a, list(drop_ids))
            dropped += int((~keep).sum())
            a = a[keep]
        chunks.append(a)
        chunks.append(np.asarray([sep_id], np.int64))
    return np.concatenate(chunks).astype(dtype), dropped


def stdlib_tokens(
    tokenizer,
    holdout: Sequence[str],
    *,
    sep_id: int,
    drop_ids: Iterable[int] = (),
    root: Optional[Path] = None,
    log=lambda m: print(m, file=sys.stderr),
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Tokenized stdlib ``(train, val, meta)``, built once and cached.

    Args:
      tokenizer: a :class:`models.tokenizer.Tokenizer` (``encode`` / ``backend``).
      holdout: dotted module names kept for validation.
      sep_id: id appended after every file (e.g. ``<|endoftext|>``).
      drop_ids: ids removed from the stream if the text happens to spell them (e.g. the
        mask token and other special tokens); the count is in ``meta["dropped"]``.
      root: stdlib directory (default: this interpreter's).

    Returns:
      ``train``, ``val``: 1-D ``uint16`` (vocab <= 65536) or ``uint32`` arrays;
      ``meta``: dict with file counts, token counts, hold-out list, cache paths.

    Raises:
      DataError: see :func:`split_files`.
    """
    root = Path(root) if root is not None else stdlib_root()
    files = stdlib_files(root)
    train_f, val_f = split_files(files, list(holdout))
    drop = frozenset(int(i) for i in drop_ids)
    vocab = tokenizer.vocab_size
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    h = hashlib.sha256()
    vocab_items = (
        sorted(tokenizer.backend.get_vocab(with_added_tokens=True).items())
        if getattr(tokenizer, "backend", None) is not None
        else [vocab]
    )
    for part in (
        sys.version,
        str(root),
        [str(f) for f in files],
        sorted(holdout),
        sep_id,
        sorted(drop),
        vocab_items,
    ):
        h.update(json.dumps(part, default=str).encode())
    key = h.hexdigest()[:16]
    d = cache_dir()
    paths = {s: d / f"stdlib-{key}-{s}.npy" for s in ("train", "val")}
    meta_path = d / f"stdlib-{key}-meta.json"
    if all(p.is_file() for p in paths.values()) and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        return np.load(paths["train"]), np.load(paths["val"]), meta
    log(f"[data] tokenizing {len(train_f)} train + {len(val_f)} held-out stdlib files from {root}")
    train, dt = _tokenize_files(tokenizer, root, train_f, sep_id, drop, dtype)
    val, dv = _tokenize_files(tokenizer, root, val_f, sep_id, drop, dtype)
    for s, a in (("train", train), ("val", val)):
        tmp = paths[s].with_suffix(".tmp.npy")
        np.save(tmp, a)
        tmp.replace(paths[s])
    meta = {
        "root": str(root),
        "python": sys.version.split()[0],
        "holdout": sorted(holdout),
        "train_files": len(train_f),
        "val_files": len(val_f),
        "train_tokens": int(train.size),
        "val_tokens": int(val.size),
        "dropped": dt + dv,
        "sep_id": sep_id,
        "cache": {s: str(p) for s, p in paths.items()},
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    log(f"[data] {meta['train_tokens']} train / {meta['val_tokens']} val tokens cached in {d}")
    return train, val, meta


class PackedDataset:
    """Fixed-length sequences cut from one token stream, drawn as a function of the step.

    Args:
      tokens: 1-D integer array (the stream).
      seq_len: tokens per sequence (T).
      seed: permutation seed.

    Raises:
      DataError: the stream is shorter than one sequence.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int = 0):
        tokens = np.asarray(tokens)
        if tokens.ndim != 1:
            raise DataError(f"token stream must be 1-D, got shape {tokens.shape}")
        if seq_len <= 0 or tokens.size < seq_len:
            raise DataError(f"stream of {tokens.size} tokens cannot fill one sequence of {seq_len}")
        self.seq_len = int(seq_len)
        self.num_sequences = tokens.size // seq_len
        self.seqs = tokens[: self.num_sequences * seq_len].reshape(self.num_sequences, seq_len)
        self.seed = int(seed)
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) > 4:
                self._perms.clear()
            rng = np.random.default_rng([self.seed, epoch])
            self._perms[epoch] = rng.permutation(self.num_sequences)
        return self._perms[epoch]

    def indices(self, step: int, samples_per_step: int) -> np.ndarray:
        """Sequence indices ``int64 (samples_per_step,)`` used at ``step``."""
        k = np.arange(step * samples_per_step, (step + 1) * samples_per_step, dtype=np.int64)
        epoch, pos = k // self.num_sequences, k % self.num_sequences
        return np.array([self._perm(int(e))[p] for e, p in zip(epoch, pos)], np.int64)

    def batch(self, step: int, samples_per_step: int) -> np.ndarray:
        """``int32 (samples_per_step, seq_len)`` batch of ``step`` (pure function of step)."""
        return self.seqs[self.indices(step, samples_per_step)].astype(np.int32)

    def fixed_batches(self, num: int, batch_size: int) -> list[np.ndarray]:
        """``num`` evaluation batches taken in order from the start (no shuffling),
        wrapping around; each ``int32 (batch_size, seq_len)``."""
        out = []
        for i in range(num):
            idx = (np.arange(batch_size) + i * batch_size) % self.num_sequences
            out.append(self.seqs[idx].astype(np.int32))
        return out


__all__ = [
    "DataError",
    "PackedDataset",
    "stdlib_tokens",
    "stdlib_files",
    "split_files",
    "is_heldout",
    "module_name",
    "stdlib_root",
    "cache_dir",
    "EXCLUDED_DIRS",
]
