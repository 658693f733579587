"""Tokenizers for the causal models, built on the ``tokenizers`` library (no transformers).

:class:`Tokenizer` wraps a ``tokenizers.Tokenizer`` and adds what decoding needs: special
token ids and chat-template rendering (Jinja2, sandboxed). It is built either from a
Hugging Face directory (``tokenizer.json`` + ``tokenizer_config.json``; for a checkpoint that ships
only the slow Qwen2-style layout ``vocab.json`` + ``merges.txt`` + added tokens, as Dream-v0 does,
the same tokenizer is built in memory by :func:`slow_bpe_tokenizer`) or from the tokenizer embedded
in a GGUF file.

Sources of facts:
  * GGUF tokenizer keys (``tokenizer.ggml.model/tokens/merges/token_type/pre``,
    ``tokenizer.chat_template``, token type 3 = control, 4 = user-defined): the GGUF spec
    and llama.cpp ``llama-vocab.h``.
  * Pre-tokenizer per ``tokenizer.ggml.pre`` (llama.cpp ``llama-vocab.cpp``): ``smollm``
    (grouped with starcoder/refact) isolates every digit ``\\p{N}`` and then applies the
    GPT-2 split regex -- the same as SmolLM2's ``tokenizer.json`` (``Digits`` with
    individual digits + ``ByteLevel``). ``qwen2`` uses its own split regex (below, as in
    transformers ``tokenization_qwen2.PRETOKENIZE_REGEX``) then byte-level mapping without
    a regex; Qwen2's ``tokenizer.json`` also NFC-normalizes.
  * Slow Qwen2-style layout (``vocab.json`` + ``merges.txt``, added tokens in
    ``added_tokens.json`` and ``tokenizer_config.json``'s ``added_tokens_decoder``): transformers
    ``tokenization_qwen2.Qwen2Tokenizer`` (NFC, the split regex above, byte-level BPE); Dream-v0's
    ``DreamTokenizer`` is that tokenizer plus its mask token (DreamLM/Dream issues #54, #81).
  * Chat-template environment (trim_blocks, lstrip_blocks, ``raise_exception``,
    ``tojson`` without HTML escaping, ``bos_token``/``eos_token`` variables): the
    conventions of Hugging Face chat templates.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Sequence

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers.models import BPE

from models.llama.params import GGUF_MAGIC, WeightFileError, _gguf_field, _open_gguf

# Qwen2's split regex.
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# GGUF token types (llama.cpp llama_token_type).
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


class TokenizerError(WeightFileError):
    """A tokenizer file is missing, unreadable, or of an unsupported kind."""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping, extra = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _token_content(tok: Any) -> str | None:
    if tok is None:
        return None
    if isinstance(tok, dict):
        return tok.get("content")
    return str(tok)


def _raise_exception(message):
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(value, indent=None, ensure_ascii=False, sort_keys=False, separators=None):
    return json.dumps(
        value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys, separators=separators
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_JINJA_ENV = None


def _jinja_env():
    global _JINJA_ENV
    if _JINJA_ENV is None:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        _JINJA_ENV = env
    return _JINJA_ENV


class Tokenizer:
    """Text <-> token ids for one model, plus its special tokens and chat template.

    Attributes:
      vocab_size: total number of ids including added tokens (int).
      bos_token_id: id of the beginning-of-sequence token or None.
      eos_token_ids: tuple of ids that end generation (may be empty).
      pad_token_id: padding id or None.
      chat_template: Jinja2 chat template string or None.
      add_bos: whether ``encode(add_special_tokens=True)`` prepends ``bos_token_id``
        (GGUF: ``tokenizer.ggml.add_bos_token``; HF: ``add_bos_token`` of
        ``tokenizer_config.json``, informational -- ``tokenizer.json``'s own post-processor
        decides there).
    """

    def __init__(
        self,
        tokenizer: _HFTokenizer,
        *,
        bos_token: str | None = None,
        eos_tokens: Sequence[str] = (),
        pad_token: str | None = None,
        chat_template: str | None = None,
        add_bos: bool = False,
        extra_eos_ids: Iterable[int] = (),
    ):
        self._tok = tokenizer
        self.bos_token = bos_token
        self.eos_token = eos_tokens[0] if eos_tokens else None
        self.pad_token = pad_token
        self.chat_template = chat_template
        self.bos_token_id = self._id(bos_token)
        eos = [self._id(t) for t in eos_tokens] + [int(i) for i in extra_eos_ids]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(i for i in eos if i is not None))
        self.pad_token_id = self._id(pad_token)
        self.add_bos = bool(add_bos and self.bos_token_id is not None)

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    # ------------------------------------------------------------------ core API
    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def backend(self) -> _HFTokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tok

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids (``list[int]``) of ``text``. Special tokens written in the text (e.g.
        ``<|im_start|>``) are matched whole. ``add_special_tokens`` prepends BOS when the
        tokenizer is configured to (``add_bos``)."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (any int iterable, e.g. a numpy row)."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def same_vocabulary(self, other: "Tokenizer") -> bool:
        """True when ``other`` maps every token string to the same id (added tokens
        included): the condition for a draft model to draft for this model's target."""
        return self.vocab_size == other.vocab_size and self._tok.get_vocab(
            with_added_tokens=True
        ) == other.backend.get_vocab(with_added_tokens=True)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(int(i))

    def apply_chat_template(
        self, messages: Sequence[dict], add_generation_prompt: bool = True, **kwargs
    ) -> str:
        """Render ``messages`` (``[{"role": ..., "content": ...}, ...]``) with the chat template.

        Rendered in a sandboxed Jinja2 environment with ``trim_blocks``/``lstrip_blocks``,
        the ``raise_exception`` and ``strftime_now`` helpers, and the variables
        ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token`` plus ``kwargs``.

        Raises:
          ValueError: the tokenizer has no chat template.
          jinja2.TemplateError: the template raised (e.g. an unsupported role).
        """
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        template = _jinja_env().from_string(self.chat_template)
        return template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **kwargs,
        )

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_hf_dir(cls, path) -> "Tokenizer":
        """Load from a Hugging Face directory.

        Reads ``tokenizer.json`` -- or, when it is missing, builds the same tokenizer from a
        slow Qwen2-style ``vocab.json`` + ``merges.txt`` (:func:`slow_bpe_tokenizer`) --,
        ``tokenizer_config.json`` (special tokens, ``add_bos_token``, ``chat_template``),
        ``chat_template.jinja`` if present, and the ``eos_token_id`` lists of
        ``generation_config.json`` / ``config.json``.

        Raises:
          TokenizerError: the directory is missing; neither ``tokenizer.json`` nor
            ``vocab.json`` + ``merges.txt`` exists; a file is unreadable; or the slow layout
            cannot be built (see :func:`slow_bpe_tokenizer`).
        """
        d = Path(path)
        if not d.is_dir():
            raise TokenizerError(f"{d}: tokenizer directory does not exist")
        tj = d / "tokenizer.json"
        if tj.is_file():
            try:
                tok = _HFTokenizer.from_file(str(tj))
            except Exception as e:
                raise TokenizerError(
                    f"{tj}: not a readable tokenizers file ({str(e)[:200]})"
                ) from None
        elif (d / "vocab.json").is_file() and (d / "merges.txt").is_file():
            tok = slow_bpe_tokenizer(d)
        else:
            raise TokenizerError(
                f"{tj}: file is missing (and there is no vocab.json + merges.txt "
                f"slow tokenizer to build it from)"
            )
        cfg = _read_json_opt(d / "tokenizer_config.json")
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: use "default"
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_file = d / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        extra_eos = []
        for name in ("generation_config.json", "config.json"):
            e = _read_json_opt(d / name).get("eos_token_id")
            extra_eos += e if isinstance(e, list) else ([] if e is None else [e])
        eos = _token_content(cfg.get("eos_token"))
        return cls(
            tok,
            bos_token=_token_content(cfg.get("bos_token")),
            eos_tokens=[eos] if eos else [],
            pad_token=_token_content(cfg.get("pad_token")),
            chat_template=template,
            add_bos=bool(cfg.get("add_bos_token", False)),
            extra_eos_ids=extra_eos,
        )

    @classmethod
    def from_gguf(cls, path) -> "Tokenizer":
        """Build the byte-level BPE tokenizer stored in a GGUF file's metadata.

        Uses ``tokenizer.ggml.tokens`` (vocabulary, already in GPT-2 byte-to-unicode
        spelling), ``tokenizer.ggml.merges``, ``tokenizer.ggml.token_type`` (3 = control ->
        special added token, 4 = user-defined -> non-special added token),
        ``tokenizer.ggml.pre`` (pre-tokenizer: ``smollm`` and other starcoder-like values,
        ``qwen2``, default GPT-2), ``tokenizer.ggml.{bos,eos,eot,eom,padding}_token_id``,
        ``tokenizer.ggml.add_bos_token`` and ``tokenizer.chat_template``.

        Raises:
          WeightFileError: file missing, not GGUF, truncated.
          TokenizerError: the file has no tokenizer or a non-BPE (``tokenizer.ggml.model``
            other than ``gpt2``) one.
        """
        where = str(path)
        reader = _open_gguf(path)
        model = _gguf_field(reader, "tokenizer.ggml.model")
        if model is None:
            raise TokenizerError(f"{where}: GGUF file has no tokenizer metadata")
        if model != "gpt2":
            raise TokenizerError(
                f"{where}: GGUF tokenizer model {model!r} is not supported "
                "(only byte-level BPE 'gpt2')"
            )
        tokens = list(_gguf_field(reader, "tokenizer.ggml.tokens", required=True, where=where))
        merges = list(_gguf_field(reader, "tokenizer.ggml.merges", required=True, where=where))
        types = _gguf_field(reader, "tokenizer.ggml.token_type", default=None)
        types = list(types) if types is not None else [1] * len(tokens)
        pre = _gguf_field(reader, "tokenizer.ggml.pre", default="default")

        spell = _bytes_to_unicode()
        alphabet = set(spell.values())
        # Vocabulary entries are byte-level spelled already; one that is not (e.g. a token
        # holding a raw space) is re-spelled byte by byte.
        vocab = {
            t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8")): i
            for i, t in enumerate(tokens)
        }
        bpe = BPE(
            vocab=vocab,
            merges=[tuple(m.split(" ", 1)) for m in merges],
            fuse_unk=False,
            byte_fallback=False,
        )
        tok = _HFTokenizer(bpe)
        if pre == "qwen2":
            tok.normalizer = normalizers.NFC()
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        elif pre in ("smollm", "starcoder", "refact", "codeshell"):
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Digits(individual_digits=True),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                ]
            )
        elif pre in ("gpt2", "default", "mpt", "olmo"):
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        else:
            raise TokenizerError(f"{where}: GGUF pre-tokenizer {pre!r} is not supported")
        tok.decoder = decoders.ByteLevel()
        # Control tokens become special added tokens (matched whole, skipped on decode);
        # a "control" token not spelled in the byte alphabet is a mislabel and is skipped.
        special = [
            AddedToken(t, normalized=False, special=True)
            for t, ty in zip(tokens, types)
            if ty == TOKEN_TYPE_CONTROL and set(t) <= alphabet
        ]
        user = [
            AddedToken(t, normalized=False, special=False)
            for t, ty in zip(tokens, types)
            if ty == TOKEN_TYPE_USER_DEFINED and t in vocab
        ]
        if special:
            tok.add_special_tokens(special)
        if user:
            tok.add_tokens(user)

        def tok_at(key):
            i = _gguf_field(reader, f"tokenizer.ggml.{key}")
            return None if i is None or not 0 <= int(i) < len(tokens) else tokens[int(i)]

        eos = [
            t for t in (tok_at("eos_token_id"), tok_at("eot_token_id"), tok_at("eom_token_id")) if t
        ]
        add_bos = bool(_gguf_field(reader, "tokenizer.ggml.add_bos_token", default=False))
        template = _gguf_field(reader, "tokenizer.chat_template")
        bos = tok_at("bos_token_id")
        if add_bos and bos is not None:  # llama.cpp prepends BOS when the file asks for it
            tok.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A",
                pair=f"{bos} $A {bos} $B",
                special_tokens=[(bos, int(_gguf_field(reader, "tokenizer.ggml.bos_token_id")))],
            )
        return cls(
            tok,
            bos_token=bos,
            eos_tokens=eos,
            pad_token=tok_at("padding_token_id"),
            chat_template=template,
            add_bos=add_bos,
        )


# ``tokenizer_class`` values (``Fast`` suffix stripped) whose vocab.json + merges.txt layout is
# Qwen2's; None / the generic classes: no class recorded, read as Qwen2's.
SLOW_QWEN2_CLASSES = (None, "Qwen2Tokenizer", "DreamTokenizer", "PreTrainedTokenizer")


def slow_added_tokens(path) -> dict[int, dict]:
    """Added tokens of a slow-tokenizer directory: ``{id: {"content": str, "special": bool,
    "normalized": bool, "lstrip": bool, "rstrip": bool, "single_word": bool}}``.

    Read from ``added_tokens.json`` (``{content: id}``; counted special) and the
    ``added_tokens_decoder`` of ``tokenizer_config.json`` (``{"id": {"content", "special", ...}}``,
    which wins for an id in both). Missing flags default to special, not normalized, no strip.

    Raises:
      TokenizerError: a file is not valid JSON or an entry is malformed.
    """
    d = Path(path)
    out: dict[int, dict] = {}
    flags = {
        "special": True,
        "normalized": False,
        "lstrip": False,
        "rstrip": False,
        "single_word": False,
    }
    try:
        for content, i in _read_json_opt(d / "added_tokens.json").items():
            out[int(i)] = {"content": str(content), **flags}
        decoder = _read_json_opt(d / "tokenizer_config.json").get("added_tokens_decoder") or {}
        for i, t in decoder.items():
            out[int(i)] = {
                "content": str(t["content"]),
                **{k: bool(t.get(k, v)) for k, v in flags.items()},
            }
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise TokenizerError(
            f"{d}: malformed added token entry ({type(e).__name__}: {e})"
        ) from None
    return out


def slow_bpe_tokenizer(path) -> _HFTokenizer:
    """Build, in memory, the fast tokenizer of a directory that ships a slow Qwen2-style one.

    ``vocab.json`` + ``merges.txt`` become a byte-level BPE with NFC normalization, Qwen2's
    pre-tokenizer split (:data:`QWEN2_SPLIT`, then byte-level mapping without a regex) and a
    byte-level decoder -- what transformers' ``Qwen2Tokenizer`` does (Dream-v0 ships this layout:
    Qwen2.5's tokenizer plus its mask token). The added tokens of :func:`slow_added_tokens` are
    added in id order and must land on their recorded ids (special ones are matched whole and
    skipped on decode). ``.save(path)`` of the result writes the equivalent ``tokenizer.json``.

    Args:
      path: directory holding ``vocab.json`` and ``merges.txt`` (plus optionally
        ``added_tokens.json`` / ``tokenizer_config.json``).

    Returns:
      a ``tokenizers.Tokenizer`` whose ``get_vocab_size(with_added_tokens=True)`` counts the
      BPE vocabulary and the added tokens.

    Raises:
      TokenizerError: ``vocab.json`` or ``merges.txt`` is missing or unreadable;
        ``tokenizer_config.json`` names a ``tokenizer_class`` that is not Qwen2-style (see
        :data:`SLOW_QWEN2_CLASSES`); an added token would not land on its recorded id (a gap
        or a clash in the recorded ids).
    """
    d = Path(path)
    vocab, merges = d / "vocab.json", d / "merges.txt"
    for f in (vocab, merges):
        if not f.is_file():
            raise TokenizerError(f"{f}: file is missing (needed to build the slow BPE tokenizer)")
    cls = _read_json_opt(d / "tokenizer_config.json").get("tokenizer_class")
    base = cls[: -len("Fast")] if isinstance(cls, str) and cls.endswith("Fast") else cls
    if base not in SLOW_QWEN2_CLASSES:
        raise TokenizerError(
            f"{d}: tokenizer_class {cls!r} with vocab.json + merges.txt is not supported "
            f"(only Qwen2-style slow tokenizers: Qwen2Tokenizer, DreamTokenizer); "
            f"save it as tokenizer.json instead"
        )
    try:
        tok = _HFTokenizer(BPE.from_file(str(vocab), str(merges)))
    except Exception as e:
        raise TokenizerError(
            f"{d}: vocab.json + merges.txt are not a readable BPE ({str(e)[:200]})"
        ) from None
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    added = slow_added_tokens(d)
    for i in sorted(added):  # in id order: a token not in vocab.json takes the next free id
        t = added[i]
        token = AddedToken(
            t["content"],
            special=t["special"],
            normalized=t["normalized"],
            lstrip=t["lstrip"],
            rstrip=t["rstrip"],
            single_word=t["single_word"],
        )
        if t["special"]:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
        got = tok.token_to_id(t["content"])
        if got != i:
            raise TokenizerError(
                f"{d}: added token {t['content']!r} should have id {i}, got "
                f"{got} (a gap or a clash in the recorded added-token ids)"
            )
    return tok


def _read_json_opt(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{path}: not valid JSON ({str(e)[:200]})") from None


def load_tokenizer(path) -> Tokenizer:
    """Tokenizer for a checkpoint path, dispatching like :func:`models.llama.params.load_weights`.

    Directory -> :meth:`Tokenizer.from_hf_dir`; ``*.gguf`` or a file with the GGUF magic ->
    :meth:`Tokenizer.from_gguf`; ``*.safetensors`` -> the HF directory containing it.

    Raises:
      WeightFileError / TokenizerError: missing path or unknown format.
    """
    p = Path(path)
    if p.is_dir():
        return Tokenizer.from_hf_dir(p)
    if not p.exists():
        raise TokenizerError(f"{p}: no such file or directory")
    with open(p, "rb") as f:
        magic = f.read(4)
    if p.suffix.lower() == ".gguf" or magic == GGUF_MAGIC:
        return Tokenizer.from_gguf(p)
    if p.suffix.lower() in (".safetensors", ".json"):
        return Tokenizer.from_hf_dir(p.parent)
    raise TokenizerError(f"{p}: neither a GGUF file nor part of a Hugging Face directory")


__all__ = [
    "Tokenizer",
    "TokenizerError",
    "load_tokenizer",
    "slow_bpe_tokenizer",
    "slow_added_tokens",
    "QWEN2_SPLIT",
]
