"""Subprocess worker for ``tests/models/test_sharding.py``: runs every registry method on its
family's tiny model once on one device and once with the parameters (and draft models)
sharded over a ``DATAxMODEL`` mesh of fake CPU devices, and prints one JSON line per method
with whether the tokens and NFE agree.

    python -m tests.models.sharding_worker --devices 8 --mesh 2x4

The device count must be fixed before JAX starts (``--xla_force_host_platform_device_count``),
hence a subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, required=True)
    ap.add_argument("--mesh", required=True)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--methods", default="all")
    ap.add_argument(
        "--checkpoint",
        default=None,
        help="instead: load this HF directory onto the mesh (bfloat16) and compare "
        "it with the one-device load",
    )
    args = ap.parse_args(argv)
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
    )
    import jax
    import numpy as np

    from jaxspec.methods import METHODS
    from models.llama.layout import decode_layout
    from models.sharding import make_mesh, mesh_of, shard_params
    from tests.test_methods import _inputs

    assert len(jax.devices()) == args.devices, jax.devices()
    mesh = make_mesh(args.mesh)

    def inputs(family):  # the registry test's tiny settings; 4 XLNet heads split 4 ways
        return _inputs(family, max_new_tokens=12, xlnet_heads=4)

    def sharded(opts):
        """Draft models in the options, sharded by their own rules."""
        out = {}
        for field in ("draft_model", "dllm_drafter"):
            pair = opts.get(field)
            if pair is not None:
                out[field] = (pair[0], shard_params(pair[0].config, pair[1], mesh))
        return dict(opts, **out)

    def rows(res):
        return [np.asarray(r).tolist() for r in res.tokens]

    def nfe(res):
        s = res.stats
        return [np.asarray(s.target_nfe).tolist(), np.asarray(s.draft_nfe).tolist()]

    if args.checkpoint:
        return _check_loading(args.checkpoint, mesh)
    names = list(METHODS) if args.methods == "all" else args.methods.split(",")
    for name in names:
        m = METHODS[name]
        model, params, inp, opts = inputs(m.family)
        opts = dict(opts, temperature=args.temperature)
        if name == "fixed-k":
            opts = dict(opts, tokens_per_step=2)
        if name == "threshold":
            opts = dict(opts, threshold=0.3)
        one = m.run(model, params, inp, m.configure(opts, strict=False), seed=3)
        sp = shard_params(model.config, params, mesh)
        many = m.run(model, sp, inp, m.configure(sharded(opts), strict=False), seed=3)
        spec = str(sp["layers"]["wq" if m.family != "asarm" else "q"].sharding.spec)
        # the AR loop's output-major layout keeps q/k/v apart on a mesh (modeling.fuse_qkv)
        fused = (
            None
            if m.family == "asarm"
            else "wqkv_t" in decode_layout(sp, "unrolled", output_major=True)["layers"][0]
        )
        print(
            json.dumps(
                {
                    "method": name,
                    "tokens": rows(one) == rows(many),
                    "nfe": nfe(one) == nfe(many),
                    "mesh": dict(mesh.shape),
                    "on_mesh": mesh_of(sp) is not None,
                    "wq_spec": spec,
                    "fused_on_mesh": fused,
                }
            ),
            flush=True,
        )
    return 0


def _check_loading(path, mesh) -> int:
    """Load ``path`` shard by shard onto ``mesh`` in bfloat16 and print, as JSON, whether
    every leaf equals the one-device bfloat16 load and carries the rule's sharding."""
    import jax
    import numpy as np

    from models.registry import load_model
    from models.sharding import param_shardings

    model, ref, _, _ = load_model("hf-directory", path, dtype="bfloat16")
    _, sp, _, _ = load_model("hf-directory", path, dtype="bfloat16", mesh=mesh)
    want = param_shardings(model.config, sp, mesh)
    same = jax.tree.leaves(
        jax.tree.map(
            lambda a, b: bool(
                np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
                and a.dtype == b.dtype
            ),
            ref,
            sp,
        )
    )
    placed = jax.tree.leaves(jax.tree.map(lambda a, w: a.sharding == w, sp, want))
    split = sum(any(p is not None for p in w.spec) for w in jax.tree.leaves(want))
    print(
        json.dumps(
            {
                "values": all(same),
                "shardings": all(placed),
                "split_leaves": split,
                "dtype": str(sp["embed"].dtype),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
