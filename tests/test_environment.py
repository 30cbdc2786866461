"""summary.json's git state: a commit that changes only docs or results keeps the code fingerprint, and a
modified file outside the code paths does not mark the run's code as modified."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sparsespec.harness.environment import CODE_PATHS, git_state


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A checkout with one file under a code path (sparsespec/) and one outside (README.md), committed."""
    assert "sparsespec" in CODE_PATHS and "README.md" not in CODE_PATHS
    git(tmp_path, "init", "-q")
    (tmp_path / "sparsespec").mkdir()
    (tmp_path / "sparsespec" / "engine.py").write_text("K = 4\n")
    (tmp_path / "README.md").write_text("intro\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "first")
    return tmp_path


def test_a_clean_checkout_records_its_commit_and_code(repo):
    state = git_state(repo)
    assert len(state["commit"]) == 40 and len(state["code"]) == 40
    assert state["dirty"] is False and state["code_dirty"] is False


def test_a_change_outside_the_code_paths_keeps_the_code_and_leaves_it_clean(repo):
    before = git_state(repo)
    (repo / "README.md").write_text("intro, edited during a run\n")
    during = git_state(repo)
    assert during["dirty"] is True and during["code_dirty"] is False and during["code"] == before["code"]
    git(repo, "commit", "-q", "-am", "docs")
    after = git_state(repo)
    assert after["commit"] != before["commit"] and after["code"] == before["code"]


def test_a_change_inside_the_code_paths_marks_the_code_modified_and_its_commit_a_new_code(repo):
    before = git_state(repo)
    (repo / "sparsespec" / "engine.py").write_text("K = 8\n")
    assert git_state(repo)["code_dirty"] is True
    git(repo, "commit", "-q", "-am", "code")
    after = git_state(repo)
    assert after["code"] != before["code"] and after["code_dirty"] is False


def test_outside_a_repo_nothing_is_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))   # no repo above tmp_path counts
    assert git_state(tmp_path) == {"commit": None, "dirty": None, "code": None, "code_dirty": None}
