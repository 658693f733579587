"""Weight and KV-cache memory of the published LLaDA-8B, Dream-7B and Qwen2.5-7B architectures
under jaxspec's own parameter layout and sharding rules (the table of docs/checkpoints.md,
"Memory").

    .venv/bin/python notebooks/memory_table.py          # prints the markdown table

Nothing is allocated: the parameter shapes come from ``jax.eval_shape`` of the parameters of
:class:`models.llama.modeling.CausalLM` (the body LLaDA and Dream share), and every count is
checked against the closed formula (``V`` vocabulary, ``D`` hidden size, ``L`` layers, ``H`` query
heads, ``K`` key/value heads, ``Dh`` head width, ``F`` MLP width, ``t`` 1 for tied embeddings)::

    N = V*D*(2 - t) + D + L * (2*D*H*Dh + 2*D*K*Dh + 3*D*F + 2*D [+ H*Dh + 2*K*Dh q/k/v biases])

Weight bytes = N * 4 (float32) or N * 2 (bfloat16). Per-device bytes follow
:func:`models.sharding.partition_spec` on a ``1xM`` mesh: a split dimension is divided by ``M``;
replicated parameters (norms, biases of unsplit axes, K/V projections whose ``K`` heads the
model axis does not divide) count in full on every device. ``M`` must divide ``H`` and ``F``
(:func:`models.sharding.check_mesh`); with more devices than the largest such ``M`` the rest go
to the data axis, which replicates the weights (e.g. 8 devices for a 28-head model: ``2x4``).
KV cache (the Fast-dLLM prefix / dual cache of the dLLMs, the causal KV cache) per 1,024
tokens at batch 1, before any split: ``2 * L * K * Dh * 1024 * bytes``.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp

from models.config import ModelConfig
from models.llama.modeling import init_params
from models.sharding import MeshError, check_mesh, partition_spec

# Published config.json values (Hugging Face model repositories): GSAI-ML/LLaDA-8B-Instruct
# (d_model, n_layers, n_heads, n_kv_heads, mlp_hidden_size, vocab_size / embedding_size,
# weight_tying false), Dream-org/Dream-v0-Instruct-7B and Qwen/Qwen2.5-7B-Instruct (the same
# Qwen2.5-7B body: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
# intermediate_size, vocab_size, tie_word_embeddings false; q/k/v biases).
PUBLISHED = {
    "LLaDA-8B-Instruct": ModelConfig(
        arch="llama",
        vocab_size=126464,
        hidden_size=4096,
        intermediate_size=12288,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        qkv_bias=False,
    ),
    "Dream-v0-Instruct-7B": ModelConfig(
        arch="qwen2",
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        qkv_bias=True,
    ),
    "Qwen2.5-7B-Instruct": ModelConfig(
        arch="qwen2",
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        qkv_bias=True,
    ),
}
DEVICES = (1, 4, 8)
GB = 1e9


def param_shapes(config: ModelConfig) -> dict:
    """``{path: shape}`` of the parameter tree (``"embed"``, ``"layers/wq"``, ...), from
    ``jax.eval_shape`` (no memory allocated)."""
    tree = jax.eval_shape(lambda: init_params(config))
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update({f"{k}/{kk}": tuple(vv.shape) for kk, vv in v.items()})
        else:
            out[k] = tuple(v.shape)
    return out


def formula_count(c: ModelConfig) -> int:
    """Parameter count N of the closed formula in the module docstring."""
    D, F, H, K, Dh = c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim
    per_layer = 2 * D * H * Dh + 2 * D * K * Dh + 3 * D * F + 2 * D
    if c.qkv_bias:
        per_layer += H * Dh + 2 * K * Dh
    return c.vocab_size * D * (1 if c.tie_embeddings else 2) + D + c.num_layers * per_layer


def model_axis(config: ModelConfig, devices: int) -> int:
    """The largest model-axis size ``M <= devices`` that divides ``devices`` and passes
    :func:`models.sharding.check_mesh`."""
    for m in range(devices, 0, -1):
        if devices % m == 0:
            try:
                check_mesh(config, types.SimpleNamespace(shape={"data": devices // m, "model": m}))
                return m
            except MeshError:
                continue
    return 1


def per_device_params(config: ModelConfig, shapes: dict, m: int) -> int:
    """Parameters held by one device of a ``1xm`` mesh under :data:`models.sharding.RULES`."""
    mesh = types.SimpleNamespace(shape={"data": 1, "model": m})
    total = 0
    for path, shape in shapes.items():
        spec = partition_spec(config, mesh, path, shape)
        n = 1
        for dim, axis in zip(shape, spec):
            n *= dim // m if axis == "model" else dim
        total += n
    return total


def rows() -> list[dict]:
    """One dict per published architecture: counts, bytes and per-device bytes."""
    out = []
    for name, c in PUBLISHED.items():
        shapes = param_shapes(c)
        n = sum(int(jnp.prod(jnp.asarray(s))) for s in shapes.values())
        if n != formula_count(c):
            raise AssertionError(f"{name}: parameter tree {n} != formula {formula_count(c)}")
        row = {
            "model": name,
            "params": n,
            "f32_gb": 4 * n / GB,
            "bf16_gb": 2 * n / GB,
            "kv_1k_bf16_gb": 2 * c.num_layers * c.num_kv_heads * c.head_dim * 1024 * 2 / GB,
        }
        for d in DEVICES:
            m = model_axis(c, d)
            row[f"mesh_{d}"] = f"{d // m}x{m}"
            row[f"bf16_per_device_{d}"] = 2 * per_device_params(c, shapes, m) / GB
        out.append(row)
    return out


def markdown(table: list[dict]) -> str:
    head = (
        "| model | parameters | weights f32 | weights bf16 | "
        + " | ".join(f"bf16 per device, {d} device{'s' * (d > 1)} (mesh)" for d in DEVICES)
        + " | KV cache per 1k tokens, bf16 (f32: x2) |"
    )
    lines = [head, "|" + "---|" * (5 + len(DEVICES))]
    for r in table:
        per = " | ".join(f"{r[f'bf16_per_device_{d}']:.1f} GB ({r[f'mesh_{d}']})" for d in DEVICES)
        lines.append(
            f"| {r['model']} | {r['params'] / 1e9:.2f} B | {r['f32_gb']:.1f} GB | "
            f"{r['bf16_gb']:.1f} GB | {per} | {r['kv_1k_bf16_gb'] * 1e3:.0f} MB |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(rows()))
