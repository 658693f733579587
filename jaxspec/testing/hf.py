"""Tiny random Hugging Face checkpoints for tests and forks: a float32 Llama / Qwen2 saved
with ``save_pretrained`` plus a tiny byte-level BPE tokenizer (``tokenizer.json`` with a
ChatML template), and its GGUF twin written the way llama.cpp's converter would.

torch, transformers and gguf are imported inside the functions (test-only dependencies).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

# Architecture of every tiny model (overridable per call of the ``tiny_hf`` factory).
TINY_DIMS = dict(
    vocab_size=300,  # = 3 control tokens + 256 byte tokens + 41 merges of the tiny tokenizer
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)
TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# A short ChatML template of our own for the tiny tokenizers.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_TINY_CORPUS = (
    "def add(a, b):\n    return a + b\n\nThe quick brown fox jumps over the lazy dog. "
    "for i in range(10):\n    print(i * 2)\nthe theory of the thing is that there are three "
    "threads; in the inner loop, return the result.\n"
) * 8


@dataclasses.dataclass
class TinyHF:
    """A tiny random HF model saved with ``save_pretrained`` (+ a tokenizer) in ``path``."""

    path: Path
    model: "object"  # transformers LlamaForCausalLM / Qwen2ForCausalLM, float32, eval mode
    arch: str  # "llama" | "qwen2"
    tied: bool
    hf_config: "object"


def _train_tiny_bpe(vocab_size: int):
    """Deterministic byte-level BPE with ``vocab_size`` entries: control tokens first (ids
    0..2), then the 256 byte symbols, then merges. Returns ``(tokens, merges)``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_TINY_CORPUS], trainer=trainer)
    tok.decoder = decoders.ByteLevel()
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    assert len(tokens) == vocab_size, f"tiny BPE has {len(tokens)} tokens, wanted {vocab_size}"
    return tokens, merges


def _write_tiny_tokenizer(path: Path, arch: str, tokens, merges):
    """tokenizer.json (arch-specific pre-tokenizer) + tokenizer_config.json in ``path``."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )

    tok = Tokenizer(
        models.BPE(
            vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ")) for m in merges]
        )
    )
    if arch == "qwen2":
        from models.tokenizer import QWEN2_SPLIT

        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:  # SmolLM2-style
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in TINY_SPECIAL_TOKENS]
    )
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "add_bos_token": False,
                "chat_template": TINY_CHAT_TEMPLATE,
            },
            indent=1,
        )
    )


def _randomize_(model, seed: int):
    """Give every weight a non-trivial value: matrices N(0, 0.08), norms 1 + N(0, 0.2),
    biases N(0, 0.2) (HF inits norms to 1 and biases to 0, which would hide mapping bugs)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.2 * noise)
            else:
                p.copy_(0.08 * noise)


def build_tiny_hf(
    path: Path, arch: str = "llama", tied: bool = False, seed: int = 0, **overrides
) -> TinyHF:
    """Create, randomize and ``save_pretrained`` a tiny float32 Llama/Qwen2 into ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    dims = {**TINY_DIMS, **overrides}
    common = dict(tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2, pad_token_id=0, **dims)
    if arch == "llama":
        cfg = LlamaConfig(rope_theta=5000.0, rms_norm_eps=1e-5, **common)
        cls = LlamaForCausalLM
    elif arch == "qwen2":
        cfg = Qwen2Config(rope_theta=10000.0, rms_norm_eps=1e-6, **common)
        cls = Qwen2ForCausalLM
    else:
        raise ValueError(arch)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(cfg).to(torch.float32).eval()
    _randomize_(model, seed)
    if tied:  # keep the tie after randomizing
        model.tie_weights()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tokens, merges = _train_tiny_bpe(dims["vocab_size"])
    _write_tiny_tokenizer(path, arch, tokens, merges)
    return TinyHF(path=path, model=model, arch=arch, tied=tied, hf_config=cfg)


def _llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp converter's q/k row permutation (HF rotate-half -> interleaved pairs)."""
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_tiny_gguf(tiny: TinyHF, out: Path) -> Path:
    """Write ``tiny`` as an F32 GGUF file the way llama.cpp's converter would (Llama q/k
    permuted, tokenizer metadata included). Returns ``out``."""
    import gguf

    c = tiny.hf_config
    arch = tiny.arch
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in tiny.model.state_dict().items()}
    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(
        float(c.rope_parameters["rope_theta"])
        if getattr(c, "rope_parameters", None)
        else float(c.rope_theta)
    )
    w.add_layer_norm_rms_eps(float(c.rms_norm_eps))
    w.add_vocab_size(c.vocab_size)
    tokens, merges = _train_tiny_bpe(c.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in TINY_SPECIAL_TOKENS else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_chat_template(TINY_CHAT_TEMPLATE)
    H, K = c.num_attention_heads, c.num_key_value_heads
    names = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.bias": "attn_v.bias",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        for hf, gg in names.items():
            key = f"model.layers.{i}.{hf}"
            if key not in sd:
                continue
            t = sd[key]
            if arch == "llama" and gg.startswith("attn_q."):
                t = _llama_cpp_permute(t, H)
            elif arch == "llama" and gg.startswith("attn_k."):
                t = _llama_cpp_permute(t, K)
            w.add_tensor(f"blk.{i}.{gg}", np.ascontiguousarray(t))
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not tiny.tied:
        w.add_tensor("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
