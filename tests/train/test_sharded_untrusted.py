"""A sharded (DCP) checkpoint from a stranger: nothing in it is unpickled, and a damaged one ends in
one line naming the folder. torch's own reader would ``pickle.load`` the ``.metadata`` and run
whatever a crafted file asks for on ``--resume``."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from tracerl.errors import UserError
from tracerl.runs.safe_dcp import UnsafeCheckpointError
from tracerl.runs.sharded import load_sharded, save_sharded


def _parts(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


@pytest.fixture()
def saved(tmp_path: Path) -> Path:
    model, optimizer = _parts(0)
    with pytest.warns(UserWarning):  # DCP: "assuming the intent is to save in a single process"
        save_sharded(tmp_path / "dcp", model, optimizer)
    return tmp_path / "dcp"


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _load(path: Path) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model, optimizer = _parts(1)
    load_sharded(path, model, optimizer)
    return model, optimizer


def test_a_legitimate_checkpoint_loads_exactly(saved: Path) -> None:
    want, _ = _parts(0)
    model, optimizer = _load(saved)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), want.state_dict().values(), strict=True))
    assert optimizer.param_groups[0]["lr"] == 1e-3 and optimizer.state_dict()["state"]


def test_a_crafted_metadata_runs_no_code(saved: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    (saved / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(UnsafeCheckpointError) as err:
        _load(saved)
    assert not marker.exists()
    assert "names posix.system" in str(err.value) or "names os.system" in str(err.value)
    assert len(str(err.value).splitlines()) == 1 and str(saved) in str(err.value)


@pytest.mark.parametrize("damage", ["truncated_metadata", "missing_shard", "flipped_shard", "truncated_shard"])
def test_a_damaged_checkpoint_is_one_line(saved: Path, damage: str) -> None:
    shard = next(saved.glob("*.distcp"))
    if damage == "truncated_metadata":
        (saved / ".metadata").write_bytes((saved / ".metadata").read_bytes()[:40])
    elif damage == "missing_shard":
        shard.unlink()
    elif damage == "flipped_shard":
        data = bytearray(shard.read_bytes())
        for i in range(0, len(data), 7):
            data[i] ^= 0xFF
        shard.write_bytes(bytes(data))
    else:
        shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(UserError) as err:
        _load(saved)
    line = str(err.value)
    assert len(line.splitlines()) == 1 and str(saved) in line, line
