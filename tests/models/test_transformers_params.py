"""memfit's transformer parameters and config defaults against the real transformers package.

Every family is built from a tiny config object on the meta device (no weights, nothing fetched)
and its named_parameters() / nn.Linear modules compared with models/hf.py exactly; the config
defaults in models/families/ are compared with the transformers config classes. Bad config.json
inputs each give one positioned problem with a stable code.
"""

import dataclasses
import json
from pathlib import Path
import logging

import needs
import pytest

from memfit.models import hf, hf_config
from memfit.models.families import BASE_FIELDS, FAMILIES, SUPPORTED


from transformers_configs import CONFIGS, OTHER_ARCHITECTURES, TINY, build  # noqa: F401 (shared with recipe/ and models/ tests)


@pytest.fixture(scope="module")
def transformers():
    module = needs.module("transformers")
    needs.module("torch")
    module.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return module


def cases():
    for model_type, configs in CONFIGS.items():
        default = FAMILIES[model_type].default_architecture
        for index, given in enumerate(configs):
            yield pytest.param(model_type, given, default, id=f"{model_type}-{index}-{default}")
        if model_type in OTHER_ARCHITECTURES:
            other = OTHER_ARCHITECTURES[model_type]
            yield pytest.param(model_type, dict(configs[0], num_labels=3), other, id=f"{model_type}-{other}")


@pytest.mark.parametrize("model_type, given, architecture", list(cases()))
def test_parameters_match_named_parameters(transformers, model_type, given, architecture):
    raw = {"model_type": model_type, "architectures": [architecture], **given}
    assert hf_config.validate(raw) == []
    cfg = hf_config.normalize(raw)
    model = build(transformers, model_type, given, architecture)

    expected = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    assert [(p.name, p.shape) for p in hf.parameters(cfg)] == expected
    assert all(p.requires_grad for p in model.parameters())
    assert hf.parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    layer = [(p.name, p.shape) for p in hf.layer_parameters(cfg)]
    prefix = next(name for name, _ in expected if ".0." in name).split(".0.")[0] + ".0."
    assert layer == [(name[len(prefix) :], shape) for name, shape in expected if name.startswith(prefix)]

    import torch.nn as nn
    from transformers.pytorch_utils import Conv1D

    modules = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            modules.append((name, module.in_features, module.out_features, module.bias is not None))
        elif isinstance(module, Conv1D):
            modules.append((name, module.weight.shape[0], module.nf, module.bias is not None))
    assert hf.linear_modules(cfg) == modules
    # the weight the head shares with the input embedding (the ledger starts its gradient at the head's backward)
    head = model.get_output_embeddings()
    shared = [name for name, p in model.named_parameters() if head is not None and p is head.weight]
    assert hf.tied_embedding(cfg) == (shared[0] if shared and shared[0] != f"{head_name(model, head)}.weight" else None)


def head_name(model, module) -> str:
    return next(name for name, m in model.named_modules() if m is module)


def test_kinds_follow_the_module_types(transformers):
    cfg = hf_config.normalize({"model_type": "gpt2", **CONFIGS["gpt2"][0]})
    kinds = {p.name: p.kind for p in hf.parameters(cfg)}
    assert kinds["transformer.wte.weight"] == "embedding"
    assert kinds["transformer.h.0.attn.c_attn.weight"] == "conv1d"
    assert kinds["transformer.h.0.attn.c_attn.bias"] == "linear_bias"
    assert kinds["transformer.ln_f.bias"] == "norm"
    cfg = hf_config.normalize({"model_type": "mixtral", **CONFIGS["mixtral"][0]})
    kinds = {p.name: p.kind for p in hf.parameters(cfg)}
    assert kinds["model.layers.0.mlp.experts.gate_up_proj"] == "other"
    assert kinds["model.layers.0.self_attn.q_proj.weight"] == "linear"
    assert kinds["model.norm.weight"] == "norm"


def test_heads():
    assert hf.head(hf_config.normalize({"model_type": "bert"})) == "masked-lm"
    assert hf.head(hf_config.normalize({"model_type": "gpt2"})) == "causal-lm"
    assert hf.head(hf_config.normalize({"model_type": "llama", "architectures": ["LlamaForSequenceClassification"]})) == "sequence-classification"


# ------------------------------------------------------------------------------------------
# Defaults: models/families/ against the config classes


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_family_fields_are_the_config_class_fields(transformers, model_type):
    config_class = transformers.CONFIG_MAPPING[model_type]
    family = FAMILIES[model_type]
    assert config_class.__name__ == family.config_class
    declared = {}
    for f in dataclasses.fields(config_class):
        declared[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    mine = {key: default for key, (default, _) in {**BASE_FIELDS, **family.fields}.items()}
    assert mine == declared
    assert family.attribute_map == dict(config_class.attribute_map)
    assert family.rope_theta_default in (None, config_class.default_theta)
    architectures = set(family.architectures)
    for name in architectures:
        assert hasattr(transformers, name)


REAL = {
    "llama-3-8b": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
        "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0", "use_cache": True,
        "vocab_size": 128256,
    },
    "gpt2": {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1, "bos_token_id": 50256,
        "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
        "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1,
        "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
        "summary_use_proj": True, "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "vocab_size": 50257,
    },
    "llama-3.1-rope": {
        "model_type": "llama", "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    },
    "qwen2-window": {"model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 2, "num_hidden_layers": 4, "head_dim": 32},
    "neox-legacy-rope": {"model_type": "gpt_neox", "rotary_pct": 0.5, "rotary_emb_base": 20000},
    "phi3-partial": {"model_type": "phi3", "rope_scaling": None, "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    "mixtral-alias": {"model_type": "mixtral", "num_experts": 4, "rope_theta": 1e6, "router_aux_loss_coef": 0.02, "torch_dtype": "bfloat16"},
    "gemma-gelu": {"model_type": "gemma", "hidden_act": "gelu", "torch_dtype": "float32"},
    "gpt2-aliases": {"model_type": "gpt2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_labels": 3},
    "gemma-3-1b": json.loads((Path(__file__).resolve().parents[2] / "examples" / "models" / "gemma-3-1b.json").read_text()),
    "gemma3-rope": {"model_type": "gemma3_text", "num_hidden_layers": 3, "sliding_window_pattern": 2, "rope_theta": 5e5,
                    "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
    # (without max_window_layers and pretraining_tp: keys Qwen2's and Llama's classes read and SmolLM3's does not,
    # which normalize() leaves out by design, see hf_config._ignored)
    "smollm3-3b": {k: v for k, v in json.loads((Path(__file__).resolve().parents[2] / "examples" / "models" / "smollm3-3b.json").read_text()).items()
                   if k not in ("max_window_layers", "pretraining_tp")},
    "smollm3-window": {"model_type": "smollm3", "num_hidden_layers": 8, "use_sliding_window": True, "sliding_window": 64},
    "falcon-40b": json.loads((Path(__file__).resolve().parents[2] / "examples" / "models" / "falcon-40b.json").read_text()),
    "falcon-n_embed": {"model_type": "falcon", "n_embed": 128, "num_attention_heads": 8, "alibi": True, "rope_theta": 5e5},
    "gpt-oss-20b": json.loads((Path(__file__).resolve().parents[2] / "examples" / "models" / "gpt-oss-20b.json").read_text()),
    "gpt-oss-rope": {"model_type": "gpt_oss", "num_hidden_layers": 3, "rope_theta": 10000.0, "num_experts": 8},
    "bert-labels": {"model_type": "bert", "id2label": {"0": "a", "1": "b", "2": "c"}, "label2id": {"a": 0, "b": 1, "c": 2}},
}


@pytest.mark.parametrize("raw", [{"model_type": m} for m in SUPPORTED] + list(REAL.values()), ids=list(SUPPORTED) + list(REAL))
def test_normalize_is_to_dict(transformers, raw):
    given = {key: value for key, value in raw.items() if key != "model_type"}
    expected = transformers.AutoConfig.for_model(raw["model_type"], **json.loads(json.dumps(given))).to_dict()
    mine = hf_config.normalize(raw)
    for d in (expected, mine):
        d.pop("_name_or_path")
    assert mine == expected


# ------------------------------------------------------------------------------------------
# Speed and size: closed form per layer kind


def test_seventy_billion_derives_fast():
    raw = {
        "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0,
    }
    from work import calls

    def derive():
        cfg = hf_config.normalize(raw)
        return hf.parameter_count(cfg), hf.parameters(cfg)

    derive()  # imports and caches warmed
    (count, params), work = calls(derive)
    assert count == 70_553_706_496  # Llama-3-70B's published size
    assert len(params) == 2 + 80 * 9 + 1
    # closed form per layer kind: a few function calls per parameter tensor (about 3 measured), not per element
    assert work < 10 * len(params), work


# ------------------------------------------------------------------------------------------
# Bad input: a positioned problem with a stable code


def located(tmp_path, text: str):
    path = tmp_path / "config.json"
    path.write_text(text)
    loaded = hf_config.load(str(path))
    problems = hf_config.validate(loaded.raw)
    return [(p.code, loaded.positions.range(p.path, p.on_key), p.message) for p in problems]


def test_missing_file_is_io(tmp_path):
    with pytest.raises(hf_config.LoadError) as error:
        hf_config.load(str(tmp_path / "nope.json"))
    assert error.value.code == "io" and error.value.range is None
    with pytest.raises(hf_config.LoadError) as error:
        hf_config.load(str(tmp_path))
    assert error.value.code == "io" and "directory" in error.value.message


def test_invalid_json_is_placed(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "model_type": "llama",\n  "hidden_size": 4096,,\n}\n')
    with pytest.raises(hf_config.LoadError) as error:
        hf_config.load(str(path))
    assert error.value.code == "json-syntax"
    assert (error.value.range.start_line, error.value.range.start_character) == (2, 22)  # the second comma


def test_binary_and_non_utf8_are_io(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"model_type": "\xff"}')
    with pytest.raises(hf_config.LoadError) as error:
        hf_config.load(str(path))
    assert error.value.code == "io" and error.value.range.start_character == 16


def test_unknown_model_type_lists_supported(tmp_path):
    [(code, where, message)] = located(tmp_path, '{\n  "model_type": "bart",\n  "d_model": 512\n}')
    assert code == "unsupported-model"
    assert (where.start_line, where.start_character, where.end_character) == (1, 16, 22)
    assert all(name in message for name in SUPPORTED)


def test_unknown_architecture(tmp_path):
    [(code, where, message)] = located(tmp_path, '{"model_type": "llama",\n "architectures": ["LlamaForQuestionAnswering"]}')
    assert code == "unsupported-model" and where.start_line == 1 and where.start_character == 19
    assert "LlamaForCausalLM" in message


def test_missing_model_type(tmp_path):
    [(code, where, _)] = located(tmp_path, '\n\n  {"hidden_size": 64}')
    assert code == "bad-model-config" and (where.start_line, where.start_character) == (2, 2)


def test_ill_typed_key(tmp_path):
    [(code, where, message)] = located(tmp_path, '{"model_type": "llama",\n "num_hidden_layers": "32"}')
    assert code == "bad-model-config" and (where.start_line, where.start_character, where.end_character) == (1, 22, 26)
    assert "integer" in message
    [(code, _, message)] = located(tmp_path, '{"model_type": "llama", "vocab_size": 0}')
    assert code == "bad-model-config" and "at least 1" in message
    [(code, _, _)] = located(tmp_path, '{"model_type": "gpt2", "n_embd": true}')
    assert code == "bad-model-config"
    [(code, where, message)] = located(tmp_path, '{"model_type": "gpt2",\n "hidden_size": "64"}')  # an alias
    assert code == "bad-model-config" and (where.start_line, where.start_character) == (1, 16) and message.startswith("hidden_size ")


def test_shape_mismatch_at_its_key(tmp_path):
    [(code, where, message)] = located(tmp_path, '{"model_type": "llama",\n "hidden_size": 100,\n "num_attention_heads": 8}')
    assert code == "shape-mismatch" and where.start_line == 1 and "divisible" in message
    [(code, where, _)] = located(tmp_path, '{"model_type": "mistral", "num_attention_heads": 32,\n "num_key_value_heads": 6}')
    assert code == "shape-mismatch" and where.start_line == 1 and where.start_character == 24
    [(code, where, _)] = located(tmp_path, '{"model_type": "gpt2", "hidden_size": 100, "n_head": 12}')
    assert code == "shape-mismatch" and where.start_character == 38  # the alias as config.json spells it
    [(code, _, _)] = located(tmp_path, '{"model_type": "phi3", "vocab_size": 100}')  # Phi-3's default pad_token_id 32000
    assert code == "shape-mismatch"
    [(code, _, _)] = located(tmp_path, '{"model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 3}')
    assert code == "shape-mismatch"


def test_messages_quote_only_an_excerpt(tmp_path):
    secret = "x" * 5000
    [(code, _, message)] = located(tmp_path, json.dumps({"model_type": secret}))
    assert code == "unsupported-model" and len(message) < 300 + len(", ".join(SUPPORTED))  # the value excerpted; the families listed


def test_inline_dict_problems_are_key_paths():
    assert hf_config.validate({"model_type": "llama", "num_key_value_heads": 5}) == [
        hf_config.HFProblem(("num_key_value_heads",), "shape-mismatch", "num_attention_heads 32 is not divisible by num_key_value_heads 5: each key/value head serves a whole group")
    ]
    assert hf_config.validate([1, 2])[0].code == "bad-model-config"


def test_blocks_concatenate_to_parameters():
    for model_type, configs in CONFIGS.items():
        for given in configs:
            cfg = hf_config.normalize({"model_type": model_type, **given})
            (_, _, embeddings), *middle, (_, _, head) = hf.blocks(cfg)
            prefix = hf.layer_prefix(cfg)
            covers = hf.block_layers(cfg)  # where layers differ (MoE and dense), each kind is a block
            of = {i: layer for name, count, layer in middle for i in covers[name] if len(covers[name]) == count}
            assert sorted(of) == list(range(hf.num_layers(cfg)))
            flat = embeddings + [hf.Param(f"{prefix}{i}.{p.name}", p.shape, p.kind) for i in sorted(of) for p in of[i]] + head
            assert flat == hf.parameters(cfg)


def test_summary():
    cfg = hf_config.normalize(REAL["llama-3-8b"])
    assert hf.summary(cfg) == "LlamaForCausalLM: 8,030,261,248 parameters; 32 layers, hidden 4096, 32 heads (8 key/value) of 128"
