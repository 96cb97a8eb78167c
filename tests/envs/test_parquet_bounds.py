"""Parquet rows within the JSONL line bound, checked from the metadata before reading (issue 50
item 6). Needs the optional ``datasets`` extra (pyarrow): ``make test-extras``."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tracerl.envs.bounded import MiB
from tracerl.envs.convert import raw_rows
from tracerl.envs.data import load_corpus, load_tasks
from tracerl.errors import UserError

pytestmark = pytest.mark.extras
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _write(rows: list[dict], path: Path, **options: object) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path, **options)
    return path


def test_one_huge_string_in_a_tiny_compressed_file_is_refused_from_the_metadata(tmp_path: Path) -> None:
    """The reported bomb at a 1/100 scale: one 8 MiB string compresses to a few KB."""
    bomb = _write([{"id": "q1", "question": "x" * (8 * MiB), "answers": ["a"]}], tmp_path / "bomb.parquet",
                  compression="zstd")
    assert bomb.stat().st_size < 64 * 1024
    with pytest.raises(UserError) as err:
        load_tasks(bomb)
    assert str(err.value) == (f"{bomb}: row group 0 (column 'question'): its rows average 8 MiB, past the 4 MiB bound "
                              "on a record (raise data.max_line_bytes if it is meant to be that long)")
    assert "\n" not in str(err.value)


def test_one_long_row_among_short_ones_is_refused_naming_its_index(tmp_path: Path) -> None:
    rows = [{"id": f"d{i}", "title": "T", "text": "short"} for i in range(10)]
    rows[7]["text"] = "y" * 3000  # 'd7' + 'T' + 3,000 = 3,003 bytes; the row average (~310) passes the bound of 1,000
    path = _write(rows, tmp_path / "corpus.parquet")
    with pytest.raises(UserError, match=r"corpus.parquet\[7\]: record of 3,003 bytes, past the 1,000 bytes bound"):
        load_corpus(path, max_line_bytes=1000)


def test_a_value_repeated_in_every_row_is_held_once_and_each_row_still_counted(tmp_path: Path) -> None:
    """Dictionary-encoded: 200 rows of the same 64 KiB text are 64 KiB on disk, 12.5 MiB decoded; each row
    (64 KiB + 'dN' + 'T') is within the 4 MiB bound, so the file loads; with a 32 KiB bound it is refused,
    naming the largest row (the first with a 4-character id: 65,536 + 4 + 1 bytes)."""
    text = "z" * (64 * 1024)
    path = _write([{"id": f"d{i}", "title": "T", "text": text} for i in range(200)], tmp_path / "repeat.parquet")
    docs = load_corpus(path)
    assert len(docs) == 200 and docs[199].text == text
    with pytest.raises(UserError, match=r"repeat.parquet\[100\]: record of 65,541 bytes, past the 32,768 bytes bound"):
        load_corpus(path, max_line_bytes=32 * 1024)


def test_nested_answers_count_toward_the_row(tmp_path: Path) -> None:
    rows = [{"id": "q1", "question": "Q?", "answers": ["a"]}, {"id": "q2", "question": "Q?", "answers": ["b" * 600] * 3}]
    path = _write(rows, tmp_path / "tasks.parquet")
    with pytest.raises(UserError, match=r"tasks.parquet\[1\]: record of"):
        load_tasks(path, max_line_bytes=1500)  # 1,800 answer bytes + 'q2' + 'Q?' in row 1
    assert [t.id for t in load_tasks(path, max_line_bytes=2000)] == ["q1", "q2"]


def test_a_footer_claiming_gigabytes_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = _write([{"id": "q1", "question": "Q?", "answers": ["a"]}], tmp_path / "tasks.parquet")
    data = bytearray(path.read_bytes())
    data[-8:-4] = struct.pack("<I", 2**31)
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"its parquet footer claims 2048 MiB of metadata, past 64 MiB"):
        load_tasks(path)


def test_convert_reads_raw_parquet_within_its_own_bound(tmp_path: Path) -> None:
    bomb = _write([{"question": "x" * (20 * MiB), "golden_answers": ["a"]}], tmp_path / "train.parquet",
                  compression="zstd")
    with pytest.raises(UserError, match=r"train.parquet: row group 0 \(column 'question'\): its rows average 20 MiB, "
                                        r"past the 16 MiB bound on a record$"):
        list(raw_rows(bomb))
    small = _write([{"question": "Who?", "golden_answers": ["a"]}], tmp_path / "ok.parquet")
    assert list(raw_rows(small)) == [(f"{small}[0]", {"question": "Who?", "golden_answers": ["a"]})]
