"""A model_type without a memfit family, through the CLI (issue 21, "any other architecture").

With memfit[trace] (torch and transformers installed): exact parameters from the meta-device build, activations
measured on fake tensors (a measured-activations note at model_type; where the step cannot run there, LoRA, the
generic rule's activations and an approximate-activations warning that quotes the measured band); the recipe
(LoRA, checkpointing, optimizer) applies to it as to a family. Without the extra (torch hidden from the
subprocess): unsupported-model at model_type, naming the install, the families and the nearest family. A known
family's check never imports torch.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from needs import module

torch = module("torch")
transformers = module("transformers")

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
# OLMo (the first; OLMo 2 has a family, OLMo has none): tiny, in its own key names
OLMO2 = {"model_type": "olmo", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
LLAMA = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}
BASE = """memfit: 1
optimizer: adamw
device: {{memory: 1 TiB}}
dtypes: {{parameters: float32, gradients: float32, activations: float32, optimizer_state: float32}}
model:
  hf_config: {name}
training: {{micro_batch: 2, seq_len: 32{training}}}
{extra}"""


def write(tmp_path, config: dict, name: str = "config.json", training: str = "", extra: str = "", yaml_name: str = "train.yaml") -> Path:
    (tmp_path / name).write_text(json.dumps(config, indent=2))
    path = tmp_path / yaml_name
    path.write_text(BASE.format(name=name, training=training, extra=extra))
    return path


def run(*args, prelude: str = "") -> tuple[int, dict | str]:
    code = f"import sys\n{prelude}\nfrom memfit.cli.main import main\nsys.exit(main({list(args)!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        return done.returncode, done.stdout + done.stderr


def meta_parameters(config: dict) -> tuple[int, int]:
    """(all parameters, those with requires_grad) of transformers' own meta build."""
    built = transformers.AutoConfig.for_model(config["model_type"], **{k: v for k, v in config.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(built)
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


def test_a_known_family_never_imports_torch(tmp_path):
    path = write(tmp_path, LLAMA)
    prelude = "import atexit\natexit.register(lambda: print('TORCH' if 'torch' in sys.modules or 'transformers' in sys.modules else 'NO-TORCH', file=sys.stderr))"
    code = f"import sys\n{prelude}\nfrom memfit.cli.main import main\nsys.exit(main(['check', '--format', 'json', {str(path)!r}]))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["files"][0]["footprint"]["parameters"] > 0
    assert done.stderr.strip().endswith("NO-TORCH"), done.stderr[-500:]


def test_without_the_extra_the_error_says_what_to_install_and_the_nearest_family(tmp_path):
    path = write(tmp_path, OLMO2)
    # torch hidden: find_spec("torch") is None, as on an install without memfit[trace]
    rc, out = run("check", "--format", "json", str(path), prelude="sys.modules['torch'] = None")
    assert rc == 1, out
    (problem,) = out["files"][0]["diagnostics"]
    assert problem["code"] == "unsupported-model" and problem["severity"] == "error"
    message = problem["message"]
    assert "pip install 'memfit[trace]'" in message
    from memfit.models.families import SUPPORTED

    assert all(name in message for name in SUPPORTED)
    # OLMo's keys are those of the Llama-layout families (OLMo 2's first)
    assert any(f"nearest family by structure: {name} (" in message for name in ("olmo2", "llama", "mistral", "qwen2", "qwen3")), message
    # placed at model_type in config.json (line 2 of the indented JSON)
    assert problem["file"] == str(tmp_path / "config.json") and problem["range"]["start"]["line"] == 1
    assert out["files"][0]["footprint"] is None


def test_nearest_family_by_structure():
    from memfit.models.unknown import nearest_family

    gpt2_like = {"model_type": "gpt_bigcode", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128, "n_inner": None,
                 "activation_function": "gelu_pytorch_tanh", "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
                 "layer_norm_epsilon": 1e-5, "scale_attn_weights": True, "multi_query": True}
    assert nearest_family(gpt2_like)[0] == "gpt2"
    moe = {**OLMO2, "model_type": "qwen2_moe", "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.01,
           "output_router_logits": False, "router_jitter_noise": 0.0, "sliding_window": None}
    assert nearest_family(moe)[0] == "mixtral"
    assert nearest_family({"model_type": "x"}) == (None, 0.0)


def test_an_unknown_model_type_gets_exact_parameters_and_a_warning(tmp_path):
    from memfit.models.traced import band_text

    plain = write(tmp_path, OLMO2)
    lora = write(tmp_path, OLMO2, yaml_name="lora.yaml", extra="lora: {r: 8, alpha: 16, target_modules: [q_proj, v_proj]}\n")
    full = write(tmp_path, OLMO2, yaml_name="full.yaml", training=", checkpointing: full")
    tied = write(tmp_path, {**OLMO2, "tie_word_embeddings": True}, name="tied.json", yaml_name="tied.yaml")
    selective = write(tmp_path, OLMO2, yaml_name="selective.yaml", training=", checkpointing: selective, attention: eager")
    rc, out = run("check", "--format", "json", str(plain), str(lora), str(full), str(tied), str(selective))
    assert rc == 0, out
    files = {Path(f["path"]).stem: f for f in out["files"]}
    count, _ = meta_parameters(OLMO2)
    fp = files["train"]["footprint"]
    assert fp["parameters"] == 4 * count and fp["gradients"] == 4 * count and fp["optimizer_state"] == 8 * count
    (note,) = files["train"]["diagnostics"]   # measured on fake tensors (issue 34)
    assert note["code"] == "measured-activations" and note["severity"] == "information"
    assert "fake tensors" in note["message"] and "meta device" in note["message"]
    assert note["file"] == str(tmp_path / "config.json") and note["range"]["start"]["line"] == 1
    # LoRA runs on fake tensors too (peft's adapters on the fake model); selective recomputation is not a
    # transformers step: the generic rule, its band and the reason
    assert [d["code"] for d in files["lora"]["diagnostics"]] == ["measured-activations"]
    (warning,) = files["selective"]["diagnostics"]
    assert warning["code"] == "approximate-activations" and warning["severity"] == "warning"
    assert band_text() in warning["message"] and "selective" in warning["message"]
    # LoRA: peft's adapters on q_proj and v_proj train; the base is frozen
    adapters = 2 * (8 * 64 + 64 * 8) + 2 * (8 * 64 + 32 * 8)
    lora_fp = files["lora"]["footprint"]
    assert lora_fp["gradients"] == 4 * adapters and lora_fp["parameters"] == 4 * (count + adapters)
    assert lora_fp["activations"] < fp["activations"]
    # a tied head is the embedding's weight: counted once
    assert files["tied"]["footprint"]["parameters"] == 4 * (count - 128 * 64) == 4 * meta_parameters({**OLMO2, "tie_word_embeddings": True})[0]
    # full checkpointing keeps each layer's input (and one layer's recomputation)
    assert files["full"]["footprint"]["activations"] < fp["activations"]


def test_frozen_parameters_get_no_gradient_or_optimizer_state(tmp_path):
    # WhisperForCausalLM: transformers freezes the decoder's sinusoidal positions (requires_grad False)
    whisper = {"model_type": "whisper", "vocab_size": 128, "d_model": 64, "decoder_layers": 2, "encoder_layers": 2,
               "decoder_attention_heads": 4, "encoder_attention_heads": 4, "decoder_ffn_dim": 112, "encoder_ffn_dim": 112,
               "max_target_positions": 64, "max_source_positions": 64, "architectures": ["WhisperForCausalLM"],
               "decoder_start_token_id": 1, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    path = write(tmp_path, whisper)
    rc, out = run("check", "--format", "json", str(path))
    assert rc == 0, out
    count, trainable = meta_parameters(whisper)
    fp = out["files"][0]["footprint"]
    assert fp["parameters"] == 4 * count
    assert fp["gradients"] == 4 * trainable and fp["optimizer_state"] == 8 * trainable


def test_a_config_transformers_cannot_build_is_a_positioned_error(tmp_path):
    path = write(tmp_path, {"model_type": "no_such_model", "hidden_size": 64})
    rc, out = run("check", "--format", "json", str(path))
    assert rc == 1, out
    (problem,) = out["files"][0]["diagnostics"]
    assert problem["code"] == "unsupported-model" and "no_such_model" in problem["message"]
    assert problem["range"]["start"]["line"] == 1


def test_the_docs_quote_the_band_the_warning_quotes():
    from memfit.models.traced import band_text

    text = (ROOT / "docs" / "transformers.md").read_text()
    assert f"**{band_text()} of autograd's saved bytes**" in text
