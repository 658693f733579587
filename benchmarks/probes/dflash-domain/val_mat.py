"""MAT of the committed DFlash drafter on the held-out rows of its own training distribution.

Question: is the drafter's low MAT on HumanEval (`results/dflash.md`) domain shift, or a
mismatch between training and decoding? This decodes the first N held-out prompts of the
self-distillation set (`split == "val"`, stdlib function prompts the drafter never trained on,
in the training format) with `dflash` and with AR, greedy, 64 new tokens, and prints MAT,
acceptance, identity, and how often AR's output equals the stored answer (the training labels
are the target's own greedy answers).

    python benchmarks/probes/dflash-domain/val_mat.py 8

2026-11-28, 2-core AMD EPYC, drafter at step 2,250 (run beside a benchmark, so no timings):
8 prompts: MAT 1.740, acceptance 0.052, identical True; AR's output equals the stored answer's
prefix in 0.75 of the prompts (an earlier version of this script, which compared only the
overlap of the two, said 0.88). HumanEval in `results/dflash.md`: MAT 1.27. The training
eval's tau on fixed held-out blocks was 2.00.
"""

import gzip
import json
import sys

import numpy as np

from jaxspec import methods
from jaxspec.causal.dflash import load_drafter
from models.registry import load_model

DRAFTER = "checkpoints/dflash-smollm2-135m/drafter.safetensors"
DISTILL = "checkpoints/smollm2-135m-space/distill.jsonl.gz"


def main(n: int = 8) -> None:
    model, params, tok, _ = load_model("smollm2-135m-instruct")
    drafter = load_drafter(DRAFTER)
    rows = [json.loads(line) for line in gzip.open(DISTILL)]
    val = [r for r in rows if r["split"] == "val"][:n]
    prompts = [r["prompt"] for r in val]
    kw = dict(seed=0, eos_ids=tuple(tok.eos_token_ids), pad_id=tok.pad_token_id or 0)
    cfg = methods.get_method("dflash").configure(max_new_tokens=64, drafter_model=drafter)
    res = methods.run("dflash", model, params, prompts, cfg, **kw)
    ar_cfg = methods.get_method("ar").configure(max_new_tokens=64)
    ar = methods.run("ar", model, params, prompts, ar_cfg, **kw)
    same = np.mean(
        [a == r["answer"][: len(a)] for a, r in zip(ar.tokens, val)]
    )  # AR's output is a prefix of the stored answer
    st = res.stats
    print(
        f"{len(prompts)} prompts: MAT {st.mat:.3f}, acceptance {st.acceptance_rate:.3f}, "
        f"identical {res.tokens == ar.tokens}; AR output equals the stored answer's prefix "
        f"in {same:.2f} of the prompts"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
