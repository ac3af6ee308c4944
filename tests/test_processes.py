"""Processes fedflock starts are its own to end: all of them, detached descendants included,
also when the run is sent SIGTERM, and never a process it did not start. The Flower App ships
inside the package, so it is found from an installed (non-editable) wheel too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

from fedflock.engines.flower.local import APP
from fedflock.engines.flower.processes import OwnedProcesses, alive, processes_carrying

REPO = Path(__file__).resolve().parents[1]


def _wait_gone(pids: list[int], seconds: float = 15.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def _detached_sleeper(owned: OwnedProcesses, seconds: int) -> int:
    """A grandchild in a session of its own whose parent has exited (as `flwr run`'s local
    SuperLink): only its environment ties it to us."""
    done = owned.run(["sh", "-c", f"setsid sleep {seconds} >/dev/null 2>&1 & echo $!"],
                     timeout=10, stdout=subprocess.PIPE, text=True)
    return int(done.stdout.strip())


def _sleeper(*marks: str) -> subprocess.Popen:
    """A process of somebody else's whose command line holds `marks`."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", *marks])


def test_ends_its_own_processes_and_no_other(tmp_path: Path) -> None:
    stranger = _sleeper("fedflock-flwr-lookalike")  # not ours
    try:
        with OwnedProcesses(grace=5) as owned:
            child = owned.start(["sleep", "300"])
            orphan = _detached_sleeper(owned, 301)
            # a process just forked or in the middle of exec may not show its environment for
            # a moment (seen once under a clean-clone CI run): wait until it is listed
            deadline = time.monotonic() + 5
            while not set(owned.pids()) >= {child.pid, orphan} and time.monotonic() < deadline:
                time.sleep(0.05)
            assert set(owned.pids()) >= {child.pid, orphan}
            # The old rule ended every process whose command line held a run's marker string:
            mimic = _sleeper(owned.token)
        assert _wait_gone([child.pid, orphan]) == []
        assert alive(stranger.pid) and alive(mimic.pid)
    finally:
        for proc in (stranger, locals().get("mimic")):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_a_run_killed_by_sigterm_leaves_nothing_behind(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from tests.test_processes import _detached_sleeper
        from fedflock.engines.flower.processes import OwnedProcesses
        with OwnedProcesses(grace=5) as owned:
            child = owned.start(["sleep", "300"])
            orphan = _detached_sleeper(owned, 303)
            print(owned.token, child.pid, orphan, flush=True)
            time.sleep(300)
    """))
    run = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    token, *pids = run.stdout.readline().split()
    assert all(alive(int(p)) for p in pids)
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=30) == 128 + signal.SIGTERM
    assert _wait_gone([int(p) for p in pids]) == []
    assert processes_carrying(token) == []


def test_a_second_sigterm_during_the_cleanup_does_not_cut_it_short(tmp_path: Path) -> None:
    """`timeout` (or a user pressing twice) passes on a second SIGTERM while the run is still
    ending its processes; one of them ignores SIGTERM, so the run is inside its grace period
    then. Everything must still be ended."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from fedflock.engines.flower.processes import OwnedProcesses
        with OwnedProcesses(grace=3) as owned:
            stubborn = owned.start(["sh", "-c", "trap '' TERM; sleep 300"])
            time.sleep(0.5)
            print(owned.token, stubborn.pid, flush=True)
            time.sleep(300)
    """))
    run = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    token, pid = run.stdout.readline().split()
    run.send_signal(signal.SIGTERM)
    time.sleep(1.0)  # inside the grace period: the stubborn process is still alive
    assert alive(int(pid))
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=30) == 128 + signal.SIGTERM
    assert _wait_gone([int(pid)]) == []
    assert processes_carrying(token) == []


def test_the_flower_app_ships_inside_the_wheel(tmp_path: Path) -> None:
    """Build the wheel, install it (no dependencies) into a folder of its own and ask that
    copy where its Flower App is: inside the installed package, with its pyproject.toml."""
    assert (APP / "pyproject.toml").is_file() and APP.is_relative_to(REPO / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist"), str(REPO)], check=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("fedflock-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        assert "fedflock/engines/flower/app/pyproject.toml" in zf.namelist()
        zf.extractall(tmp_path / "site")
    where = subprocess.run(
        [sys.executable, "-c", "import fedflock.engines.flower.local as m; print(m.APP)"],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, capture_output=True,
        text=True, check=True, timeout=60, cwd=tmp_path).stdout.strip()
    assert Path(where) == tmp_path / "site" / "fedflock" / "engines" / "flower" / "app"
    assert "fedflock.engines.flower.serverapp:app" in (Path(where) / "pyproject.toml").read_text()
