"""Every key in each native reader's table is modelled or warned about (issue 33): the tables (read/native/*.py
KEYS, UNMODELLED, CONDITIONAL, and the Trainer's NO_MEMORY) cover the framework's keys that change memory, each
unmodelled key set to a value that matters is a positioned `not-modelled` warning saying which way the figure is
off, through the CLI; the keys the issue named are modelled (Axolotl's overrides_of_model_config) or warned about
(eval batches, DDP's gradient buckets, measured on gloo, MiCS, a KD teacher, LLaMA-Factory's upcast logits)."""

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from needs import module

from memfit.read.native import axolotl, deepspeed, hftrainer, llamafactory, torchtune

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"
READERS = {"axolotl": axolotl, "llama-factory": llamafactory, "hf-trainer": hftrainer, "torchtune": torchtune}

# the keys issue 33 found ignored, by reader: each must be in a table (modelled, or warned about)
ISSUE_KEYS = {
    "axolotl": ("overrides_of_model_config", "eval_batch_size"),
    "llama-factory": ("upcast_lmhead_output", "per_device_eval_batch_size"),
    "hf-trainer": ("per_device_eval_batch_size", "ddp_bucket_cap_mb"),
    "torchtune": ("teacher_model",),
}


def memfit(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], check=False, capture_output=True, text=True, cwd=cwd, timeout=120)


def tabled(module) -> set:
    keys = set(getattr(module, "UNMODELLED", {})) | set(getattr(module, "CONDITIONAL", {}))
    for key in getattr(module, "KEYS", {}):
        keys |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", key))  # torchtune's table names several keys in one entry
    return keys


@pytest.mark.parametrize("reader", sorted(ISSUE_KEYS))
def test_the_issues_keys_are_in_their_readers_table(reader):
    missing = [key for key in ISSUE_KEYS[reader] if key not in tabled(READERS[reader]) | set(getattr(READERS[reader], "NO_MEMORY", ()))]
    assert not missing, f"{reader}: {missing} neither modelled nor warned about"
    assert "mics_shard_size" in deepspeed.ZERO_MODELLED


def test_every_trainer_argument_is_tabled():
    """Each field of the installed transformers' TrainingArguments is modelled (KEYS), warned about (UNMODELLED,
    CONDITIONAL) or listed as not changing the training step's GPU memory (NO_MEMORY): a new field fails here."""
    TrainingArguments = module("transformers").TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    known = set(hftrainer.KEYS) | set(hftrainer.UNMODELLED) | set(hftrainer.CONDITIONAL) | set(hftrainer.NO_MEMORY)
    assert not sorted(fields - known), "TrainingArguments fields in no table"
    assert not set(hftrainer.NO_MEMORY) & (set(hftrainer.KEYS) | set(hftrainer.UNMODELLED) | set(hftrainer.CONDITIONAL))
    # each unmodelled key's no-effect values hold TrainingArguments' default
    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments) if f.default is not dataclasses.MISSING}
    for key, (inert, _) in hftrainer.UNMODELLED.items():
        if key in defaults and defaults[key] is not None:
            assert defaults[key] in inert, key


def mattering(inert: tuple):
    """A value that is not one of the key's no-effect values."""
    if False in inert:
        return True
    if 1 in inert or -1 in inert:
        return 2
    return "x"


BASES = {
    "axolotl": ("run.yml", "base_model: ./llama-3-8b.json\nmicro_batch_size: 1\nsequence_len: 512\n"),
    "llama-factory": ("lf.yaml", "model_name_or_path: ./llama-3-8b.json\nstage: sft\nfinetuning_type: lora\ncutoff_len: 512\nper_device_train_batch_size: 1\n"),
    "hf-trainer": ("args.yaml", "model_name_or_path: ./llama-3-8b.json\nper_device_train_batch_size: 1\noutput_dir: out\nblock_size: 512\n"),
    "torchtune": ("tt.yaml", "model:\n  _component_: torchtune.models.llama3.lora_llama3_8b\n  lora_attn_modules: ['q_proj', 'v_proj']\ntokenizer:\n  max_seq_len: 512\nbatch_size: 1\ndtype: bf16\n"),
}


@pytest.mark.parametrize("reader", sorted(BASES))
def test_every_unmodelled_key_is_a_positioned_warning(tmp_path, reader):
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    name, text = BASES[reader]
    table = READERS[reader].UNMODELLED
    text += "".join(f"{key}: {json.dumps(mattering(inert))}\n" for key, (inert, _) in table.items())
    (tmp_path / name).write_text(text)
    out = memfit("check", "--device", "H200", "--input-format", reader, name, cwd=tmp_path)
    lines = text.splitlines()
    for key in table:
        line = next(i for i, row in enumerate(lines) if row.startswith(f"{key}:")) + 1
        assert f"{name}:{line}:1: warning[not-modelled] {key}: " in out.stdout, (key, out.stdout)


DIRECTION = re.compile(r"the figures? (is|are|may be) (low|high)|figures? (is|are) (low|high)|the figures? (is|are) the host's|high, on the safe side|(is|are) low by")


@pytest.mark.parametrize("reader", sorted(READERS) + ["deepspeed"])
def test_every_unmodelled_key_says_which_way_the_figure_is_off(reader):
    """Issue 33: a key memfit does not model is a warning that says whether the figures are low, high (on the safe
    side) or may be either: a new entry without a direction fails here."""
    module = READERS.get(reader, deepspeed)
    tables = [getattr(module, name) for name in ("UNMODELLED", "ZERO_UNMODELLED") if hasattr(module, name)]
    silent = [key for table in tables for key, (_, why) in table.items() if not DIRECTION.search(why)]
    assert tables and not silent, f"{reader}: {silent} do not say which way the figures are off"


def test_every_unmodelled_deepspeed_key_is_a_positioned_warning_in_the_json(tmp_path):
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    zero = {"stage": 3, **{key: mattering(inert) for key, (inert, _) in deepspeed.ZERO_UNMODELLED.items()}}
    ds = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": zero}
    text = json.dumps(ds, indent=2)
    (tmp_path / "ds.json").write_text(text)
    out = memfit("check", "--model", "llama-3-8b.json", "--device", "H200", "--gpus", "8", "ds.json", cwd=tmp_path)
    lines = text.splitlines()
    for key in deepspeed.ZERO_UNMODELLED:
        line = next(i for i, row in enumerate(lines) if row.strip().startswith(f'"{key}"'))
        column = lines[line].index('"') + 1
        assert f"ds.json:{line + 1}:{column}: warning[not-modelled] zero_optimization.{key}: " in out.stdout, (key, out.stdout)
    assert "the figures are low" in out.stdout


def test_axolotl_overrides_of_model_config_are_the_model_built(tmp_path):
    """Axolotl sets each override on the loaded config (setattr) before building the model: a 128-layer override
    gives the figures of a config.json with 128 layers, not the 32 of the file."""
    raw = json.loads((MODELS / "llama-3-8b.json").read_text())
    (tmp_path / "llama-3-8b.json").write_text(json.dumps(raw))
    (tmp_path / "deep.json").write_text(json.dumps({**raw, "num_hidden_layers": 128}))
    common = "micro_batch_size: 1\nsequence_len: 1024\nadapter: lora\nlora_r: 8\nlora_target_linear: true\nbf16: true\n"
    (tmp_path / "over.yml").write_text("base_model: ./llama-3-8b.json\noverrides_of_model_config:\n  num_hidden_layers: 128\n" + common)
    (tmp_path / "deep.yml").write_text("base_model: ./deep.json\n" + common)
    (tmp_path / "plain.yml").write_text("base_model: ./llama-3-8b.json\n" + common)
    out = memfit("check", "--format", "json", "--device", "H100", "over.yml", "deep.yml", "plain.yml", cwd=tmp_path)
    over, deep, plain = json.loads(out.stdout)["files"]
    assert over["footprint"] == deep["footprint"] and over["peak"] == deep["peak"]
    assert over["peak"]["bytes"] > over["budget"] > plain["peak"]["bytes"]  # the 32-layer reading "fits"


def test_eval_batches_larger_than_the_training_batch_are_the_evaluation_pass(tmp_path):
    """On one GPU an evaluation batch larger than the training batch is training.eval_batch (the evaluation pass,
    measured in tests/ledger/test_passes.py), at the native key; under a layout it stays a warning; Axolotl evaluates
    only with a validation split."""
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    (tmp_path / "ax.yml").write_text("base_model: ./llama-3-8b.json\nmicro_batch_size: 2\nsequence_len: 512\nval_set_size: 0.05\neval_batch_size: 32\n")
    (tmp_path / "args.json").write_text(json.dumps({"model_name_or_path": "./llama-3-8b.json", "output_dir": "o", "per_device_train_batch_size": 2, "do_eval": True, "per_device_eval_batch_size": 64}))
    (tmp_path / "same.yml").write_text("base_model: ./llama-3-8b.json\nmicro_batch_size: 2\nsequence_len: 512\neval_batch_size: 2\n")
    (tmp_path / "nosplit.yml").write_text("base_model: ./llama-3-8b.json\nmicro_batch_size: 2\nsequence_len: 512\neval_batch_size: 32\n")
    for name, batch in (("ax.yml", 32), ("args.json", 64)):
        converted = memfit("convert", name, cwd=tmp_path).stdout
        assert f"eval_batch: {batch}" in converted, converted
    for name in ("same.yml", "nosplit.yml"):
        assert "eval_batch" not in memfit("convert", name, cwd=tmp_path).stdout
    out = memfit("check", "--format", "json", "--device", "H200", "ax.yml", "args.json", cwd=tmp_path)
    for file in json.loads(out.stdout)["files"]:
        assert file["peak"]["phase"] == "evaluation" and not [d for d in file["diagnostics"] if d["code"] == "not-modelled" and "eval" in d["message"]], file
    out = memfit("check", "--device", "H200", "--gpus", "8", "ax.yml", "args.json", cwd=tmp_path)
    assert "ax.yml:5:1: warning[not-modelled] eval_batch_size 32 is larger than the training micro-batch 2" in out.stdout, out.stdout
    assert "warning[not-modelled] per_device_eval_batch_size 64 is larger than the training micro-batch 2" in out.stdout


def test_ddp_keeps_a_second_copy_of_the_gradients_and_memfit_says_so(tmp_path):
    """Measured on gloo: without gradient_as_bucket_view, DDP's reducer holds its buckets in storage of their own,
    as many bytes as the gradients; with it, the gradients are views of the buckets. memfit counts them (the peaks
    against MemTracker: tests/placement/test_ddp_buckets.py) and says so where a native run is data parallel without
    ZeRO or FSDP."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        for view in (False, True):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
            ddp = DistributedDataParallel(model, gradient_as_bucket_view=view)
            buckets = []

            def hook(state, bucket, buckets=buckets):
                buffer = bucket.buffer()
                buckets.append((buffer.untyped_storage().data_ptr(), buffer.numel() * buffer.element_size()))
                done = torch.futures.Future()
                done.set_result(buffer)
                return done

            ddp.register_comm_hook(None, hook)
            ddp(torch.randn(4, 64)).sum().backward()
            grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
            assert sum(size for _, size in buckets) == grads
            shared = {p.grad.untyped_storage().data_ptr() for p in model.parameters()} <= {ptr for ptr, _ in buckets}
            assert shared is view  # a second copy exactly when the gradients are not views of the buckets
    finally:
        dist.destroy_process_group()
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    (tmp_path / "ax.yml").write_text("base_model: ./llama-3-8b.json\nmicro_batch_size: 1\nsequence_len: 512\n")
    out = memfit("check", "--device", "H200", "--gpus", "8", "ax.yml", cwd=tmp_path)
    assert "runs PyTorch DDP" not in out.stdout and out.returncode == 0, out.stdout  # counted: no warning that it is not
    one = json.loads(memfit("check", "--format", "json", "--device", "H200", "--gpus", "1", "ax.yml", cwd=tmp_path).stdout)["files"][0]
    eight = json.loads(memfit("check", "--format", "json", "--device", "H200", "--gpus", "8", "ax.yml", cwd=tmp_path).stdout)["files"][0]
    assert eight["peak"]["bytes"] - one["peak"]["bytes"] >= 0.99 * one["footprint"]["gradients"]  # the buckets: a second copy
    zero = tmp_path / "ds.json"
    zero.write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}))
    (tmp_path / "ax.yml").write_text("base_model: ./llama-3-8b.json\nmicro_batch_size: 1\nsequence_len: 512\ndeepspeed: ds.json\n")
    assert "runs PyTorch DDP" not in memfit("check", "--device", "H200", "--gpus", "8", "ax.yml", cwd=tmp_path).stdout


def test_every_deepspeed_zero_key_is_tabled():
    """Each field of the installed DeepSpeed's DeepSpeedZeroConfig, as a JSON writes it (its alias), is read
    (ZERO_MODELLED), warned about (ZERO_UNMODELLED) or listed as not changing the step's GPU memory (ZERO_NO_MEMORY)."""
    config = module("deepspeed.runtime.zero.config")
    fields = {f.alias or name for name, f in config.DeepSpeedZeroConfig.model_fields.items()}
    known = set(deepspeed.ZERO_MODELLED) | set(deepspeed.ZERO_UNMODELLED) | set(deepspeed.ZERO_NO_MEMORY)
    assert not sorted(fields - known), "DeepSpeedZeroConfig fields in no table"
    assert not set(deepspeed.ZERO_NO_MEMORY) & (set(deepspeed.ZERO_MODELLED) | set(deepspeed.ZERO_UNMODELLED))


def test_the_trainers_activation_checkpointing_is_its_gradient_checkpointing(tmp_path):
    """transformers 5's TrainingArguments.activation_checkpointing (gradient_checkpointing is its deprecated alias,
    which __post_init__ reads only where the new name is unset): the same run as gradient_checkpointing, and it wins
    over the alias."""
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    common = {"model_name_or_path": "./llama-3-8b.json", "output_dir": "out", "per_device_train_batch_size": 2, "max_seq_length": 1024, "bf16": True}
    runs = {"new": {"activation_checkpointing": True}, "old": {"gradient_checkpointing": True},
            "both": {"activation_checkpointing": False, "gradient_checkpointing": True}, "none": {}}
    for name, keys in runs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({**common, **keys}))
    out = memfit("check", "--format", "json", "--device", "H100", *(f"{n}.json" for n in runs), cwd=tmp_path)
    new, old, both, none = json.loads(out.stdout)["files"]
    assert new["peak"] == old["peak"] and new["footprint"]["activations"] < none["footprint"]["activations"]
    assert both["peak"] == none["peak"]  # the new name, false, wins over the alias
    assert not [d for d in new["diagnostics"] if "activation_checkpointing" in d["message"]]


def test_mics_keeps_what_zero3_over_its_group_keeps(tmp_path):
    """DeepSpeed's MiCS (mics_shard_size, ZeRO-3 only) shards the parameters, gradients and optimizer state within
    groups of that many GPUs and replicates across the groups: over 8 GPUs in groups of 2 a GPU holds what ZeRO-3 over
    2 GPUs holds (1/2 each), where plain ZeRO-3 over 8 keeps 1/8. Read from the JSON, positioned, through the CLI."""
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    for name, zero in {"mics.json": {"stage": 3, "mics_shard_size": 2}, "zero3.json": {"stage": 3}, "mics2.json": {"stage": 2, "mics_shard_size": 2}}.items():
        (tmp_path / name).write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": zero}, indent=2))

    def check(name, gpus):
        out = memfit("check", "--format", "json", "--model", "llama-3-8b.json", "--device", "H200", "--gpus", gpus, name, cwd=tmp_path)
        return json.loads(out.stdout)["files"][0]

    mics, over_two, over_eight, stage2 = check("mics.json", 8), check("zero3.json", 2), check("zero3.json", 8), check("mics2.json", 8)
    for key in ("parameters", "gradients", "optimizer_state"):
        assert mics["footprint"][key] == over_two["footprint"][key] > over_eight["footprint"][key]
    assert mics["peak"]["bytes"] == over_two["peak"]["bytes"]
    assert stage2["peak"] == check("mics2.json", 8)["peak"] and stage2["footprint"]["parameters"] > mics["footprint"]["parameters"]
    text = memfit("check", "--model", "llama-3-8b.json", "--device", "H200", "--gpus", "8", "mics.json", "mics2.json", cwd=tmp_path).stdout
    assert "mics.json:8:24: information[not-modelled] zero_optimization.mics_shard_size: MiCS shards the parameters, gradients and optimizer state over groups of 2 GPUs" in text, text
    assert "mics2.json:8:24: information[not-modelled] zero_optimization.mics_shard_size: MiCS applies to ZeRO stage 3 only" in text
    (tmp_path / "odd.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "mics_shard_size": 3}}))
    odd = memfit("check", "--model", "llama-3-8b.json", "--device", "H200", "--gpus", "8", "odd.json", cwd=tmp_path)
    assert odd.returncode != 0 and "zero_shard_size = 3 does not divide data = 8" in odd.stdout, odd.stdout


def _code_strings(module) -> tuple[set, set]:
    """(the keys a reader reads at the top of its document: the first argument of r.get / r.has / r.at /
    r.eval_batch without `data=` or `prefix=`; every string constant in its functions)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(module))
    top, strings = set(), set()
    for function in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(function):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "has", "at", "eval_batch")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "r" and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                    and not {k.arg for k in node.keywords} & {"data", "prefix"}):
                top.add(node.args[0].value)
    return top, strings


def inspect_source(module) -> str:
    import inspect

    return inspect.getsource(module)


def _named(entry: str) -> list:
    """The keys a KEYS entry names: torchtune's entries name several ('model.lora_rank (8) / lora_alpha (16)'),
    with their defaults in parentheses; a dotted key is read by its last part from its section."""
    bare = re.sub(r"\([^()]*(\([^()]*\))?[^()]*\)", "", entry)
    return [piece.strip().rsplit(".", 1)[-1] for piece in re.split(r"[/,]", bare) if piece.strip()]


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_key_a_reader_reads_is_in_its_table_and_every_tabled_key_is_read(reader):
    """A key the reader reads is in its table (KEYS, CONDITIONAL, UNMODELLED; the Trainer's NO_MEMORY); a key its
    KEYS (modelled) or CONDITIONAL (warned when its value matters) names is read by its code; the UNMODELLED keys are
    warned about by r.unmodelled (test_every_unmodelled_key_is_a_positioned_warning). A key neither modelled nor named
    fails here: add it to the table, or read it."""
    module = READERS[reader]
    top, strings = _code_strings(module)
    from memfit.read.native import vision

    if "vision." in inspect_source(module):  # the multimodal keys it hands to read/native/vision.py
        strings |= _code_strings(vision)[1]
    tabled_keys = tabled(module) | set(getattr(module, "NO_MEMORY", ()))
    sections = {name.split(".")[0] for entry in module.KEYS for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_]", entry)}
    assert not sorted(top - tabled_keys - sections), f"{reader}: keys read but in no table"
    named = [key for entry in (*module.KEYS, *getattr(module, "CONDITIONAL", {})) for key in _named(entry)]
    assert named and not sorted(key for key in named if key not in strings), f"{reader}: tabled keys its code never reads"
    import ast
    import inspect

    warned = {n.id for call in ast.walk(ast.parse(inspect.getsource(module))) if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
              and call.func.attr == "unmodelled" for n in ast.walk(call) if isinstance(n, ast.Name)}
    assert "UNMODELLED" in warned, f"{reader}: its UNMODELLED table is never warned about"


def test_llama_factorys_upcast_lmhead_output_adds_nothing_measured(tmp_path):
    """LLaMA-Factory's upcast_lmhead_output registers a forward hook on the lm_head that returns its output in float32
    (model/model_utils/checkpointing.py _fp32_forward_post_hook). transformers' causal-LM loss upcasts the logits to
    float32 itself (loss_utils.py ForCausalLMLoss: logits.float()), and the 16-bit output the hook replaces is saved by
    nobody: MemTracker's peak of a bf16 training step is the same with and without the hook, and so is memfit's."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    transformers = module("transformers")
    config = transformers.LlamaConfig(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                                      num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=False, use_cache=False)

    def peak(upcast: bool) -> int:
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16)
        model.train()
        if upcast:
            model.lm_head.register_forward_hook(lambda m, args, out: out.to(torch.float32))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        ids = torch.randint(0, config.vocab_size, (2, 128))

        def step():
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()
        tracker = MemTracker()
        tracker.track_external(model, optimizer, ids)
        with tracker:
            step()
        return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]

    with_hook, without = peak(True), peak(False)
    assert with_hook == without and with_hook > 2 * 128 * 4096 * 4  # the float32 logits are within the peak either way
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    common = "model_name_or_path: ./llama-3-8b.json\nstage: sft\nfinetuning_type: full\nbf16: true\ncutoff_len: 1024\nper_device_train_batch_size: 2\n"
    (tmp_path / "up.yaml").write_text(common + "upcast_lmhead_output: true\n")
    (tmp_path / "plain.yaml").write_text(common)
    out = memfit("check", "--format", "json", "--device", "H200", "up.yaml", "plain.yaml", cwd=tmp_path)
    up, plain = json.loads(out.stdout)["files"]
    assert up["peak"] == plain["peak"] and not [d for d in up["diagnostics"] if "upcast" in d["message"]]
