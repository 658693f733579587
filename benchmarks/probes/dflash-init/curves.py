"""Held-out training curves of DFlash drafter runs that differ in one setting, on one figure.

Reads the ``eval`` rows of each run's ``metrics.jsonl`` (:mod:`jaxspec.training.dflash_run`:
held-out loss, argmax accuracy at draft positions 1..k, ``val_greedy_tau``) and draws tau and
the first draft's accuracy against the step, one line per run; prints the rows as a table.
Runs with the same seed and held-out rows score the same blocks at every evaluation, so their
curves compare point by point.

    python benchmarks/probes/dflash-init/curves.py NAME=METRICS.jsonl [NAME=METRICS.jsonl ...]
        [--out curves.png]
"""

import argparse
import json
from pathlib import Path

from jaxspec.core.plotting import pyplot


def eval_rows(path) -> list[dict]:
    """The ``eval`` rows of a metrics file, in step order."""
    rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    return sorted((r for r in rows if r.get("kind") == "eval"), key=lambda r: r["step"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="NAME=METRICS.jsonl")
    ap.add_argument("--out", default="curves.png")
    args = ap.parse_args()
    runs = {}
    for item in args.runs:
        name, _, path = item.partition("=")
        runs[name] = eval_rows(path)
    print("| run | step | held-out loss | accuracy at positions 1 / 2 / 3 | tau |")
    print("|---|---|---|---|---|")
    for name, rows in runs.items():
        for r in rows:
            acc = " / ".join(f"{a:.2f}" for a in r["val_acc_pos"][:3])
            print(
                f"| {name} | {r['step']} | {r['val_loss']:.3f} | {acc} | "
                f"{r['val_greedy_tau']:.2f} |"
            )
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in runs.items():
        steps = [r["step"] for r in rows]
        a.plot(steps, [r["val_greedy_tau"] for r in rows], "o-", label=name)
        b.plot(steps, [r["val_acc_pos"][0] for r in rows], "o-", label=name)
    a.set_xlabel("training step")
    a.set_ylabel("held-out tau (greedy tokens per target pass)")
    b.set_xlabel("training step")
    b.set_ylabel("held-out accuracy of the first draft")
    a.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
