"""Infilling templates: text with ``<mask:N>`` spans -> tokens + mask, and back to text.

**Template syntax.** Plain text in which every ``<mask:N>`` tag (``N`` a positive decimal
integer) stands for ``N`` tokens the model must generate, inline::

    "def add(a, b):\\n    <mask:8>\\n"          # 8 masked tokens between the two text pieces

The literal text pieces are tokenized one by one (so a piece's tokens never merge with a
masked span's) and concatenated with ``N`` mask slots per tag; the result is a token sequence
plus a boolean mask, the input of :func:`jaxspec.asarm.assd.assd_generate`. Anything that looks like
a tag but is not well formed (``<mask:>``, ``<mask:x>``, ``<mask:0>``) is an error, so a typo
never silently becomes literal text. On the command line (``scripts.generate --infill``) the
two-character escapes ``\\n``, ``\\t`` and ``\\\\`` are expanded first
(:func:`unescape_cli`), because shells pass ``"...\\n..."`` through literally.

:func:`infill_text` parses a template and fills it with a trained AS-ARM
(:class:`models.registry.ASARM`, :func:`models.registry.load_asarm`) through
:func:`jaxspec.asarm.assd.assd_generate`. HumanEval single-line tasks live in
:mod:`jaxspec.eval.tasks`, the pass@1 sandbox in :mod:`jaxspec.eval.sandbox`, the command line in
:mod:`scripts.infill`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Optional, Sequence, Union

from jaxspec.asarm.assd import assd_generate
from jaxspec.core.sampling import SamplingConfig
from models.registry import ASARM

_TAG = re.compile(r"<mask:(\d+)>")
_LOOSE = re.compile(r"<mask:[^>\n]{0,32}>?")


class TemplateError(ValueError):
    """A malformed infilling template (no masks, bad tag, past the context)."""


@dataclasses.dataclass
class InfillTemplate:
    """A parsed template.

    Attributes:
      ids: int token ids (mask slots hold ``fill_id``).
      masked: bool per token, True at the positions to generate.
      pieces: the template as a list of literal ``str`` pieces and ``int`` mask counts.
      spans: ``(start, stop)`` token ranges of the masked spans, in order.
    """

    ids: list
    masked: list
    pieces: list
    spans: list

    def render(self, ids: Sequence[int], decode: Callable[[list], str]) -> str:
        """The text with every masked span replaced by ``decode`` of its tokens in ``ids``
        (a full sequence as returned by the decoder); literal pieces are kept verbatim."""
        out, s = [], 0
        for p in self.pieces:
            if isinstance(p, str):
                out.append(p)
            else:
                a, b = self.spans[s]
                out.append(decode([int(t) for t in ids[a:b]]))
                s += 1
        return "".join(out)


def split_template(text: str) -> list:
    """``text`` -> alternating literal pieces (``str``, empty ones dropped) and mask counts
    (``int``).

    Raises:
      TemplateError: a malformed ``<mask:...>`` tag or ``N < 1`` (one line, with the offset).
    """
    pieces: list = []
    pos = 0
    for m in _LOOSE.finditer(text):
        good = _TAG.fullmatch(m.group(0))
        if not good:
            raise TemplateError(
                f"malformed mask tag {m.group(0)!r} at character {m.start()}; "
                "expected <mask:N> with N a positive integer"
            )
        n = int(good.group(1))
        if n < 1:
            raise TemplateError(
                f"mask tag {m.group(0)!r} at character {m.start()} asks for "
                f"{n} tokens; N must be >= 1"
            )
        if m.start() > pos:
            pieces.append(text[pos : m.start()])
        pieces.append(n)
        pos = m.end()
    if pos < len(text):
        pieces.append(text[pos:])
    return pieces


def build_template(
    pieces: Sequence[Union[str, int]],
    encode: Callable[[str], list],
    max_len: Optional[int] = None,
    fill_id: int = 0,
) -> InfillTemplate:
    """Tokenize literal pieces one by one and insert the mask slots.

    Args:
      pieces: ``str`` literal text or ``int`` number of masked tokens.
      encode: text -> token ids (e.g. ``tokenizer.encode``).
      max_len: optional context limit in tokens.
      fill_id: the id stored at masked slots (ignored by the decoder).

    Raises:
      TemplateError: no masked span, or a span (or the text) running past ``max_len``.
    """
    ids, masked, spans = [], [], []
    for p in pieces:
        if isinstance(p, str):
            t = [int(x) for x in encode(p)]
            ids += t
            masked += [False] * len(t)
        else:
            spans.append((len(ids), len(ids) + int(p)))
            ids += [int(fill_id)] * int(p)
            masked += [True] * int(p)
    if not spans:
        raise TemplateError("template has no <mask:N> span: nothing to infill")
    if max_len is not None and len(ids) > max_len:
        for i, (a, b) in enumerate(spans):
            if b > max_len:
                raise TemplateError(
                    f"mask span {i + 1} (tokens {a}..{b - 1}) runs past the "
                    f"context of {max_len} tokens"
                )
        raise TemplateError(
            f"template of {len(ids)} tokens runs past the context of {max_len} tokens"
        )
    return InfillTemplate(ids=ids, masked=masked, pieces=list(pieces), spans=spans)


_CLI_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape_cli(text: str) -> str:
    """Expand the escapes ``\\n`` (newline), ``\\t`` (tab) and ``\\\\`` (backslash) of a
    template typed on a command line; any other backslash is kept as written."""
    return re.sub(r"\\([nt\\])", lambda m: _CLI_ESCAPES[m.group(1)], text)


def parse_template(
    text: str, tokenizer, max_len: Optional[int] = None, fill_id: int = 0
) -> InfillTemplate:
    """Parse an infilling template (module docstring) with ``tokenizer`` (an object with
    ``encode(str) -> list[int]``, or such a callable).

    Returns:
      :class:`InfillTemplate`: ``ids`` and ``masked`` of equal length.

    Raises:
      TemplateError (a ValueError): malformed tag, ``N < 1``, no masks, past ``max_len``.
    """
    plain = callable(tokenizer) and not hasattr(tokenizer, "encode")
    encode = tokenizer if plain else tokenizer.encode
    return build_template(split_template(text), encode, max_len, fill_id)


# ------------------------------------------------------------------------ infilling with an AS-ARM
def infill_text(
    asarm: ASARM,
    template: str,
    *,
    method: str = "assd",
    k: int = 5,
    sampling=None,
    seed: int = 0,
    epsilon: float = 0.0,
    suppress_unk: bool = False,
    cache: str = "none",
):
    """Parse ``template`` (``<mask:N>`` syntax) and infill it with
    :func:`jaxspec.asarm.assd.assd_generate` (``suppress_unk``: never generate the compact
    vocabulary's UNK id; ``cache``: ``"none"`` or the content-stream cache ``"content"``).

    Returns:
      ``(text, InfillResult, InfillTemplate)``: the template with every span filled.

    Raises:
      TemplateError / ValueError: a bad template or decoding settings (one line).
    """
    tpl = parse_template(template, asarm.tokenizer, max_len=asarm.max_len)
    ids = asarm.to_model(tpl.ids)
    res = assd_generate(
        asarm.model,
        asarm.params,
        [ids],
        [tpl.masked],
        method=method,
        k=k,
        sampling=sampling or SamplingConfig(),
        seed=seed,
        epsilon=epsilon,
        max_len=asarm.max_len,
        suppress=_unk(asarm) if suppress_unk else (),
        cache=cache,
    )
    return tpl.render(res.sequences[0], asarm.decode), res, tpl


def _unk(asarm: ASARM) -> tuple:
    """``(UNK id,)`` of an AS-ARM with a compact vocabulary, else ``()``."""
    unk = getattr(asarm.vocab, "unk", None)
    return () if unk is None else (int(unk),)


__all__ = [
    "TemplateError",
    "InfillTemplate",
    "split_template",
    "build_template",
    "parse_template",
    "unescape_cli",
    "infill_text",
]
