"""The processes fedflock starts are its own to end, and only those.

Every process started through `OwnedProcesses` gets a random token in its environment, which its
descendants inherit, even those that detach into a session of their own (the SuperLink that
`flwr run` starts for a local federation, Ray's daemons, the ClientApp processes of a
SuperNode). Ending the group ends exactly the processes of this user that carry the token: no
command-line matching, so no process of another run or another user is ever touched. It ends
them on leaving the `with` block, on SIGTERM/SIGHUP (turned into an exception so that the block
unwinds) and at interpreter exit, whichever comes first.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

TOKEN = "FEDFLOCK_PROCESS_GROUP"
_PROC = Path("/proc")


def _carrying(token: str | None) -> list[int]:
    """PIDs of this user's processes whose environment holds `TOKEN=token` (any token when
    None), this process excluded."""
    needle = f"{TOKEN}={token}".encode() if token else f"{TOKEN}=".encode()
    uid, me, found = os.getuid(), os.getpid(), []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if any(var == needle or (token is None and var.startswith(needle)) for var in env):
            found.append(int(entry.name))
    return found


def processes_carrying(token: str | None = None) -> list[int]:
    """Living processes started by an `OwnedProcesses` (with this token, or any)."""
    return [pid for pid in _carrying(token) if alive(pid)]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has ended; its parent has not read its status yet)."""
    try:
        state = (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class OwnedProcesses:
    """`with OwnedProcesses(env) as owned: owned.start([...])`: everything started (and
    everything that descends from it) is ended when the block is left."""

    def __init__(self, env: Mapping[str, str] | None = None, grace: float = 10.0) -> None:
        self.token = secrets.token_hex(16)
        self.env = {**(os.environ if env is None else env), TOKEN: self.token}
        self.grace = grace
        self.started: list[subprocess.Popen] = []
        self._previous: dict[int, Any] = {}
        self._stopped = False

    # -- starting -----------------------------------------------------------------------------
    def start(self, args: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """A process of ours, in a session of its own (so one signal reaches its children)."""
        proc = subprocess.Popen(list(args), env=self.env, start_new_session=True, **kwargs)
        self.started.append(proc)
        return proc

    def run(self, args: Sequence[str], timeout: float | None = None, **kwargs: Any
            ) -> subprocess.CompletedProcess:
        """Run a process of ours to its end (ended with its descendants on a timeout)."""
        proc = self.start(args, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.end([proc])
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    # -- ending -------------------------------------------------------------------------------
    def pids(self) -> list[int]:
        return processes_carrying(self.token)

    def end(self, procs: Sequence[subprocess.Popen] | None = None) -> None:
        """End `procs` (default: every process of ours, detached descendants included):
        SIGTERM, then SIGKILL after the grace period."""
        targets = {p.pid for p in (procs if procs is not None else self.started)}
        if procs is None:
            targets.update(self.pids())
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline:
            self._reap()
            left = [pid for pid in targets if alive(pid)]
            if procs is None:
                left += [pid for pid in self.pids() if pid not in left]
            if not left:
                return
            time.sleep(0.1)
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        for proc in self.started:
            with contextlib.suppress(OSError):
                proc.poll()

    def stop(self) -> None:
        """End everything of ours (once; also from atexit and the signal handlers)."""
        if self._stopped:
            return
        self._stopped = True
        self.end()
        for proc in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                proc.wait(timeout=1)

    # -- the block ----------------------------------------------------------------------------
    def __enter__(self) -> OwnedProcesses:
        atexit.register(self.stop)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stopped:  # already ending them: a second signal (e.g. `timeout` passing on
            return         # its own SIGTERM) must not cut that short and leave processes behind
        raise SystemExit(128 + signum)  # unwinds the block: __exit__ ends our processes

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.stop()
        finally:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            atexit.unregister(self.stop)
