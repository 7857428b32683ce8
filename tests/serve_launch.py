"""`nitsum serve` as a subprocess for end-to-end tests: start on fresh loopback ports, wait
until it reports ready, and stop it with every child afterwards.

(test_serve_e2e.py keeps its own launcher: its tests kill and stall individual workers, so it
tracks every child process by pid.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from nitsum.ports import free_port


@contextlib.contextmanager
def serving(
    work: Path, *flags: str, startup_s: float = 300.0, cwd: Path | None = None
) -> Iterator[tuple[str, Path]]:
    """`nitsum serve FLAGS`, logging to `work/serve.log`; yields (base URL, log path) once it
    prints `ready at`. Its log's tail is printed at the end (pytest shows it on failure)."""
    port, zport = free_port(), free_port()
    log_path = work / "serve.log"
    cmd = [sys.executable, "-m", "nitsum.cli", "serve", "--port", str(port)]
    cmd += ["--worker-addr", f"tcp://127.0.0.1:{zport}", *flags]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + startup_s
        while "ready at" not in log_path.read_text(errors="replace"):
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-3000:]
            time.sleep(0.25)
        yield f"http://127.0.0.1:{port}", log_path
    finally:
        if proc.poll() is None:  # the launcher stops its router and workers
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # whatever is left of its session
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        print(log_path.read_text(errors="replace")[-4000:])
