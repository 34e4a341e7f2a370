"""The command line in-process: `main(argv)` with its output captured, and this process put back as it was after.

A subprocess costs an interpreter, torch's import and the package's for every run; each command keeps one subprocess
test of the real `python -m llm_anatomy` entry (its exit status and a one-line error), and the others call main()
here. A command changes what a process keeps (torch's threads and the course's thread policy, torch's random state,
grad mode, the environment, the working folder): all of that is restored, and a thread the command leaves running
fails the run, so that no test after it sees a different process.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import random
import threading
import time
import warnings
from dataclasses import dataclass

import torch


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> dict:
        assert self.code == 0, self.err[-2000:]
        return json.loads(self.out)


@contextlib.contextmanager
def process_kept():
    """Restore what a command may change in this process, and fail if it leaves a thread behind."""
    from llm_anatomy import device

    threads, policy, grad = torch.get_num_threads(), copy.copy(device._policy), torch.is_grad_enabled()
    rng, py_rng, environ, cwd = torch.get_rng_state(), random.getstate(), dict(os.environ), os.getcwd()
    filters, live = list(warnings.filters), set(threading.enumerate())
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        device._policy.clear()
        device._policy.update(policy)
        torch.set_grad_enabled(grad)
        torch.set_rng_state(rng)
        random.setstate(py_rng)
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        warnings.filters[:] = filters
        # tqdm's monitor is one per process, started by the first progress bar anywhere (transformers' among them)
        left = [t for t in threading.enumerate() if t not in live and t.name != "tqdm_monitor"]
        deadline = time.monotonic() + 5  # one finishing as the command returns gets a moment; one kept running does not
        for t in left:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        left = [t.name for t in left if t.is_alive()]
        assert not left, f"the command left threads running: {left}"


def run_cli(*argv: str) -> Run:
    """`python -m llm_anatomy ARGV` in this process: exit status (argparse's SystemExit included), stdout, stderr."""
    from llm_anatomy.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with process_kept(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as stop:  # what the interpreter would make of it: None is 0, a message is printed and 1
            code = stop.code
            if code is None:
                code = 0
            elif not isinstance(code, int):
                print(code, file=err)
                code = 1
    return Run(code, out.getvalue(), err.getvalue())


def quick_bench_json(topic: str) -> dict:
    """`bench TOPIC --json --quick` on the tiny random model, on one CPU thread (in this process)."""
    return run_cli("bench", topic, "--json", "--quick", "--model-size", "tiny", "--device", "cpu", "--threads",
                   "1").json()
