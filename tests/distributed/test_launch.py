"""The launcher: spawned ranks give back their results in rank order, a failing rank fails the call with its name
and error, a rank that never joins is a clear timeout, a stalled run meets its deadline, and no rank outlives a call."""

from __future__ import annotations

import os

import time

import psutil
import pytest
import rank_targets
import torch

from llm_anatomy.device import timed
from llm_anatomy.distributed.launch import pick_backend, run_ranks
from llm_anatomy.errors import CourseError


def _busy_reruns() -> set[int]:
    """make test's busy-machine reruns, which run beside the unit tests (tests/busy_background.py): their burners are
    spawned too, and are not ranks."""
    try:
        root = psutil.Process(int(os.environ["LLM_ANATOMY_BUSY_RERUNS_PID"]))
        return {root.pid, *(p.pid for p in root.children(recursive=True))}
    except (KeyError, ValueError, psutil.Error):
        return set()


def _children() -> set[int]:
    """This process's live ranks: the processes multiprocessing spawned (spawn_main), not its resource tracker (one
    per parent, by design), and not another test's helpers (a browser test's Chromium starts utility processes late)."""
    out, beside = set(), _busy_reruns()
    for p in psutil.Process().children(recursive=True):
        if p.pid in beside:
            continue
        try:
            command = " ".join(p.cmdline())
            if p.status() != psutil.STATUS_ZOMBIE and "spawn_main" in command and "resource_tracker" not in command:
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


def _described(pids: set[int]) -> str:
    out = []
    for pid in sorted(pids):
        try:
            out.append(f"{pid} ({' '.join(psutil.Process(pid).cmdline())[:120]})")
        except psutil.Error:
            out.append(f"{pid} (gone)")
    return ", ".join(out)


def _none_left(before: set[int]) -> None:
    left = _children() - before
    for _ in range(50):  # one still exiting as the call returns gets up to 5 s to be gone; a rank kept alive does not
        if not left:
            break
        time.sleep(0.1)
        left = _children() - before
    assert not left, f"processes left behind: {_described(left)}"


@pytest.fixture
def no_rank_left_behind():
    before = _children()
    yield
    _none_left(before)


pytestmark = pytest.mark.usefixtures("no_rank_left_behind")


@pytest.fixture(scope="module")
def three_ranks():
    """One group of three for the two tests below (starting the ranks is most of their time), with its own check
    that no rank outlives the call."""
    before = _children()
    results = run_ranks(rank_targets.echo_and_sum, 3, "hello", timeout_s=30)
    _none_left(before)
    return results


def test_three_ranks_give_back_their_results_in_rank_order(three_ranks):
    results = three_ranks
    assert [r["rank"] for r in results] == [0, 1, 2] and {r["world_size"] for r in results} == {3}
    assert all(r["value"] == "hello" for r in results)
    assert [r["tensor"].tolist() for r in results] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]


def test_the_ranks_form_one_group(three_ranks):
    assert [r["summed"] for r in three_ranks] == [6.0, 6.0, 6.0]


# The failures each start their own ranks, as few as show the fault (a group of two, where one rank must be stopped
# or is never started).


def test_a_rank_that_raises_fails_the_call_with_its_name_and_error():
    seconds, error = timed(lambda: pytest.raises(CourseError, run_ranks, rank_targets.fails, 2, 1, timeout_s=30))
    assert str(error.value) == ("Rank 1 of 2 failed (ValueError: rank 1 was told to fail); all ranks were stopped.")
    assert error.value.rank == 1 and "ValueError" in error.value.rank_traceback
    assert seconds < 25  # the other was stopped, not left to wait for its barrier's timeout


def test_a_rank_that_never_joins_is_a_clear_timeout():
    with pytest.raises(CourseError) as error:
        run_ranks(rank_targets.echo, 2, "x", timeout_s=2, ranks=[0])  # rank 1 is never started
    assert "waited 2 s for all 2 ranks to join the group" in str(error.value)
    assert "rank 1 never joined" in str(error.value)


def test_a_stalled_run_is_stopped_at_its_deadline():
    seconds, error = timed(lambda: pytest.raises(CourseError, run_ranks, rank_targets.stalls, 2, timeout_s=30,
                                                 deadline_s=4))
    assert "did not finish within 4 s" in str(error.value) and "[0, 1]" in str(error.value)
    assert seconds < 30


def test_bad_arguments_are_refused_before_any_rank_starts():
    for world in (0, -1, 2.5, True):
        with pytest.raises(CourseError, match="world_size must be a whole number"):
            run_ranks(rank_targets.echo, world, "x")
    with pytest.raises(CourseError, match="backend must be"):
        run_ranks(rank_targets.echo, 2, "x", backend="mpi")


def test_the_backend_follows_the_gpus():
    backend, device = pick_backend(3)
    if torch.cuda.device_count() >= 3:
        assert (backend, device) == ("nccl", "cuda")
    else:
        assert (backend, device) == ("gloo", "cpu")  # one GPU cannot hold three NCCL ranks
    assert pick_backend(1) == ("gloo", "cpu")
