"""The project's own promises: the README's commands are what CI runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    command = ci[-1]
    assert "pytest" in command and "pip install" in command
    assert f"\n{command}\n" in (ROOT / "README.md").read_text()


def test_every_documented_diagnostic_code_is_a_sarif_rule_and_vice_versa():
    import re

    from memfit.report.reporters import RULES

    readme = (ROOT / "docs" / "cli.md").read_text()
    table = readme[readme.index("## Diagnostic codes (stable)") :]
    table = table.split("\n\n#")[0]
    documented = re.findall(r"^\| `([a-z-]+)` \| ([a-z]+) \|", table, re.MULTILINE)
    assert sorted(code for code, _ in documented) == sorted(RULES)
    from memfit.diagnostics.codes import CODES

    assert {code: severity for code, severity in documented} == {code.id: code.severity for code in CODES.values()}
    source = "".join(p.read_text() for p in (ROOT / "src" / "memfit").rglob("*.py"))
    for code in RULES:
        assert f'"{code}"' in source
