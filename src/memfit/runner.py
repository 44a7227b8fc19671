"""Wires a parsed command line to the pipeline: paths -> check -> reporter -> exit code."""

from __future__ import annotations

import os
import sys

from .check import Options, Result, safe_check
from .inputs import expand

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def check_paths(paths: list[str], options: Options, jobs: int = 0) -> list[Result]:
    targets = expand(paths)
    results: list[Result | None] = [Result(p, [d]) if d else None for p, d in targets]
    todo = [p for p, d in targets if d is None]
    from .pool import map_checked

    checked = iter(map_checked(todo, options, jobs))
    return [r if r is not None else next(checked) for r in results]


def run(args) -> int:
    if args.command == "schema":
        from .schemagen import schema_text

        sys.stdout.write(schema_text())
        return EXIT_OK
    if args.command == "lsp":
        from .lsp_entry import start

        return start(args)
    options = Options(
        budget=args.budget,
        warn_at=args.warn_at,
        skip_unrecognized=getattr(args, "skip_unrecognized", False),
        max_file_size=args.max_file_size,
    )
    if args.command == "explain":
        from .explain import render

        result = safe_check(args.path, options)
        colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty() and "NO_COLOR" not in os.environ)
        sys.stdout.write(render(result, colour))
        return EXIT_FAILED if result.failed else EXIT_OK

    from .reporters import REPORTERS, summary_markdown
    from .safe_text import printable

    clash = _output_onto_input(args)
    if clash is not None:
        sys.stderr.write(printable(clash) + "\n")
        return EXIT_USAGE
    results = check_paths(args.paths, options, args.jobs)
    target = args.output or "standard output"
    try:
        if args.output:
            with open(args.output, "w", encoding="utf-8") as out:
                REPORTERS[args.format](out).report(results)
        else:
            REPORTERS[args.format](sys.stdout).report(results)
        if args.summary_md:
            target = args.summary_md
            # appended, not replaced: $GITHUB_STEP_SUMMARY collects every step's summary
            with open(args.summary_md, "a", encoding="utf-8") as out:
                out.write(summary_markdown(results))
    except BrokenPipeError:
        raise  # the CLI's own handling: `memfit check ... | head` is not an error
    except OSError as error:
        # a failed write or close (a full disk: /dev/full) carries no file name: name the target
        sys.stderr.write(printable(f"memfit: cannot write {error.filename or target}: {error.strerror or error}") + "\n")
        return EXIT_USAGE
    return EXIT_FAILED if any(r.failed for r in results) else EXIT_OK


def _output_onto_input(args) -> str | None:
    """A report written over a config it checks would destroy it: `-o a.yaml a.yaml`, or an
    output that is an input under another name (./a.yaml, a symlink, inside a checked directory)."""
    outputs = [(flag, name) for flag, name in (("--output", args.output), ("--summary-md", args.summary_md)) if name]
    if not outputs:
        return None
    existing = [(flag, name) for flag, name in outputs if os.path.exists(name)]
    if not existing:
        return None
    for path, _ in expand(args.paths):
        for flag, name in existing:
            try:
                same = os.path.samefile(path, name)
            except OSError:
                continue
            if same:
                return f"memfit: {flag} {name} is one of the inputs ({path}): refusing to write over a config being checked"
    return None
