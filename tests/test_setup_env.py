"""scripts/setup-env: without Graphviz, and without the right to install it, it stops clearly."""

import os
import shutil
import subprocess

import nbcheck


def run_without_dot(tmp_path, uid: str, profile: str = "book", tools=("bash", "dirname", "cat")):
    # A PATH with just what the script needs before its system checks: no `dot`
    # (unless asked for), no `apt-get`, no `chromium`, and an `id` that reports the
    # given user id.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in tools:
        os.symlink(shutil.which(tool), bindir / tool)
    (bindir / "id").write_text(f"#!{shutil.which('bash')}\necho {uid}\n")
    (bindir / "id").chmod(0o755)
    repo = tmp_path / "repo"
    shutil.copytree(nbcheck.ROOT / "scripts", repo / "scripts")
    result = subprocess.run(
        [str(bindir / "bash"), "scripts/setup-env", profile],
        cwd=repo,
        env={"PATH": str(bindir)},
        capture_output=True,
        text=True,
    )
    return result, repo


def test_missing_graphviz_as_user_stops_with_one_clear_line(tmp_path):
    result, repo = run_without_dot(tmp_path, uid="1000")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "sudo apt-get install graphviz" in lines[0] and "brew install graphviz" in lines[0]
    assert not (repo / ".venv").exists(), "a half-made venv was left behind"


def test_missing_graphviz_as_root_without_apt_stops_the_same_way(tmp_path):
    result, repo = run_without_dot(tmp_path, uid="0")
    assert result.returncode != 0
    assert "apt-get install graphviz" in result.stderr
    assert not (repo / ".venv").exists()


def test_missing_chromium_for_the_tests_stops_with_one_clear_line(tmp_path):
    result, repo = run_without_dot(
        tmp_path, uid="1000", profile="dev", tools=("bash", "dirname", "cat", "dot")
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "sudo apt-get install chromium" in lines[0] and "CHROMIUM=" in lines[0]
    assert not (repo / ".venv").exists()


def test_cache_is_dropped_when_the_helper_changes(tmp_path):
    # Jupyter Book's cache keys on a chapter's code only; the script covers the rest.
    repo = tmp_path / "repo"
    shutil.copytree(nbcheck.ROOT / "scripts", repo / "scripts")
    (repo / "src" / "gradstop").mkdir(parents=True)
    (repo / "src" / "gradstop" / "helper.py").write_text("A = 1\n")
    (repo / "requirements.txt").write_text("torch==2.13.0\n")
    (repo / "pyproject.toml").write_text("[project]\n")
    script = [str(repo / "scripts" / "invalidate-stale-cache")]

    def build_leftovers():
        for name in (".jupyter_cache", ".doctrees"):
            (repo / "_build" / name).mkdir(parents=True, exist_ok=True)

    subprocess.run(script, check=True)
    build_leftovers()
    subprocess.run(script, check=True)  # nothing changed
    assert (repo / "_build" / ".jupyter_cache").exists()
    (repo / "src" / "gradstop" / "helper.py").write_text("A = 2\n")
    out = subprocess.run(script, check=True, capture_output=True, text=True).stdout
    assert "every chapter will re-run" in out
    assert not (repo / "_build" / ".jupyter_cache").exists()
    assert not (repo / "_build" / ".doctrees").exists()
