"""``python -m scripts.generate --infill TEMPLATE``: the AS-ARM (XLNet) inputs of
:mod:`scripts.generate` (:func:`load_infill`).

The template uses the ``<mask:N>`` syntax of :mod:`jaxspec.asarm.infill`; the shell escapes
``\\n``, ``\\t`` and ``\\\\`` are expanded first. The model is a trained AS-ARM found by name or
path through :func:`models.registry.load_asarm`, or ``--model auto --weights DIR`` for a
transformers XLNet directory (or a jaxspec XLNet file). The method, its options, defaults and
checks are the registry's (:mod:`jaxspec.methods.asarm`), as for every other family.
"""

from __future__ import annotations

from jaxspec.asarm.infill import parse_template, unescape_cli
from models.registry import load_asarm


def load_infill(args, method, options: dict):
    """Load the AS-ARM of ``--model`` / ``--weights`` and parse ``--infill``.

    Returns:
      ``(model, params, tasks, config, show)``: one infilling task ``(tokens, masked)``, the
      method's config (``--suppress-unk`` resolved to the model's UNK id) and ``show(result)``,
      the filled template's text.

    Raises:
      jaxspec.asarm.infill.TemplateError (a ValueError): a malformed template or one past the
      model's context; models.llama.params.WeightFileError: unreadable weights.
    """
    asarm = load_asarm(args.weights or args.model)
    tpl = parse_template(unescape_cli(args.infill), asarm.tokenizer, max_len=asarm.max_len)
    if "suppress" in options:
        unk = getattr(asarm.vocab, "unk", None)
        options = {**options, "suppress": () if unk is None else (int(unk),)}
    tasks = [(list(asarm.to_model(tpl.ids)), list(tpl.masked))]

    def show(res) -> list[str]:
        return [tpl.render(res.sequences[0], asarm.decode)]

    return asarm.model, asarm.params, tasks, method.configure(options), show
