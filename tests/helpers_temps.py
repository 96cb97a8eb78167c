"""Temporaries as a killed tracerl writer leaves them: made by tracerl's own code in a child
process that then exits, so their pid is dead and their name and marker are tracerl's."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import json, os, sys
from pathlib import Path
from tracerl.atomic import make_temp_dir, open_temp
folder, files, dirs = Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
names = []
for target in files:
    tmp, fd = open_temp(folder / target)
    os.write(fd, b"half written")
    os.close(fd)
    names.append(tmp.name)
for target in dirs:
    tmp = make_temp_dir(folder / target)
    (tmp / "config.json").write_text("{")
    names.append(tmp.name)
print(json.dumps(names))
"""


def dead_writer_temps(folder: Path, files: Sequence[str] = (), dirs: Sequence[str] = ()) -> list[str]:
    """Temporaries of ``files`` and ``dirs`` (target names in ``folder``) left by a writer that
    exited; their names, in the order given (files first)."""
    done = subprocess.run([sys.executable, "-c", _CHILD, str(folder), json.dumps(list(files)), json.dumps(list(dirs))],
                          capture_output=True, text=True, check=True, cwd=ROOT)
    return list(json.loads(done.stdout))


def own_temps(folder: Path) -> list[str]:
    """The names in ``folder`` that carry tracerl's temporary naming."""
    return sorted(p.name for p in folder.iterdir() if ".tracerl-tmp-" in p.name)
