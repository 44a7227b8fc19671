"""The pre-commit hook, end to end with the real tools: real `git commit` in a temporary
repository whose .pre-commit-config.yaml points at this checkout's hook, as a user's would
(`repo:` + `rev:` + `id: memfit`). pre-commit clones it, builds the hook's virtualenv with pip
(memfit and its dependencies from the local wheels .ci/run builds: tests/support/wheelhouse.py; a user's come from
PyPI) and runs the manifest's entry: the hook definition, the
console script and the packaging are what is tested. One pre-commit cache serves the session,
so the hook environment is built once."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import needs
import pytest
import wheelhouse

pytestmark = pytest.mark.slow
needs.module("pre_commit")

ROOT = Path(__file__).resolve().parents[2]
HOOK_NAME = "memfit (training memory fits the budget)"

# 1000 x 1000 float32 weights, Adam: 4,000,000 B parameters + 4,000,000 B gradients
# + 8,000,000 B optimizer state = 16,000,000 B.
CONFIG = """\
memfit: 1
name: {name}
device:
  memory: {memory}
optimizer: adam
parameters:
  - name: w
    shape: [1000, 1000]
"""
NO_BUDGET = "memfit: 1\noptimizer: adam\nparameters:\n  - [1000, 1000]\n"
UNRELATED = {
    "docker-compose.yml": "services:\n  web:\n    image: nginx:1.27\n    ports: ['8080:80']\n",
    ".github/workflows/ci.yml": "on: [push]\njobs:\n  test:\n    runs-on: ubuntu-latest\n    steps:\n      - run: make test\n",
    # a Helm template is not even valid YAML; it must not be parsed, let alone failed
    "chart/templates/deploy.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}\n  labels: {{- include \"x\" . | nindent 4 }}\n",
    # `memfit` as a nested key is not the top-level marker
    "k8s/job.yaml": "kind: Job\nspec:\n  template:\n    metadata:\n      labels:\n        memfit: checked\n",
}


def _require(tool: str) -> None:
    if shutil.which(tool) is None:
        needs.unavailable(f"{tool} is not installed")


def run(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def env(tmp_path_factory) -> dict:
    """Hermetic: a fresh HOME (no user git config, hooks or pip config), one pre-commit cache
    for the session, a fixed identity, and no GIT_* variables leaking in from an outer git."""
    _require("git")
    base = tmp_path_factory.mktemp("precommit-env")
    (base / "home").mkdir()
    clean = wheelhouse.offline({k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "PRE_COMMIT"))})
    return {
        **clean,
        "HOME": str(base / "home"),
        "XDG_CONFIG_HOME": str(base / "home" / ".config"),
        "PRE_COMMIT_HOME": str(base / "pre-commit-cache"),
        "PRE_COMMIT_COLOR": "never",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "memfit test",
        "GIT_AUTHOR_EMAIL": "test@memfit.invalid",
        "GIT_COMMITTER_NAME": "memfit test",
        "GIT_COMMITTER_EMAIL": "test@memfit.invalid",
    }


@pytest.fixture(scope="session")
def hook_repo(tmp_path_factory, env) -> tuple[Path, str]:
    """This checkout's files as they are now (committed or not, new files included, ignored
    files left out), committed to a scratch repository: what `rev:` would name after a push."""
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], ROOT, env)
    if listed.returncode != 0:
        needs.unavailable(f"{ROOT} is not a git checkout: {listed.stderr.strip()}")
    repo = tmp_path_factory.mktemp("memfit-hook-repo")
    for name in filter(None, listed.stdout.split("\0")):
        source = ROOT / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the work tree
        target = repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    for args in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-q", "--no-verify", "-m", "snapshot"]):
        done = run(args, repo, env)
        assert done.returncode == 0, done.stderr
    sha = run(["git", "rev-parse", "HEAD"], repo, env).stdout.strip()
    return repo, sha


def user_config(hook_repo: tuple[Path, str], args: list[str] | None = None) -> str:
    path, sha = hook_repo
    extra = f"\n        args: [{', '.join(args)}]" if args else ""
    return f"repos:\n  - repo: {path}\n    rev: {sha}\n    hooks:\n      - id: memfit{extra}\n"


def make_repo(tmp_path: Path, env: dict, hook_repo, args: list[str] | None = None) -> Path:
    repo = tmp_path / "user-repo"
    repo.mkdir()
    assert run(["git", "init", "-q"], repo, env).returncode == 0
    (repo / ".pre-commit-config.yaml").write_text(user_config(hook_repo, args), encoding="utf-8")
    installed = run([sys.executable, "-m", "pre_commit", "install"], repo, env)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return repo


def commit(repo: Path, env: dict, files: dict[str, str], message: str) -> subprocess.CompletedProcess:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text, encoding="utf-8")
    assert run(["git", "add", "-A"], repo, env).returncode == 0
    return run(["git", "commit", "-m", message], repo, env)


def commits(repo: Path, env: dict) -> int:
    done = run(["git", "rev-list", "--count", "HEAD"], repo, env)
    return int(done.stdout) if done.returncode == 0 else 0


def hook_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith(HOOK_NAME[:20])]
    assert len(lines) == 1, output
    return lines[0]


def test_fits_then_exceeds_then_fixed(tmp_path: Path, env, hook_repo) -> None:
    repo = make_repo(tmp_path, env, hook_repo)

    fits = commit(repo, env, {"train.yaml": CONFIG.format(name="fits", memory="24 GiB")}, "a config that fits")
    assert fits.returncode == 0, fits.stdout + fits.stderr
    assert hook_line(fits.stdout + fits.stderr).endswith("Passed")
    assert commits(repo, env) == 1

    over_text = CONFIG.format(name="over", memory="10 MB")
    refused = commit(repo, env, {"train.yaml": over_text}, "a config that does not fit")
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0, output
    assert hook_line(output).endswith("Failed")
    assert commits(repo, env) == 1  # the commit was refused
    # the user sees file:line:col, the total, the budget and the overshoot, in one line
    line = over_text.splitlines().index("  memory: 10 MB") + 1
    col = len("  memory: ") + 1
    expected = (
        f"train.yaml:{line}:{col}: error[budget-exceeded] total 16,000,000 B (15.26 MiB) exceeds the budget "
        f"10,000,000 B (9.54 MiB) (device.memory 10 MB) by 6,000,000 B (5.72 MiB)"
    )
    assert expected in output.splitlines(), output
    assert "memfit: 1 config of 1 failed (1 error, 0 warnings)" in output

    fixed = commit(repo, env, {"train.yaml": CONFIG.format(name="fixed", memory="16 MB")}, "fixed: a bigger device")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert commits(repo, env) == 2


def test_unrelated_yaml_passes(tmp_path: Path, env, hook_repo) -> None:
    repo = make_repo(tmp_path, env, hook_repo)
    done = commit(repo, env, UNRELATED, "a repository's other YAML")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert hook_line(output).endswith("Passed")  # the hook ran on them (types_or: [yaml, json, toml]) and skipped them
    assert commits(repo, env) == 1


def test_only_bad_config_fails_among_unrelated(tmp_path: Path, env, hook_repo) -> None:
    repo = make_repo(tmp_path, env, hook_repo)
    files = {**UNRELATED, "configs/ok.yaml": CONFIG.format(name="ok", memory="1 GiB"), "configs/bad.yml": CONFIG.format(name="bad", memory="1 MB")}
    done = commit(repo, env, files, "mixed")
    output = done.stdout + done.stderr
    assert done.returncode != 0
    errors = [line for line in output.splitlines() if "error[" in line]
    assert len(errors) == 1 and errors[0].startswith("configs/bad.yml:4:11: error[budget-exceeded]"), output
    # skipped: the four unrelated files and the user's own .pre-commit-config.yaml
    assert "memfit: 1 config of 2 failed (1 error, 0 warnings), 5 skipped (not memfit configs)" in output


@pytest.mark.parametrize(("budget", "passes"), [("80GiB", True), ("15MB", False)])
def test_budget_as_hook_args(tmp_path: Path, env, hook_repo, budget: str, passes: bool) -> None:
    """One budget for every config, given as the same hook's args; --skip-unrecognized (in the
    entry, not in args) still applies, so unrelated YAML is still skipped."""
    repo = make_repo(tmp_path, env, hook_repo, ["--budget", budget])
    done = commit(repo, env, {"model.yaml": NO_BUDGET, **UNRELATED}, "budget from args")
    output = done.stdout + done.stderr
    if passes:
        assert done.returncode == 0, output
        assert commits(repo, env) == 1
    else:
        assert done.returncode != 0
        assert "model.yaml:1:1: error[budget-exceeded] total 16,000,000 B (15.26 MiB) exceeds the budget 15,000,000 B (14.31 MiB) (from --budget) by 1,000,000 B (976.56 KiB)" in output
        assert commits(repo, env) == 0


def test_no_budget_without_args_is_refused(tmp_path: Path, env, hook_repo) -> None:
    repo = make_repo(tmp_path, env, hook_repo)
    done = commit(repo, env, {"model.yaml": NO_BUDGET}, "no budget anywhere")
    assert done.returncode != 0
    assert "model.yaml:1:1: error[no-budget]" in done.stdout + done.stderr


def test_try_repo(tmp_path: Path, env, hook_repo) -> None:
    """`pre-commit try-repo`, as a hook author tries a hook before tagging it."""
    repo = tmp_path / "scratch"
    repo.mkdir()
    assert run(["git", "init", "-q"], repo, env).returncode == 0
    for name, text in {"ok.yaml": CONFIG.format(name="ok", memory="1 GiB"), "over.yaml": CONFIG.format(name="over", memory="1 MB"), **UNRELATED}.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text, encoding="utf-8")
    assert run(["git", "add", "-A"], repo, env).returncode == 0
    done = run([sys.executable, "-m", "pre_commit", "try-repo", str(hook_repo[0]), "memfit", "--all-files"], repo, env)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert re.search(r"^over\.yaml:4:11: error\[budget-exceeded\] .* by 15,000,000 B \(14\.31 MiB\)$", output, re.MULTILINE), output
    assert "memfit: 1 config of 2 failed (1 error, 0 warnings), 4 skipped (not memfit configs)" in output


def test_the_readme_snippet_works_as_printed_today_and_after_a_release(tmp_path: Path, env, hook_repo) -> None:
    """The README's `.pre-commit-config.yaml`, changed in nothing but the repository URL (memfit has no public
    home yet), followed as the README says: `pre-commit autoupdate` pins `rev:` to the latest commit's SHA while
    the repository has no tag (as memfit's has none today), `pre-commit install`, and a real `git commit` runs
    the hook. After a release tag made by docs/releasing.md's commands, `pre-commit autoupdate` moves the pin
    to the tag, and the hook still runs."""
    path, sha = hook_repo
    assert run(["git", "tag", "--list"], path, env).stdout.strip() == ""  # no tag: memfit's situation today
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (snippet,) = [b for b in re.findall(r"```yaml\n(.*?)```", readme, re.DOTALL) if b.lstrip().startswith("# .pre-commit-config.yaml")]
    snippet = "\n".join(line[len(snippet) - len(snippet.lstrip(" ")) :] for line in snippet.splitlines()) + "\n"

    repo = tmp_path / "user-repo"
    repo.mkdir()
    assert run(["git", "init", "-q"], repo, env).returncode == 0
    config = repo / ".pre-commit-config.yaml"
    config.write_text(snippet.replace("<memfit's git URL>", str(path)), encoding="utf-8")
    updated = run([sys.executable, "-m", "pre_commit", "autoupdate"], repo, env)
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert re.search(rf"^\s*rev: {sha}\b", config.read_text(encoding="utf-8"), re.MULTILINE), config.read_text(encoding="utf-8")
    installed = run([sys.executable, "-m", "pre_commit", "install"], repo, env)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    done = commit(repo, env, {"ok.yaml": CONFIG.format(name="ok", memory="1 GiB")}, "a config that fits")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Passed" in hook_line(done.stdout + done.stderr)
    done = commit(repo, env, {"over.yaml": CONFIG.format(name="over", memory="1 MB")}, "a config that does not")
    assert done.returncode == 1 and "over.yaml:4:11: error[budget-exceeded]" in done.stdout + done.stderr

    releasing = (ROOT / "docs" / "releasing.md").read_text(encoding="utf-8")
    (commands,) = re.findall(r"```sh\n(.*?)```", releasing, re.DOTALL)
    tag_commands = "\n".join(line.strip() for line in commands.splitlines() if "git push" not in line)
    tagged = subprocess.run(["bash", "-ec", tag_commands], cwd=path, env={**env, "PYTHONPATH": str(path / "src")}, capture_output=True, text=True, timeout=60, check=False)
    assert tagged.returncode == 0, tagged.stderr
    from memfit import __version__

    try:
        updated = run([sys.executable, "-m", "pre_commit", "autoupdate"], repo, env)
        assert updated.returncode == 0, updated.stdout + updated.stderr
        assert f"rev: v{__version__}" in config.read_text(encoding="utf-8")
        done = run([sys.executable, "-m", "pre_commit", "run", "--all-files"], repo, env)
        assert done.returncode == 1 and "over.yaml:4:11: error[budget-exceeded]" in done.stdout + done.stderr
    finally:
        run(["git", "tag", "-d", f"v{__version__}"], path, env)


def test_a_config_json_edit_rechecks_the_configs_that_read_it(tmp_path: Path, env, hook_repo) -> None:
    """Issue 20: a model's config.json edit that takes a config past its budget must not commit
    cleanly, though the config itself is not staged."""
    import json

    repo = make_repo(tmp_path, env, hook_repo)
    model = json.loads((ROOT / "examples" / "models" / "llama-3-8b.json").read_text(encoding="utf-8"))
    config = "memfit: 1\ndevice: {memory: 100 GiB}\nprecision: bf16-true\noptimizer: adamw\nmodel: {hf_config: models/m.json}\ntraining: {micro_batch: 1, seq_len: 1024, checkpointing: full}\n"
    first = commit(repo, env, {"train.yaml": config, "models/m.json": json.dumps(model, indent=2)}, "a run that fits")
    assert first.returncode == 0, first.stdout + first.stderr
    deeper = commit(repo, env, {"models/m.json": json.dumps({**model, "num_hidden_layers": 96}, indent=2)}, "a deeper model")
    output = deeper.stdout + deeper.stderr
    assert deeper.returncode != 0, output
    assert any(line.startswith("train.yaml:") and "error[budget-exceeded]" in line for line in output.splitlines()), output
    assert commits(repo, env) == 1


def test_every_route_to_a_staged_file_rechecks_its_readers(tmp_path: Path, env, hook_repo) -> None:
    """Issue 33: a staged file reached by any route has the configs that read it checked again: a model folder
    (`base_model: ./models/x`, `hf_config: models/x`), a DeepSpeed JSON read by a Trainer argument file, the
    DeepSpeed JSON the launch config names (`deepspeed_config_file`), a memfit.toml and a pyproject.toml.
    Each edit alone takes its readers past the budget; the readers are not staged."""
    import json

    repo = make_repo(tmp_path, env, hook_repo)
    model = json.loads((ROOT / "examples" / "models" / "llama-3-8b.json").read_text(encoding="utf-8"))
    zero3 = json.dumps({"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}})
    zero0 = json.dumps({"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 0}, "bf16": {"enabled": "auto"}})
    memfit_config = "memfit: 1\nprecision: bf16-true\noptimizer: adamw\nmodel: {hf_config: %s}\ntraining: {micro_batch: 1, seq_len: 512, checkpointing: full}\n"
    files = {
        "a/models/x/config.json": json.dumps(model, indent=2),
        "a/memfit.toml": 'device = "H100"\n',
        "a/ax.yml": "base_model: ./models/x\nsequence_len: 2048\nmicro_batch_size: 1\nadapter: lora\nlora_r: 8\nlora_target_linear: true\nbf16: true\n",
        "a/m.yaml": memfit_config % "models/x",
        "b/memfit.toml": 'device = "H100"\ngpus = 8\n',
        "b/trainer.json": json.dumps({"model_name_or_path": "../a/models/x", "per_device_train_batch_size": 1, "output_dir": "o", "deepspeed": "ds.json", "bf16": True, "gradient_checkpointing": True}),
        "b/ds.json": zero3,
        "c/memfit.toml": 'device = "H100"\nlaunch = "launch.yaml"\n',
        "c/launch.yaml": "distributed_type: DEEPSPEED\nnum_processes: 8\nmixed_precision: bf16\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n",
        "c/ds.json": zero3,
        "c/full.yml": "base_model: ../a/models/x\nsequence_len: 2048\nmicro_batch_size: 1\nbf16: true\ngradient_checkpointing: true\n",
        "d/pyproject.toml": '[project]\nname = "d"\n\n[tool.memfit]\ndevice = "H200"\n',
        "d/m.yaml": memfit_config % "../a/models/x/config.json",
    }
    first = commit(repo, env, files, "runs that fit")
    assert first.returncode == 0, first.stdout + first.stderr
    deeper = json.dumps({**model, "num_hidden_layers": 128}, indent=2)
    routes = [
        # every config reads the model: all five checked again; the two ZeRO-3 runs still fit on 8 GPUs
        ({"a/models/x/config.json": deeper}, ["a/ax.yml", "a/m.yaml", "d/m.yaml"], 5),
        ({"b/ds.json": zero0}, ["b/trainer.json"], 1),
        ({"c/ds.json": zero0}, ["c/full.yml"], 1),
        ({"c/launch.yaml": files["c/launch.yaml"].replace("num_processes: 8", "num_processes: 1")}, ["c/full.yml"], 1),
        ({"a/memfit.toml": 'device = "T4"\n'}, ["a/ax.yml", "a/m.yaml"], 2),
        ({"d/pyproject.toml": '[project]\nname = "d"\n\n[tool.memfit]\ndevice = "T4"\n'}, ["d/m.yaml"], 1),
    ]
    for edit, readers, checked in routes:
        refused = commit(repo, env, edit, f"edit {', '.join(edit)}")
        output = refused.stdout + refused.stderr
        assert refused.returncode != 0, (edit, output)
        failing = sorted({line.split(":")[0] for line in output.splitlines() if "error[budget-exceeded]" in line})
        assert failing == sorted(readers), (edit, output)
        assert f"memfit: {len(readers)} config{'s' if len(readers) > 1 else ''} of {checked} failed" in output, (edit, output)
        assert commits(repo, env) == 1
        assert run(["git", "reset", "-q", "--hard"], repo, env).returncode == 0
    # an edit that keeps every reader within its budget commits
    fits = commit(repo, env, {"b/ds.json": json.dumps({**json.loads(zero3), "gradient_clipping": 1.0})}, "a harmless edit")
    assert fits.returncode == 0, fits.stdout + fits.stderr
