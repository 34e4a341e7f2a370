"""Starting ranks: one process per rank, a timeout on every group, and every rank's error brought home.

    results = run_ranks(tp_check, 3, cfg, folder)   # tp_check(rank, world_size, cfg, folder) runs in each rank

Each rank is a fresh Python process started with `spawn` (never `fork`: a forked copy of a notebook's kernel inherits
its threads and locks mid-flight). It joins a process group (gloo on the CPU; NCCL when there is one GPU per rank)
that has a timeout, so a collective waiting for a rank that died or never came fails instead of waiting forever.
`run_ranks` returns when every rank has returned, in rank order; when one rank raises, the others are stopped and a
CourseError names that rank and its error. No rank outlives the call. The target must be importable (a function in
the library, not one defined in a notebook): a spawned process finds it by its module and name.
"""

from __future__ import annotations

import datetime
import io
import os
import queue
import traceback

import torch

from ..device import pin_cpu_threads, timed
from ..errors import CourseError


def pick_backend(world_size: int) -> tuple[str, str]:
    """(backend, device type) for `world_size` ranks: ("nccl", "cuda") with a GPU for every rank, else ("gloo", "cpu").

    One GPU cannot hold several NCCL ranks, so a machine with fewer GPUs than ranks runs them all on the CPU.
    """
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size >= 2:
        return "nccl", "cuda"
    return "gloo", "cpu"


def rank_device(rank: int) -> torch.device:
    """The device of `rank` in the running group: its own GPU under NCCL, else the CPU."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", rank)
    return torch.device("cpu")


def run_ranks(target, world_size: int, *args, timeout_s: float = 60.0, deadline_s: float = 600.0, threads: int = 1,
              backend: str = "auto", ranks=None) -> list:
    """Run `target(rank, world_size, *args)` in `world_size` spawned ranks; their return values, in rank order.

    timeout_s: how long a rank waits for the group to form, and for each collective, before it fails (seconds).
    deadline_s: the whole run's limit (seconds); past it every rank is stopped and CourseError raised.
    threads: torch threads per rank. backend: "auto" (see pick_backend), "gloo" or "nccl".
    ranks: start only these ranks (the others are someone else's to start, as with torchrun on several machines).
    Raises CourseError naming the rank that failed, or the ranks that never joined.
    """
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise CourseError(f"world_size must be a whole number of ranks, at least 1, not {world_size!r}.")
    if backend == "auto":
        backend = pick_backend(world_size)[0]
    if backend not in ("gloo", "nccl"):
        raise CourseError(f"backend must be 'auto', 'gloo' or 'nccl', not {backend!r}.")
    here = sorted(range(world_size) if ranks is None else ranks)
    # The parent holds the rendezvous store (port 0: the system picks a free one), so no port is ever guessed.
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    processes = {r: ctx.Process(target=_rank_main, daemon=True, name=f"rank-{r}",
                                args=(target, r, world_size, store.port, backend, timeout_s, threads, args, messages))
                 for r in here}
    results, arrived = {}, set()
    waited = 0.0
    try:
        for p in processes.values():
            p.start()
        while len(results) < len(here):
            try:
                seconds, message = timed(lambda: messages.get(timeout=0.2))
            except queue.Empty:
                waited += 0.2
                _check_alive(processes, results, messages)
                if waited > deadline_s:
                    raise CourseError(f"The ranks did not finish within {deadline_s:g} s (ranks "
                                      f"{sorted(set(here) - set(results))} were still running): all were stopped.")
                continue
            waited += seconds
            rank, kind, payload = message
            if kind == "arrived":
                arrived.add(rank)
            elif kind == "result":
                results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            else:
                _raise_rank_error(rank, world_size, payload, arrived)
    finally:
        _stop(processes)
        messages.close()
        messages = store = None  # free the queue's semaphores now, even while an error's traceback holds this frame
    return [results[r] for r in here]


def _rank_main(target, rank, world_size, port, backend, timeout_s, threads, args, messages):
    """What every spawned rank runs: join the group (with its timeout), call the target, report, leave the group."""
    import torch.distributed as dist

    pin_cpu_threads(threads)  # a rank keeps its count: the same roundings as the one it is compared with
    # the names torchrun sets: libraries that start their own distributed code (transformers' tp_plan) read them
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    try:
        messages.put((rank, "arrived", None))
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        try:
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        except Exception:
            raise CourseError(f"it waited {timeout_s:g} s for all {world_size} ranks to join the group") from None
        result = target(rank, world_size, *args)
        buffer = io.BytesIO()
        torch.save(result, buffer)  # bytes, not shared memory: the result outlives this process
        messages.put((rank, "result", buffer.getvalue()))
    except BaseException as err:  # noqa: BLE001  (everything goes home, KeyboardInterrupt included)
        messages.put((rank, "error", (type(err).__name__, str(err), traceback.format_exc())))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _raise_rank_error(rank, world_size, payload, arrived):
    name, text, trace = payload
    first = (text.strip().splitlines() or [""])[0][:300]
    missing = sorted(set(range(world_size)) - arrived - {rank}) if "to join the group" in text else []
    if missing:
        who = f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} never joined"
        error = CourseError(f"Rank {rank} of {world_size} stopped: {first}, and {who}; all ranks were stopped.")
    else:
        what = first if name == "CourseError" else f"{name}: {first}"
        error = CourseError(f"Rank {rank} of {world_size} failed ({what}); all ranks were stopped.")
    error.rank, error.rank_traceback = rank, trace  # the whole traceback, for whoever debugs the rank's code
    raise error


def _check_alive(processes, results, messages):
    """A rank that died without a word (killed, out of memory, a crash in C++) fails the run too."""
    for rank, p in processes.items():
        if rank not in results and not p.is_alive() and p.exitcode not in (None, 0) and messages.empty():
            raise CourseError(f"Rank {rank} died with exit code {p.exitcode} before it reported (out of memory, or "
                              "killed?); all ranks were stopped.")


def _stop(processes) -> None:
    """Make sure no rank outlives the call: ask politely, then insist."""
    for p in processes.values():
        if p.is_alive():
            p.terminate()
    for p in processes.values():
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
