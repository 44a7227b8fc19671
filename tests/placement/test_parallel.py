"""Many files: a pool only when it pays, results in input order, pre-commit's splitting still fine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_module import bench

from memfit.cli import pool
from memfit.cli.pool import MIN_FILES_PER_JOB, jobs_for

ROOT = Path(__file__).resolve().parents[2]




@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(pool, "cores", lambda: 4)


def test_few_files_get_no_pool(four_cores):
    assert jobs_for(1) == 1
    assert jobs_for(2 * MIN_FILES_PER_JOB - 1) == 1


def test_many_files_get_a_worker_per_core_at_most(four_cores):
    assert jobs_for(2 * MIN_FILES_PER_JOB) == 2
    assert jobs_for(100 * MIN_FILES_PER_JOB) == 4


def test_jobs_asked_for_are_given_but_never_more_than_files(four_cores):
    assert jobs_for(10, jobs=3) == 3
    assert jobs_for(2, jobs=8) == 2
    assert jobs_for(10_000, jobs=1) == 1


def test_a_pool_returns_results_in_input_order_with_footprints(tmp_path):
    paths = []
    for i in range(12):
        path = tmp_path / f"c{i}.yaml"
        path.write_text(bench.config_text(5 + i, seed=i, name=f"c{i}"), encoding="utf-8")
        paths.append(str(path))
    paths.reverse()
    from memfit.check.pipeline import Options
    from memfit.check.pipeline import safe_check

    pooled = pool.map_checked(paths, Options(), jobs=3)
    alone = [safe_check(p, Options()) for p in paths]
    assert [r.path for r in pooled] == paths
    assert [(r.footprint, r.budget, r.diagnostics) for r in pooled] == [(r.footprint, r.budget, r.diagnostics) for r in alone]


@pytest.mark.slow
@pytest.mark.parametrize("serial", ["true", "false"], ids=["one-memfit-pools", "pre-commit-splits"])
def test_pre_commit_runs_the_hook_on_many_files(tmp_path, serial):
    if shutil.which("git") is None:
        pytest.fail("git is needed for the pre-commit test")
    repo = tmp_path / "repo"
    (repo / "configs").mkdir(parents=True)
    for i in range(150):
        (repo / "configs" / f"c{i:03d}.yaml").write_text(bench.config_text(20, seed=i, name=f"c{i}"), encoding="utf-8")
    (repo / ".pre-commit-config.yaml").write_text(
        "repos:\n- repo: local\n  hooks:\n  - id: memfit\n    name: memfit\n"
        f"    entry: {sys.executable} -m memfit check\n    args: [--budget, 100TiB]\n    language: system\n    files: ^configs/.*\\.yaml$\n"
        f"    require_serial: {serial}\n",
        encoding="utf-8",
    )
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"), "GIT_CONFIG_GLOBAL": os.devnull}

    def git(*args):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, env=env)

    def hook():
        return subprocess.run([sys.executable, "-m", "pre_commit", "run", "--all-files", "--verbose"], cwd=repo, capture_output=True, text=True, env=env, check=False)

    git("init", "-q")
    git("add", ".")
    done = hook()
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("checked, all fit") == (1 if serial == "true" else done.stdout.count("memfit: "))
    if serial == "true":
        assert "150 configs checked, all fit" in done.stdout

    broken = repo / "configs" / "c137.yaml"
    broken.write_text(broken.read_text(encoding="utf-8").replace("optimizer:", "optimiser:"), encoding="utf-8")
    git("add", ".")
    done = hook()
    assert done.returncode == 1
    assert "configs/c137.yaml:" in done.stdout and "error[schema]" in done.stdout
    assert done.stdout.count("configs/c") == 2  # its unknown key and its missing optimizer, nothing else
