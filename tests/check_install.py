"""The install line works from an empty virtual environment (``make install-check``).

Not part of ``make test``: it installs torch into a new environment, which takes minutes.
The line from the tool's page is run as a reader runs it, with a ``file://`` URL standing
for the repository: a copy of this checkout, committed and tagged with the version the
line names. The book's pins are the environment's constraints, so torch comes from the
machine's local wheel rather than a download. Then a training step with a bug is
diagnosed with the installed package.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import nbcheck
import setup_cell

ROOT = nbcheck.ROOT

# What a reader runs after installing: a training step with a bug, diagnosed.
READER_STEP = textwrap.dedent(
    """
    import torch
    from torch import nn
    import gradstop as gp

    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with gp.diagnose_step(model, optimizer, show=False) as step:
        hidden = model[0](torch.randn(8, 3)).detach()
        model[1](hidden).sum().backward()
        optimizer.step()
    assert step.reasons["0.weight"] is gp.Reason.DETACHED, step
    print("diagnosed", sorted(r.name for r in step.reasons.values()))
    """
)


def git(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)


def tagged_copy(tmp_path) -> str:
    """A repository holding this checkout's files, committed and tagged: its file:// URL."""
    repo = tmp_path / "repository"
    nbcheck.clone_copy(repo)
    (repo / ".venv").unlink()
    env = {"GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "t@example.org"}
    env |= {"GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "t@example.org"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy"]):
        subprocess.run(["git", *args], cwd=repo, check=True, env={**os.environ, **env})
    git("tag", setup_cell.tag(), cwd=repo)
    return repo.as_uri()


def test_the_line_installs_into_an_empty_virtual_environment(tmp_path):
    url = tagged_copy(tmp_path)
    line = setup_cell.install_line().replace(setup_cell.repository(), url)
    venv = tmp_path / "reader"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    start = time.perf_counter()
    # The pip that Python 3.11's venv bundles (23.2) refuses a git+file URL beside this
    # machine's find-links and constraints; a reader's pip is newer, and so is this one.
    upgrade = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--upgrade", "pip"]
    subprocess.run(upgrade, check=True, capture_output=True)
    env = {**os.environ, "PIP_CONSTRAINT": str(ROOT / "requirements.txt")}
    pip = venv / "bin" / "pip"
    done = subprocess.run(
        f"{pip} install -q {line.removeprefix('pip install ')}",
        shell=True,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"\ninstalled in {time.perf_counter() - start:.0f} s: {line}")
    run = subprocess.run(
        [str(venv / "bin" / "python"), "-c", READER_STEP],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("diagnosed")
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import gradstop; print(gradstop.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(venv) in where and str(ROOT) not in where  # the installed copy, not this one
