"""Retrieval servers on 127.0.0.1 for the http_search tests: in a thread (uvicorn on a real socket) or
``tracerl serve-retriever`` as a real subprocess. Both listen on a free port picked by the OS."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tracerl.envs.retriever_server import bind


@contextmanager
def serve_app(app: Any) -> Iterator[str]:
    """Serve the ASGI ``app`` on a thread; yields its base URL, stops it on exit."""
    import uvicorn

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        # the socket already listens: requests queue in its backlog until the loop serves them
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@contextmanager
def serve_subprocess(corpus: Path, *extra: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``tracerl serve-retriever --corpus CORPUS --port 0`` as a subprocess; yields (URL, process)
    once it printed the line naming its port; kills it on exit."""
    code = "from tracerl.cli import main; main()"
    proc = subprocess.Popen([sys.executable, "-c", code, "serve-retriever", "--corpus", str(corpus), "--port", "0",
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the server listens (or exits)
        assert line.startswith("serving "), line + proc.stdout.read()
        url = line.split(" on ", 1)[1].split()[0]
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
