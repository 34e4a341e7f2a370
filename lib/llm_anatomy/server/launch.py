"""Starting a server: in this process (`run`, what `python -m llm_anatomy serve` calls), or in a subprocess that is
always stopped again (`ServerProcess`, what notebook 11, the tests and `bench api` use), ours or transformers'.

A subprocess server outlives a careless parent: a notebook whose kernel is killed runs no cleanup. So the child
watches its parent (`--exit-with-parent`) and exits when the parent is gone; the parent stops it when its `with`
block ends, when stop() is called, and when Python exits (atexit), and start() stops it when it does not come up.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from ..errors import CourseError

_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 never goes through a proxy


def _course_on_path() -> dict:
    """The environment's one change for a child: the course's lib/ first on PYTHONPATH (it imports this package)."""
    lib = str(Path(__file__).resolve().parents[2])
    return {"PYTHONPATH": os.pathsep.join([lib] + [p for p in [os.environ.get("PYTHONPATH")] if p])}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(model: str | None = None, device: str = "cpu", *, max_batch: int = 8, kv_blocks: int = 512,
          block_size: int = 16, max_batched_tokens: int | None = 256, prefix_cache: bool = True,
          max_waiting: int | str | None = None, ttft_objective_s: float | None = None, api_key: str | None = None,
          max_body_bytes: int = 1 << 20, default_max_tokens: int = 256, prefill_first: bool = True):
    """A Server (app.py) on an EngineLoop over the from-scratch model (fp32 on a CPU), warmed up, not yet started."""
    import torch

    from ..generate.chat import chat_prompt_ids
    from ..model.scratch import ScratchLlama
    from ..weights.load import load_model
    from .app import Server
    from .engine import EngineLoop
    from .metrics import Metrics

    loaded = load_model(model, device, dtype=torch.float32 if device == "cpu" else None, verbose=False)
    metrics = Metrics()
    engine = EngineLoop(ScratchLlama.from_hf(loaded.model), loaded.tokenizer, max_batch=max_batch,
                        kv_blocks=kv_blocks, block_size=block_size, max_batched_tokens=max_batched_tokens,
                        prefix_cache=prefix_cache, max_waiting=max_waiting,
                        ttft_objective_s=ttft_objective_s, metrics=metrics, prefill_first=prefill_first)
    engine.warm_up()  # the first calls pay for allocation: not a client
    chat_prompt_ids(loaded.tokenizer, [{"role": "user", "content": "hello"}])  # so does the chat template's
    return Server(engine, loaded.name, metrics, api_key=api_key, max_body_bytes=max_body_bytes,
                  default_max_tokens=default_max_tokens)


SWITCH_INTERVAL_S = 0.0005  # how long a thread may keep the interpreter lock while another one waits for it


def run(host: str = "127.0.0.1", port: int = 8000, log=print, **options) -> None:
    """Serve until interrupted (Ctrl+C): build(**options), then uvicorn on host:port.

    The engine thread and the event loop share one interpreter lock; Python's default switch interval (5 ms) lets a
    busy engine step keep a handler that has a token to write waiting up to 5 ms each time it wants the lock, which is
    the server's own latency. SWITCH_INTERVAL_S makes that wait a tenth as long, for a little more switching."""
    import uvicorn

    sys.setswitchinterval(SWITCH_INTERVAL_S)

    server = build(**options)
    engine = server.engine
    log(f"serving {server.name} on http://{host}:{port}/v1 ({engine.describe()}, queue limit {engine.max_waiting}, "
        f"API key {'required' if server.api_key else 'not required'})")
    uvicorn.run(server.app(), host=host, port=port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=3)


class ServerProcess:
    """A server in a subprocess on 127.0.0.1: `with ServerProcess.ours() as s: ... s.url ...`, or start()/stop().

    argv: the command (the port goes in it); start() waits until GET /health answers (at most ready_timeout_s).
    """

    def __init__(self, argv: list[str], port: int, *, env: dict | None = None, ready_timeout_s: float = 180.0,
                 api_key: str | None = None, label: str = "server"):
        self.argv, self.port, self.label, self.api_key = argv, port, label, api_key
        self.env = dict(os.environ, HF_HUB_OFFLINE="1", **(env or {}))
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"llm-anatomy-{label}-", suffix=".log", delete=False)

    @classmethod
    def ours(cls, *options: str, port: int | None = None, **kwargs) -> "ServerProcess":
        """`python -m llm_anatomy serve --port P --exit-with-parent OPTIONS...` (this Python, this course)."""
        port = port or free_port()
        env = _course_on_path()
        key = next((options[i + 1] for i, o in enumerate(options[:-1]) if o == "--api-key"), None)
        argv = [sys.executable, "-m", "llm_anatomy", "serve", "--port", str(port), "--exit-with-parent", *options]
        return cls(argv, port, env=env, label="ours", api_key=key, **kwargs)

    @classmethod
    def transformers(cls, model_dir: str, *options: str, port: int | None = None, **kwargs) -> "ServerProcess":
        """`transformers serve MODEL_DIR --continuous-batching` on 127.0.0.1, offline, watched like ours."""
        port = port or free_port()
        args = ["serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), *options]
        code = ("from llm_anatomy.server.launch import watch_parent\nwatch_parent()\n"  # first: exit with the parent
                f"import sys\nsys.argv = ['transformers'] + {args!r}\n"
                "from transformers.cli.transformers import main\nsys.exit(main())\n")
        return cls([sys.executable, "-c", code], port, env=_course_on_path(), label="transformers", **kwargs)

    @property
    def url(self) -> str:
        """The OpenAI base URL, for openai.OpenAI(base_url=...)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ServerProcess":
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        atexit.register(self.stop)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise CourseError(f"The {self.label} server exited with status {self.proc.returncode} before it was "
                                  f"ready:\n{self.tail()}")
            try:
                with _LOCAL.open(self.root + "/health", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise CourseError(f"The {self.label} server did not answer /health within {self.ready_timeout_s:.0f} s:\n"
                          f"{self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        """The end of what the server printed."""
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def get(self, path: str) -> str:
        """GET a path of the server (with its key, if it has one) as text."""
        request = urllib.request.Request(self.root + path)
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        with _LOCAL.open(request, timeout=10) as reply:
            return reply.read().decode()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (SIGTERM to its process group, SIGKILL if it lingers); safe to call twice."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> "ServerProcess":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def watch_parent() -> None:
    """In a server started by ServerProcess: exit when the process that started it is gone."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
