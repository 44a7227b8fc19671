"""The files users copy: the hook manifest, the project's pre-commit config, action.yml and the
documented workflow / GitLab snippets, checked with the real validators (pre-commit's own, and
check-jsonschema's vendored GitHub and GitLab schemas, offline); and action.yml's steps run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import wheelhouse
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FITS = "memfit: 1\ndevice: {memory: 24 GiB}\noptimizer: adam\nparameters:\n  - [1000, 1000]\n"
OVER = "memfit: 1\ndevice: {memory: 10 MB}\noptimizer: adam\nparameters:\n  - [1000, 1000]\n"


def tool(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def yaml_blocks(first_line: str) -> list[tuple[Path, str]]:
    """```yaml blocks of the docs whose first line is the comment naming the file they are."""
    found = []
    for doc in DOCS:
        if doc.is_file():
            for block in re.findall(r"```yaml\n(.*?)```", doc.read_text(encoding="utf-8"), re.DOTALL):
                if block.startswith(first_line):
                    found.append((doc, block))
    return found


def test_hook_manifest() -> None:
    done = tool("pre_commit", "validate-manifest", ".pre-commit-hooks.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    assert hook["id"] == "memfit"
    assert hook["language"] == "python"
    assert hook["types_or"] == ["yaml", "json", "toml"]  # JSON, TOML: a staged config.json or settings file re-checks the configs that read it
    assert hook["entry"] == "memfit check --skip-unrecognized"
    assert "args" not in hook  # users' args replace the manifest's: nothing of ours to lose there
    assert hook["require_serial"] is True


def test_project_precommit_config() -> None:
    done = tool("pre_commit", "validate-config", ".pre-commit-config.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    hooks = {h["id"]: h for repo in yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))["repos"] for h in repo["hooks"]}
    assert hooks["memfit"]["files"] == "^examples/"
    assert hooks["memfit"]["entry"].startswith("memfit check --skip-unrecognized")
    assert "ruff" in hooks


def test_documented_precommit_configs_are_valid(tmp_path: Path) -> None:
    blocks = yaml_blocks("# .pre-commit-config.yaml")
    assert len(blocks) >= 2  # plain, and with args: [--budget, ...]
    for i, (doc, block) in enumerate(blocks):
        path = tmp_path / f"config-{i}.yaml"
        path.write_text(block, encoding="utf-8")
        done = tool("pre_commit", "validate-config", str(path))
        assert done.returncode == 0, f"{doc}:\n{block}\n{done.stdout}{done.stderr}"
        (hook,) = yaml.safe_load(block)["repos"][0]["hooks"]
        assert hook["id"] == "memfit"  # one hook id, whatever the args


@pytest.mark.parametrize(
    ("first_line", "schema", "least"),
    [("# .github/workflows/", "vendor.github-workflows", 2), ("# .gitlab-ci.yml", "vendor.gitlab-ci", 1)],
)
def test_documented_ci_snippets_are_valid(tmp_path: Path, first_line: str, schema: str, least: int) -> None:
    blocks = yaml_blocks(first_line)
    assert len(blocks) >= least
    for i, (doc, block) in enumerate(blocks):
        path = tmp_path / f"snippet-{i}.yml"
        path.write_text(block, encoding="utf-8")
        done = tool("check_jsonschema", "--builtin-schema", schema, str(path))
        assert done.returncode == 0, f"{doc}:\n{block}\n{done.stdout}{done.stderr}"
        assert "memfit" in block


def test_action_yml_is_valid() -> None:
    done = tool("check_jsonschema", "--builtin-schema", "vendor.github-actions", "action.yml")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_action_steps_run(tmp_path: Path) -> None:
    """action.yml's own scripts, run by bash as the runner runs them (bash -e -o pipefail), with
    the runner's variables pointing into tmp_path and the inputs mapped as the env: blocks say."""
    action = yaml.safe_load((ROOT / "action.yml").read_text(encoding="utf-8"))
    steps = action["runs"]["steps"]
    workspace = tmp_path / "workspace"
    (workspace / "configs").mkdir(parents=True)
    (workspace / "configs" / "fits.yaml").write_text(FITS, encoding="utf-8")
    (workspace / "configs" / "over.yaml").write_text(OVER, encoding="utf-8")
    (workspace / "docker-compose.yml").write_text("services: {web: {image: nginx}}\n", encoding="utf-8")
    (tmp_path / "runner").mkdir()
    # the Action's install step builds memfit from its checkout: from the local wheels, with no package index
    base = wheelhouse.offline({
        **{k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")},
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
        "GITHUB_ACTION_PATH": str(ROOT),
        "RUNNER_TEMP": str(tmp_path / "runner"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
    })

    def step(index: int, inputs: dict) -> subprocess.CompletedProcess:
        values = {name: spec.get("default", "") for name, spec in action["inputs"].items()} | inputs
        env = dict(base)
        for key, value in steps[index].get("env", {}).items():
            env[key] = re.sub(r"\$\{\{\s*inputs\.([\w-]+)\s*\}\}", lambda m: values[m.group(1)], value)
        script = tmp_path / f"step-{index}.sh"
        script.write_text(steps[index]["run"], encoding="utf-8")
        return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], check=False, cwd=workspace, env=env, capture_output=True, text=True, timeout=600)

    install = step(0, {})
    assert install.returncode == 0, install.stdout + install.stderr

    failing = step(1, {"paths": "configs docker-compose.yml", "sarif": "memfit.sarif"})
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert failing.stdout.startswith("::error file=configs/over.yaml,line=2,")
    assert "1 skipped (not memfit configs)" in failing.stdout
    sarif = json.loads((workspace / "memfit.sarif").read_text(encoding="utf-8"))
    assert [r["ruleId"] for r in sarif["runs"][0]["results"]] == ["budget-exceeded"]
    assert "| `configs/over.yaml` |" in (tmp_path / "summary.md").read_text(encoding="utf-8")

    passing = step(1, {"paths": "configs", "budget": "80GiB"})
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert passing.stdout == "memfit: 2 configs checked, all fit\n"

    usage = step(1, {"paths": "configs", "budget": "12 XB", "sarif": "again.sarif"})
    assert usage.returncode != 0
    assert "unknown unit 'XB'" in usage.stderr

    # baseline: the job summary gains the diff against that revision, largest growth first
    identity = {"GIT_AUTHOR_NAME": "ci", "GIT_AUTHOR_EMAIL": "ci@example.com", "GIT_COMMITTER_NAME": "ci", "GIT_COMMITTER_EMAIL": "ci@example.com"}
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=workspace, check=True, capture_output=True, env={**base, **identity})
    (workspace / "configs" / "fits.yaml").write_text(FITS.replace("[1000, 1000]", "[1000, 2000]"), encoding="utf-8")
    compared = step(1, {"paths": "configs", "budget": "80GiB", "baseline": "HEAD"})
    assert compared.returncode == 0, compared.stdout + compared.stderr
    summary = (tmp_path / "summary.md").read_text(encoding="utf-8")
    assert "### memfit: memory against `HEAD`" in summary
    assert "| `configs/fits.yaml` | 15.26 MiB | 30.52 MiB | +15.26 MiB (+100.0%) |" in summary
    missing = step(1, {"paths": "configs", "baseline": "no-such-rev"})
    assert missing.returncode == 2 and "unknown revision 'no-such-rev'" in missing.stderr
