"""The command line: parses arguments, then hands them to the runner. Exit codes are a
published contract: 0 no error, 1 a config failed (or could not be read), 2 usage error."""

from __future__ import annotations

import argparse

from memfit import __version__
from memfit.read.inputs import DEFAULT_MAX_FILE_SIZE
from memfit.report.reporters import REPORTERS
from memfit.diagnostics.units import UnitError, parse_bytes, parse_percent


def _bytes_arg(text: str) -> int:
    try:
        digits = text.strip()
        return parse_bytes(int(digits) if digits.isascii() and digits.isdigit() else text)
    except UnitError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _budget_arg(text: str) -> int:
    """--budget: a byte quantity with its unit. A bare number is refused, as device.memory refuses it:
    `--budget 80` meant as 80 GB would be a budget of 80 bytes."""
    digits = text.strip()
    if digits.replace("_", "").replace(",", "").replace(".", "", 1).isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} has no unit: write the budget with one, e.g. '{digits}GiB' or '{digits}GB' ('{digits}B' for bytes)")
    return _bytes_arg(text)


def _device_arg(text: str) -> str:
    """--device: a GPU preset of the table (config/presets.py), checked before any file is read: a typo
    would otherwise pass unnoticed wherever a config names its own device."""
    from memfit.config import presets

    if presets.lookup(text) is not None:
        return text
    choices = presets.ambiguous(text)
    if choices:
        listed = ", ".join(choices)
        raise argparse.ArgumentTypeError(f"{text!r} names cards with different memory: {listed}; name one")
    near = presets.closest(text)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise argparse.ArgumentTypeError(f"unknown device preset {text!r}{hint} (known: {', '.join(presets.PRESETS)})")


def _jobs_arg(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes (0: choose by file count and cores)")
    return int(text)


def _reserve_arg(text: str):
    """--reserve: bytes or a percentage, kept as written (device.reserve takes the same forms)."""
    try:
        parse_percent(text) if text.strip().endswith("%") else _bytes_arg(text)
    except (UnitError, argparse.ArgumentTypeError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return int(text) if text.isascii() and text.isdigit() else text


def _overhead_arg(text: str):
    """--overhead: auto or bytes, kept as written (device.overhead takes the same forms)."""
    if text == "auto":
        return text
    _bytes_arg(text)
    return int(text) if text.isascii() and text.isdigit() else text


def _count_arg(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return int(text)


def _percent_arg(text: str):
    try:
        return parse_percent(text)
    except UnitError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _share_arg(text: str):
    from memfit.whatif.diff import parse_share

    try:
        return parse_share(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


class _Version(argparse.Action):
    """`memfit --version`: the version and the commit (found only when asked: it may run git)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from memfit.diagnostics.provenance import version_text

        print(version_text(__version__))
        parser.exit()


COMMANDS = ("check", "explain", "fit", "diff", "convert", "schema", "lsp", "runs")


def parser(wanted: str | None = None) -> argparse.ArgumentParser:
    """The command line. `wanted`: the command being run; only its parser is built (building every command's took
    half of a small config's check, and each parser costs argparse's message lookups): a known command's arguments
    meet only its own parser, and its help and errors print no other command. Without one (`memfit --help`, a
    mistyped command) every command is listed, with its help line."""
    top = argparse.ArgumentParser(prog="memfit", description="Check that training configs fit in device memory.")
    top.add_argument("--version", action=_Version, nargs=0, help="print the version and the commit, and exit")
    commands = top.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--budget", type=_budget_arg, metavar="BYTES", help="memory budget with its unit, e.g. 80GiB; supplies or overrides device.memory - reserve")
        sub.add_argument("--warn-at", type=_percent_arg, metavar="PERCENT", help="warn above this share of the budget (default 90%%, or device.warn_at)")
        sub.add_argument(
            "--max-file-size", type=_bytes_arg, default=DEFAULT_MAX_FILE_SIZE, metavar="BYTES", help="refuse to read a config larger than this (default 64 MiB)"
        )
        settings(sub)

    def settings(sub: argparse.ArgumentParser) -> None:
        """Native configs and the project settings ([tool.memfit]); the command line wins."""
        from memfit.read.native import FORMATS

        sub.add_argument("--input-format", choices=FORMATS, metavar="NAME", help=f"read the files as this format ({', '.join(FORMATS)}); default: by their keys")
        sub.add_argument("--device", type=_device_arg, metavar="PRESET", help="the GPU preset (e.g. H100-80GB) where a config names no device")
        sub.add_argument("--gpus", type=_count_arg, metavar="N", help="GPUs in the run (the world size): a native config's, and a memfit config's parallel.data where it states none")
        sub.add_argument("--gpus-per-node", type=_count_arg, metavar="N", help="GPUs per node")
        sub.add_argument("--host-memory", type=_bytes_arg, metavar="BYTES", help="host RAM per node, where a config names none")
        sub.add_argument("--reserve", type=_reserve_arg, metavar="BYTES|PERCENT", help="device memory kept free, where a config names none")
        sub.add_argument("--overhead", type=_overhead_arg, metavar="auto|BYTES", help="runtime overhead (auto: the preset's CUDA context and workspaces)")
        sub.add_argument("--launch", metavar="FILE", help="an accelerate config: the world size and sharding of native configs")
        sub.add_argument("--model", metavar="NAME", help="the model of a config that names none (a DeepSpeed JSON alone)")
        sub.add_argument("--no-settings", dest="settings", action="store_false", help="ignore [tool.memfit] in pyproject.toml and memfit.toml")
        sub.add_argument("--online", action="store_true", help="fetch a model's config.json alone from the Hugging Face Hub when it is not found locally (memfit's own bounded HTTP client, no extra package; HF_ENDPOINT and HF_TOKEN honoured)")

    if wanted in (None, "check"):
        check = commands.add_parser("check", help="check configs; exit 1 if any error")
        check.add_argument("paths", nargs="+", metavar="PATH", help="files, or directories to search for *.yaml / *.yml")
        check.add_argument("--format", choices=list(REPORTERS), default="text", help="output format (default text)")
        check.add_argument("--skip-unrecognized", action="store_true", help="skip files that are not memfit configs instead of failing them")
        check.add_argument("--allow-empty", action="store_true", help="let a directory in which no config is recognised pass (default: exit 1, error no-configs)")
        check.add_argument("--output", "-o", metavar="FILE", help="write the report to FILE instead of stdout")
        check.add_argument("--summary-md", metavar="FILE", help="also append a Markdown table (file, total, budget, headroom, verdict) to FILE, e.g. $GITHUB_STEP_SUMMARY")
        check.add_argument("--suggest", action="store_true", help="for a config over (or near) its budget, the single changes that make it fit, with their edits")
        check.add_argument("--jobs", "-j", type=_jobs_arg, default=0, metavar="N", help="parallel processes for many files (default: by file count and cores)")
        common(check)

    if wanted in (None, "explain"):
        explain = commands.add_parser("explain", help="show the footprint breakdown of configs")
        explain.add_argument("paths", nargs="+", metavar="PATH", help="config files, or directories to search for *.yaml / *.yml")
        explain.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="colour the budget bar (default: on a terminal)")
        explain.add_argument("--format", choices=("text", "json", "html"), default="text", help="text (default), json (with each step's timeline) or one self-contained HTML report of all the configs")
        explain.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of stdout")
        explain.add_argument("--skip-unrecognized", action="store_true", help="skip files that are not memfit configs instead of failing them")
        explain.add_argument("--allow-empty", action="store_true", help="let a directory in which no config is recognised pass (default: exit 1, error no-configs)")
        common(explain)

    if wanted in (None, "fit"):
        fit = commands.add_parser("fit", help="the largest micro_batch (or other training key) that fits, or the fewest GPUs")
        from memfit.whatif.fit import DEFAULT_VARY, VARY

        fit.add_argument("paths", nargs="+", metavar="CONFIG", help="config files, or directories to search for *.yaml / *.yml")
        fit.add_argument(
            "--vary",
            choices=[*VARY, "gpus", "data"],
            default=DEFAULT_VARY,
            help=f"the key to search (default {DEFAULT_VARY}); gpus (or data): the fewest data-parallel GPUs per strategy",
        )
        fit.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
        common(fit)

    if wanted in (None, "diff"):
        diff = commands.add_parser("diff", help="each config's footprint at a git revision beside the working tree")
        diff.add_argument("rev", metavar="REV", help="the git revision to compare against, e.g. main or the pull request's base SHA")
        diff.add_argument("paths", nargs="*", metavar="PATH", help="files or directories (default: the whole repository)")
        diff.add_argument("--format", choices=("text", "json", "markdown", "html"), default="text", help="output format (default text); html: the report with the revision's timeline drawn over each config's")
        diff.add_argument(
            "--fail-on-growth", type=_share_arg, metavar="PERCENT",
            help="exit 1 when any config's gated figure (its peak, else its total) grows by more than this share, e.g. 5%%, or it passed and now fails",
        )
        common(diff)

    if wanted in (None, "convert"):
        convert = commands.add_parser("convert", help="print the memfit config a native config (Axolotl, LLaMA-Factory, ...) means")
        convert.add_argument("paths", nargs=1, metavar="FILE", help="a native config")
        convert.add_argument("--max-file-size", type=_bytes_arg, default=DEFAULT_MAX_FILE_SIZE, metavar="BYTES", help=argparse.SUPPRESS)
        settings(convert)

    if wanted in (None, "schema"):
        commands.add_parser("schema", help="print the config JSON Schema")

    if wanted in (None, "runs"):
        runs = commands.add_parser("runs", help="predicted against measured memory of the runs MemfitCallback recorded")
        runs.add_argument("paths", nargs="+", metavar="PATH", help="record files (JSON lines) written by MemfitCallback(record=PATH)")
        runs.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")

    if wanted in (None, "lsp"):
        lsp = commands.add_parser("lsp", help="run the language server (needs memfit[lsp])")
        lsp.add_argument("--tcp", metavar="HOST:PORT", help="listen on TCP instead of stdio")
    return top


def main(argv: list[str] | None = None) -> int:
    import sys

    given = sys.argv[1:] if argv is None else argv
    command = next((a for a in given if not a.startswith("-")), None)
    top = parser(command if command in COMMANDS and not any(a in ("-h", "--help") for a in given[: given.index(command)]) else None)
    args, extra = top.parse_known_args(argv)
    # `diff REV --format markdown PATH`: argparse takes the positionals before an option in one
    # go, so the paths after it come back unparsed; they are paths, anything else is an error
    if extra and (args.command != "diff" or any(x.startswith("-") for x in extra)):
        top.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.paths += extra
    import gc

    from memfit.cli import runner

    collecting = gc.isenabled()
    try:
        if args.command == "runs":
            from memfit.report.runs import run as runs

            return runs(args)
        return runner.run(args)
    except BrokenPipeError:  # `memfit check ... | head`
        return runner.EXIT_OK
    except KeyboardInterrupt:
        return 130
    finally:
        if argv is not None and collecting:  # called in a process that goes on: its collector as it was
            gc.unfreeze()
            gc.enable()
