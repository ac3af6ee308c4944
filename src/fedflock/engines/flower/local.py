"""A real Flower deployment on loopback: one SuperLink and N SuperNodes as separate processes.

For integration tests, benchmarks and trying the deployment on one machine. Every process is
started through `OwnedProcesses`: the SuperLink, the SuperNodes and everything they start
(SuperExec, ClientApp processes) are ended on exit, also when the body raises or the process is
sent SIGTERM, and nothing else is touched.

Every SuperNode runs with `worker=true` (a long-lived worker per node does the ClientApp's work,
`fedflock.engines.flower.worker`) unless its node config says otherwise, and with one torch
thread per process unless OMP_NUM_THREADS is set: all nodes share this machine's cores.

With `credentials` (`fedflock deploy init`) every connection uses TLS under their CA; with
`authenticate` as well, the SuperLink admits only SuperNodes whose public key was registered
(`flwr supernode register`, done here for node keys 0..N-1 before the nodes start).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from fedflock.engines.flower.credentials import Credentials
from fedflock.engines.flower.processes import OwnedProcesses

APP = Path(__file__).resolve().parent / "app"  # package data: works from any install


def flower_env(home: Path) -> dict[str, str]:
    """Environment for Flower processes: this interpreter's scripts first, no telemetry."""
    bindir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
            "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0",
            "RAY_USAGE_STATS_ENABLED": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalDeployment:
    """`with LocalDeployment(4, workdir) as d: d.run(config_path, out)`."""

    def __init__(self, nodes: int, workdir: Path, node_config: dict[int, str] | None = None,
                 app: Path = APP, credentials: Credentials | None = None,
                 authenticate: bool = False) -> None:
        if authenticate and credentials is None:
            raise ValueError("node authentication needs TLS credentials (fedflock deploy init)")
        self.credentials = credentials
        self.authenticate = authenticate
        self.nodes = nodes
        self.workdir = Path(workdir)
        self.node_config = node_config or {}
        self.app = app
        self.port = free_port()
        self.supernodes: dict[int, subprocess.Popen] = {}
        self.superlink: subprocess.Popen | None = None
        env = flower_env(self.workdir / "flwr-home")
        # Every node of a loopback deployment shares this machine's cores: one thread each, or
        # N ClientApp processes running torch at once thrash the cores (unless the user chose).
        env.setdefault("OMP_NUM_THREADS", "1")
        self.owned = OwnedProcesses(env)
        self.env = self.owned.env
        self.flwr = shutil.which("flwr", path=self.env["PATH"]) or "flwr"

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        with (self.workdir / f"{name}.log").open("w") as log:
            return self.owned.start(args, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=self.workdir)

    def __enter__(self) -> LocalDeployment:
        self.owned.__enter__()
        self.workdir.mkdir(parents=True, exist_ok=True)
        home = self.workdir / "flwr-home"
        home.mkdir(exist_ok=True)
        trust = ("insecure = true" if self.credentials is None else
                 f'root-certificates = "{self.credentials.ca_certificate}"')
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
            f'address = "127.0.0.1:{self.port}"\n{trust}\n')
        try:
            self.superlink = self._start("superlink", [
                "flower-superlink", *self._link_security(),
                "--disable-runtime-dependency-installation",
                "--port", str(self.port), "--database", ":flwr-in-memory:"])
            self._wait_for_port(self.port)
            if self.authenticate:
                assert self.credentials is not None
                for i in range(self.nodes):
                    self.register(self.credentials.node_public_key(i))
            for i in range(self.nodes):
                self.start_node(i)
        except BaseException:
            self.close()
            raise
        return self

    def _link_security(self) -> list[str]:
        c = self.credentials
        if c is None:
            return ["--insecure"]
        return ["--ssl-ca-certfile", str(c.ca_certificate), "--ssl-certfile",
                str(c.server_certificate), "--ssl-keyfile", str(c.server_key),
                *(["--enable-supernode-auth"] if self.authenticate else [])]

    def register(self, public_key: Path) -> None:
        """Register a SuperNode's public key with the SuperLink (`flwr supernode register`)."""
        done = self.owned.run([self.flwr, "supernode", "register", str(public_key), "local"],
                              timeout=120, cwd=self.workdir, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"flwr supernode register {public_key} failed: "
                               f"{done.stdout.strip()[-500:]}")

    def start_node(self, partition: int, key: Path | None = None,
                   name: str | None = None) -> subprocess.Popen:
        """Start a SuperNode for `partition`, authenticating with `key` (default: node key
        `partition` of the credentials when authentication is on)."""
        config = f"partition-id={partition} num-partitions={self.nodes}"
        extra = self.node_config.get(partition, "")
        if "worker=" not in extra:  # a long-lived worker per node: no torch import per message
            config += " worker=true"
        if extra:
            config += " " + extra
        c = self.credentials
        security = ["--insecure"] if c is None else ["--root-certificates",
                                                      str(c.ca_certificate)]
        if key is None and self.authenticate and c is not None:
            key = c.node_key(partition)
        if key is not None:
            security += ["--auth-supernode-private-key", str(key)]
        name = name or f"supernode{partition}"
        proc = self._start(name, ["flower-supernode", *security, "--superlink",
                                  f"127.0.0.1:{self.port}", "--node-config", config,
                                  "--port", str(free_port())])
        if name == f"supernode{partition}":
            self.supernodes[partition] = proc
        return proc

    def _wait_for_port(self, port: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            if self.superlink is not None and self.superlink.poll() is not None:
                raise RuntimeError(f"flower-superlink exited; see {self.workdir}/superlink.log")
            time.sleep(0.2)
        raise TimeoutError(f"flower-superlink did not listen on {port} within {timeout} s")

    def submit(self, config: Path, out: Path, extra: str = "") -> subprocess.CompletedProcess:
        """`flwr run` the app on this deployment (returns once the run is submitted)."""
        run_config = f'config="{Path(config).resolve()}" out="{Path(out).resolve()}" {extra}'
        return self.owned.run([self.flwr, "run", str(self.app), "local", "--run-config",
                               run_config.strip()], timeout=120, cwd=self.workdir,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def kill_node(self, partition: int) -> None:
        """SIGKILL a SuperNode's whole session (as a device losing power)."""
        proc = self.supernodes[partition]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        """End every process this deployment started, and their descendants."""
        self.owned.__exit__(None, None, None)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
