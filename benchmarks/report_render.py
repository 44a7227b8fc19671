"""The HTML report's bench row: write it, then open it in headless Chromium, for a config of N tensors.

    python benchmarks/report_render.py [--tensors 5000] [--runs 5] [--hf]

Prints one Markdown row: the time `memfit explain --format html` takes (a whole process, start-up
included), the file's size, and the browser's time from navigation start to the load event's end
(parsing, the inline script, layout), the median of --runs. The target is under 1 s in the browser.
The config is bench.py's synthetic one with a `training:` section (so it has a timeline); --hf
adds the 70B-size transformer of bench.py (80 layers: the longest timeline). Needs Playwright and
Debian's chromium (the test extra and .ci/run install them).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _bench():
    spec = importlib.util.spec_from_file_location("memfit_bench", HERE / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hf", action="store_true", help="the 70B-size transformer instead (80 layers)")
    args = parser.parse_args(argv)
    bench = _bench()
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("chromium is not installed (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.hf:
            (root / "llama-70b.json").write_text(json.dumps(bench.LLAMA_70B))
            config = root / "hf.yaml"
            config.write_text(bench.HF_YAML)
            case = "70B-size transformer (80 layers)"
        else:
            config = root / "tensors.yaml"
            config.write_text(bench.config_text(args.tensors) + "training: {optimizer_impl: foreach}\n")
            case = f"{args.tensors:,} tensors"
        out = root / "report.html"
        writes = []
        for _ in range(args.runs):
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "memfit", "explain", "--format", "html", "-o", str(out), str(config)], capture_output=True, text=True, check=False)
            writes.append(time.perf_counter() - start)
            if done.returncode not in (0, 1):
                sys.exit(done.stderr)
        loads = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            for _ in range(args.runs):
                page = browser.new_page()
                page.goto(out.as_uri())
                page.wait_for_load_state("load")
                loads.append(page.evaluate("(() => { const t = performance.getEntriesByType('navigation')[0]; return t.loadEventEnd - t.startTime; })()") / 1000)
                page.close()
            browser.close()
        size = out.stat().st_size
    load = statistics.median(loads)
    print("| case | explain --format html (s) | file | browser load (s) | target |")
    print("| --- | ---: | ---: | ---: | --- |")
    print(f"| {case} | {statistics.median(writes):.3f} | {size / 1024:,.0f} KiB | {load:.3f} | {'met' if load < 1 else 'MISSED'}: < 1 s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
