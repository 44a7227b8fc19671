"""MemfitCallback in real Trainer runs on the CPU (a tiny Llama, one or two steps): its prediction is, to the byte,
what `memfit check` gives for the config a user writes by hand for the same run; a run that cannot fit stops before
its first step; on_fail="warn" goes on; the record file gets one line per run, which `memfit runs` reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import needs
import pytest
import yaml

torch = needs.module("torch")
transformers = needs.module("transformers")

from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

import memfit  # noqa: E402
from memfit.integrations.transformers import MemfitCallback, MemfitWarning  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SEQ = 32
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)
BF16 = transformers.utils.is_torch_bf16_available_on_device("cpu")


def cli(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "memfit", *args], capture_output=True, text=True, timeout=300, check=False, cwd=cwd, env=env)


def checked(path, *flags, cwd=None) -> dict:
    done = cli("check", "--format", "json", *flags, str(path), cwd=cwd)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)["files"][0]


def tiny_model(tmp_path: Path):
    """The model, and its config.json where a hand-written config names it (tmp_path/model/config.json)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY))
    (tmp_path / "model").mkdir(exist_ok=True)
    model.config.to_json_file(str(tmp_path / "model" / "config.json"))
    return model


def dataset(lengths=(SEQ,) * 8):
    generator = torch.Generator().manual_seed(0)
    return [{"input_ids": (ids := torch.randint(0, TINY["vocab_size"], (n,), generator=generator)), "labels": ids.clone()} for n in lengths]


def arguments(tmp_path: Path, **changes) -> TrainingArguments:
    settings = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, max_steps=2, report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True)
    return TrainingArguments(**{**settings, **changes})


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_full_fine_tune_with_accumulation_is_what_memfit_check_gives_for_the_trainer_arguments(tmp_path):
    record = tmp_path / "runs.jsonl"
    callback = MemfitCallback(budget="1 GiB", record=str(record))
    trainer = Trainer(model=tiny_model(tmp_path), args=arguments(tmp_path, gradient_accumulation_steps=2), train_dataset=dataset(), callbacks=[callback])
    trainer.train()
    assert trainer.state.global_step == 2
    # what a user writes for this run: the Trainer's argument file (run_clm.py's), read by memfit as hf-trainer
    hand = tmp_path / "train_args.json"
    hand.write_text(json.dumps({"model_name_or_path": "model", "output_dir": "out", "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "max_seq_length": SEQ}))
    entry = checked(hand, "--budget", "1GiB", cwd=tmp_path)
    assert entry["input_format"] == "hf-trainer"
    assert callback.result.peak == entry["peak"]["bytes"] > 0
    assert callback.result.to_json()["peak"] == entry["peak"]
    assert callback.result.footprint == entry["footprint"]
    assert callback.result.budget == entry["budget"] == 2**30 and callback.result.fits
    assert callback.checked_len == SEQ and callback.seq_source == "the longest batch so far"
    (run,) = lines(record)
    assert run["status"] == "completed" and run["predicted"]["peak"] == entry["peak"]["bytes"] and run["predicted"]["fits"] is True
    assert run["measured"] == {"allocated": None, "reserved": None, "steps": 2}
    assert run["config"]["model"]["transformer"]["hidden_size"] == TINY["hidden_size"]
    assert set(run["versions"]) == {"torch", "transformers", "peft", "bitsandbytes"} and run["versions"]["torch"] == torch.__version__
    # the record's config alone (the model inline) gives the same figure through the CLI
    alone = tmp_path / "elsewhere" / "run.yaml"
    alone.parent.mkdir()
    alone.write_text(yaml.safe_dump(run["config"], sort_keys=False))
    assert checked(alone)["peak"] == entry["peak"]


def test_lora_with_checkpointing_in_bf16_is_what_memfit_check_gives_for_the_hand_written_config(tmp_path):
    peft = needs.module("peft")
    model = peft.get_peft_model(tiny_model(tmp_path), peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    callback = MemfitCallback(budget="1 GiB")
    args = arguments(tmp_path, max_steps=1, gradient_checkpointing=True, bf16=BF16)
    trainer = Trainer(model=model, args=args, train_dataset=dataset(), callbacks=[callback])
    trainer.train()
    assert trainer.state.global_step == 1
    precision = "bf16-mixed" if BF16 else "32-true"
    hand = tmp_path / "lora.yaml"
    hand.write_text(textwrap.dedent(f"""\
        memfit: 1
        device: {{memory: 1 GiB, type: cpu}}
        model: {{hf_config: model/config.json}}
        precision: {precision}
        optimizer: adamw
        training: {{micro_batch: 2, seq_len: {SEQ}, checkpointing: full, optimizer_impl: fused}}
        lora: {{r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj, v_proj]}}
        """))
    entry = checked(hand)
    assert entry["diagnostics"] == []
    assert callback.result.peak == entry["peak"]["bytes"] and callback.result.to_json()["peak"] == entry["peak"]
    assert callback.result.footprint == entry["footprint"]
    assert callback.config["lora"] == {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    assert callback.config["training"]["checkpointing"] == "full" and callback.config["precision"] == precision
    # `memfit convert` of the config the callback built, then `memfit check`: the callback's figure
    built = tmp_path / "built.yaml"
    built.write_text(yaml.safe_dump(callback.config, sort_keys=False))
    converted = cli("convert", str(built))
    assert converted.returncode == 0, converted.stderr
    (tmp_path / "converted.yaml").write_text(converted.stdout)
    assert checked(tmp_path / "converted.yaml")["peak"]["bytes"] == callback.result.peak


def test_a_run_on_the_cpu_is_checked_with_cpu_autocast(tmp_path):
    """use_cpu=True: the Trainer's device is the CPU, so the config the callback checks says `device.type: cpu`, and a
    bf16-mixed GPT-2 (gelu_new's pow, which CUDA autocast runs in float32 and CPU autocast in bf16) is priced with CPU
    autocast's dtypes: the callback's figure is `memfit check`'s of the hand-written config with `type: cpu`, and below
    the same config on `cuda`."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    # use_cache off, as the Trainer turns it off for training (the config.json the hand-written config names says so too)
    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=TINY["vocab_size"], n_positions=128, use_cache=False))
    (tmp_path / "model").mkdir()
    model.config.to_json_file(str(tmp_path / "model" / "config.json"))
    callback = MemfitCallback(budget="1 GiB")
    trainer = Trainer(model=model, args=arguments(tmp_path, max_steps=1, bf16=True), train_dataset=dataset(), callbacks=[callback])
    trainer.train()
    assert trainer.state.global_step == 1 and trainer.args.device.type == "cpu"
    assert callback.config["device"] == {"memory": "1 GiB", "type": "cpu"} and callback.config["precision"] == "bf16-mixed"
    figures = {}
    for kind in ("cpu", "cuda"):
        hand = tmp_path / f"{kind}.yaml"
        hand.write_text(textwrap.dedent(f"""\
            memfit: 1
            device: {{memory: 1 GiB, type: {kind}}}
            model: {{hf_config: model/config.json}}
            precision: bf16-mixed
            optimizer: adamw
            training: {{micro_batch: 2, seq_len: {SEQ}, optimizer_impl: fused}}
            """))
        entry = checked(hand)
        assert entry["diagnostics"] == []
        figures[kind] = entry["peak"]["bytes"]
    assert callback.result.peak == figures["cpu"] < figures["cuda"], (callback.result.peak, figures)


def test_the_device_type_is_where_the_trainer_runs():
    from types import SimpleNamespace

    from memfit.integrations import live

    assert live.device_type(SimpleNamespace(device=torch.device("cpu"))) == "cpu"
    assert live.device_type(SimpleNamespace(device=torch.device("cuda", 0))) == "cuda"
    assert live.device_type(SimpleNamespace(use_cpu=True)) == "cpu" and live.device_type(SimpleNamespace(use_cpu=False)) == "cuda"


def test_a_run_that_cannot_fit_stops_before_its_first_step_with_the_diagnostics_memfit_check_prints(tmp_path):
    record = tmp_path / "runs.jsonl"
    model = tiny_model(tmp_path)
    trainer = Trainer(model=model, args=arguments(tmp_path), train_dataset=dataset(), callbacks=[MemfitCallback(budget="1 MB", record=str(record))])
    with pytest.raises(memfit.DoesNotFit) as raised:
        trainer.train()
    assert trainer.state.global_step == 0
    assert all(p.grad is None for p in model.parameters())  # stopped before the first backward
    assert not trainer.optimizer.state  # the optimizer state not yet allocated
    result = raised.value.result
    assert not result.fits and result.budget == 1_000_000 and result.peak > result.budget
    (run,) = lines(record)
    assert run["status"] == "stopped" and run["predicted"]["fits"] is False
    written = tmp_path / "run.yaml"
    written.write_text(yaml.safe_dump(run["config"], sort_keys=False))
    entry = checked(written)
    assert [(d["code"], d["severity"], d["message"]) for d in entry["diagnostics"]] == [(d.code, d.severity, d.message) for d in result.diagnostics]
    assert [d.code for d in result.diagnostics] == ["budget-exceeded"]
    assert str(raised.value).splitlines()[-1] == "memfit: 1 config of 1 failed (1 error, 0 warnings)"


def test_on_fail_warn_goes_on_and_the_warning_names_the_shortfall(tmp_path):
    callback = MemfitCallback(budget=1_000_000, on_fail="warn")
    trainer = Trainer(model=tiny_model(tmp_path), args=arguments(tmp_path), train_dataset=dataset(), callbacks=[callback])
    with pytest.warns(MemfitWarning) as caught:
        trainer.train()
    assert trainer.state.global_step == 2
    shortfall = callback.result.peak - 1_000_000
    (said,) = [str(w.message) for w in caught if "does not fit" in str(w.message)]
    assert "exceeds the budget 1,000,000 B" in said and f"by {shortfall:,} B" in said


def test_a_longer_batch_later_is_checked_again(tmp_path):
    callback = MemfitCallback(budget="1 GiB")
    args = arguments(tmp_path, per_device_train_batch_size=1, max_steps=3, train_sampling_strategy="sequential")
    trainer = Trainer(model=tiny_model(tmp_path), args=args, train_dataset=dataset((8, 24, 16)), callbacks=[callback])
    seen = []
    original = callback._check
    callback._check = lambda length, source: (seen.append(length), original(length, source))[1]
    trainer.train()
    assert seen == [8, 24]  # the first batch, then the longer one; the shorter third is not checked again
    again = MemfitCallback(budget="1 GiB", seq_len=24)
    Trainer(model=tiny_model(tmp_path), args=arguments(tmp_path, per_device_train_batch_size=1, max_steps=1), train_dataset=dataset((24,)), callbacks=[again]).train()
    assert callback.result.peak == again.result.peak


def test_without_a_device_or_budget_on_a_machine_without_a_gpu_the_run_is_only_recorded(tmp_path):
    record = tmp_path / "runs.jsonl"
    for _ in range(2):
        callback = MemfitCallback(record=str(record))
        trainer = Trainer(model=tiny_model(tmp_path), args=arguments(tmp_path, max_steps=1), train_dataset=dataset(), callbacks=[callback])
        trainer.train()
        assert trainer.state.global_step == 1 and callback.result.budget is None
    runs = lines(record)
    assert len(runs) == 2 and runs[0]["id"] != runs[1]["id"]
    for run in runs:
        assert run["status"] == "completed" and run["device"] == "cpu" and run["predicted"]["fits"] is None
        assert run["measured"] == {"allocated": None, "reserved": None, "steps": 1}
        assert run["predicted"]["peak"] == callback.result.peak
    done = cli("runs", str(record))
    assert done.returncode == 0, done.stderr
    assert "memfit runs: 2 runs, 0 measured" in done.stdout and f"{record}:2" in done.stdout
    report = json.loads(cli("runs", "--format", "json", str(record)).stdout)
    assert [r["status"] for r in report["runs"]] == ["completed", "completed"] and report["summary"]["measured"] == 0


OOM_SCRIPT = """
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
from memfit.integrations.transformers import MemfitCallback
model = LlamaForCausalLM(LlamaConfig(**{tiny}))
def out_of_memory(module, args, output):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
model.model.layers[0].register_forward_hook(out_of_memory)
data = [{{"input_ids": torch.zeros(32, dtype=torch.long), "labels": torch.zeros(32, dtype=torch.long)}}] * 4
args = TrainingArguments(output_dir=sys.argv[2], per_device_train_batch_size=2, max_steps=1, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=data, callbacks=[MemfitCallback(budget="1 GiB", record=sys.argv[1])]).train()
"""


def test_a_run_that_dies_of_out_of_memory_leaves_its_line_marked(tmp_path):
    record = tmp_path / "runs.jsonl"
    script = tmp_path / "train.py"
    script.write_text(OOM_SCRIPT.format(tiny=TINY))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, str(script), str(record), str(tmp_path / "out")], capture_output=True, text=True, timeout=300, check=False, env=env)
    assert done.returncode == 1 and "OutOfMemoryError" in done.stderr
    (run,) = lines(record)
    assert run["status"] == "oom" and run["predicted"]["fits"] is True and run["error"].startswith("OutOfMemoryError: CUDA out of memory")
    report = cli("runs", str(record))
    assert report.returncode == 1  # an out-of-memory run that memfit said fits
    assert "oom-after-pass" in report.stdout and "died of out-of-memory after memfit said it fits" in report.stdout


def test_bad_settings_are_refused_when_the_callback_is_made():
    with pytest.raises(ValueError, match="on_fail"):
        MemfitCallback(on_fail="stop")
    with pytest.raises(ValueError, match="budget"):
        MemfitCallback(budget="80 GBs")
    with pytest.raises(ValueError, match="seq_len"):
        MemfitCallback(seq_len=0)
    with pytest.raises(ValueError, match=r"'H10' is not a GPU preset \(did you mean H100-80GB"):
        MemfitCallback(device="H10")


class Regression(torch.nn.Module):
    """A model without a transformers config: memfit cannot build its config."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, labels):
        return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}


def test_a_run_memfit_cannot_read_goes_on_unchecked_with_a_warning(tmp_path):
    data = [{"x": torch.ones(4), "labels": torch.tensor(1.0)}] * 4
    callback = MemfitCallback(budget="1 MB")
    trainer = Trainer(model=Regression(), args=arguments(tmp_path, max_steps=1), train_dataset=data, callbacks=[callback])
    with pytest.warns(MemfitWarning, match="cannot check this run .*Regression has no transformers config"):
        trainer.train()
    assert trainer.state.global_step == 1 and callback.result is None


def test_the_readme_s_three_lines_run(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Inside the training script") :]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) == 3
    monkeypatch.chdir(tmp_path)
    space = {"Trainer": Trainer, "model": tiny_model(tmp_path), "args": arguments(tmp_path, max_steps=1), "data": dataset()}
    exec(compile(code, "README.md", "exec"), space)
    assert space["trainer"].state.global_step == 1
    (run,) = lines(tmp_path / "memfit-runs.jsonl")
    from memfit.config.presets import PRESETS

    assert run["status"] == "completed" and run["predicted"]["fits"] is True
    # the run trains on the CPU (use_cpu): checked against the preset with CPU autocast's dtypes
    assert run["config"]["device"] == {"preset": "H100-80GB", "type": "cpu"} and run["predicted"]["budget"] <= PRESETS["H100-80GB"].memory


def test_qlora_is_what_memfit_check_gives_for_the_hand_written_config(tmp_path):
    """A 4-bit bitsandbytes model (loaded on the CPU) with a peft LoRA adapter: the quantization section comes from the
    model's quantization_config, the precision from its bf16 weights."""
    needs.module("bitsandbytes")
    peft = needs.module("peft")
    tiny_model(tmp_path).save_pretrained(str(tmp_path / "weights"))
    quantization = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
    model = LlamaForCausalLM.from_pretrained(str(tmp_path / "weights"), quantization_config=quantization, dtype=torch.bfloat16, device_map="cpu")
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    callback = MemfitCallback(budget="1 GiB")
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemfitWarning)  # nothing of this run is left out
        trainer = Trainer(model=model, args=arguments(tmp_path, max_steps=1), train_dataset=dataset(), callbacks=[callback])
        trainer.train()
    assert trainer.state.global_step == 1
    hand = tmp_path / "qlora.yaml"
    hand.write_text(textwrap.dedent(f"""\
        memfit: 1
        device: {{memory: 1 GiB, type: cpu}}
        model: {{hf_config: model/config.json}}
        precision: bf16-true
        optimizer: adamw
        training: {{micro_batch: 2, seq_len: {SEQ}, optimizer_impl: fused}}
        lora: {{r: 4, alpha: 8, target_modules: [q_proj, v_proj]}}
        quantization: {{method: nf4, double_quant: true, compute_dtype: bfloat16}}
        """))
    entry = checked(hand)
    assert entry["diagnostics"] == []
    assert callback.result.peak == entry["peak"]["bytes"] and callback.result.footprint == entry["footprint"]
    assert callback.config["quantization"] == {"method": "nf4", "double_quant": True, "compute_dtype": "bfloat16"}


def test_deepspeed_arguments_and_the_world_size_go_through_the_trainer_argument_reader(tmp_path):
    """A ZeRO-2 run on 4 GPUs cannot run here; the config the callback would build for it is what `memfit check` reads
    from the argument file with the same DeepSpeed keys and --gpus 4."""
    from memfit.integrations import live

    zero = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"}}
    args = arguments(tmp_path, deepspeed=zero, bf16=True)
    model = tiny_model(tmp_path)
    doc, notes = live.memfit_config(args, model, SEQ, budget="1 GiB", world_size=4)
    assert notes == [] and doc["parallel"]["zero"] == 2 and doc["parallel"]["data"] == 4
    built = memfit.check_config(doc)
    hand = tmp_path / "zero2_args.json"
    hand.write_text(json.dumps({"model_name_or_path": "model", "output_dir": "out", "per_device_train_batch_size": 2, "max_seq_length": SEQ, "bf16": True, "deepspeed": zero}))
    entry = checked(hand, "--budget", "1GiB", "--gpus", "4", cwd=tmp_path)
    assert built.to_json()["peak"] == entry["peak"] and built.footprint == entry["footprint"]


TWO_RANKS = """
import os, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
import memfit
from memfit.integrations.transformers import MemfitCallback
model = LlamaForCausalLM(LlamaConfig(**{tiny}))
# batch 1, sequential sampling, sharded by rank: rank 0 trains on the 8-token sequence, rank 1 on the 64-token one
data = [{{"input_ids": torch.zeros(n, dtype=torch.long), "labels": torch.zeros(n, dtype=torch.long)}} for n in (8, 64)]
args = TrainingArguments(output_dir=sys.argv[2], per_device_train_batch_size=1, max_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                         disable_tqdm=True, train_sampling_strategy="sequential", ddp_backend="gloo")
callback = MemfitCallback(budget=int(sys.argv[1]))
trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
try:
    trainer.train()
    said = f"rank {{args.process_index}}: trained, checked {{callback.checked_len}} tokens"
except memfit.DoesNotFit:
    said = f"rank {{args.process_index}}: DoesNotFit at step {{trainer.state.global_step}}, checked {{callback.checked_len}} tokens"
# one write of the whole line: the two ranks share the pipe, and print's text and newline are two writes
os.write(1, (said + "\\n").encode())
"""


def test_every_rank_of_a_two_process_run_stops(tmp_path):
    """torch.distributed on gloo, two processes: rank 0's batch alone would fit, rank 1's would not. The ranks agree
    on the longest batch, so both stop before their first step (none is left in DDP's gradient all-reduce)."""
    from memfit.integrations import live

    model = tiny_model(tmp_path)
    args = arguments(tmp_path, per_device_train_batch_size=1)
    short, long = (memfit.check_config(live.memfit_config(args, model, n, world_size=2)[0]).peak for n in (8, 64))
    assert short < long
    script = tmp_path / "train.py"
    script.write_text(TWO_RANKS.format(tiny=TINY))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script), str((short + long) // 2), str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, env=env, cwd=tmp_path)
    said = sorted(line for line in done.stdout.splitlines() if line.startswith("rank "))
    assert said == ["rank 0: DoesNotFit at step 0, checked 64 tokens", "rank 1: DoesNotFit at step 0, checked 64 tokens"], done.stdout + done.stderr[-3000:]


def test_fsdp_settings_the_reader_leaves_out_are_said(tmp_path):
    from memfit.integrations import live

    args = arguments(tmp_path, fsdp=True, fsdp_config={"cpu_offload": True})
    doc, notes = live.memfit_config(args, tiny_model(tmp_path), SEQ, budget="1 GiB", world_size=2)
    assert doc["parallel"]["fsdp"] == "full_shard" and doc["parallel"]["data"] == 2
    # the offload is in the layout (once the hf-trainer reader reads cpu_offload), or said to be left out
    assert ("offload" in doc["parallel"]) != any(note.startswith("fsdp_config cpu_offload") for note in notes), (doc, notes)


def test_on_a_gpu_without_a_device_or_budget_the_card_s_own_memory_is_the_budget(monkeypatch):
    """The mapping from the card to what it is checked against (this machine has no GPU: the driver's answer is
    given here): a card whose total is a preset's is that preset (its overhead lines apply), another its total."""
    from types import SimpleNamespace

    from memfit.config.presets import PRESETS

    args = SimpleNamespace(device=torch.device("cuda", 0))
    for total, expected in ((PRESETS["H100-80GB"].memory, ("H100-80GB", None, True)), (12_345 * 2**20, (None, 12_345 * 2**20, True))):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, total=total: SimpleNamespace(total_memory=total))
        assert MemfitCallback()._target(args) == expected
    assert MemfitCallback()._target(SimpleNamespace(device=torch.device("cpu"))) == (None, None, False)
    assert MemfitCallback(device="H100")._target(args) == ("H100", None, True)
