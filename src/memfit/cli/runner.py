"""Wires a parsed command line to the pipeline: paths -> check -> reporter -> exit code."""

from __future__ import annotations

import os
import sys

from memfit.check.pipeline import Options, Result, safe_check
from memfit.read.inputs import expand

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def targets(paths: list[str], allow_empty: bool = False):
    """The files to check: a named file; under a named directory its YAML files and JSON files (read
    alike: a native config is recognised by its parsed keys, wherever it was found), plus the native
    configs the settings include. A directory with no such file is a problem unless `allow_empty`."""
    found = []
    for path, problem in expand(paths):
        # a directory without YAML files: its JSON files, if any, are its candidates
        if problem is not None and os.path.isdir(path) and (allow_empty or _walk_json(path)):
            continue
        found.append((path, problem))
    have = {p for p, _ in found}
    for directory in (p for p in paths if os.path.isdir(p)):
        from memfit.read.native.settings import include_matches

        for extra in _walk_json(directory) + include_matches(directory):
            if extra not in have:
                found.append((extra, None))
                have.add(extra)
    return found


def _walk_json(top: str) -> list[str]:
    """The JSON files under a directory (hidden and pruned folders left out, as the YAML walk does)."""
    from memfit.read.inputs import PRUNED

    out = []
    for root, dirs, names in os.walk(top):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in PRUNED]
        out.extend(os.path.join(root, name) for name in names if name.endswith(".json"))
    return sorted(out)


def lenient(paths: list[str]) -> frozenset:
    """The JSON files a directory walk found: most JSON in a folder is not a config (a model's
    config.json, a tokenizer), so such a file counts only where memfit recognises it, as
    --skip-unrecognized would have it, with or without the flag."""
    return frozenset(p for directory in paths if os.path.isdir(directory) for p in _walk_json(directory))


def check_found(found: list, options: Options, loose: frozenset, jobs: int = 0) -> list[Result]:
    """safe_check for each (path, problem), in order; a lenient file checked as --skip-unrecognized does."""
    from dataclasses import replace

    from memfit.cli.pool import map_checked

    results: list[Result | None] = [Result(p, [d]) if d else None for p, d in found]
    strict = [p for p, d in found if d is None and p not in loose]
    skipping = [p for p, d in found if d is None and p in loose]
    checked = dict(zip(strict, map_checked(strict, options, jobs)))
    checked.update(zip(skipping, map_checked(skipping, replace(options, skip_unrecognized=True), jobs)))
    return [r if r is not None else checked[p] for r, (p, _) in zip(results, found)]


def empty_folders(paths: list[str], results: list[Result], allow_empty: bool) -> list[Result]:
    """A directory named on the command line in which memfit recognised no config: checking it
    checked nothing, which a gate must not call a pass (unless --allow-empty asks for one)."""
    from memfit.diagnostics import codes
    from memfit.diagnostics.diagnostic import FILE_START, diagnostic

    if allow_empty:
        return []
    out = []
    for directory in dict.fromkeys(p for p in paths if os.path.isdir(p)):
        prefix = os.path.join(directory, "")
        under = [r for r in results if r.path.startswith(prefix) or r.path == directory]
        if any(not r.skipped for r in under):
            continue
        message = (
            f"no config memfit recognises in directory {directory} ({len(under):,} file{'s' if len(under) != 1 else ''} skipped: "
            "neither a memfit config nor a native config recognised by its keys); pass --allow-empty if an empty check may pass"
        )
        out.append(Result(directory, [diagnostic(FILE_START, codes.NO_CONFIGS, message)]))
    return out


def check_paths(paths: list[str], options: Options, jobs: int = 0, allow_empty: bool = False) -> list[Result]:
    settings = settings_results(paths, options)
    named_settings = {r.path for r in settings}
    found = [(p, d) for p, d in targets(paths, allow_empty) if p not in named_settings]
    results = check_found(found, options, lenient(paths), jobs) + settings
    if options.skip_unrecognized:
        results += dependents(results, options)
    return results + empty_folders(paths, results, allow_empty)


SETTINGS_NAMES = ("pyproject.toml", "memfit.toml")
# a JSON file larger than this is not a candidate reader (a tokenizer or a data set, never a Trainer argument file)
MAX_CANDIDATE_JSON = 2**20


def settings_results(paths: list[str], options: Options) -> list[Result]:
    """A settings file named on the command line (the hook hands it over when it is staged) is no config:
    with --skip-unrecognized it is skipped, and the configs it governs are checked again (dependents)."""
    if not options.skip_unrecognized:
        return []
    return [Result(p, skipped=True) for p in paths if p.endswith(".toml") and os.path.isfile(p)]


def dependents(results: list[Result], options: Options) -> list[Result]:
    """The hook's other half: a staged file that configs read but that is not a config itself has those configs
    checked again, so that an edit that makes a run overflow does not commit cleanly, by any route: a model's
    config.json or its folder (`base_model: ./models/x`, `hf_config: models/x`), a DeepSpeed JSON read by a
    Trainer argument file or an Axolotl config, a launch config and the DeepSpeed JSON it names
    (`deepspeed_config_file`), the settings (pyproject.toml, memfit.toml) and what they name.

    Candidates are the repository's YAML and JSON files under the working directory (plus the settings'
    include), found by their text: one that mentions a changed file's name (or its folder's, for a
    config.json), or the name of a file that does (a launch config naming the DeepSpeed JSON), or that is
    governed by a settings file among these. A candidate counts when its check read a changed file."""
    from memfit.read.inputs import read
    from memfit.read.native.settings import find, include_matches

    changed = {
        os.path.abspath(r.path): r.path
        for r in results
        # what configs read: JSON (a model's config.json, a DeepSpeed JSON, a Trainer's arguments), the settings'
        # TOML, a launch config or a DeepSpeed config in YAML; an unrelated staged YAML costs no scan of the repository
        if os.path.isfile(r.path) and (r.path.endswith((".json", ".toml")) or r.input_format in ("accelerate", "deepspeed"))
    }
    if not changed:
        return []
    given = {os.path.abspath(r.path) for r in results}
    candidates = [p for p, d in expand(["."]) if d is None] + include_matches(".")
    candidates += [p for p in _walk_json(".") if os.path.getsize(p) <= MAX_CANDIDATE_JSON]
    texts = {}
    for candidate in dict.fromkeys(os.path.normpath(c) for c in candidates):
        if os.path.abspath(candidate) in given:
            continue
        text, problem, _ = read(candidate, options.max_file_size)
        if problem is None:
            texts[candidate] = text
    governing = {c: find(os.path.dirname(os.path.abspath(c)))[0] for c in texts}
    # the names that lead to a changed file, closed over the files that mention one (launch -> DeepSpeed JSON)
    names = set()
    for full in changed:
        names.add(os.path.basename(full))
        if os.path.basename(full) == "config.json":
            names.add(os.path.basename(os.path.dirname(full)))  # the model folder
    settings_files = {f for f in governing.values() if f}
    mapped: set[str] = set()
    for settings_file in settings_files:
        _, _, values, _ = find(os.path.dirname(settings_file))
        base = os.path.dirname(settings_file)
        for name, target in (values.get("models") or {}).items():
            full = os.path.abspath(os.path.join(base, os.path.expanduser(str(target))))
            if full in changed or os.path.join(full, "config.json") in changed:
                mapped.add(name)
    names |= mapped
    hit: set[str] = set()
    settings_hit = {f for f in settings_files if f in changed}
    while True:
        grown = False
        for candidate, text in texts.items():
            if candidate not in hit and any(name and name in text for name in names):
                hit.add(candidate)
                names.add(os.path.basename(candidate))
                grown = True
        for settings_file in settings_files - settings_hit:
            settings_text = find(os.path.dirname(settings_file))[1]
            if any(name and name in settings_text for name in names):
                settings_hit.add(settings_file)
                grown = True
        if not grown:
            break
    out = []
    for candidate in texts:
        if candidate not in hit and governing[candidate] not in settings_hit:
            continue
        result = safe_check(candidate, options)
        if result.skipped:
            continue
        read_files = set(result.references) | ({governing[candidate]} if governing[candidate] else set())
        if any(_reads(ref, full) for ref in read_files for full in changed):
            out.append(result)
    return out


def _reads(reference: str, changed: str) -> bool:
    """Whether a file a check read is the changed file, or a folder that holds it (a model folder)."""
    reference = os.path.abspath(reference)
    return reference == changed or changed.startswith(os.path.join(reference, ""))


def _settled(results: list) -> list:
    """The checked results, with Python's cyclic garbage collector out of the way for the rest of the command: they
    live until it ends, and neither the check (pipeline.check pauses the collector too) nor the report builds
    cycles, while rendering them (a 150,000-tensor explain: millions of rows and strings) made each full collection
    walk everything again: a quarter of such an explain's time. The command exits after its report; the editor's
    server does not come this way."""
    import gc

    gc.freeze()  # what exists now is never walked again
    gc.disable()
    return results


def run(args) -> int:
    if args.command == "schema":
        from memfit.cli.schemagen import schema_text

        sys.stdout.write(schema_text())
        return EXIT_OK
    if args.command == "lsp":
        from memfit.editor.lsp_entry import start

        return start(args)
    if args.command == "diff":
        return run_diff(args)
    options = _options(args)
    if args.command == "convert":
        return run_convert(args, options)
    if args.command == "fit":
        return run_fit(args, options)
    if args.command == "explain":
        return run_explain(args, options)

    from memfit.report.reporters import REPORTERS, summary_markdown
    from memfit.diagnostics.safe_text import printable

    clash = _output_onto_input(args)
    if clash is not None:
        sys.stderr.write(printable(clash) + "\n")
        return EXIT_USAGE
    results = check_paths(args.paths, options, args.jobs, getattr(args, "allow_empty", False))
    if args.suggest:
        results = [suggest(r, options) for r in results]
    results = _settled(results)
    clash = _output_onto_read(args, results)
    if clash is not None:
        sys.stderr.write(printable(clash) + "\n")
        return EXIT_USAGE
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


# the HTML report's bound: per config a fixed allowance (the largest example's report, a Llama-3-8B QLoRA's timeline,
# is 348,056 bytes) plus a multiple of the config's own bytes (a long layer list is a long table); past it, an error
HTML_PER_CONFIG = 2 * 2**20
HTML_PER_BYTE = 16


def html_limit(results) -> tuple[int, int]:
    """The most bytes `explain --format html` writes for these configs, and the configs' own bytes."""
    sizes = 0
    for result in results:
        try:
            sizes += os.path.getsize(result.path)
        except OSError:
            pass
    return HTML_PER_CONFIG * len(results) + HTML_PER_BYTE * sizes, sizes


def run_explain(args, options: Options) -> int:
    """`memfit explain`: text (the breakdown), json (check's entries with the step's timeline) or html."""
    from memfit.diagnostics.safe_text import printable
    from memfit.report.explain import json_entry, render

    clash = _output_onto_input(args)
    if clash is not None:
        sys.stderr.write(printable(clash) + "\n")
        return EXIT_USAGE
    allow_empty = getattr(args, "allow_empty", False)
    checked = check_found(targets(args.paths, allow_empty), options, lenient(args.paths))
    results = _settled(checked + empty_folders(args.paths, checked, allow_empty))
    shown = [r for r in results if not r.skipped]
    clash = _output_onto_read(args, results)
    if clash is not None:
        sys.stderr.write(printable(clash) + "\n")
        return EXIT_USAGE
    if args.format == "text":
        colour = args.color == "always" or (args.color == "auto" and not args.output and sys.stdout.isatty() and "NO_COLOR" not in os.environ)
        text = "\n".join(render(result, colour) for result in shown)
    else:
        import json

        entries = [json_entry(r) for r in shown]
        if args.format == "json":
            text = json.dumps({"files": entries}, indent=2) + "\n"
        else:
            from memfit.report.html import render as html

            text = html(shown, entries)
            limit, sizes = html_limit(shown)
            written = len(text.encode("utf-8"))
            if written > limit:
                sys.stderr.write(printable(
                    f"memfit explain: the HTML report would be {written:,} bytes, over its bound of {limit:,} bytes "
                    f"({HTML_PER_CONFIG:,} per config + {HTML_PER_BYTE} x the configs' {sizes:,} bytes): nothing was written; "
                    "report fewer configs at a time, or use --format json"
                ) + "\n")
                return EXIT_USAGE
    try:
        if args.output:
            with open(args.output, "w", encoding="utf-8") as out:
                out.write(text)
        else:
            sys.stdout.write(text)
    except BrokenPipeError:
        raise
    except OSError as error:
        sys.stderr.write(printable(f"memfit: cannot write {error.filename or args.output or 'standard output'}: {error.strerror or error}") + "\n")
        return EXIT_USAGE
    return EXIT_FAILED if any(result.failed for result in results) else EXIT_OK


def _native_options(args) -> dict:
    """The command line's native-config flags (checked by argparse), as Options fields."""
    out = {key: getattr(args, key, None) for key in ("input_format", "device", "gpus", "gpus_per_node", "host_memory", "launch", "model", "reserve", "overhead")}
    out["settings"] = getattr(args, "settings", True)
    out["online"] = getattr(args, "online", False)
    return out


def run_convert(args, options: Options) -> int:
    """`memfit convert FILE`: the memfit config a native file means, as YAML; the problems found
    reading it on stderr (exit 1 when one is an error)."""
    import yaml

    from memfit.check.pipeline import check
    from memfit.diagnostics.safe_text import printable
    from memfit.read.inputs import read
    from memfit.report.reporters import diagnostic_line

    path = args.paths[0]
    text, problem, _ = read(path, options.max_file_size)
    if problem is not None:
        sys.stderr.write(diagnostic_line(path, problem) + "\n")
        return EXIT_FAILED
    from dataclasses import replace

    result = check(text, path, replace(options, budget=options.budget or 1))  # the read, not the budget, is the question
    launch_only = result.input_format == "accelerate"  # what a launch config decides, with no model of its own
    ignored = {"budget-exceeded", "near-budget", "no-budget"} | ({"model-not-found"} if launch_only else set())
    read_problems = [d for d in result.diagnostics if d.severity != "information" and d.code not in ignored]
    for d in read_problems:
        sys.stderr.write(diagnostic_line(path, d) + "\n")
    if result.data is None:
        return EXIT_FAILED
    shown = printable(path)  # a comment line: a newline in the file's name must not start a key of the output
    if launch_only:
        header = f"# what the launch config {shown} decides (accelerate), to go with a training config (memfit check --launch {shown} CONFIG)\n"
    else:
        header = f"# memfit config read from {shown} ({result.input_format}); `memfit check` on this file gives the same figures\n"
    sys.stdout.write(header + yaml.safe_dump(result.data, sort_keys=False, default_flow_style=None, width=120))
    return EXIT_FAILED if any(d.severity == "error" for d in read_problems) else EXIT_OK


def suggest(result: Result, options: Options) -> Result:
    """--suggest: the fixes of an over- or near-budget config (the file read and checked
    again here when its result came back from a worker without the data)."""
    from memfit.check.pipeline import check, internal_error
    from memfit.whatif.fixes import FIXABLE, fixes
    from memfit.read.inputs import read

    if result.skipped or not any(d.code in FIXABLE for d in result.diagnostics):
        return result
    try:
        text, problem, _ = read(result.path, options.max_file_size)
        if problem is not None:
            return result
        if result.data is None:
            result = check(text, result.path, options)
        result.fixes = fixes(result, text, options)
    except Exception as error:  # noqa: BLE001
        result.diagnostics.append(internal_error(error))
    return result


def fit_file(path: str, vary: str, options: Options):
    """One file's fit answer; like safe_check, a bug in memfit is a diagnostic on that file."""
    from memfit.check.pipeline import check, internal_error
    from memfit.whatif.fit import Fit, fit
    from memfit.whatif.gpus import GPU_VARY, GpuFit, gpus
    from memfit.read.inputs import read

    empty = GpuFit if vary in GPU_VARY else Fit
    try:
        text, problem, _ = read(path, options.max_file_size)
        if problem is not None:
            return empty(path, vary, diagnostics=[problem])
        if vary in GPU_VARY:
            return gpus(check(text, path, options), vary, options)
        return fit(check(text, path, options), text, vary, options)
    except Exception as error:  # noqa: BLE001
        return empty(path, vary, diagnostics=[internal_error(error)])


def run_fit(args, options: Options) -> int:
    from memfit.whatif.fit import REPORTERS, Fit
    from memfit.whatif.gpus import GPU_VARY, GpuFit

    empty = Fit
    if args.vary in GPU_VARY:
        from memfit.whatif.gpus import REPORTERS

        empty = GpuFit
    loose = lenient(args.paths)
    found = [(p, d) for p, d in targets(args.paths) if p not in loose or not safe_check(p, _skipping(options)).skipped]
    fits = [empty(p, args.vary, diagnostics=[d]) if d else fit_file(p, args.vary, options) for p, d in found]
    REPORTERS[args.format](sys.stdout).report(fits)
    if any(f.usage for f in fits):
        return EXIT_USAGE
    return EXIT_FAILED if any(f.failed for f in fits) else EXIT_OK


def _skipping(options: Options) -> Options:
    from dataclasses import replace

    return replace(options, skip_unrecognized=True)


def _options(args) -> Options:
    return Options(
        budget=getattr(args, "budget", None),
        warn_at=getattr(args, "warn_at", None),
        skip_unrecognized=getattr(args, "skip_unrecognized", False),
        max_file_size=args.max_file_size,
        **_native_options(args),
    )


def run_diff(args) -> int:
    from memfit.diagnostics.safe_text import printable
    from memfit.whatif.diff import REPORTERS, UsageError, compare, grown

    try:
        comparison = compare(args.rev, args.paths, options=_options(args))
    except UsageError as error:
        sys.stderr.write(f"memfit diff: {printable(str(error))}\n")
        return EXIT_USAGE
    if args.format == "html":  # the report's overlay (report.html), not one of diff's own reporters
        from memfit.report.explain import json_entry
        from memfit.report.html import render_diff

        sys.stdout.write(render_diff(comparison, json_entry))
    else:
        REPORTERS[args.format](sys.stdout).report(comparison)
    if args.fail_on_growth is not None:
        over = grown(comparison, args.fail_on_growth)
        for entry in over:
            if entry.newly_failing:
                sys.stderr.write(f"memfit diff: {printable(entry.path)}: passed its budget at {printable(args.rev)} and fails it now\n")
            else:
                share = float(entry.growth * 100)
                sys.stderr.write(f"memfit diff: {printable(entry.path)}: the {entry.label} grew by {share:.1f}%, more than {float(args.fail_on_growth * 100):g}%\n")
        if over:
            return EXIT_FAILED
    return EXIT_OK


def _existing_outputs(args) -> list[tuple[str, str]]:
    """(flag, file) of each report output that already exists: the ones a write could destroy."""
    outputs = (("--output", args.output), ("--summary-md", getattr(args, "summary_md", None)))
    return [(flag, name) for flag, name in outputs if name and os.path.exists(name)]


def _written_over(path: str, outputs: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The output (flag, file) that is `path` under any name (./a.yaml, a symlink), if one is."""
    for flag, name in outputs:
        try:
            if os.path.samefile(path, name):
                return flag, name
        except OSError:
            continue
    return None


def _output_onto_read(args, results) -> str | None:
    """An output onto a file a check read (a model's config.json, a DeepSpeed JSON, a launch config, the settings):
    written over, the next check would read the report. Found after the checks, before anything is written."""
    outputs = _existing_outputs(args)
    for result in results if outputs else ():
        settings = (result.provenance or {}).get("settings") if getattr(result, "provenance", None) else None
        for read_file in [*result.references, *([settings] if settings else [])]:
            hit = _written_over(read_file, outputs)
            if hit:
                return f"memfit: {hit[0]} {hit[1]} is a file the check of {result.path} reads ({read_file}): refusing to write over it"
    return None


def _output_onto_input(args) -> str | None:
    """A report written over a config it checks would destroy it: `-o a.yaml a.yaml`, or an
    output that is an input under another name (./a.yaml, a symlink, inside a checked directory)."""
    outputs = _existing_outputs(args)
    for path, _ in expand(args.paths) if outputs else ():
        hit = _written_over(path, outputs)
        if hit:
            return f"memfit: {hit[0]} {hit[1]} is one of the inputs ({path}): refusing to write over a config being checked"
    return None
