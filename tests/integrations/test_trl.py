"""MemfitCallback in a TRL SFTTrainer run (an SFTTrainer is a Trainer): TRL's own defaults (activation checkpointing
on, bf16 where the device has it) and its max_length reach the prediction, which is, to the byte, what `memfit check`
gives for the argument file a user writes for the same run; a run that cannot fit stops at step 0; warn goes on; the
record has one line per run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import needs
import pytest

torch = needs.module("torch")
transformers = needs.module("transformers")
trl = needs.module("trl")
datasets = needs.module("datasets")
tokenizers = needs.module("tokenizers")

from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

import memfit  # noqa: E402
from memfit.integrations.transformers import MemfitCallback, MemfitWarning  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MAX_LENGTH = 24
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=64, max_position_embeddings=128)


def tokenizer():
    """A word-level tokenizer built here (no hub): 60 words, then the special tokens."""
    vocab = {f"w{i}": i for i in range(60)} | {"<pad>": 60, "<eos>": 61, "<unk>": 62}
    model = tokenizers.models.WordLevel(vocab, unk_token="<unk>")
    built = tokenizers.Tokenizer(model)
    built.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=built, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def data(lengths=(10, 30, 20, 40)):
    return datasets.Dataset.from_dict({"text": [" ".join(f"w{(i * 7 + j) % 60}" for j in range(n)) for i, n in enumerate(lengths)]})


def model_and_config(tmp_path: Path):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY, pad_token_id=60, eos_token_id=61))
    (tmp_path / "model").mkdir(exist_ok=True)
    model.config.to_json_file(str(tmp_path / "model" / "config.json"))
    return model


def sft(tmp_path: Path, callback, **changes):
    settings = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, max_steps=1, max_length=MAX_LENGTH, report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True)
    config = trl.SFTConfig(**{**settings, **changes})
    return trl.SFTTrainer(model=model_and_config(tmp_path), args=config, train_dataset=data(), processing_class=tokenizer(), callbacks=[callback])


def checked(path, *flags, cwd=None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", *flags, str(path)], capture_output=True, text=True, timeout=300, check=False, cwd=cwd, env=env)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)["files"][0]


def test_an_sft_run_is_what_memfit_check_gives_for_the_hand_written_arguments(tmp_path):
    record = tmp_path / "runs.jsonl"
    callback = MemfitCallback(budget="1 GiB", record=str(record))
    trainer = sft(tmp_path, callback)
    trainer.train()
    assert trainer.state.global_step == 1
    args = trainer.args
    assert args.gradient_checkpointing is True  # TRL's default, which the callback reads from the live arguments
    # the argument file a user writes for this run, with TRL's defaults spelled out
    hand = tmp_path / "sft_args.json"
    hand.write_text(json.dumps({
        "model_name_or_path": "model", "output_dir": "out", "per_device_train_batch_size": 2, "max_seq_length": MAX_LENGTH,
        "gradient_checkpointing": True, "bf16": bool(args.bf16),
    }))
    entry = checked(hand, "--budget", "1GiB", cwd=tmp_path)
    assert callback.result.peak == entry["peak"]["bytes"] and callback.result.to_json()["peak"] == entry["peak"]
    assert callback.result.footprint == entry["footprint"]
    assert callback.checked_len == MAX_LENGTH and callback.seq_source == "SFTConfig.max_length"
    (run,) = [json.loads(line) for line in record.read_text().splitlines()]
    assert run["status"] == "completed" and run["predicted"]["peak"] == callback.result.peak
    assert run["measured"] == {"allocated": None, "reserved": None, "steps": 1}


def test_an_sft_run_that_cannot_fit_stops_at_step_zero_and_warn_goes_on(tmp_path):
    trainer = sft(tmp_path, MemfitCallback(budget="1 MB"))
    with pytest.raises(memfit.DoesNotFit) as raised:
        trainer.train()
    assert trainer.state.global_step == 0 and not trainer.optimizer.state
    assert [d.code for d in raised.value.result.diagnostics] == ["budget-exceeded"]
    callback = MemfitCallback(budget="1 MB", on_fail="warn")
    trainer = sft(tmp_path, callback)
    with pytest.warns(MemfitWarning) as caught:
        trainer.train()
    assert trainer.state.global_step == 1
    assert callback.result.peak == raised.value.result.peak
    (said,) = [str(w.message) for w in caught if "does not fit" in str(w.message)]
    assert "exceeds the budget 1,000,000 B" in said and f"by {callback.result.peak - 1_000_000:,} B" in said


def test_a_preference_trainer_s_config_is_said_to_be_more_than_the_step_memfit_models(tmp_path):
    from memfit.integrations import live

    args = trl.DPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, max_length=MAX_LENGTH, report_to=[], use_cpu=True)
    _, notes = live.memfit_config(args, model_and_config(tmp_path), MAX_LENGTH, budget="1 GiB")
    assert any(note.startswith("DPOConfig: DPO runs chosen and rejected sequences") for note in notes), notes
    sft_args = trl.SFTConfig(output_dir=str(tmp_path / "out"), max_length=MAX_LENGTH, report_to=[], use_cpu=True)
    assert live.memfit_config(sft_args, model_and_config(tmp_path), MAX_LENGTH, budget="1 GiB")[1] == []
