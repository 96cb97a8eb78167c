"""Every results JSON records the commit it was made from and whether the tree was dirty (issue 48):
:func:`tracerl.testbed.provenance.git_state` on a hand-made repository, and ``common.write_json``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tracerl.testbed.provenance import git_state

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import common  # noqa: E402


def _git(repo: Path, *argv: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org",
                    "-c", "commit.gpgsign=false", *argv], check=True, capture_output=True)


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "code.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text("scratch/\n")
    _git(repo, "add", "code.py", ".gitignore")
    _git(repo, "commit", "-q", "-m", "one")
    return repo


def _head(repo: Path) -> str:
    """The commit ``main`` points at, read from the ref file itself (not through git)."""
    return (repo / ".git" / "refs" / "heads" / "main").read_text().strip()


def test_clean_checkout_records_its_commit(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    assert git_state(repo) == {"commit": _head(repo), "dirty": False, "changed": 0, "note": None}
    assert len(_head(repo)) == 40


def test_results_and_ignored_files_do_not_make_it_dirty_code_does(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "benchmarks" / "results").mkdir(parents=True)
    (repo / "benchmarks" / "results" / "shard.json").write_text("{}\n")  # a sweep's own output
    (repo / "scratch").mkdir()
    (repo / "scratch" / "log.txt").write_text("ignored\n")
    assert git_state(repo)["dirty"] is False
    (repo / "code.py").write_text("x = 2\n")  # a modified tracked file
    assert git_state(repo) == {"commit": _head(repo), "dirty": True, "changed": 1, "note": None}
    (repo / "new.py").write_text("y = 1\n")  # an untracked, not ignored file
    assert git_state(repo)["changed"] == 2


def test_new_commit_is_recorded(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    first = _head(repo)
    (repo / "code.py").write_text("x = 3\n")
    _git(repo, "commit", "-q", "-am", "two")
    state = git_state(repo)
    assert state["commit"] == _head(repo) != first and state["dirty"] is False


def test_not_a_checkout_and_no_git_record_null_with_a_note(tmp_path: Path, monkeypatch) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    state = git_state(plain)
    assert (state["commit"], state["dirty"], state["changed"]) == (None, None, None)
    assert "not a git checkout" in state["note"]
    repo = _repo(tmp_path)
    (repo / "sub").mkdir()
    inside = git_state(repo / "sub")  # a package folder inside someone else's checkout: not its commit
    assert inside["commit"] is None and "not a git checkout's top" in inside["note"]
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    assert git_state(repo) == {"commit": None, "dirty": None, "changed": None, "note": "git not found"}


def test_write_json_adds_git_unless_given(tmp_path: Path) -> None:
    out = common.write_json(tmp_path / "r.json", {"x": 0.123456789})
    data = json.loads(out.read_text())
    assert data["x"] == 0.1235 and set(data["git"]) == {"commit", "dirty", "changed", "note"}
    given = {"commit": "abc", "dirty": False, "changed": 0, "note": None}
    kept = json.loads(common.write_json(tmp_path / "s.json", {"git": given}).read_text())
    assert kept == {"git": given}
