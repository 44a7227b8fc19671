"""`memfit diff` with real git: a temporary repository, two commits, a diff between them and
against the working tree. Every footprint is compared with `memfit check` on the same text."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

pytestmark = pytest.mark.skipif(shutil.which("git") is None and not __import__("os").environ.get("CI"), reason="git is not installed")


def memfit(*args, cwd):
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], check=False, capture_output=True, text=True, cwd=cwd, timeout=120)


def git(repo: Path, *args) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com", "HOME": str(repo), "PATH": __import__("os").environ["PATH"]}
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True, env=env).stdout


def footprint(path: Path) -> dict:
    return json.loads(subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", str(path)], capture_output=True, text=True, check=False).stdout)["files"][0]["footprint"]


@pytest.fixture
def repo(tmp_path):
    """Commit 1: two configs and a YAML file that is no config. Commit 2: the text encoder's
    batch doubled, cifar removed, atari added, and a config that no longer parses."""
    repo = tmp_path / "repo"
    (repo / "configs").mkdir(parents=True)
    for name in ("text-encoder.yaml", "cifar-cnn.yaml", "gpt2-small.yaml"):
        shutil.copy(EXAMPLES / name, repo / "configs" / name)
    shutil.copytree(EXAMPLES / "models", repo / "configs" / "models")  # gpt2-small's hf_config
    (repo / "configs" / "compose.yaml").write_text("services: {web: {image: nginx}}\n", encoding="utf-8")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "one")
    encoder = repo / "configs" / "text-encoder.yaml"
    encoder.write_text(encoder.read_text(encoding="utf-8").replace("batch_size: 64", "batch_size: 128"), encoding="utf-8")
    git(repo, "rm", "-q", "configs/cifar-cnn.yaml")
    shutil.copy(EXAMPLES / "atari-cnn.yaml", repo / "configs" / "atari-cnn.yaml")
    small = repo / "configs" / "gpt2-small.yaml"
    small.write_text(small.read_text(encoding="utf-8").replace("optimizer: adamw", "optimizer: [adamw"), encoding="utf-8")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "two")
    return repo


def test_diff_between_two_commits_in_json(repo):
    # the working tree is commit two; compare it with commit one, from a subdirectory
    done = memfit("diff", "HEAD~1", "--format", "json", cwd=repo / "configs")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["base"] == "HEAD~1"
    files = {f["path"]: f for f in report["files"]}
    assert sorted(files) == ["configs/atari-cnn.yaml", "configs/cifar-cnn.yaml", "configs/gpt2-small.yaml", "configs/text-encoder.yaml"]

    encoder = files["configs/text-encoder.yaml"]
    old_text = EXAMPLES / "text-encoder.yaml"
    assert encoder["before"] == footprint(old_text)
    assert encoder["after"] == footprint(repo / "configs" / "text-encoder.yaml")
    assert encoder["delta"] == {k: encoder["after"][k] - encoder["before"][k] for k in encoder["before"]}
    assert encoder["delta"]["parameters"] == 0 and encoder["delta"]["activations"] > 0
    assert "diagnostics" not in encoder

    added, removed = files["configs/atari-cnn.yaml"], files["configs/cifar-cnn.yaml"]
    assert added["before"] is None and added["delta"] == added["after"] == footprint(EXAMPLES / "atari-cnn.yaml")
    assert removed["after"] is None and removed["delta"] == {k: -v for k, v in footprint(EXAMPLES / "cifar-cnn.yaml").items()}

    broken = files["configs/gpt2-small.yaml"]
    assert broken["before"] == footprint(EXAMPLES / "gpt2-small.yaml") and broken["after"] is None and broken["delta"] is None
    assert [(d["side"], d["code"]) for d in broken["diagnostics"]] == [("after", "yaml-syntax")]


def test_diff_against_the_working_tree_and_between_paths(repo):
    encoder = repo / "configs" / "text-encoder.yaml"
    encoder.write_text(encoder.read_text(encoding="utf-8").replace("batch_size: 128", "batch_size: 32"), encoding="utf-8")
    done = memfit("diff", "HEAD", "configs/text-encoder.yaml", "--format", "json", cwd=repo)
    (entry,) = json.loads(done.stdout)["files"]
    assert entry["path"] == "configs/text-encoder.yaml" and entry["delta"]["total"] < 0
    text = memfit("diff", "HEAD", "configs/text-encoder.yaml", cwd=repo).stdout
    assert "configs/text-encoder.yaml: 745.63 MiB → 311.98 MiB (-433.64 MiB, -58.2%)" in text and "activations" in text


def test_markdown_largest_growth_first_and_fail_on_growth(repo):
    done = memfit("diff", "HEAD~1", "--format", "markdown", "--fail-on-growth", "5%", cwd=repo)
    assert done.returncode == 1
    assert "configs/text-encoder.yaml: the total grew by 63.3%, more than 5%" in done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [
        "configs/text-encoder.yaml",  # +289.09 MiB
        "configs/atari-cnn.yaml",  # added
        "configs/cifar-cnn.yaml",  # removed
        "configs/gpt2-small.yaml",  # no footprint now
    ]
    assert rows[0].startswith("| `configs/text-encoder.yaml` | 456.53 MiB | 745.63 MiB | +289.09 MiB (+63.3%) |")
    assert memfit("diff", "HEAD~1", "--fail-on-growth", "70%", cwd=repo).returncode == 0
    assert memfit("diff", "HEAD", "--fail-on-growth", "0%", cwd=repo).returncode == 0  # nothing changed since


def test_bad_input(repo, tmp_path):
    unknown = memfit("diff", "no-such-rev", cwd=repo)
    assert unknown.returncode == 2 and "unknown revision 'no-such-rev'" in unknown.stderr and "Traceback" not in unknown.stderr
    outside = memfit("diff", "HEAD", str(tmp_path), cwd=repo)
    assert outside.returncode == 2 and "outside the repository" in outside.stderr
    missing = memfit("diff", "HEAD", "configs/nope.yaml", cwd=repo)
    assert missing.returncode == 2 and "no such file" in missing.stderr
    assert memfit("diff", "HEAD", "--fail-on-growth", "lots", cwd=repo).returncode == 2
    nowhere = tmp_path / "plain"
    nowhere.mkdir()
    assert memfit("diff", "HEAD", cwd=nowhere).returncode == 2


def test_config_that_does_not_parse_at_the_revision(repo):
    small = repo / "configs" / "gpt2-small.yaml"
    shutil.copy(EXAMPLES / "gpt2-small.yaml", small)
    done = memfit("diff", "HEAD", "configs/gpt2-small.yaml", "--format", "json", cwd=repo)
    assert done.returncode == 0
    (entry,) = json.loads(done.stdout)["files"]
    assert entry["before"] is None and entry["after"] == footprint(small) and entry["delta"] is None
    assert [(d["side"], d["code"]) for d in entry["diagnostics"]] == [("before", "yaml-syntax")]
    assert "no footprint at HEAD:" in memfit("diff", "HEAD", "configs/gpt2-small.yaml", cwd=repo).stdout


def test_a_referenced_config_json_is_read_at_the_revision(repo):
    """gpt2-small names models/gpt2.json: at HEAD~1 both come from git, in the working tree both
    from disk. Halving n_layer in the working tree's config.json alone changes the after side."""
    model = repo / "configs" / "models" / "gpt2.json"
    model.write_text(model.read_text(encoding="utf-8").replace('"n_layer": 12', '"n_layer": 6'), encoding="utf-8")
    small = repo / "configs" / "gpt2-small.yaml"
    shutil.copy(EXAMPLES / "gpt2-small.yaml", small)
    done = memfit("diff", "HEAD~1", "configs/gpt2-small.yaml", "--format", "json", cwd=repo)
    (entry,) = json.loads(done.stdout)["files"]
    assert entry["before"] == footprint(EXAMPLES / "gpt2-small.yaml")
    assert entry["after"] == footprint(small) and entry["delta"]["parameters"] < 0
    # a config.json broken at the revision: its diagnostics name it relative to the repository root
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "three")
    model.write_text("{", encoding="utf-8")
    git(repo, "commit", "-qam", "four")
    model.write_text((EXAMPLES / "models" / "gpt2.json").read_text(encoding="utf-8"), encoding="utf-8")
    (entry,) = json.loads(memfit("diff", "HEAD", "configs/gpt2-small.yaml", "--format", "json", cwd=repo).stdout)["files"]
    assert entry["before"] is None and entry["after"] == footprint(EXAMPLES / "gpt2-small.yaml")
    assert [(d["side"], d["code"], d.get("file")) for d in entry["diagnostics"]] == [("before", "json-syntax", "configs/models/gpt2.json")]


# ------------------------------------------------------------------------------------------
# The gated figure (issue 19) and a diff that cannot be fooled (issue 23)


def check_json(path: Path, *extra) -> dict:
    done = subprocess.run([sys.executable, "-m", "memfit", "check", "--format", "json", *extra, str(path)], capture_output=True, text=True, check=False)
    return json.loads(done.stdout)["files"][0]


def _gpt2_run(impl: str, memory: int | None = None) -> str:
    """GPT-2 small, one 16-token sequence: its peak is the optimizer step, whose temporaries depend on optimizer_impl."""
    text = (EXAMPLES / "gpt2-small.yaml").read_text(encoding="utf-8")
    text = text.replace("micro_batch: 8", "micro_batch: 1").replace("seq_len: 1024", "seq_len: 16")
    text = text.replace("  attention: eager", f"  attention: eager\n  optimizer_impl: {impl}")
    if memory is not None:
        text = text.replace("  memory: 40 GiB\n  reserve: 2 GiB\n", f"  memory: {memory}\n")
    return text


@pytest.fixture
def run_repo(tmp_path):
    """A config with a training section committed with fused AdamW, and its peaks under both impls as check reports them."""
    repo = tmp_path / "runs"
    (repo / "models").mkdir(parents=True)
    shutil.copy(EXAMPLES / "models" / "gpt2.json", repo / "models" / "gpt2.json")
    probe = repo / "probe.yaml"
    peaks = {}
    for impl in ("fused", "foreach"):
        probe.write_text(_gpt2_run(impl), encoding="utf-8")
        peaks[impl] = check_json(probe)["peak"]["bytes"]
    probe.unlink()
    assert peaks["foreach"] > peaks["fused"]  # foreach's temporaries (one per parameter at once); fused has none
    budget = (peaks["fused"] + peaks["foreach"]) // 2
    (repo / "run.yaml").write_text(_gpt2_run("fused", budget), encoding="utf-8")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "fused")
    (repo / "run.yaml").write_text(_gpt2_run("foreach", budget), encoding="utf-8")
    return repo, peaks


def test_diff_compares_the_gated_peak_and_shows_pass_to_fail(run_repo):
    repo, peaks = run_repo
    after = check_json(repo / "run.yaml")
    assert after["footprint"] is not None and any(d["code"] == "budget-exceeded" for d in after["diagnostics"])
    done = memfit("diff", "HEAD", "--format", "json", cwd=repo)
    (entry,) = json.loads(done.stdout)["files"]
    # the footprint does not see optimizer_impl; the peak, which the gate compares, does
    assert entry["delta"]["total"] == 0
    assert entry["before_peak"]["bytes"] == peaks["fused"] and entry["after_peak"] == after["peak"]
    assert entry["gated"] == {"figure": "peak", "before": peaks["fused"], "after": peaks["foreach"], "delta": peaks["foreach"] - peaks["fused"]}
    assert entry["status"] == {"before": "pass", "after": "fail"}

    text = memfit("diff", "HEAD", cwd=repo).stdout
    line = next(line for line in text.splitlines() if line.startswith("run.yaml: "))
    assert line.startswith("run.yaml: peak ") and "unchanged" not in line and line.endswith("; PASS → FAIL")
    assert "budget-exceeded" in text
    markdown = memfit("diff", "HEAD", "--format", "markdown", cwd=repo).stdout
    assert "❌ **pass → fail**" in markdown

    # growth of the peak fires --fail-on-growth; and a pass turned into a fail fires it whatever the share
    share = (peaks["foreach"] - peaks["fused"]) * 100 / peaks["fused"]
    under = memfit("diff", "HEAD", "--fail-on-growth", f"{share / 2:.3f}%", cwd=repo)
    assert under.returncode == 1 and "run.yaml: passed its budget at HEAD and fails it now" in under.stderr
    (repo / "run.yaml").write_text(_gpt2_run("foreach", 10**15), encoding="utf-8")  # same peaks, a budget both fit
    grew = memfit("diff", "HEAD", "--fail-on-growth", f"{share / 2:.3f}%", cwd=repo)
    assert grew.returncode == 1 and f"run.yaml: the peak grew by {share:.1f}%" in grew.stderr
    assert memfit("diff", "HEAD", "--fail-on-growth", f"{share * 2:.3f}%", cwd=repo).returncode == 0


def test_a_newline_in_a_name_cannot_choose_another_files_before_side(tmp_path):
    """git cat-file --batch reads one request a line: a name with a newline used to split into two
    requests, and every later file got the previous one's blob. Names now never reach that protocol."""
    repo = tmp_path / "inject"
    repo.mkdir()
    small = (EXAMPLES / "text-encoder.yaml").read_text(encoding="utf-8")
    big = small.replace("batch_size: 64", "batch_size: 512")
    tricky = "a\nHEAD:z.yaml\n\x1b[31mred.yaml"
    (repo / tricky).write_text(small, encoding="utf-8")
    (repo / "z.yaml").write_text(big, encoding="utf-8")
    (repo / "zz.yaml").write_text(small, encoding="utf-8")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "one")
    (repo / "zz.yaml").write_text(big, encoding="utf-8")  # grew: must be seen as growth from `small`
    done = memfit("diff", "HEAD", "--format", "json", cwd=repo)
    assert done.returncode == 0, done.stderr
    files = {f["path"]: f for f in json.loads(done.stdout)["files"]}
    assert set(files) == {tricky, "z.yaml", "zz.yaml"}
    expected_small, expected_big = check_json(EXAMPLES / "text-encoder.yaml")["footprint"], check_json(repo / "z.yaml")["footprint"]
    assert files[tricky]["before"] == files[tricky]["after"] == expected_small
    assert files["z.yaml"]["before"] == expected_big
    assert files["zz.yaml"]["before"] == expected_small and files["zz.yaml"]["after"] == expected_big
    assert memfit("diff", "HEAD", "--fail-on-growth", "5%", cwd=repo).returncode == 1
    # the name's control characters are escaped in every format, as check escapes them
    for fmt in ("text", "markdown"):
        out = memfit("diff", "HEAD", "--format", fmt, cwd=repo).stdout
        assert "\x1b" not in out and "\\x1b[31mred.yaml" in out
        assert not any(line.startswith("HEAD:z.yaml") for line in out.splitlines())


def test_both_sides_go_through_checks_input_checks(tmp_path):
    import os

    repo = tmp_path / "inputs"
    repo.mkdir()
    config = (EXAMPLES / "text-encoder.yaml").read_text(encoding="utf-8")
    (repo / "big.yaml").write_text(config + "#" * 5000 + "\n", encoding="utf-8")
    (repo / "small.yaml").write_text(config, encoding="utf-8")
    os.symlink("small.yaml", repo / "link.yaml")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "one")
    (repo / "untracked.yaml").write_text(config + "#" * 6000 + "\n", encoding="utf-8")
    os.mkfifo(repo / "fifo.yaml")  # would block a reader forever
    limit = str(len(config.encode()) + 100)
    done = memfit("diff", "HEAD", "--format", "json", "--max-file-size", limit, cwd=repo)
    assert done.returncode == 0, done.stderr
    files = {f["path"]: f for f in json.loads(done.stdout)["files"]}
    codes = {path: [(d["side"], d["code"]) for d in f.get("diagnostics", [])] for path, f in files.items()}
    assert codes["big.yaml"] == [("before", "io"), ("after", "io")]
    assert "over the" in files["big.yaml"]["diagnostics"][0]["message"]
    assert codes["untracked.yaml"] == [("after", "io")]
    assert "fifo.yaml" not in files  # git lists no FIFO; named on the command line, it is refused, not opened
    (fifo,) = json.loads(memfit("diff", "HEAD", "fifo.yaml", "--format", "json", cwd=repo).stdout)["files"]
    assert [(d["side"], d["code"]) for d in fifo["diagnostics"]] == [("after", "io")] and "FIFO" in fifo["diagnostics"][0]["message"]
    assert codes["link.yaml"] == [("before", "io")]  # a symbolic link at the revision is not followed into git's objects
    assert files["small.yaml"]["before"] == files["small.yaml"]["after"] == check_json(repo / "small.yaml")["footprint"]
