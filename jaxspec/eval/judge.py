"""Generative perplexity (ASSD paper Eq. 21): a causal judge scores generated sequences.

Used by the AS-ARM benchmark suite (:mod:`jaxspec.bench.assd`, Table 1's gen. PPL column) and the
AS-ARM infilling gate (:func:`jaxspec.eval.quality.run_asarm_gate`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from models.registry import load_model


def smollm2_judge(
    log: Callable[[str], None] = lambda m: None,
    name: str = "smollm2-135m-instruct",
    unk_id: int = 0,
    batch: int = 4,
) -> Callable[[Sequence[Sequence[int]]], list]:
    """A generative-perplexity judge (Eq. 21) backed by a causal preset (SmolLM2-135M).

    Returns ``judge(seqs) -> list[float]``: per sequence of tokenizer ids, ``exp`` of the mean
    negative log-likelihood of tokens ``1..N-1`` given their prefix (token 0 has no context).
    Ids ``< 0`` (the AS-ARM's UNK) are scored as ``unk_id``. Sequences are right-padded to a
    multiple of 64 and scored ``batch`` at a time with one jitted causal forward.
    """
    model, params, _, _ = load_model(name, log=log)

    @jax.jit
    def nll(tok, valid):
        T = tok.shape[1]
        pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), tok.shape)
        att = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (tok.shape[0], T, T))
        out = model.apply({"params": params}, tok, pos, att)
        logits = out[0] if isinstance(out, tuple) else out
        lp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), -1)
        tgt = jnp.take_along_axis(lp, tok[:, 1:, None], -1)[..., 0]
        v = valid[:, 1:]
        return -jnp.sum(jnp.where(v, tgt, 0.0), 1) / jnp.maximum(jnp.sum(v, 1), 1)

    def judge(seqs):
        out = []
        for s in range(0, len(seqs), batch):
            chunk = [
                np.where(np.asarray(x) < 0, unk_id, np.asarray(x)) for x in seqs[s : s + batch]
            ]
            T = int(-(-max(len(x) for x in chunk) // 64) * 64)
            tok = np.zeros((batch, T), np.int32)
            val = np.zeros((batch, T), bool)
            for i, x in enumerate(chunk):
                tok[i, : len(x)] = x
                val[i, : len(x)] = True
            out += [float(np.exp(v)) for v in np.asarray(nll(tok, val))[: len(chunk)]]
        return out

    return judge


__all__ = ["smollm2_judge"]
