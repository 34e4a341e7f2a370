"""The watch over torch's calls that the method checks build on: it sees every call, C code's included, once each,
with what it returned, and stops watching when the block ends."""

from __future__ import annotations

import torch

from llm_anatomy.exercises._watch import torch_calls


def test_every_torch_call_is_seen_once_with_its_output():
    seen = []
    x = torch.ones(3)
    with torch_calls(lambda func, args, kwargs, out: seen.append((getattr(func, "__name__", str(func)), out))):
        y = torch.add(x, 1)
        z = (y * 2).sum()
    names = [name for name, _ in seen]
    assert names.count("add") == 1 and names == ["add", "mul", "sum"]
    assert next(out for name, out in seen if name == "add") is y
    assert next(out for name, out in seen if name == "sum") is z
    count = len(seen)
    torch.add(x, 1)  # outside the block: not watched
    assert len(seen) == count


def test_keyword_arguments_reach_the_watcher():
    kwargs_seen = []
    with torch_calls(lambda func, args, kwargs, out: kwargs_seen.append(kwargs)):
        torch.softmax(torch.zeros(2), dim=-1)
    assert {"dim": -1} in kwargs_seen
