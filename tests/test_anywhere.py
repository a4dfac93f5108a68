"""A chapter runs wherever a reader opens it: downloaded from its page, or on Colab.

The download test does what a reader does: in Chromium, open the chapter's page,
click the download button, save the .ipynb into an empty folder outside the
repository, and run it top to bottom in a virtual environment that has the
book's pins but not ``gradstop``. The first chapter's setup cell must install
the package (from this checkout: ``GRADSTOP_SOURCE``), and every chapter must
raise only its declared errors.
"""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
import yaml
from playwright.sync_api import sync_playwright
from test_run_twice import RUN_TWICE

import nbcheck
import setup_cell
from test_browser import CHROMIUM, CHROMIUM_ARGS, serve

ROOT = nbcheck.ROOT
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text("utf-8"))
NOTEBOOKS = nbcheck.toc_notebooks()
CHAPTERS = [p for p in NOTEBOOKS if p.parent.name == "notebooks"]
# The seed-coverage appendix reruns every chapter and reads the posts from the
# repository (seed-posts.yml, seed_coverage.py): a report on the repository, which
# cannot run from a download. Its page still offers the download button.
DOWNLOADABLE = [p for p in NOTEBOOKS if p.name != "seed-coverage.ipynb"]
# Kept between runs (make clean removes it): made again when the pins change.
READER_VENV = ROOT / "_build" / "reader-venv"


def doc_of(path: Path) -> str:
    return path.relative_to(ROOT).with_suffix("").as_posix()


# --- the first cell --------------------------------------------------------------


@pytest.mark.parametrize("path", setup_cell.chapters(), ids=lambda p: p.name)
def test_every_chapter_starts_with_the_setup_cell_from_the_config(path):
    nb = nbformat.read(path, as_version=4)
    assert setup_cell.problems(nb, path) == []
    repo = CONFIG["repository"]
    assert f'BOOK = "git+{repo["url"]}@{setup_cell.tag()}"' in setup_cell.source()


def test_a_changed_repository_url_is_caught_and_rewritten(tmp_path):
    nbcheck.repo_copy(tmp_path, ["_config.yml", "pyproject.toml", "notebooks", "scripts"])
    config = tmp_path / "_config.yml"
    config.write_text(
        config.read_text("utf-8").replace(CONFIG["repository"]["url"], "https://example.org/fork")
    )
    check = [sys.executable, "scripts/check-notebooks"]
    stale = subprocess.run(check, cwd=tmp_path, capture_output=True, text=True)
    assert stale.returncode != 0 and "setup_cell.py" in stale.stderr
    subprocess.run([sys.executable, "scripts/setup_cell.py"], cwd=tmp_path, check=True)
    assert subprocess.run(check, cwd=tmp_path).returncode == 0
    first = nbformat.read(tmp_path / CHAPTERS[0].relative_to(ROOT), as_version=4).cells
    assert f'BOOK = "git+https://example.org/fork@{setup_cell.tag()}"' in next(
        c.source for c in first if c.cell_type == "code"
    )


def run_setup_cell(tmp_path, *, path_dirs, uid, gradstop_source=None):
    """The setup cell's code in a fresh Python with this PATH, as user ``uid``."""
    script = f"import os\nos.getuid = lambda: {uid}\n" + setup_cell.source()
    env = {"PATH": os.pathsep.join(str(d) for d in path_dirs), "HOME": str(tmp_path)}
    if gradstop_source:
        env["GRADSTOP_SOURCE"] = gradstop_source
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path
    )


def fake_tools(tmp_path, *names) -> Path:
    """A folder of stand-ins: an apt-get that 'installs' a dot and logs its call."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in names:
        tool = bindir / name
        if name == "apt-get":
            dot, chmod = bindir / "dot", shutil.which("chmod")
            tool.write_text(
                f'#!/bin/sh\necho "$@" >> {tmp_path}/apt.log\n'
                f"echo '#!/bin/sh' > {dot} && {chmod} +x {dot}\n"
            )
        else:
            tool.write_text("#!/bin/sh\n")
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return bindir


def test_setup_cell_prints_nothing_where_everything_is_there(tmp_path):
    result = run_setup_cell(tmp_path, path_dirs=[fake_tools(tmp_path, "dot")], uid=1000)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == ""


def test_setup_cell_without_dot_and_without_root_says_in_one_line_what_to_install(tmp_path):
    result = run_setup_cell(tmp_path, path_dirs=[fake_tools(tmp_path, "apt-get")], uid=1000)
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0 and len(lines) == 1
    assert "sudo apt-get install graphviz" in lines[0] and "brew install graphviz" in lines[0]
    assert not (tmp_path / "apt.log").exists(), "apt-get ran without root"


def test_setup_cell_as_root_installs_dot_with_apt(tmp_path):
    bindir = fake_tools(tmp_path, "apt-get")
    result = run_setup_cell(tmp_path, path_dirs=[bindir], uid=0)
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr
    assert "install -y graphviz" in (tmp_path / "apt.log").read_text()


# --- the launch buttons ----------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    assert Path(CHROMIUM).exists(), "Chromium is missing: apt-get install chromium"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def site(built_book):
    with serve(built_book) as url:
        yield url


def open_page(browser, site, doc):
    context = browser.new_context(accept_downloads=True)
    page = context.new_page()
    local = site.split("//")[1]
    page.route(
        "**/*",
        lambda route: (
            route.continue_() if local in route.request.url else route.fulfill(status=200, body="")
        ),
    )
    page.goto(f"{site}/{doc}.html", wait_until="load")
    return context, page


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_colab_and_binder_buttons_open_this_chapter_from_the_repository(browser, site, path):
    repo = CONFIG["repository"]["url"].removeprefix("https://github.com/").strip("/")
    branch = CONFIG["repository"]["branch"]
    colab = CONFIG["launch_buttons"]["colab_url"]
    doc = doc_of(path)
    context, page = open_page(browser, site, doc)
    page.click("button[aria-label='Launch interactive content']")
    links = {
        a.inner_text().strip(): a.get_attribute("href")
        for a in page.locator(".dropdown-launch-buttons a").all()
    }
    context.close()
    assert links["Colab"] == f"{colab}/github/{repo}/blob/{branch}/{doc}.ipynb"
    assert links["Binder"].endswith(f"/v2/gh/{repo}/{branch}?urlpath=lab/tree/{doc}.ipynb")


# --- a downloaded chapter runs ---------------------------------------------------


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def reader_python():
    """A venv with the book's pins (from pip's local wheels) and no gradstop."""
    python = READER_VENV / "bin" / "python"
    marker = READER_VENV / ".pins"
    if not (marker.exists() and marker.read_text() == digest(ROOT / "requirements.txt")):
        shutil.rmtree(READER_VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(READER_VENV)], check=True)
        # The pins are complete (test_pins): no resolving; bytecode is compiled on use.
        pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-compile"]
        pip += ["-r", str(ROOT / "requirements.txt")]
        subprocess.run(pip, check=True, capture_output=True)
        marker.write_text(digest(ROOT / "requirements.txt"))
    uninstall_gradstop(python)
    return python


def uninstall_gradstop(python: Path) -> None:
    command = [str(python), "-m", "pip", "uninstall", "-q", "-y", "gradstop"]
    subprocess.run(command, capture_output=True)
    assert not has_gradstop(python)


def has_gradstop(python: Path) -> bool:
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('gradstop') is None)"
    return subprocess.run([str(python), "-c", probe]).returncode == 0


def download(browser, site, doc, folder: Path) -> Path:
    """Click the page's download button for its .ipynb and save what arrives."""
    context, page = open_page(browser, site, doc)
    page.click("button[aria-label='Download this page']")
    with page.expect_download() as arrived:
        page.click("a.btn-download-source-button")
    saved = folder / arrived.value.suggested_filename
    arrived.value.save_as(saved)
    context.close()
    return saved


def run_in_reader_env(python: Path, notebook: Path, tmp_path: Path, source: str = str(ROOT)):
    """Run All twice in one kernel of the reader's venv (test_run_twice.RUN_TWICE).

    Returns the notebook as its first pass left it, and what the two passes found
    (``{"problems": [...], "quiet": [...]}``). The first cell installs gradstop from
    ``source`` (this checkout, by default).
    """
    env = {
        **os.environ,
        "GRADSTOP_SOURCE": source,
        # Build gradstop with the venv's own pinned setuptools: no index lookups, and
        # each chapter's install is twice as fast. The cell itself is unchanged.
        "PIP_NO_BUILD_ISOLATION": "0",
        # The reader venv's own kernel, whatever kernels this machine has elsewhere.
        "JUPYTER_PATH": str(python.parents[1] / "share" / "jupyter"),
        "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data"),
    }
    env.pop("PYTHONPATH", None)
    executed = tmp_path / "executed.ipynb"
    timeout = str(nbcheck.cell_timeout())
    scripts = str(ROOT / "scripts")  # nbcheck names the cells; the kernel never sees it
    result = subprocess.run(
        [str(python), "-c", RUN_TWICE, str(notebook), timeout, scripts, str(executed)],
        cwd=notebook.parent,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return nbformat.read(executed, as_version=4), json.loads(result.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def downloaded_runs(browser, site, reader_python, tmp_path_factory):
    """Every chapter downloaded from its page and run in the reader's venv.

    {chapter: (saved file, executed notebook or the failure, gradstop installed after)}.
    The venv starts without gradstop: the first chapter runs alone, and its setup
    cell installs the package; the setup cell is the same in every chapter (checked
    above), so the others reuse that install, as in a reader's own Jupyter, and run
    two at a time (this machine has two cores).
    """
    jobs = []
    for path in DOWNLOADABLE:
        folder = tmp_path_factory.mktemp("reader")
        assert ROOT not in folder.parents
        saved = download(browser, site, doc_of(path), folder)
        jobs.append((path, saved, tmp_path_factory.mktemp("run")))

    def run(job):
        path, saved, workdir = job
        start = time.perf_counter()
        try:
            executed, twice = run_in_reader_env(reader_python, saved, workdir)
        except AssertionError as failure:
            executed, twice = failure, {"problems": [f"the run itself failed: {failure}"]}
        quiet = len(twice.get("quiet", []))
        said = f", {quiet} declared cell(s) raised nothing" if quiet else ""
        print(f"{path.name}: both passes in {time.perf_counter() - start:.1f} s{said}")
        return path, (saved, executed, has_gradstop(reader_python), twice)

    first, *rest = jobs
    runs = dict([run(first)])
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs.update(pool.map(run, rest))
    return runs


@pytest.mark.parametrize("path", DOWNLOADABLE, ids=lambda p: p.name)
def test_downloaded_chapter_runs_outside_the_repository(downloaded_runs, path):
    saved, nb, installed, _ = downloaded_runs[path]
    assert json.loads(saved.read_text("utf-8"))["cells"]
    assert not isinstance(nb, AssertionError), f"the run itself failed: {nb}"
    assert nbcheck.problems_in_executed(nb, saved) == []
    code = [c for c in nb.cells if c.cell_type == "code"]
    if path in CHAPTERS:
        assert code[0].source == setup_cell.source() and code[0].outputs == []
        assert installed, "the first cell did not install gradstop"


@pytest.mark.parametrize("path", DOWNLOADABLE, ids=lambda p: p.name)
def test_runs_twice_in_one_kernel(downloaded_runs, path):
    """Run All, then Run All again in the same kernel (tests/test_run_twice.py)."""
    assert downloaded_runs[path][3]["problems"] == []


def test_failed_install_stops_with_one_sentence(reader_python, tmp_path):
    uninstall_gradstop(reader_python)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(setup_cell.source())])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    notebook = tmp_path / "setup-only.ipynb"
    nbformat.write(nb, notebook)
    missing = tmp_path / "no-such-clone"
    executed, _ = run_in_reader_env(reader_python, notebook, tmp_path, source=str(missing))
    (error,) = [o for o in executed.cells[0].outputs if o.output_type == "error"]
    assert error.ename == "SetupError"
    assert error.traceback == [f"SetupError: {error.evalue}"]  # one line, no pip output
    assert missing.as_uri() in error.evalue and "GRADSTOP_SOURCE" in error.evalue
    assert error.evalue.count(". ") == 0 and error.evalue.endswith("again.")
    # The download test's own check reports such a chapter as failing.
    (problem,) = nbcheck.problems_in_executed(executed, notebook)
    assert "unexpected SetupError" in problem


def test_binder_installs_the_package_after_the_pins():
    post_build = ROOT / "binder" / "postBuild"
    assert os.access(post_build, os.X_OK), "repo2docker runs postBuild only if executable"
    commands = [line for line in post_build.read_text().splitlines() if "pip install" in line]
    assert commands == ["python -m pip install --no-deps --editable ."]
