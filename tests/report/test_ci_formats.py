"""The CI gate's outputs, driven through the real CLI: GitHub workflow-command annotations,
SARIF 2.1.0 checked against the official schema, and the Markdown job summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import needs
import pytest

from memfit.report.reporters import RULES, _escape_data, _escape_property
from memfit.diagnostics.units import human

ROOT = Path(__file__).resolve().parents[2]

# 1000 x 1000 float32 weights with Adam: 4,000,000 B of parameters, 4,000,000 B of gradients,
# 2 x 4,000,000 B of optimizer state = 16,000,000 B in total.
TOTAL = 16_000_000
OVER = """\
memfit: 1
name: over
device: {name: "card, 10MB: small", memory: 10 MB}
optimizer: adam
parameters:
  - name: w
    shape: [1000, 1000]
"""
NEAR = """\
memfit: 1
device: {memory: 17 MB}
optimizer: adam
parameters:
  - name: w
    shape: [1000, 1000]
"""
FITS = """\
memfit: 1
device:
  memory: 24 GiB
optimizer: adam
parameters:
  - name: w
    shape: [1000, 1000]
"""
BROKEN = "memfit: 1\noptimizer: [adam\n"
UNRELATED = "services:\n  web:\n    image: nginx\n"


def memfit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memfit", *args], check=False, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    for name, text in {"over.yaml": OVER, "near.yaml": NEAR, "fits.yaml": FITS, "broken.yaml": BROKEN, "compose.yaml": UNRELATED}.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


# ---- github ---------------------------------------------------------------------------------


def test_github_annotations_exact(configs: Path) -> None:
    run = memfit("check", "--format", "github", "--skip-unrecognized", "over.yaml", "near.yaml", "fits.yaml", "compose.yaml", cwd=configs)
    assert run.returncode == 1, run.stderr
    assert run.stderr == ""
    # the budget-exceeded error sits on the value of device.memory: "10 MB" on line 3
    col = OVER.splitlines()[2].index("10 MB") + 1
    assert col == 45
    # near.yaml is at 16/17 = 94.1% of its budget, above the default 90% mark: a warning, whose
    # '%' signs are escaped as workflow commands require
    assert run.stdout.splitlines() == [
        (
            f"::error file=over.yaml,line=3,col={col},endLine=3,endColumn={col + 5},title=memfit budget-exceeded::"
            "total 16,000,000 B (15.26 MiB) exceeds the budget 10,000,000 B (9.54 MiB) (device.memory 10 MB) by 6,000,000 B (5.72 MiB)"
        ),
        (
            "::warning file=near.yaml,line=2,col=18,endLine=2,endColumn=23,title=memfit near-budget::"
            "total 16,000,000 B (15.26 MiB) is 94.1%25 of the budget 17,000,000 B (16.21 MiB) (device.memory 17 MB), "
            "above the 90%25 warning mark; headroom 1,000,000 B (976.56 KiB)"
        ),
        "memfit: 1 config of 3 failed (1 error, 1 warning), 1 skipped (not memfit configs)",
    ]


def test_github_positions_match_the_json_contract(configs: Path) -> None:
    """Same diagnostics, same places: the annotation's 1-based line/col are the json ranges + 1."""
    files = ["over.yaml", "near.yaml", "broken.yaml"]
    report = json.loads(memfit("check", "--format", "json", *files, cwd=configs).stdout)
    expected = []
    for entry in report["files"]:
        for d in entry["diagnostics"]:
            start, end = d["range"]["start"], d["range"]["end"]
            expected.append(
                (entry["path"], start["line"] + 1, start["character"] + 1, end["line"] + 1, end["character"] + 1, d["severity"], d["code"])
            )
    seen = []
    for line in memfit("check", "--format", "github", *files, cwd=configs).stdout.splitlines():
        if not line.startswith("::"):
            continue
        command, rest = line[2:].split(" ", 1)
        properties = dict(p.split("=", 1) for p in rest.split("::", 1)[0].split(","))
        seen.append(
            (
                properties["file"],
                int(properties["line"]),
                int(properties["col"]),
                int(properties["endLine"]),
                int(properties["endColumn"]),
                command,
                properties["title"].removeprefix("memfit "),
            )
        )
    assert len(expected) == 3
    assert seen == expected


def test_github_escapes_path_properties(tmp_path: Path) -> None:
    (tmp_path / "a,b:c%.yaml").write_text(OVER, encoding="utf-8")
    run = memfit("check", "--format", "github", "a,b:c%.yaml", cwd=tmp_path)
    assert run.stdout.startswith("::error file=a%2Cb%3Ac%25.yaml,line=3,"), run.stdout


def test_escape_rules() -> None:
    # GitHub's toolkit: data escapes % CR LF; properties also escape ':' and ','
    assert _escape_data("50% done\r\nnext: a, b") == "50%25 done%0D%0Anext: a, b"
    assert _escape_property("50% done\r\nnext: a, b") == "50%25 done%0D%0Anext%3A a%2C b"
    assert _escape_data("%0A") == "%250A"  # '%' first, so an escape is never double-read


# ---- sarif ----------------------------------------------------------------------------------


def sarif_schema_path() -> Path | None:
    """The official SARIF 2.1.0 schema is not copied into this repository (the shared test data's
    terms); it is read from $MEMFIT_SARIF_SCHEMA or ../shared/test-data/ beside the checkout."""
    candidates = [os.environ.get("MEMFIT_SARIF_SCHEMA"), ROOT.parent / "shared" / "test-data" / "sarif-schema-2.1.0.json"]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@pytest.fixture(scope="module")
def sarif_validator():
    path = sarif_schema_path()
    if path is None:
        needs.unavailable("official SARIF 2.1.0 schema not found: set MEMFIT_SARIF_SCHEMA or put shared/test-data/ beside the checkout")
    import jsonschema

    schema = json.loads(path.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    # the schema declares draft-04; validate with that draft's rules, formats included, offline
    # (every $ref in it is local, so nothing is fetched)
    assert schema["$schema"] == "http://json-schema.org/draft-04/schema#"
    assert cls is jsonschema.Draft4Validator
    cls.check_schema(schema)
    # "uri" is checked only with rfc3986-validator installed (the test extra has it)
    assert "uri" in cls.FORMAT_CHECKER.checkers
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def sarif_of(configs: Path, *files: str) -> dict:
    run = memfit("check", "--format", "sarif", "--skip-unrecognized", *files, cwd=configs)
    assert run.returncode == 1, run.stderr
    return json.loads(run.stdout)


def test_sarif_is_valid_against_the_official_schema(configs: Path, sarif_validator) -> None:
    log = sarif_of(configs, "over.yaml", "near.yaml", "fits.yaml", "broken.yaml", "compose.yaml")
    errors = sorted(sarif_validator.iter_errors(log), key=lambda e: list(e.path))
    assert errors == [], "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    # and the validator is not a pushover: a result without its message, a 0-based line,
    # or an informationUri that is no URI are each rejected
    for spoil in (
        lambda run: run["results"][0].pop("message"),
        lambda run: run["results"][0]["locations"][0]["physicalLocation"]["region"].update(startLine=0),
        lambda run: run["tool"]["driver"].update(informationUri="memfit home page"),
    ):
        broken = json.loads(json.dumps(log))
        spoil(broken["runs"][0])
        assert list(sarif_validator.iter_errors(broken))


def test_sarif_content(configs: Path) -> None:
    files = ["over.yaml", "near.yaml", "fits.yaml", "broken.yaml", "compose.yaml"]
    log = sarif_of(configs, *files)
    assert log["version"] == "2.1.0"
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "memfit"
    from memfit import __version__

    assert driver["version"] == __version__
    # a link to memfit's docs where its repository is known (tests/diagnostics/test_provenance.py), else none at all
    assert driver.get("informationUri", "https://").startswith("https://")
    assert all(rule.get("helpUri", "https://").startswith("https://") for rule in driver["rules"])
    rules = driver["rules"]
    assert [r["id"] for r in rules][: len(RULES)] == list(RULES)
    for rule in rules:
        assert rule["shortDescription"]["text"] and rule["help"]["text"]
    assert run["columnKind"] == "unicodeCodePoints"

    report = json.loads(memfit("check", "--format", "json", "--skip-unrecognized", *files, cwd=configs).stdout)
    expected = [(f["path"], d) for f in report["files"] for d in f["diagnostics"]]
    assert len(run["results"]) == len(expected) == 3
    levels = {"error": "error", "warning": "warning"}
    for result, (path, d) in zip(run["results"], expected):
        assert result["ruleId"] == d["code"]
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["level"] == levels[d["severity"]]
        assert result["message"]["text"] == d["message"]
        (location,) = result["locations"]
        physical = location["physicalLocation"]
        assert physical["artifactLocation"]["uri"] == path
        assert not os.path.isabs(physical["artifactLocation"]["uri"])
        start, end = d["range"]["start"], d["range"]["end"]
        assert physical["region"] == {
            "startLine": start["line"] + 1,
            "startColumn": start["character"] + 1,
            "endLine": end["line"] + 1,
            "endColumn": end["character"] + 1,
        }
    over = run["results"][0]
    assert over["properties"]["footprint"]["total"] == TOTAL
    assert over["properties"]["budget"] == 10_000_000
    assert [f["path"] for f in run["properties"]["files"]] == ["over.yaml", "near.yaml", "fits.yaml", "broken.yaml"]


def test_sarif_columns_count_code_points(tmp_path: Path) -> None:
    # two 2-byte UTF-8 characters before the value: code points, not bytes, set the column
    (tmp_path / "u.yaml").write_text(OVER.replace('"card, 10MB: small"', '"ün"'), encoding="utf-8")
    log = json.loads(memfit("check", "--format", "sarif", "u.yaml", cwd=tmp_path).stdout)
    region = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
    line = OVER.replace('"card, 10MB: small"', '"ün"').splitlines()[2]
    assert region["startColumn"] == line.index("10 MB") + 1
    assert region["endColumn"] == line.index("10 MB") + len("10 MB") + 1


def test_absolute_paths_become_relative(configs: Path) -> None:
    log = json.loads(memfit("check", "--format", "sarif", str(configs / "over.yaml"), cwd=configs).stdout)
    assert log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "over.yaml"


# ---- summary --------------------------------------------------------------------------------


def test_summary_md_appends_a_table(configs: Path) -> None:
    summary = configs / "summary.md"
    summary.write_text("# earlier step\n\n", encoding="utf-8")
    files = ["over.yaml", "near.yaml", "fits.yaml", "broken.yaml", "compose.yaml"]
    run = memfit("check", "--skip-unrecognized", "--summary-md", "summary.md", *files, cwd=configs)
    assert run.returncode == 1
    # the normal report still goes to stdout, unchanged
    assert run.stdout.splitlines()[-1] == "memfit: 2 configs of 4 failed (2 errors, 1 warning), 1 skipped (not memfit configs)"
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("# earlier step\n\n### memfit\n")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    budgets = {"over.yaml": 10_000_000, "near.yaml": 17_000_000, "fits.yaml": 24 * 2**30}
    expected = [
        f"| `{name}` | {human(TOTAL)} | {human(budget)} | {human(budget - TOTAL)} | {verdict} |"
        for name, budget, verdict in [
            ("over.yaml", budgets["over.yaml"], f"❌ exceeds by {human(TOTAL - budgets['over.yaml'])}"),
            ("near.yaml", budgets["near.yaml"], "⚠️ fits, near budget"),
            ("fits.yaml", budgets["fits.yaml"], "✅ fits"),
        ]
    ] + ["| `broken.yaml` | — | — | — | ❌ yaml-syntax |"]
    assert rows == expected
    assert "| file | total | budget | headroom | verdict |" in text
    assert "compose.yaml" not in text  # skipped files are not configs
    assert "-5.72 MiB" in rows[0]  # negative headroom is the overshoot

    memfit("check", "--summary-md", "summary.md", "fits.yaml", cwd=configs)
    assert summary.read_text(encoding="utf-8").count("### memfit") == 2  # appended again, not replaced


@pytest.mark.parametrize("option", ["--summary-md", "--output"])
def test_unwritable_report_file_is_a_usage_error(configs: Path, option: str) -> None:
    run = memfit("check", option, str(configs / "no-such-dir" / "out"), "fits.yaml", cwd=configs)
    assert run.returncode == 2
    assert "cannot write" in run.stderr and "Traceback" not in run.stderr


def test_formats_listed_in_help(configs: Path) -> None:
    run = memfit("check", "--help", cwd=configs)
    assert "github" in run.stdout and "sarif" in run.stdout and "--summary-md" in run.stdout
