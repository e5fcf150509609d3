"""Published config.json files: the zoo's parameter count is transformers' own, for every family the zoo reads.

transformers builds each model from the same file on the meta device (no
memory, any size); counting `model.parameters()` takes each tensor once, so
a tied head is the embedding table, as the zoo counts it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import models_zoo

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.hf_models import hf_count, hf_params, instantiate, zoo_params  # noqa: E402

pytestmark = pytest.mark.torch

CONFIGS = Path(__file__).parent / "data" / "hf_configs"
FOLDERS = sorted(p.name for p in CONFIGS.iterdir() if (p / "config.json").is_file())
#: model_types transformers knows by another name: Kimi K2 is DeepseekV3ForCausalLM.
_HF_TYPE = {"kimi_k2": "deepseek_v3"}


def hf_model(folder: str):
    """transformers' model of the file on the meta device: the text model of a file that nests a text_config and
    whose multimodal model the zoo does not build (Gemma 3, Llama 4), the whole model otherwise."""
    data = json.loads((CONFIGS / folder / "config.json").read_text())
    kind = data.pop("model_type")
    cfg = transformers.CONFIG_MAPPING[_HF_TYPE.get(kind, kind)](**data)
    if kind in ("gemma3", "llama4"):
        return instantiate(transformers.AutoModelForCausalLM.from_config, cfg.text_config, meta=True)
    auto = transformers.AutoModelForImageTextToText if kind in ("llava", "qwen2_vl") else \
        transformers.AutoModelForCausalLM
    return instantiate(auto.from_config, cfg, meta=True)


def unused_vision_params(hf, zoo_names: set[str]) -> int:
    """Parameters of a VLM's vision tower that no computation reads (layers past the feature layer, CLIP's
    post_layernorm): transformers holds them, the zoo's graph does not."""
    return sum(p.numel() for n, p in hf.named_parameters() if n not in zoo_names)


@pytest.mark.parametrize("folder", FOLDERS)
def test_parameter_count_is_transformers_count(folder):
    hf = hf_model(folder)
    total, active = models_zoo.hf_param_counts(CONFIGS / folder)
    zoo = models_zoo.build_hf(CONFIGS / folder, seq_len=1024)
    ours = zoo_params(zoo)
    theirs = hf_params(hf)
    assert all(theirs[name] == shape for name, shape in ours.items())  # every tensor of ours is theirs, same shape
    missing = unused_vision_params(hf, set(ours))
    assert total + missing == hf_count(hf)
    if folder == "llava-1.5-7b-hf":  # CLIP's 24th layer and post_layernorm: the features are the 23rd layer's
        assert missing == 4 * 1024 * 1024 + 4 * 1024 + 4 * 1024 + 2 * 1024 * 4096 + 4096 + 1024 + 2 * 1024
    else:
        assert missing == 0 and set(ours) == set(theirs)
    assert 0 < active <= total
