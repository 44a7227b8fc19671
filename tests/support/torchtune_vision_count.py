"""Run by a torchtune 0.6.1 interpreter (MEMFIT_TORCHTUNE_PYTHON): build a Llama 3.2 Vision model on the meta device
as a recipe config names it and print, as JSON, its parameter count and what the recipe trains: the `model` mapping
of each config (argv[1], a JSON list of them), either a model builder (`torchtune.models.llama3_2_vision.llama3_2_vision_11b`,
`lora_llama3_2_vision_11b` with its arguments) or `torchtune.modules.model_fusion.DeepFusionModel` with its
`encoder` and `decoder` component builders nested (torchtune's instantiate builds nested components since 0.7;
0.6.1's does not, so this script builds them in the same order). The full recipes train what requires_grad says
(DeepFusionModel's decoder_trainable / encoder_trainable / fusion_trainable); the LoRA recipes train
get_adapter_params(model) only (recipes/lora_finetune_single_device.py set_trainable_params).

torchvision is imported by torchtune's image transforms only (models/clip/_transform.py, resize_with_pad.py), never
by the model builders, and the torchtune interpreter has none: a bare stand-in module satisfies those imports.
"""

import importlib
import importlib.machinery
import json
import sys
import types


def _stand_in_torchvision() -> None:
    names = ("torchvision", "torchvision.transforms", "torchvision.transforms.v2", "torchvision.transforms.v2.functional")
    mods = [types.ModuleType(n) for n in names]
    for parent, child in zip(mods, mods[1:]):
        setattr(parent, child.__name__.rsplit(".", 1)[-1], child)
    mods[1].InterpolationMode = type("InterpolationMode", (), {})
    for m in mods:
        m.__spec__ = importlib.machinery.ModuleSpec(m.__name__, None)
        sys.modules[m.__name__] = m


def _component(path: str):
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def _build(node: dict):
    kwargs = {k: _build(v) if isinstance(v, dict) and "_component_" in v else v for k, v in node.items() if k != "_component_"}
    return _component(node["_component_"])(**kwargs)


_stand_in_torchvision()
import torch  # noqa: E402
from torchtune.modules.peft import get_adapter_params  # noqa: E402



def count(node: dict) -> dict:
    names = [node["_component_"]] + [v["_component_"] for v in node.values() if isinstance(v, dict) and "_component_" in v]
    lora = any(n.rsplit(".", 1)[-1].startswith(("lora_", "qlora_")) for n in names)
    for n in names:
        _component(n)  # imported outside the meta device (torchao's tables)
    with torch.device("meta"):
        model = _build(node)
    params = dict(model.named_parameters())
    trainable = get_adapter_params(model) if lora else {k: p for k, p in params.items() if p.requires_grad}
    return {"parameters": sum(p.numel() for p in params.values()), "trainable": sum(p.numel() for p in trainable.values()),
            "lora": lora}


print(json.dumps([count(node) for node in json.loads(sys.argv[1])]))
