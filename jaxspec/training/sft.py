"""SFT samples from the standard library for the v2 masked-diffusion recipe.

A v1 ``dream-smollm2-135m`` trained on plain stdlib windows never saw a document end, so at
gen length 256 it fills the whole budget by repeating itself. Real LLaDA / Dream instruct
models answer and pad the rest with EOS. The v2 recipe adds LLaDA-SFT-style samples (LLaDA,
Nie et al. 2025, Sec. 2.3 and Appendix B.1: the prompt is never masked, the response is, and
EOS padding counts as response so the model learns to end):

* **prompt**: a function's decorators, signature and docstring, as they appear in the file;
* **response**: the rest of the function's body, then EOS, then EOS padding to ``seq_len``;
* **response mask**: ``True`` from the first response token to the end of the row.

Functions without a docstring or a body after it, and samples longer than ``seq_len`` (after
one EOS), are skipped and counted. The same hold-out module split as the plain windows
(:func:`jaxspec.training.data.split_files`) keeps validation functions out of training.

:class:`SFTMixDataset` interleaves these samples with plain windows (fraction
``sft_fraction``), as a pure function of ``(seed, step)`` (exact resume). A batch is
``int32 (n, 2, T)``: row 0 the tokens, row 1 the response mask (all ones for plain windows,
whose loss then reduces to the pre-training loss divided by ``T``;
:func:`jaxspec.training.objectives.diffusion_loss`).

:func:`distill_samples` turns self-distillation rows (the base model's own greedy answers,
:mod:`jaxspec.training.distill`) into the same kind of sample: prompt unmasked, the answer as
the response. An answer ends with EOS only where the base model ended it: answers cut at the
generation budget get no EOS (see the function for how they are kept or dropped). Nesting two
:class:`SFTMixDataset` (the outer one's ``windows`` being the inner mix) gives a three-way mix
of distilled answers, stdlib function samples and plain windows (``data.source:
stdlib-sft+distill``, :func:`jaxspec.training.build.build_data`).
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

from jaxspec.training.data import (
    DataError,
    PackedDataset,
    cache_dir,
    split_files,
    stdlib_files,
    stdlib_root,
)


def function_samples(source: str) -> tuple[list[tuple[str, str]], int]:
    """``([(prompt, response), ...], skipped)`` of every function in a Python ``source``.

    ``prompt``: the lines from the first decorator (or the ``def``) through the end of the
    docstring; ``response``: the remaining lines of the function. Functions without a
    docstring, or with nothing after it, are skipped (counted). A file that does not parse
    gives ``([], 0)``."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return [], 0
    lines = source.splitlines(keepends=True)
    out, skipped = [], 0
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = node.body[0] if node.body else None
        has_doc = (
            isinstance(doc, ast.Expr)
            and isinstance(doc.value, ast.Constant)
            and isinstance(doc.value.value, str)
        )
        if not has_doc or len(node.body) < 2:
            skipped += 1
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        prompt = "".join(lines[start : doc.end_lineno])
        response = "".join(lines[doc.end_lineno : node.end_lineno])
        if not response.strip():
            skipped += 1
            continue
        out.append((prompt, response))
    return out, skipped


def pack_samples(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]], seq_len: int, eos_id: int, dtype=np.int32
) -> tuple[np.ndarray, np.ndarray, int]:
    """Token pairs -> ``(tokens (N, T), prompt_len int32 (N,), too_long)``: each row is
    ``prompt + response + EOS``, right-padded with EOS to ``T = seq_len``; pairs that do not
    fit (or have an empty prompt or response) are dropped and counted in ``too_long``."""
    rows, plens, too_long = [], [], 0
    for p, r in pairs:
        n = len(p) + len(r) + 1
        if not p or not r or n > seq_len:
            too_long += 1
            continue
        row = np.full(seq_len, eos_id, np.int64)
        row[: len(p)] = p
        row[len(p) : len(p) + len(r)] = r
        rows.append(row)
        plens.append(len(p))
    if not rows:
        return np.zeros((0, seq_len), dtype), np.zeros((0,), np.int32), too_long
    return np.stack(rows).astype(dtype), np.asarray(plens, np.int32), too_long


def distill_samples(
    rows: Sequence[dict],
    seq_len: int,
    eos_id: int,
    *,
    answer_cap: int,
    drop_ids: Iterable[int] = (),
    dtype=np.int32,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Self-distillation rows -> SFT rows ``(tokens (N, T), prompt_len int32 (N,), stats)``.

    A row ``{"prompt": ids, "answer": ids}`` (:func:`jaxspec.training.distill.self_distill`
    stores the answer without its EOS, and stops at ``answer_cap`` new tokens) becomes:

    * **ended** (``len(answer) < answer_cap``: the base model emitted EOS) and ``prompt +
      answer + EOS`` fits ``T``: ``prompt + answer + EOS``, EOS padding to ``T``
      (:func:`pack_samples`);
    * **open** (the answer was cut at ``answer_cap``, or an ended answer does not fit) and
      ``prompt + answer`` fills ``T``: its first ``T`` tokens, no EOS: the text goes on past
      the row, so the row must not teach an end there;
    * otherwise (a cut answer too short to fill the row, or a prompt of ``T`` tokens or more)
      dropped and counted: padding it with EOS would teach a false end.

    The response (masked at training time) starts at ``prompt_len``. Ids in ``drop_ids``
    (e.g. the [MASK] id) are removed from prompt and answer first.

    Returns:
      tokens ``dtype (N, T)``, prompt lengths ``int32 (N,)``, and ``stats``: ``{"rows",
      "ended", "open", "dropped_cut_short", "dropped_prompt_too_long", "response_tokens"}``.
    """
    if answer_cap < 1:
        raise DataError(f"answer_cap must be >= 1, got {answer_cap}")
    drop = frozenset(int(i) for i in drop_ids)
    ended, opened = [], []
    n_short = n_long_prompt = 0
    for r in rows:
        p = [int(t) for t in r["prompt"] if int(t) not in drop]
        a = [int(t) for t in r["answer"] if int(t) not in drop]
        if not p or len(p) >= seq_len:
            n_long_prompt += 1
        elif len(r["answer"]) < answer_cap and len(p) + len(a) + 1 <= seq_len and a:
            ended.append((p, a))
        elif len(p) + len(a) >= seq_len:
            opened.append((p, a[: seq_len - len(p)]))
        else:
            n_short += 1
    t1, p1, _ = pack_samples(ended, seq_len, eos_id, dtype)
    # one token longer, then cut: the row is prompt + answer exactly, the EOS falls off
    t2, p2, _ = pack_samples(opened, seq_len + 1, eos_id, dtype)
    tokens = np.concatenate([t1, t2[:, :seq_len]])
    plen = np.concatenate([p1, p2]).astype(np.int32)
    stats = {
        "rows": len(rows),
        "ended": int(len(p1)),
        "open": int(len(p2)),
        "dropped_cut_short": n_short,
        "dropped_prompt_too_long": n_long_prompt,
        "response_tokens": int(seq_len * len(plen) - plen.sum()),
    }
    return tokens, plen, stats


def _encode(tokenizer, texts: list[str]) -> list[list[int]]:
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    return [tokenizer.encode(t) for t in texts]


def _build(tokenizer, root: Path, files, seq_len, eos_id, drop: frozenset, dtype):
    prompts, responses, skipped = [], [], 0
    for f in files:
        pairs, s = function_samples((root / f).read_text(encoding="utf-8", errors="replace"))
        skipped += s
        prompts += [p for p, _ in pairs]
        responses += [r for _, r in pairs]
    enc_p, enc_r = _encode(tokenizer, prompts), _encode(tokenizer, responses)
    clean = lambda ids: [i for i in ids if i not in drop]
    toks, plens, too_long = pack_samples(
        [(clean(p), clean(r)) for p, r in zip(enc_p, enc_r)], seq_len, eos_id, dtype
    )
    return (
        toks,
        plens,
        {
            "functions": len(prompts),
            "no_docstring_or_body": skipped,
            "too_long": too_long,
            "samples": int(len(plens)),
        },
    )


def stdlib_sft(
    tokenizer,
    holdout: Sequence[str],
    *,
    seq_len: int,
    eos_id: int,
    drop_ids: Iterable[int] = (),
    root: Optional[Path] = None,
    log=lambda m: print(m, file=sys.stderr),
) -> dict:
    """SFT samples of the stdlib's functions, split by module like the plain windows; built
    once and cached under :func:`jaxspec.training.data.cache_dir` (keyed by a hash of the
    inputs, as :func:`jaxspec.training.data.stdlib_tokens`).

    Returns:
      ``{"train": (tokens (N, T), prompt_len (N,)), "val": (...), "meta": {...}}``; tokens
      ``uint16`` / ``uint32``, prompt lengths ``int32``.

    Raises:
      DataError: no sample fits ``seq_len`` in a split (see also :func:`split_files`).
    """
    root = Path(root) if root is not None else stdlib_root()
    files = stdlib_files(root)
    train_f, val_f = split_files(files, list(holdout))
    drop = frozenset(int(i) for i in drop_ids)
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
    h = hashlib.sha256()
    vocab_items = (
        sorted(tokenizer.backend.get_vocab(with_added_tokens=True).items())
        if getattr(tokenizer, "backend", None) is not None
        else [tokenizer.vocab_size]
    )
    for part in (
        "sft-v1",
        sys.version,
        str(root),
        [str(f) for f in files],
        sorted(holdout),
        seq_len,
        eos_id,
        sorted(drop),
        vocab_items,
    ):
        h.update(json.dumps(part, default=str).encode())
    path = cache_dir() / f"stdlib-sft-{h.hexdigest()[:16]}.npz"
    if path.is_file():
        z = np.load(path)
        meta = json.loads(str(z["meta"]))
        return {
            "train": (z["train"], z["train_plen"]),
            "val": (z["val"], z["val_plen"]),
            "meta": meta,
        }
    log(f"[data] building SFT samples from {len(train_f)} + {len(val_f)} stdlib files")
    train, tp, tm = _build(tokenizer, root, train_f, seq_len, eos_id, drop, dtype)
    val, vp, vm = _build(tokenizer, root, val_f, seq_len, eos_id, drop, dtype)
    for name, n in (("train", len(tp)), ("held-out", len(vp))):
        if n == 0:
            raise DataError(f"no {name} function fits seq_len {seq_len} as an SFT sample")
    meta = {
        "seq_len": seq_len,
        "eos_id": eos_id,
        "train": tm,
        "val": vm,
        "train_response_tokens": int(sum(seq_len - p for p in tp)),
    }
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, train=train, train_plen=tp, val=val, val_plen=vp, meta=json.dumps(meta))
    tmp.replace(path)
    log(
        f"[data] {tm['samples']} train / {vm['samples']} held-out SFT samples "
        f"({tm['too_long']} train functions longer than {seq_len} tokens skipped)"
    )
    return {"train": (train, tp), "val": (val, vp), "meta": meta}


def interleave(k: int, fraction: float) -> tuple[bool, int]:
    """Where global sample ``k`` of an even interleave of two sources comes from: ``(True,
    floor(k f))`` (the second source, its index) iff ``floor((k + 1) f) > floor(k f)``, else
    ``(False, k - floor(k f))``; ``f`` = ``fraction``, exactly ``f`` of every batch in the
    long run."""
    before = int(np.floor(k * fraction))
    if int(np.floor((k + 1) * fraction)) > before:
        return True, before
    return False, k - before


class SFTMixDataset:
    """SFT samples interleaved with plain windows; batches ``int32 (n, 2, T)`` = ``[tokens,
    response mask]``, a pure function of ``(seed, step)``.

    Global sample ``k`` is an SFT sample iff ``floor((k + 1) f) > floor(k f)`` (``f`` =
    ``sft_fraction``: an even interleave, exactly ``f`` of every batch in the long run). Its
    SFT index is ``j = floor(k f)``, its window index ``k - floor(k f)``; each source is
    walked through an epoch-seeded permutation like :class:`PackedDataset`.

    Args:
      tokens: ``(N, T)`` SFT rows; prompt_len: ``(N,)`` prompt lengths (response starts there).
      windows: a :class:`PackedDataset` of plain windows with the same ``seq_len`` (None when
        ``sft_fraction`` is 1), or another :class:`SFTMixDataset` (a nested mix: its sample
        ``k - floor(k f)`` fills the non-SFT places).
      sft_fraction: share of SFT samples in ``[0, 1]``.
      seed: permutation seed.

    Raises:
      DataError: mismatched shapes / lengths, no SFT rows, or a fraction outside ``[0, 1]``.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        prompt_len: np.ndarray,
        windows: Optional[PackedDataset],
        sft_fraction: float,
        seed: int = 0,
    ):
        tokens, prompt_len = np.asarray(tokens), np.asarray(prompt_len)
        if tokens.ndim != 2 or len(tokens) == 0 or prompt_len.shape != (len(tokens),):
            raise DataError(
                f"SFT rows must be (N, T) with N > 0 and prompt_len (N,), got "
                f"{tokens.shape} and {prompt_len.shape}"
            )
        if not 0.0 <= float(sft_fraction) <= 1.0:
            raise DataError(f"sft_fraction must lie in [0, 1], got {sft_fraction}")
        if float(sft_fraction) < 1.0 and (windows is None or windows.seq_len != tokens.shape[1]):
            raise DataError(
                "plain windows with the SFT rows' seq_len are needed when sft_fraction < 1"
            )
        self.tokens, self.prompt_len = tokens, prompt_len.astype(np.int64)
        self.windows, self.f, self.seed = windows, float(sft_fraction), int(seed)
        self.seq_len = tokens.shape[1]
        self._perms: dict[int, np.ndarray] = {}

    def _sft_index(self, j: int) -> int:
        n = len(self.tokens)
        e = j // n
        if e not in self._perms:
            if len(self._perms) > 4:
                self._perms.clear()
            self._perms[e] = np.random.default_rng([self.seed, 7919, e]).permutation(n)
        return int(self._perms[e][j % n])

    def sample(self, k: int) -> np.ndarray:
        """Global sample ``k``: ``int32 (2, T)``."""
        T = self.seq_len
        sft, j = interleave(k, self.f)
        if sft:
            i = self._sft_index(j)
            resp = (np.arange(T) >= self.prompt_len[i]).astype(np.int32)
            return np.stack([self.tokens[i].astype(np.int32), resp])
        w = j
        if isinstance(self.windows, SFTMixDataset):  # a nested mix: its own sample k
            return self.windows.sample(w)
        n = self.windows.num_sequences
        row = self.windows.seqs[self.windows._perm(w // n)[w % n]].astype(np.int32)
        return np.stack([row, np.ones(T, np.int32)])

    def batch(self, step: int, samples_per_step: int) -> np.ndarray:
        """``int32 (samples_per_step, 2, T)`` batch of ``step``."""
        k0 = step * samples_per_step
        return np.stack([self.sample(k) for k in range(k0, k0 + samples_per_step)])

    def fixed_batches(self, num: int, batch_size: int) -> list[np.ndarray]:
        """``num`` evaluation batches (the first ``num * batch_size`` samples, in order of
        ``k``), each ``int32 (batch_size, 2, T)``."""
        return [self.batch(i, batch_size) for i in range(num)]


__all__ = [
    "function_samples",
    "pack_samples",
    "distill_samples",
    "stdlib_sft",
    "interleave",
    "SFTMixDataset",
]
