"""The gate on native configs as users keep them (issue 33), each reproducer through the CLI on real files:
recognition from the parsed document (every spelling YAML and JSON allow), folders checked like their files,
an empty folder not called a pass, the command line's budget and device flags, where the budget came from."""

import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"

# an Axolotl full fine-tune of Llama-3-8B at 16 x 8192 tokens: far over an H100
AXOLOTL = {
    "block": "base_model: ../llama-3-8b.json\nsequence_len: 8192\nmicro_batch_size: 16\nnum_epochs: 1\n",
    "flow": "{base_model: ../llama-3-8b.json, sequence_len: 8192, micro_batch_size: 16, num_epochs: 1}\n",
    "quoted": "\"base_model\": ../llama-3-8b.json\n'sequence_len': 8192\n\"micro_batch_size\": 16\nnum_epochs: 1\n",
    "indented": "  base_model: ../llama-3-8b.json\n  sequence_len: 8192\n  micro_batch_size: 16\n  num_epochs: 1\n",
    "escaped": "\"\\x62ase_model\": ../llama-3-8b.json\n\"sequence\\u005flen\": 8192\nmicro_batch_size: 16\nnum_epochs: 1\n",
    "json": '{"base_model": "../llama-3-8b.json", "sequence_len": 8192, "micro_batch_size": 16, "num_epochs": 1}',
}
# a Trainer argument file whose keys are JSON escapes
TRAINER_ESCAPED = '{"\\u006dodel_name_or_path": "llama-3-8b.json", "per_device_train_batch_size": 16, "\\u0062lock_size": 8192, "output_dir": "o"}'


def memfit(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], check=False, capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.fixture
def project(tmp_path) -> Path:
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    (tmp_path / "ax").mkdir()
    return tmp_path


@pytest.mark.parametrize("spelling", sorted(AXOLOTL))
def test_every_spelling_is_recognised_by_its_parsed_keys(project, spelling):
    name = project / "ax" / ("run.json" if spelling == "json" else "run.yml")
    name.write_text(AXOLOTL[spelling])
    out = memfit("check", "--skip-unrecognized", "--format", "json", "--device", "H100", name)
    [entry] = json.loads(out.stdout)["files"]  # the json format lists the files it checked, not the ones it skipped
    assert out.returncode == 1 and entry["input_format"] == "axolotl"
    assert [d["code"] for d in entry["diagnostics"]] == ["budget-exceeded"]


def test_a_trainer_json_with_escaped_keys_is_checked(project):
    (project / "args.json").write_text(TRAINER_ESCAPED)
    out = memfit("check", "--skip-unrecognized", "--device", "H100", project / "args.json")
    assert out.returncode == 1 and "error[budget-exceeded]" in out.stdout, out.stdout


def test_a_folder_is_checked_like_its_files(project):
    for spelling, text in AXOLOTL.items():
        (project / "ax" / (f"{spelling}.json" if spelling == "json" else f"{spelling}.yml")).write_text(text)
    (project / "ax" / "tokenizer.json").write_text('{"version": "1.0", "added_tokens": []}')  # JSON that is no config: skipped
    (project / "ax" / "dataset.yaml").write_text("name: alpaca\nsplits: [train]\n")
    out = memfit("check", "--skip-unrecognized", "--device", "H100", project / "ax")
    assert out.returncode == 1, out.stdout
    assert out.stdout.count("error[budget-exceeded]") == len(AXOLOTL), out.stdout
    assert f"memfit: {len(AXOLOTL)} configs of {len(AXOLOTL)} failed" in out.stdout and "2 skipped" in out.stdout
    # named one by one, the same verdicts
    named = memfit("check", "--skip-unrecognized", "--device", "H100", *sorted((project / "ax").iterdir()))
    assert named.stdout.count("error[budget-exceeded]") == len(AXOLOTL)


def test_the_upstream_example_folder_checks_as_a_folder():
    out = memfit("check", "--skip-unrecognized", "--format", "json", ROOT / "examples" / "native")
    files = json.loads(out.stdout)["files"]
    assert files and all(f["input_format"] == "axolotl" for f in files) and out.returncode == 0


def test_a_folder_with_no_config_is_not_a_pass(project):
    other = project / "other"
    other.mkdir()
    (other / "values.yaml").write_text("replicas: 2\n")
    (other / "package.json").write_text('{"name": "x"}')
    out = memfit("check", "--skip-unrecognized", other)
    assert out.returncode == 1 and f"{other}:1:1: error[no-configs] no config memfit recognises in directory {other} (2 files skipped" in out.stdout
    passed = memfit("check", "--skip-unrecognized", "--allow-empty", other)
    assert passed.returncode == 0 and "0 configs checked" in passed.stdout
    # a folder with no YAML or JSON file at all: an error, unless an empty pass was asked for
    (project / "empty").mkdir()
    assert memfit("check", project / "empty").returncode == 1
    assert memfit("check", "--allow-empty", project / "empty").returncode == 0
    # explain gates the same way
    assert memfit("explain", "--skip-unrecognized", other).returncode == 1
    assert memfit("explain", "--skip-unrecognized", "--allow-empty", other).returncode == 0


def test_a_folder_of_deepspeed_jsons_is_checked(project):
    ds = project / "ds"
    ds.mkdir()
    for stage in (2, 3):
        (ds / f"zero{stage}.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage}, "bf16": {"enabled": True}}))
    out = memfit("check", "--skip-unrecognized", "--format", "json", "--model", project / "llama-3-8b.json", "--device", "H100", "--gpus", "8", ds)
    files = json.loads(out.stdout)["files"]
    assert [Path(f["path"]).name for f in files] == ["zero2.json", "zero3.json"], out.stdout
    assert all(f["input_format"] == "deepspeed" and f["footprint"] is not None for f in files)


def test_the_hook_passes_files_that_are_none_of_memfits(project):
    names = []
    for name, text in {"compose.yml": "services: {web: {image: nginx}}\n", "package.json": '{"name": "x", "model": 3}', "train.yaml": "model: resnet\nepochs: 3\n"}.items():
        (project / name).write_text(text)
        names.append(project / name)
    out = memfit("check", "--skip-unrecognized", *names)
    assert out.returncode == 0 and "3 skipped" in out.stdout, out.stdout


MEMFIT_CONFIG = "memfit: 1\noptimizer: adam\nparameters: [[1000, 1000]]\n"


def test_a_bare_budget_asks_for_a_unit(tmp_path):
    config = tmp_path / "m.yaml"
    config.write_text(MEMFIT_CONFIG)
    out = memfit("check", "--budget", "80", config)
    assert out.returncode == 2 and "'80' has no unit" in out.stderr and "80GiB" in out.stderr
    assert memfit("check", "--budget", "80GB", config).returncode == 0
    assert memfit("check", "--budget", "80B", config).returncode == 1  # bytes, said so


def test_the_device_flag_is_checked_and_kept(tmp_path):
    config = tmp_path / "m.yaml"
    config.write_text(MEMFIT_CONFIG)
    own = tmp_path / "own.yaml"
    own.write_text("memfit: 1\ndevice: {preset: H100}\noptimizer: adam\nparameters: [[1000, 1000]]\n")
    # a typo is an error even where the config names its device (it would otherwise pass unnoticed)
    typo = memfit("check", "--device", "H10", own)
    assert typo.returncode == 2 and "unknown device preset 'H10'; did you mean H100-80GB" in typo.stderr
    assert memfit("check", "--device", "A100", config).returncode == 2  # two cards with different memory
    # --no-settings drops the settings files, not the command line's device
    (tmp_path / "memfit.toml").write_text('device = "T4"\n')
    kept = memfit("check", "--no-settings", "--device", "H100", "--format", "json", config)
    assert kept.returncode == 0, kept.stdout
    assert json.loads(kept.stdout)["files"][0]["budget"] == json.loads(memfit("check", "--device", "H100", "--format", "json", config).stdout)["files"][0]["budget"]


def test_where_the_device_model_and_settings_came_from(tmp_path):
    (tmp_path / ".git").mkdir()  # the repository's root
    (tmp_path / "models").mkdir()
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "models" / "m.json")
    (tmp_path / "memfit.toml").write_text('device = "A100-80GB"\n[models]\n"acme/llama" = "models/m.json"\n')
    config = tmp_path / "run.yml"
    config.write_text("base_model: acme/llama\nmicro_batch_size: 1\nsequence_len: 1024\nadapter: lora\nlora_r: 8\nlora_target_linear: true\nbf16: true\n")
    out = memfit("check", "--format", "json", "run.yml", cwd=tmp_path)
    entry = json.loads(out.stdout)["files"][0]
    keys = list(entry)
    assert keys.index("provenance") == keys.index("budget") + 1
    assert entry["provenance"] == {
        "settings": "memfit.toml",
        "device": {"preset": "A100-80GB", "from": "memfit.toml"},
        "model": {"name": "acme/llama", "config": "models/m.json", "from": "the models table of memfit.toml"},
    }
    text = memfit("check", "run.yml", cwd=tmp_path).stdout
    assert "fits (device A100-80GB from memfit.toml; model acme/llama: models/m.json, from the models table of memfit.toml)" in text
    flagged = json.loads(memfit("check", "--format", "json", "--device", "H100", "run.yml", cwd=tmp_path).stdout)["files"][0]
    assert flagged["provenance"]["device"] == {"preset": "H100", "from": "--device"}
    # a failing config says it on a line of its own
    failing = memfit("check", "--budget", "1GiB", "run.yml", cwd=tmp_path).stdout
    assert "run.yml: device A100-80GB from memfit.toml; model acme/llama: models/m.json, from the models table of memfit.toml" in failing


def test_settings_stop_at_the_repository_root(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.memfit]\ndevice = "T4"\n')  # above the checkout: someone else's
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    config = repo / "m.yaml"
    config.write_text(MEMFIT_CONFIG)
    out = memfit("check", config)
    assert out.returncode == 1 and "error[no-budget]" in out.stdout, out.stdout
    (repo / "pyproject.toml").write_text('[tool.memfit]\ndevice = "T4"\n')  # the repository's own
    assert memfit("check", config).returncode == 0


def test_a_local_folder_that_shadows_a_hub_name_is_a_warning_naming_both(project):
    folder = project / "ax" / "meta-llama" / "Meta-Llama-3-8B"
    folder.mkdir(parents=True)
    shutil.copy(MODELS / "gpt2.json", folder / "config.json")  # a tiny model where the framework would load the 8B
    config = project / "ax" / "run.yml"
    config.write_text("base_model: meta-llama/Meta-Llama-3-8B\nmicro_batch_size: 1\nsequence_len: 1024\n")
    out = memfit("check", "--device", "H100", config)
    assert f"{config}:1:13: warning[model-shadowed] model 'meta-llama/Meta-Llama-3-8B' is read from the local folder" in out.stdout, out.stdout
    assert "which shadows the Hugging Face model 'meta-llama/Meta-Llama-3-8B'" in out.stdout
    # written as a path, the folder is meant: no warning
    config.write_text("base_model: ./meta-llama/Meta-Llama-3-8B\nmicro_batch_size: 1\nsequence_len: 1024\n")
    assert "model-shadowed" not in memfit("check", "--device", "H100", config).stdout


def test_a_cache_ref_cannot_lead_out_of_the_cache(tmp_path):
    repo = tmp_path / "hub" / "models--acme--llama"
    (repo / "refs").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(MODELS / "llama-3-8b.json", outside / "config.json")
    (repo / "snapshots").mkdir()
    (repo / "refs" / "main").write_text("../../../outside")  # snapshots/../../../outside/config.json
    config = tmp_path / "run.yml"
    config.write_text("base_model: acme/llama\nmicro_batch_size: 1\nsequence_len: 1024\n")
    out = subprocess.run([sys.executable, "-m", "memfit", "check", "--device", "H100", str(config)], capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HOME": str(tmp_path)})
    assert out.returncode == 1 and "error[model-not-found]" in out.stdout, out.stdout


NOT_TRAINING = {
    # LLaMA-Factory examples/inference/llama3.yaml and examples/merge_lora/llama3_lora_sft.yaml, as upstream writes them
    "inference.yaml": "model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct\ntemplate: llama3\ninfer_backend: huggingface  # choices: [huggingface, vllm, sglang]\ntrust_remote_code: true\n",
    "merge.yaml": "model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct\nadapter_name_or_path: saves/llama3-8b/lora/sft\ntemplate: llama3\ntrust_remote_code: true\nexport_dir: output/llama3_lora_sft\nexport_size: 5\nexport_device: cpu\nexport_legacy_format: false\n",
    # torchtune recipes/configs/eleuther_evaluation.yaml and generation.yaml (abridged: their keys that matter)
    "eval.yaml": "model:\n  _component_: torchtune.models.llama3.llama3_8b\ncheckpointer:\n  _component_: torchtune.training.FullModelHFCheckpointer\ntokenizer:\n  _component_: torchtune.models.llama3.llama3_tokenizer\n  max_seq_len: null\ntasks: [\"truthfulqa_mc2\"]\nlimit: null\nbatch_size: 8\nenable_kv_cache: True\ndtype: bf16\n",
    "generation.yaml": "model:\n  _component_: torchtune.models.llama2.llama2_7b\ntokenizer:\n  _component_: torchtune.models.llama2.llama2_tokenizer\ndtype: bf16\nprompt:\n  user: \"Tell me a joke.\"\nmax_new_tokens: 300\ntemperature: 0.6\n",
}


def test_configs_that_train_nothing_get_a_note_and_no_figure(tmp_path):
    for name, text in NOT_TRAINING.items():
        (tmp_path / name).write_text(text)
    out = memfit("check", "--format", "json", "--device", "H100", *sorted(NOT_TRAINING), cwd=tmp_path)
    assert out.returncode == 0, out.stdout
    for entry in json.loads(out.stdout)["files"]:
        assert entry["footprint"] is None and "peak" not in entry, entry["path"]
        assert [(d["code"], d["severity"]) for d in entry["diagnostics"]] == [("not-training", "information")], entry
    text = memfit("check", "--device", "H100", "eval.yaml", cwd=tmp_path).stdout
    assert "eval.yaml:8:1: information[not-training] tasks: an evaluation, generation or quantization recipe config, which trains nothing" in text
    # the hook sees them as what they are, not as skipped files
    hook = memfit("check", "--skip-unrecognized", "--device", "H100", "merge.yaml", cwd=tmp_path)
    assert hook.returncode == 0 and "skipped" not in hook.stdout and "not-training" in hook.stdout


def test_a_deepspeed_json_alone_takes_the_trainers_defaults_for_auto(project):
    ds = project / "ds.json"
    ds.write_text('{\n  "train_micro_batch_size_per_gpu": "auto",\n  "gradient_accumulation_steps": "auto",\n  "zero_optimization": {"stage": 3},\n  "bf16": {"enabled": "auto"}\n}\n')
    out = memfit("check", "--format", "json", "--model", "llama-3-8b.json", "--device", "H100", "--gpus", "8", "ds.json", cwd=project)
    entry = json.loads(out.stdout)["files"][0]
    assert entry["footprint"] is not None and not [d for d in entry["diagnostics"] if d["severity"] == "error" and d["code"] != "budget-exceeded"], entry["diagnostics"]
    warned = {d["range"]["start"]["line"]: d["message"] for d in entry["diagnostics"] if d["code"] == "not-modelled"}
    assert "alone, memfit takes the Trainer's default 8" in warned[1] and "default 1" in warned[2] and "off: float32" in warned[4]
    # the micro-batch that "auto" stands for is the Trainer's default: the same figures as writing 8
    ds.write_text('{\n  "train_micro_batch_size_per_gpu": 8,\n  "gradient_accumulation_steps": 1,\n  "zero_optimization": {"stage": 3}\n}\n')
    written = json.loads(memfit("check", "--format", "json", "--model", "llama-3-8b.json", "--device", "H100", "--gpus", "8", "ds.json", cwd=project).stdout)["files"][0]
    assert written["footprint"] == entry["footprint"]


def test_a_file_that_is_no_config_has_no_input_format(tmp_path):
    (tmp_path / "data.json").write_text('{"rows": [1, 2]}')
    entry = json.loads(memfit("check", "--format", "json", tmp_path / "data.json").stdout)["files"][0]
    assert entry["input_format"] is None and entry["diagnostics"][0]["code"] == "not-a-config"


def test_fit_gives_every_key_the_same_units():
    seq = memfit("fit", "--vary", "seq_len", ROOT / "examples" / "gpt2-small.yaml").stdout
    assert re.search(r"seq_len ≤ \d+ fits \(\d+\.\d\d GiB = [\d,]+ B of \d+\.\d\d GiB = [\d,]+ B\); \d+ needs \d+\.\d\d GiB", seq), seq
    batch = memfit("fit", ROOT / "examples" / "gpt2-small.yaml").stdout
    assert re.search(r"micro_batch ≤ \d+ fits \(\d+\.\d\d GiB of \d+\.\d\d GiB\)", batch), batch


def test_the_launch_configs_fsdp_is_no_unmodelled_key(project):
    (project / "launch.yaml").write_text("distributed_type: FSDP\nnum_processes: 8\nmixed_precision: bf16\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n")
    (project / "lf.yaml").write_text("model_name_or_path: ./llama-3-8b.json\nstage: sft\nfinetuning_type: full\ncutoff_len: 1024\nper_device_train_batch_size: 1\nbf16: true\nfsdp: full_shard\n")
    alone = memfit("check", "--device", "H100", "lf.yaml", cwd=project).stdout
    assert "lf.yaml:7:1: warning[not-modelled] fsdp:" in alone
    launched = memfit("check", "--device", "H100", "--launch", "launch.yaml", "lf.yaml", cwd=project)
    assert launched.returncode == 0 and "warning" not in launched.stdout and "GPU rank 0 of 8" in launched.stdout, launched.stdout


def test_suggest_on_an_axolotl_file_finds_what_its_conversion_finds(project):
    native = project / "ax" / "ax.yml"
    native.write_text("base_model: ../llama-3-8b.json\nsequence_len: 4096\nmicro_batch_size: 4\nbf16: true\nadapter: lora\nlora_r: 8\nlora_target_linear: true\n")
    out = memfit("check", "--suggest", "--device", "RTX-4090", native)
    assert "no change memfit knows of" not in out.stdout, out.stdout
    assert "checkpointing: full (recompute each layer in backward) + micro_batch 4 → 1, gradient_accumulation 1 → 4" in out.stdout
    assert f"{native}:3:19: replace with '1'" in out.stdout and "insert 'gradient_checkpointing: true'" in out.stdout
    assert "insert 'gradient_accumulation_steps: 4'" in out.stdout
    # the edits, made, give a config that fits
    text = native.read_text().replace("micro_batch_size: 4", "micro_batch_size: 1") + "gradient_checkpointing: true\ngradient_accumulation_steps: 4\n"
    native.write_text(text)
    assert memfit("check", "--device", "RTX-4090", native).returncode == 0


def test_suggest_on_a_torchtune_file_edits_its_own_keys(tmp_path):
    """torchtune spells checkpointing enable_activation_checkpointing (and the micro-batch batch_size): --suggest's
    fix is an edit of that key, not "no key of this file", and the edited file fits."""
    native = tmp_path / "kd_single_device.yaml"
    source = ROOT / "tests" / "read" / "torchtune_configs" / "llama3_2_8B_to_1B_KD_lora_single_device.yaml"
    native.write_text(source.read_text().replace("max_seq_len: null", "max_seq_len: 2048"))
    out = memfit("check", "--suggest", "--budget", "40GiB", native)
    assert out.returncode == 1 and "checkpointing: full (recompute each layer in backward)" in out.stdout, out.stdout
    line = next(i for i, row in enumerate(native.read_text().splitlines(), 1) if row.startswith("enable_activation_checkpointing:"))
    assert f"{native}:{line}:34: replace with 'true'" in out.stdout, out.stdout
    native.write_text(native.read_text().replace("enable_activation_checkpointing: False", "enable_activation_checkpointing: true"))
    assert memfit("check", "--budget", "40GiB", native).returncode == 0


def test_output_never_overwrites_a_file_the_check_reads(project):
    config = project / "ax" / "run.yml"
    config.write_text("base_model: ../llama-3-8b.json\nmicro_batch_size: 1\nsequence_len: 512\n")
    (project / "ax" / "memfit.toml").write_text('device = "H100"\n')
    model = (project / "llama-3-8b.json").read_bytes()
    for command in ("check", "explain"):
        for target in (project / "llama-3-8b.json", project / "ax" / "memfit.toml"):
            before = target.read_bytes()
            out = memfit(command, "-o", target, config)
            assert out.returncode == 2 and "refusing to write over it" in out.stderr, out.stderr
            assert target.read_bytes() == before
    assert (project / "llama-3-8b.json").read_bytes() == model


def test_a_newline_in_a_file_name_injects_nothing_into_convert(project):
    name = project / "ax" / "x\nmemfit: 7\nparallel: {data: 99}\n#.yml"
    name.write_text("base_model: ../llama-3-8b.json\nmicro_batch_size: 1\nsequence_len: 512\n")
    out = memfit("convert", "--device", "H100", name)
    assert out.returncode == 0, out.stderr
    import yaml

    doc = yaml.safe_load(out.stdout)
    assert doc["memfit"] == 1 and "parallel" not in doc
    assert out.stdout.splitlines()[0].startswith("# memfit config read from ") and "\\nmemfit: 7" in out.stdout.splitlines()[0]


def test_a_deeply_nested_config_json_is_a_positioned_diagnostic(project):
    folder = project / "deep"
    folder.mkdir()
    raw = (MODELS / "llama-3-8b.json").read_text()
    (folder / "config.json").write_text(raw.rstrip().rstrip("}") + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    config = project / "ax.yml"
    config.write_text("base_model: ./deep\nmicro_batch_size: 1\nsequence_len: 512\n")
    out = memfit("check", "--device", "H100", config)
    assert out.returncode == 1 and "internal" not in out.stdout and "RecursionError" not in out.stdout, out.stdout
    assert f"{folder / 'config.json'}:1:1: error[json-syntax] invalid JSON: nested too deeply (referenced from {config}:1:13)" in out.stdout


def test_a_layer_name_cannot_hide_the_rest_of_the_html_report(tmp_path):
    hostile = tmp_path / "a.yaml"
    hostile.write_text(
        'memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\nmodel:\n  input_shape: [8]\n  batch_size: 2\n  layers:\n'
        '    - {name: "<!--<script>", type: Dense, units: 8}\n    - {name: "</script><b>x</b>&amp;", type: Dense, units: 4}\n'
        "training: {micro_batch: 2}\n"
    )
    plain = tmp_path / "b.yaml"
    plain.write_text("memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\nparameters: [[1000, 1000]]\n")
    out = memfit("explain", "--format", "html", hostile, plain)
    assert out.returncode == 0, out.stderr
    page = out.stdout
    blocks = re.findall(r'<script type="application/json" class="memfit-data">(.*?)</script>', page, re.S)
    assert len(blocks) == 2  # both configs' data, the second not swallowed by the first
    assert all("<" not in block and ">" not in block and "&" not in block for block in blocks)
    assert any("<!--<script>" in json.dumps(json.loads(block)) for block in blocks)  # the name itself is kept, as data
    assert page.index(f'data-path="{hostile}"') < page.index(f'data-path="{plain}"')


def test_the_html_report_is_bounded_with_a_clear_error(tmp_path):
    config = tmp_path / "m.yaml"
    config.write_text("memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\nparameters: [[1000, 1000]]\n")
    out_file = tmp_path / "report.html"
    # the bound, made small here, as a report past it: nothing written, exit 2 and why
    script = (
        "import sys; import memfit.cli.runner as r; r.HTML_PER_CONFIG = 1000; from memfit.cli.main import main; "
        f"sys.exit(main(['explain', '--format', 'html', '-o', {str(out_file)!r}, {str(config)!r}]))"
    )
    small = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert small.returncode == 2 and not out_file.exists(), small.stderr
    assert "over its bound of" in small.stderr and "(1,000 per config + 16 x the configs'" in small.stderr and "nothing was written" in small.stderr
    # the real bound: this report is far inside it
    assert memfit("explain", "--format", "html", "-o", out_file, config).returncode == 0 and out_file.stat().st_size < 2 * 2**20


# LLaMA-Factory's v1 format (its examples/v1/train_lora/train_lora_sft.yaml, shortened): `model` and plugin configs
LLAMA_FACTORY_V1 = """\
model: Qwen/Qwen3-4B
model_class: llm

peft_config:
  name: lora
  r: 16
  target_modules: all

dist_config:
  name: fsdp2

train_dataset: data/v1_sft_demo.yaml
micro_batch_size: 1
cutoff_len: 2048
"""


def test_a_llama_factory_v1_config_is_read_by_its_own_reader(project):
    """LLaMA-Factory's v1 format (USE_V1=1) is recognised by its keys and read (read/native/llamafactory_v1.py): named
    alone, in a folder, or under --skip-unrecognized (the hook), a model it cannot resolve is a positioned error at
    `model` (the gate does not pass it), and with the model mapped it gets a figure."""
    (project / "lf").mkdir()
    (project / "lf" / "train_lora_sft.yaml").write_text(LLAMA_FACTORY_V1)
    for args in (["lf/train_lora_sft.yaml"], ["--skip-unrecognized", "lf/train_lora_sft.yaml"], ["--skip-unrecognized", "lf"]):
        out = memfit("check", "--device", "H100", *args, cwd=project)
        assert out.returncode == 1, (args, out.stdout)
        assert "lf/train_lora_sft.yaml:1:8: error[model-not-found] model 'Qwen/Qwen3-4B' not found" in out.stdout, out.stdout
        assert "Traceback" not in out.stderr
    (project / "lf" / "memfit.toml").write_text('[models]\n"Qwen/Qwen3-4B" = "../llama-3-8b.json"\n')
    [entry] = json.loads(memfit("check", "--format", "json", "--device", "H100", "lf/train_lora_sft.yaml", cwd=project).stdout)["files"]
    assert entry["input_format"] == "llama-factory" and entry["footprint"]["total"] > 0
    assert entry["diagnostics"] == []  # the trainer's second loss (compute_log_probs) priced: training.second_loss
    # a file that only shares the `model` key stays none of memfit's
    (project / "lf" / "train_lora_sft.yaml").write_text("model: Qwen/Qwen3-4B\ntemperature: 0.7\n")
    other = memfit("check", "--skip-unrecognized", "--device", "H100", "lf/train_lora_sft.yaml", cwd=project)
    assert other.returncode == 0 and "native-config" not in other.stdout and "1 skipped" in other.stdout, other.stdout


def test_a_plain_check_never_contacts_the_hub_for_a_name_inside_config_json(tmp_path):
    """A config.json that names a hub checkpoint inside it (DETR's `backbone`: transformers' load_backbone fetches its
    config, or its weights with use_pretrained_backbone) is built by the [trace] path with huggingface_hub offline: a
    plain check (no --online) sends no request to HF_ENDPOINT, a loopback server that counts them here."""
    import http.server
    import threading

    pytest.importorskip("transformers")
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 -- http.server's name
            hits.append(self.path)
            self.send_response(404)
            self.end_headers()

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (tmp_path / "config.json").write_text(json.dumps({
            "model_type": "detr", "architectures": ["DetrForObjectDetection"], "use_timm_backbone": False, "backbone": "acme/resnet-50",
            "use_pretrained_backbone": True, "d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
            "decoder_attention_heads": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "num_queries": 4}))
        (tmp_path / "run.yaml").write_text("memfit: 1\ndevice: {memory: 80 GiB}\noptimizer: adamw\nmodel: {hf_config: config.json}\ntraining: {micro_batch: 1, seq_len: 16}\n")
        env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}", "HF_HOME": str(tmp_path / "hf")}
        env.pop("HF_HUB_OFFLINE", None)
        env.pop("TRANSFORMERS_OFFLINE", None)
        out = subprocess.run([sys.executable, "-m", "memfit", "check", "run.yaml"], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    finally:
        server.shutdown()
        server.server_close()
    assert hits == [], hits
    assert "Traceback" not in out.stderr and out.returncode in (0, 1) and "config.json:" in out.stdout, out.stdout + out.stderr


def test_a_rank_holding_a_share_is_never_said_to_gather_a_negative_amount(tmp_path):
    """A pipeline stage's worst moment can hold less than its footprint's categories at full size (its micro-batches'
    activations are not all alive at once): the budget message then names that total, never a negative 'gathered for a
    moment' (the issue's '-11.43 GiB'); a layout that does gather says what it gathers, a positive amount."""
    shutil.copy(MODELS / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    doc = "memfit: 1\ndevice: {{memory: 10 GiB}}\noptimizer: adamw\nmodel: {{hf_config: llama-3-8b.json}}\ntraining: {{micro_batch: 4, seq_len: 2048, gradient_accumulation: 4}}\nparallel: {}\n"
    (tmp_path / "pp.yaml").write_text(doc.format("{pipeline: 4}"))
    (tmp_path / "z3.yaml").write_text(doc.format("{data: 2, zero: 3}").replace("micro_batch: 4, seq_len: 2048", "micro_batch: 1, seq_len: 512"))
    (tmp_path / "dp.yaml").write_text(doc.format("{data: 8}"))
    [pp, z3, dp] = json.loads(memfit("check", "--format", "json", "pp.yaml", "z3.yaml", "dp.yaml", cwd=tmp_path).stdout)["files"]
    assert pp["peak"]["bytes"] < pp["footprint"]["total"] and z3["peak"]["bytes"] > z3["footprint"]["total"]  # the two cases
    assert any(z3["peak"]["gathered"].values()) and not any(dp["peak"]["gathered"].values()) and dp["peak"]["bytes"] > dp["footprint"]["total"]
    out = memfit("check", "pp.yaml", "z3.yaml", cwd=tmp_path)
    assert out.returncode == 1 and "gathered for a moment -" not in out.stdout, out.stdout
    [pp_line] = [line for line in out.stdout.splitlines() if line.startswith("pp.yaml") and "budget-exceeded" in line]
    [z3_line] = [line for line in out.stdout.splitlines() if line.startswith("z3.yaml") and "budget-exceeded" in line]
    assert "the four categories at full size total" in pp_line and "gathered for a moment" not in pp_line
    assert re.search(r"gathered for a moment [0-9,]+ B", z3_line), z3_line
    # DDP gathers nothing (its buckets and transients are above the categories' total): not called gathered
    out = memfit("check", "dp.yaml", cwd=tmp_path)
    assert "gathered for a moment" not in out.stdout and "the four categories at full size total" in out.stdout, out.stdout
