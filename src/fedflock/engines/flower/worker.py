"""A node's long-lived worker: the ClientApp's work without a torch import per message.

Flower starts a ClientApp process for every message; importing torch and loading the node's
data and model in each would cost seconds. With `worker=true` in the node config, the first
message starts this worker (one per node and run) and every message hands its work over: the
ClientApp process sends the message and its context, the worker answers with `handler.answer`
and returns the reply's content and the context's new state. Frames are Flower's own protobuf
serialisation (no pickle); the socket lives in a folder only this user can enter
(`$TMPDIR/fedflock-workers-<uid>`, mode 700) and every connection must prove the worker's
secret (HMAC challenge of `multiprocessing.connection`).

The worker ends when the process that started its first client (the SuperNode's SuperExec) is
gone, or after `IDLE_SECONDS` without a message; it carries the environment of the node, so a
`LocalDeployment` ends it with the rest. If it cannot be reached, the ClientApp does the work
itself (and says so in a warning).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path

from flwr.app import Context, Message, RecordDict
from flwr.common.serde import (
    context_from_proto,
    context_to_proto,
    message_from_proto,
    message_to_proto,
    recorddict_from_proto,
    recorddict_to_proto,
)
from flwr.proto.message_pb2 import Context as ProtoContext
from flwr.proto.message_pb2 import Message as ProtoMessage
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

IDLE_SECONDS = 900.0
START_SECONDS = 120.0  # for a worker to import torch and listen
MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 107 bytes on Linux
log = logging.getLogger("fedflock.worker")


def workers_folder() -> Path:
    folder = Path(tempfile.gettempdir()) / f"fedflock-workers-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{folder} is not private to this user")
    return folder


def _name(context: Context) -> str:
    """One worker per node and run (and node/run config: a changed config is a new worker)."""
    raw = json.dumps([context.run_id, context.node_id, sorted(context.node_config.items()),
                      sorted(context.run_config.items())], default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


def _connect(sock: Path, secret: Path) -> Connection | None:
    if not (sock.exists() and secret.exists()):
        return None
    try:
        return Client(str(sock), family="AF_UNIX", authkey=secret.read_bytes())
    except (OSError, EOFError, AuthenticationError):
        return None


def _start(sock: Path, secret: Path) -> Connection:
    """Start the worker (once, under a lock) and connect to it."""
    with open(sock.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = _connect(sock, secret)
        if conn is not None:  # another message started it meanwhile
            return conn
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(32))
        sock.unlink(missing_ok=True)
        with open(sock.with_suffix(".log"), "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "fedflock.engines.flower.worker",
                                     str(sock), str(secret), str(os.getppid())], stdout=out,
                                    stderr=out, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            conn = _connect(sock, secret)
            if conn is not None:
                return conn
            if proc.poll() is not None:  # died starting: say so now, not after the deadline
                raise RuntimeError(f"the node's worker exited with status {proc.returncode} "
                                   f"(see {sock.with_suffix('.log')})")
            time.sleep(0.05)
    raise TimeoutError(f"the node's worker did not listen on {sock} within {START_SECONDS} s")


def ask(message: Message, context: Context) -> RecordDict | None:
    """The reply's content from the node's worker (started if needed), `context.state`
    updated; None when the worker cannot be reached or fails (the caller then does the work,
    which also reports the failure as the in-process handler would)."""
    try:
        folder = workers_folder()
        name = _name(context)
        sock, secret = folder / f"{name}.sock", folder / f"{name}.key"
        if len(str(sock)) > MAX_SOCKET_PATH:
            raise OSError(f"socket path {sock} is too long for AF_UNIX (set TMPDIR shorter)")
        conn = _connect(sock, secret) or _start(sock, secret)
        with conn:
            conn.send_bytes(message_to_proto(message).SerializeToString())
            conn.send_bytes(context_to_proto(context).SerializeToString())
            status = conn.recv_bytes().decode()
            if status != "ok":
                raise RuntimeError(status)
            content = recorddict_from_proto(ProtoRecordDict.FromString(conn.recv_bytes()))
            context.state = recorddict_from_proto(ProtoRecordDict.FromString(conn.recv_bytes()))
        return content
    except (OSError, EOFError, RuntimeError, TimeoutError) as err:
        log.warning("node worker: %s; answering in this process", err)
        return None


def _leave(sock: Path, inode: int, secret: bytes) -> None:
    """Remove the worker's socket and secret if they are still its own (a successor may have
    replaced them), its log when empty, and end the process. The lock file stays: another
    process may hold it."""
    with contextlib.suppress(OSError):
        if sock.stat().st_ino == inode:
            sock.unlink()
    with contextlib.suppress(OSError):
        key = sock.with_suffix(".key")
        if key.read_bytes() == secret:
            key.unlink()
    log_file = sock.with_suffix(".log")
    with contextlib.suppress(OSError):
        if log_file.stat().st_size == 0:
            log_file.unlink()
    os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watchdog(leave: Callable[[], None], parent: int, last: list[float],
              busy: threading.Event) -> None:
    """End the worker when its node is gone, or when it has been idle (not answering a
    message) for longer than IDLE_SECONDS."""
    while True:
        time.sleep(2.0)
        idle = not busy.is_set() and time.monotonic() - last[0] > IDLE_SECONDS
        if idle or not _alive(parent):
            leave()


def serve(sock: Path, secret: Path, parent: int) -> None:
    key = secret.read_bytes()
    with Listener(str(sock), family="AF_UNIX", authkey=key) as listener:
        inode = sock.stat().st_ino

        def leave() -> None:
            _leave(sock, inode, key)

        signal.signal(signal.SIGTERM, lambda *_: leave())
        from fedflock.engines.flower.handler import answer  # torch, the runtime: once

        last, busy = [time.monotonic()], threading.Event()
        threading.Thread(target=_watchdog, args=(leave, parent, last, busy),
                         daemon=True).start()
        while True:
            try:
                conn = listener.accept()
            except (OSError, EOFError, AuthenticationError) as err:  # no secret, or gone
                log.warning("node worker: refused a connection (%s)", err)
                continue
            busy.set()
            with conn, contextlib.suppress(OSError, EOFError):
                message = message_from_proto(ProtoMessage.FromString(conn.recv_bytes()))
                context = context_from_proto(ProtoContext.FromString(conn.recv_bytes()))
                try:
                    content = answer(message, context)
                except Exception as err:  # the ClientApp redoes it and reports it
                    conn.send_bytes(f"{type(err).__name__}: {err}".encode())
                else:
                    conn.send_bytes(b"ok")
                    conn.send_bytes(recorddict_to_proto(content).SerializeToString())
                    conn.send_bytes(recorddict_to_proto(context.state).SerializeToString())
            last[0] = time.monotonic()
            busy.clear()


if __name__ == "__main__":
    serve(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
