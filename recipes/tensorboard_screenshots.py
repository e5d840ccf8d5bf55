"""Screenshots of TensorBoard showing a run's logs, taken by a real headless Chromium, for the README and the docs.

Every picture of the main job in ``recipes/figures`` comes from one command, run from a checkout's root::

    python -m recipes.tensorboard_screenshots --fit

It fits the main job (``lightning-gae fit --config configs/vit_digits.yaml``, about two minutes on a quiet CPU) into a
temporary folder, starts ``tensorboard --logdir`` over it on a free loopback port, opens it in Debian's ``chromium``
(``apt-get install chromium``) driven over the DevTools protocol on a pipe, and saves ``tensorboard_gae_tab.png``
(the GAE dashboard: the summary, the curves, the first samples), ``tensorboard_gae_tab_crop.png`` (cut out of it:
its first ranking table and chart at full size, the docs' front picture), ``tensorboard_gae_curves.png`` (its curves),
``tensorboard_images.png``, ``tensorboard_custom_scalars.png``, ``tensorboard_faithfulness_table.png`` (the Text
tab) and ``vit_digits_tensorboard.png`` (:mod:`recipes.readme_figure`), then ``manifest.json``: what they were made
from, the hash of the GAE tab's code (:func:`dashboard_hash`) included, which ``tests/test_docs.py`` compares with
the code's. ``python -m recipes.tensorboard_screenshots runs/vit_digits`` does the same over a run already made.

Every other picture there is the GAE tab over another recipe's fit (:data:`RECIPES`: several token sets, a
retrieval model, a causal LM, the shortcut text recipe's region cut to its chart), made the same way by
``--recipes NAME [NAME ...]`` (or ``all``): each config fitted, seeded and on one thread, into a temporary folder
(half a minute each, the causal LM ten minutes). ``LOGDIR --recipes NAME`` shoots a run of that recipe already made.
Every picture is recorded in the manifest with the dashboard's hash it was made with, so the test names the command
of each one the dashboard changed since; ``python -m recipes.tensorboard_screenshots --fit --recipes all`` remakes
them all. The test of the dashboard (``tests/tensorboard/test_plugin.py``) drives the browser through the same
:class:`Chromium` and :func:`tensorboard_server`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "recipes" / "figures"
MANIFEST = FIGURES / "manifest.json"
SCRIPT = "python -m recipes.tensorboard_screenshots"
COMMAND = f"{SCRIPT} --fit"
MAIN_JOB = "configs/vit_digits.yaml"


@dataclass(frozen=True)
class Recipe:
    """Another recipe's picture: the GAE tab over a fresh fit of ``config`` (with ``overrides``, command-line
    arguments of ``lightning-gae fit``), saved as ``picture``; ``part``, a CSS selector in the tab, cuts the picture to
    that element (None: the whole tab)."""

    config: str
    picture: str
    part: str | None = None
    overrides: tuple[str, ...] = ()

    def command(self, name: str) -> str:
        return f"{SCRIPT} --recipes {name}"


# The recipes with several token sets, a retrieval model, a causal LM and a declared shortcut region: each picture is
# the GAE tab over its recipe's fit (half a minute to ten minutes on one thread), made by ``--recipes NAME``.
RECIPES = {
    "seq2seq": Recipe("configs/seq2seq.yaml", "tensorboard_gae_seq2seq.png"),
    "dual_encoder": Recipe("configs/dual_encoder.yaml", "tensorboard_gae_dual_encoder.png"),
    # The callback guide's shortcut story: explained every 6 steps, so the chart shows relevance moving onto the word.
    "regions": Recipe("configs/shortcut_text.yaml", "tensorboard_gae_regions.png", part="#gae-regions > [data-region]",
                      overrides=("--trainer.callbacks.every_n_epochs=null", "--trainer.callbacks.every_n_train_steps=6")),
    "recall": Recipe("configs/causal_lm_recall.yaml", "tensorboard_gae_recall.png"),
}
EVERYTHING = f"{COMMAND} --recipes all"


def dashboard_files(root: Path = ROOT) -> list[Path]:
    """The GAE tab's code: the plugin's routes and its frontend, in a fixed order."""
    package = root / "lightning_gae" / "tensorboard"
    return [package / "plugin.py", *sorted((package / "static").iterdir())]


def dashboard_hash(root: Path = ROOT) -> str:
    """SHA-256 over the GAE tab's code (each file's path under ``root`` and its bytes): what the screenshots show."""
    digest = hashlib.sha256()
    for path in dashboard_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    """The path of a Chromium binary on PATH (Debian's ``chromium``), or None."""
    return next((path for name in ("chromium", "chromium-browser") if (path := shutil.which(name))), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def tensorboard_server(logdir: Path, timeout: float = 120.0) -> Iterator[str]:
    """A real ``tensorboard`` on a free loopback port over ``logdir``; yields its base URL once it answers.

    It runs in this interpreter's environment (``python -m tensorboard.main``), so it loads the
    plugins that environment registers, and is stopped on exit.
    """
    port = free_port()
    log = tempfile.TemporaryFile()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port),
         "--reload_interval", "1"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{base}/data/plugins_listing", timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"tensorboard did not start:\n{log.read().decode(errors='replace')}") from None
                time.sleep(0.25)
        yield base
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


class Chromium:
    """A headless Chromium driven over the DevTools protocol on a pipe: no driver, no extra package.

    ``--remote-debugging-pipe`` makes the browser read commands on file descriptor 3 and write
    answers and events on 4, each a JSON message ended by a NUL byte.

    Args:
        executable: the browser binary.
        width: viewport width in CSS pixels.
        height: viewport height in CSS pixels.
    """

    def __init__(self, executable: str, width: int = 1400, height: int = 1000) -> None:
        self._profile = tempfile.mkdtemp(prefix="chromium-")
        commands_read, self._commands = os.pipe()
        self._answers, answers_write = os.pipe()

        def wire() -> None:  # in the child, before exec
            os.dup2(commands_read, 3)
            os.dup2(answers_write, 4)

        self._process = subprocess.Popen(
            [executable, *CHROMIUM_FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=wire,
        )
        os.close(commands_read)
        os.close(answers_write)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.width, self.height = width, height

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("Browser.close", timeout=10)
        try:
            self._process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        for fd in (self._commands, self._answers):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._answers], [], [], remaining)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._answers, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe (did it crash?)")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict[str, Any]:
        """Send one DevTools command and return its result; events that arrive meanwhile go to :attr:`events`."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._message(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def open(self, url: str) -> Page:
        """A new tab showing ``url``, with script errors and console messages recorded."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log"):
            page.send(f"{domain}.enable")
        page.send("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})
        page.send("Page.navigate", {"url": url})
        return page


class Page:
    """One tab of :class:`Chromium`."""

    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser = browser
        self.session = session

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60.0) -> dict[str, Any]:
        return self.browser.send(method, params, self.session, timeout)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the tab's top frame (promises are awaited)."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0) -> Any:
        """Poll ``expression`` until it is truthy (in JavaScript); return its value (True for an element or object).

        An expression that throws (the page is not there yet) counts as false.
        """
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(f"(() => {{ try {{ const v = ({expression}); return v ? (typeof v === 'object' ? true : v) : false; }} "
                                  "catch (error) { return false; } })()")
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:.0f} s for {expression!r}")
            time.sleep(0.2)

    def press(self, key: str, code: int) -> None:
        """Press and release a key in the focused element (``key`` as in DOM's ``KeyboardEvent.key``)."""
        for kind in ("rawKeyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", {"type": kind, "key": key, "code": key, "windowsVirtualKeyCode": code})

    def script_errors(self) -> list[str]:
        """Uncaught exceptions and ``console.error`` calls of every frame of this tab so far."""
        errors = []
        for event in self.browser.events:
            if event.get("sessionId") != self.session:
                continue
            params = event.get("params", {})
            if event.get("method") == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                errors.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
            elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") == "error":
                errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        return errors

    def screenshot(self, path: Path, clip: dict[str, float] | None = None) -> None:
        """Save the viewport (or ``clip``: x, y, width, height in CSS pixels) as a PNG."""
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": clip is not None}
        if clip:
            params["clip"] = {**clip, "scale": 1}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", params)["data"]))


# The GAE tab lives in an iframe TensorBoard creates; it is same-origin, so the top frame can read it.
DASHBOARD = "document.querySelector('iframe').contentDocument"

# TensorBoard's own dashboards are Polymer elements: their parts are inside shadow roots.
DEEP = """((selector, text) => {
  const seek = (root) => {
    for (const hit of root.querySelectorAll(selector)) if (!text || hit.textContent.includes(text)) return hit;
    for (const node of root.querySelectorAll('*')) if (node.shadowRoot) { const hit = seek(node.shadowRoot); if (hit) return hit; }
    return null;
  };
  return seek(document);
})"""


def _settle(page: Page, seconds: float = 2.0) -> None:
    """Let charts finish their transitions before a screenshot (a picture, not a test: waiting is fine)."""
    time.sleep(seconds)
    page.evaluate("new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")


def gae_tab(page: Page, output: Path, name: str = "tensorboard_gae_tab.png", part: str | None = None) -> list[Path]:
    page.wait_for(f"{DASHBOARD}.querySelector('#gae-dashboard[data-rendered-step]')", timeout=180)
    if part:
        return [_part(page, output / name, part)]
    # Hover a patch of the first GAE map (a matrix cell, a token), so the picture shows the read-out.
    target = ("canvas.gae-heatmap[data-method=gae], table.gae-matrix[data-method=gae] td.gae-cell, "
              ".gae-tokens[data-method=gae] .gae-token:not(.muted), canvas.gae-heatmap")
    hovered = page.evaluate(f"""(() => {{
        const frame = document.querySelector('iframe').getBoundingClientRect();
        const hits = {DASHBOARD}.querySelectorAll('{target}');
        if (!hits.length) return null;  // a run with scores and no pictures: nothing to hover
        const r = hits[Math.min(hits.length - 1, hits[0].tagName === 'TD' ? 37 : 0)].getBoundingClientRect();
        return [frame.left + r.left, frame.top + r.top, r.width, r.height];
    }})()""")
    if hovered:
        left, top, width, height = hovered
        page.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": left + width * 0.6, "y": top + height * 0.4})
    _settle(page, 0.5)
    first = output / name
    page.screenshot(first)
    if name != "tensorboard_gae_tab.png":
        return [first]
    made = [first, *_crop(page, first)]
    if not page.evaluate(f"Boolean({DASHBOARD}.querySelector('.gae-curves'))"):
        return made
    page.evaluate(f"{DASHBOARD}.querySelector('#gae-tooltip').style.display = 'none'")
    page.evaluate(f"{DASHBOARD}.querySelector('.gae-curves').scrollIntoView({{block: 'end'}})")
    _settle(page, 0.5)
    # The curves and their section title, where they are on screen now.
    x, y, w, h = page.evaluate(f"""(() => {{
        const frame = document.querySelector('iframe').getBoundingClientRect();
        const curves = {DASHBOARD}.querySelector('.gae-curves');
        const top = curves.previousElementSibling.getBoundingClientRect().top;
        const r = curves.getBoundingClientRect();
        const right = Math.max(...[...curves.children].map((c) => c.getBoundingClientRect().right));
        return [frame.left, frame.top + top - 8, right + 16, r.bottom - top + 16];
    }})()""")
    second = output / "tensorboard_gae_curves.png"
    page.screenshot(second, clip={"x": x, "y": y, "width": w, "height": h})
    return [*made, second]


def _part(page: Page, path: Path, selector: str) -> Path:
    """Save the first element of the GAE tab that ``selector`` matches, scrolled into view, with a margin of 6 px (8
    reaches the text above the element)."""
    if not page.evaluate(f"Boolean({DASHBOARD}.querySelector({json.dumps(selector)}))"):
        raise SystemExit(f"the GAE tab has no {selector!r} to cut {path.name} to: did the fit log it?")
    page.evaluate(f"{DASHBOARD}.querySelector({json.dumps(selector)}).scrollIntoView({{block: 'center'}})")
    _settle(page, 0.5)
    x, y, w, h = page.evaluate(f"""(() => {{
        const frame = document.querySelector('iframe').getBoundingClientRect();
        const r = {DASHBOARD}.querySelector({json.dumps(selector)}).getBoundingClientRect();
        return [frame.left + r.left - 6, frame.top + r.top - 6, r.width + 12, r.height + 12];
    }})()""")
    page.screenshot(path, clip={"x": x, "y": y, "width": w, "height": h})
    return path


def _crop(page: Page, full: Path) -> list[Path]:
    """The front picture, cut out of ``full`` (the GAE tab's screenshot): the summary's title, its first ranking table
    and the first chart over training, each cut on its own and stacked, at full size.

    At a page's width the whole tab's text is too small to read, so the docs' index shows these parts of it,
    stacked, and links to the whole. Where the tab has no summary (a run without scores) it is the tab's top left.
    """
    boxes = page.evaluate(f"""(() => {{
        const doc = {DASHBOARD}, frame = document.querySelector('iframe').getBoundingClientRect();
        const summary = doc.querySelector('.gae-summary'), chart = doc.querySelector('.gae-history');
        if (!summary) return [[frame.left, frame.top, frame.left + 800, frame.top + 500]];
        const text = doc.createRange();
        text.selectNodeContents(summary.previousElementSibling);
        const title = text.getBoundingClientRect(), table = summary.firstElementChild.getBoundingClientRect();
        const box = (r, above = 4) => [frame.left + r.left - 8, frame.top + r.top - above, frame.left + r.right + 8, frame.top + r.bottom + 4];
        const parts = [box(title), box(table)];
        return chart ? [...parts, box(chart.getBoundingClientRect(), 0)] : parts;
    }})()""")
    from PIL import Image

    with Image.open(full) as image:
        parts = [image.crop(tuple(round(v) for v in b)) for b in boxes]
    crop = Image.new("RGB", (max(p.width for p in parts), sum(p.height for p in parts)), "white")
    top = 0
    for part in parts:
        crop.paste(part, (0, top))
        top += part.height
    path = full.parent / "tensorboard_gae_tab_crop.png"
    crop.save(path)
    return [path]


def images_tab(page: Page, output: Path) -> list[Path]:
    page.wait_for(f"{DEEP}('img') && {DEEP}('img').naturalWidth > 0", timeout=180)
    # TensorBoard fits images to 350 px cards unless "Show actual image size" is ticked.
    page.evaluate(f"{DEEP}('paper-checkbox', 'actual image size').click()")
    page.evaluate(f"{DEEP}('.heading', 'gae_evolution') && {DEEP}('.heading', 'gae_evolution').click()")
    _settle(page)
    path = output / "tensorboard_images.png"
    page.screenshot(path)
    return [path]


def custom_scalars_tab(page: Page, output: Path) -> list[Path]:
    page.wait_for(f"{DEEP}('tf-custom-scalar-multi-line-chart-card')", timeout=180)
    # Every point on the axes (TensorBoard's default clips them to the 5-95% quantiles of a chart's values), the
    # lines through the points themselves (no smoothing), and each chart's list of matches open: its legend.
    page.evaluate(f"(() => {{ const d = {DEEP}('tf-custom-scalar-dashboard'); d.set('_ignoreYOutliers', false); "
                  "d.set('_smoothingWeight', 0); })()")
    page.evaluate("""(() => {
        const cards = [];
        const seek = (root) => { for (const n of root.querySelectorAll('*')) {
            if (n.tagName.toLowerCase() === 'tf-custom-scalar-multi-line-chart-card') cards.push(n);
            if (n.shadowRoot) seek(n.shadowRoot); } };
        seek(document);
        cards.forEach((card) => card.set('_matchesListOpened', true));
    })()""")
    _settle(page, 4.0)
    path = output / "tensorboard_custom_scalars.png"
    page.screenshot(path, clip={"x": 0, "y": 0, "width": page.browser.width, "height": 1050})
    return [path]


def text_tab(page: Page, output: Path) -> list[Path]:
    page.wait_for(f"{DEEP}('table')", timeout=180)
    _settle(page, 1.0)
    path = output / "tensorboard_faithfulness_table.png"
    page.screenshot(path, clip={"x": 0, "y": 0, "width": 1100, "height": 460})
    return [path]


def fit(config: str, folder: Path, overrides: tuple[str, ...] = ()) -> tuple[Path, str]:
    """Fit ``config`` (seeded by its ``seed_everything``, on one thread; ``overrides``: more arguments) with its logs
    under ``folder``: its logdir (``folder/<its logger's name>``) and what it printed."""
    import yaml

    name = yaml.safe_load((ROOT / config).read_text())["trainer"]["logger"]["init_args"]["name"]
    fitted = subprocess.run([sys.executable, "-m", "lightning_gae.cli", "fit", "--config", config,
                             *overrides, f"--trainer.logger.init_args.save_dir={folder}"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    print(fitted.stdout)
    fitted.check_returncode()
    return folder / name, fitted.stdout


def fit_main_job(folder: Path) -> tuple[Path, list[str]]:
    """Fit the main job with its logs under ``folder``: its logdir (``folder/vit_digits``) and the faithfulness table
    of the summary it printed (the header and a row per method), which the callback guide quotes."""
    logdir, printed = fit(MAIN_JOB, folder)
    return logdir, faithfulness_table(printed)


def faithfulness_table(summary: str) -> list[str]:
    """The faithfulness table of a printed summary: its ``faithfulness (...)`` line and the indented rows under it."""
    lines = summary.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("faithfulness ("))
    table = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        table.append(line)
    return table


def made_from(command: str, config: str, run: str, made: list[Path]) -> dict[str, Any]:
    """A manifest's entry for pictures made by one command: the command, the config and run, the commit, the
    dashboard's code (its hash) and each picture's hash."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {"command": command, "config": config, "run": run, "commit": commit or None,
            "dashboard_files": [p.relative_to(ROOT).as_posix() for p in dashboard_files()],
            "dashboard_sha256": dashboard_hash(), "figures": {p.name: file_hash(p) for p in sorted(made)}}


def write_manifest(output: Path, jobs: dict[str, dict[str, Any]], summary: list[str] | None = None) -> Path:
    """``manifest.json``: for the main job (``main``) and each recipe remade, what :func:`made_from` says, kept for the
    jobs not remade this time; and the faithfulness table the main job's fit printed (after ``--fit``)."""
    path = output / MANIFEST.name
    manifest: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    manifest.setdefault("jobs", {}).update(jobs)
    manifest["jobs"] = {name: manifest["jobs"][name] for name in ["main", *RECIPES] if name in manifest["jobs"]}
    if "main" in jobs:
        manifest["summary"] = summary
    manifest = {"command": EVERYTHING, "jobs": manifest["jobs"], "summary": manifest.get("summary")}
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def shoot(logdir: Path, output: Path, gae_only: str | None = None, part: str | None = None) -> list[Path]:
    """Open each tab of a TensorBoard over ``logdir`` in its own browser and save its pictures to ``output``; with
    ``gae_only``, the GAE tab alone under that name (cut to ``part``, a CSS selector, if given)."""
    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("no chromium on PATH: install it (Debian: apt-get install chromium)")
    tabs = [("gae", lambda page, output: gae_tab(page, output, gae_only or "tensorboard_gae_tab.png", part))]
    if not gae_only:
        tabs += [("images", images_tab), ("custom_scalars", custom_scalars_tab), ("text", text_tab)]
    made = []
    # 1600 px: the Images tab's cards then fit four 256 px panels at their actual size; 1700 px high: the GAE
    # tab's summary, curves and first samples on one screen.
    with tensorboard_server(logdir) as base:
        for tab, take in tabs:
            with Chromium(chromium, width=1600, height={"gae": 1700, "custom_scalars": 1050}.get(tab, 1000)) as browser:
                page = browser.open(f"{base}/#{tab}")
                made += take(page, output)
                errors = page.script_errors()
                if errors:
                    raise SystemExit(f"the {tab} tab logged script errors: {errors}")
    return made


def main_job(logdir: Path | None, output: Path, folder: Path) -> tuple[list[Path], dict[str, Any], list[str] | None]:
    """The main job's pictures over ``logdir`` (None: a fresh fit under ``folder``), its manifest entry and summary."""
    run = str(logdir) if logdir else "a fresh fit (--fit)"
    logdir, summary = fit_main_job(folder) if logdir is None else (logdir, None)
    made = shoot(logdir, output)
    from recipes import readme_figure

    version = max(logdir.glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    figure = output / "vit_digits_tensorboard.png"
    readme_figure.main([str(version), str(figure)])
    made.append(figure)
    return made, made_from(COMMAND, MAIN_JOB, run, made), summary


def recipe_job(name: str, logdir: Path | None, output: Path, folder: Path) -> tuple[list[Path], dict[str, Any]]:
    """Recipe ``name``'s picture over ``logdir`` (None: a fresh fit of its config under ``folder``) and its entry."""
    recipe = RECIPES[name]
    run = str(logdir) if logdir else "a fresh fit"
    if logdir is None:
        logdir, _ = fit(recipe.config, folder / name, recipe.overrides)
    made = shoot(logdir, output, recipe.picture, recipe.part)
    return made, made_from(recipe.command(name), " ".join([recipe.config, *recipe.overrides]), run, made)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir", type=Path, nargs="?",
                        help="a logdir made before, e.g. runs/vit_digits (or --fit); with --recipes NAME, that recipe's")
    parser.add_argument("output", type=Path, nargs="?", default=FIGURES, help="folder for the PNGs (recipes/figures)")
    parser.add_argument("--fit", action="store_true", help=f"first fit the main job ({MAIN_JOB}) into a temporary folder")
    parser.add_argument("--recipes", nargs="+", choices=[*RECIPES, "all"], default=[], metavar="NAME",
                        help=f"also fit these recipes ({', '.join(RECIPES)}, or all) and make their pictures")
    args = parser.parse_args(argv)
    recipes = list(RECIPES) if "all" in args.recipes else list(dict.fromkeys(args.recipes))
    if args.logdir is None and not (args.fit or recipes):
        parser.error(f"give a logdir, --fit (which makes one) or --recipes; `{EVERYTHING}` remakes every picture")
    if args.logdir is not None and (args.fit or len(recipes) > 1):
        parser.error("a logdir is one run: of the main job (no --fit), or of the one recipe --recipes names")
    made: list[Path] = []
    jobs: dict[str, dict[str, Any]] = {}
    summary = None
    with tempfile.TemporaryDirectory(prefix="screenshots-") as folder:
        if args.fit or (args.logdir is not None and not recipes):
            pictures, jobs["main"], summary = main_job(args.logdir, args.output, Path(folder))
            made += pictures
        for name in recipes:
            pictures, jobs[name] = recipe_job(name, args.logdir, args.output, Path(folder))
            made += pictures
    made.append(write_manifest(args.output, jobs, summary))
    for path in made:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
