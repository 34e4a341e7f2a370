"""The packed decode step compiled as one graph (fast/compiled.py; issue 51; claim C20's CPU half)."""

from __future__ import annotations

import json

import pytest
import torch

from llm_anatomy.claims import ClaimFailed, claim
from llm_anatomy.errors import CourseError
from llm_anatomy.fast import compiled as c
from llm_anatomy.fast.compiled import (CompiledDecoder, compile_cache, compile_times, compiler_status,
                                       overhead_evidence, time_eager_and_compiled)
from llm_anatomy.fast.packed import pack
from llm_anatomy.generate.decode import generate_greedy
from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.weights.random import random_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py

needs_compiler = pytest.mark.skipif(not compiler_status()[0], reason="no C++ compiler: " + compiler_status()[1])


@pytest.fixture(scope="module")
def real_int4(real_scratch, real):
    """The real model packed int4, a chat prompt, and its decoder compiled in the course's cache (notebook 09 then
    finds the step built: one cold compile in make test, not two)."""
    from llm_anatomy.generate.chat import chat_prompt_ids

    from llm_anatomy.device import torch_threads, usable_cores

    model = pack(real_scratch, "int4")
    chat = chat_prompt_ids(real.tokenizer, [{"role": "user", "content": "Explain what a KV cache is."}])
    # inductor's kernels are built for a count of threads: one per core, as notebook 09 runs them on an idle machine
    # (the policy's choice now would count make test's busy reruns in the background, and build them for one)
    with torch.inference_mode(), torch_threads(usable_cores()):
        times = compile_times(model, chat, compile_cache(), max_len=chat.shape[1] + 129)
    return model, chat, times


@needs_compiler
def test_the_compiled_step_gives_the_eager_packed_paths_128_greedy_tokens(real_int4):
    model, chat, times = real_int4
    decoder = times["decoder"]
    assert times["warm_s"] > 0 and times["cold_s"] > 0
    compiled = decoder.generate(chat, 128)
    assert compiled.shape == (1, 128)
    assert torch.equal(compiled, generate_greedy(model, chat, 128).tokens)
    again = decoder.generate(chat, 128)  # the cache rewound by prefill: the same run again, no recompile
    assert torch.equal(again, compiled)


# --------------------------------------------------------------------------- C20's CPU half, its false worlds
# (the true world is notebook 09's cell [section 4.3], asserted under nbval and again with a core burned)


@needs_compiler
@pytest.mark.counterfactual("C20", "CPU: a 'compiled' step that runs eagerly (traced by dynamo, backend='eager', "
                                   "no kernels generated)")
def test_c20_cpu_half_fails_when_the_compiled_step_is_not_compiled(real_int4):
    model, chat, _ = real_int4
    decoder = CompiledDecoder(model, chat.shape[1] + 40)
    decoder._step = torch.compile(c.greedy_decode_step, backend="eager", dynamic=True, fullgraph=True)
    decoder.warm_up(chat)
    same = torch.equal(decoder.generate(chat, 32), generate_greedy(model, chat, 32).tokens)
    t = time_eager_and_compiled(model, decoder, chat)
    with pytest.raises(ClaimFailed, match="C20 FAILED"):
        claim("C20", *overhead_evidence(t["eager_s"], t["kernels_s"], t["compiled_s"], same))


class _Forgetful(CompiledDecoder):
    """A plausible bug: a step that writes its key and value over the last prompt position instead of after it."""

    def step(self, token):
        self.cache.length = min(self.cache.length, self._prompt - 1) if hasattr(self, "_prompt") else self.cache.length
        return super().step(token)

    def prefill(self, prompt_ids):
        self._prompt = prompt_ids.shape[1]
        return super().prefill(prompt_ids)


@needs_compiler
@pytest.mark.counterfactual("C20", "CPU: a compiled step that never advances its cache (each token overwrites the "
                                   "same slot): fast, but not the eager path's tokens")
def test_c20_cpu_half_fails_when_the_compiled_path_gives_other_tokens(real_int4):
    model, chat, times = real_int4
    decoder = _Forgetful.__new__(_Forgetful)
    decoder.__dict__.update(times["decoder"].__dict__)  # the compiled step and cache of the real decoder, reused
    same = torch.equal(decoder.generate(chat, 32), generate_greedy(model, chat, 32).tokens)
    assert not same
    with pytest.raises(ClaimFailed, match="C20 FAILED.*NOT the same greedy tokens"):
        claim("C20", *overhead_evidence(0.0125, 0.006, 0.0085, same))  # the real step's times: only the tokens fail



@needs_compiler
@pytest.mark.counterfactual("C20", "CPU: an eager step already at its kernels' bound (two layers of 2,048 x 8,192 "
                                   "int4 matrices): compiling has no overhead to remove")
def test_c20_cpu_half_fails_for_a_step_at_its_kernels_bound(tmp_path):
    big = ScratchLlama.from_hf(random_llama(hidden_size=2048, intermediate_size=8192, num_hidden_layers=2,
                                            num_attention_heads=16, num_key_value_heads=4, vocab_size=512))
    model = pack(big, "int4")
    ids = torch.randint(3, 500, (1, 24), generator=torch.Generator().manual_seed(0))
    decoder = compile_times(model, ids, tmp_path, max_len=ids.shape[1] + 33)["decoder"]
    same = torch.equal(decoder.generate(ids, 32), generate_greedy(model, ids, 32).tokens)
    t = time_eager_and_compiled(model, decoder, ids)
    assert same
    with pytest.raises(ClaimFailed, match="C20 FAILED"):
        claim("C20", *overhead_evidence(t["eager_s"], t["kernels_s"], t["compiled_s"], same))


# --------------------------------------------------------------------------- the rest (they reset dynamo: run last)


@needs_compiler
def test_the_compile_record_gives_the_cold_figure_once_the_cache_holds_the_step(tmp_path, tiny_model):
    model = pack(ScratchLlama.from_hf(random_llama(hidden_size=64, intermediate_size=128)), "int4")
    ids = torch.tensor([[5, 6, 7, 8]])
    first = compile_times(model, ids, tmp_path, max_len=12)
    assert first["cold_measured_now"] and first["cold_s"] > 0 and first["warm_s"] > 0
    record = json.loads((tmp_path / c.RECORDS).read_text())
    assert [r["cold_s"] for r in record.values()] == [first["cold_s"]]
    # the folder holds the step: the warm compile only, the cold figure read back
    second = compile_times(model, ids, tmp_path, max_len=12)
    assert not second["cold_measured_now"] and second["cold_s"] == first["cold_s"]
    (tmp_path / c.RECORDS).write_text("{not json")  # a damaged record is measured again, not an error
    assert compile_times(model, ids, tmp_path, max_len=12)["cold_measured_now"]
    assert torch.equal(second["decoder"].generate(ids, 6), generate_greedy(model, ids, 6).tokens)


def test_no_cpp_compiler_is_one_sentence_and_no_decoder(monkeypatch, tiny_model):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    ok, why = compiler_status()
    assert not ok and "no C++ compiler" in why and "/nonexistent/g++" in why
    with pytest.raises(CourseError, match="Cannot compile the decode step: no C\\+\\+ compiler"):
        CompiledDecoder(ScratchLlama.from_hf(tiny_model), 16)
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert not compiler_status()[0]


@needs_compiler
def test_bad_input_is_refused_before_anything_runs(tiny_model):
    model = ScratchLlama.from_hf(tiny_model)
    for bad in (1, 0, 2.5, True, "16"):
        with pytest.raises(CourseError, match="max_len"):
            CompiledDecoder(model, bad)
    decoder = CompiledDecoder(model, 8)
    with pytest.raises(CourseError, match="prefill the prompt"):
        decoder.step(torch.tensor([[3]]))
    with pytest.raises(CourseError, match=r"\[1, seq\]"):
        decoder.prefill(torch.tensor([[3, 4], [5, 6]]))
    with pytest.raises(CourseError, match="do not fit"):
        decoder.prefill(torch.arange(3, 11)[None])
    with pytest.raises(CourseError, match="do not fit"):
        decoder.generate(torch.tensor([[3, 4, 5]]), 6)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(CourseError, match="new_tokens"):
            decoder.generate(torch.tensor([[3, 4, 5]]), bad)
    assert decoder.compile_s is None  # nothing was compiled by the refusals
    assert decoder.generate(torch.tensor([[3, 4, 5]]), 5).shape == (1, 5)
    with pytest.raises(CourseError, match="slots are full"):
        token = decoder.prefill(torch.tensor([[3, 4, 5]]))
        for _ in range(8):
            token = decoder.step(token)


def test_the_evidence_refuses_times_that_are_not_positive():
    for bad in (0.0, -1.0, float("nan"), None):
        with pytest.raises(CourseError, match="positive number of seconds"):
            overhead_evidence(0.012, bad, 0.008, True)
