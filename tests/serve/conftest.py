"""A tiny chat target with a random draft, served on 127.0.0.1 in this process (uvicorn in a thread).

The server is the real one (``build_app`` + ``Scheduler`` over a ``SpecEngine``); only
where it runs differs from ``eaglet serve`` (test_sigterm.py starts that as a process).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from eaglet.loading import load_target
from eaglet.serve.app import build_app
from eaglet.serve.metrics import Metrics
from eaglet.serve.scheduler import Scheduler
from eaglet.speculative import SpecEngine
from eaglet.speculative.load import load_engine_draft
from tests.conftest import save_random_draft
from tests.train.helpers import make_tiny_target_dir

CONTEXT = 256


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def start_server(dirs, *flags: str, timeout: float = 120) -> tuple[subprocess.Popen, str]:
    """`eaglet serve` as a process (the tiny target and its draft, a free port, ``flags``) -> (process, URL),
    once /health answers; the caller stops the process."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "eaglet.cli", "serve", "--target", str(dirs[0]), "--draft", str(dirs[1]),
         "--port", str(port), "--max-context", str(CONTEXT), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            return httpx.get(f"{url}/health").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(up, timeout)
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    return proc, url


@pytest.fixture(scope="session")
def served_dirs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("serve")
    target = make_tiny_target_dir(root / "target")
    return target, save_random_draft(target, root / "draft", 64)


def new_engine(dirs, adaptive: bool = True, **kw) -> SpecEngine:
    target = load_target(str(dirs[0]), dtype=torch.float32, device="cpu")
    return SpecEngine(target, load_engine_draft(dirs[1], target), CONTEXT, log=lambda _: None, adaptive=adaptive,
                      **kw)


class Served:
    """A running server: its URL, scheduler and metrics."""

    def __init__(self, engine, max_batch: int = 4, max_queue: int = 64, sizes: tuple[int, ...] | None = None,
                 overlap: bool = False):
        import uvicorn

        self.engine, self.metrics = engine, Metrics()
        self.scheduler = Scheduler(engine, max_batch, max_queue, self.metrics, sizes, overlap=overlap)
        self.model = engine.target.name
        app = build_app(engine, self.scheduler, self.metrics, self.model)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, **kw)

    def metric(self, name: str) -> float:
        """The value of one sample of /metrics (0 when absent), e.g. 'eaglet_requests_total{outcome="finished"}'."""
        for line in httpx.get(f"{self.url}/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0

    def stop(self) -> None:
        self.scheduler.close(0)
        self.server.should_exit = True
        self.thread.join(10)
        self.scheduler.join(10)


@pytest.fixture(scope="module")
def served(served_dirs, one_thread):
    s = Served(new_engine(served_dirs))
    yield s
    s.stop()
