"""A model's registered buffers (models/buffers.py) against transformers' own build: every family's tiny configs
built on the meta device in the precision's dtype as from_pretrained(dtype=...) builds it; `memfit check`'s footprint parameters are the
bytes of `model.parameters()` plus `model.buffers()` (each storage once), and on one device the peak's live
parameters are the same figure (the two reductions count the same tensors)."""

from __future__ import annotations

import logging

import needs
import pytest
import yaml

from memfit.check.pipeline import check
from memfit.models.families import FAMILIES

from transformers_configs import CONFIGS

DTYPES = {"32-true": "float32", "bf16-true": "bfloat16"}


@pytest.fixture(scope="module")
def transformers():
    module = needs.module("transformers")
    needs.module("torch")
    module.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return module


def their_bytes(params, buffers) -> int:
    """The parameters of one build (every one in the recipe's dtype: model.to(dtype); from_pretrained keeps DeepSeek-V3's
    router weight fp32, a question of the parameters, not of the buffers) and the buffers of the other."""
    seen, total = set(), 0
    for t in [*params.parameters(), *buffers.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_footprint_parameters_are_parameters_and_buffers(transformers, model_type, precision):
    for given in CONFIGS[model_type]:
        check_one(transformers, model_type, given, precision)


def check_one(transformers, model_type, given, precision):
    import torch

    architecture = FAMILIES[model_type].default_architecture
    config = transformers.AutoConfig.for_model(model_type, **given)
    dtype = getattr(torch, DTYPES[precision])
    with torch.device("meta"):  # as from_pretrained(dtype=...) builds it: its buffers; the parameters as the recipe casts them
        model = getattr(transformers, architecture)._from_config(config, dtype=dtype)
        params = getattr(transformers, architecture)._from_config(config).to(dtype)
    doc = {"memfit": 1, "precision": precision, "optimizer": "adamw", "device": {"memory": "1 GiB"},
           "model": {"transformer": {"model_type": model_type, "architectures": [architecture], **given}},
           "training": {"micro_batch": 1, "seq_len": 8}}
    result = check(yaml.safe_dump(doc, sort_keys=False))
    assert not result.failed, result.diagnostics
    assert any(True for _ in model.buffers()) == (model_type != "gpt2")  # (every family here but GPT-2 has some)
    assert result.footprint["parameters"] == their_bytes(params, model)
    assert result.peak["live"]["parameters"] == result.footprint["parameters"]
