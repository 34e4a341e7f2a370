import os

import pytest
import torch

from llm_anatomy import CourseError
from llm_anatomy.device import default_dtype, describe_device, pick_device


def test_auto_picks_cpu_when_there_is_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu")


def test_auto_prefers_cuda_then_mps(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device("auto").type == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert pick_device("auto").type == "mps"


def test_dtype_follows_the_device(monkeypatch):
    assert default_dtype(torch.device("cpu")) == torch.float32
    assert default_dtype(torch.device("mps")) == torch.float16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert default_dtype(torch.device("cuda")) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert default_dtype(torch.device("cuda")) == torch.float16


def test_emulated_bf16_is_not_native(monkeypatch):
    """A T4 says bf16 is supported only through emulation: the course then picks fp16."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert default_dtype(torch.device("cuda")) == torch.float16


@pytest.mark.parametrize("bad", ["gpu", "tpu:0", "", "cpux"])
def test_unknown_device_is_one_clear_sentence(bad):
    with pytest.raises(CourseError, match="Unknown device"):
        pick_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_says_so():
    with pytest.raises(CourseError, match="no CUDA GPU"):
        pick_device("cuda")


def test_describe_cpu_mentions_cores():
    assert describe_device(torch.device("cpu")).startswith("cpu (")


# --------------------------------------------------------------------------- the thread policy

import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from llm_anatomy import device as dev  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import busy_check  # noqa: E402  (the burner the busy-machine check uses)


@pytest.fixture
def policy():
    """The policy's state and torch's threads as they were, restored after the test."""
    before, saved = torch.get_num_threads(), dict(dev._policy)
    dev._policy.clear()
    yield dev._policy
    dev._policy.clear()
    dev._policy.update(saved)
    torch.set_num_threads(before)


def test_torch_threads_is_restored():
    before = torch.get_num_threads()
    with dev.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_usable_cores_is_at_most_torchs_choice_and_the_affinity():
    cores = dev.usable_cores()
    assert 1 <= cores <= dev.TORCH_DEFAULT_THREADS
    if hasattr(os, "sched_getaffinity"):
        assert cores <= len(os.sched_getaffinity(0))


@pytest.mark.quiet
@pytest.mark.timeout(60)
def test_a_burned_core_is_seen_and_this_process_is_not():
    def own_thread_busy():
        stop = time.monotonic() + 0.5

        def spin():
            while time.monotonic() < stop:  # bounded: half a second
                pass

        spinner = threading.Thread(target=spin)
        spinner.start()  # this process's own busy thread: not another program
        busy = dev.busy_cores(0.3)
        spinner.join()
        return busy

    # In turns, up to three rounds: another program that gets busy between two readings moves one round, while
    # counting this process's own thread would add a whole core to every round.
    rounds = []
    for _ in range(3):
        quiet, own = dev.busy_cores(0.3), own_thread_busy()
        rounds.append((quiet, own))
        if own < quiet + 0.5:
            break
    assert own < quiet + 0.5, f"this process's own thread counted as busy: (quiet, own) = {rounds}"
    if quiet > dev.usable_cores() - 1.25:  # another program holds the cores already: none left to burn and see
        pytest.skip(f"{quiet:.2f} of {dev.usable_cores()} cores were busy before the burner started")
    with busy_check.burning(1, seconds=30):
        time.sleep(0.3)  # the spawned burner starts spinning
        burned = dev.busy_cores(0.3)
    assert burned > quiet + 0.6, f"a core kept busy read {burned:.2f} cores busy (quiet: {quiet:.2f})"


@pytest.mark.skipif(dev.usable_cores() < 2, reason="needs two cores for torch")
@pytest.mark.timeout(60)
def test_the_policy_gives_up_the_burned_core(policy):
    with busy_check.burning(dev.usable_cores() - 1, seconds=30):
        time.sleep(0.3)
        choice = dev.use_cpu_threads("cpu", sample_s=0.3)
    assert choice.threads == 1 == torch.get_num_threads(), str(choice)
    assert "kept busy by other programs" in str(choice) and choice.busy >= 0.6


def test_the_rule_one_thread_per_free_core(monkeypatch):
    monkeypatch.setattr(dev, "usable_cores", lambda: 4)
    for busy, threads in ((0.0, 4), (0.2, 4), (0.3, 3), (1.0, 3), (1.9, 2), (3.8, 1), (7.0, 1)):
        monkeypatch.setattr(dev, "busy_cores", lambda sample_s, b=busy: b)
        assert dev.choose_cpu_threads().threads == threads, busy


def test_recheck_applies_the_policy_only_where_it_is_in_charge(policy, monkeypatch):
    monkeypatch.setattr(dev, "busy_cores", lambda sample_s: 0.0)
    assert dev.recheck_cpu_threads() is None  # nothing applied yet: torch's threads are left alone
    first = dev.use_cpu_threads("cpu")
    assert dev.recheck_cpu_threads() is first  # young: kept without measuring again
    monkeypatch.setattr(dev, "busy_cores", lambda sample_s: 99.0)
    assert dev.recheck_cpu_threads(max_age_s=0).threads == 1 == torch.get_num_threads()  # measured again
    with dev.torch_threads(2 if first.threads != 2 else 3):  # pinned for a block: the re-check keeps out
        assert dev.recheck_cpu_threads(max_age_s=0) is None
    dev.pin_cpu_threads(2)  # by hand (--threads): neither the policy nor a re-check changes it
    assert dev.use_cpu_threads("cpu").pinned and dev.recheck_cpu_threads(max_age_s=0) is None
    assert torch.get_num_threads() == 2 and "by hand" in str(dev.use_cpu_threads("cpu"))


def test_no_policy_on_a_gpu_and_no_bad_pin(policy):
    before = torch.get_num_threads()
    assert dev.use_cpu_threads(torch.device("cuda")) is None and torch.get_num_threads() == before
    for bad in (0, -1, 1.5, True):
        with pytest.raises(CourseError, match="at least 1 thread"):
            dev.pin_cpu_threads(bad)
    assert torch.get_num_threads() == before


def test_one_table_of_number_formats():
    from llm_anatomy.device import DTYPES, dtype_name, dtype_named

    assert dtype_named("bf16") is torch.bfloat16 and dtype_name(torch.float16) == "fp16"
    assert dtype_name(torch.int8) == "int8"  # not in the table: torch's own name
    assert all(dtype_name(dtype_named(name)) == name for name in DTYPES)
    with pytest.raises(CourseError, match=r"Unknown number format 'fp12': choose one of bf16, fp16, fp32, fp8\."):
        dtype_named("fp12")
