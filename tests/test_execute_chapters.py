"""scripts/execute_chapters.py: the chapters run in parallel, into the build's own cache.

That the build then executes nothing (the key is MyST-NB's) is checked in
test_reproducible.py, on the small books built there.
"""

import datetime
import fcntl
import shutil
import subprocess
import sys
import time

import nbformat
import yaml
from jupyter_cache import get_cache

import minibook
import nbcheck

sys.path.insert(0, str(nbcheck.ROOT / "scripts"))
import execute_chapters  # noqa: E402

ROOT = nbcheck.ROOT


def execute(book, *args):
    return minibook.run(
        book, str(ROOT / ".venv" / "bin" / "python"), "scripts/execute_chapters.py", *args
    )


def test_settings_are_the_builds():
    settings = execute_chapters.book_settings(ROOT)
    config = yaml.safe_load((ROOT / "_config.yml").read_text("utf-8"))["execute"]
    assert settings.timeout == config["timeout"] == nbcheck.cell_timeout()
    assert settings.mode == "cache" and settings.in_temp is False
    assert settings.allow_errors is False
    assert settings.cache == ROOT / "_build" / ".jupyter_cache"


def test_a_failing_chapter_stops_the_build_naming_chapter_and_cell(tmp_path):
    book = minibook.make(
        tmp_path,
        {
            "fine": [
                minibook.cell("x = 1"),
                minibook.cell("1 / 0", raises=("ZeroDivisionError", "division by zero")),
            ],
            "broken": [minibook.cell("y = 2"), minibook.cell("raise KeyError('no such key')")],
            "slow": [minibook.cell("import time"), minibook.cell("time.sleep(60)")],
        },
        config_edit=lambda text: text.replace("timeout: 180", "timeout: 3"),
    )
    result = minibook.make_book(book)
    log = result.stdout
    assert result.returncode != 0
    # notebook, cell number (markdown title is cell 0), first line, error
    assert """broken.ipynb failed at cell 2 ("raise KeyError('no such key')"): KeyError""" in log
    assert "slow.ipynb failed at cell 2 ('time.sleep(60)'): CellTimeoutError" in log
    assert "jupyter-book build" not in log, "the book was built after a chapter failed"
    # a cell declared to fail may fail (allow_errors per cell, as in the build), and
    # the chapters that ran are cached for next time
    cache = get_cache(book / "_build" / ".jupyter_cache")
    cached = {r.uri.rsplit("/", 1)[-1] for r in cache.list_cache_records()}
    assert cached == {"fine.ipynb"}


def test_cache_writes_wait_for_the_lock(tmp_path):
    # The notebook says when it runs, then waits for the test to hold the lock.
    waits = "import os, time\nopen('started', 'w').close()\nwhile not os.path.exists('go'):\n"
    cells = [minibook.cell(waits + "    time.sleep(0.1)"), minibook.cell("open('ran', 'w')")]
    book = minibook.make(tmp_path, {"marks": cells})
    folder = book / "notebooks"  # where the notebook runs, as in the build
    runner = subprocess.Popen(
        [ROOT / ".venv" / "bin" / "python", "scripts/execute_chapters.py"],
        cwd=book,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    cache_dir = book / "_build" / ".jupyter_cache"

    def wait_for(path):
        deadline = time.monotonic() + 120
        while not path.exists() and runner.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert path.exists(), runner.communicate()[0] if runner.poll() is not None else path

    wait_for(folder / "started")
    with open(cache_dir / execute_chapters.LOCK_NAME, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (folder / "go").touch()
        wait_for(folder / "ran")
        time.sleep(3)  # ample for an unguarded write to land
        assert runner.poll() is None, "the executor finished while the cache was locked"
        assert get_cache(cache_dir).list_cache_records() == []
        released = time.time()
        fcntl.flock(lock, fcntl.LOCK_UN)
    out, _ = runner.communicate(timeout=120)
    assert runner.returncode == 0, out
    (record,) = get_cache(cache_dir).list_cache_records()
    # jupyter-cache records UTC without saying so
    assert record.created.replace(tzinfo=datetime.timezone.utc).timestamp() >= released - 1


def test_only_what_changed_is_executed_again(tmp_path):
    book = minibook.make(
        tmp_path, {"one": [minibook.cell("print(1)")], "two": [minibook.cell("print(2)")]}
    )
    first = execute(book)
    assert first.returncode == 0 and "2 executed, 0 from the cache" in first.stdout
    path = book / "notebooks" / "two.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source = "print(22)"
    nbformat.write(nb, path)
    second = execute(book)
    assert second.returncode == 0 and "1 executed, 1 from the cache" in second.stdout
    assert "executing two.ipynb" in second.stdout and "executing one.ipynb" not in second.stdout


def test_cache_is_dropped_when_the_helper_package_changes(tmp_path):
    # The helper module may live beside the chapters or in a package under src/.
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "scripts", repo / "scripts")
    package = repo / "src" / "gradstop"
    package.mkdir(parents=True)
    (package / "pictures.py").write_text("A = 1\n")
    (repo / "requirements.txt").write_text("torch==2.13.0\n")
    script = [str(repo / "scripts" / "invalidate-stale-cache")]
    subprocess.run(script, check=True)
    for change in (
        lambda: (package / "pictures.py").write_text("A = 2\n"),
        lambda: (package / "pictures.py").rename(package / "drawing.py"),
    ):
        (repo / "_build" / ".jupyter_cache").mkdir(parents=True, exist_ok=True)
        subprocess.run(script, check=True)  # nothing changed yet
        assert (repo / "_build" / ".jupyter_cache").exists()
        change()
        out = subprocess.run(script, check=True, capture_output=True, text=True).stdout
        assert "every chapter will re-run" in out
        assert not (repo / "_build" / ".jupyter_cache").exists()


def test_a_notebook_with_its_own_execution_settings_is_left_to_the_build(tmp_path):
    # MyST-NB honours a notebook's own "mystnb" execution settings; running it here
    # with the book's settings would not. The build runs it (here: never, "off").
    book = minibook.make(tmp_path, {"kept": [minibook.cell("1 / 0")], "fine": []})
    kept = book / "notebooks" / "kept.ipynb"
    nb = nbformat.read(kept, as_version=4)
    nb.metadata["mystnb"] = {"execution_mode": "off"}
    nbformat.write(nb, kept)
    assert execute_chapters.own_execution_settings(kept) == ["execution_mode"]
    result = execute(book)
    assert result.returncode == 0, result.stdout
    assert "kept.ipynb sets execution_mode: left to the build" in result.stdout
    cache = get_cache(book / "_build" / ".jupyter_cache")
    assert {r.uri.rsplit("/", 1)[-1] for r in cache.list_cache_records()} == {"fine.ipynb"}
