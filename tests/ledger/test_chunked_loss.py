"""torchtune's chunked cross-entropy (`loss: CEWithChunkedOutputLoss`, `num_output_chunks`) and its optimizer in
backward (`optimizer_in_bwd: true`), measured on torchtune 0.6.1's own step (MemTracker and saved_tensors_hooks
around tests/support/torchtune_step.py, in torchtune's own interpreter: MEMFIT_TORCHTUNE_PYTHON, as
tests/read/test_torchtune_built.py) against `memfit check` on the torchtune config that runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import needs
import pytest
import yaml

SUPPORT = Path(__file__).resolve().parents[1] / "support"
BAND = 0.05
# the logits dominate (vocab 4096 over a 64-wide model): the loss's chunking is what the peak measures
WIDE_VOCAB = {"vocab_size": 4096, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64, "intermediate_dim": 112, "max_seq_len": 256}
# a short sequence over more layers: the gradients and the optimizer step are what the peak measures
DEEP = {"vocab_size": 256, "num_layers": 6, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 128, "intermediate_dim": 256, "max_seq_len": 256}
LORA = {"lora_attn_modules": ["q_proj", "v_proj"], "apply_lora_to_mlp": False, "apply_lora_to_output": False, "lora_rank": 8, "lora_alpha": 16}


def torchtune_python() -> str:
    python = os.environ.get("MEMFIT_TORCHTUNE_PYTHON")
    if not python:
        needs.unavailable("MEMFIT_TORCHTUNE_PYTHON is not set (an interpreter with torchtune 0.6.1 and torchao 0.10.0)")
    return python


def _spec(dtype: str, lora: bool, chunks: int, in_bwd: bool, builder: dict, batch: int, seq: int, linear: bool = False,
          family: str = "llama3") -> dict:
    return {"dtype": dtype, "lora": lora, "chunks": chunks, "in_bwd": in_bwd, "batch_size": batch, "seq_len": seq,
            "builder": {**(LORA if lora else {}), **builder}, **({"linear": True} if linear else {}),
            **({"family": family} if family != "llama3" else {})}


# every torchtune step this file measures, run in one torchtune process (its import is most of a step's time)
CHUNKED = [("bf16", False, 8), ("fp32", False, 8), ("bf16", True, 8), ("bf16", False, 0)]
IN_BACKWARD = [("fp32", False), ("bf16", False), ("fp32", True)]
# torchtune main's LinearCrossEntropyLoss (tests/support/torchtune_linear_loss.py), 8 chunks
LINEAR = [("bf16", False), ("fp32", False), ("bf16", True), ("fp32", True)]
# and on other heads (dtype, lora, family, builder, batch, sequence, chunks): Llama 3.2's tied output projection (a
# TiedLinear of the embedding, the 1B and 3B configs'), LoRA on the output projection (apply_lora_to_output), one
# longer sequence in 4 chunks
TIED = {**WIDE_VOCAB, "tie_word_embeddings": True}
LINEAR_HEADS = [("bf16", False, "llama3_2", TIED, 2, 64, 8), ("bf16", True, "llama3", {**WIDE_VOCAB, "apply_lora_to_output": True}, 2, 64, 8),
                ("fp32", True, "llama3", {**WIDE_VOCAB, "apply_lora_to_output": True}, 2, 64, 8), ("bf16", False, "llama3", WIDE_VOCAB, 1, 256, 4)]
SPECS = ([_spec(d, lo, c, False, WIDE_VOCAB, 2, 64) for d, lo, c in CHUNKED]
         + [_spec(d, lo, 8, False, WIDE_VOCAB, 2, 64, linear=True) for d, lo in LINEAR]
         + [_spec(d, lo, 8, False, WIDE_VOCAB, 2, 64) for d, lo in LINEAR if (d, lo, 8) not in CHUNKED]
         + [_spec(d, lo, c, False, builder, b, s, True, family) for d, lo, family, builder, b, s, c in LINEAR_HEADS]
         + [_spec(d, lo, 0, True, DEEP, 1, 16) for d, lo in IN_BACKWARD]
         + [_spec(d, lo, 0, False, DEEP, 1, 16) for d, lo in IN_BACKWARD if not lo])
_MEASURED: dict = {}


def theirs(dtype: str, lora: bool, chunks: int, in_bwd: bool, builder: dict, batch: int, seq: int, linear: bool = False,
           family: str = "llama3") -> dict:
    spec = _spec(dtype, lora, chunks, in_bwd, builder, batch, seq, linear, family)
    if not _MEASURED:
        done = subprocess.run([torchtune_python(), str(SUPPORT / "torchtune_step.py"), json.dumps(SPECS)], capture_output=True,
                              text=True, timeout=900, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        results = [json.loads(line) for line in done.stdout.strip().splitlines()[-len(SPECS):]]
        _MEASURED.update({json.dumps(s, sort_keys=True): r for s, r in zip(SPECS, results)})
    return _MEASURED[json.dumps(spec, sort_keys=True)]


def ours(tmp_path, dtype: str, lora: bool, chunks: int, in_bwd: bool, builder: dict, batch: int, seq: int,
         linear: bool = False, family: str = "llama3") -> dict:
    model = {"_component_": f"torchtune.models.{family}.{'lora_' if lora else ''}{family}", **(LORA if lora else {}), **builder}
    config = {"model": model,
              "tokenizer": {"_component_": "torchtune.models.llama3.llama3_tokenizer", "path": "/tmp/tokenizer.model", "max_seq_len": seq},
              "batch_size": batch, "optimizer": {"_component_": "torch.optim.AdamW", "fused": True}, "dtype": dtype,
              "optimizer_in_bwd": in_bwd}
    if chunks:
        loss = "LinearCrossEntropyLoss" if linear else "CEWithChunkedOutputLoss"
        config["loss"] = {"_component_": f"torchtune.modules.loss.{loss}", "num_output_chunks": chunks}
    else:
        config["loss"] = {"_component_": "torch.nn.CrossEntropyLoss"}
    path = tmp_path / ("lora_single_device.yaml" if lora else "full_single_device.yaml")
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", "--budget", "1GiB", str(path)],
                         capture_output=True, text=True, timeout=120, check=False)
    return json.loads(out.stdout)["files"][0]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("dtype, lora, chunks", CHUNKED)
def test_chunked_loss_matches_torchtunes_step(tmp_path, dtype, lora, chunks):
    measured = theirs(dtype, lora, chunks, False, WIDE_VOCAB, 2, 64)
    file = ours(tmp_path, dtype, lora, chunks, False, WIDE_VOCAB, 2, 64)
    peak = file["peak"]
    assert abs(peak["bytes"] - measured["bytes"]) <= BAND * measured["bytes"], (peak["bytes"], measured["bytes"])
    saved = file["footprint"]["activations"]
    assert abs(saved - measured["saved"]) <= BAND * measured["saved"], (saved, measured["saved"])
    assert not [d for d in file.get("diagnostics", []) if d["code"] == "not-modelled" and "loss" in d["message"]]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("dtype, lora", LINEAR)
def test_linear_cross_entropy_matches_its_code_on_torchtunes_step(tmp_path, dtype, lora):
    """`loss: LinearCrossEntropyLoss` (torchtune main): the output projection inside the loss, 8 chunks of the
    batch's tokens; measured with the class's code on torchtune 0.6.1's step (the model's output layer skipped as
    main's TransformerDecoder skips it), where the labels keep all but each sequence's last token (the recipe's
    shift): memfit counts every token, its figure the upper bound of these."""
    measured = theirs(dtype, lora, 8, False, WIDE_VOCAB, 2, 64, linear=True)
    file = ours(tmp_path, dtype, lora, 8, False, WIDE_VOCAB, 2, 64, linear=True)
    peak = file["peak"]
    assert abs(peak["bytes"] - measured["bytes"]) <= BAND * measured["bytes"], (peak["bytes"], measured["bytes"])
    assert peak["phase"] == measured["phase"] == "backward"
    saved = file["footprint"]["activations"]
    assert abs(saved - measured["saved"]) <= BAND * measured["saved"], (saved, measured["saved"])
    assert not [d for d in file.get("diagnostics", []) if "loss" in d["message"] and d["severity"] != "information"], file["diagnostics"]
    # the note at the key: every token counted as labelled
    assert [d for d in file["diagnostics"] if d["severity"] == "information" and "upper bound" in d["message"] and "labels" in d["message"]]
    # the whole logits never exist: below the same model's step with CEWithChunkedOutputLoss, measured and memfit's
    chunked = theirs(dtype, lora, 8, False, WIDE_VOCAB, 2, 64)
    assert measured["bytes"] < chunked["bytes"] and peak["bytes"] < ours(tmp_path, dtype, lora, 8, False, WIDE_VOCAB, 2, 64)["peak"]["bytes"]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("dtype, lora, family, builder, batch, seq, chunks", LINEAR_HEADS, ids=["tied", "lora-output-bf16", "lora-output-fp32", "1x256"])
def test_linear_cross_entropy_on_other_heads(tmp_path, dtype, lora, family, builder, batch, seq, chunks):
    """The same against its code where the head is the embedding's weight (its gradient summed with the
    embedding's), adapted (LoRA on the output projection, in every chunk) or where the chunks' log-softmax is most
    of the step (one sequence of 256 tokens, 4 chunks)."""
    measured = theirs(dtype, lora, chunks, False, builder, batch, seq, True, family)
    file = ours(tmp_path, dtype, lora, chunks, False, builder, batch, seq, True, family)
    peak = file["peak"]
    assert abs(peak["bytes"] - measured["bytes"]) <= BAND * measured["bytes"], (peak["bytes"], measured["bytes"])
    # in the same phase: an fp32 adapted head's forward (the base output, the adapter's and their sum, three chunks)
    assert peak["phase"] == measured["phase"], (peak["phase"], measured["phase"])
    saved = file["footprint"]["activations"]
    assert abs(saved - measured["saved"]) <= BAND * measured["saved"], (saved, measured["saved"])


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("dtype, lora", IN_BACKWARD)
def test_optimizer_in_backward_matches_torchtunes_step(tmp_path, dtype, lora):
    measured = theirs(dtype, lora, 0, True, DEEP, 1, 16)
    file = ours(tmp_path, dtype, lora, 0, True, DEEP, 1, 16)
    peak = file["peak"]
    assert abs(peak["bytes"] - measured["bytes"]) <= BAND * measured["bytes"], (peak["bytes"], measured["bytes"])
    assert peak["live"]["gradients"] < file["footprint"]["gradients"] or lora
    if not lora:  # the gradients are a large share of a full fine-tune's step: the measured saving is real, and memfit's
        plain = theirs(dtype, lora, 0, False, DEEP, 1, 16)
        assert plain["bytes"] > measured["bytes"] * (1 + BAND)
        assert ours(tmp_path, dtype, lora, 0, False, DEEP, 1, 16)["peak"]["bytes"] > peak["bytes"]


def test_optimizer_in_backward_with_gradient_accumulation_is_refused(tmp_path):
    path = tmp_path / "full_single_device.yaml"
    path.write_text("model:\n  _component_: torchtune.models.llama3.llama3\n" + "".join(f"  {k}: {v}\n" for k, v in DEEP.items())
                    + "tokenizer:\n  max_seq_len: 16\noptimizer_in_bwd: true\ngradient_accumulation_steps: 4\n")
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", "--budget", "1GiB", str(path)],
                         capture_output=True, text=True, timeout=120, check=False)
    diagnostics = json.loads(out.stdout)["files"][0]["diagnostics"]
    refused = [d for d in diagnostics if d["code"] == "optimizer-impl" and d["severity"] == "error"]
    assert refused and "gradient_accumulation" in refused[0]["message"], diagnostics
    assert refused[0]["range"]["start"]["line"] == 11, refused[0]


# --- LitGPT's chunked head and loss (litgpt 0.5.13): its own code reproduced, on a transformers Llama ----------------
# LitGPT cannot be installed beside this environment's packages (litgpt 0.5.13 pins huggingface_hub<1.4), so its two
# functions are reproduced line for line: litgpt/model.py GPT.forward (lines 177-179) and litgpt/utils.py
# chunked_cross_entropy (lines 313-331, the list branch), as litgpt/finetune/lora.py (lines 355-358) calls them.
def litgpt_loss(chunk_size: int):
    import torch

    def chunked_cross_entropy(logits, targets, ignore_index=-100):
        logit_chunks = [logit_chunk.reshape(-1, logit_chunk.size(-1)) for logit_chunk in logits]
        target_chunks = [target_chunk.reshape(-1) for target_chunk in targets.split(logits[0].size(1), dim=1)]
        loss_chunks = [torch.nn.functional.cross_entropy(logit_chunk, target_chunk, ignore_index=ignore_index, reduction="none")
                       for logit_chunk, target_chunk in zip(logit_chunks, target_chunks)]
        non_masked_elems = (targets != ignore_index).sum()
        return torch.cat(loss_chunks).sum() / non_masked_elems.maximum(torch.ones_like(non_masked_elems))

    def loss(model, input_ids, targets):
        logits = model(input_ids)
        logits[-1] = logits[-1][..., :-1, :]
        return chunked_cross_entropy(logits, targets[..., 1:])

    return loss


def litgpt_forward(model, chunk_size: int):
    """The transformers model whose forward ends as GPT.forward does with lm_head_chunk_size (a module: the head runs
    inside the model's forward, as in LitGPT)."""
    import torch

    class Chunked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, input_ids):
            x = self.inner.model(input_ids=input_ids).last_hidden_state
            return [self.inner.lm_head(x_i) for x_i in x.split(chunk_size, dim=1)]

    return Chunked()


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("precision", ["32-true", "bf16-true"])
def test_litgpts_chunked_head_matches_its_code(tmp_path, precision):
    needs.module("torch")
    needs.module("transformers")
    import hf_measure
    import peak_reference as ref
    from test_peak_transformers import hf_run_peak, hf_tiny

    cfg = {**hf_tiny("llama"), "vocab_size": 4096}
    model = litgpt_forward(hf_measure.build(cfg, precision=precision), 16)
    batch = hf_measure.inputs(cfg, 2, 64)
    opt = ref.OPTIMIZERS["adamw"](model.parameters(), **ref.IMPLS["foreach"])
    measured = ref.measure(model, (batch["input_ids"], batch["labels"]), litgpt_loss(16), opt)
    run = dict(micro_batch=2, seq_len=64, checkpointing="none", optimizer_impl="foreach", attention="sdpa")
    peak = hf_run_peak(cfg, tmp_path, optimizer="adamw", precision=precision, loss={"kind": "chunked_head", "chunk_size": 16}, **run)["peak"]
    whole = hf_run_peak(cfg, tmp_path, optimizer="adamw", precision=precision, **run)["peak"]
    assert abs(peak["bytes"] - measured["bytes"]) <= BAND * measured["bytes"], (peak["bytes"], measured["bytes"])
    assert peak["bytes"] < whole["bytes"]


def _litgpt_saved(cfg: dict, precision: str, chunk_size: int, b: int, s: int) -> int:
    """Distinct saved bytes (saved_tensors_hooks; parameters and buffers left out) of LitGPT's chunked head and loss
    (its code above) on a transformers Llama, under CPU autocast for *-mixed."""
    import contextlib

    import hf_measure
    import torch

    model = litgpt_forward(hf_measure.build(cfg, precision="bf16-true" if precision == "bf16-true" else "32-true"), chunk_size)
    batch = hf_measure.inputs(cfg, b, s)
    excluded = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in excluded:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16-mixed" else contextlib.nullcontext()
    with hf_measure.cuda_dropout(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        litgpt_loss(chunk_size)(model, batch["input_ids"], batch["labels"])
    return sum(seen.values())


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("precision", ["32-true", "bf16-true", "bf16-mixed"])
def test_the_footprint_counts_what_the_chunked_head_keeps(tmp_path, precision):
    """The footprint's saved activations (`memfit check --format json`, a separate reduction from the peak) of
    LitGPT's chunked head: each chunk's log-softmax in the logits' dtype (bf16-true: 2 bytes a logit where the whole
    loss keeps an fp32 one), in fp32 under *-mixed (autocast's cross_entropy) and fp32; against the saved bytes of its
    code and of transformers' whole loss (saved_tensors_hooks, one forward on the CPU)."""
    needs.module("torch")
    needs.module("transformers")
    import hf_measure
    from test_peak_transformers import hf_tiny

    cfg = {**hf_tiny("llama"), "vocab_size": 4096}
    b, s = 2, 64
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    paths = []
    for name, loss in (("whole", None), ("head", {"kind": "chunked_head", "chunk_size": 16})):
        doc = {"memfit": 1, "device": {"memory": "1 TiB", "type": "cpu"}, "precision": precision, "optimizer": "adamw",
               "model": {"hf_config": "config.json"}, "training": {"micro_batch": b, "seq_len": s, **({"loss": loss} if loss else {})}}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        paths.append(str(tmp_path / f"{name}.yaml"))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", *paths], capture_output=True,
                          text=True, timeout=300, check=False)
    files = {Path(f["path"]).stem: f for f in json.loads(done.stdout)["files"]}
    figures = {name: files[name]["footprint"]["activations"] for name in files}
    real = {"whole": hf_measure.measure(cfg, micro_batch=b, seq_len=s, precision=precision)["total"],
            "head": _litgpt_saved(cfg, precision, 16, b, s)}
    for name in figures:
        assert abs(figures[name] - real[name]) <= BAND * real[name], (name, figures[name], real[name])
        # the peak's live saved activations never exceed the footprint's
        assert files[name]["peak"]["live"]["activations"] <= figures[name]
    # exactly the logits' log-softmax in 2 bytes instead of 4 (b x s x vocab) at bf16-true; nothing otherwise
    assert figures["whole"] - figures["head"] == (b * s * cfg["vocab_size"] * 2 if precision == "bf16-true" else 0)
