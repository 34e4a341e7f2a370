"""The claim cells of notebooks 01-04 (and 06's C9), run as the notebook holds them (on the real model where they
read it): each holds, and each fails (ClaimFailed) when its evidence is broken on purpose (tests/test_claims.py shows
the same for a whole notebook run).

Each claim cell here imports what it uses and reads only a few names the notebook made above it (the model, the
prompt's ids), so a test can run the cell's own source with those names and a piece of the evidence swapped."""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import pytest
import torch

from llm_anatomy.claims import ClaimFailed, claim
from llm_anatomy.model import ablations
from llm_anatomy.model.scratch import ScratchLlama

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def cell_source(notebook: str, needle: str) -> str:
    """The source of the one code cell of `notebook` that contains `needle`."""
    cells = json.loads((NOTEBOOKS / notebook).read_text())["cells"]
    found = [c for c in cells if c["cell_type"] == "code" and needle in "".join(c["source"])]
    assert len(found) == 1, f"{notebook}: {len(found)} code cells contain {needle!r}"
    return "".join(found[0]["source"])


def run_cell(source: str, **names) -> dict:
    namespace = {"claim": claim, "torch": torch, **names}
    with torch.no_grad():
        exec(compile(source, "<claim cell>", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def course(real):
    model = real.model if real.dtype == torch.float32 else copy.deepcopy(real.model).float()
    return dict(model=model, scratch=ScratchLlama.from_hf(model), tok=real.tokenizer, loaded=real)


def _ids(course, text):
    return course["tok"](text, return_tensors="pt").input_ids  # [1, seq]


# 04 · C5: the grouping that matches transformers is h // 3, not h % 3; repeat_kv's copies change nothing
GQA = ("04_forward_pass.ipynb", 'claim("C5"')


def _gqa_names(course):
    ids = _ids(course, "The capital of France is")
    return dict(course, ids=ids, reference=course["model"](ids))  # the notebook's pass, made in the block-by-hand cell


def test_04_gqa_ablation_holds(course):
    namespace = run_cell(cell_source(*GQA), **_gqa_names(course))
    assert namespace["wrong_change"] > 0.1 and namespace["copy_change"] <= 1e-5


@pytest.mark.counterfactual("C5", "GQA groups query heads h % 3 instead of the checkpoint's h // 3")
def test_04_gqa_ablation_fails_when_the_wrong_grouping_is_the_true_one(course, monkeypatch):
    real_read = ablations.kv_heads_read
    heads, kv = course["scratch"].cfg.num_heads, course["scratch"].cfg.num_kv_heads
    monkeypatch.setattr(ablations, "kv_heads_read",
                        lambda model, _: real_read(model, [h // (heads // kv) for h in range(heads)]))
    with pytest.raises(ClaimFailed, match="C5 FAILED"):
        run_cell(cell_source(*GQA), **_gqa_names(course))


@pytest.mark.counterfactual("C5", "repeat_kv tiles the K/V heads (head h reads h % 3)")
def test_04_gqa_ablation_fails_when_the_copy_deals_the_heads_out_wrongly(course, monkeypatch):
    monkeypatch.setattr(ablations, "repeat_kv", lambda x, n_rep: x.repeat(1, n_rep, 1, 1))  # tiles: head h gets h % 3
    with pytest.raises(ClaimFailed, match="C5 FAILED"):
        run_cell(cell_source(*GQA), **_gqa_names(course))


def test_04_gqa_ablation_refuses_a_change_that_never_reaches_the_model(course, monkeypatch):
    monkeypatch.setattr(ablations, "_attention_replaced", lambda model, replacement: contextlib.nullcontext([]))
    with pytest.raises(Exception, match="reached 0 attention calls"):
        run_cell(cell_source(*GQA), **_gqa_names(course))


# 03 · C9 over the whole model: with the mask, cached decode is the full pass; without it, they part from block 1 on
CACHE = ("03_attention.ipynb", "cached_vs_full(scratch32, ids, masked=True)")


def _cache_names(course):
    return dict(model=course["model"], loaded=course["loaded"],
                ids=_ids(course, "The cat sat on the mat because it was tired."))


def test_03_whole_model_mask_claim_holds(course):
    namespace = run_cell(cell_source(*CACHE), **_cache_names(course))
    assert namespace["off"].per_layer[0] <= 1e-4 < namespace["off"].per_layer[1]


@pytest.mark.counterfactual("C9", "an ablation that switches the mask off but changes nothing")
def test_03_whole_model_mask_claim_fails_when_switching_the_mask_off_changes_nothing(course, monkeypatch):
    monkeypatch.setattr(ablations, "mask_off", lambda model: contextlib.nullcontext([1] * 3 * model.cfg.num_layers))
    with pytest.raises(ClaimFailed, match="C9 FAILED"):
        run_cell(cell_source(*CACHE), **_cache_names(course))


@pytest.mark.counterfactual("C9", "a model whose attention has no causal mask (03)")
def test_03_whole_model_mask_claim_fails_for_a_model_without_a_causal_mask(course, monkeypatch):
    from llm_anatomy.model import scratch as scratch_module

    real_attention = scratch_module.attention
    monkeypatch.setattr(scratch_module, "attention", lambda q, k, v, **kw: real_attention(q, k, v, **{**kw, "causal": False}))
    with pytest.raises(ClaimFailed, match="C9 FAILED"):
        run_cell(cell_source(*CACHE), **_cache_names(course))


# 06 · C9 again where the cache is built: the same whole-model comparison on notebook 06's prompt
CACHE_06 = ("06_kv_cache.ipynb", "cached_vs_full(model32, prompt, masked=True)")


def _cache_06_names(course):
    return dict(model=course["scratch"], loaded=course["loaded"], ScratchLlama=ScratchLlama,
                prompt=_ids(course, "The three most useful things about a cache are"))


def test_06_whole_model_mask_claim_holds(course):
    namespace = run_cell(cell_source(*CACHE_06), **_cache_06_names(course))
    assert max(namespace["on"].per_layer) <= 1e-4 and namespace["off"].per_layer[0] <= 1e-4
    assert min(namespace["off"].per_layer[1:]) > 1e-3


@pytest.mark.counterfactual("C9", "06: a mask ablation that changes nothing")
def test_06_whole_model_mask_claim_fails_when_switching_the_mask_off_changes_nothing(course, monkeypatch):
    monkeypatch.setattr(ablations, "mask_off", lambda model: contextlib.nullcontext([1] * 3 * model.cfg.num_layers))
    with pytest.raises(ClaimFailed, match="C9 FAILED"):
        run_cell(cell_source(*CACHE_06), **_cache_06_names(course))


@pytest.mark.counterfactual("C9", "06: a model without a causal mask")
def test_06_whole_model_mask_claim_fails_for_a_model_without_a_causal_mask(course, monkeypatch):
    from llm_anatomy.model import scratch as scratch_module

    real_attention = scratch_module.attention
    monkeypatch.setattr(scratch_module, "attention", lambda q, k, v, **kw: real_attention(q, k, v, **{**kw, "causal": False}))
    with pytest.raises(ClaimFailed, match="C9 FAILED"):
        run_cell(cell_source(*CACHE_06), **_cache_06_names(course))


# 03 · C5: the heads of one layer look for different relations (per-head statistics, deterministic in fp32)
HEADS = ("03_attention.ipynb", "to_previous, to_itself = int(previous.argmax())")


def _heads_names(course, weights=None):
    text_ids = _ids(course, "The cat sat on the mat because it was tired. The cat")
    w = course["scratch"].attention_weights(text_ids, 11)[0] if weights is None else weights  # [9, seq, seq]
    return dict(w=w, H=course["scratch"].cfg.num_heads, layer=11)


def test_03_head_statistics_claim_holds(course):
    namespace = run_cell(cell_source(*HEADS), **_heads_names(course))
    assert namespace["to_previous"] != namespace["to_itself"]


@pytest.mark.counterfactual("C5", "every head of the layer looks alike (one head copied, or uniform weights)")
def test_03_head_statistics_claim_fails_when_every_head_looks_alike(course):
    w = _heads_names(course)["w"]
    alike = w[1:2].expand_as(w).clone()  # every head a copy of head 1
    with pytest.raises(ClaimFailed, match="C5 FAILED"):
        run_cell(cell_source(*HEADS), **_heads_names(course, alike))
    seq = w.shape[-1]
    uniform = torch.ones(seq, seq).tril()
    uniform = (uniform / uniform.sum(-1, keepdim=True)).expand_as(w)  # every query spreads its weight evenly
    with pytest.raises(ClaimFailed, match="C5 FAILED"):
        run_cell(cell_source(*HEADS), **_heads_names(course, uniform))


# 02 · C3 on the model: shifted positions leave a layer's attention weights, swapped tokens change them
SHIFT = ("02_embeddings_and_positions.ipynb", "positions_shifted(scratch32, shift)")


def _shift_names(course):
    return dict(model=course["model"], loaded=course["loaded"], tok=course["tok"], scratch32=course["scratch"],
                print=lambda *a, **k: None)


def test_02_shifted_positions_claim_holds(course):
    namespace = run_cell(cell_source(*SHIFT), **_shift_names(course))
    assert namespace["shift_change"] <= 1e-4 < 1e-2 < namespace["swap_change"]
    assert namespace["blind"] <= 1e-5 < 1e-2 < namespace["rope_alone"]


@pytest.mark.counterfactual("C3", "no rotary embedding: only the causal mask sees order")
def test_02_swap_claim_fails_for_a_model_without_rope_where_only_the_mask_sees_order(course, monkeypatch):
    from llm_anatomy.model import scratch as scratch_module

    # no rotation anywhere: a swap still changes the weights (the causal mask), but with the mask off it is only a
    # reordering, which is what the claim's control must catch
    monkeypatch.setattr(scratch_module, "apply_rope", lambda x, cos, sin: x)
    with pytest.raises(ClaimFailed, match="C3 FAILED"):
        run_cell(cell_source(*SHIFT), **_shift_names(course))


@pytest.mark.counterfactual("C3", "an absolute position signal added to q and k (a learned position table)")
def test_02_shifted_positions_claim_fails_for_a_model_that_reads_absolute_positions(course, monkeypatch):
    from llm_anatomy.model import scratch as scratch_module

    real_rope = scratch_module.apply_rope
    # an absolute position signal added to queries and keys, as a learned position table would add one
    monkeypatch.setattr(scratch_module, "apply_rope", lambda x, cos, sin: real_rope(x, cos, sin) + cos)
    with pytest.raises(ClaimFailed, match="C3 FAILED"):
        run_cell(cell_source(*SHIFT), **_shift_names(course))


def test_02_shifted_positions_claim_refuses_a_shift_that_never_reached_the_model(course, monkeypatch):
    monkeypatch.setattr(ablations, "positions_shifted", lambda model, shift: contextlib.nullcontext([]))
    with pytest.raises(Exception, match="reached 0 forward passes"):
        run_cell(cell_source(*SHIFT), **_shift_names(course))


# 02 · C3: the pairing is the checkpoint's: the model's loss on a real passage with every layer turning the wrong
# pairs; before it, one score by hand (interleaved RoPE on permuted rows is rotate-half's score: arithmetic)
PAIRING = ("02_embeddings_and_positions.ipynb", "interleaved on the permuted rows")
PAIRING_LOSS = ("02_embeddings_and_positions.ipynb", "ablations.rope_interleaved(scratch32)")


def _pairing_names(course):
    from llm_anatomy.model.embeddings import embedding_table
    from llm_anatomy.model.rope import rope_frequencies

    cfg, model = course["loaded"].config, course["model"]
    attn0, norm0 = model.model.layers[0].self_attn, model.model.layers[0].input_layernorm
    emb = embedding_table(course["loaded"])[course["tok"].encode(" cat", add_special_tokens=False)[0]].float()
    h = emb * torch.rsqrt(emb.pow(2).mean() + norm0.variance_epsilon) * norm0.weight.float()  # as the notebook's RMSNorm
    head_dim, theta = cfg.head_dim, cfg.rope_parameters["rope_theta"]
    return dict(attn0=attn0, h=h, head_dim=head_dim, theta=theta, freqs=rope_frequencies(head_dim, theta),
                q_cat=attn0.q_proj.weight[:head_dim].float() @ h, model=model, loaded=course["loaded"],
                tok=course["tok"], cfg=cfg, print=lambda *a, **k: None)


def test_02_one_score_by_hand_reorders_the_same_arithmetic(course):
    namespace = run_cell(cell_source(*PAIRING), **_pairing_names(course))
    half, permuted, wrong = namespace["half"], namespace["permuted"], namespace["wrong"]
    assert abs(half - permuted) <= 1e-6 * abs(half) and abs(wrong - half) > 1e-2 * abs(half)


def test_02_pairing_claim_holds_on_the_passage(course):
    namespace = run_cell(cell_source(*PAIRING_LOSS), **_pairing_names(course))
    assert namespace["wrong_pairs"] > namespace["right_pairs"] + 1.0


@pytest.mark.counterfactual("C3", "RoPE's pairing of dimensions does not matter to the model")
def test_02_pairing_claim_fails_when_the_wrong_pairing_costs_the_model_nothing(course, monkeypatch):
    @contextlib.contextmanager
    def reaches_but_changes_nothing(model):
        yield [1] * (2 * model.cfg.num_layers)

    monkeypatch.setattr(ablations, "rope_interleaved", reaches_but_changes_nothing)
    with pytest.raises(ClaimFailed, match="C3 FAILED"):
        run_cell(cell_source(*PAIRING_LOSS), **_pairing_names(course))


# 03 · an induction head: from the second " cat", one head looks at the token after the first " cat"
INDUCTION = ("03_attention.ipynb", "after_first = where[0] + 1")


def _induction_names(course, text):
    from llm_anatomy.views.labels import token_labels

    text_ids = _ids(course, text)
    scratch, cfg = course["scratch"], course["loaded"].config
    traced = scratch.trace(text_ids, keep_hidden=False, attention_layers=range(cfg.num_hidden_layers),
                           logits_to_keep=1)  # made in the section's first cell, as the notebook makes it
    return dict(tok=course["tok"], scratch=scratch, cfg=cfg, text_ids=text_ids, traced=traced,
                text_names=token_labels(course["tok"], text_ids[0]), H=scratch.cfg.num_heads)


def test_03_induction_head_claim_holds(course):
    namespace = run_cell(cell_source(*INDUCTION),
                         **_induction_names(course, "The cat sat on the mat because it was tired. The cat"))
    assert namespace["row"][namespace["after_first"]] > 0.5


@pytest.mark.counterfactual("C5", "nothing repeated: no earlier token for a head to copy from")
def test_03_induction_head_claim_fails_when_nothing_is_repeated(course):
    with pytest.raises(ClaimFailed, match="C5 FAILED"):  # one " cat" only: there is nothing to copy from
        run_cell(cell_source(*INDUCTION), **_induction_names(course, "The cat sat on the mat because it was tired. The dog"))


def test_03_induction_head_copies_whatever_followed_last_time(course):
    # what makes it an induction head: after a different context, the second " cat" still looks at " sat"
    namespace = run_cell(cell_source(*INDUCTION), **_induction_names(course, "The cat sat on the mat. A dog ran, cat"))
    assert namespace["text_names"][namespace["after_first"]] == "·sat"


# 03 · C5: induction heads by the standard test (random tokens said twice, every head scored against a control that
# never repeats), and silencing the best head costs the repeated half more than silencing its layer's other heads
STANDARD_INDUCTION = ("03_attention.ipynb", "induction_scores(rand_traced, LENGTH)")


def _standard_induction_names(course):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return dict(tok=course["tok"], scratch=course["scratch"], cfg=course["loaded"].config,
                loaded=course["loaded"], H=course["scratch"].cfg.num_heads, plt=plt, print=lambda *a, **k: None)


def test_03_standard_induction_claim_holds(course):
    namespace = run_cell(cell_source(*STANDARD_INDUCTION), **_standard_induction_names(course))
    assert namespace["best"] > 0.5 and namespace["without_best"] > namespace["second_half_loss"]["repeated"]
    assert max(namespace["without_random"]) < namespace["without_copiers"]


@pytest.mark.counterfactual("C5", "random tokens that never repeat (no induction to find)")
def test_03_standard_induction_claim_fails_when_nothing_repeats(course, monkeypatch):
    from llm_anatomy.model import explore

    real = explore.repeated_random_tokens
    monkeypatch.setattr(explore, "repeated_random_tokens", lambda *a, **k: real(*a, **{**k, "repeat": False}))
    with pytest.raises(ClaimFailed, match="C5 FAILED"):
        run_cell(cell_source(*STANDARD_INDUCTION), **_standard_induction_names(course))


@pytest.mark.counterfactual("C5", "silencing the induction heads costs nothing")
def test_03_standard_induction_claim_fails_when_silencing_the_head_changes_nothing(course, monkeypatch):
    import contextlib

    from llm_anatomy.model import ablations

    @contextlib.contextmanager
    def reaches_but_changes_nothing(model, heads):
        yield [1] * len({layer for layer, _ in heads})

    monkeypatch.setattr(ablations, "heads_ablated", reaches_but_changes_nothing)
    with pytest.raises(ClaimFailed, match="C5 FAILED"):
        run_cell(cell_source(*STANDARD_INDUCTION), **_standard_induction_names(course))


@pytest.mark.counterfactual("C5", "silencing any heads costs as much as silencing the copiers (whole layers silenced)")
def test_03_standard_induction_claim_fails_when_any_silenced_heads_cost_as_much(course, monkeypatch):
    from llm_anatomy.model import ablations

    real = ablations.heads_ablated
    H = course["scratch"].cfg.num_heads
    # a bug that silences each named head's whole layer: random non-copying heads then cost as much as the copiers
    monkeypatch.setattr(ablations, "heads_ablated",
                        lambda model, heads: real(model, sorted({(l, h) for l, _ in heads for h in range(H)})))
    with pytest.raises(ClaimFailed, match="C5 FAILED"):
        run_cell(cell_source(*STANDARD_INDUCTION), **_standard_induction_names(course))


# 02 · C2: one-hot times the table is the lookup, and so are the library's one_hot_lookup and the model's layer
LOOKUP = ("02_embeddings_and_positions.ipynb", 'claim("C2"')


def _lookup_names(course):
    from llm_anatomy.model.embeddings import embedding_table

    table = embedding_table(course["loaded"])
    return dict(table=table, ids=course["tok"].encode("The cat sat", add_special_tokens=False), model=course["model"])


def test_02_lookup_claim_holds(course):
    namespace = run_cell(cell_source(*LOOKUP), **_lookup_names(course))
    assert torch.equal(namespace["by_index"], namespace["layer"])


@pytest.mark.counterfactual("C2", "the embedding layer or one-hot product reads another row")
def test_02_lookup_claim_fails_when_the_library_or_the_layer_reads_another_row(course, monkeypatch):
    from types import SimpleNamespace

    from llm_anatomy.model import embeddings

    names = _lookup_names(course)
    table = names["table"]
    shifted = SimpleNamespace(model=SimpleNamespace(embed_tokens=lambda ids: table[(ids + 1) % table.shape[0]]))
    with pytest.raises(ClaimFailed, match="C2 FAILED"):  # a layer that reads the next row
        run_cell(cell_source(*LOOKUP), **{**names, "model": shifted})
    monkeypatch.setattr(embeddings, "one_hot_lookup", lambda ids, t: t[ids] * 1.001)  # not the row itself
    with pytest.raises(ClaimFailed, match="C2 FAILED"):
        run_cell(cell_source(*LOOKUP), **names)


# 02 · C3: RoPE by hand, the library's and transformers' agree; only the offset sets the score
ROPE = ("02_embeddings_and_positions.ipynb", "library_vs_theirs = (library - theirs)")
OFFSET = ("02_embeddings_and_positions.ipynb", "offset3 = [score(m + 3, m)")


def _rope_names(course, apply=None):
    from llm_anatomy.model import rope

    cfg = course["loaded"].config
    names = dict(model=course["model"], loaded=course["loaded"], head_dim=cfg.head_dim,
                 theta=cfg.rope_parameters["rope_theta"], rope_cos_sin=rope.rope_cos_sin,
                 apply_rope=apply or rope.apply_rope, freqs=rope.rope_frequencies(cfg.head_dim,
                                                                                  cfg.rope_parameters["rope_theta"]))
    exec(compile(cell_source("02_embeddings_and_positions.ipynb", "def rope_by_hand"), "<cell>", "exec"),
         {"torch": torch, "print": lambda *a, **k: None, **names}, names)  # the notebook's own x, pos and mine
    return names


def test_02_rope_claim_holds(course):
    namespace = run_cell(cell_source(*ROPE), **_rope_names(course))
    assert namespace["library_vs_theirs"] <= 1e-5


@pytest.mark.counterfactual("C3", "our RoPE turns each pair by -angle")
def test_02_rope_claim_fails_when_the_library_turns_the_other_way(course):
    from llm_anatomy.model import rope

    backwards = lambda x, cos, sin: rope.apply_rope(x, cos, -sin)  # noqa: E731: every pair turned by -angle
    with pytest.raises(ClaimFailed, match="C3 FAILED"):
        run_cell(cell_source(*ROPE), **_rope_names(course, backwards))


@pytest.mark.counterfactual("C3", "absolute positions added, or no rotation: q.k does not depend on the offset alone")
def test_02_offset_claim_holds_and_fails_for_absolute_positions_or_no_rotation(course):
    from llm_anatomy.model import rope

    run_cell(cell_source(*OFFSET), **_rope_names(course))
    absolute = lambda x, cos, sin: rope.apply_rope(x, cos, sin) + cos  # noqa: E731: a position added, not turned
    with pytest.raises(ClaimFailed, match="C3 FAILED"):
        run_cell(cell_source(*OFFSET), **_rope_names(course, absolute))
    with pytest.raises(ClaimFailed, match="C3 FAILED"):  # no rotation: every offset gives the same score
        run_cell(cell_source(*OFFSET), **_rope_names(course, lambda x, cos, sin: x))


# 03 · C4, C9 (layer 0) and C5 (the grouping): the notebook's own cells, from the hook on layer 0 to the claims
NB03 = "03_attention.ipynb"
LAYER0 = ["caught = {}", "def one_head(q, k, v):", "head, kv_head = 0, 0", 'claim("C4", layer_diff']


@pytest.fixture(scope="module")
def layer0(course):
    import math

    loaded = course["loaded"]
    namespace = dict(model=course["model"], tok=course["tok"], cfg=loaded.config, loaded=loaded, math=math,
                     copy=copy)
    for needle in LAYER0:
        namespace = run_cell(cell_source(NB03, needle), **namespace)
    return namespace


def test_03_layer_claims_hold(layer0):
    run_cell(cell_source(NB03, 'claim("C9", relative[True]'), **layer0)
    namespace = run_cell(cell_source(NB03, "gqa_diff = (per_head"), **layer0)
    assert namespace["gqa_diff"] <= 1e-5 and layer0["layer_diff"] <= 1e-4


@pytest.mark.counterfactual("C4", "the library's attention layer looks ahead (no causal mask)")
def test_03_layer_claim_c4_fails_when_the_library_layer_looks_ahead(layer0, monkeypatch):
    from llm_anatomy.model import attention as attention_module

    real = attention_module.attention
    monkeypatch.setattr(attention_module, "attention", lambda q, k, v, causal=True, **kw: real(q, k, v, causal=False))
    with pytest.raises(ClaimFailed, match="C4 FAILED"):
        run_cell(cell_source(NB03, 'claim("C4", layer_diff'), **layer0)


@pytest.mark.counterfactual("C4", "attention without the 1/sqrt(head_dim) scale, or softmax over the queries")
def test_03_layer_claim_c4_fails_without_the_scale_or_with_softmax_over_the_wrong_axis(layer0, monkeypatch):
    from llm_anatomy.model import attention as attention_module

    real = attention_module.attention
    unscaled = lambda q, k, v, causal=True, **kw: real(q * q.shape[-1] ** 0.5, k, v, causal=causal)  # noqa: E731
    monkeypatch.setattr(attention_module, "attention", unscaled)  # the cell imports it from the library
    with pytest.raises(ClaimFailed, match="C4 FAILED"):
        run_cell(cell_source(NB03, 'claim("C4", layer_diff'), **layer0)

    def over_queries(q, k, v, causal=True, **kw):  # each KEY's weights sum to 1, not each query's
        scores = q @ attention_module.repeat_kv(k, q.shape[1] // k.shape[1]).transpose(-1, -2) / q.shape[-1] ** 0.5
        n = q.shape[-2]
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        return torch.softmax(scores, dim=-2).nan_to_num() @ attention_module.repeat_kv(v, q.shape[1] // v.shape[1])

    monkeypatch.setattr(attention_module, "attention", over_queries)
    with pytest.raises(ClaimFailed, match="C4 FAILED"):
        run_cell(cell_source(NB03, 'claim("C4", layer_diff'), **layer0)


@pytest.mark.counterfactual("C9", "layer 0 with the mask never applied")
def test_03_layer0_mask_claim_fails_when_the_mask_is_never_applied(layer0):
    real = layer0["attention"]
    with pytest.raises(ClaimFailed, match="C9 FAILED"):
        run_cell(cell_source(NB03, 'claim("C9", relative[True]'),
                 **{**layer0, "attention": lambda q, k, v, causal=True: real(q, k, v, causal=False)})


@pytest.mark.counterfactual("C5", "query head h reads K/V head h % 3")
def test_03_grouping_claim_fails_when_the_heads_read_kv_head_h_mod_3(layer0):
    Q, K, V, H, KV = (layer0[name] for name in ("Q", "K", "V", "H", "KV"))
    dealt = torch.tensor([h % KV for h in range(H)])  # 0, 1, 2, 0, ...: each K/V head still read by 3 query heads
    wrong = layer0["attention"](Q, K[:, dealt], V[:, dealt], causal=True)  # [1, 9, seq, 64]
    with pytest.raises(ClaimFailed, match="C5 FAILED"):
        run_cell(cell_source(NB03, "gqa_diff = (per_head"), **{**layer0, "heads_out": wrong})


# 04 · C4: the loop over the blocks is ScratchLlama, which is transformers to 1e-3; greedy tokens identical
LOOP = ("04_forward_pass.ipynb", 'claim("C4", loop_diff')
GREEDY = ("04_forward_pass.ipynb", 'claim("C4", our_ids == reference_ids')


@pytest.fixture(scope="module")
def loop_names(course):
    ids = _ids(course, "The capital of France is")
    return dict(scratch=course["scratch"], ids=ids, reference=course["model"](ids, output_hidden_states=True))


def test_04_loop_claim_holds(loop_names):
    namespace = run_cell(cell_source(*LOOP), **loop_names)
    assert namespace["loop_diff"] <= 1e-5 and namespace["model_diff"] <= 1e-3


@pytest.mark.counterfactual("C4", "one block's MLP weight 5% off the checkpoint")
def test_04_loop_claim_fails_when_one_block_is_not_the_models(loop_names):
    weight = loop_names["scratch"].layers[15].mlp.down_proj.weight  # shared with the other tests: put back after
    kept = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(1.05)  # one block's MLP 5% off: a wrong weight, a wrong loop
        with pytest.raises(ClaimFailed, match="C4 FAILED"):
            run_cell(cell_source(*LOOP), **loop_names)
    finally:
        with torch.no_grad():
            weight.copy_(kept)


@pytest.mark.counterfactual("C4", "our greedy loop differs from transformers in the last token")
def test_04_greedy_claim_fails_when_one_token_differs(course, monkeypatch):
    from types import SimpleNamespace

    from llm_anatomy.generate import decode

    ids = _ids(course, "The capital of France is")
    tokens = [12, 34, 56, 78]  # stand-ins, no model run: the test is that the cell compares every token
    reference = SimpleNamespace(generate=lambda ids, **kw: torch.cat([ids, torch.tensor([tokens])], dim=1))
    names = dict(model=reference, tok=course["tok"], scratch=None, ids=ids)
    monkeypatch.setattr(decode, "greedy_tokens", lambda *a, **k: list(tokens))
    assert run_cell(cell_source(*GREEDY), **names)["our_ids"] == tokens
    monkeypatch.setattr(decode, "greedy_tokens", lambda *a, **k: tokens[:-1] + [0])  # the last token differs
    with pytest.raises(ClaimFailed, match="C4 FAILED"):
        run_cell(cell_source(*GREEDY), **names)


# 01 · C1: our trainer's merges are the tokenizers library's, in order; our encoder gives the model's ids
TRAINER = ("01_tokens.ipynb", 'claim("C1", ours_merges == reference_merges')
ENCODER = ("01_tokens.ipynb", 'claim("C1", all(same_tricky)')


@pytest.mark.counterfactual("C1", "our BPE trainer learns two merges in the other order, one fewer, or one more")
def test_01_trainer_claim_fails_when_one_merge_is_out_of_order_or_missing(monkeypatch):
    from llm_anatomy.tokens import bpe

    corpus = bpe.load_corpus()
    theirs = bpe.hf_trained_merges(corpus, 256 + 1000)
    names = dict(bpe=bpe, corpus=corpus, small=None)
    monkeypatch.setattr(bpe, "learned_merges", lambda tokenizer: list(theirs))  # stand-in for our trainer's merges
    assert run_cell(cell_source(*TRAINER), **names)["same"] == 1000
    swapped = list(theirs)
    swapped[500], swapped[501] = swapped[501], swapped[500]  # the same merges, two learned in the other order
    for wrong in (swapped, theirs[:999], theirs + [(b"x", b"y")]):  # one more merge: zip alone would not see it
        monkeypatch.setattr(bpe, "learned_merges", lambda tokenizer, wrong=wrong: wrong)
        with pytest.raises(ClaimFailed, match="C1 FAILED"):
            run_cell(cell_source(*TRAINER), **names)


@pytest.mark.counterfactual("C1", "our encoder's last id is off by one, or one tricky string differs")
def test_01_encoder_claim_holds_and_fails_when_one_id_or_one_tricky_string_differs(ours, reference_tokenizer):
    from llm_anatomy.device import timed
    from llm_anatomy.tokens import bpe

    corpus = bpe.load_corpus()[:3000]  # a slice: the cell encodes all of it twice
    names = dict(bpe=bpe, timed=timed, ours=ours, small=ours, tokenizer=reference_tokenizer, corpus=corpus,
                 tricky=["a", "b"], same_tricky=[True, True])
    run_cell(cell_source(*ENCODER), **names)
    with pytest.raises(ClaimFailed, match="C1 FAILED"):
        run_cell(cell_source(*ENCODER), **{**names, "same_tricky": [True, False]})

    class OneIdOff(bpe.BPETokenizer):  # our encoder with its last id changed
        def encode(self, text):
            ids = super().encode(text)
            return ids[:-1] + [ids[-1] + 1] if ids else ids

    off = copy.copy(ours)
    off.__class__ = OneIdOff
    with pytest.raises(ClaimFailed, match="C1 FAILED"):
        run_cell(cell_source(*ENCODER), **{**names, "ours": off})


# 04 · why each part exists: the passage's loss with each part taken away, in order; and 20 training steps
PARTS = ("04_forward_pass.ipynb", "removed = {\"nothing removed\": None")
TRAINING = ("04_forward_pass.ipynb", "optimizer = torch.optim.AdamW(small.parameters()")


def _parts_names(course):
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pydoc_data.topics import topics

    text_ids = _ids(course, topics["truth"][:500])
    return dict(scratch=course["scratch"], cfg=course["loaded"].config, text_ids=text_ids, math=math, plt=plt,
                loaded=course["loaded"], ScratchLlama=ScratchLlama, print=lambda *a, **k: None)


def test_04_each_part_taken_away_costs_what_the_text_says(course):
    namespace = run_cell(cell_source(*PARTS), **_parts_names(course))
    assert namespace["losses"]["nothing removed"] < namespace["positions"] < namespace["uniform"] < namespace["structure"]
    assert namespace["one_scale"] < namespace["losses"]["nothing removed"] + 1 < namespace["losses"]["no final norm"]
    print({k: round(v, 2) for k, v in namespace["losses"].items()})


def test_04_the_parts_cell_fails_when_one_scale_is_not_enough(course, monkeypatch):
    from llm_anatomy.model import ablations as ablations_module

    # a world where the final norm's per-position work is what the model needs: its control costs as much as no norm
    monkeypatch.setattr(ablations_module, "final_norm_constant", ablations_module.final_norm_off)
    with pytest.raises(AssertionError, match="one scale for the whole passage"):
        run_cell(cell_source(*PARTS), **_parts_names(course))


def test_04_the_parts_cell_fails_when_removing_rope_costs_nothing(course, monkeypatch):
    from llm_anatomy.model import ablations as ablations_module

    for name in ("rope_off", "rope_interleaved"):
        monkeypatch.setattr(ablations_module, name, lambda model: contextlib.nullcontext([1]))
    with pytest.raises(AssertionError, match="not in the order"):
        run_cell(cell_source(*PARTS), **_parts_names(course))


def test_04_training_lowers_the_loss_and_the_cell_fails_when_nothing_is_learned(course, monkeypatch):
    names = dict(_parts_names(course), whole=3.4, uniform=10.8)
    namespace = run_cell(cell_source(*TRAINING), **names)
    assert namespace["curve"][-1] < namespace["curve"][0] - 3

    class Frozen(torch.optim.AdamW):  # an optimizer that never changes a weight
        def step(self, closure=None):
            return None

    monkeypatch.setattr(torch.optim, "AdamW", Frozen)
    with pytest.raises(AssertionError, match="did not fall"):
        run_cell(cell_source(*TRAINING), **names)


# 04 · a made-up name, seen once, is copied (each prompt's own name is the top guess, unlikely without its first
# sentence), where notebook 03's induction head looks; " France" after a Germany sentence is a guess, not a copy
COPY = ("04_forward_pass.ipynb", "induction_layer, induction_head = divmod(")


@pytest.fixture(scope="module")
def copy_names(course):
    cfg, scratch = course["loaded"].config, course["scratch"]
    return dict(tok=course["tok"], loaded=course["loaded"], scratch=scratch, cfg=cfg, H=scratch.cfg.num_heads,
                print=lambda *a, **k: None)


class _WithoutTheName:
    """The model run on each prompt with its first sentence (the made-up name) cut out: what it guesses from the
    rest alone, which a copy needs and a prior does not."""

    def __init__(self, scratch, tok):
        self.scratch, self.tok = scratch, tok

    def _cut(self, ids):
        text = self.tok.decode(ids[0], skip_special_tokens=True)
        cut = text.split(" lives in Oslo. ", 1)[-1]
        return self.tok(cut, return_tensors="pt").input_ids.to(ids.device)

    def __call__(self, ids):
        return self.scratch(self._cut(ids))

    def trace(self, ids, **kwargs):
        return self.scratch.trace(self._cut(ids) if " lives in Oslo." in self.tok.decode(ids[0]) else ids, **kwargs)


def test_04_the_made_up_name_is_copied_and_the_cell_fails_when_it_is_not(copy_names):
    namespace = run_cell(cell_source(*COPY), **copy_names)
    assert set(namespace["copies"]) == {"Quenzel", "Tharnwick", "Zupolin"}
    assert all(c["top"] and c["looks_there"] for c in namespace["copies"].values())
    blind = _WithoutTheName(copy_names["scratch"], copy_names["tok"])
    with pytest.raises((AssertionError, IndexError)):
        run_cell(cell_source(*COPY), **{**copy_names, "scratch": blind})


def test_04_the_copy_fails_when_the_induction_head_looks_elsewhere(copy_names):
    scratch = copy_names["scratch"]

    class LooksBackwards:  # the same model, its kept attention weights read backwards along the keys
        def __call__(self, ids):
            return scratch(ids)

        def trace(self, ids, **kwargs):
            out = scratch.trace(ids, **kwargs)
            out.attentions = {layer: w.flip(-1).tril() for layer, w in out.attentions.items()}
            return out

    with pytest.raises(AssertionError, match="the text above says it does"):
        run_cell(cell_source(*COPY), **{**copy_names, "scratch": LooksBackwards()})
