#!/usr/bin/env python3
"""memfit's speed benchmark against check-jsonschema (issue 6).

    python benchmarks/bench.py                # the full table (several minutes: check-jsonschema is slow on big files)
    python benchmarks/bench.py --quick        # smaller cases, fewer runs, for iteration
    python benchmarks/bench.py --json out.json
    python benchmarks/bench.py --against 31cebcc   # also time that commit's memfit on the same files, side by side

Synthetic configs come from a fixed seed, so every run times the same files. Each case is a
whole process (start-up included), run several times; the table shows the median wall time,
the child's peak RSS, and ratios against check-jsonschema validating the same files with
memfit's own schema, and against the floor `python -c "import yaml, jsonschema"`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "schemas" / "memfit.schema.json"
SEED = 20261129

# -- synthetic configs -------------------------------------------------------------------------

# (first dims, other dims) by rank: 2-D weights up to a vocabulary embedding; 3-D and 4-D
# activations and conv kernels with a batch-like first dim, so a config's total stays plausible
DIMS = {
    2: ((1, 64, 768, 1024, 2048, 4096, 50257), (1, 64, 768, 1024, 2304, 3072, 4096)),
    3: ((1, 2, 4, 8, 16, 32), (1, 3, 64, 128, 512, 768, 1024)),
    4: ((1, 2, 4, 8), (1, 3, 7, 16, 64, 128, 256)),
}
DTYPES = ("bfloat16", "float16", "float32", "int8", "nf4", 0.5, 2)
PARTS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "ln_1", "ln_2", "embed", "head", "norm", "q_proj", "k_proj", "v_proj")
TENSOR_KINDS = ("weight", "bias", "scale")


def _shape(rng: random.Random) -> list[int]:
    rank = rng.randint(2, 4)
    first, rest = DIMS[rank]
    return [rng.choice(first)] + [rng.choice(rest) for _ in range(rank - 1)]


def _flow(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _tensor_lines(rng: random.Random, i: int, category: str) -> list[str]:
    """One list item, in the mix of styles people write: bare shapes, flow mappings, block mappings."""
    shape = _shape(rng)
    style = rng.random()
    if style < 0.35:
        return [f"  - {_flow(shape)}"]
    name = f"h.{i // len(PARTS)}.{PARTS[i % len(PARTS)]}.{rng.choice(TENSOR_KINDS)}"
    fields = [("name", name), ("shape", _flow(shape))]
    if rng.random() < 0.3:
        fields.append(("dtype", rng.choice(DTYPES)))
    if rng.random() < 0.3:
        fields.append(("count", rng.randint(1, 48)))
    if category == "parameters" and rng.random() < 0.2:
        fields.append(("trainable", rng.choice(("false", "true"))))
    if style < 0.6:
        return ["  - {" + ", ".join(f"{k}: {v}" for k, v in fields) + "}"]
    lines = [f"  - {fields[0][0]}: {fields[0][1]}"]
    lines += [f"    {k}: {v}" for k, v in fields[1:]]
    return lines


def config_text(tensors: int, seed: int = SEED, name: str = "synthetic") -> str:
    """A valid memfit config with `tensors` tensors (about 2/3 parameters, 1/3 activations)."""
    rng = random.Random(seed)
    params = tensors - tensors // 3
    lines = [
        "memfit: 1",
        f"name: {name}",
        "device:",
        "  name: A100 80GB",
        f"  memory: {max(80, tensors // 2)} GiB",
        "  reserve: 2 GiB",
        "dtypes:",
        "  parameters: bfloat16",
        "  gradients: float32",
        "  activations: bfloat16",
        "  optimizer_state: float32",
        f"optimizer: {rng.choice(('adamw', 'adam', 'sgd', 'lion'))}",
        "parameters:",
    ]
    for i in range(params):
        lines += _tensor_lines(rng, i, "parameters")
    lines.append("activations:")
    for i in range(tensors - params):
        lines += _tensor_lines(rng, i, "activations")
    return "\n".join(lines) + "\n"


# A Llama-3-70B-size config.json (its published shape): a transformer derived from hf_config.
LLAMA_70B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
}
HF_YAML = """memfit: 1
name: llama-70b
optimizer: adamw
device: {memory: 8 TiB}
dtypes: {parameters: bfloat16, gradients: bfloat16, activations: bfloat16}
model:
  hf_config: llama-70b.json
training: {micro_batch: 1, seq_len: 8192, attention: sdpa, checkpointing: full}
"""
# The same model on H100s under FSDP: what `memfit fit --vary gpus` answers for (issue 22)
HF_GPUS_YAML = """memfit: 1
name: llama-70b-h100
optimizer: adamw
device: {name: H100 SXM, memory: 80 GB, reserve: 2 GiB}
host: {memory: 1 TiB}
dtypes: {parameters: bfloat16, gradients: bfloat16, activations: bfloat16, optimizer_state: float32}
model:
  hf_config: llama-70b.json
training: {micro_batch: 1, seq_len: 4096, attention: sdpa, checkpointing: full}
parallel: {data: 16, fsdp: full_shard, gpus_per_node: 8}
"""
# The same model launched by an Axolotl config (issue 20: a native config within 1.3x the memfit
# config it means, which `memfit convert` writes beside it)
AXOLOTL_YAML = """base_model: ./llama-70b.json
sequence_len: 8192
micro_batch_size: 1
bf16: true
gradient_checkpointing: true
attn_implementation: sdpa
optimizer: adamw_torch
datasets:
  - path: tatsu-lab/alpaca
    type: alpaca
"""


def layout(root: Path, configs: int, sizes: tuple[int, ...]) -> dict:
    """Where the benchmark's files go: one typical config, `configs` typical ones, one per size,
    and one transformer from a 70B-size config.json."""
    return {
        "typical": root / "typical.yaml",
        "hf": root / "hf70b.yaml",
        "gpus": root / "hf70b-h100.yaml",
        "axolotl": root / "axolotl70b.yml",
        "converted": root / "axolotl70b.memfit.yaml",
        "many": [root / "many" / f"config-{i:04d}.yaml" for i in range(configs)],
        "big": {n: root / f"tensors-{n}.yaml" for n in sizes},
    }


def write_corpus(root: Path, configs: int, sizes: tuple[int, ...]) -> dict:
    files = layout(root, configs, sizes)
    files["typical"].write_text(config_text(75), encoding="utf-8")
    files["hf"].write_text(HF_YAML, encoding="utf-8")
    files["gpus"].write_text(HF_GPUS_YAML, encoding="utf-8")
    files["axolotl"].write_text(AXOLOTL_YAML, encoding="utf-8")
    (root / "llama-70b.json").write_text(json.dumps(LLAMA_70B, indent=2), encoding="utf-8")
    (root / "many").mkdir()
    for i, path in enumerate(files["many"]):
        path.write_text(config_text(75, seed=SEED + 1 + i, name=f"config-{i}"), encoding="utf-8")
    for n, path in files["big"].items():
        path.write_text(config_text(n, seed=SEED + n, name=f"tensors-{n}"), encoding="utf-8")
    return files


# -- timing whole processes --------------------------------------------------------------------


def run_once(argv: list[str]) -> tuple[float, int, int]:
    """Wall seconds, peak RSS (bytes) of the child, exit code. Linux counts into a child's peak
    the memory of this process it was started from (exec keeps the old high-water mark), so this
    process stays small: the configs are generated in another one (see run)."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    return elapsed, usage.ru_maxrss * 1024, child.returncode  # ru_maxrss is KiB on Linux


def measure_pair(this: list[str], that: list[str], runs: int, ok=(0, 1)) -> tuple[dict, dict]:
    """Two commands timed alternately (this, that, this, that...): a load that comes and goes
    falls on both sides alike, so their ratio is what the code changed."""
    samples: dict = {"this": [], "that": []}
    for _ in range(runs):
        for side, argv in (("this", this), ("that", that)):
            samples[side].append(run_once(argv))
    out = []
    for side, argv in (("this", this), ("that", that)):
        codes = {code for _, _, code in samples[side]}
        if not codes <= set(ok):
            raise SystemExit(f"bench: {' '.join(argv[:4])} ... exited {sorted(codes)}; expected {sorted(ok)}")
        out.append({"seconds": statistics.median(s for s, _, _ in samples[side]), "peak_bytes": max(m for _, m, _ in samples[side]),
                    "runs": runs, "all_seconds": [round(s, 4) for s, _, _ in samples[side]]})
    return out[0], out[1]


def measure(argv: list[str], runs: int, ok=(0, 1)) -> dict:
    samples = [run_once(argv) for _ in range(runs)]
    codes = {code for _, _, code in samples}
    if not codes <= set(ok):
        raise SystemExit(f"bench: {' '.join(argv[:4])} ... exited {sorted(codes)}; expected {sorted(ok)}")
    return {
        "seconds": statistics.median(s for s, _, _ in samples),
        "peak_bytes": max(m for _, m, _ in samples),
        "runs": runs,
        "all_seconds": [round(s, 4) for s, _, _ in samples],
    }


def tool(name: str, module: str | None = None) -> list[str]:
    """The console script next to this Python, as a hook would run it (or `python -m`)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    if found:
        return [found]
    if module:
        return [sys.executable, "-m", module]
    raise SystemExit(f"bench: {name} not found; install the test extra: pip install -e '.[test]'")


def machine() -> dict:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return {"nproc": cores, "cpu": model, "python": platform.python_version(), "platform": platform.platform()}


def versions() -> dict:
    from importlib.metadata import version

    out = {}
    for name in ("memfit", "jsonschema", "pyyaml", "check-jsonschema"):
        try:
            out[name] = version(name)
        except Exception:  # noqa: BLE001
            out[name] = "?"
    return out


# -- the cases and the table -------------------------------------------------------------------


def mib(n: int) -> str:
    return f"{n / 2**20:.0f}"


def _tree_command(tree: Path) -> list[str]:
    """memfit from a source tree, as `python -m memfit` with that tree's src first on the path."""
    return ["env", f"PYTHONPATH={tree / 'src'}", sys.executable, "-m", "memfit"]


def run(args) -> dict:
    memfit = tool("memfit", "memfit")
    previous_tree = None
    if args.against:
        # both sides run the same way (python -m memfit from a tree), in the same run, on the same files
        previous_tree = Path(tempfile.mkdtemp(prefix="memfit-bench-rev-")) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(previous_tree), args.against], check=True, capture_output=True)
        memfit = _tree_command(ROOT)
    competitor = tool("check-jsonschema") + ["--schemafile", str(SCHEMA)]
    sizes = args.sizes or ((2_000, 20_000, 30_000) if args.quick else (10_000, 100_000, 150_000))
    configs = args.configs or (200 if args.quick else 1_000)
    small, huge = (args.runs, args.runs) if args.runs else (3, 1) if args.quick else (7, 3)
    huge_competitor = 1  # 40-50 s a run on 150,000 tensors
    root = Path(tempfile.mkdtemp(prefix="memfit-bench-"))
    rows = []
    only = set(args.only.split(",")) if args.only else None

    def want(key: str) -> bool:
        return only is None or key in only
    try:
        # generated in a separate process, so this one's peak memory (counted into every
        # child's, see run_once) stays below that of any Python process it measures
        subprocess.run([sys.executable, __file__, "--generate", str(root), "--configs", str(configs), "--sizes", ",".join(map(str, sizes))], check=True)
        corpus = layout(root, configs, sizes)
        say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if not args.silent else (lambda *a: None)

        say("bench: floor")
        floor = measure([sys.executable, "-c", "import yaml, jsonschema"], small, ok=(0,))
        rows.append({"case": "floor: python -c 'import yaml, jsonschema'", "key": "floor", "memfit": floor, "competitor": None})

        say("bench: one typical config, cold")
        typical = [str(corpus["typical"])]
        if want("cold"):
            rows.append({"case": "1 config (75 tensors), cold", "key": "cold", "_argv": ["check"] + typical, "memfit": measure(memfit + ["check"] + typical, small), "competitor": measure(competitor + typical, small, ok=(0,))})

        say("bench: a 70B-size hf_config, cold")
        hf = [str(corpus["hf"])]
        if want("hf70b"):
            rows.append({"case": "1 config with a 70B-size hf_config, cold", "key": "hf70b", "_argv": ["check"] + hf, "memfit": measure(memfit + ["check"] + hf, small), "competitor": measure(competitor + hf, small, ok=(0,))})
        say("bench: memfit fit on the 70B-size hf_config")
        # fit exits 1 when even micro_batch 1 does not fit the config's budget: still a full search
        if want("fit70b"):
            rows.append({"case": "memfit fit on the 70B-size hf_config", "key": "fit70b", "_argv": ["fit"] + hf, "memfit": measure(memfit + ["fit"] + hf, small, ok=(0, 1)), "competitor": None})

        say("bench: memfit check --suggest where nothing fits (every combination of fixes is tried)")
        if want("suggest70b"):
            rows.append({"case": "memfit check --suggest, the 70B-size hf_config at 500 GiB (no fix fits)", "key": "suggest70b", "memfit": measure(memfit + ["check", "--suggest", "--budget", "500GiB"] + hf, small, ok=(1,)), "competitor": None})
        say("bench: memfit check and memfit fit --vary gpus on the 70B on H100s")
        gpus = [str(corpus["gpus"])]
        if want("check70bh100") or want("gpus70b"):
            # timed alternately (check, fit, check, fit...): their ratio is the target, and a load that comes
            # and goes on a shared machine then falls on both alike
            checked, fitted = measure_pair(memfit + ["check"] + gpus, memfit + ["fit", "--vary", "gpus"] + gpus, small)
            rows.append({"case": "memfit check, the 70B on H100s (FSDP)", "key": "check70bh100", "memfit": checked, "competitor": None})
            rows.append({"case": "memfit fit --vary gpus, the 70B on H100s", "key": "gpus70b", "memfit": fitted, "competitor": None})

        say("bench: an Axolotl config of the 70B-size model, and the memfit config it means")
        budget = ["--budget", "8TiB"]
        converted = subprocess.run(memfit + ["convert", str(corpus["axolotl"])], capture_output=True, text=True, check=True)
        corpus["converted"].write_text(converted.stdout, encoding="utf-8")
        if want("native70b"):
            rows.append({"case": "1 Axolotl config of the 70B-size model, cold", "key": "native70b", "memfit": measure(memfit + ["check"] + budget + [str(corpus["axolotl"])], small), "competitor": None})
        if want("converted70b"):
            rows.append({"case": "its memfit config (memfit convert), cold", "key": "converted70b", "memfit": measure(memfit + ["check"] + budget + [str(corpus["converted"])], small), "competitor": None})

        say(f"bench: {configs:,} configs in one call")
        files = [str(p) for p in corpus["many"]]
        if want("many"):
            rows.append({"case": f"{configs:,} configs in one call", "key": "many", "_argv": ["check"] + files, "memfit": measure(memfit + ["check"] + files, huge), "competitor": measure(competitor + files, huge, ok=(0,))})

        for n, path in corpus["big"].items():
            say(f"bench: one config of {n:,} tensors")
            runs = small if n == sizes[0] else huge
            if want(f"tensors-{n}"):
                rows.append({"case": f"1 config of {n:,} tensors", "key": f"tensors-{n}", "tensors": n, "_argv": ["check", str(path)], "memfit": measure(memfit + ["check", str(path)], runs), "competitor": measure(competitor + [str(path)], runs if n == sizes[0] else huge_competitor, ok=(0,))})
        largest = corpus["big"][sizes[-1]]
        say(f"bench: memfit explain on {sizes[-1]:,} tensors")
        if want("explain"):
            rows.append({"case": f"memfit explain, {sizes[-1]:,} tensors", "key": "explain", "_argv": ["explain", "--color", "never", str(largest)], "memfit": measure(memfit + ["explain", "--color", "never", str(largest)], huge), "competitor": None})
        if previous_tree is not None:
            previous = _tree_command(previous_tree)
            say(f"bench: the same cases with {args.against}")
            for row in rows:
                if row["key"] == "floor" or "_argv" not in row:
                    continue  # a command that commit may not have (fit --vary gpus, native configs)
                argv = row.pop("_argv")
                # timed again, alternating with that commit's run of the same case
                runs = max(small if row["memfit"]["runs"] == small else huge, 5)
                row["this"], row["previous"] = measure_pair(memfit + argv, previous + argv, runs)
                row["vs_previous"] = row["this"]["seconds"] / row["previous"]["seconds"]
    finally:
        if previous_tree is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(previous_tree)], check=False, capture_output=True)
        if args.keep:
            print(f"bench: files kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)

    for row in rows:
        row.pop("_argv", None)
        m, c = row["memfit"], row["competitor"]
        row["vs_floor"] = m["seconds"] / floor["seconds"]
        if c:
            row["time_ratio"] = m["seconds"] / c["seconds"]  # < 1: memfit is faster
            row["memory_ratio"] = m["peak_bytes"] / c["peak_bytes"]
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"machine": machine(), "versions": versions(), "quick": args.quick, "against": args.against, "bench_peak_bytes": own, "rows": rows, "targets": targets(rows, sizes, configs)}


def targets(rows: list[dict], sizes, configs: int) -> list[dict]:
    by = {row["key"]: row for row in rows}

    def seconds(key):
        return by[key]["memfit"]["seconds"]

    out = []

    def target(name, value, limit, better_below=True):
        """One target, left out when --only did not run a row it needs."""
        try:
            value = value()
        except KeyError:
            return
        met = value <= limit if better_below else value >= limit
        out.append({"target": name, "value": round(value, 3), "limit": limit, "met": met})

    largest = f"tensors-{sizes[-1]}"
    target("1 config cold: memfit / floor <= 1.3", lambda: by["cold"]["vs_floor"], 1.3)
    target("70B-size hf_config cold: memfit / floor <= 1.3", lambda: by["hf70b"]["vs_floor"], 1.3)
    target("memfit fit / memfit check on the 70B-size hf_config <= 2", lambda: seconds("fit70b") / seconds("hf70b"), 2)
    target("memfit check --suggest (no fix fits) / memfit check on the 70B-size hf_config <= 10", lambda: seconds("suggest70b") / seconds("hf70b"), 10)
    target("memfit fit --vary gpus / memfit check on the 70B on H100s <= 2", lambda: seconds("gpus70b") / seconds("check70bh100"), 2)
    target("Axolotl config / its memfit config <= 1.3", lambda: seconds("native70b") / seconds("converted70b"), 1.3)
    target("1 config cold: memfit / check-jsonschema <= 0.5", lambda: by["cold"]["time_ratio"], 0.5)
    target(f"{configs:,} configs: check-jsonschema / memfit >= 4", lambda: 1 / by["many"]["time_ratio"], 4, better_below=False)
    target(f"{sizes[-1]:,} tensors: check-jsonschema / memfit >= 4", lambda: 1 / by[largest]["time_ratio"], 4, better_below=False)
    target(f"{sizes[-1]:,} tensors: memfit / check-jsonschema peak memory <= 0.75", lambda: by[largest]["memory_ratio"], 0.75)
    target(f"{sizes[0]:,} -> {sizes[1]:,} tensors: memfit time grows <= 12x", lambda: seconds(f"tensors-{sizes[1]}") / seconds(f"tensors-{sizes[0]}"), 12)
    return out


def table(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"machine: {m['nproc']} cores, {m['cpu']}, Python {m['python']} ({m['platform']})",
        f"peak memory is the measured process's high-water RSS (with --jobs, the largest single process); the benchmark's own process peaked at {mib(report['bench_peak_bytes'])} MiB, a floor under every figure",
        "versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        "",
        "| case | memfit s | memfit MiB | check-jsonschema s | check-jsonschema MiB | memfit/cj time | memfit/cj memory | memfit/floor |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in report["rows"]:
        mem, comp = row["memfit"], row["competitor"]
        cj = (f"{comp['seconds']:.3f}", mib(comp["peak_bytes"]), f"{row['time_ratio']:.2f}", f"{row['memory_ratio']:.2f}") if comp else ("", "", "", "")
        lines.append(f"| {row['case']} | {mem['seconds']:.3f} | {mib(mem['peak_bytes'])} | {cj[0]} | {cj[1]} | {cj[2]} | {cj[3]} | {row['vs_floor']:.2f} |")
    if any("previous" in row for row in report["rows"]):
        lines += ["", f"against {report.get('against')}, side by side in this run (each case's runs alternate between the two; medians):", "", "| case | this tree s | that commit s | this / that |", "| --- | ---: | ---: | ---: |"]
        for row in report["rows"]:
            if "previous" in row:
                lines.append(f"| {row['case']} | {row['this']['seconds']:.3f} | {row['previous']['seconds']:.3f} | {row['vs_previous']:.3f} |")
    lines += ["", "| target | measured | met |", "| --- | ---: | --- |"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['value']:.3f} | {'yes' if t['met'] else 'NO'} |")
    return "\n".join(lines)


def _sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(int(part) for part in text.split(","))
    if len(sizes) != 3:
        raise argparse.ArgumentTypeError("three tensor counts, e.g. 10000,100000,150000")
    return sizes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller cases, fewer runs (for iteration; the targets are for the full run)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the generated configs (their folder is printed)")
    parser.add_argument("--configs", type=int, metavar="N", help="how many typical configs in the many-files case (default 1000)")
    parser.add_argument("--sizes", type=_sizes, metavar="A,B,C", help="tensor counts of the big configs (default 10000,100000,150000)")
    parser.add_argument("--runs", type=int, metavar="N", help="runs per case (default 7 for small cases, 3 for big ones; check-jsonschema once on the two biggest)")
    parser.add_argument("--generate", metavar="DIR", help=argparse.SUPPRESS)  # internal: write the configs only
    parser.add_argument("--silent", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--only", metavar="KEYS", help="run only these rows (comma-separated keys: cold, hf70b, fit70b, suggest70b, check70bh100, gpus70b, native70b, converted70b, many, tensors-N, explain); the targets they allow")
    parser.add_argument("--against", metavar="REV", help="also run a commit's memfit (a git worktree of REV) on every case, side by side")
    args = parser.parse_args(argv)
    if args.generate:
        write_corpus(Path(args.generate), args.configs, args.sizes)
        return 0
    report = run(args)
    print(table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
