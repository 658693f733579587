"""Does DFlash training score blocks the way decoding meets them?

For the first 8 held-out prompts of the self-distillation set, this runs the training
objective's forward (:func:`jaxspec.training.dflash.blocks_at`, teacher-forced on the target's
stored greedy answer, first 128 tokens) at every answer position, and reads each block's
drafts before the first argmax miss. It then reports two figures:

- ``visited MAT``: walk the answer as greedy verification would (anchor = the last emitted
  token; advance by accepted + 1), the MAT that decoding these answers must reach if training
  and decoding agree (compare ``val_mat.py``, which decodes);
- ``uniform tau``: the mean over every anchor with a complete block, the training eval's
  ``val_greedy_tau``, which reads higher because decoding's anchors follow a rejection.

    python benchmarks/probes/dflash-domain/visited.py [DRAFTER]

2026-11-28, 2-core AMD EPYC, the mix-trained drafter of commit ef7d6f6 (before the second
mix pass): visited MAT 1.748, uniform tau 1.986. Decoding the same 8 prompts (128 tokens, no
EOS stop, so past the stored answers' ends) gave MAT 1.62: no mismatch between training and
decoding.
"""

import gzip
import json
import sys

import jax.numpy as jnp
import numpy as np

from jaxspec.causal.dflash import load_drafter
from jaxspec.training.dflash import blocks_at, target_features
from models.registry import load_model

DRAFTER = "checkpoints/dflash-smollm2-135m/drafter.safetensors"
DISTILL = "checkpoints/smollm2-135m-space/distill.jsonl.gz"


def main(path: str) -> None:
    model, params, _, _ = load_model("smollm2-135m-instruct")
    spec, own = load_drafter(path)
    shared = {k: params[k] for k in ("embed", "lm_head") if k in params}
    with gzip.open(DISTILL, "rt") as f:
        val = [r for r in map(json.loads, f) if r.get("split") == "val"][:8]
    B = spec.block_size
    hist, uniform = np.zeros(B + 1, int), []
    for r in val:
        P, answer = len(r["prompt"]), r["answer"][:128]
        seq = np.asarray(r["prompt"] + answer, np.int32)[None]
        T = seq.shape[1]
        hidden = target_features(model, params, jnp.asarray(seq), spec.layer_ids)
        anchors = jnp.arange(P, T, dtype=jnp.int32)[None]
        best = np.asarray(
            jnp.argmax(blocks_at(spec, own, shared, jnp.asarray(seq), hidden, anchors)[0], -1)
        )
        lead = [
            int(np.cumprod(best[i, : len(seq[0, a + 1 : a + B])] == seq[0, a + 1 : a + B]).sum())
            for i, a in enumerate(range(P, T))
        ]
        uniform += [n for n, a in zip(lead, range(P, T)) if a + B - 1 < T]
        a = P
        while a < T - 1:
            hist[lead[a - P] + 1] += 1
            a += lead[a - P] + 1
    print(f"visited MAT {(hist * np.arange(B + 1)).sum() / hist.sum():.3f}")
    print(f"uniform tau {1 + np.mean(uniform):.3f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else DRAFTER)
