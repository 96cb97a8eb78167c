"""``tracerl view`` and the rollout log on run folders from someone else: crafted records, missing keys,
gzip bombs, symbolic links, temporaries of killed views. Each ends in one line or is refused, and
nothing outside the run folder is read, written or deleted."""

from __future__ import annotations

import copy
import gzip
import json
import os
import subprocess
import sys
import tracemalloc
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracerl.atomic import open_temp
from tracerl.cli import app
from tracerl.runs.rollout_log import RolloutLog, RolloutRecordError, read_step, step_file
from tracerl.view.site import ViewError, render_run
from tracerl.view.records import parse_tree

from helpers_temps import dead_writer_temps
from view_fixtures import write_run

INJECT = '"><script>alert(1)</script><img src=x onerror=alert(2)>'


def _record(tmp_path: Path) -> dict:
    """A genuine record (the branching tree of test_view), to be damaged by each test."""
    write_run(tmp_path / "genuine", steps=1)
    (record,) = read_step(tmp_path / "genuine", 1)
    return record


def _write_records(run_dir: Path, records: list[object], step: int = 1) -> Path:
    path = step_file(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))
    return path


def _cli_view(run_dir: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["view", str(run_dir)])
    return result.exit_code, result.stderr


class _Scripts(HTMLParser):
    """Counts ``<script>`` elements and attributes that run code (``on*``, ``javascript:``)."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts, self.handlers = 0, []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.scripts += tag == "script"
        self.handlers += [k for k, v in attrs if k.startswith("on") or "javascript:" in (v or "")]


@pytest.mark.parametrize("where, key", [("nodes", "id"), ("nodes", "visits"), ("nodes", "assistant_tokens"),
                                        ("trajectories", "leaf"), ("nodes", "reward")])
def test_crafted_numbers_are_refused_naming_file_line_and_field(tmp_path: Path, where: str, key: str) -> None:
    record = _record(tmp_path)
    record[where][1][key] = INJECT
    run = tmp_path / "run"
    path = _write_records(run, [_record(tmp_path), record])  # line 2 is the crafted one
    with pytest.raises(RolloutRecordError) as err:
        render_run(run)
    assert str(err.value).startswith(f"{path}:2: {where}[1].{key}: expected ")
    assert not (run / "view" / "step-000001.html").exists()
    code, stderr = _cli_view(run)
    assert code == 1 and len(stderr.splitlines()) == 1 and f"{where}[1].{key}" in stderr


def test_ints_must_be_ints_not_bools_floats_or_strings() -> None:
    good = {"task_id": "t", "nodes": [{"id": 0, "parent": None, "action": "prompt", "is_leaf": True}],
            "trajectories": []}
    assert parse_tree(good).nodes[0].id == 0
    for bad in (True, 1.0, "0", None):
        crafted = copy.deepcopy(good)
        crafted["nodes"][0]["id"] = bad
        with pytest.raises(Exception, match=r"nodes\[0\]\.id: expected an integer"):
            parse_tree(crafted)
    crafted = copy.deepcopy(good)
    crafted["nodes"][0]["reward"] = float("nan")
    with pytest.raises(Exception, match=r"nodes\[0\]\.reward: expected a finite number"):
        parse_tree(crafted)


def test_every_text_field_is_escaped(tmp_path: Path) -> None:
    record = _record(tmp_path)
    record.update(task_id=INJECT, question=INJECT, answers=[INJECT], prompt=INJECT, tree_id=INJECT)
    record["credit_options"]["value"] = INJECT
    for node in record["nodes"]:
        node.update(text=INJECT, observation=INJECT, action=INJECT)
    for traj in record["trajectories"]:
        traj["answer"] = INJECT
    _write_records(tmp_path / "run", [record])
    page = _Scripts()
    page.feed((render_run(tmp_path / "run").parent / "step-000001.html").read_text())
    assert page.scripts == 1 and page.handlers == []  # only the page's own script


def test_links_inside_a_record_must_name_its_nodes(tmp_path: Path) -> None:
    record = _record(tmp_path)
    twin = copy.deepcopy(record)
    twin["nodes"][2]["id"] = 1  # two nodes with id 1: a child of itself would loop forever
    with pytest.raises(Exception, match=r"nodes\[2\]\.id: node id 1 appears twice"):
        parse_tree(twin)
    orphan = copy.deepcopy(record)
    orphan["trajectories"][0]["node_path"][1] = 99
    with pytest.raises(Exception, match=r"trajectories\[0\]\.node_path\[1\]: no node has id 99"):
        parse_tree(orphan)


@pytest.mark.parametrize("drop, expected", [
    ((None, "nodes"), "record: lacks the key 'nodes'"), (("nodes", "id"), "nodes[0]: lacks the key 'id'"),
    (("trajectories", "node_path"), "trajectories[0]: lacks the key 'node_path'")])
def test_missing_keys_end_in_one_line_naming_file_line_and_key(tmp_path: Path, drop: tuple, expected: str) -> None:
    record = _record(tmp_path)
    if drop[0] is None:
        del record[drop[1]]
    else:
        del record[drop[0]][0][drop[1]]
    path = _write_records(tmp_path / "run", [record])
    code, stderr = _cli_view(tmp_path / "run")
    assert code == 1 and stderr == f"view failed: {path}:1: {expected}\n"


def _bomb(path: Path, line: bytes, lines: int) -> None:
    """A gzip file of ``lines`` copies of ``line``, compressed as it is written (small on disk)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip container
    with open(path, "wb") as handle:
        for _ in range(lines):
            handle.write(packer.compress(line))
        handle.write(packer.flush())


@pytest.mark.parametrize("line, lines, cap", [(b" " * 2**20, 80, "MAX_LINE_BYTES"),  # one 80 MiB line
                                              (b" " * (2**20 - 1) + b"\n", 80, "MAX_FILE_BYTES")])
def test_a_gzip_bomb_stops_at_the_cap_in_bounded_memory(tmp_path: Path, line: bytes, lines: int, cap: str) -> None:
    _bomb(step_file(tmp_path, 1), line, lines)
    assert step_file(tmp_path, 1).stat().st_size < 2**20  # 80 MiB in well under 1 MiB on disk
    tracemalloc.start()
    try:
        message = rf"step-000001\.jsonl\.gz:\d+: .* than (16|64) MiB \(rollout_log\.{cap}\)"
        with pytest.raises(RolloutRecordError, match=message):
            render_run(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 48 * 2**20  # caps: 16 MiB a line, 64 MiB a file (measured ~32 MiB; the unbounded read: 160 MiB)


def test_json_nested_too_deeply_is_one_line(tmp_path: Path) -> None:
    path = step_file(tmp_path, 1)
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip.compress(b"[" * 100_000 + b"]" * 100_000 + b"\n"))
    code, stderr = _cli_view(tmp_path)
    assert code == 1 and stderr == f"view failed: {path}:1: JSON nested too deeply to be a rollout record\n"


def _dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(child.stdout)


def test_temporaries_of_a_killed_view_are_removed(tmp_path: Path) -> None:
    write_run(tmp_path, steps=1)
    view = tmp_path / "view"
    view.mkdir()
    dead_writer_temps(view, files=["index.html", "step-000001.html"])
    live, fd = open_temp(view / "index.html")  # this process lives: its temporary may still be written
    os.close(fd)
    mine = f".index.html.tmp-{_dead_pid()}"  # a user's name pattern, never tracerl's to remove
    (view / mine).write_text("my notes")
    render_run(tmp_path)
    assert sorted(p.name for p in view.iterdir()) == sorted([live.name, mine, "index.html", "step-000001.html"])


KILL_AT_RENAME = """
import os, signal, sys
os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)  # killed with a page in its temporary
from tracerl.view.site import render_run
render_run(sys.argv[1])
"""


def test_a_view_killed_mid_write_leaves_a_temporary_the_next_view_removes(tmp_path: Path) -> None:
    write_run(tmp_path, steps=2)
    killed = subprocess.run([sys.executable, "-c", KILL_AT_RENAME, str(tmp_path)], capture_output=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert killed.returncode == -9
    (left,) = [p.name for p in (tmp_path / "view").iterdir()]
    assert left.startswith(".step-000001.html.tracerl-tmp-")  # the page itself was never half written
    render_run(tmp_path)
    assert sorted(p.name for p in (tmp_path / "view").iterdir()) == ["index.html", "step-000001.html",
                                                                    "step-000002.html"]


def test_a_view_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    write_run(tmp_path / "run", steps=1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "index.html").write_text("someone else's page")
    (tmp_path / "run" / "view").symlink_to(elsewhere)
    code, stderr = _cli_view(tmp_path / "run")
    assert code == 1 and len(stderr.splitlines()) == 1 and "view is a symbolic link" in stderr
    assert sorted(p.name for p in elsewhere.iterdir()) == ["index.html"]
    assert (elsewhere / "index.html").read_text() == "someone else's page"
    (tmp_path / "run" / "view").unlink()
    (tmp_path / "run" / "view").symlink_to(tmp_path / "nowhere")  # dangling: would be created elsewhere
    with pytest.raises(RolloutRecordError, match="view is a symbolic link"):
        render_run(tmp_path / "run")
    assert not (tmp_path / "nowhere").exists()
    with pytest.raises(RolloutRecordError, match="view is a symbolic link"):  # named, as the README does
        render_run(tmp_path / "run", out=tmp_path / "run" / "view" / "pages")
    assert not (tmp_path / "nowhere").exists()
    assert render_run(tmp_path / "run", out=tmp_path / "html").is_file()  # an --out elsewhere is used as given


def _linked_rollouts(tmp_path: Path) -> tuple[Path, Path]:
    """A run folder whose ``rollouts/`` links to another run's records (steps 1-2, a stale temporary)."""
    write_run(tmp_path / "other", steps=2)
    target = tmp_path / "other" / "rollouts"
    dead_writer_temps(target, files=["step-000003.jsonl.gz"])
    run = tmp_path / "run"
    run.mkdir()
    (run / "rollouts").symlink_to(target)
    return run, target


def test_resume_never_deletes_through_a_rollouts_link(tmp_path: Path) -> None:
    run, target = _linked_rollouts(tmp_path)
    with pytest.raises(RolloutRecordError, match="rollouts is a symbolic link"):
        RolloutLog(run, {})  # the trainer's constructor: would clear temporaries, then truncate
    assert sorted(p.name for p in target.iterdir() if ".tracerl-tmp-" not in p.name) == [
        "step-000001.jsonl.gz", "step-000002.jsonl.gz"] and len(list(target.iterdir())) == 3
    log = RolloutLog(tmp_path / "other", {})  # its own folder: its stale temporary goes
    target.rename(tmp_path / "moved")  # the folder swapped for a link while the run holds the log
    target.symlink_to(tmp_path / "moved")
    with pytest.raises(RolloutRecordError, match="rollouts is a symbolic link"):
        log.truncate_after(0)
    assert sorted(p.name for p in (tmp_path / "moved").iterdir()) == ["step-000001.jsonl.gz", "step-000002.jsonl.gz"]


def test_view_reads_nothing_through_links(tmp_path: Path) -> None:
    run, _ = _linked_rollouts(tmp_path)
    with pytest.raises(RolloutRecordError, match="rollouts is a symbolic link"):
        render_run(run)
    write_run(tmp_path / "plain", steps=1)
    (tmp_path / "plain" / "metrics.jsonl").unlink()
    (tmp_path / "plain" / "metrics.jsonl").symlink_to(tmp_path / "other" / "metrics.jsonl")
    code, stderr = _cli_view(tmp_path / "plain")
    assert code == 1 and "metrics.jsonl is a symbolic link" in stderr and len(stderr.splitlines()) == 1
    (tmp_path / "plain" / "metrics.jsonl").unlink()
    step = step_file(tmp_path / "plain", 1)
    step.unlink()
    step.symlink_to(step_file(tmp_path / "other", 1))
    with pytest.raises(RolloutRecordError, match=r"step-000001\.jsonl\.gz is a symbolic link"):
        render_run(tmp_path / "plain")


def test_a_metrics_step_that_is_not_an_integer_is_one_line(tmp_path: Path) -> None:
    write_run(tmp_path, steps=1)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": "<b>1</b>", "loss": 1.0}) + "\n")
    with pytest.raises(ViewError, match=r"metrics\.jsonl:1: field 'step' must be a non-negative integer, got str"):
        render_run(tmp_path)


def test_a_truncated_gzip_is_one_line(tmp_path: Path) -> None:
    write_run(tmp_path, steps=1)
    path = step_file(tmp_path, 1)
    path.write_bytes(path.read_bytes()[:-12])  # the gzip trailer and some data cut off
    code, stderr = _cli_view(tmp_path)
    assert code == 1 and stderr.startswith(f"view failed: {path}:") and "damaged gzip" in stderr
    assert len(stderr.splitlines()) == 1
