"""`memfit explain --format json|html`: the step's timeline and the self-contained HTML report.

The json contract is checked against independent sources (the footprint and peak the same run
prints, the yaml's own layer names, transformers' own module tree on the meta device); the HTML
is opened in a real browser (Debian's headless chromium driven by Playwright): every request it
would make is routed and failed, the console must stay clean, the stacked series in the DOM
must equal the json to the byte, hovering shows the numbers, and the budget line and the peak
marker sit where the data puts them.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").rglob("*.yaml"))
PHASES = {"forward", "loss", "backward", "optimizer"}
ATS = {"pre-forward", "post-forward", "pre-backward", "post-backward", None}
SCREENSHOT = ROOT / "docs" / "images" / "report-gpt2-small.png"


def memfit(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "memfit", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300, check=False)


def explain_json(*paths) -> list[dict]:
    done = memfit("explain", "--format", "json", *paths)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)["files"]


@pytest.fixture(scope="module")
def entries() -> dict:
    return {e["path"]: e for e in explain_json(*EXAMPLES)}


# --- the HTML's charts, read from its text (no browser) ---------------------------------------------


@pytest.fixture(scope="module")
def html_sections(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("html") / "report.html"
    done = memfit("explain", "--format", "html", "-o", out, *EXAMPLES)
    assert done.returncode in (0, 1), done.stderr
    text = out.read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r'<section class="config" id="cfg\d+" data-path="([^"]+)">(.*?)</section>', text, re.S)}


def test_every_example_has_a_chart_with_one_unit_per_axis(entries, html_sections):
    assert set(html_sections) == set(EXAMPLES)
    for path, section in html_sections.items():
        charts = re.findall(r'<svg class="chart[^"]*".*?</svg>', section, re.S)
        assert len(charts) == 1, path
        chart = charts[0]
        labels = re.findall(r'<text class="axis"[^>]*data-bytes="(\d+)">([^<]+)</text>', chart)
        assert len(labels) == 5, path
        assert len({text.split()[-1] for _, text in labels}) == 1, (path, labels)  # one unit on the axis
        if not entries[path]["timeline"]:  # the footprint, stacked: its categories add up to the total
            values = [int(v) for v in re.findall(r'<rect class="series[^"]*"[^>]*data-values="(\d+)"', chart)]
            assert sum(values) == entries[path]["footprint"]["total"], path


def test_the_peak_label_stays_inside_its_step(entries, html_sections):
    from memfit.report.html import CHAR_W

    seen = 0
    for path, section in html_sections.items():
        m = re.search(r'<g class="peak-marker"[^>]*data-step-x0="([\d.]+)" data-step-x1="([\d.]+)">.*?'
                      r'<text class="peak-label" x="([\d.]+)"[^>]*text-anchor="(\w+)">([^<]+)</text>', section, re.S)
        if entries[path].get("peak") is None:
            continue
        assert m, path
        x0, x1, x, anchor = float(m.group(1)), float(m.group(2)), float(m.group(3)), m.group(4)
        width = len(m.group(5).replace("&amp;", "&").replace("&#x27;", "'")) * CHAR_W
        left = {"start": x, "end": x - width, "middle": x - width / 2}[anchor]
        assert x0 <= left and left + width <= x1, (path, x0, x1, left, width)
        seen += 1
    assert seen


# --- the json series ------------------------------------------------------------------------
def test_every_example_has_a_timeline_whose_largest_event_is_the_peak(entries):
    assert set(entries) == set(EXAMPLES)
    runs = 0
    for path, e in entries.items():
        assert {"path", "footprint", "budget", "diagnostics", "timeline"} <= set(e)
        if "peak" not in e:
            assert e["timeline"] == [], path  # no training section: no run, no step to draw
            continue
        runs += 1
        events = e["timeline"]
        assert events, path
        for ev in events:
            assert ev["phase"] in PHASES and ev["at"] in ATS and ev["step"] in (1, 2)
            assert set(ev["live"]) == set(e["peak"]["live"]), path
            assert ev["bytes"] == sum(ev["live"].values())
        assert max(ev["bytes"] for ev in events) == e["peak"]["bytes"], path
        assert [ev["step"] for ev in events] == sorted(ev["step"] for ev in events)  # step 1, then step 2
        if "rank" in e["peak"]:  # parallel: the binding rank's program (its warm step), every event naming that rank
            assert {ev["rank"] for ev in events} == {e["peak"]["rank"]} and {ev["step"] for ev in events} == {2}, path
            assert events[0]["phase"] == "forward" and events[-1]["phase"] == "optimizer", path
            continue
        warm = [ev for ev in events if ev["step"] == 2]
        cold = [ev for ev in events if ev["step"] == 1]
        assert [ev["phase"] for ev in warm] == [ev["phase"] for ev in cold]
        assert warm[0]["phase"] == "forward" and warm[-1]["phase"] == "optimizer"
        # the warm step holds the optimizer state (the footprint's, to the byte) from its start; the
        # first step has none until optimizer.step() creates it
        state = e["footprint"]["optimizer_state"]
        for w, c in zip(warm, cold):
            if w["phase"] != "optimizer":
                assert c["live"]["optimizer_state"] == 0 and w["live"]["optimizer_state"] == state, path
                assert w["bytes"] - c["bytes"] == state
            else:
                assert w == {**c, "step": 2}
        # the peak's phase is where the warm step reaches it
        phase = {"forward": {"forward", "loss"}, "backward": {"backward"}, "optimizer_step": {"optimizer"}}[e["peak"]["phase"]]
        assert any(ev["bytes"] == e["peak"]["bytes"] and ev["phase"] in phase for ev in warm), path
    assert runs >= 6


def _module_names(hf_config: Path) -> set:
    from needs import module

    torch, transformers = module("torch"), module("transformers")

    config = transformers.AutoConfig.for_model(**json.loads(hf_config.read_text()))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return {name for name, _ in model.named_modules()}


@pytest.mark.parametrize("path, hf_config", [("examples/gpt2-small.yaml", "examples/models/gpt2.json"), ("examples/llama-3-8b.yaml", "examples/models/llama-3-8b.json"),
                                             ("examples/over-budget/mixtral-8x7b-on-h100.yaml", "examples/models/mixtral-8x7b.json")])
def test_transformer_modules_are_transformers_own_module_paths(entries, path, hf_config):
    names = _module_names(ROOT / hf_config)
    modules = [ev["module"] for ev in entries[path]["timeline"] if ev["module"] not in ("loss", "optimizer")]
    assert set(modules) <= names, set(modules) - names
    layers = {m for m in modules if re.search(r"\.\d+$", m)}
    assert len(layers) == sum(1 for n in names if re.fullmatch(r"(model\.layers|transformer\.h)\.\d+", n))
    # every layer has its four boundaries in the warm step, forward in order, backward in reverse
    warm = [ev for ev in entries[path]["timeline"] if ev["step"] == 2]
    forward = [ev["module"] for ev in warm if ev["at"] == "post-forward"]
    backward = [ev["module"] for ev in warm if ev["at"] == "post-backward"]
    assert [m for m in forward if m in layers] == sorted(layers, key=lambda m: int(m.rsplit(".", 1)[1]))
    assert [m for m in backward if m in layers] == [m for m in forward if m in layers][::-1]
    # the model's ends: its embedding first and last; the final norm, then the output layer end forward, and
    # backward begins with the output layer, then the final norm (each a module of its own)
    norm = forward[-2]
    assert forward[0] == backward[-1] and forward[-1] == "lm_head" and ("norm" in norm or "ln_f" in norm)
    assert backward[:2] == ["lm_head", norm]
    for m in layers | {norm, "lm_head"}:
        assert {ev["at"] for ev in warm if ev["module"] == m} - {None} == {"pre-forward", "post-forward", "pre-backward", "post-backward"}


KERAS_RUN = """memfit: 1
device: {memory: 1 GiB}
optimizer: adam
training: {micro_batch: 16}
model:
  input_shape: [32, 32, 3]
  layers:
    - {type: Conv2D, name: stem, filters: 16, kernel_size: 3, activation: relu}
    - {type: MaxPooling2D, name: pool, pool_size: 2}
    - {type: Flatten, name: flat}
    - {type: Dense, name: hidden, units: 64, activation: relu}
    - {type: Dense, name: logits, units: 10}
"""


def test_a_keras_form_layer_stack_is_named_by_its_layers(tmp_path):
    config = tmp_path / "cnn.yaml"
    config.write_text(KERAS_RUN)
    (e,) = explain_json(config)
    assert e["diagnostics"] == [] and e["peak"]["bytes"] == max(ev["bytes"] for ev in e["timeline"])
    forward = [ev["module"] for ev in e["timeline"] if ev["step"] == 2 and ev["at"] == "post-forward"]
    assert forward == ["stem", "pool", "flat", "hidden", "logits"]


# --- the HTML file itself -------------------------------------------------------------------
def test_the_report_is_self_contained_and_small(tmp_path):
    out = tmp_path / "r.html"
    done = memfit("explain", "--format", "html", "-o", out, "examples/parallel/llama3-70b-tp8-pp4.yaml")
    assert done.returncode == 0, done.stderr
    text = out.read_text(encoding="utf-8")
    assert len(text.encode()) < 1_000_000
    full = tmp_path / "all.html"
    assert memfit("explain", "--format", "html", "-o", full, *EXAMPLES).returncode == 1  # over-budget examples fail
    for report in (text, full.read_text(encoding="utf-8")):
        assert not re.search(r"[A-Za-z][A-Za-z0-9+.-]*://", report)  # no URL of any scheme
        assert not re.search(r"\b(src|href)=\"(?!#)", report)  # nothing loaded, links only inside the file
        csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', report).group(1)
        assert "default-src 'none'" in csp and "unsafe-inline" not in csp and "connect-src 'none'" in csp


def test_html_writes_over_no_input(tmp_path):
    config = tmp_path / "a.yaml"
    config.write_text(KERAS_RUN)
    done = memfit("explain", "--format", "html", "-o", config, config)
    assert done.returncode == 2 and "refusing" in done.stderr
    assert config.read_text() == KERAS_RUN


# --- in a real browser ----------------------------------------------------------------------
def _browser():
    from needs import module, unavailable

    sync = module("playwright.sync_api")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        unavailable("chromium is not installed (Debian: apt-get install chromium)")
    return sync, chromium


def _png_pixels(data: bytes):
    """Distinct RGB values of an 8-bit RGB/RGBA PNG (the screenshot), decoded with zlib."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        size, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + size]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += size + 12
    width, height, depth, colour = header[:4]
    assert depth == 8 and colour in (2, 6)
    bpp = 3 if colour == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return {bytes(r[x : x + 3]) for r in rows[::4] for x in range(0, stride, bpp * 4)}


def _open(page, url):
    requests, problems = [], []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: requests.append(r.url))

    def refuse(route):  # every request is routed here: the report itself loads, anything else fails
        if route.request.url == url and route.request.is_navigation_request():
            route.continue_()
            return
        problems.append(f"request: {route.request.url}")
        route.abort()

    page.route("**/*", refuse)
    page.goto(url)
    page.wait_for_load_state("load")
    return requests, problems


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES)
def test_each_example_report_in_chromium(tmp_path, entries, example):
    sync, chromium = _browser()
    out = tmp_path / "report.html"
    done = memfit("explain", "--format", "html", "-o", out, example)
    assert done.returncode in (0, 1), done.stderr
    entry = entries[example]
    with sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            requests, problems = _open(page, out.as_uri())
            _check_page(page, entry)
            assert problems == [] and requests == [out.as_uri()], (problems, requests)
            shot = page.screenshot(full_page=False)
            assert len(_png_pixels(shot)) > 8  # not blank: text, axes and series in several colours
            if example == "examples/gpt2-small.yaml":
                chart = page.locator("svg.chart")
                page.evaluate("document.activeElement && document.activeElement.blur()")  # no focus ring in the picture
                chart.scroll_into_view_if_needed()
                box = chart.bounding_box()
                page.mouse.move(box["x"] + box["width"] * 0.72, box["y"] + box["height"] * 0.5)
                clip = {"x": 0, "y": max(0, box["y"] - 50), "width": 1100, "height": box["height"] + 150}
                image = page.screenshot(clip=clip)
                assert len(_png_pixels(image)) > 8
                (tmp_path / "shot.png").write_bytes(image)
                if os.environ.get("MEMFIT_UPDATE_SCREENSHOT"):  # the README's picture, taken here
                    SCREENSHOT.parent.mkdir(exist_ok=True)
                    SCREENSHOT.write_bytes(image)
            # dark mode and print: the page follows the reader's scheme; printing hides the hover box
            light = page.evaluate("getComputedStyle(document.body).backgroundColor")
            page.emulate_media(color_scheme="dark")
            assert page.evaluate("getComputedStyle(document.body).backgroundColor") != light
            page.emulate_media(media="print")
            if page.locator(".tip").count():
                assert page.locator(".tip").first.is_hidden()
            assert len(page.pdf()) > 1000
            assert problems == [], problems
        finally:
            browser.close()


def _check_page(page, entry):
    events, peak = entry["timeline"], entry.get("peak")
    fp = entry["footprint"]
    # the exact byte counts, in the text, next to the rounded ones
    assert page.locator(".footprint-total [data-bytes]").get_attribute("data-bytes") == str(fp["total"])
    assert f"{fp['total']:,} B" in page.locator(".footprint-total").inner_text()
    if peak is not None:
        assert page.locator(".peak-bytes [data-bytes]").get_attribute("data-bytes") == str(peak["bytes"])
        assert f"{peak['bytes']:,} B" in page.locator(".peak-bytes").inner_text()
    # the footprint table a screen reader reads: header cells, exact numbers as text
    rows = page.locator("table.footprint tbody tr")
    assert [int(rows.nth(i).locator("td").first.inner_text().replace(",", "")) for i in range(rows.count())] == [fp[c] for c in ("parameters", "gradients", "activations", "optimizer_state", "total")]
    if "rank" in (peak or {}):  # per rank: the binding one first, the others selectable
        rows = page.locator("table.ranks tbody tr")
        assert rows.first.get_attribute("data-rank") == str(peak["rank"]) and "binding" in rows.first.inner_text()
        ranks = [rows.nth(i).get_attribute("data-rank") for i in range(rows.count())]
        page.locator("select.rank").select_option(ranks[-1])
        assert [r for r in ranks if page.locator(f'table.ranks tr[data-rank="{r}"]').is_visible()] == [ranks[-1]]
        page.locator("select.rank").select_option("all")
        assert all(rows.nth(i).is_visible() for i in range(rows.count()))
    if entry.get("host"):
        assert page.locator("table.host [data-bytes]").last.get_attribute("data-bytes") == str(entry["host"]["total"])
    if not events:  # no training section: the footprint as one stacked bar, each category's exact bytes
        bars = page.locator("svg.footprint-chart rect.series")
        assert sum(int(bars.nth(i).get_attribute("data-values")) for i in range(bars.count())) == fp["total"]
        return
    svg = page.locator("svg.chart")
    attrs = {k: float(svg.get_attribute(f"data-{k}")) for k in ("x0", "y0", "plot-w", "plot-h", "ymax")}
    n = len(events)
    assert int(svg.get_attribute("data-events")) == n
    # the stacked series: exact values per category, each equal to the json's
    series = {}
    for i in range(page.locator("path.series").count()):
        path = page.locator("path.series").nth(i)
        series[path.get_attribute("data-category")] = [int(v) for v in path.get_attribute("data-values").split()]
    for category in events[0]["live"]:
        expected = [ev["live"][category] for ev in events]
        assert series.get(category, [0] * n) == expected, category
    totals = [sum(values[i] for values in series.values()) for i in range(n)]
    assert totals == [ev["bytes"] for ev in events]
    top = max(max(totals), entry["budget"] or 0)
    assert top <= attrs["ymax"] < 2 * top  # the axis holds everything, without squashing it

    def y(b):
        return attrs["y0"] + attrs["plot-h"] * (1 - b / attrs["ymax"])

    def x(i):
        return attrs["x0"] + (i + 0.5) * attrs["plot-w"] / n

    if entry["budget"] is not None:
        line = page.locator("line.budget")
        assert int(line.get_attribute("data-bytes")) == entry["budget"]
        assert abs(float(line.get_attribute("y1")) - y(entry["budget"])) < 0.01
    # the peak marker: on the warm step's event whose bytes are the peak, at the peak's height
    index = next(i for i, ev in enumerate(events) if ev["step"] == 2 and ev["bytes"] == peak["bytes"])
    marker = page.locator("g.peak-marker")
    assert int(marker.get_attribute("data-index")) == index
    circle = marker.locator("circle")
    assert abs(float(circle.get_attribute("cx")) - x(index)) < 0.01 and abs(float(circle.get_attribute("cy")) - y(peak["bytes"])) < 0.01
    assert peak["phase"].split("_")[0] in marker.text_content()
    # and on the screen: the marker's dot is over the peak column, at the top of the stack there
    svg.scroll_into_view_if_needed()
    box, dot = svg.bounding_box(), circle.bounding_box()
    scale = box["width"] / float(svg.get_attribute("viewBox").split()[2])
    assert abs(dot["x"] + dot["width"] / 2 - (box["x"] + x(index) * scale)) < 1
    assert abs(dot["y"] + dot["height"] / 2 - (box["y"] + y(peak["bytes"]) * scale)) < 1
    # hovering an event shows its numbers (a column can be narrower than a pixel, and the browser
    # reports the mouse in whole pixels: the event under it is this one or a neighbour)
    tip = page.locator(".tip")

    def shown(k):
        assert int(tip.locator("[data-bytes]").first.get_attribute("data-bytes")) == events[k]["bytes"]
        live = {s.get_attribute("data-cat"): int(s.get_attribute("data-bytes")) for s in tip.locator("span.live").all()}
        assert live == {c: v for c, v in events[k]["live"].items() if v}
        assert f"{events[k]['bytes']:,} B" in tip.inner_text()
        if events[k]["module"]:
            assert events[k]["module"] in tip.inner_text()

    for i in sorted({0, index, n - 1, n // 3}):
        page.mouse.move(box["x"] + x(i) * scale, box["y"] + box["height"] / 2)
        k = int(svg.get_attribute("data-index"))
        column = attrs["plot-w"] * scale / n  # pixels per event: the mouse lands on whole pixels
        assert abs(k - i) <= (0 if column >= 4 else math.ceil(1 / column)), (k, i)
        shown(k)
    # and from the keyboard, one event at a time
    page.mouse.move(box["x"] + x(0) * scale, box["y"] + box["height"] / 2)
    start = int(svg.get_attribute("data-index"))
    svg.focus()
    for k in range(start + 1, min(n, start + 4)):
        page.keyboard.press("ArrowRight")
        assert int(svg.get_attribute("data-index")) == k
        shown(k)


# --- in CI: the Action writes the report, uploads it and links it from the job summary ---------
@pytest.mark.slow
def test_the_action_writes_the_report_and_links_it(tmp_path):
    import yaml

    action = yaml.safe_load((ROOT / "action.yml").read_text(encoding="utf-8"))
    steps = {s["name"]: s for s in action["runs"]["steps"]}
    report, upload, link = steps["HTML report"], steps["Upload the report"], steps["Link the report from the job summary"]
    assert upload["uses"].startswith("actions/upload-artifact@") and upload["with"]["path"] == "${{ steps.report.outputs.path }}"
    assert "!cancelled()" in report["if"] and "steps.upload.outputs.artifact-url" in link["env"]["MEMFIT_REPORT_URL"]
    workspace, runner = tmp_path / "ws", tmp_path / "runner"
    (workspace / "configs").mkdir(parents=True)
    (runner / "memfit-venv" / "bin").mkdir(parents=True)
    # the install step's venv, as this interpreter's memfit
    (runner / "memfit-venv" / "bin" / "memfit").write_text(f"#!/bin/sh\nexec {sys.executable} -m memfit \"$@\"\n")
    (runner / "memfit-venv" / "bin" / "memfit").chmod(0o755)
    (workspace / "configs" / "cnn.yaml").write_text(KERAS_RUN)
    (workspace / "compose.yml").write_text("services: {web: {image: nginx}}\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}, "RUNNER_TEMP": str(runner), "GITHUB_OUTPUT": str(tmp_path / "out"),
           "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"), "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "MEMFIT_PATHS": "configs compose.yml", "MEMFIT_BUDGET": ""}
    done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", report["run"]], cwd=workspace, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    written = (tmp_path / "out").read_text().strip()
    assert written == f"path={runner}/memfit-report/memfit-report.html"
    html = Path(written.split("=", 1)[1]).read_text(encoding="utf-8")
    assert "configs/cnn.yaml" in html and "compose.yml" not in html
    url = "https://github.com/o/r/actions/runs/1/artifacts/2"
    env["MEMFIT_REPORT_URL"] = url
    done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", link["run"]], cwd=workspace, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert f"**[memfit report]({url})**" in (tmp_path / "summary.md").read_text(encoding="utf-8")


# --- memfit diff REV --format html: the revision's timeline over the working tree's -------------
@pytest.mark.slow
def test_diff_html_overlays_the_revision(tmp_path):
    sync, chromium = _browser()
    repo = tmp_path / "repo"
    (repo / "models").mkdir(parents=True)
    original = (ROOT / "examples" / "gpt2-small.yaml").read_text(encoding="utf-8")
    assert "micro_batch: 8" in original
    (repo / "train.yaml").write_text(original)
    (repo / "models" / "gpt2.json").write_text((ROOT / "examples" / "models" / "gpt2.json").read_text())
    identity = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=repo, check=True, env=identity, capture_output=True)
    (repo / "train.yaml").write_text(original.replace("micro_batch: 8", "micro_batch: 4"))
    (repo / "base.yaml").write_text(original)  # the revision's config, for explain to compare with
    then, now = explain_json(repo / "base.yaml", repo / "train.yaml")
    (repo / "base.yaml").unlink()
    done = memfit("diff", "HEAD", "--format", "html", cwd=repo)
    assert done.returncode == 0, done.stderr
    report = tmp_path / "diff.html"
    report.write_text(done.stdout, encoding="utf-8")
    assert not re.search(r"[A-Za-z][A-Za-z0-9+.-]*://", done.stdout)
    with sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            requests, problems = _open(page, report.as_uri())
            overlay = page.locator("path.overlay")
            assert [int(v) for v in overlay.get_attribute("data-values").split()] == [e["bytes"] for e in then["timeline"]]
            series = {page.locator("path.series").nth(i).get_attribute("data-category"): page.locator("path.series").nth(i).get_attribute("data-values") for i in range(page.locator("path.series").count())}
            assert series["activations"].split() == [str(e["live"]["activations"]) for e in now["timeline"]]
            cells = page.locator("table.before tbody tr").all()
            peak_row = [c for c in cells if c.locator("th").inner_text() == "peak"][0]
            assert int(peak_row.locator("td[data-bytes]").last.get_attribute("data-bytes")) == now["peak"]["bytes"] - then["peak"]["bytes"] < 0
            assert "HEAD" in page.locator(".legend").inner_text()
            assert problems == [] and requests == [report.as_uri()], (problems, requests)
        finally:
            browser.close()
