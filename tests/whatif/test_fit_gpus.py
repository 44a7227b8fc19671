"""`memfit fit --vary gpus|data`: the fewest data-parallel GPUs per strategy, checked against a brute-force
loop over every data-parallel size run through `memfit check` itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "parallel" / "llama3-8b-zero3-offload-4x4090.yaml"
SIZES = range(1, 33)


def memfit(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "memfit", *args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False)


def _variant(host_memory: str | None) -> dict:
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    data["model"]["hf_config"] = str(ROOT / "examples" / "models" / "llama-3-8b.json")
    # one sequence per step: the loss's fp32 logits and their gradients (a 128,256-word vocabulary)
    # do not shrink with more GPUs, and at two sequences they alone leave few strategies an answer
    data["training"]["micro_batch"] = 1
    if host_memory is not None:
        data["host"] = {"memory": host_memory}
    return data


def _zero3_peak_at(tmp_path, base: dict, size: int) -> str:
    """What ZeRO-3 needs per GPU at `size` data ranks, as `memfit check` says: a budget whose answers fall
    inside the loop's range whatever the figures are."""
    path = tmp_path / f"zero3-at-{size}.yaml"
    path.write_text(yaml.safe_dump({**base, "parallel": {"gpus_per_node": 4, "zero": 3, "data": size}}), encoding="utf-8")
    (entry,) = json.loads(memfit("check", "--format", "json", "--budget", "1TiB", str(path)).stdout)["files"]
    return f"{entry['peak']['bytes']}B"


@pytest.mark.parametrize(
    "budget, host_memory",
    [("zero3@12", None), ("23GiB", "60 GiB")],  # the second: the host budget binds the offloading strategies
)
def test_fit_gpus_matches_a_loop_over_every_size_through_check(tmp_path, budget, host_memory):
    from memfit.whatif.gpus import STRATEGIES

    base = _variant(host_memory)
    if budget.startswith("zero3@"):
        budget = _zero3_peak_at(tmp_path, base, int(budget.split("@")[1]))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(base), encoding="utf-8")
    done = memfit("fit", "--vary", "data", "--format", "json", "--budget", budget, str(config))
    assert done.returncode in (0, 1), done.stderr
    (entry,) = json.loads(done.stdout)["files"]
    rows = {row["strategy"]: row for row in entry["strategies"]}
    assert list(rows) == [name for name, _ in STRATEGIES]

    # brute force: one file per strategy and size, all through one `memfit check`
    files = {}
    kept = {k: v for k, v in base["parallel"].items() if k not in ("zero", "fsdp", "offload", "data")}
    for index, (name, keys) in enumerate(STRATEGIES):
        for size in SIZES:
            path = tmp_path / f"s{index}-d{size}.yaml"
            path.write_text(yaml.safe_dump({**base, "parallel": {**kept, **keys, "data": size}}), encoding="utf-8")
            files[str(path)] = (name, size)
    checked = memfit("check", "--format", "json", "--budget", budget, *files)
    passes = {}
    for result in json.loads(checked.stdout)["files"]:
        name, size = files[result["path"]]
        ok = not any(d["severity"] == "error" for d in result["diagnostics"])
        passes.setdefault(name, {})[size] = ok
    found_inside = 0
    for name, _ in STRATEGIES:
        brute = next((s for s in SIZES if passes[name][s]), None)
        answer = rows[name]["data"]
        if brute is None:
            assert answer is None or answer > SIZES[-1], (name, answer)
        else:
            assert answer == brute, (name, answer, brute)
            assert rows[name]["gpus"] == brute  # tensor 1 x pipeline 1
            found_inside += brute > 1
    assert found_inside >= 2  # the comparison has answers to compare, not only "1" and "none"


def test_the_search_is_logarithmic_and_the_table_names_every_strategy(tmp_path):
    """A budget set to what ZeRO-3 needs per GPU at 150 data ranks (read from `memfit check` on that layout)
    puts ZeRO-3's answer in the low hundreds: the search takes a handful of pipeline runs, not hundreds,
    and the answer is confirmed exactly (it passes, the size below it does not)."""
    from memfit.check.pipeline import Options, check
    from memfit.whatif.gpus import gpus

    base = _variant(None)
    at150 = tmp_path / "z3-150.yaml"
    at150.write_text(yaml.safe_dump({**base, "parallel": {"gpus_per_node": 4, "zero": 3, "data": 150}}), encoding="utf-8")
    (entry,) = json.loads(memfit("check", "--format", "json", "--budget", "1TiB", str(at150)).stdout)["files"]
    budget = entry["peak"]["bytes"]
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(base), encoding="utf-8")
    found = gpus(check(config.read_text(encoding="utf-8"), str(config), Options(budget=budget)), options=Options(budget=budget))
    rows = {row.strategy: row for row in found.rows}
    zero3 = rows["ZeRO-3"]
    assert zero3.data is not None and 100 < zero3.data <= 150, zero3.data
    assert zero3.runs <= 2 * zero3.data.bit_length() + 6, zero3.runs
    assert all(row.runs <= 40 for row in found.rows), [(row.strategy, row.runs) for row in found.rows]
    for size, ok in ((zero3.data, True), (zero3.data - 1, False)):
        path = tmp_path / f"z3-{size}.yaml"
        path.write_text(yaml.safe_dump({**base, "parallel": {"gpus_per_node": 4, "zero": 3, "data": size}}), encoding="utf-8")
        assert (memfit("check", "--budget", f"{budget}B", str(path)).returncode == 0) is ok, size


def test_text_table_and_a_config_without_parallel(tmp_path):
    done = memfit("fit", "--vary", "gpus", "examples/llama-3-8b.yaml")
    lines = done.stdout.splitlines()
    assert lines[0].startswith("examples/llama-3-8b.yaml: the fewest GPUs that pass memfit check, per strategy")
    assert lines[1].split() == ["GPUs", "strategy", "peak", "per", "GPU", "host", "per", "node"]
    assert len(lines) == 2 + 12
    bad = memfit("fit", "--vary", "nodes", "examples/llama-3-8b.yaml")
    assert bad.returncode == 2


def test_an_offloaded_70b_on_one_gpu_is_every_parameter_on_the_host_and_says_so():
    """Llama-3-70B, bf16 weights, gradients and AdamW state, FSDP with parameter and optimizer offload: one GPU is
    enough because the host holds every parameter, gradient and optimizer state (8 bytes per parameter of the
    model transformers builds) and the GPU only what runs; the text says so."""
    import needs

    torch, transformers = needs.module("torch"), needs.module("transformers")
    raw = json.loads((ROOT / "examples" / "models" / "llama-3-70b.json").read_text())
    config = transformers.AutoConfig.for_model(raw.pop("model_type"), **{k: v for k, v in raw.items() if k != "architectures"})
    with torch.device("meta"):
        count = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(config).parameters())
    example = "examples/parallel/llama3-70b-fsdp-8xh100.yaml"
    (entry,) = json.loads(memfit("fit", "--vary", "gpus", "--format", "json", example).stdout)["files"]
    (row,) = [r for r in entry["strategies"] if r["strategy"] == "FSDP full_shard + offload"]
    assert row["gpus"] == 1 and row["host"] == 8 * count, row
    text = memfit("fit", "--vary", "gpus", example).stdout
    assert "FSDP full_shard + offload on 1 GPU: the parameters, gradients and optimizer state are on the host" in text
