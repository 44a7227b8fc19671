"""DeepSpeed's ZeRO estimators through configs a user writes (issue 19): the per-GPU model states
`memfit check --format json` prints for a model's parameters under `parallel.zero` (ZeRO-2: the footprint's total,
its peak adds the step's flattened gradient copy; ZeRO-3: the peak, with the gathered module), against
deepspeed 0.19.8's own estimate_zero2/3_model_states_mem_needs, to the byte, for stages 2 and 3,
every offload combination, t5-3b and two more models; written both with the explicit recipe (the
ZeRO paper's 16-bit weights, fp32 master and gradient partition) and as users write it for
Lightning's DeepSpeed strategy or the Trainer's bf16=True (`precision: bf16-mixed`), which that
engine runs as its 16-bit mode."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import needs
import pytest
import yaml

RECIPES = {
    "explicit": {"precision": "16-true", "master_weights": "float32", "training": {"grad_accum_dtype": "float32"}},
    "bf16-mixed": {"precision": "bf16-mixed"},
    "16-mixed": {"precision": "16-mixed"},
}
OFFLOADS = [(False, False), (True, False), (True, True)]


def _deepspeed():
    needs.module("deepspeed")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from deepspeed.runtime.zero import stage3, stage_1_and_2
    return stage_1_and_2, stage3


def _model(kind: str):
    """(named parameter shapes, total parameters, the largest module's own parameters) of a real
    transformers model on the meta device, as DeepSpeed's model_to_params counts them."""
    torch = needs.module("torch")
    needs.module("transformers")
    import transformers

    if kind == "t5-3b":
        config = transformers.T5Config(d_model=1024, d_ff=16384, num_layers=24, num_heads=32, d_kv=128, vocab_size=32128)
        cls = transformers.T5ForConditionalGeneration
    elif kind == "llama-7b":
        config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, vocab_size=32000)
        cls = transformers.LlamaForCausalLM
    else:  # gpt2-xl
        config = transformers.GPT2Config(n_embd=1600, n_layer=48, n_head=25)
        cls = transformers.GPT2LMHeadModel
    with torch.device("meta"):
        model = cls(config)
    shapes = [(n, list(p.shape)) for n, p in model.named_parameters()]
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return shapes, total, largest


_MODELS: dict = {}


def model(kind):
    if kind not in _MODELS:
        _MODELS[kind] = _docs_t5_3b() if kind == "docs-t5-3b" else _model(kind)
    return _MODELS[kind]


def _docs_t5_3b():
    """DeepSpeed's memory.rst case: 2,851M parameters, 32M in the largest layer (89 modules of 32M and one of 3M)."""
    shapes = [(f"block.{i}.w.weight", [32_000_000]) for i in range(89)] + [("final.weight", [3_000_000])]
    assert sum(s[0] for _, s in shapes) == 2_851_000_000
    return shapes, 2_851_000_000, 32_000_000


def memfit_gpu(tmp_path, shapes, recipe: str, stage: int, gpus: int, nodes: int, offload_optimizer: bool, offload_parameters: bool,
               training: dict | None = None) -> dict:
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "host": {"memory": "100 TiB"}, "optimizer": "adamw"}
    doc.update(json.loads(json.dumps(RECIPES[recipe])))
    if training:  # a step to walk (without one, the figures are the model states)
        doc["training"] = {**doc.get("training", {}), **training}
    doc["parameters"] = [{"name": name, "shape": shape} for name, shape in shapes]
    parallel = {"data": gpus * nodes, "zero": stage, "gpus_per_node": gpus}
    offload = {k: "cpu" for k, on in (("optimizer", offload_optimizer), ("parameters", offload_parameters)) if on}
    if offload:
        parallel["offload"] = offload
    doc["parallel"] = parallel
    path = tmp_path / f"zero{stage}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout)["files"][0]


# every model with every recipe on one node of 8; two nodes of 4 (a world over nodes, the host per node) once per model
CASES = [(kind, recipe, 8, 1) for kind in ("t5-3b", "llama-7b", "gpt2-xl") for recipe in sorted(RECIPES)] + [(kind, "bf16-mixed", 4, 2) for kind in ("t5-3b", "llama-7b", "gpt2-xl")]


@pytest.mark.parametrize("kind, recipe, gpus, nodes", CASES)
def test_deepspeed_estimators_through_a_config(kind, recipe, gpus, nodes, tmp_path):
    stage12, stage3 = _deepspeed()
    shapes, total, largest = model(kind)
    for offload_optimizer, offload_parameters in OFFLOADS:
        _, gpu3, _ = stage3.estimate_zero3_model_states_mem_needs(total, largest, gpus, nodes, cpu_offload=offload_optimizer, cpu_offload_params=offload_parameters)
        ours = memfit_gpu(tmp_path, shapes, recipe, 3, gpus, nodes, offload_optimizer, offload_parameters)["peak"]["bytes"]
        assert ours == gpu3, ("zero 3", offload_optimizer, offload_parameters, ours, gpu3)  # on 8 ranks nothing is padded
        if not offload_parameters:
            _, gpu2 = stage12.estimate_zero2_model_states_mem_needs(total, gpus, nodes, cpu_offload=offload_optimizer)
            entry = memfit_gpu(tmp_path, shapes, recipe, 2, gpus, nodes, offload_optimizer, False)
            ours = entry["footprint"]["total"]
            assert ours == gpu2, ("zero 2", offload_optimizer, ours, gpu2)
            # the step's flattened copy of the rank's 16-bit gradients (2 B a parameter / N) is a moment, not a state
            assert entry["peak"]["bytes"] >= ours


def test_bf16_mixed_under_zero_is_deepspeeds_16_bit_mode_and_the_explicit_recipe_keeps_its_meaning(tmp_path):
    """The same run written both ways gives the same figures under ZeRO; without ZeRO, bf16-mixed
    keeps Lightning's meaning (an fp32 model under autocast: 16 bytes per parameter with AdamW)."""
    shapes, _, _ = model("gpt2-xl")
    mixed = memfit_gpu(tmp_path, shapes, "bf16-mixed", 2, 8, 1, False, False, {"micro_batch": 1})
    explicit = memfit_gpu(tmp_path, shapes, "explicit", 2, 8, 1, False, False, {"micro_batch": 1})
    assert mixed["footprint"] == explicit["footprint"] and mixed["peak"]["bytes"] == explicit["peak"]["bytes"]
    doc = {"memfit": 1, "device": {"memory": "1 TiB"}, "optimizer": "adamw", "precision": "bf16-mixed", "parameters": [{"name": "w", "shape": [1000, 1000]}]}
    path = tmp_path / "single.yaml"
    path.write_text(yaml.safe_dump(doc))
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True, text=True, timeout=120, check=True)
    fp = json.loads(done.stdout)["files"][0]["footprint"]
    assert fp["parameters"] + fp["gradients"] + fp["optimizer_state"] == 16 * 1_000_000


def test_the_pages_table_is_deepspeeds_estimate_and_memfits_figure_to_the_byte(tmp_path):
    """docs/parallel.md's side-by-side (tools/doc_tables.py): each row's DeepSpeed cell is what deepspeed's estimator
    returns for that model and cluster, its memfit cell what `memfit check` prints for the config (the explicit
    recipe), and its difference exact: 0 where the page says 0, else the padding bytes it prints."""
    import doc_tables

    stage12, stage3 = _deepspeed()
    rows = doc_tables.documented("docs/parallel.md", "deepspeed")
    runs = doc_tables.DeepSpeedTable().runs(rows)
    assert len(rows) == 16 and sum(r[5] == "0" for r in rows) == 13
    for row, run in zip(rows, runs):
        shapes, total, largest = model(run["model"])
        gpus, nodes = run["gpus"], run["nodes"]
        if run["zero"] == 3:
            theirs = stage3.estimate_zero3_model_states_mem_needs(total, largest, gpus, nodes, cpu_offload=run["optimizer"],
                                                                 cpu_offload_params=run["parameters"])[1]
        else:
            theirs = stage12.estimate_zero2_model_states_mem_needs(total, gpus, nodes, cpu_offload=run["optimizer"])[1]
        entry = memfit_gpu(tmp_path, shapes, "explicit", run["zero"], gpus, nodes, run["optimizer"], run["parameters"])
        ours = entry["peak"]["bytes"] if run["zero"] == 3 else entry["footprint"]["total"]
        assert theirs == int(row[3].replace(",", "")), row
        assert ours == int(row[4].replace(",", "")), row
        assert ours - theirs == (0 if row[5] == "0" else int(row[5].split(" B")[0].replace(",", ""))), row
