"""The project's own promises: the README's commands are what CI runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    command = ci[-1]
    assert "pytest" in command and "pip install" in command
    assert f"\n{command}\n" in (ROOT / "README.md").read_text()
