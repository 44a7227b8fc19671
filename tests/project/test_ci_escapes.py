"""tests/conftest.py under CI=true: no skip escapes (an importorskip, a skip at collection, a plain skip), a test
marked `gpu` is the one kind skipped (no GPU on CI) and the summary counts it, a strict xfail stays an xfail, and a
file a test leaves in the checkout fails the run. Run on a scratch project that holds a copy of the conftest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TESTS = '''
import pytest

def test_ok():
    pass

def test_plain_skip():
    pytest.skip("nope")

def test_importorskip():
    pytest.importorskip("memfit_no_such_module_xyz")

@pytest.mark.gpu
def test_on_a_gpu():
    assert False, "never run without a GPU"

@pytest.mark.xfail(strict=True)
def test_known_failure():
    assert 0
'''
MODULE_SKIP = 'import pytest\npytest.importorskip("memfit_no_such_module_xyz")\n\ndef test_never():\n    pass\n'
WRITES = 'from pathlib import Path\n\ndef test_writes_into_the_checkout():\n    (Path(__file__).parents[1] / "left.txt").write_text("x")\n'


def project(tmp_path: Path, **files: str) -> Path:
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    for name, text in files.items():
        (tmp_path / "tests" / f"{name}.py").write_text(text, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True, env=env)
    subprocess.run([*git, "add", "-A"], cwd=tmp_path, check=True, env=env)
    subprocess.run([*git, "commit", "-qm", "scratch"], cwd=tmp_path, check=True, env=env)
    return tmp_path


def pytest_run(path: Path, ci: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI" and not k.startswith("GIT_")}
    if ci:
        env["CI"] = "true"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "tests"], cwd=path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_under_ci_every_skip_fails_a_gpu_test_is_counted_and_a_file_left_in_the_checkout_fails(tmp_path):
    path = project(tmp_path, test_escapes=TESTS, test_writes=WRITES)
    done = pytest_run(path, ci=True)
    out = done.stdout
    assert done.returncode == 1, out
    assert "FAILED tests/test_escapes.py::test_plain_skip" in out and "FAILED tests/test_escapes.py::test_importorskip" in out, out
    assert "SKIPPED" in out and "needs a GPU (marked gpu)" in out and "1 xfailed" in out and "2 passed" in out, out
    assert "gpu: 1 tests marked gpu, 1 skipped (no GPU here)" in out, out
    assert "tests wrote into the checkout" in out and "left.txt" in out, out
    (path / "left.txt").unlink()
    done = pytest_run(path, ci=False)  # a developer without the package gets the skips; a left file is named only
    assert done.returncode == 0 and "2 passed, 3 skipped, 1 xfailed" in done.stdout and "left.txt" in done.stdout, done.stdout


def test_under_ci_a_skip_at_collection_fails(tmp_path):
    done = pytest_run(project(tmp_path, test_module=MODULE_SKIP), ci=True)
    assert done.returncode != 0 and "skipped at collection" in done.stdout and "memfit_no_such_module_xyz" in done.stdout, done.stdout
