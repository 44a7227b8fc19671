"""--gpus on a memfit config, through the CLI: it sets the world size of a config that states no parallel.data, as it
does for native configs (parallel.data = gpus / (tensor x pipeline)), and where the config's parallel section states
another world size the config wins with a gpus-overridden warning at parallel.data: --gpus is never ignored silently.

The figures of a config with --gpus N are compared with the same config with `data:` written in it (what --gpus is
documented to mean); the warning and the error are read from `memfit check`'s json and text output."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """memfit: 1
device: {{preset: H100-80GB}}
optimizer: adamw
dtypes: {{parameters: bfloat16, gradients: bfloat16, activations: bfloat16, optimizer_state: bfloat16}}
model:
  hf_config: gpt2.json
training: {{micro_batch: 1, seq_len: 1024, attention: sdpa}}
{parallel}"""


def check(path: Path, *flags: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", *flags, str(path)], capture_output=True, text=True,
                          cwd=path.parent, timeout=300, check=False)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return done.returncode, json.loads(done.stdout)["files"][0]


def write(tmp_path: Path, name: str, parallel: str) -> Path:
    shutil.copy(ROOT / "examples" / "models" / "gpt2.json", tmp_path / "gpt2.json")
    path = tmp_path / name
    path.write_text(CONFIG.format(parallel=parallel))
    return path


def test_gpus_sets_the_data_ranks_of_a_config_that_states_none(tmp_path):
    """An FSDP config without parallel.data, checked with --gpus 8: 8 ranks, the figures of the config with data: 8
    (before: 1 rank and no diagnostic)."""
    bare = write(tmp_path, "bare.yaml", "parallel: {fsdp: full_shard}\n")
    eight = write(tmp_path, "eight.yaml", "parallel: {data: 8, fsdp: full_shard}\n")
    rc, flagged = check(bare, "--gpus", "8")
    _, written = check(eight)
    assert rc == 0 and flagged["diagnostics"] == [] and flagged["peak"]["ranks"] == 8
    assert (flagged["footprint"], flagged["peak"]["bytes"]) == (written["footprint"], written["peak"]["bytes"])
    _, alone = check(bare)
    assert alone["peak"]["ranks"] == 1 and alone["peak"]["bytes"] != flagged["peak"]["bytes"]  # the flag changes the figure


def test_gpus_divided_by_tensor_and_pipeline(tmp_path):
    """tensor 2 without data: --gpus 8 is data 4 (the world 8); --gpus 6 does not divide by tensor x pipeline = 4
    (pipeline 2): bad-parallel on the parallel key, exit 1."""
    bare = write(tmp_path, "tp.yaml", "parallel: {tensor: 2}\n")
    four = write(tmp_path, "tp4.yaml", "parallel: {tensor: 2, data: 4}\n")
    _, flagged = check(bare, "--gpus", "8")
    _, written = check(four)
    assert flagged["diagnostics"] == [] and flagged["peak"]["ranks"] == 8 and flagged["peak"]["bytes"] == written["peak"]["bytes"]
    piped = write(tmp_path, "pp.yaml", "parallel: {tensor: 2, pipeline: 2}\n")
    rc, refused = check(piped, "--gpus", "6")
    [d] = refused["diagnostics"]
    assert rc == 1 and (d["code"], d["severity"]) == ("bad-parallel", "error")
    assert d["message"].startswith("--gpus 6: 6 GPUs do not divide into tensor x pipeline = 2 x 2 = 4")
    assert d["range"]["start"] == {"line": 7, "character": 0}  # the `parallel` key (0-based line 7)


def test_a_config_without_a_parallel_section_runs_data_parallel_on_gpus_ranks(tmp_path):
    """No parallel section: --gpus 4 is plain data parallelism (DDP) on 4 ranks, as `parallel: {data: 4}`."""
    bare = write(tmp_path, "plain.yaml", "")
    four = write(tmp_path, "ddp.yaml", "parallel: {data: 4}\n")
    _, flagged = check(bare, "--gpus", "4")
    _, written = check(four)
    assert flagged["diagnostics"] == [] and flagged["peak"]["ranks"] == 4 and flagged["peak"]["bytes"] == written["peak"]["bytes"]
    _, one = check(bare, "--gpus", "1")
    _, alone = check(bare)
    assert one == alone and "ranks" not in alone["peak"]  # one GPU: no layout added, the single-device figure


def test_a_stated_world_size_wins_with_a_warning_at_parallel_data(tmp_path):
    """data: 8 with --gpus 4: the figures stay the 8-rank ones, a gpus-overridden warning at the `data` key says so
    (exit 0); --gpus equal to data x tensor x pipeline gives none."""
    path = write(tmp_path, "eight.yaml", "parallel:\n  data: 2\n  tensor: 2\n  fsdp: full_shard\n")
    rc, flagged = check(path, "--gpus", "8")
    _, plain = check(path)
    [d] = flagged["diagnostics"]
    assert rc == 0 and (d["code"], d["severity"]) == ("gpus-overridden", "warning")
    assert d["message"] == ("--gpus 8 is not this config's world size, parallel.data 2 x tensor 2 x pipeline 1 = 4 GPUs: the config's parallel "
                            "section wins, the figures are for 4 GPUs (drop parallel.data to let --gpus set it)")
    assert d["range"] == {"start": {"line": 8, "character": 2}, "end": {"line": 8, "character": 6}}
    assert flagged["peak"]["ranks"] == 4 and flagged["peak"]["bytes"] == plain["peak"]["bytes"]
    _, same = check(path, "--gpus", "4")
    assert same["diagnostics"] == []
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--gpus", "8", str(path)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and f"{path}:9:3: warning[gpus-overridden] --gpus 8 is not this config's world size" in done.stdout


def test_the_settings_gpus_applies_as_the_flag_does(tmp_path):
    """`gpus = 4` in a memfit.toml beside the config: the world size of a config without parallel.data, and a
    warning naming the settings file where the config states another."""
    (tmp_path / ".git").mkdir()  # the settings search stops at the repository's root
    (tmp_path / "memfit.toml").write_text("gpus = 4\n")
    bare = write(tmp_path, "bare.yaml", "parallel: {fsdp: full_shard}\n")
    stated = write(tmp_path, "stated.yaml", "parallel: {data: 8, fsdp: full_shard}\n")
    _, flagged = check(bare)
    assert flagged["diagnostics"] == [] and flagged["peak"]["ranks"] == 4
    _, kept = check(stated)
    [d] = kept["diagnostics"]
    assert d["code"] == "gpus-overridden" and d["message"].startswith("gpus = 4 in memfit.toml is not this config's world size, parallel.data 8 = 8 GPUs")
    assert kept["peak"]["ranks"] == 8
    _, flag = check(stated, "--gpus", "8")  # the command line wins over the settings file
    assert flag["diagnostics"] == []


def test_fewer_gpus_than_the_configs_model_parallel_split_leave_the_config_as_written(tmp_path):
    """tensor 2 without data, --gpus 1 (a project's `gpus = 1` too): the config's own split wins, as a stated
    parallel.data does, with a gpus-overridden warning at the parallel key and exit 0: the figure of the config alone
    (a config that passed before --gpus applied to memfit configs still passes)."""
    bare = write(tmp_path, "tp.yaml", "parallel: {tensor: 2}\n")
    _, alone = check(bare)
    rc, flagged = check(bare, "--gpus", "1")
    [d] = flagged["diagnostics"]
    assert rc == 0 and (d["code"], d["severity"]) == ("gpus-overridden", "warning"), d
    assert d["message"].startswith("--gpus 1 is fewer GPUs than this config's tensor 2 x pipeline 1 = 2") and d["range"]["start"]["line"] == 7
    assert (flagged["footprint"], flagged["peak"]["bytes"], flagged["peak"]["ranks"]) == (alone["footprint"], alone["peak"]["bytes"], alone["peak"]["ranks"])
