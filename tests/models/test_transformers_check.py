"""A transformer model through the whole check: config forms, the rules that tie `model` to
`training`, bytes through the cost model, diagnostics placed in config.json, explain, hover, hints."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.check.pipeline import check, check_file
from memfit.editor.editor import Analysis
from memfit.models import hf_activations

ROOT = Path(__file__).resolve().parents[2]
GPT2 = json.loads((ROOT / "examples" / "models" / "gpt2.json").read_text())
TINY = {"model_type": "llama", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


def doc(model: str, training: str = "training: {micro_batch: 2, seq_len: 16}\n", extra: str = "") -> str:
    return f"memfit: 1\noptimizer: adam\ndevice: {{memory: 1 TiB}}\n{extra}model:\n{model}\n{training}"


def write(tmp_path, config: dict | str, yaml_text: str | None = None, name: str = "config.json"):
    (tmp_path / name).write_text(config if isinstance(config, str) else json.dumps(config, indent=2))
    path = tmp_path / "train.yaml"
    path.write_text(yaml_text or doc(f"  hf_config: {name}"))
    return path


def codes_of(result):
    return [d.code for d in result.diagnostics]


def meta_parameters(given: dict) -> int:
    """The parameters transformers itself builds for the config (on the meta device: no weights), tied ones once."""
    import needs

    torch = needs.module("torch")
    transformers = needs.module("transformers")
    config = transformers.AutoConfig.for_model(**given)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def meta_buffer_bytes(given: dict, dtype: str) -> int:
    """The bytes of the registered buffers transformers builds for the config (rotary inv_freq, ...) in `dtype` as
    from_pretrained(dtype=...) builds the model: they are on the device beside the parameters, under `parameters`."""
    import needs

    torch = needs.module("torch")
    transformers = needs.module("transformers")
    config = transformers.AutoConfig.for_model(**given)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    return sum(b.numel() * b.element_size() for b in model.buffers())


def measured(given: dict, **run) -> dict:
    """A real step of the model on the CPU: the bytes autograd saves (tests/support/hf_measure.py)."""
    import needs

    needs.module("torch")
    transformers = needs.module("transformers")
    import hf_measure

    return hf_measure.measure(transformers.AutoConfig.for_model(**given).to_dict(), **run)


def test_hf_config_bytes_are_the_parameters_and_the_saved_tensors(tmp_path):
    path = write(tmp_path, TINY)
    result = check_file(str(path))
    assert result.diagnostics == []
    elements = meta_parameters(TINY)
    assert elements == 67_904  # embed 96x64 + head 96x64 + 2 layers x (q 64x64 + k, v 32x64 + o 64x64 + 3 x 80x64 + 2 x 64) + norm 64
    assert elements == 2 * 96 * 64 + 2 * (64 * 64 * 2 + 32 * 64 * 2 + 3 * 80 * 64 + 2 * 64) + 64
    fp = result.footprint
    assert fp["parameters"] == 4 * elements + meta_buffer_bytes(TINY, "float32") and fp["gradients"] == 4 * elements and fp["optimizer_state"] == 8 * elements
    # the bytes autograd saves in a real step of the same model (sdpa, 2 x 16 tokens): equal to the byte
    assert fp["activations"] == measured(TINY, micro_batch=2, seq_len=16, attention="sdpa")["total"]
    assert result.config.model.file == str(tmp_path / "config.json")


def test_inline_transformer_is_the_same_as_the_file(tmp_path):
    path = write(tmp_path, TINY)
    inline = check(doc("  transformer: " + json.dumps(TINY)))
    assert inline.diagnostics == []
    assert inline.footprint == check_file(str(path)).footprint


def test_bf16_dtypes_and_checkpointing(tmp_path):
    extra = "dtypes: {parameters: bfloat16, gradients: bfloat16, activations: bfloat16}\n"
    training = "training: {micro_batch: 2, seq_len: 16, attention: eager, checkpointing: full}\n"
    result = check(doc("  transformer: " + json.dumps(TINY), training, extra))
    assert result.diagnostics == []
    # the peak of saved bytes in a real bf16 step with gradient checkpointing (eager, 2 x 16 tokens): to the byte
    real = measured(TINY, micro_batch=2, seq_len=16, attention="eager", checkpointing="full", precision="bf16-true")
    assert result.footprint["activations"] == real["peak"] < real["total"]
    assert result.footprint["parameters"] == 2 * meta_parameters(TINY) + meta_buffer_bytes(TINY, "bfloat16")


def test_the_gpt2_example_is_its_measured_activations(tmp_path):
    """The bundled example's model and dtypes (bf16, eager) against a real step of GPT-2 small on the CPU at one
    sequence of 128 tokens (its 8 x 1024 saves 12 GB: more than CI has): memfit counts each of the 25 LayerNorms'
    statistics in fp32 (4 bytes a token), which torch keeps in 16 bits under bf16; the rest is equal to the byte
    (docs/transformers.md says so)."""
    import yaml

    result = check_file(str(ROOT / "examples" / "gpt2-small.yaml"))
    assert result.diagnostics == []
    assert meta_parameters(GPT2) == 124_439_808 == result.footprint["parameters"] // 2
    doc_ = yaml.safe_load((ROOT / "examples" / "gpt2-small.yaml").read_text())
    doc_["training"].update(micro_batch=1, seq_len=128)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "gpt2.json").write_text(json.dumps(GPT2))
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(doc_, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(tmp_path / "small.yaml")], capture_output=True, text=True, timeout=120, check=False)
    ours = json.loads(done.stdout)["files"][0]["footprint"]["activations"]
    real = measured(GPT2, micro_batch=1, seq_len=128, attention="eager", precision="bf16-true")["total"]
    norms = 2 * GPT2["n_layer"] + 1
    assert (ours, real) == (111_186_444, 111_173_644) and ours - real == norms * 128 * 4


# ---------------------------------------------------------------------------------------------
# Diagnostics in config.json, linked from hf_config


def test_missing_file_is_io_at_the_hf_config_value(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(doc("  hf_config: nope/config.json"))
    (d,) = check_file(str(path)).diagnostics
    assert d.code == "io" and d.file is None
    assert (d.range.start_line, d.range.start_character) == (4, 13)
    assert "nope/config.json" in d.message


def test_invalid_json_is_placed_in_the_file_and_linked(tmp_path):
    path = write(tmp_path, '{\n  "model_type": "llama",\n  "hidden_size": 64,,\n}\n')
    result = check_file(str(path))
    (d,) = result.diagnostics
    assert d.code == "json-syntax" and d.file == str(tmp_path / "config.json")
    assert (d.range.start_line, d.range.start_character) == (2, 20)
    assert (d.related.start_line, d.related.start_character) == (4, 13)
    assert result.footprint is None


@pytest.mark.parametrize(
    "config, code, line",
    [
        # an encoder-decoder without a family: traced as its seq2seq class and measured on fake tensors (issue 34)
        ({"model_type": "mt5", "d_model": 64}, "measured-activations", 1),
        ({**TINY, "architectures": ["LlamaForQuestionAnswering"]}, "unsupported-model", 9),
        ({**TINY, "architectures": ["LlamaForSequenceClassification"]}, "unsupported-model", 9),  # no pad_token_id at micro_batch 2: transformers refuses it
        ({**TINY, "num_hidden_layers": "2"}, "bad-model-config", 5),
        ({**TINY, "num_key_value_heads": 3}, "shape-mismatch", 7),
        ({"hidden_size": 64}, "bad-model-config", 0),
    ],
)
def test_config_json_problems_are_at_their_key(tmp_path, config, code, line):
    path = write(tmp_path, config)
    (d,) = check_file(str(path)).diagnostics
    assert d.code == code and d.file == str(tmp_path / "config.json")
    assert d.range.start_line == line
    assert (d.related.start_line, d.related.start_character) == (4, 13)


def test_text_output_names_the_file_and_the_reference(tmp_path):
    path = write(tmp_path, {**TINY, "num_key_value_heads": 3})
    done = subprocess.run([sys.executable, "-m", "memfit", "check", str(path)], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 1
    assert f"{tmp_path / 'config.json'}:8:" in done.stdout and "shape-mismatch" in done.stdout


def test_inline_problems_are_at_the_yaml_key():
    result = check(doc("  transformer: {model_type: llama, num_key_value_heads: 5}"))
    (d,) = result.diagnostics
    assert d.code == "shape-mismatch" and d.file is None and d.range.start_line == 4
    # a model_type transformers knows is traced with memfit[trace] (tests/models/test_traced_cli.py); one it does not is not
    (d,) = check(doc("  transformer: {model_type: no_such_model}")).diagnostics
    assert d.code == "unsupported-model" and "llama" in d.message
    # read as hf_config reads a config.json (issue 19): a key no family reads is ignored, as
    # transformers ignores it, and a likely typo of one that is read gets a note at the key
    typo = check(doc("  transformer: {model_type: llama, num_hiden_layers: 2}"))
    (d,) = typo.diagnostics
    assert d.code == "ignored-key" and d.severity == "information" and "num_hidden_layers" in d.message and d.range.start_line == 4
    assert typo.footprint == check(doc("  transformer: {model_type: llama}")).footprint
    assert check(doc("  transformer: {model_type: llama, _name_or_path: x/y, output_attentions: false}")).diagnostics == []


def test_one_form_and_one_batch():
    both = check(doc("  transformer: {model_type: llama}\n  layers: []\n  input_shape: [4]"))
    assert codes_of(both) == ["schema"] and both.diagnostics[0].range.start_line == 5
    two = check(doc("  hf_config: a.json\n  transformer: {model_type: llama}"))
    assert codes_of(two) == ["schema"]
    (d,) = check(doc("  transformer: {model_type: llama}", "training: {micro_batch: 2}\n")).diagnostics
    assert d.code == "schema" and "seq_len" in d.message
    keras = "  input_shape: [4]\n  batch_size: 8\n  layers: [{type: Dense, units: 2}]"
    (d,) = check(doc(keras, "training: {micro_batch: 4}\n")).diagnostics
    assert d.code == "schema" and d.range.start_line == 7  # the second of the two: training.micro_batch
    assert check(doc(keras, "training: {micro_batch: 8}\n")).diagnostics == []
    no_batch = "  input_shape: [4]\n  layers: [{type: Dense, units: 2}]"
    assert check(doc(no_batch, "training: {micro_batch: 8}\n")).footprint == check(doc(keras, "")).footprint
    (d,) = check(doc(no_batch, "")).diagnostics
    assert d.code == "schema" and "micro_batch" in d.message


# ---------------------------------------------------------------------------------------------
# explain, hover, hints


def test_explain_has_block_rows():
    done = subprocess.run([sys.executable, "-m", "memfit", "explain", str(ROOT / "examples" / "llama-3-8b.yaml")], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0
    text = done.stdout
    assert "model  LlamaForCausalLM: 8,030,261,248 parameters" in text
    for block in ("embeddings", "layer", "head", "loss"):
        assert f"\n{block} " in text
    assert "kept for backward, per block" in text and "checkpoint: the layer's input" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_hover_on_hf_config_and_hints_on_training_agree_with_check(tmp_path):
    """An invariant (memfit against memfit): the hints print the activations `memfit check` gives for the same config
    with each checkpointing."""
    path = write(tmp_path, TINY, doc("  hf_config: config.json", "training:\n  micro_batch: 2\n  seq_len: 16\n  attention: eager\n  checkpointing: none\n"))
    text = path.read_text()
    analysis = Analysis(text, check(text, str(path)))
    hover = analysis.hover(4, 4)
    assert "LlamaForCausalLM" in hover.markdown and "| layer | 2 |" in hover.markdown
    hints = {h.line: h.label for h in analysis.hints(0, 20)}
    assert hints[6].startswith("activations ") and "at 3:" in hints[6]
    assert "eager" in hints[8] and "sdpa" in hints[8] and "flash" in hints[8]
    checked = {c: check(text.replace("checkpointing: none", f"checkpointing: {c}"), str(path)).footprint["activations"] for c in ("none", "full", "selective")}
    assert hints[9] == f"activations: none {_human(checked['none'])} · full {_human(checked['full'])} · selective {_human(checked['selective'])}"
    assert "training.seq_len" in analysis.hover(7, 3).markdown


def _human(n):
    from memfit.diagnostics.units import human

    return human(n)


def test_a_model_directory_means_its_config_json(tmp_path):
    (tmp_path / "llama").mkdir()
    path = write(tmp_path, TINY, doc("  hf_config: llama"), name="llama/config.json")
    result = check_file(str(path))
    assert result.diagnostics == [] and result.config.model.file == str(tmp_path / "llama" / "config.json")


def test_explain_says_when_config_json_has_another_dtype(tmp_path):
    path = write(tmp_path, {**TINY, "torch_dtype": "float16"})
    done = subprocess.run([sys.executable, "-m", "memfit", "explain", str(path)], capture_output=True, text=True, check=False, timeout=60)
    assert "config.json says dtype float16; training uses dtypes.parameters float32" in done.stdout


@pytest.mark.parametrize("attention", ["eager", "sdpa", "flash"])
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_every_family_checks_and_its_footprint_is_its_models_figure_invariant(attention, checkpointing):
    from transformers_configs import CONFIGS

    for model_type, configs in CONFIGS.items():
        for given in configs:
            raw = {"model_type": model_type, **given}
            training = f"training: {{micro_batch: 2, seq_len: 8, attention: {attention}, checkpointing: {checkpointing}}}\n"
            result = check(doc("  transformer: " + json.dumps(raw), training))
            assert result.diagnostics == [], (model_type, result.diagnostics)
            model = result.config.model
            assert result.footprint["activations"] == model.activations > 0
            names = [r.name for r in model.blocks]
            # a layer block per layer kind (DeepSeek-V3's first_k_dense_replace dense layers: "dense layer"), in order
            kinds = set(hf_activations.layer_kinds(model.cfg))
            layers = ["dense layer", "layer"] if model_type == "deepseek_v3" and len(kinds) > 1 else ["layer"]
            assert names[:len(layers) + 3] == ["embeddings", *layers, "head", "loss"], (model_type, names)
