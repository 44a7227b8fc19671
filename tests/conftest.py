"""The tests mirror src/memfit/: tests/<stage>/ holds the tests of src/memfit/<stage>/ (tests/project/ those of the
repository as a whole: layout, docs, benchmarks). tests/support/ holds what several stages' tests share (the
framework measurements, `needs`); it is put on the import path here so that a test imports it by name, as are the
repository's tools/ (tools/doc_tables.py: the tests that run a reference assert the docs' figures through it).
"""

import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent / "support"
TOOLS = SUPPORT.parents[1] / "tools"
for path in (TOOLS, SUPPORT):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


# --- CI=true: nothing escapes as a skip ---------------------------------------------------------------------------
# .ci/run installs every extra, so under CI a skip is a broken setup hiding (an importorskip, a module-level skip, a
# skipif on a missing tool): it fails the run instead. The one kind of test CI cannot run is marked `gpu` (hardware
# CI does not have): those are skipped where no GPU is present and counted in the summary.
import os  # noqa: E402

import pytest  # noqa: E402

GPU_MARKER = "gpu"


def _ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _has_gpu() -> bool:
    import glob
    import shutil

    if not glob.glob("/dev/nvidia[0-9]*") and shutil.which("nvidia-smi") is None:
        return False  # no NVIDIA device: no need to import torch to know
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_configure(config):
    if _ci():
        os.environ["PIP_NO_INDEX"] = "1"  # after .ci/run's install step no test needs a package index
    config.addinivalue_line("markers", f"{GPU_MARKER}: needs a CUDA GPU (CI has none): skipped without one, counted in the summary")
    config.addinivalue_line("markers", "wallclock: asserts a generous outer wall-clock limit where the work cannot be counted from Python "
                                       "(a regex engine, big-integer arithmetic, a server's reply); speed itself is benchmarks/bench.py's")
    config._memfit_gpu = {"collected": 0, "skipped": 0}


def pytest_collection_modifyitems(config, items):
    gpu = [item for item in items if item.get_closest_marker(GPU_MARKER)]
    config._memfit_gpu["collected"] = len(gpu)
    if gpu and not _has_gpu():
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason="needs a GPU (marked gpu)"))


def _escaped(report) -> bool:
    return _ci() and report.skipped and not hasattr(report, "wasxfail")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if _escaped(report):
        report.outcome = "failed"
        report.longrepr = f"CI=true: {collector.nodeid} skipped at collection ({_reason(report)}); CI installs every test dependency"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if item.get_closest_marker(GPU_MARKER) and report.skipped:
        if report.when == "setup":
            item.config._memfit_gpu["skipped"] += 1
        return
    if _escaped(report):
        report.outcome = "failed"
        report.longrepr = f"CI=true: {item.nodeid} skipped ({_reason(report)}); CI installs every test dependency (mark a test that needs a GPU `gpu`)"


def _reason(report) -> str:
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def pytest_terminal_summary(terminalreporter, config):
    _report_left(terminalreporter, config)
    counts = getattr(config, "_memfit_gpu", None)
    if counts and counts["collected"]:
        terminalreporter.write_line(f"gpu: {counts['collected']} tests marked gpu, {counts['skipped']} skipped (no GPU here)")


# --- no test writes into the checkout ------------------------------------------------------------------------------
# What `git status` shows at the end of the run and did not at its start (a file a test left in the repository):
# listed in the summary, and a failure under CI.
import subprocess  # noqa: E402

REPO = SUPPORT.parents[1]


def _status() -> set[str] | None:
    try:
        done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return set(done.stdout.splitlines()) if done.returncode == 0 else None


def pytest_sessionstart(session):
    session.config._memfit_status = _status()


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_memfit_status", None)
    after = _status() if before is not None else None
    left = sorted(after - before) if after is not None else []
    session.config._memfit_left = left
    if left and _ci() and session.exitstatus == 0:
        session.exitstatus = 1


def _report_left(terminalreporter, config):
    left = getattr(config, "_memfit_left", [])
    if left:
        terminalreporter.write_line("tests wrote into the checkout (git status, new since the run began): " + ", ".join(left), red=True)
