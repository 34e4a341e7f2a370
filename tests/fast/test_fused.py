"""Fused projections (fused.py): the same logits and tokens as the plain model, fewer matmul calls."""

from __future__ import annotations

import pytest
import torch

from llm_anatomy.generate.decode import StaticDecoder, generate_greedy
from llm_anatomy.errors import CourseError
from llm_anatomy.fast.fused import Projection, compile_step, fuse, matmuls_per_layer, sdpa_attend
from llm_anatomy.measure.overhead import count_ops
from llm_anatomy.model.scratch import ScratchLlama
from llm_anatomy.fast.tiled_attention import tiled_attention

from llm_anatomy.weights.random import random_llama


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


def _ids(batch, seq, seed=0):
    return torch.randint(3, 128, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("layout", ["out_in", "in_out"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_fused_model_equals_the_plain_one_and_transformers(layout, kv_heads):
    hf = random_llama(num_key_value_heads=kv_heads, tie_word_embeddings=False)
    plain = ScratchLlama.from_hf(hf)
    fast = fuse(plain, layout)
    ids = _ids(2, 17)
    with torch.no_grad():
        assert (fast(ids) - plain(ids)).abs().max() < 1e-5
        assert (fast(ids) - hf(ids).logits).abs().max() < 1e-5
    assert torch.equal(generate_greedy(fast, ids, 12).tokens, generate_greedy(plain, ids, 12).tokens)
    mask = torch.ones(2, 17, dtype=torch.long)
    mask[0, :5] = 0  # left padding goes through the fused model too
    with torch.no_grad():
        assert (fast(ids, attention_mask=mask)[1] - plain(ids, attention_mask=mask)[1]).abs().max() < 1e-5


def test_fusing_concatenates_once_and_shares_the_rest():
    plain = ScratchLlama.from_hf(random_llama())
    fast = fuse(plain)
    attn, mlp = fast.layers[1].self_attn, fast.layers[1].mlp
    q, k, v = attn.qkv_proj.weight.split(attn.sizes)
    assert torch.equal(q, plain.layers[1].self_attn.q_proj.weight) and torch.equal(v, plain.layers[1].self_attn.v_proj.weight)
    gate, up = mlp.gate_up_proj.weight.chunk(2)
    assert torch.equal(gate, plain.layers[1].mlp.gate_proj.weight) and torch.equal(up, plain.layers[1].mlp.up_proj.weight)
    assert fast.embed_tokens is plain.embed_tokens and fast.lm_head is plain.lm_head
    assert fast.norm.weight is plain.norm.weight and fast.layers[0].input_layernorm.weight is plain.layers[0].input_layernorm.weight
    transposed = fuse(plain, "in_out")
    assert transposed.lm_head.weight.shape == (64, 128)  # [in, out]: the LM head is stored the other way round
    assert torch.equal(transposed.lm_head.weight.T, plain.lm_head.weight)
    assert (matmuls_per_layer(plain), matmuls_per_layer(fast)) == (7, 4)


def test_the_fused_step_dispatches_fewer_matmuls(tiny_model):
    plain = ScratchLlama.from_hf(tiny_model)
    fast = fuse(plain)
    ids = _ids(1, 6)
    mms = lambda ops: ops["mm"] + ops["addmm"] + ops["bmm"] + ops["linear"]  # noqa: E731
    plain_ops = count_ops(lambda: generate_greedy(plain, ids, 3))
    fast_ops = count_ops(lambda: generate_greedy(fast, ids, 3))
    layers = plain.cfg.num_layers
    assert mms(plain_ops) - mms(fast_ops) == 3 * layers * 3  # 3 model calls x 2 layers x 3 fewer matmuls


def test_fused_model_runs_the_fixed_shape_step_and_tiled_attention(tiny_model):
    plain = ScratchLlama.from_hf(tiny_model)
    ids = _ids(2, 5)
    decoder = StaticDecoder(fuse(plain, "in_out"), batch=2, max_len=16)
    assert torch.equal(decoder.generate(ids, 8), generate_greedy(plain, ids, 8).tokens)
    tiled = fuse(plain, attend=lambda *a, **kw: tiled_attention(*a, block_q=4, block_k=3, **kw))
    with torch.no_grad():
        assert (tiled(_ids(1, 23)) - plain(_ids(1, 23))).abs().max() < 1e-5
    with pytest.raises(CourseError, match="weights"):
        tiled.trace(_ids(1, 4), attention_layers=(0,))


def test_the_fused_model_runs_torchs_fused_attention_with_padding_and_a_cache(tiny_model):
    plain = ScratchLlama.from_hf(tiny_model)
    fast = fuse(plain, attend=sdpa_attend)
    ids = _ids(2, 9)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0  # left padding: SDPA gets a boolean mask, not is_causal
    with torch.no_grad():
        assert (fast(ids) - plain(ids)).abs().max() < 1e-5
        assert (fast(ids, attention_mask=mask)[1] - plain(ids, attention_mask=mask)[1]).abs().max() < 1e-5
    assert torch.equal(generate_greedy(fast, ids, 6).tokens, generate_greedy(plain, ids, 6).tokens)  # one query a step
    with pytest.raises(CourseError, match="keeps no attention weights"):
        fast.trace(_ids(1, 4), attention_layers=(0,))


def test_bad_input_is_refused_clearly(tiny_model):
    plain = ScratchLlama.from_hf(tiny_model)
    with pytest.raises(CourseError, match="layout"):
        fuse(plain, "rows")
    with pytest.raises(CourseError, match="ScratchLlama"):
        fuse(tiny_model)
    with pytest.raises(CourseError, match="layout"):
        Projection(torch.ones(2, 2), "columns")


def test_compile_finds_the_host_sync_in_the_range_check():
    """torch.compile stops at `int(input_ids.max())`, the token-id range check: a value read back to the host.
    The fixed-shape step has no such read. (A backend that only traces keeps this test quick.)"""
    import torch._dynamo as dynamo

    plain = ScratchLlama.from_hf(random_llama())
    ids = _ids(1, 1)
    with torch.no_grad():
        explained = dynamo.explain(lambda: plain(ids))()
    assert explained.graph_break_count >= 1
    decoder = StaticDecoder(plain, batch=1, max_len=8)
    decoder.prefill(_ids(1, 3))
    with torch.inference_mode():
        assert dynamo.explain(decoder._step)().graph_break_count == 0
    dynamo.reset()


def test_compile_step_reports_time_and_graph_breaks():
    import torch._dynamo as dynamo

    def step():
        return torch.ones(3) * 2

    compiled, seconds, breaks = compile_step(step, backend="eager")  # tracing only: quick, no C++ compiler
    assert seconds > 0 and breaks == 0 and torch.equal(compiled(), torch.ones(3) * 2)

    def syncs():
        return torch.ones(3) * int(torch.ones(1).sum())  # int(tensor): a value read back to the host

    assert compile_step(syncs, backend="eager")[2] >= 1
    state = torch.zeros(2)  # a buffer the step mutates in place, as a StaticDecoder's cache and pos

    def bump():
        state.add_(1)

    compiled, _, breaks = compile_step(bump, backend="eager", static=(state,))
    compiled()
    assert breaks == 0 and torch.equal(state, torch.full((2,), 3.0))  # explain, the warm-up call, and this one
    from llm_anatomy.fast.fused import cudagraph_skips

    assert cudagraph_skips() >= 0  # the counter exists in this PyTorch (no CUDA graphs on a CPU to count)
    dynamo.reset()


def test_real_fused_greedy_equals_transformers(real, real_scratch, story_prompt, greedy_reference):
    from llm_anatomy.generate.decode import greedy_tokens

    fast = fuse(real_scratch, "in_out")
    # transformers' 32 greedy tokens: the first 32 of the 128-token reference test_scratch checks (run once for both)
    theirs = greedy_reference(story_prompt, 128)[:32]
    ours = greedy_tokens(fast, story_prompt, 32, eos_token_id=real.model.generation_config.eos_token_id)
    assert ours == theirs, (ours, theirs)
    with torch.no_grad():
        ids = story_prompt[:, :20]
        assert (fast(ids) - real.model(ids).logits).abs().max() < 1e-4


# --------------------------------------------------------------------------- C20's checks, true and false worlds


def _fusion_check(plain, variants):
    from llm_anatomy.claims import claim
    from llm_anatomy.fast.fused import fusion_evidence

    ids = _ids(1, 10)

    def ops(m):
        cache = m.new_cache(1, 11)
        with torch.inference_mode():
            m(ids, cache=cache)
            return sum(count_ops(lambda: m(ids[:, -1:], cache=cache)).values())
    return claim("C20", *fusion_evidence(plain, variants, ids, ops(plain), ops(next(iter(variants.values()))),
                                         new_tokens=12))


def test_the_fusion_check_holds(tiny_model):
    plain = ScratchLlama.from_hf(tiny_model)
    _fusion_check(plain, {"fused": fuse(plain), "fused, [in, out]": fuse(plain, "in_out")})


@pytest.mark.counterfactual("C20", "a fusion that concatenates gate and up in the wrong order ([up | gate])")
def test_the_fusion_check_fails_with_gate_and_up_swapped(tiny_model):
    from llm_anatomy.claims import ClaimFailed
    from llm_anatomy.fast.fused import Projection as P

    plain = ScratchLlama.from_hf(tiny_model)
    wrong = fuse(plain)
    for ours, theirs in zip(wrong.layers, plain.layers):
        ours.mlp.gate_up_proj = P(torch.cat([theirs.mlp.up_proj.weight, theirs.mlp.gate_proj.weight]))
    with pytest.raises(ClaimFailed, match="C20 FAILED"):
        _fusion_check(plain, {"fused": wrong})


@pytest.mark.counterfactual("C20", "a 'fused' model that fuses nothing (the plain model: 7 matmuls, as many ops)")
def test_the_fusion_check_fails_when_nothing_is_fused(tiny_model):
    from llm_anatomy.claims import ClaimFailed

    plain = ScratchLlama.from_hf(tiny_model)
    with pytest.raises(ClaimFailed, match="C20 FAILED"):
        _fusion_check(plain, {"fused": plain})


def test_the_graph_break_check_holds_and_fails_with_a_host_read_in_the_step():
    import torch._dynamo as dynamo

    from llm_anatomy.claims import ClaimFailed, claim
    from llm_anatomy.fast.fused import graph_break_evidence

    plain = ScratchLlama.from_hf(random_llama())
    decoder = StaticDecoder(plain, batch=1, max_len=8)
    decoder.prefill(_ids(1, 3))
    with torch.no_grad():
        model_breaks = dynamo.explain(lambda: plain(_ids(1, 1)))().graph_break_count
    with torch.inference_mode():
        static_breaks = dynamo.explain(decoder._step)().graph_break_count

        def step_with_a_host_read():  # a fixed-shape step that checks the token's range on the host
            if int(decoder.token.max()) >= plain.cfg.vocab_size:
                raise ValueError("token out of range")
            decoder._step()
        read_breaks = dynamo.explain(step_with_a_host_read)().graph_break_count
    dynamo.reset()
    claim("C20", *graph_break_evidence(model_breaks, static_breaks))
    with pytest.raises(ClaimFailed, match="C20 FAILED"):
        claim("C20", *graph_break_evidence(model_breaks, read_breaks))


@pytest.mark.counterfactual("C20", "a fixed-shape step that reads a value back to the host (its graph breaks)")
def test_the_graph_break_check_fails_for_a_step_with_a_host_read():
    from llm_anatomy.claims import ClaimFailed, claim
    from llm_anatomy.fast.fused import graph_break_evidence

    with pytest.raises(ClaimFailed, match="C20 FAILED"):
        claim("C20", *graph_break_evidence(model_call_breaks=3, static_step_breaks=1))
    with pytest.raises(ClaimFailed, match="C20 FAILED"):  # a model call without its host read: nothing to show
        claim("C20", *graph_break_evidence(model_call_breaks=0, static_step_breaks=0))


@pytest.mark.counterfactual("C20", "GPU: a 'replay' that relaunches every kernel, as fast as eager (timed on the CPU)")
def test_the_replay_check_fails_when_replay_is_eager_relabelled():
    """The GPU cell's check, on timings this CPU can make: the same step timed twice, in turns, as "eager" and as
    "replay", is never 0.8x of itself; a step that does a fifth of the work passes."""
    from llm_anatomy.claims import ClaimFailed, claim
    from llm_anatomy.fast.fused import replay_evidence
    from llm_anatomy.measure.timing import time_interleaved

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    step = lambda: a @ b  # noqa: E731
    fifth = lambda: a[:, :48] @ b[:48]  # noqa: E731
    t = {n: s.min_s for n, s in time_interleaved({"eager": step, "replay": step, "fast": fifth}, warmup=2,
                                                 repeats=20).items()}
    with pytest.raises(ClaimFailed, match="C20 FAILED"):
        claim("C20", *replay_evidence(t["eager"], t["replay"]))
    claim("C20", *replay_evidence(t["eager"], t["fast"]))
    with pytest.raises(CourseError):
        replay_evidence(0.0, 1e-3)


def test_the_matmuls_hold_most_of_the_real_models_cpu_step(real_scratch):
    from llm_anatomy.claims import claim
    from llm_anatomy.fast.packed import one_step
    from llm_anatomy.measure.overhead import matmul_share, matmul_share_evidence

    with torch.inference_mode():
        claim("C20", *matmul_share_evidence(*matmul_share(one_step(real_scratch, _ids(1, 20)))))


@pytest.mark.counterfactual("C20", "CPU: a step bound by its ops' dispatch, not its matmuls (a tiny model)")
def test_the_matmul_share_check_fails_for_a_dispatch_bound_step(tiny_model):
    from llm_anatomy.claims import ClaimFailed, claim
    from llm_anatomy.fast.packed import one_step
    from llm_anatomy.measure.overhead import matmul_share, matmul_share_evidence

    with torch.inference_mode(), pytest.raises(ClaimFailed, match="C20 FAILED"):
        claim("C20", *matmul_share_evidence(*matmul_share(one_step(ScratchLlama.from_hf(tiny_model), _ids(1, 4)))))
