"""Every option of every subcommand, run through the CLI with its documented meaning checked (its --help line and
docs/cli.md), and a registry that names, for each option the parser has, the test that runs it: a new flag without a
test fails `test_every_flag_of_every_subcommand_has_a_test`.

Figures are written as arithmetic here: H100-80GB is 81,559 MiB = 85,520,809,984 B (nvidia-smi's figure,
tests/ledger/test_peak.py); a tensor list of one [1000, 1000] fp32 weight with Adam is 4,000,000 B of parameters,
as much gradient and 8,000,000 B of state: 16,000,000 B."""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
H100 = 81559 * 2**20
GiB = 2**30
TENSORS = "memfit: 1\ndevice: {{memory: {memory}}}\noptimizer: adam\nparameters:\n  - {{name: w, shape: [1000, 1000]}}\n"
DEEPSPEED = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}


def memfit(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300, check=False,
                          env=env)


def entry(*args, cwd=None) -> dict:
    done = memfit("check", "--format", "json", *args, cwd=cwd)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return json.loads(done.stdout)["files"][0]


@pytest.fixture
def native(tmp_path) -> Path:
    """A DeepSpeed JSON alone (ZeRO-3, optimizer offload) beside a model's config.json."""
    shutil.copy(ROOT / "examples" / "models" / "llama-3-8b.json", tmp_path / "llama-3-8b.json")
    (tmp_path / "ds.json").write_text(json.dumps(DEEPSPEED))
    return tmp_path / "ds.json"


# --- check: the budget's flags ---------------------------------------------------------------------------------
def test_reserve_applies_where_the_config_names_no_reserve(tmp_path):
    """--reserve BYTES|PERCENT: "device memory kept free, where a config names none" (a device section without a
    reserve included); a config's own device.reserve wins."""
    path = tmp_path / "t.yaml"
    path.write_text(TENSORS.format(memory="10 GiB"))
    assert entry(path)["budget"] == 10 * GiB
    assert entry("--reserve", "1GiB", path)["budget"] == 9 * GiB
    assert entry("--reserve", "10%", path)["budget"] == 10 * GiB - GiB  # 10% of 10 GiB
    path.write_text(TENSORS.format(memory="10 GiB") .replace("memory: 10 GiB", "memory: 10 GiB, reserve: 2 GiB"))
    assert entry("--reserve", "1GiB", path)["budget"] == 8 * GiB
    assert memfit("check", "--reserve", "12XB", path).returncode == 2


def test_overhead_is_taken_off_a_tensor_lists_budget_and_live_in_a_runs_peak(tmp_path, native):
    """--overhead auto|BYTES: "runtime overhead": a tensor list's budget loses it; a run (a training step, on one GPU
    or per rank) holds it in every phase of its peak, and the budget stays the device's (counted once)."""
    path = tmp_path / "t.yaml"
    path.write_text(TENSORS.format(memory="10 GiB"))
    assert entry("--overhead", "512MiB", path)["budget"] == 10 * GiB - 512 * 2**20
    flags = ["--model", "./llama-3-8b.json", "--device", "H100-80GB", "--gpus", "16"]
    plain, loaded = entry(*flags, native, cwd=native.parent), entry(*flags, "--overhead", "2GiB", native, cwd=native.parent)
    assert plain["budget"] == loaded["budget"] == H100
    assert loaded["peak"]["live"]["overhead"] == 2 * GiB and loaded["peak"]["bytes"] - plain["peak"]["bytes"] == 2 * GiB
    auto = entry(*flags, "--overhead", "auto", native, cwd=native.parent)
    # the preset's named lines (CUDA context, cuBLAS workspaces) plus the allocator's 512-byte rounding of what is live
    assert auto["budget"] == H100 and auto["peak"]["live"]["overhead"] > 256 * 2**20


def test_warn_at_moves_the_near_budget_warning(tmp_path):
    """--warn-at PERCENT: warn above this share of the budget (default 90%). 16,000,000 B of 20,000,000 B is 80%."""
    path = tmp_path / "t.yaml"
    path.write_text(TENSORS.format(memory="20000000 B"))
    assert entry(path)["diagnostics"] == []
    (d,) = entry("--warn-at", "75%", path)["diagnostics"]
    assert (d["code"], d["severity"]) == ("near-budget", "warning") and "16,000,000 B" in d["message"]
    assert entry("--warn-at", "85%", path)["diagnostics"] == []
    assert memfit("check", "--warn-at", "0.9", path).returncode == 2  # a share takes its sign (docs/cli.md)


def test_jobs_spread_files_over_processes_and_give_the_same_report_invariant(tmp_path):
    """-j/--jobs N: parallel processes for many files. The report is the files' in order, whatever N (an invariant:
    memfit against memfit); N is counted, not guessed: 0 is "by file count and cores", a negative is a usage error."""
    paths = []
    for i in range(6):
        paths.append(tmp_path / f"c{i}.yaml")
        paths[-1].write_text(TENSORS.format(memory=f"{15 + i}000000 B"))
    one = memfit("check", "--format", "json", "--jobs", "1", *paths)
    two = memfit("check", "--format", "json", "-j", "2", *paths)
    assert one.returncode == two.returncode == 1  # c0 (15,000,000 B) is over, the rest fit
    assert json.loads(one.stdout) == json.loads(two.stdout)
    assert [f["path"] for f in json.loads(two.stdout)["files"]] == [str(p) for p in paths]
    assert memfit("check", "-j", "-1", *paths).returncode == 2


def test_gpus_per_node_and_host_memory_size_the_host_check(native):
    """--gpus-per-node N: GPUs per node (a node's host holds that many ranks' offloaded state); --host-memory BYTES:
    host RAM per node, checked when something is offloaded."""
    flags = ["--model", "./llama-3-8b.json", "--device", "H100-80GB", "--gpus", "16"]
    four = entry(*flags, "--gpus-per-node", "4", "--host-memory", "1TiB", native, cwd=native.parent)
    eight = entry(*flags, "--gpus-per-node", "8", "--host-memory", "1TiB", native, cwd=native.parent)
    assert (four["host"]["gpus"], eight["host"]["gpus"]) == (4, 8)
    assert eight["host"]["total"] == 2 * four["host"]["total"] > 0
    assert not [d for d in four["diagnostics"] if d["code"].startswith(("host", "no-host"))]
    small = entry(*flags, "--gpus-per-node", "4", "--host-memory", "1GiB", native, cwd=native.parent)
    (d,) = [d for d in small["diagnostics"] if d["code"] == "host-budget-exceeded"]
    assert f"{four['host']['total']:,} B" in d["message"] and "1,073,741,824 B" in d["message"]


def test_no_settings_ignores_the_projects_memfit_toml(tmp_path):
    """--no-settings: ignore [tool.memfit] in pyproject.toml and memfit.toml. The settings name the device; without
    them the config has no budget."""
    (tmp_path / "memfit.toml").write_text('device = "H100-80GB"\n')
    path = tmp_path / "t.yaml"
    path.write_text("memfit: 1\noptimizer: adam\nparameters:\n  - {name: w, shape: [1000, 1000]}\n")
    assert entry(path)["budget"] == H100
    done = memfit("check", "--format", "json", "--no-settings", path)
    assert done.returncode == 1 and [d["code"] for d in json.loads(done.stdout)["files"][0]["diagnostics"]] == ["no-budget"]


# --- the same flags on explain, fit, diff and convert ----------------------------------------------------------
SETTINGS_FLAGS = ["--input-format", "deepspeed", "--model", "./llama-3-8b.json", "--device", "H100-80GB", "--gpus", "16", "--gpus-per-node", "4",
                  "--host-memory", "1TiB", "--reserve", "1GiB", "--overhead", "2GiB", "--no-settings", "--online", "--max-file-size", "1MiB"]
BUDGET_FLAGS = ["--budget", "90GiB", "--warn-at", "50%"]


def _git(repo: Path, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args], cwd=repo, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("command", ["explain", "fit", "diff"])
def test_the_settings_and_budget_flags_mean_in_each_command_what_they_mean_in_check_invariant(native, command):
    """explain, fit and diff take check's flags (`common` in cli/main.py): with every one of them given, the budget,
    peak and host each prints are check's (an invariant: memfit against memfit; check's meaning of each flag is
    asserted by the tests above). --online fetches nothing here (the model is found locally), --max-file-size is
    above the files, --no-settings has none to ignore: each is taken and changes nothing."""
    cwd = native.parent
    flags = [*SETTINGS_FLAGS, *BUDGET_FLAGS]
    checked = entry(*flags, native, cwd=cwd)
    assert checked["budget"] == 90 * GiB and checked["host"]["gpus"] == 4 and checked["peak"]["live"]["overhead"] == 2 * GiB
    assert [d["code"] for d in checked["diagnostics"] if d["code"] == "near-budget"] == ["near-budget"]  # 70.8 GB of 90 GiB > 50%
    if command == "explain":
        done = memfit("explain", "--format", "json", *flags, native, cwd=cwd)
        assert done.returncode == 0, done.stdout + done.stderr
        shown = json.loads(done.stdout)["files"][0]
        assert {k: shown[k] for k in ("footprint", "budget", "host")} == {k: checked[k] for k in ("footprint", "budget", "host")}
        assert shown["peak"]["bytes"] == checked["peak"]["bytes"] and shown["diagnostics"] == checked["diagnostics"]
    elif command == "fit":
        done = memfit("fit", "--format", "json", *flags, native, cwd=cwd)
        assert done.returncode == 0, done.stdout + done.stderr
        answer = json.loads(done.stdout)["files"][0]
        assert answer["budget"] == checked["budget"] and answer["max"] >= 1
        assert answer["bytes_at_max"] >= checked["peak"]["bytes"] or answer["max"] == 1 and answer["bytes_at_max"] == checked["peak"]["bytes"]
    else:
        _git(cwd, "init", "-q")
        _git(cwd, "add", "-A")
        _git(cwd, "commit", "-qm", "base")
        done = memfit("diff", "--format", "json", *flags, "HEAD", native.name, cwd=cwd)
        assert done.returncode == 0, done.stdout + done.stderr
        (row,) = json.loads(done.stdout)["files"]
        assert row["gated"] == {"figure": "peak", "before": checked["peak"]["bytes"], "after": checked["peak"]["bytes"], "delta": 0}, row
        assert row["after_peak"]["live"] == checked["peak"]["live"] and row["status"] == {"before": "pass", "after": "pass"}


def test_convert_writes_what_the_flags_mean(native):
    """convert takes the settings flags: the memfit config it prints carries each one where it belongs (device preset,
    reserve and overhead; the world size and GPUs per node; the host's memory; the model), and checking it gives
    check's figures on the native file with the same flags."""
    cwd = native.parent
    done = memfit("convert", *SETTINGS_FLAGS, native, cwd=cwd)
    assert done.returncode == 0, done.stderr
    doc = yaml.safe_load(done.stdout)
    assert doc["device"] == {"preset": "H100-80GB", "reserve": "1GiB", "overhead": "2GiB"}
    assert doc["parallel"]["data"] == 16 and doc["parallel"]["gpus_per_node"] == 4 and doc["parallel"]["zero"] == 3
    assert doc["host"] == {"memory": 2**40} and doc["model"]["hf_config"].endswith("llama-3-8b.json")
    (cwd / "converted.yaml").write_text(done.stdout)
    a, b = entry(*SETTINGS_FLAGS, native, cwd=cwd), entry("converted.yaml", cwd=cwd)
    assert {k: a[k] for k in ("footprint", "budget", "host")} == {k: b[k] for k in ("footprint", "budget", "host")}
    assert a["peak"]["bytes"] == b["peak"]["bytes"] == b["peak"]["bytes"]
    # a launch config: the world size and sharding (--launch FILE)
    launch = cwd / "accelerate.yaml"
    launch.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 2\nnum_processes: 16\n")
    done = memfit("convert", "--model", "./llama-3-8b.json", "--device", "H100-80GB", "--launch", launch, native, cwd=cwd)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["parallel"]["data"] == 16


def test_convert_error_paths(tmp_path, native):
    """convert FILE: one native config; a file that cannot be read, is too large, is no config or is read as another
    format is a positioned error on stderr and exit 1; a usage error exit 2."""
    assert memfit("convert").returncode == 2
    assert memfit("convert", native, native).returncode == 2  # one FILE
    missing = memfit("convert", tmp_path / "nowhere.json")
    assert missing.returncode == 1 and "nowhere.json" in missing.stderr and missing.stdout == ""
    big = memfit("convert", "--max-file-size", "10B", native)
    assert big.returncode == 1 and "limit" in big.stderr and big.stdout == ""
    bad = tmp_path / "bad.yml"
    bad.write_text("base_model: ./llama-3-8b.json\nmicro_batch_size: two\n")
    done = memfit("convert", "--device", "H100-80GB", bad)
    assert done.returncode == 1 and f"{bad}:2:19: error[native-config] micro_batch_size is 'two'" in done.stderr
    forced = memfit("convert", "--input-format", "accelerate", "--model", "./llama-3-8b.json", native, cwd=native.parent)
    assert forced.returncode in (0, 1) and "deepspeed" not in forced.stdout.split("\n")[0].split("(")[-1]
    assert memfit("convert", "--input-format", "nope", native).returncode == 2


# --- fit --vary gradient_accumulation, diff --budget, explain --output --------------------------------------------
def test_fit_varies_gradient_accumulation(tmp_path):
    """fit --vary KEY: the largest value of the training key that fits. On one GPU gradient accumulation keeps the
    gradients from one micro-batch to the next: 1 and 2 differ (checked below through check), 2 and more do not, so
    every value fits and fit says so (no value past its answer fails: bytes_at_next is null)."""
    shutil.copy(ROOT / "examples" / "models" / "gpt2.json", tmp_path / "gpt2.json")
    path = tmp_path / "run.yaml"
    path.write_text("memfit: 1\ndevice: {memory: 40 GiB}\noptimizer: adamw\nmodel: {hf_config: gpt2.json}\n"
                    "training: {micro_batch: 2, seq_len: 256, gradient_accumulation: 4}\n")
    done = memfit("fit", "--format", "json", "--vary", "gradient_accumulation", path)
    assert done.returncode in (0, 1), done.stderr
    answer = json.loads(done.stdout)["files"][0]
    assert answer["vary"] == "gradient_accumulation" and done.returncode == 0
    checked = entry(path)
    one = path.with_name("one.yaml")
    one.write_text(path.read_text().replace("gradient_accumulation: 4", "gradient_accumulation: 1"))
    assert entry(one)["peak"]["bytes"] < checked["peak"]["bytes"]  # accumulation holds the gradients between micro-batches
    assert answer["budget"] == checked["budget"] == 40 * GiB
    assert answer["bytes_at_max"] == checked["peak"]["bytes"] and answer["bytes_at_next"] is None
    text = memfit("fit", "--vary", "gradient_accumulation", path).stdout
    assert text.startswith(f"{path}: gradient_accumulation ≤ ") and "fits" in text


def test_diff_budget_is_the_budget_of_both_sides(tmp_path):
    """diff --budget BYTES: both revisions are checked against it (as check --budget): a config that fits its own
    device fails at both sides under a smaller --budget."""
    repo = tmp_path / "repo"
    repo.mkdir()
    path = repo / "t.yaml"
    path.write_text(TENSORS.format(memory="1 GiB"))
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    path.write_text(TENSORS.format(memory="1 GiB").replace("[1000, 1000]", "[1000, 2000]"))
    free = memfit("diff", "--format", "json", "HEAD", "t.yaml", cwd=repo)
    tight = memfit("diff", "--format", "json", "--budget", "20000000B", "HEAD", "t.yaml", cwd=repo)
    assert free.returncode == 0, free.stdout + free.stderr
    assert json.loads(free.stdout)["files"][0]["status"] == {"before": "pass", "after": "pass"}
    # 16,000,000 B before and 32,000,000 B after: the after side is over 20,000,000 B, the before side within it
    (row,) = json.loads(tight.stdout)["files"]
    assert (row["before"]["total"], row["after"]["total"]) == (16_000_000, 32_000_000)
    assert row["status"] == {"before": "pass", "after": "fail"}, row
    assert tight.returncode == 0, tight.stdout  # diff reports; only --fail-on-growth gates (docs/fit-and-diff.md)


def test_explain_output_writes_the_file(tmp_path):
    """explain --output FILE (-o): the report goes to FILE, nothing to stdout."""
    path = tmp_path / "t.yaml"
    path.write_text(TENSORS.format(memory="1 GiB"))
    out = tmp_path / "report.txt"
    done = memfit("explain", "--output", out, path)
    assert done.returncode == 0 and done.stdout == ""
    assert re.search(r"^total +16,000,000 +15\.26 MiB$", out.read_text(), re.MULTILINE), out.read_text()
    done = memfit("explain", "-o", tmp_path / "r.json", "--format", "json", path)
    assert json.loads((tmp_path / "r.json").read_text())["files"][0]["footprint"]["total"] == 16_000_000


# --- the registry -------------------------------------------------------------------------------------------------
T = "tests/cli/test_flags.py::"
SHARED_ELSEWHERE = {  # (command, flag): the test that runs it
    ("(memfit)", "--version"): "tests/cli/test_cli.py::test_version_and_module_entry",
    ("check", "--budget"): "tests/cli/test_cli.py::test_budget_flag_overrides",
    ("check", "--device"): "tests/read/test_native.py::test_deepspeed_alone_and_a_launch_config",
    ("check", "--gpus"): "tests/read/test_native.py::test_deepspeed_alone_and_a_launch_config",
    ("check", "--launch"): "tests/read/test_native.py::test_deepspeed_alone_and_a_launch_config",
    ("check", "--model"): "tests/read/test_native.py::test_deepspeed_alone_and_a_launch_config",
    ("check", "--input-format"): "tests/read/test_native.py::test_bad_input_is_positioned",
    ("check", "--online"): "tests/read/test_native.py::test_online_fetches_config_json_alone_from_the_endpoint",
    ("check", "--max-file-size"): "tests/project/test_arch.py::test_a_file_over_the_size_limit_is_refused_and_the_limit_can_be_raised",
    ("check", "--format"): "tests/report/test_ci_formats.py::test_github_annotations_exact",
    ("check", "--skip-unrecognized"): "tests/report/test_ci_formats.py::test_sarif_content",
    ("check", "--output"): "tests/cli/test_cli.py::test_no_traceback_for_an_unreadable_output",
    ("check", "-o"): "tests/check/test_hostile.py::test_a_full_device_is_named_in_the_message",
    ("check", "--summary-md"): "tests/report/test_ci_formats.py::test_summary_md_appends_a_table",
    ("check", "--suggest"): "tests/whatif/test_fit.py::test_suggest_gives_the_largest_batch_that_fits_as_an_edit",
    ("explain", "--color"): "tests/cli/test_cli.py::test_explain_over_budget_exits_1_and_says_by_how_much",
    ("explain", "--format"): "tests/report/test_report_html.py::test_the_report_is_self_contained_and_small",
    ("explain", "--skip-unrecognized"): "tests/check/test_hostile.py::test_the_hook_and_the_action_never_block_on_special_files",
    ("fit", "--format"): "tests/whatif/test_fit.py::test_fit_is_exact_against_check",
    ("diff", "--format"): "tests/whatif/test_diff.py::test_diff_between_two_commits_in_json",
    ("diff", "--fail-on-growth"): "tests/whatif/test_diff.py::test_markdown_largest_growth_first_and_fail_on_growth",
    ("diff", "--max-file-size"): "tests/whatif/test_diff.py::test_both_sides_go_through_checks_input_checks",
    ("lsp", "--tcp"): "tests/editor/test_lsp.py::test_tcp_serves_the_same_diagnostics",
    ("check", "--allow-empty"): "tests/cli/test_native_gate.py::test_a_folder_with_no_config_is_not_a_pass",
    ("explain", "--allow-empty"): "tests/cli/test_native_gate.py::test_a_folder_with_no_config_is_not_a_pass",
    ("runs", "--format"): "tests/report/test_runs.py::test_the_table_the_median_the_worst_and_a_low_run",
}
REGISTRY = dict(SHARED_ELSEWHERE)
REGISTRY.update({
    ("check", "--reserve"): T + "test_reserve_applies_where_the_config_names_no_reserve",
    ("check", "--overhead"): T + "test_overhead_is_taken_off_a_tensor_lists_budget_and_live_in_a_runs_peak",
    ("check", "--warn-at"): T + "test_warn_at_moves_the_near_budget_warning",
    ("check", "--jobs"): T + "test_jobs_spread_files_over_processes_and_give_the_same_report_invariant",
    ("check", "-j"): T + "test_jobs_spread_files_over_processes_and_give_the_same_report_invariant",
    ("check", "--gpus-per-node"): T + "test_gpus_per_node_and_host_memory_size_the_host_check",
    ("check", "--host-memory"): T + "test_gpus_per_node_and_host_memory_size_the_host_check",
    ("check", "--no-settings"): T + "test_no_settings_ignores_the_projects_memfit_toml",
    ("explain", "--output"): T + "test_explain_output_writes_the_file",
    ("explain", "-o"): T + "test_explain_output_writes_the_file",
    ("fit", "--vary"): T + "test_fit_varies_gradient_accumulation",
    ("diff", "--budget"): T + "test_diff_budget_is_the_budget_of_both_sides",
})
_SAME = T + "test_the_settings_and_budget_flags_mean_in_each_command_what_they_mean_in_check_invariant"
for _command in ("explain", "fit", "diff"):
    for _flag in SETTINGS_FLAGS + BUDGET_FLAGS:
        if _flag.startswith("--"):
            REGISTRY.setdefault((_command, _flag), _SAME)
for _flag in SETTINGS_FLAGS:
    if _flag.startswith("--"):
        REGISTRY.setdefault(("convert", _flag), T + "test_convert_writes_what_the_flags_mean")
REGISTRY[("convert", "--launch")] = T + "test_convert_writes_what_the_flags_mean"
REGISTRY[("convert", "--max-file-size")] = T + "test_convert_error_paths"
REGISTRY[("convert", "--input-format")] = T + "test_convert_error_paths"
for _command in ("explain", "fit", "diff"):
    REGISTRY[(_command, "--launch")] = T + "test_launch_means_the_same_in_every_command_invariant"


@pytest.mark.parametrize("command", ["explain", "fit", "diff"])
def test_launch_means_the_same_in_every_command_invariant(tmp_path, native, command):
    """--launch FILE (an accelerate config: the world size and sharding of native configs) on explain, fit and diff:
    their budget and figures are check's with the same launch config (an invariant)."""
    cwd = native.parent
    launch = cwd / "accelerate.yaml"
    launch.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 2\nnum_processes: 16\n")
    flags = ["--model", "./llama-3-8b.json", "--device", "H100-80GB", "--launch", str(launch)]
    checked = entry(*flags, native, cwd=cwd)
    assert checked["peak"]["ranks"] == 16
    if command == "explain":
        shown = json.loads(memfit("explain", "--format", "json", *flags, native, cwd=cwd).stdout)["files"][0]
        assert shown["peak"]["bytes"] == checked["peak"]["bytes"] and shown["budget"] == checked["budget"]
    elif command == "fit":
        answer = json.loads(memfit("fit", "--format", "json", *flags, native, cwd=cwd).stdout)["files"][0]
        assert answer["budget"] == checked["budget"]
    else:
        _git(cwd, "init", "-q")
        _git(cwd, "add", "-A")
        _git(cwd, "commit", "-qm", "base")
        done = memfit("diff", "--format", "json", *flags, "HEAD", native.name, cwd=cwd)
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["files"][0]["gated"]["after"] == checked["peak"]["bytes"]


def parser_options() -> set[tuple[str, str]]:
    from memfit.cli.main import parser

    top = parser()
    found = {("(memfit)", s) for a in top._actions for s in a.option_strings if s not in ("-h", "--help")}
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= {(name, s) for a in sub._actions for s in a.option_strings if s not in ("-h", "--help")}
    return found


def test_every_flag_of_every_subcommand_has_a_test():
    """Each option the parser has (per subcommand) is in REGISTRY, with a test that exists and names the flag in its
    own source: a new flag fails here until a test runs it."""
    options = parser_options()
    assert sorted(options - set(REGISTRY)) == [], "flags no test runs: add a test and a REGISTRY entry"
    assert sorted(set(REGISTRY) - options) == [], "REGISTRY names flags the parser no longer has"
    sources: dict[str, dict[str, str]] = {}
    for (command, flag), where in sorted(REGISTRY.items()):
        file, name = where.split("::")
        if file not in sources:
            text = (ROOT / file).read_text(encoding="utf-8")
            sources[file] = {n.name: ast.get_source_segment(text, n) or "" for n in ast.walk(ast.parse(text))
                             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert name in sources[file], f"{command} {flag}: {where} does not exist"
        source = sources[file][name]
        named = re.search(r"[\"' ]" + re.escape(flag) + r"[\"'= ]", source) or (name == _SAME.split("::")[1] and flag in SETTINGS_FLAGS + BUDGET_FLAGS) \
            or (name == "test_convert_writes_what_the_flags_mean" and flag in SETTINGS_FLAGS)
        assert named, f"{command} {flag}: {where} does not pass {flag}"
