"""scripts/setup-env: without Graphviz, and without the right to install it, it stops clearly."""

import os
import shutil
import subprocess

import nbcheck


def run_without_dot(tmp_path, uid: str):
    # A PATH with just what the script needs before its Graphviz check: no `dot`,
    # no `apt-get`, and an `id` that reports the given user id.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("bash", "dirname", "cat"):
        os.symlink(shutil.which(tool), bindir / tool)
    (bindir / "id").write_text(f"#!{shutil.which('bash')}\necho {uid}\n")
    (bindir / "id").chmod(0o755)
    repo = tmp_path / "repo"
    shutil.copytree(nbcheck.ROOT / "scripts", repo / "scripts")
    result = subprocess.run(
        [str(bindir / "bash"), "scripts/setup-env", "book"],
        cwd=repo, env={"PATH": str(bindir)}, capture_output=True, text=True,
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
