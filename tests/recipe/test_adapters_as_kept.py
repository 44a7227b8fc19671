"""Adapters as each framework keeps them (issue 32), measured through `memfit check` on config files:

- the adapters' dtype: peft 0.21.2's get_peft_model on a bf16 tiny Llama with autocast_adapter_dtype true (fp32
  adapters) and false (bf16: the base layer's dtype); the trainable bytes (sum of numel x element_size of the
  requires_grad parameters) are memfit's `gradients`, and a real AdamW step's state is memfit's `optimizer_state`;
- DoRA (peft use_dora): the parameters exactly, the saved activations within 5% of saved_tensors_hooks on a real step;
- torchtune's adapters in the model's dtype, as its code builds them (arithmetic: see the test).
"""

from __future__ import annotations

import json
import subprocess
import sys

import needs
import pytest
import yaml

torch = needs.module("torch")
needs.module("transformers")
needs.module("peft")

import hf_measure  # noqa: E402

BAND = 0.05
MICRO_BATCH, SEQ_LEN = 2, 32
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}


def check(doc: dict, tmp_path) -> dict:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return json.loads(done.stdout)["files"][0]


def config(tmp_path, cfg: dict, precision: str, lora: dict, checkpointing: str = "none") -> dict:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return {"memfit": 1, "device": {"memory": "1 TiB", "type": "cpu"}, "optimizer": "adamw", "precision": precision,
            "model": {"hf_config": "config.json"},
            "training": {"micro_batch": MICRO_BATCH, "seq_len": SEQ_LEN, "attention": "sdpa", "checkpointing": checkpointing,
                         "optimizer_impl": "foreach"},
            "lora": lora}


def trainable_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def adamw_state_bytes(model) -> int:
    """A real AdamW step's moments (exp_avg, exp_avg_sq, in each parameter's dtype); the 0-dim step counters are left
    out, as memfit's optimizer_state leaves them out."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, foreach=True)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    return sum(t.numel() * t.element_size() for s in opt.state.values() for k, t in s.items() if k != "step")


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("autocast", [True, False])
@pytest.mark.parametrize("key", ["autocast_adapter_dtype", "dtype"])
def test_the_adapters_dtype_is_what_get_peft_model_keeps(autocast, key, tmp_path):
    cfg = hf_measure.without_attention_dropout(hf_measure.tiny("llama"))
    model = hf_measure.build(cfg, "sdpa", "bf16-true", dict(LORA, autocast_adapter_dtype=autocast))
    dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    assert dtypes == ({torch.float32} if autocast else {torch.bfloat16})
    spelling = {"autocast_adapter_dtype": autocast} if key == "autocast_adapter_dtype" else {"dtype": "peft" if autocast else "model"}
    ours = check(config(tmp_path, cfg, "bf16-true", {**LORA, **spelling}), tmp_path)["footprint"]
    assert ours["gradients"] == trainable_bytes(model)
    assert ours["optimizer_state"] == adamw_state_bytes(model)


@pytest.mark.filterwarnings("ignore")
def test_bf16_adapters_halve_the_gradients_and_state_and_keep_no_fp32_input_copies(tmp_path):
    cfg = hf_measure.without_attention_dropout(hf_measure.tiny("llama"))
    peft = check(config(tmp_path, cfg, "bf16-true", LORA), tmp_path)["footprint"]
    model = check(config(tmp_path, cfg, "bf16-true", dict(LORA, dtype="model")), tmp_path)["footprint"]
    assert 2 * model["gradients"] == peft["gradients"]
    # peft casts each adapter's input to the adapters' fp32 (a copy autograd keeps); bf16 adapters read it as it is
    saved = hf_measure.measure(cfg, micro_batch=MICRO_BATCH, seq_len=SEQ_LEN, precision="bf16-true",
                               lora=dict(LORA, autocast_adapter_dtype=False))["peak"]
    assert model["activations"] < peft["activations"]
    assert abs(model["activations"] - saved) <= BAND * saved, (model["activations"], saved)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("precision,checkpointing", [("32-true", "none"), ("32-true", "full"), ("bf16-true", "none"),
                                                     ("bf16-mixed", "none")])
def test_dora_parameters_and_saved_tensors_match_peft(precision, checkpointing, tmp_path):
    cfg = hf_measure.without_attention_dropout(hf_measure.tiny("llama"))
    lora = dict(LORA, use_dora=True)
    ours = check(config(tmp_path, cfg, precision, lora, checkpointing), tmp_path)["footprint"]
    model = hf_measure.build(cfg, "sdpa", precision, lora)
    magnitudes = [n for n, _ in model.named_parameters() if "lora_magnitude_vector" in n]
    assert magnitudes  # one per adapted linear
    assert ours["gradients"] == trainable_bytes(model)
    assert ours["optimizer_state"] == adamw_state_bytes(model)
    saved = hf_measure.measure(cfg, micro_batch=MICRO_BATCH, seq_len=SEQ_LEN, checkpointing=checkpointing,
                               precision=precision, lora=lora)["peak"]
    plain = check(config(tmp_path, cfg, precision, LORA, checkpointing), tmp_path)["footprint"]
    assert ours["activations"] > plain["activations"]
    assert abs(ours["activations"] - saved) <= BAND * saved, (ours["activations"], saved)


@pytest.mark.filterwarnings("ignore")
def test_dora_on_a_4bit_base_matches_peft(tmp_path):
    """QDoRA: DoraLinearLayer.forward dequantizes the Linear4bit weight for the norm (a transient) and keeps what it
    keeps on a 16-bit base."""
    needs.module("bitsandbytes")
    cfg = hf_measure.without_attention_dropout(hf_measure.tiny("llama"))
    quantization = {"method": "nf4", "double_quant": True, "compute_dtype": "bfloat16"}
    lora = dict(LORA, use_dora=True)
    doc = config(tmp_path, cfg, "bf16-true", lora)
    ours = check({**doc, "quantization": quantization}, tmp_path)["footprint"]
    model = hf_measure.build(cfg, "sdpa", "bf16-true", lora, quantization=quantization)
    assert ours["gradients"] == trainable_bytes(model)
    saved = hf_measure.measure(cfg, micro_batch=MICRO_BATCH, seq_len=SEQ_LEN, precision="bf16-true", lora=lora,
                               quantization=quantization)["peak"]
    assert abs(ours["activations"] - saved) <= BAND * saved, (ours["activations"], saved)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("precision", ["bf16-true", "32-true"])
def test_without_autocast_4bit_adapters_take_the_compute_dtype(precision, tmp_path):
    """peft's _get_base_layer_device_and_dtype reads a Linear4bit's compute_dtype: on an fp32 base with bf16 compute,
    autocast_adapter_dtype=False leaves bf16 adapters (and their bf16 input copies for backward)."""
    needs.module("bitsandbytes")
    cfg = hf_measure.without_attention_dropout(hf_measure.tiny("llama"))
    quantization = {"method": "nf4", "double_quant": True, "compute_dtype": "bfloat16"}
    lora = dict(LORA, autocast_adapter_dtype=False)
    ours = check({**config(tmp_path, cfg, precision, lora), "quantization": quantization}, tmp_path)["footprint"]
    model = hf_measure.build(cfg, "sdpa", precision, lora, quantization=quantization)
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.bfloat16}
    assert ours["gradients"] == trainable_bytes(model)
    saved = hf_measure.measure(cfg, micro_batch=MICRO_BATCH, seq_len=SEQ_LEN, precision=precision, lora=lora,
                               quantization=quantization)["peak"]
    assert abs(ours["activations"] - saved) <= BAND * saved, (ours["activations"], saved)


def test_dora_on_gpt2s_conv1d_is_refused_at_the_key(tmp_path):
    cfg = hf_measure.without_attention_dropout(hf_measure.tiny("gpt2"))
    ours = check(config(tmp_path, cfg, "32-true", dict(LORA, use_dora=True)), tmp_path)
    assert [d["code"] for d in ours["diagnostics"]] == ["bad-lora"]
    assert "use_dora" in ours["diagnostics"][0]["message"]


TORCHTUNE_LORA = """\
model:
  _component_: torchtune.models.llama3.lora_llama3_8b
  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']
  apply_lora_to_mlp: True
  apply_lora_to_output: False
  lora_rank: 8
  lora_alpha: 16
  lora_dropout: 0.0
{dora}
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: /tmp/Meta-Llama-3-8B-Instruct/original/tokenizer.model
  max_seq_len: 2048
batch_size: 2
optimizer:
  _component_: torch.optim.AdamW
  fused: True
  lr: 3e-4
dtype: bf16
enable_activation_checkpointing: True
"""


@pytest.mark.parametrize("dora", [False, True])
def test_torchtunes_llama3_8b_lora_keeps_its_adapters_in_bf16(dora, tmp_path):
    """torchtune 0.6.1 builds the model under training.set_default_dtype(self._dtype) (recipes/
    lora_finetune_single_device.py _setup_model), and modules/peft/lora.py LoRALinear creates lora_a = nn.Linear(in_dim,
    rank) and lora_b = nn.Linear(rank, out_dim) in that default dtype (DoRALinear adds magnitude, (out_dim,)); nothing
    upcasts them. Its Llama-3-8B (models/llama3/_model_builders.py: dim 4096, 8 KV heads of 128, hidden 14336, 32
    layers) with q, v, output_proj and the MLP adapted at rank 8 trains these bf16 elements (torchtune 0.6.1 cannot be
    installed beside this venv's torchao 0.17; its build is written here as arithmetic):"""
    dim, kv, hidden, layers, rank = 4096, 8 * 128, 14336, 32, 8
    linears = [(dim, dim), (dim, kv), (dim, dim), (dim, hidden), (dim, hidden), (hidden, dim)]  # q, v, o, w1, w3, w2
    elements = layers * sum(rank * (i + o) + (o if dora else 0) for i, o in linears)
    path = tmp_path / "8B_lora_single_device.yaml"
    path.write_text(TORCHTUNE_LORA.format(dora="  use_dora: True" if dora else ""))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", "--input-format", "torchtune", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    footprint = json.loads(done.stdout)["files"][0]["footprint"]
    assert footprint["gradients"] == 2 * elements  # bf16: 39,321,600 bytes without DoRA (peft's fp32: twice that)
    assert footprint["optimizer_state"] == 2 * 2 * elements  # AdamW's two moments in the parameters' bf16
    if not dora:  # docs/accuracy.md's figures: 19,660,800 elements, gradients 39,321,600 B, AdamW's moments 78,643,200 B
        assert (elements, footprint["gradients"], footprint["optimizer_state"]) == (19_660_800, 39_321_600, 78_643_200)
    else:  # the page: the magnitudes add 32 x (4096 x 3 + 14336 x 2 + 1024) elements
        assert elements == 19_660_800 + 32 * (4096 * 3 + 14336 * 2 + 1024)


@pytest.mark.filterwarnings("ignore")
def test_docs_accuracy_tables_reference_figures_are_what_peft_keeps():
    """docs/accuracy.md's adapters table (tools/doc_tables.py regenerates it; tests/project/test_docs.py holds its
    memfit cells): each reference figure, to the byte, from peft's model, a real AdamW step and autograd's saved peak."""
    needs.module("bitsandbytes")
    import doc_tables  # tools/doc_tables.py: the docs' measurement tables

    table = doc_tables.AdapterTable()
    rows = doc_tables.documented("docs/accuracy.md", "adapters")
    assert len(rows) == 21
    for row, run in zip(rows, table.runs(rows)):
        cfg = hf_measure.without_attention_dropout(hf_measure.tiny("llama"))
        quantization = dict(table.NF4) if run.get("nf4") else None
        figure = table.FIGURES[row[1]]
        if figure == "activations":
            theirs = hf_measure.measure(cfg, micro_batch=MICRO_BATCH, seq_len=SEQ_LEN, checkpointing=run.get("checkpointing", "none"),
                                        precision=run["precision"], lora=table.lora(run), quantization=quantization)["peak"]
        else:
            model = hf_measure.build(cfg, "sdpa", run["precision"], table.lora(run), quantization=quantization)
            theirs = trainable_bytes(model) if figure == "gradients" else adamw_state_bytes(model)
        assert theirs == int(row[3].replace(",", "")), f"docs/accuracy.md: {row[0]} / {row[1]}: measured {theirs:,} B, the page {row[3]} B"
