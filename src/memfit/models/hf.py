"""A transformers model's parameters, from its normalized config (models/hf_config.normalize).

`parameters(cfg)` lists what `named_parameters()` of the transformers 5.24 class yields for that
config (built on the meta device): the same names, shapes and order, a tied weight once (at its
first name, the input embedding), buffers left out (rotary inv_freq, BERT's position ids, Gemma's
embedding scale). `linear_modules(cfg)` lists the nn.Linear (and GPT-2 Conv1D) modules a LoRA
adapter can target. Both come from one description of the module tree per family, written once
per layer kind and repeated for the layers, so a 70B config derives as fast as a tiny one.

Module order follows each class's __init__ (named_parameters visits a module's own parameters,
then its children in registration order); tests/models/test_transformers_params.py builds every family
with transformers and compares.
"""


from __future__ import annotations

from memfit.models.falcon import falcon_layout  # hf.falcon_layout for callers
from memfit.models.hf_layers import (
    architecture, ATTENTIONS, block_layers, CHECKPOINTING, CONV1D, EMBEDDING, family, head, head_dim, layer_kinds,
    LINEAR, LINEAR_BIAS, Module, MOE_LAYERS, NORM, num_layers, OTHER, Param,
)
from memfit.models.hf_params import (
    blocks, layer_parameters, layer_prefix, linear_modules, module_tree, parameter_count, parameters, summary,
    tied_embedding,
)
from memfit.models.hf_derive import (
    activation_bytes, BlockRow, derive, forced_activations, is_transformer, Model, _recipe_arguments, saved_rows,
    _tensors,
)
from memfit.models.hf_explain import attention_lines, routing_lines

# What the rest of memfit imports from here. The jobs live in the modules above: hf_layers (the module tree, layer
# by layer), hf_params (parameters, linear modules, blocks, summary), hf_derive (reading the model in a config:
# config.json, the recipe's arguments, the tensors), hf_explain (what explain states beside the transformer's table, report/model_tables).
__all__ = [
    "falcon_layout", "architecture", "ATTENTIONS", "block_layers", "CHECKPOINTING", "CONV1D", "EMBEDDING", "family",
    "head", "head_dim", "layer_kinds", "LINEAR", "LINEAR_BIAS", "Module", "MOE_LAYERS", "NORM", "num_layers",
    "OTHER", "Param", "blocks", "layer_parameters", "layer_prefix", "linear_modules", "module_tree",
    "parameter_count", "parameters", "summary", "tied_embedding", "activation_bytes", "BlockRow", "derive",
    "forced_activations", "is_transformer", "Model", "_recipe_arguments", "saved_rows", "_tensors",
    "attention_lines", "routing_lines",
]
