"""N ranks as N threads of one process, for tests: the collectives go through shared memory instead of gloo.

It lets a test run TP = 3 of a tiny model in a fraction of a second, and break it on purpose (drop the all-reduce
of one site on every rank) to show that the evidence of claim C21 then fails. The modules under test are the
library's own: only the Communicator is replaced.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from llm_anatomy.distributed.tensor_parallel import Collective, Communicator


class ThreadGroup:
    def __init__(self, size: int, timeout_s: float = 60.0):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=timeout_s)
        self.slots: list[torch.Tensor | None] = [None] * size


@dataclass
class ThreadCommunicator(Communicator):
    rank: int = 0
    drop: set = field(default_factory=set)  # sites whose all-reduce every rank skips (a broken model)

    @property
    def world_size(self) -> int:
        return self.group.size

    def _exchange(self, x: torch.Tensor) -> list[torch.Tensor]:
        g = self.group
        g.slots[self.rank] = x.clone()
        g.barrier.wait()
        parts = list(g.slots)
        g.barrier.wait()
        return parts

    def all_reduce(self, x, site):
        self.calls.append(Collective("all_reduce", site, x.numel() * x.element_size()))
        if site not in self.drop:
            parts = self._exchange(x)
            x.copy_(torch.stack(parts).sum(0))
        return x

    def all_gather(self, x, site):
        self.calls.append(Collective("all_gather", site, x.numel() * x.element_size()))
        return torch.cat(self._exchange(x), dim=-1)


def run_threads(size: int, work, drop=()) -> list:
    """work(rank, communicator) in `size` threads; their results in rank order (a thread's error is re-raised)."""
    group = ThreadGroup(size)
    results, errors = [None] * size, []

    def target(rank):
        try:
            results[rank] = work(rank, ThreadCommunicator(group, rank=rank, drop=set(drop)))
        except BaseException as err:  # noqa: BLE001
            errors.append(err)
            group.barrier.abort()

    threads = [threading.Thread(target=target, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return results
