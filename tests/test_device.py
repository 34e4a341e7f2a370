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
