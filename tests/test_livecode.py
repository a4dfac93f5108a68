"""Live code, end to end: chapter 1's "live code" button runs its cells on a real kernel.

The published site starts its kernels on Binder and loads Thebe from a CDN; neither is
reachable here. So, for the test only:

- a Jupyter server runs from the book's own environment (.venv) on localhost;
- the page's Thebe configuration (the `text/x-thebe-config` script the build writes)
  is pointed at that server instead of Binder, keeping every other setting;
- the Thebe script the page asks for is answered with a pinned npm package, fetched
  once with `npm pack` (version and integrity checked) and served from disk. Every
  other request to another host is aborted.

Then the test clicks the page's own launch button, runs the first cells and finds
their output as rendered from the kernel's messages, and runs one edited cell, whose
output no build could have written into the page. Thebe's typesetting of math in new
outputs (MathJax 2, from a CDN) is switched off: no output of these cells has math.
The last test shows the check failing on the page as published, whose kernel would
come from Binder.
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest
import torch
from playwright.sync_api import TimeoutError as PlaywrightTimeout

import nbcheck
from test_browser import PageVisit, browser, site  # noqa: F401 (fixtures)

ROOT = nbcheck.ROOT
CHAPTER = "notebooks/01-autograd-graph"

# sphinx-thebe 0.3.1 loads thebe 0.8.2 from unpkg, but the npm registry reachable
# here does not serve 0.8.2 (it has thebe 0.9.2 and 0.9.3, and thebelab 0.5.1). thebe 0.9
# changed bootstrap(): called without arguments, as sphinx-thebe calls it, it never
# starts a kernel. thebelab 0.5.1, thebe's previous name, has the API sphinx-thebe
# 0.3.1 calls (thebelab.on, thebelab.bootstrap reading the page's config), so it is
# the one that exercises the page's own code path.
THEBE_PACKAGE = "thebelab"
THEBE_VERSION = "0.5.1"
THEBE_INTEGRITY = (
    "sha512-1wYDNmMRZbO3G4wwmoBs+tdjNhwqpHobYxXLTGkXPT6Ul3jUZppd"
    "Yi3PV1U+sBlohZzzKmYkiMBDivK3XbGJOw=="
)
THEBE_CACHE = ROOT / "_build" / "npm"


def npm_package(name: str, version: str, integrity: str) -> Path:
    """The unpacked npm package name@version, fetched once; fails if it is not the pin."""
    target = THEBE_CACHE / f"{name}-{version}"
    if (target / "package.json").is_file():
        return target
    npm = shutil.which("npm")
    assert npm, "npm is missing: the live-code test fetches Thebe with it (apt-get install npm)"
    with tempfile.TemporaryDirectory() as tmp:
        packed = subprocess.run(
            [npm, "pack", f"{name}@{version}", "--json", "--pack-destination", tmp],
            capture_output=True,
            text=True,
            cwd=tmp,
        )
        assert packed.returncode == 0, f"npm pack {name}@{version} failed:\n{packed.stderr}"
        (info,) = json.loads(packed.stdout)
        assert info["integrity"] == integrity, f"{name}@{version}: not the pinned tarball"
        with tarfile.open(Path(tmp) / info["filename"]) as archive:
            # the "data" filter refuses links and paths outside tmp (Python >= 3.11.4)
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            archive.extractall(tmp, **safe)
        THEBE_CACHE.mkdir(parents=True, exist_ok=True)
        shutil.move(Path(tmp) / "package", target)
    return target


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def jupyter_server(site):  # noqa: F811
    """A Jupyter server from the book's environment on localhost; yields (url, token)."""
    token, port = secrets.token_hex(16), free_port()
    home = Path(tempfile.mkdtemp(prefix="wgs-jupyter-"))
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
    }
    command = [
        sys.executable,
        "-m",
        "jupyter_server",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={ROOT}",
        f"--ServerApp.allow_origin={site}",
        f"--IdentityProvider.token={token}",
        "--ServerApp.open_browser=False",
        "--ServerApp.terminals_enabled=False",
        "--allow-root",  # CI runs as root
    ]
    log = open(home / "server.log", "w+")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, (
                    "the Jupyter server did not start:\n" + (home / "server.log").read_text()
                )
                time.sleep(0.5)
        yield url, token
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
        shutil.rmtree(home, ignore_errors=True)


class LiveCodeVisit(PageVisit):
    """A page whose Thebe script comes from the pinned package; other hosts are cut off."""

    def __init__(self, browser, site, doc, thebe_url, thebe_dir):  # noqa: F811
        self.thebe_url, self.thebe_dir = urlparse(thebe_url), thebe_dir
        self.thebe_served = []
        super().__init__(browser, site, doc)

    def _route(self, route):
        url = urlparse(route.request.url)
        if self._local(route.request.url) or url.scheme == "data":
            route.continue_()
        elif url.netloc == self.thebe_url.netloc and url.path.startswith(
            os.path.dirname(self.thebe_url.path) + "/"
        ):
            # the script the page asks for, and the chunks it loads beside itself
            local = self.thebe_dir / "lib" / Path(url.path).name
            self.thebe_served.append(local.name)
            route.fulfill(path=local) if local.is_file() else route.abort()
        else:
            self.external.append(route.request.url)
            route.abort("internetdisconnected")


POINT_AT_SERVER = """([url, token]) => {
  const el = document.querySelector('script[type="text/x-thebe-config"]');
  const config = eval('(' + el.textContent + ')');
  delete config.binderOptions;
  // Thebe would fetch MathJax 2 from a CDN to typeset math in new outputs; none here.
  config.mathjaxUrl = false;
  config.kernelOptions.serverSettings = {
    baseUrl: url, wsUrl: 'ws' + url.slice(4), token: token, appendToken: true,
  };
  el.textContent = JSON.stringify(config);
  return config;
}"""


# Text the kernel printed, rendered by Thebe's output area. The outputs the build
# wrote into the page are shown by Thebe too, but as HTML, so they never match.
PRINTED = '.thebelab-cell .jp-RenderedText[data-mime-type="application/vnd.jupyter.stdout"]'
STATUS = """() => document.querySelector('.thebe-launch-button .status')?.textContent ?? ''"""


def live_code_problems(visit: PageVisit, timeout_ms: int) -> list[str]:
    """Click the page's live-code button, run chapter 1's first cells and an edited one;
    return what went wrong (empty if the kernel's own output appeared for each)."""
    page = visit.page
    page.locator("button.btn-launch-thebe").dispatch_event("click")
    try:
        page.wait_for_function(f"() => /ready|failed/.test(({STATUS})())", timeout=timeout_ms)
    except PlaywrightTimeout:
        return [f"no kernel: Thebe's status is {page.evaluate(STATUS)!r}"]
    if page.evaluate(STATUS) != "ready":
        return [f"no kernel: Thebe's status is {page.evaluate(STATUS)!r}"]
    if page.locator(PRINTED).count():
        return ["printed output shown before any cell ran: the check could not tell"]
    # the cells a reader sees: a folded check (tag "check") is run from its own fold, and
    # a cell in a closed "Going deeper" box is not visible until the box opens
    cells = page.locator("div.cell:not(.tag_check) .thebelab-cell:visible")
    expected = [
        (0, None, f"torch {torch.__version__}"),  # the first cell prints the version
        (1, None, "grad_fn=<SumBackward0>"),  # the short answer's example prints its loss
        (2, None, "tensor([[1., 1.],"),  # the next prints x
        # an edited cell: only this kernel, with x still defined, can print this
        (3, "print(x.sum() * 21)", "tensor(84."),
    ]
    problems = []
    for index, new_source, text in expected:
        cell = cells.nth(index)
        if new_source is not None:
            cell.locator(".CodeMirror").click()
            page.keyboard.press("Control+A")
            page.keyboard.type(new_source)
        cell.locator(".thebelab-run-button").click()
        try:
            page.locator(PRINTED, has_text=text).wait_for(timeout=timeout_ms)
        except PlaywrightTimeout:
            problems.append(f"cell {index + 1}: the kernel printed no {text!r}")
    problems += [f"asked another host for {url}" for url in visit.external]
    problems += [f"console error: {e}" for e in visit.console_errors]
    return problems


def live_visit(browser, site, point_at=None) -> LiveCodeVisit:  # noqa: F811
    """Chapter 1 with the pinned Thebe; pointed at the server (url, token) if given."""
    thebe = npm_package(THEBE_PACKAGE, THEBE_VERSION, THEBE_INTEGRITY)
    probe = PageVisit(browser, site, CHAPTER)
    thebe_url = probe.page.evaluate("THEBE_JS_URL")  # what sphinx-thebe would load
    probe.page.close()
    visit = LiveCodeVisit(browser, site, CHAPTER, thebe_url, thebe)
    if point_at is not None:
        config = visit.page.evaluate(POINT_AT_SERVER, list(point_at))
        assert os.path.normpath(config["kernelOptions"]["path"]) == "notebooks", config
    return visit


def test_live_code_runs_chapter_one_on_a_local_kernel(browser, site, jupyter_server):  # noqa: F811
    visit = live_visit(browser, site, point_at=jupyter_server)
    try:
        assert live_code_problems(visit, timeout_ms=120_000) == []
        assert "index.js" in visit.thebe_served
    finally:
        visit.page.close()


def test_live_code_check_fails_without_a_kernel(browser, site):  # noqa: F811
    # The page as published: its Thebe asks Binder, which is out of reach here.
    visit = live_visit(browser, site)
    try:
        problems = live_code_problems(visit, timeout_ms=30_000)
        assert problems and problems[0].startswith("no kernel"), problems
        assert any("mybinder.org" in url for url in visit.external)
    finally:
        visit.page.close()
