"""The fourth pass over the exercise checks (issue 48 item 3): each wrong answer a learner found accepted in 01-07 is
refused here with the message that names its mistake, every right answer stays accepted, and the messages that
blamed another mistake (or could not use the answer) now name the real one. test_third_pass.py holds the earlier
pass, test_wrong_answers.py the ones before it."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from exercise_helpers import ROOT, load_solutions, not_yet

from llm_anatomy.exercises import ch01, ch02, ch03, ch04, ch05, ch06, ch07
from llm_anatomy.tokens import bpe

solutions = {n: load_solutions(f"ch{n:02d}") for n in (1, 2, 3, 4, 5, 6, 7)}


# =========================================================================== 1.1: the pre-split is GPT-2's

def _train_with_split(split):
    """The right training loop on the chunks of `split(text)` (a pre-split of the learner's own)."""
    def train(text, vocab_size):
        chunks = [list(c.encode("utf-8")) for c in split(text)]
        merges = {}
        for new_id in range(256, vocab_size):
            counts = {}
            for ids in chunks:
                bpe.pair_counts(ids, counts)
            if not counts:
                break
            best = bpe.most_frequent(counts)
            merges[best] = new_id
            chunks = [bpe.merge(ids, best, new_id) for ids in chunks]
        return merges
    return train


HOME_MADE_SPLITS = {  # what a learner writes instead of GPT-2's pattern
    "words and punctuation": lambda text: re.findall(r" ?\w+| ?[^\w\s]+|\s+", text),
    "letters, digits grouped with letters": lambda text: re.findall(r" ?[A-Za-z0-9]+| ?[^A-Za-z0-9\s]+|\s+", text),
}


@pytest.mark.parametrize("split", sorted(HOME_MADE_SPLITS))
def test_1_1_a_home_made_pre_split_is_named(split):
    not_yet(ch01.check_train(_train_with_split(HOME_MADE_SPLITS[split])), "bpe.PreSplitter")


def test_1_1_gpt2s_pattern_with_ties_broken_by_max_is_told_about_ties():
    import regex

    gpt2 = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

    def by_max(text, vocab_size):
        chunks, merges = [list(c.encode("utf-8")) for c in gpt2.findall(text)], {}
        for new_id in range(256, vocab_size):
            counts = {}
            for ids in chunks:
                bpe.pair_counts(ids, counts)
            best = max(counts, key=counts.get)
            merges[best] = new_id
            chunks = [bpe.merge(ids, best, new_id) for ids in chunks]
        return merges

    verdict = ch01.check_train(by_max)
    not_yet(verdict, "break ties")
    assert "PreSplitter" not in verdict.message


def test_1_1_gpt2s_pattern_written_out_passes():
    import regex

    gpt2 = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    assert ch01.check_train(_train_with_split(gpt2.findall)).passed
    assert ch01.check_train(solutions[1].train).passed


# =========================================================================== 2.1, 2.2, 2.3: embeddings and positions

def _embed_by_bag(ids, table):
    return torch.nn.functional.embedding_bag(ids.flatten()[:, None], table, mode="sum").view(*ids.shape, -1)


def _embed_by_aten_index(ids, table):
    return torch.ops.aten.index(table, [ids])


def _embed_by_aten_index_of_a_copy(ids, table):
    return torch.ops.aten.index(table.as_subclass(torch.Tensor) * 1, [ids])  # a plain copy of the table, indexed


@pytest.mark.parametrize("embed", [_embed_by_bag, _embed_by_aten_index, _embed_by_aten_index_of_a_copy],
                         ids=["F.embedding_bag", "aten.index", "aten.index-of-a-copy"])
def test_2_1_embedding_bag_and_aten_index_are_refused(embed):
    not_yet(ch02.check_one_hot_embed(embed), "one-hot")


def _neighbours_in_python(table, ids, k):
    rows = table.tolist()  # the whole table out of torch: a pure-Python loop from here on
    norms = [math.sqrt(sum(x * x for x in row)) for row in rows]
    out = []
    for i in ids.tolist():
        sims = [sum(a * b for a, b in zip(rows[i], row)) / (norms[i] * n) for row, n in zip(rows, norms)]
        sims[i] = -2.0
        out.append(sorted(range(len(sims)), key=lambda j: -sims[j])[:k])
    return torch.tensor(out)


def test_2_2_a_pure_python_loop_over_the_table_is_refused():
    not_yet(ch02.check_nearest_neighbours(_neighbours_in_python), "Python", "one matrix product")
    assert ch02.check_nearest_neighbours(solutions[2].neighbours).passed


def test_2_3_swapped_halves_are_named():
    def swapped(x, positions, theta):  # the right angles, the halves in the wrong order
        d = x.shape[-1]
        out = solutions[2].rope(x, positions, theta)
        return torch.cat([out[:, d // 2:], out[:, :d // 2]], dim=-1)

    verdict = ch02.check_rope(swapped)
    not_yet(verdict, "halves")
    assert "theta **" not in verdict.message


# =========================================================================== 3.1, 3.3: attention

def _attend_by_flex(q, k, v):
    from torch.nn.attention.flex_attention import flex_attention

    def causal(score, b, h, i, j):
        return torch.where(j <= i, score, -float("inf"))

    return flex_attention(q[None, None], k[None, None], v[None, None], score_mod=causal)[0, 0]


def _attend_by_the_flex_op(q, k, v):  # the higher-order op flex_attention calls, called by hand
    from torch.nn.attention.flex_attention import _create_empty_block_mask

    def causal(score, b, h, i, j):
        return torch.where(j <= i, score, -float("inf"))

    block_mask = _create_empty_block_mask(q[None, None], k[None, None])
    out = torch.ops.higher_order.flex_attention(q[None, None], k[None, None], v[None, None], causal,
                                                block_mask.as_tuple(), 1 / math.sqrt(q.shape[-1]), {})
    return out[0][0, 0]


@pytest.mark.parametrize("attend", [_attend_by_flex, _attend_by_the_flex_op], ids=["flex_attention", "the op"])
def test_3_1_flex_attention_is_refused(attend):
    verdict = ch03.check_one_head(attend)
    not_yet(verdict, "don't call")
    assert "flexattention" in verdict.message.lower().replace("_", "")


def _multiply_and_sum(q, k):
    heads, kv = q.shape[0], k.shape[0]
    copied = k[torch.arange(heads) // (heads // kv)]  # [heads, k_len, d]: K copied for every query head
    return (q[:, :, None] * copied[:, None]).sum(-1) / math.sqrt(q.shape[-1])


def _flattened_copy(q, k):
    heads, q_len, d = q.shape
    kv, k_len = k.shape[0], k.shape[1]
    flat = k[torch.arange(heads) // (heads // kv)].reshape(heads * k_len, d)  # the copy, flattened
    scores = torch.stack([q[h] @ flat[h * k_len:(h + 1) * k_len].T for h in range(heads)])
    return scores / math.sqrt(d)


def _broadcast_matmul(q, k):
    heads, q_len, d = q.shape
    kv = k.shape[0]
    grouped = q.view(kv, heads // kv, q_len, d) @ k[:, None].mT  # matmul broadcasts K: it copies it inside
    return grouped.reshape(heads, q_len, -1) / math.sqrt(d)


@pytest.mark.parametrize("scores", [_multiply_and_sum, _flattened_copy, _broadcast_matmul],
                         ids=["multiply-and-sum", "flattened", "broadcast-matmul"])
def test_3_3_a_k_copied_any_way_is_refused(scores):
    not_yet(ch03.check_grouped_scores(scores), "K was copied for every query head")


def test_3_3_right_answers_without_a_copy_still_pass():
    def einsum(q, k):
        heads, q_len, d = q.shape
        kv = k.shape[0]
        grouped = torch.einsum("gnqd,gkd->gnqk", q.view(kv, heads // kv, q_len, d), k)
        return grouped.reshape(heads, q_len, -1) / math.sqrt(d)

    def per_head_views(q, k):
        n_rep = q.shape[0] // k.shape[0]
        return torch.stack([q[h] @ k[h // n_rep].T for h in range(q.shape[0])]) / math.sqrt(q.shape[-1])

    for answer in (solutions[3].grouped_scores, einsum, per_head_views):
        verdict = ch03.check_grouped_scores(answer)
        assert verdict.passed, verdict.message


# =========================================================================== 4.3, 4.5: the block and the loss

def test_4_3_flex_attention_is_refused():
    from torch.nn.attention.flex_attention import flex_attention

    def block_forward(block, x, cos, sin):
        from llm_anatomy.model.rope import apply_rope

        attn, cfg = block.self_attn, block.self_attn.cfg
        b, s, _ = x.shape
        h = block.input_layernorm(x)
        q = apply_rope(attn.q_proj(h).view(b, s, cfg.num_heads, cfg.head_dim).transpose(1, 2), cos, sin)
        k = apply_rope(attn.k_proj(h).view(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2), cos, sin)
        v = attn.v_proj(h).view(b, s, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        out = flex_attention(q, k, v, score_mod=lambda sc, bb, hh, i, j: torch.where(j <= i, sc, -float("inf")),
                             enable_gqa=True)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(b, s, -1))
        return x + block.mlp(block.post_attention_layernorm(x))

    not_yet(ch04.check_block(block_forward), "don't call", "flex_attention")


def test_4_3_a_missing_o_proj_is_named_not_gqa():
    def no_o_proj(block, x, cos, sin):
        attn, cfg = block.self_attn, block.self_attn.cfg
        real = attn.o_proj
        try:
            attn.o_proj = torch.nn.Identity()
            return solutions[4].block_forward(block, x, cos, sin)
        finally:
            attn.o_proj = real

    verdict = ch04.check_block(no_o_proj)
    not_yet(verdict, "o_proj")
    assert "GQA" not in verdict.message


def _kl_div_by(kl):
    def next_token_loss(logits, ids):
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        target = torch.nn.functional.one_hot(ids[:, 1:], logits.shape[-1]).float()
        return kl(logp, target) / target[..., 0].numel()  # KL to a one-hot target is the cross-entropy
    return next_token_loss


@pytest.mark.parametrize("kl", [
    lambda logp, target: torch.nn.functional.kl_div(logp, target, reduction="sum"),
    lambda logp, target: torch.nn.KLDivLoss(reduction="sum")(logp, target),
    lambda logp, target: torch.ops.aten.kl_div(logp, target, 2),  # 2: reduction "sum"
], ids=["F.kl_div", "KLDivLoss", "aten.kl_div"])
def test_4_5_kl_div_is_refused(kl):
    verdict = ch04.check_next_token_loss(_kl_div_by(kl))
    not_yet(verdict, "don't call")
    assert "kl_div" in verdict.message.lower() or "KLDivLoss" in verdict.message


# =========================================================================== 5.2, 5.3: top-p on screen, the loop

def _notebook_cells(name: str) -> list[dict]:
    cells = json.loads((ROOT / "notebooks" / name).read_text())["cells"]
    return [dict(c, source="".join(c["source"])) for c in cells]


_RUNNING_SUM = re.compile(r"cumsum|cumulative|accumulate")


def test_5_2_no_running_sum_of_probabilities_is_on_screen_above_the_exercise():
    cells = _notebook_cells("05_generation.ipynb")
    at = next(i for i, c in enumerate(cells) if "Exercise 5.2" in c["source"])
    above = [c["source"] for c in cells[:at] if c["cell_type"] == "code"]
    assert not [s for s in above if _RUNNING_SUM.search(s)], "a running sum of probabilities is on screen above 5.2"
    assert any(_RUNNING_SUM.search(c["source"]) for c in cells[at:] if c["cell_type"] == "code")  # the funnel, after


def test_5_2_the_search_finds_the_idea_in_any_spelling():
    for spelling in ("(ordered.cumsum(0) - ordered < 0.9)", "torch.cumsum(p, dim=0) <= top", "np.cumsum(probs)",
                     "list(itertools.accumulate(probs))"):
        assert _RUNNING_SUM.search(spelling)


def _until_stop(pick, stop_checked_last=False):
    """The append-and-rerun loop of 5.3 with `pick(logits)` choosing each token."""
    def generate_until_stop(model, ids, max_new_tokens, stop_ids):
        new = []
        for _ in range(max_new_tokens):
            next_id = pick(model(ids)[0])
            new.append(next_id)
            if stop_checked_last and len(new) == max_new_tokens:  # the limit first: a stop made last is "length"
                return new, "length"
            if next_id in stop_ids:
                return new, "stop"
            ids = torch.cat([ids, torch.tensor([[next_id]])], dim=1)
        return new, "length"
    return generate_until_stop


def test_5_3_a_stop_made_as_the_last_allowed_token_is_stop():
    verdict = ch05.check_generate_until_stop(_until_stop(lambda logits: int(logits[-1].argmax()), True))
    not_yet(verdict, "'stop'", "last")
    assert ch05.check_generate_until_stop(solutions[5].generate_until_stop).passed


def test_5_3_sampling_instead_of_the_argmax_is_named():
    g = torch.Generator().manual_seed(0)
    sampled = _until_stop(lambda logits: int(torch.multinomial(logits[-1].softmax(-1), 1, generator=g)))
    verdict = ch05.check_generate_until_stop(sampled)
    not_yet(verdict, "argmax")
    assert "LAST position" not in verdict.message
    not_yet(ch05.check_generate_until_stop(_until_stop(lambda logits: int(logits[0].argmax()))), "LAST position")


# =========================================================================== 6.1, 6.2: the cached loop, the update

def test_6_1_a_decode_token_shaped_1_is_named():
    def flat_token(model, ids, max_new_tokens, stop_ids):
        cache = model.new_cache(1, ids.shape[1] + max_new_tokens)
        logits, out = model(ids, cache), []
        while True:
            out.append(int(logits[0, -1].argmax()))
            if out[-1] in stop_ids:
                return out, "stop"
            if len(out) == max_new_tokens:
                return out, "length"
            logits = model(torch.tensor([out[-1]]), cache)  # shape [1]: no batch dimension

    verdict = ch06.check_generate_with_cache(flat_token)
    not_yet(verdict, "[1, 1]", "[1]")
    assert "could not use your answer" not in verdict.message


def test_6_1_a_stop_made_as_the_last_allowed_token_is_still_stop():
    def limit_first(model, ids, max_new_tokens, stop_ids):
        cache = model.new_cache(1, ids.shape[1] + max_new_tokens)
        logits, out = model(ids, cache), []
        while True:
            out.append(int(logits[0, -1].argmax()))
            if len(out) == max_new_tokens:
                return out, "length"
            if out[-1] in stop_ids:
                return out, "stop"
            logits = model(torch.tensor([[out[-1]]]), cache)

    not_yet(ch06.check_generate_with_cache(limit_first), "'stop'", "last")


def _update_copying(make):
    """A right update whose keys and values are written back from `make(stored, new)`, a copy of the whole cache."""
    def update(self, layer, k, v):
        end = self.length + k.shape[2]
        for tensors, new in ((self.keys, k), (self.values, v)):
            full = tensors[layer][:, :, :end]
            full.copy_(make(full, new, self.length))
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]
    return update


def _times_one(full, new, length):
    out = full * 1  # past * 1: every stored position copied
    out[:, :, length:] = new
    return out


COPIES = {
    "past * 1": _times_one,
    "torch.where": lambda full, new, length: torch.where(
        (torch.arange(full.shape[2]) >= length)[:, None], torch.nn.functional.pad(new, (0, 0, length, 0)), full),
    "torch.dstack": lambda full, new, length: torch.dstack([full[:, :, :length], new]),
}


@pytest.mark.parametrize("copy", sorted(COPIES))
def test_6_2_a_copy_of_the_stored_positions_made_any_way_is_named(copy):
    not_yet(ch06.check_cache_update(_update_copying(COPIES[copy])), "copied", "Write only the new k and v")


# =========================================================================== 7.1, 7.3: counting the work

def test_7_1_notebook_07s_own_pass_rows_is_refused():
    from llm_anatomy.measure import roofline

    def by_the_table(cfg, past, size):
        rows = roofline.pass_rows(cfg, 1, past, 1, size)  # the table above 7.1, row by row
        cache = sum(r.activation_bytes for r in rows if r.name.startswith("KV cache: read"))
        return sum(r.flops for r in rows), sum(r.weight_bytes for r in rows) + cache

    not_yet(ch07.check_decode_work(by_the_table), "don't call", "pass_rows")


def test_7_3_context_plus_one_is_named():
    def one_more(batch, context, *rest):
        return solutions[7].predict_step_s(batch, context + 1, *rest)

    not_yet(ch07.check_predict_step(one_more), "context, not context + 1")
    assert ch07.check_predict_step(solutions[7].predict_step_s).passed


def test_7_3_a_prediction_off_by_a_little_prints_two_different_floors():
    def a_little_more(*args):
        return solutions[7].predict_step_s(*args) * (1 + 1e-5)

    verdict = ch07.check_predict_step(a_little_more)
    want, got = re.search(r"the floor is ([\d.]+) ms .* you predicted ([\d.]+) ms", verdict.message).groups()
    assert want != got, verdict.message


# =========================================================================== right answers the new watches must let pass

@pytest.mark.parametrize("embed", [
    lambda ids, t: torch.einsum("...v,vh->...h", torch.nn.functional.one_hot(ids, t.shape[0]).to(t.dtype), t),
    lambda ids, t: torch.nn.functional.linear(torch.nn.functional.one_hot(ids, t.shape[0]).to(t.dtype), t.T),
    lambda ids, t: (torch.nn.functional.one_hot(ids, t.shape[0]).to(t.dtype)[..., None] * t).sum(-2),
], ids=["einsum", "F.linear", "multiply-and-sum"])
def test_2_1_other_one_hot_products_pass(embed):
    assert ch02.check_one_hot_embed(embed).passed


def test_3_3_a_bmm_or_a_loop_over_the_groups_passes():
    def by_bmm(q, k):
        heads, q_len, d = q.shape
        return torch.bmm(q.reshape(k.shape[0], -1, d), k.transpose(1, 2)).view(heads, q_len, -1) / math.sqrt(d)

    def by_group(q, k):
        heads, q_len, d = q.shape
        n = heads // k.shape[0]
        rows = [q[g * n:(g + 1) * n].reshape(-1, d) @ k[g].T for g in range(k.shape[0])]
        return torch.cat(rows).view(heads, q_len, -1) / math.sqrt(d)

    for answer in (by_bmm, by_group):
        verdict = ch03.check_grouped_scores(answer)
        assert verdict.passed, verdict.message


def test_6_2_an_update_by_index_copy_or_narrow_passes():
    def update(self, layer, k, v):
        end = self.length + k.shape[2]
        self.keys[layer].index_copy_(2, torch.arange(self.length, end), k)
        self.values[layer].narrow(2, self.length, k.shape[2]).copy_(v)
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    verdict = ch06.check_cache_update(update)
    assert verdict.passed, verdict.message
