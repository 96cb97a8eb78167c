"""A model's chat template rendered under a time, memory and size limit, in a killable child process.

A chat template is a Jinja program shipped with a model (``chat_template.jinja``, or inside
``tokenizer_config.json``), so a model folder from someone else brings code that runs on every
prompt and observation. Transformers renders it in Jinja's sandbox, which stops attribute
tricks but not work: two nested ``range(100000)`` loops run for hours, and a string that doubles
itself forty times asks for a terabyte. Neither can be stopped from inside the process (a
thread cannot be killed; a C-level string operation is not interruptible), and an in-process
check of every Jinja operation would miss the next filter that amplifies (``replace``, ``join``).

So every render runs in one long-lived child process (forked once, so the tokenizer needs no
pickling and a render costs a pipe round trip, ~0.1 ms): the child's address space is capped
(``RLIMIT_AS``: its size at the fork plus :data:`MEMORY_MIB`), its answer must arrive within
:data:`TIMEOUT_S` and hold at most :data:`MAX_CHARS` characters. A template past a limit is
killed with its child and named in one :class:`TemplateError` line; the next render forks a
fresh child. What the template renders is exactly ``tokenizer.apply_chat_template``'s text.
"""

from __future__ import annotations

import multiprocessing
import resource
import threading
from typing import Any

from tracerl.errors import UserError

TIMEOUT_S = 10.0
"""Longest a render may take (a real template renders in milliseconds, the first call compiles it)."""
MEMORY_MIB = 1024
"""Address space the child may grow by while rendering."""
MAX_CHARS = 8 << 20
"""Longest rendered text (a prompt with many tools is tens of KB)."""


class TemplateError(UserError):
    """A chat template raised (its own error, e.g. a role it rejects)."""


class TemplateLimitError(TemplateError):
    """A chat template ran past its time or memory limit, or rendered too much text: it was killed,
    and every later render of the same sandbox fails at once with the same message."""


def _child(conn: Any, tokenizer: Any, memory_mib: int, max_chars: int) -> None:
    """The render loop: one ``(messages, kwargs)`` request in, ``("ok", text)`` or ``("error", why)`` out."""
    try:
        with open("/proc/self/status") as status:
            size_kib = next(int(line.split()[1]) for line in status if line.startswith("VmSize"))
        limit = (size_kib << 10) + (memory_mib << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (OSError, ValueError, StopIteration):  # no /proc (not Linux): the time limit still holds
        pass
    while True:
        try:
            messages, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        try:
            text = str(tokenizer.apply_chat_template(messages, tokenize=False, **kwargs))
            reply = ("ok", text) if len(text) <= max_chars else \
                ("error", f"it rendered {len(text)} characters, more than {max_chars}")
        except MemoryError:
            reply = ("error", f"it needed more than {memory_mib} MiB of memory")
        except Exception as exc:  # noqa: BLE001 - any template failure goes back to the caller as text
            reply = ("raise", f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        conn.send(reply)


class TemplateSandbox:
    """``render(messages, **kwargs)``: ``tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)``
    run in a child process under :data:`TIMEOUT_S`, :data:`MEMORY_MIB` and :data:`MAX_CHARS`.

    A template's own error (a ``raise_exception`` call, a role it rejects) is raised as
    :class:`TemplateError` with the template's message, as ``apply_chat_template`` would raise
    it; callers that probe a template catch it. Thread-safe (one request at a time); picklable
    (the child is not: a copy in another process forks its own).
    """

    def __init__(self, tokenizer: Any, *, timeout_s: float = TIMEOUT_S, memory_mib: int = MEMORY_MIB,
                 max_chars: int = MAX_CHARS) -> None:
        self.tokenizer = tokenizer
        self.timeout_s, self.memory_mib, self.max_chars = timeout_s, memory_mib, max_chars
        self._process: Any = None
        self._conn: Any = None
        self._lock = threading.Lock()
        self.failure = ""
        """Why the template was stopped ('' while it behaves): later renders fail at once."""

    def render(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        with self._lock:
            if self.failure:
                raise TemplateLimitError(self.failure)
            if self._process is None or not self._process.is_alive():
                self._start()
            try:
                self._conn.send((messages, kwargs))
                ready = self._conn.poll(self.timeout_s)
                status, text = self._conn.recv() if ready else ("error", f"it ran past {self.timeout_s:g} s")
            except (EOFError, OSError, BrokenPipeError):
                status, text = "error", "its process died while rendering (out of memory?)"
            if status == "error":
                self._stop()
                self.failure = (f"the model's chat template was stopped: {text}; a template is code shipped with "
                                "the model: use a model you trust, or replace its chat_template.jinja")
                raise TemplateLimitError(self.failure)
            if status == "raise":
                raise TemplateError(f"the model's chat template raised {text}")
            return text

    def _start(self) -> None:
        context = multiprocessing.get_context("fork")  # the tokenizer is inherited, not pickled
        parent, child = context.Pipe()
        self._process = context.Process(target=_child, args=(child, self.tokenizer, self.memory_mib, self.max_chars),
                                        daemon=True, name="tracerl-chat-template")
        self._process.start()
        child.close()
        self._conn = parent

    def _stop(self) -> None:
        process, conn, self._process, self._conn = self._process, self._conn, None, None
        if process is not None and process.is_alive():
            process.kill()
        if process is not None:
            process.join(timeout=5)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Stop the child (idempotent); a later render starts a new one."""
        with self._lock:
            self._stop()

    def __getstate__(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer, "timeout_s": self.timeout_s, "memory_mib": self.memory_mib,
                "max_chars": self.max_chars}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state.pop("tokenizer"), **state)  # type: ignore[misc]

    def __del__(self) -> None:
        try:
            self._stop()
        except Exception:  # noqa: BLE001 - interpreter shutdown: a daemon child ends with the process
            pass


_ATTRIBUTE = "_tracerl_template_sandbox"


def sandbox_for(tokenizer: Any) -> TemplateSandbox:
    """The tokenizer's sandbox, made on first use and kept on the tokenizer (one child process per
    tokenizer, freed with it), so probing a template and building a format share one child."""
    sandbox = tokenizer.__dict__.get(_ATTRIBUTE)
    if not isinstance(sandbox, TemplateSandbox):
        sandbox = TemplateSandbox(tokenizer)
        tokenizer.__dict__[_ATTRIBUTE] = sandbox
    return sandbox
