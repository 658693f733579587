"""A SPACE SAR-SFT model in the Hugging Face layout (issue 18): :func:`models.checkpoint.export_hf`
writes a causal model's ``mask_token_id`` to ``config.json`` and
:meth:`models.config.ModelConfig.from_hf_dict` reads it back; plain Llama / Qwen2 configs stay
without one. SPACE (through the method registry, as ``scripts.generate`` runs it) on the
reloaded model is identical to AR greedy and to SPACE on the original parameters."""

from __future__ import annotations

import json

import pytest

from jaxspec.methods import get_method, reference_of
from jaxspec.testing.tiny import tiny_model
from models.checkpoint import export_hf
from models.config import ConfigError, ModelConfig
from models.llama.modeling import CausalLM
from models.llama.params import load_hf_dir

PROMPTS = [[3, 9, 4, 9, 4, 9, 4, 17, 2], [5, 6, 7, 5, 6, 7, 5]]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_space_model_roundtrips_through_hf_layout(arch, tmp_path):
    model, params = tiny_model(64, arch=arch, seed=0, mask_token_id=63)
    export_hf(tmp_path / "hf", model.config, params)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["mask_token_id"] == 63
    config, loaded = load_hf_dir(tmp_path / "hf")
    assert config == model.config and config.mask_token_id == 63

    space = get_method("space")
    cfg = space.configure(max_new_tokens=20, mask_groups=3)
    ref_method, ref_cfg = reference_of(space, cfg)
    assert ref_method.name == "ar"
    kw = dict(seed=3, eos_ids=(7,))
    res = space.run(CausalLM(config), loaded, PROMPTS, cfg, **kw)
    ar = ref_method.run(CausalLM(config), loaded, PROMPTS, ref_cfg, **kw)
    before = space.run(model, params, PROMPTS, cfg, **kw)
    assert res.tokens == ar.tokens == before.tokens
    assert int(res.stats.draft_nfe.sum()) == 0


def test_plain_configs_have_no_mask_token(tmp_path):
    model, params = tiny_model(64, arch="qwen2", seed=0)
    export_hf(tmp_path / "hf", model.config, params)
    raw = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert "mask_token_id" not in raw
    assert load_hf_dir(tmp_path / "hf")[0].mask_token_id is None
    for bad in (64, -1, "63", True):
        with pytest.raises(ConfigError, match="mask_token_id"):
            ModelConfig.from_hf_dict(dict(raw, mask_token_id=bad))
