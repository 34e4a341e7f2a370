"""A real JupyterLab in headless Chromium, for the browser tests (pytest -m browser).

One JupyterLab server and one Chromium per session; a fresh browser context (page) per test.
The server runs on 127.0.0.1 on a free port with a random token, with its configuration,
settings, workspaces and runtime files in a temporary folder, serving a temporary COPY of
notebooks/ (so a notebook that gets saved never touches the repository). News, update checks and
the extension manager are off, so nothing reaches for the network. Chromium is Debian's
(/usr/bin/chromium, or $LLM_ANATOMY_CHROMIUM), driven by Playwright's Python package; Playwright's own
browser download is not used. Without Chromium the tests skip, except under CI (CI set), where they fail.

Teardown shuts the server down (kernels included), kills its process group and any child that
survives, and checks that no jupyter, kernel or chromium process of ours is left, also after a failure.

Screenshots of every widget go to test-artifacts/screenshots/ for a person to look at.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# $LLM_ANATOMY_BROWSER_NOTEBOOKS serves another folder instead (e.g. a copy with a widget broken on purpose).
NOTEBOOKS = Path(os.environ.get("LLM_ANATOMY_BROWSER_NOTEBOOKS") or ROOT / "notebooks")
ARTIFACTS = ROOT / "test-artifacts"
SCREENSHOTS = ARTIFACTS / "screenshots"

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
                 "--disable-dev-shm-usage"]

# Generous but bounded waits, in milliseconds: the test machine may have 2 slow, shared cores.
SERVER_START_S = 120
PAGE_LOAD_MS = 120_000
KERNEL_START_MS = 120_000
RUN_ALL_MS = 900_000  # a whole notebook, model load and its measurements included
WIDGET_UPDATE_MS = 60_000

# User settings written into the temporary JUPYTERLAB_SETTINGS_DIR.
LAB_SETTINGS = {
    # No news feed, no update check, no "would you like news?" toast.
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    # The extension manager would query PyPI.
    "@jupyterlab/extensionmanager-extension:plugin": {"enabled": False},
    # Keep every cell in the DOM, so that tests can find widgets anywhere in a long notebook.
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
}

# Browser console messages that say nothing about our widgets (checked by exact pattern, not broadly).
HARMLESS_CONSOLE = [
    re.compile(r"favicon.*404|404.*favicon", re.I),
    re.compile(r"^Failed to load resource: the server responded with a status of 404 \(Not Found\)$"),
    # The "Open in Colab" badge image lives on the internet, which the test machine cannot reach.
    re.compile(r"^Failed to load resource: net::ERR_(NAME_NOT_RESOLVED|INTERNET_DISCONNECTED|CONNECTION_REFUSED)$"),
    re.compile(r"ResizeObserver loop (limit exceeded|completed with undelivered notifications)"),
]
# Console errors that point at a widget problem (ipywidgets' manager logs these).
WIDGET_CONSOLE = re.compile(r"widget|jupyter-widgets|ipywidgets|Could not create (a )?view|model not found|"
                            r"Class \w+ not found|Failed to (load|create) (model|view)", re.I)


# --------------------------------------------------------------------------- helpers


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _chromium_path() -> str | None:
    candidates = [os.environ.get("LLM_ANATOMY_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                  shutil.which("chromium-browser")]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _missing(reason: str):
    """Skip on a developer's machine; fail in CI, where the browser must be there."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so the browser tests must run: .ci/run installs chromium)",
                    pytrace=False)
    pytest.skip(reason)


def _our_stragglers(workdir: Path) -> list:
    """Live processes below this pytest that the browser harness started: the JupyterLab server and its
    kernels (their command lines name our temporary folder), Chromium and Playwright's driver.

    Other kernels of the same pytest run (nbval's) use the default runtime folder and are not counted.
    """
    import psutil

    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        if str(workdir) in cmd or any(word in cmd.lower() for word in ("chrom", "playwright")):
            found.append(proc)
    return found


# --------------------------------------------------------------------------- the server


class LabServer:
    """A JupyterLab server in its own process group, with everything in a temporary folder."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port = _free_port()
        self.token = uuid.uuid4().hex
        self.base = f"http://127.0.0.1:{self.port}"
        self.root = workdir / "notebooks"
        self.log_path = ARTIFACTS / "browser" / "jupyterlab.log"
        self.proc: subprocess.Popen | None = None
        self.children: list = []

    def _prepare(self) -> dict:
        shutil.copytree(NOTEBOOKS, self.root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        dirs = {name: self.workdir / name for name in ("config", "settings", "workspaces", "runtime", "ipython")}
        for folder in dirs.values():
            folder.mkdir()
        for plugin, values in LAB_SETTINGS.items():
            package, name = plugin.split(":")
            target = dirs["settings"] / package / f"{name}.jupyterlab-settings"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(values))
        config = {
            "ServerApp": {"ip": "127.0.0.1", "port": self.port, "port_retries": 0, "open_browser": False,
                          "root_dir": str(self.root), "allow_root": os.geteuid() == 0,
                          "terminals_enabled": False, "shutdown_no_activity_timeout": 3600},
            "IdentityProvider": {"token": self.token},
            "LabApp": {"news_url": None, "check_for_updates_class": "jupyterlab.handlers.announcements.NeverCheckForUpdate"},
            "MappingKernelManager": {"cull_idle_timeout": 0},
        }
        (dirs["config"] / "jupyter_server_config.json").write_text(json.dumps(config))
        env = dict(os.environ)
        env.update(JUPYTER_CONFIG_DIR=str(dirs["config"]), JUPYTERLAB_SETTINGS_DIR=str(dirs["settings"]),
                   JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]), JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
                   IPYTHONDIR=str(dirs["ipython"]), HF_HUB_OFFLINE="1", PYDEVD_DISABLE_FILE_VALIDATION="1",
                   JUPYTER_PLATFORM_DIRS="1")
        env.pop("JUPYTER_PATH", None)
        return env

    def start(self) -> None:
        env = self._prepare()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w")
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--ServerApp.port={self.port}",
               f"--ServerApp.root_dir={self.root}", "--ServerApp.ip=127.0.0.1"]
        self.proc = subprocess.Popen(cmd, env=env, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}; see {self.log_path}")
            try:
                self.api("GET", "/api/status")
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        raise RuntimeError(f"JupyterLab did not answer within {SERVER_START_S} s; see {self.log_path}")

    def api(self, method: str, path: str, timeout: float = 10):
        request = urllib.request.Request(self.base + path, method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def url(self, path: str) -> str:
        return f"{self.base}{path}{'&' if '?' in path else '?'}token={self.token}"

    def kernel_pids(self) -> list:
        import psutil

        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []

    def shutdown_kernels(self) -> None:
        """Stop every kernel (between tests, to free memory)."""
        try:
            for session in self.api("GET", "/api/sessions"):
                self.api("DELETE", f"/api/sessions/{session['id']}", timeout=30)
            for kernel in self.api("GET", "/api/kernels"):
                self.api("DELETE", f"/api/kernels/{kernel['id']}", timeout=30)
        except (urllib.error.URLError, OSError):
            pass

    def stop(self) -> None:
        """Shut down politely, then kill the process group and every child that survives."""
        import psutil

        if self.proc is None:
            return
        children = self.kernel_pids()  # kernels run in sessions of their own: remember them now
        if self.proc.poll() is None:
            try:
                self.api("POST", "/api/shutdown", timeout=10)
            except (urllib.error.URLError, OSError):
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        for child in children:
            try:
                child.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(children, timeout=10)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def chromium_path():
    path = _chromium_path()
    if path is None:
        _missing("Chromium is not installed (looked for $LLM_ANATOMY_CHROMIUM, /usr/bin/chromium, chromium "
                 "on PATH); on Debian/Ubuntu: sudo apt-get install chromium")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _missing("the playwright Python package is not installed (pip install -r requirements-lock.txt)")
    return path


@pytest.fixture(scope="session")
def lab(chromium_path, tmp_path_factory):
    """The running JupyterLab server; stopped, with everything it started, at the end of the session."""
    for old in SCREENSHOTS.glob("FAILED-*.png"):
        old.unlink()
    server = LabServer(tmp_path_factory.mktemp("jupyterlab"))
    try:
        server.start()
        yield server
    finally:
        server.stop()
        _nothing_left_behind(server.workdir)  # Chromium (which depends on the server) is closed by now


@pytest.fixture(scope="session")
def browser(chromium_path, lab):
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    browser = None
    try:
        browser = playwright.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS, headless=True)
        yield browser
    finally:
        try:
            if browser is not None:
                browser.close()
        finally:
            playwright.stop()


def _nothing_left_behind(workdir: Path) -> None:
    """After the browser session: no server, kernel, Chromium or Playwright process of ours survives."""
    import psutil

    left = _our_stragglers(workdir)
    if left:
        names = [f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in left]
        for proc in left:
            try:
                proc.kill()
            except psutil.Error:
                pass
        pytest.fail(f"processes left behind by the browser tests (now killed): {names}", pytrace=False)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def notebook_page(browser, lab, request):
    """A fresh browser context and page; on failure a full screenshot; afterwards every kernel stopped."""
    context = browser.new_context(viewport={"width": 1400, "height": 1600})
    context.set_default_timeout(30_000)
    page = context.new_page()
    ui = LabPage(page, lab, request.node.name)
    try:
        yield ui
    finally:
        try:
            failed = getattr(request.node, "rep_call", None)
            if failed is not None and failed.failed:
                SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SCREENSHOTS / f"FAILED-{request.node.name}.png"), full_page=False)
                print("console errors seen:", ui.console_errors, "page errors:", ui.page_errors)
        except Exception:  # a screenshot must never hide the real failure
            pass
        finally:
            context.close()
            lab.shutdown_kernels()


# --------------------------------------------------------------------------- driving JupyterLab


class LabPage:
    """One JupyterLab page: open a notebook, run it, find widgets, and watch for errors."""

    def __init__(self, page, lab: LabServer, name: str):
        self.page = page
        self.lab = lab
        self.name = re.sub(r"[^\w.-]+", "_", name)
        self.console_errors: list[str] = []
        self.page_errors: list[str] = []
        page.on("console", lambda msg: self.console_errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda err: self.page_errors.append(str(err)))

    # -- opening and running

    def open(self, notebook: str) -> None:
        """Open notebooks/<notebook> in a fresh workspace and wait for its kernel to be idle."""
        from playwright.sync_api import expect

        if not (self.lab.root / notebook).exists():
            _missing(f"notebooks/{notebook} does not exist (yet)")
        workspace = f"t{uuid.uuid4().hex[:8]}"
        self.page.goto(self.lab.url(f"/lab/workspaces/{workspace}/tree/{notebook}?reset"), timeout=PAGE_LOAD_MS)
        self.panel = self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
        expect(self.panel.locator(".jp-Cell").first).to_be_visible(timeout=PAGE_LOAD_MS)
        self.dismiss_dialogs()
        self.notebook = notebook
        self.wait_kernel_ready(KERNEL_START_MS)

    def open_widget(self, notebook: str, marker: str) -> float:
        """Open and Run All a slice of notebooks/<notebook>: its one cell containing `marker` (the widget's) and
        the statements above that it needs (tests/browser/slicing.py); return the seconds Run All took.

        nbval runs every notebook whole; this runs only what the widget reads, so no notebook runs twice."""
        from slicing import write_widget_slice

        source = self.lab.root / notebook
        if not source.exists():
            _missing(f"notebooks/{notebook} does not exist (yet)")
        sliced = source.with_name(f"{source.stem}.widget.ipynb")
        kept = write_widget_slice(source, marker, sliced)
        self.open(sliced.name)
        seconds = self.run_all()
        print(f"{notebook}'s widget slice (statements kept per cell: {kept}) ran in the browser in {seconds:.0f} s")
        return seconds

    def dismiss_dialogs(self) -> None:
        """Answer JupyterLab's dialogs (kernel choice: keep the default) and close any toast."""
        for _ in range(5):
            dialog = self.page.locator(".jp-Dialog")
            if dialog.count() == 0:
                break
            accept = dialog.locator("button.jp-mod-accept")
            if dialog.get_by_text("Select Kernel").count() and accept.count():
                accept.first.click()
            else:
                self.page.keyboard.press("Escape")
            self.page.wait_for_timeout(300)
        for close in self.page.locator(".jp-Notification-Toast-Close").all():
            try:
                close.click(timeout=2000)
            except Exception:
                pass

    def kernel_status(self) -> str:
        return self.panel.locator(".jp-Notebook-ExecutionIndicator").first.get_attribute("data-status") or ""

    def wait_kernel_ready(self, timeout_ms: int) -> None:
        """Wait until the notebook's kernel has started and is idle, and has stayed the same for 2 s.

        The toolbar's indicator reads 'idle' before any kernel exists, so ask the server too.
        """
        deadline = time.monotonic() + timeout_ms / 1000
        seen, steady = None, 0
        while time.monotonic() < deadline:
            kernels = [s["kernel"] for s in self.lab.api("GET", "/api/sessions")
                       if s.get("path") == self.notebook and s.get("kernel")]
            current = kernels[0]["id"] if len(kernels) == 1 and kernels[0]["execution_state"] == "idle" else None
            if current and current == seen and self.kernel_status() == "idle":
                steady += 1
                if steady >= 2:
                    return
            else:
                steady = 0
            seen = current
            self.page.wait_for_timeout(1000)
            self.dismiss_dialogs()
        pytest.fail(f"{self.name}: the kernel of {self.notebook} was not ready within {timeout_ms / 1000:.0f} s",
                    pytrace=False)

    def run_all(self, timeout_ms: int = RUN_ALL_MS) -> float:
        """Run > Run All Cells from the menu bar; wait until every cell ran; return the seconds it took."""
        start = time.monotonic()
        prompts = self.panel.locator(".jp-CodeCell .jp-InputPrompt")
        # Menus grow while extensions load, so an early click can land on another item: retry once.
        for attempt in range(2):
            self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
            item = self.page.locator(".lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel",
                                     has_text=re.compile(r"^Run All Cells$"))
            item.wait_for(state="visible")
            self.page.wait_for_timeout(500)  # let the menu settle where it opens
            item.click()
            self.dismiss_dialogs()
            # Started when a cell waits, runs or has run.
            started_by = time.monotonic() + 30
            while time.monotonic() < started_by:
                if any(re.search(r"\[(\*|\d+)\]", t) for t in prompts.all_inner_texts()):
                    break
                self.page.wait_for_timeout(250)
            else:
                continue
            break
        else:
            pytest.fail(f"{self.name}: Run > Run All Cells started nothing, twice", pytrace=False)
        deadline = start + timeout_ms / 1000
        # Done when no cell waits or runs ([*]) and the kernel is idle, twice in a row.
        settled = 0
        while time.monotonic() < deadline:
            texts = prompts.all_inner_texts()
            busy = any("*" in t for t in texts)
            settled = settled + 1 if (not busy and self.kernel_status() == "idle") else 0
            if settled >= 2:
                break
            self.page.wait_for_timeout(1000)
        else:
            pytest.fail(f"{self.name}: the notebook did not finish within {timeout_ms / 1000:.0f} s", pytrace=False)
        texts = prompts.all_inner_texts()
        not_run = [i for i, t in enumerate(texts) if not re.search(r"\[\d+\]", t)]
        if not_run:
            errors = self.panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            detail = "\n".join(errors.all_inner_texts())[-3000:]
            pytest.fail(f"{self.name}: code cells {not_run} did not run (a cell above them failed?):\n{detail}",
                        pytrace=False)
        return time.monotonic() - start

    # -- finding things

    def widget(self, css_class: str):
        """The one element with this CSS class, scrolled into view."""
        from playwright.sync_api import expect

        found = self.panel.locator(f".{css_class}")
        try:
            expect(found.first).to_be_visible(timeout=WIDGET_UPDATE_MS)
        except AssertionError:
            problems = self.widget_problems()
            pytest.fail(f"{self.name}: no visible .{css_class} in {self.notebook} after running it"
                        + (":\n" + "\n".join(problems) if problems else ""), pytrace=False)
        # The first one is the widget under test; a notebook may show it again further down.
        found.first.scroll_into_view_if_needed()
        return found.first

    def set_slider(self, slider, value: int) -> None:
        """Set an ipywidgets slider as a person would: type the value into its readout and press Enter."""
        readout = slider.locator(".widget-readout")
        readout.scroll_into_view_if_needed()
        readout.click()
        self.page.keyboard.press("Control+A")
        self.page.keyboard.type(str(value))
        self.page.keyboard.press("Enter")

    def image_digest(self, image) -> tuple[int, str]:
        """(bytes, SHA-256) of what an <img> (an ipywidgets Image) shows right now."""
        length, digest = image.evaluate("""async (img) => {
            const data = await (await fetch(img.src)).arrayBuffer();
            const hash = await crypto.subtle.digest("SHA-256", data);
            return [data.byteLength, Array.from(new Uint8Array(hash), b => b.toString(16).padStart(2, "0")).join("")];
        }""")
        return int(length), digest

    def wait_image_change(self, image, before: tuple[int, str], timeout_ms: int = WIDGET_UPDATE_MS):
        """Wait until the image shows something other than `before`; return its new digest."""
        deadline = time.monotonic() + timeout_ms / 1000
        while time.monotonic() < deadline:
            now = self.image_digest(image)
            if now != before:
                return now
            self.page.wait_for_timeout(500)
        pytest.fail(f"{self.name}: the image did not change within {timeout_ms / 1000:.0f} s", pytrace=False)

    def outputs_text(self) -> str:
        return "\n".join(self.panel.locator(".jp-OutputArea-output").all_inner_texts())

    def screenshot(self, locator, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        locator.screenshot(path=str(path))
        return path

    # -- errors

    def widget_problems(self) -> list[str]:
        """Widget-related JavaScript errors and 'Error displaying widget' texts seen so far."""
        problems = [f"page error: {e}" for e in self.page_errors
                    if not any(p.search(e) for p in HARMLESS_CONSOLE)]
        problems += [f"console error: {e}" for e in self.console_errors
                     if WIDGET_CONSOLE.search(e) and not any(p.search(e) for p in HARMLESS_CONSOLE)]
        shown = self.page.get_by_text(re.compile(r"Error displaying widget|Failed to (load|render) widget"))
        problems += [f"shown in the page: {t}" for t in shown.all_inner_texts()]
        return problems

    def assert_no_widget_errors(self) -> None:
        problems = self.widget_problems()
        assert not problems, "\n".join(problems)

    def assert_error_line_empty(self, css_class: str) -> None:
        """The widget's own error line (ErrorLine) shows nothing."""
        lines = self.panel.locator(f".{css_class}")
        texts = [t.strip() for t in lines.all_inner_texts()]
        assert not any(texts), f".{css_class} shows: {texts}"
