"""Hostile files against the command line, generated here at test time (no large fixtures in git):
output amplification, huge numbers, control characters, marker spellings, inputs that used to
end in an internal error, output paths onto inputs, and what the CI formats print for odd paths.
Each test names the class of defect it guards, not one example of it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OVER = "memfit: 1\ndevice: {memory: 10 MB}\noptimizer: adam\nparameters:\n  - [1000, 1000]\n"  # 16,000,000 B > 10 MB
FORMATS = [["--format", "text"], ["--format", "json"], ["--format", "github"], ["--format", "sarif"], ["--summary-md", "summary.md"]]


def memfit(*args: str, cwd: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    outer = {k: v for k, v in os.environ.items() if k != "GITHUB_WORKSPACE"}  # the test says where the root is
    full_env = {**outer, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))} | (env or {})
    return subprocess.run([sys.executable, "-m", "memfit", *args], cwd=cwd, env=full_env, capture_output=True, timeout=timeout, check=False)


# Runs memfit's command line once per format inside one interpreter (a process per format cost
# most of this file's time), each with its own stdout and stderr, as strict UTF-8 as a real one.
_DRIVER = r"""
import base64, io, json, sys, time, traceback
from memfit.cli.main import main
runs = []
for args in json.loads(sys.argv[1]):
    out, err = io.BytesIO(), io.BytesIO()
    sys.stdout = wrapped_out = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    sys.stderr = wrapped_err = io.TextIOWrapper(err, encoding="utf-8", write_through=True)
    started = time.monotonic()
    try:
        code = main(args)
    except SystemExit as stop:
        code = stop.code
    except BaseException:
        sys.stderr.write(traceback.format_exc())
        code = 1
    seconds = time.monotonic() - started
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    runs.append([code, base64.b64encode(out.getvalue()).decode(), base64.b64encode(err.getvalue()).decode(), seconds])
    wrapped_out.detach(), wrapped_err.detach()
print(json.dumps(runs))
"""


class Run:
    def __init__(self, returncode, stdout: bytes, stderr: bytes) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def every_output(tmp_path: Path, name: str) -> dict[str, tuple[Run, bytes, float]]:
    """Each output of memfit for one file: (run, what it wrote, seconds)."""
    import base64

    variants = FORMATS + [["explain", "--color", "never"]]
    commands = [["explain", "--color", "never", name] if args[0] == "explain" else ["check", *args, name] for args in variants]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(commands)], cwd=tmp_path, env=env, capture_output=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    out = {}
    summary = tmp_path / "summary.md"
    written_summary = summary.read_bytes() if summary.exists() else b""
    for args, (code, stdout, stderr, seconds) in zip(variants, json.loads(done.stdout)):
        run = Run(code, base64.b64decode(stdout), base64.b64decode(stderr))
        extra = written_summary if args[0] == "--summary-md" else b""
        out[" ".join(args)] = (run, run.stdout + run.stderr + extra, seconds)
    return out


def assert_no_internal_error(outputs) -> None:
    for label, (done, written, _) in outputs.items():
        assert b"Traceback" not in written, (label, written[-2000:])
        assert done.returncode in (0, 1), (label, done.returncode, written[:2000])
        if label == "--format json":
            codes = [d["code"] for f in json.loads(done.stdout)["files"] for d in f["diagnostics"]]
        elif label == "--format sarif":
            codes = [r["ruleId"] for run in json.loads(done.stdout)["runs"] for r in run["results"]]
        else:
            codes = re.findall(rb"\[(internal)\]|memfit (internal)::", written)
        assert "internal" not in codes and not [c for c in codes if isinstance(c, tuple) and any(c)], (label, written[:2000])


# --- output amplification ---------------------------------------------------------------------------


@pytest.mark.wallclock  # bounded by bytes (the report); the clock only as a generous outer limit
def test_an_aliased_megabyte_string_gives_a_small_report(tmp_path: Path):
    """One 1 MB anchored string used a thousand times (dims, a dtype, layer types): the report
    must stay small and quick, whatever the format."""
    big = "x" * 1_000_000
    uses = 1000
    text = (
        f'memfit: 1\nname: &s "{big}"\ndevice: {{memory: 1 GiB}}\noptimizer: adam\ndtypes: {{parameters: *s}}\n'
        + "parameters:\n"
        + "".join("  - [*s, 2]\n" for _ in range(uses))
        + "model: {input_shape: [4], batch_size: 1, layers: ["
        + ", ".join("{type: *s}" for _ in range(uses))
        + "]}\n"
    )
    (tmp_path / "amp.yaml").write_text(text, encoding="utf-8")
    outputs = every_output(tmp_path, "amp.yaml")
    assert_no_internal_error(outputs)
    for label, (done, written, seconds) in outputs.items():
        assert done.returncode == 1, label
        assert len(written) < 256 * 1024, (label, len(written))
        assert seconds < 60, (label, seconds)


def test_a_long_value_quoted_back_is_cut_short(tmp_path: Path):
    """A value echoed in a message (an unknown dtype, layer type, unit, key) is cut short, once or
    under the alias guard: the report of a 1 MB value is a few kilobytes."""
    big = "y" * 1_000_000
    text = (
        f"memfit: 1\nname: {big}\ndevice: {{memory: '{big} GB', reserve: {big}}}\noptimizer: {big}\n"
        f"dtypes: {{parameters: {big}}}\n{big}: 1\nparameters:\n  - {{shape: [2], name: {big}}}\n"
        f"model: {{input_shape: [4], batch_size: 1, layers: [{{type: {big}}}]}}\n"
    )
    (tmp_path / "long.yaml").write_text(text, encoding="utf-8")
    outputs = every_output(tmp_path, "long.yaml")
    assert_no_internal_error(outputs)
    for label, (done, written, _) in outputs.items():
        assert done.returncode == 1, label
        assert len(written) < 64 * 1024, (label, len(written))


# --- huge numbers -----------------------------------------------------------------------------------------

HUGE = {
    "dim-4400": "memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\nparameters:\n  - [" + "9" * 4400 + ", 2]\n",
    "dim-5000": "memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\nparameters:\n  - [" + "7" * 5000 + "]\n",
    "memory-4400": "memfit: 1\ndevice: {memory: " + "9" * 4400 + "}\noptimizer: adam\nparameters:\n  - [1000]\n",
    "memory-unit-million": "memfit: 1\ndevice: {memory: " + "9" * 1_000_000 + " GB}\noptimizer: adam\nparameters:\n  - [1000]\n",
    "dim-million": "memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\nparameters:\n  - [" + "9" * 1_000_000 + "]\n",
    "count-4400": "memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\nparameters:\n  - {shape: [2], count: " + "9" * 4400 + "}\n",
    "product-8000-digits": "memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\nparameters:\n  - [" + "9" * 4000 + ", " + "9" * 4000 + "]\n",
    "reserve-4400": "memfit: 1\ndevice: {memory: 1 GiB, reserve: " + "1" * 4400 + "}\noptimizer: adam\nparameters:\n  - [1000]\n",
}


@pytest.mark.wallclock  # big-integer arithmetic runs in C: the clock only as a generous outer limit
@pytest.mark.parametrize("case", sorted(HUGE))
def test_huge_numbers_are_formatted_or_refused_with_a_position(tmp_path: Path, case: str):
    (tmp_path / "huge.yaml").write_text(HUGE[case], encoding="utf-8")
    outputs = every_output(tmp_path, "huge.yaml")
    assert_no_internal_error(outputs)
    for label, (_, _, seconds) in outputs.items():
        assert seconds < 30, (label, seconds)  # a million-digit size took 33 s (now about 1 s)
    text = outputs["--format text"][1].decode()
    for line in text.splitlines()[:-1]:
        assert not line.startswith("huge.yaml:1:1:"), line  # at the number, not at the file's start


def test_the_language_server_answers_about_huge_numbers():
    """Hints, hover, lens and the footprint command on a config whose numbers are thousands of
    digits long: every request answered with a result, never an error."""
    from lsp_session import INIT, session

    uri = "file:///tmp/memfit-huge/huge.yaml"
    messages = [INIT, {"jsonrpc": "2.0", "method": "initialized", "params": {}}]
    for index, text in enumerate(HUGE[name] for name in ("dim-4400", "count-4400", "product-8000-digits", "memory-4400")):
        messages.append({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": uri, "languageId": "yaml", "version": index, "text": text}}})
        for method, params in [
            ("textDocument/inlayHint", {"textDocument": {"uri": uri}, "range": {"start": {"line": 0, "character": 0}, "end": {"line": 10, "character": 0}}}),
            ("textDocument/hover", {"textDocument": {"uri": uri}, "position": {"line": 4, "character": 6}}),
            ("textDocument/hover", {"textDocument": {"uri": uri}, "position": {"line": 2, "character": 12}}),
            ("textDocument/codeLens", {"textDocument": {"uri": uri}}),
            ("workspace/executeCommand", {"command": "memfit.footprint", "arguments": [uri]}),
        ]:
            messages.append({"jsonrpc": "2.0", "id": f"{index}-{method}-{len(messages)}", "method": method, "params": params})
        messages.append({"jsonrpc": "2.0", "method": "textDocument/didClose", "params": {"textDocument": {"uri": uri}}})
    _, replies = session(messages)
    answers = [r for r in replies if "id" in r and "method" not in r and r["id"] != "init"]
    assert len(answers) == 20
    assert not [r for r in answers if "error" in r], [r for r in answers if "error" in r]


# --- control characters -------------------------------------------------------------------------------

CONTROL = '"a\\e]0;pwned\\a\\e[2J\\r\\n::error::injected\\x85\\u2028|<b>x</b>"'


def controlled_config() -> str:
    return (
        f"memfit: 1\nname: {CONTROL}\ndevice: {{name: {CONTROL}, memory: 10 MB}}\noptimizer: adam\n"
        f"parameters:\n  - {{name: {CONTROL}, shape: [1000, 1000]}}\n"
        f"activations:\n  - {{name: {CONTROL}, shape: [10]}}\n"
        f"model:\n  input_shape: [4]\n  batch_size: 2\n  layers:\n    - {{type: Dense, units: 3, name: {CONTROL}}}\n"
    )


def raw_controls(data: bytes) -> list[str]:
    text = data.decode("utf-8", "replace")
    return sorted({f"U+{ord(c):04X}" for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F or c in "\u2028\u2029"})


@pytest.mark.parametrize("file_name", ["plain.yaml", "esc\x1b]0;t\x07\x1b[2J.yaml", "nl\n::error::x.yaml", "not-utf8-\udcff.yaml"])
def test_control_characters_are_escaped_in_every_human_facing_output(tmp_path: Path, file_name: str):
    (tmp_path / file_name).write_text(controlled_config(), encoding="utf-8")
    outputs = every_output(tmp_path, file_name)
    assert_no_internal_error(outputs)
    for label, (done, written, _) in outputs.items():
        assert raw_controls(written) == [], label
        written.decode("utf-8")  # a name that is not UTF-8 (a lone surrogate in Python) is written escaped
        if label in ("--format text", "explain --color never"):
            for line in written.decode().splitlines():
                assert not line.startswith("::"), (label, line)  # no workflow command smuggled in
    summary = (tmp_path / "summary.md").read_text(encoding="utf-8") if (tmp_path / "summary.md").exists() else ""
    memfit("check", "--summary-md", "summary.md", file_name, cwd=tmp_path)
    summary = (tmp_path / "summary.md").read_text(encoding="utf-8")
    rows = [line for line in summary.splitlines() if line.startswith("|")]
    assert rows and all(len(re.findall(r"(?<!\\)\|", row)) == len(re.findall(r"(?<!\\)\|", rows[0])) for row in rows), summary
    assert "<b>" not in summary


# --- the hook's marker ------------------------------------------------------------------------------------

BODY = "device: {memory: 10 MB}\noptimizer: adam\nparameters:\n  - [1000, 1000]\n"
MARKERS = {
    "anchor": "memfit: &v 1\n" + BODY,
    "tag": "memfit: !!int 1\n" + BODY,
    "plus": "memfit: +1\n" + BODY,
    "next-line": "memfit:\n  1\n" + BODY,
    "after-comment": "memfit: # the format version\n  1\n" + BODY,
    "comment-first": "# memfit config\n---\nmemfit: 1\n" + BODY,
    "complex-key": "? memfit\n: 1\n" + BODY,
    "escaped": '"memf\\x69t": 1\n' + BODY,
    "unicode-escape": '"\\u006demfit": 1\n' + BODY,
    "single-quoted": "'memfit': 1\n" + BODY,
    "indented": "".join("  " + line + "\n" for line in ("memfit: 1\n" + BODY).splitlines()),
    "flow": "{memfit: 1, device: {memory: 10 MB}, optimizer: adam, parameters: [[1000, 1000]]}\n",
    "merge": "base: &b {memfit: 1}\n<<: *b\n" + BODY,
    "alias-key": "x: &k memfit\n*k : 1\n" + BODY,
    "last-key": BODY + "memfit: 1\n",
}


@pytest.mark.parametrize("case", sorted(MARKERS))
def test_a_config_that_would_fail_is_never_skipped(tmp_path: Path, case: str):
    (tmp_path / "c.yaml").write_text(MARKERS[case], encoding="utf-8")
    done = memfit("check", "--skip-unrecognized", "c.yaml", cwd=tmp_path)
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 1, output
    assert "skipped" not in output, output


@pytest.mark.parametrize(
    "text",
    [
        # a Helm template: not YAML until rendered, and a comment that mentions the marker
        "# see {memfit: 1} in the docs\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n  labels: {{- include \"x\" . | nindent 4 }}\n",
        "description: 'memfit: 1 is the marker'\nsteps: [memfit]\n",
        "jobs:\n  memfit:\n    script: memfit check .\n",
        "pattern: 'a\\d+'\npath: \"C:\\\\tmp\"\n",
    ],
)
def test_other_yaml_is_still_skipped(tmp_path: Path, text: str):
    (tmp_path / "other.yaml").write_text(text, encoding="utf-8")
    done = memfit("check", "--skip-unrecognized", "other.yaml", cwd=tmp_path)
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 0, output
    assert "1 skipped" in output, output


# --- inputs that ended in an internal error -----------------------------------------------------------

BASE = "memfit: 1\ndevice: {memory: 1 GiB}\noptimizer: adam\n"
POSITIONED = {
    # case: (text, (1-based line, column) the diagnostic must be at)
    "warn-at-150": ("memfit: 1\ndevice: {memory: 1 GiB, warn_at: 150%}\noptimizer: adam\nparameters: [[10]]\n", (2, 34)),
    "int-tag": (BASE + "parameters: [[!!int abc]]\n", (4, 15)),
    "float-tag": (BASE + "parameters: [{shape: [1], count: !!float xyz}]\n", (4, 34)),
    "bool-tag": (BASE + "parameters: [{shape: [1], trainable: !!bool maybe}]\n", (4, 38)),
    "dim-5000": (BASE + "parameters: [[" + "5" * 5000 + "]]\n", (4, 15)),
    "nul": (BASE + "parameters: [[1]]\nname: a\x00b\n", (5, 8)),
    "del": (BASE + "name: a\x7fb\nparameters: [[1]]\n", (4, 8)),
    "esc": (BASE + "name: a\x1bb\nparameters: [[1]]\n", (4, 8)),
    "nel-moves-nothing": (BASE + 'name: "a\x85b"\nparameters: [[1]]\nfoo: 1\n', (6, 1)),
    "ls-moves-nothing": (BASE + 'name: "a\u2028b"\nparameters: [[1]]\nfoo: 1\n', (6, 1)),
}


@pytest.mark.parametrize("case", sorted(POSITIONED))
def test_bad_inputs_get_a_positioned_diagnostic(tmp_path: Path, case: str):
    text, (line, column) = POSITIONED[case]
    (tmp_path / "bad.yaml").write_bytes(text.encode("utf-8"))
    done = memfit("check", "bad.yaml", cwd=tmp_path)
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 1, output
    assert "internal" not in output and "Traceback" not in output, output
    assert output.startswith(f"bad.yaml:{line}:{column}: error["), output


@pytest.mark.parametrize("depth", [990, 5000])
@pytest.mark.parametrize("style", ["flow-list", "flow-map", "block"])
def test_deep_nesting_is_a_positioned_diagnostic(tmp_path: Path, depth: int, style: str):
    if style == "flow-list":
        nested = "[" * depth + "1" + "]" * depth
    elif style == "flow-map":
        nested = "{a: " * depth + "1" + "}" * depth
    else:
        nested = "\n" + "".join("  " * (i + 1) + "- \n" for i in range(depth)).rstrip(" \n") + " 1"
    (tmp_path / "deep.yaml").write_text(BASE + "parameters: [[1]]\nname: " + nested + "\n", encoding="utf-8")
    done = memfit("check", "deep.yaml", cwd=tmp_path)
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 1, output[:3000]
    assert "internal" not in output and "Traceback" not in output, output[:3000]
    assert not output.startswith("deep.yaml:1:1:"), output[:3000]


def test_a_lone_surrogate_is_reported_not_crashed_on(tmp_path: Path):
    for name, data in {
        "utf16.yaml": "\ufeff".encode("utf-16-le") + (BASE + "name: x").encode("utf-16-le") + b"\x00\xd8" + "\nparameters: [[1]]\n".encode("utf-16-le"),
        "utf8.yaml": (BASE + "name: x").encode() + b"\xed\xa0\x80" + b"\nparameters: [[1]]\n",
        "escape.yaml": (BASE + 'name: "\\ud800"\nparameters: [[1]]\n').encode(),
        "escape32.yaml": (BASE + 'name: "\\U0000d800"\nparameters: [[1]]\n').encode(),
    }.items():
        (tmp_path / name).write_bytes(data)
        for args in (["check"], ["check", "--format", "json"], ["explain"]):
            done = memfit(*args, name, cwd=tmp_path)
            output = (done.stdout + done.stderr).decode("utf-8", "replace")
            assert done.returncode == 1, (name, args, output)
            assert "internal" not in output and "Traceback" not in output, (name, args, output)
            assert not output.startswith(f"{name}:1:1:"), (name, args, output)


def test_two_merge_keys_are_a_duplicate_key(tmp_path: Path):
    text = "memfit: 1\nsmall: &s {memory: 1 MB}\nbig: &b {memory: 1 GiB}\ndevice:\n  <<: *s\n  <<: *b\noptimizer: adam\nparameters: [[1000]]\n"
    (tmp_path / "merge.yaml").write_text(text, encoding="utf-8")
    done = memfit("check", "--format", "json", "merge.yaml", cwd=tmp_path)
    diagnostics = json.loads(done.stdout)["files"][0]["diagnostics"]
    duplicate = [d for d in diagnostics if d["code"] == "duplicate-key"]
    assert duplicate and duplicate[0]["range"]["start"] == {"line": 5, "character": 2}, diagnostics


# --- where the outputs go ---------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["-o", "--output", "--summary-md"])
def test_an_output_onto_an_input_is_refused(tmp_path: Path, flag: str):
    (tmp_path / "a.yaml").write_text(OVER, encoding="utf-8")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "b.yaml").write_text(OVER, encoding="utf-8")
    os.symlink(tmp_path / "a.yaml", tmp_path / "link.yaml")
    for target, inputs in [("a.yaml", ["a.yaml"]), ("./a.yaml", ["a.yaml"]), ("link.yaml", ["a.yaml"]), ("dir/b.yaml", ["dir"])]:
        done = memfit("check", flag, target, *inputs, cwd=tmp_path)
        assert done.returncode == 2, (target, done.stdout, done.stderr)
        assert b"input" in done.stderr, done.stderr
    assert (tmp_path / "a.yaml").read_text(encoding="utf-8") == OVER
    assert (tmp_path / "dir" / "b.yaml").read_text(encoding="utf-8") == OVER


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_a_full_device_is_named_in_the_message(tmp_path: Path):
    (tmp_path / "a.yaml").write_text(OVER, encoding="utf-8")
    done = memfit("check", "-o", "/dev/full", "a.yaml", cwd=tmp_path)
    assert done.returncode == 2
    message = done.stderr.decode()
    assert "/dev/full" in message and "None" not in message, message
    assert "No space left on device" in message, message


def test_sarif_uris_are_percent_encoded(tmp_path: Path):
    name = "a b#c%d?é.yaml"
    (tmp_path / name).write_text(OVER, encoding="utf-8")
    done = memfit("check", "--format", "sarif", name, cwd=tmp_path)
    sarif = json.loads(done.stdout)
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in sarif["runs"][0]["results"]}
    assert uris == {"a%20b%23c%25d%3F%C3%A9.yaml"}


@pytest.mark.parametrize("text", ["hunter2-secret-token\n", "- hunter2-secret-token\n", "token: hunter2-secret-token\n", "hunter2-secret-token: 1\n"])
def test_not_a_config_does_not_echo_the_file(tmp_path: Path, text: str):
    secret = tmp_path / "secret.txt"
    secret.write_text(text, encoding="utf-8")
    os.symlink(secret, tmp_path / "innocent.yaml")
    for args in (["check"], ["check", "--format", "json"], ["check", "--format", "github"], ["explain"]):
        done = memfit(*args, "innocent.yaml", cwd=tmp_path)
        assert done.returncode == 1
        assert b"hunter2" not in done.stdout + done.stderr, (args, done.stdout, done.stderr)
        assert b"not-a-config" in done.stdout + done.stderr or b"not a memfit config" in done.stdout + done.stderr


def test_github_annotations_name_files_from_the_repository_root(tmp_path: Path):
    repo = tmp_path / "repo"
    (repo / "configs" / "team").mkdir(parents=True)
    (repo / "configs" / "team" / "x.yaml").write_text(OVER, encoding="utf-8")
    here = memfit("check", "--format", "github", ".", cwd=repo)
    assert here.stdout.decode().startswith("::error file=configs/team/x.yaml,"), here.stdout
    dotted = memfit("check", "--format", "github", "./configs//team/../team/x.yaml", cwd=repo)
    assert dotted.stdout.decode().startswith("::error file=configs/team/x.yaml,"), dotted.stdout
    inside = memfit("check", "--format", "github", ".", cwd=repo / "configs", env={"GITHUB_WORKSPACE": str(repo)})
    assert inside.stdout.decode().startswith("::error file=configs/team/x.yaml,"), inside.stdout


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not Path("/dev/zero").exists(), reason="no FIFOs or /dev/zero on this system")
def test_the_hook_and_the_action_never_block_on_special_files(tmp_path: Path):
    """What the hook (--skip-unrecognized) and the Action (`paths: .`, github format) meet in a
    walked tree: a FIFO and a symlink to /dev/zero named like configs. They are reported (or
    skipped), never read: the run ends at once with a bounded report."""
    tree = tmp_path / "repo"
    (tree / "configs").mkdir(parents=True)
    os.mkfifo(tree / "configs" / "pipe.yaml")
    (tree / "configs" / "zero.yaml").symlink_to("/dev/zero")
    (tree / "configs" / "over.yaml").write_text(OVER, encoding="utf-8")
    for args in (["--skip-unrecognized"], ["--skip-unrecognized", "--format", "github"], ["--format", "sarif"]):
        done = memfit("check", *args, ".", cwd=tree, timeout=60)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert len(done.stdout) < 64 * 1024
        assert b"over.yaml" in done.stdout
    explained = memfit("explain", "configs/pipe.yaml", cwd=tree, timeout=60)
    assert explained.returncode == 1 and b"FIFO" in explained.stdout
