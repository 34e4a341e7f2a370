"""The third pass over the exercise checks (issue 37): each wrong answer a learner's run of every exercise found
accepted is refused here, with the message that names its real mistake, and each right answer it found refused is
accepted. test_wrong_answers.py holds the earlier passes."""

from __future__ import annotations

import hashlib
import json
import math
import operator

import numpy as np
import pytest
import torch
from exercise_helpers import ROOT, load_solutions, not_yet

from llm_anatomy.exercises import ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch10, ch11
from llm_anatomy.tokens import bpe

def notebook_cells(name: str) -> list[dict]:
    """A notebook's cells, each with its source as one string."""
    cells = json.loads((ROOT / "notebooks" / name).read_text())["cells"]
    return [dict(c, source="".join(c["source"])) for c in cells]


solutions = {n: load_solutions(f"ch{n:02d}") for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)}


# =========================================================================== 1.1a, 1.1b, 1.1: BPE by hand

def _counts_or_new(ids, counts=None):
    counts = counts or {}  # an empty dict is false: a new one is made, and the loop's own stays empty
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def _copied_counts(ids, counts=None):
    out = dict(counts or {})
    for pair in zip(ids, ids[1:]):
        out[pair] = out.get(pair, 0) + 1
    return out


def test_1_1a_counts_not_added_into_the_dict_given_are_refused():
    not_yet(ch01.check_pair_counts(_counts_or_new), "counts or {}", "if counts is None")
    not_yet(ch01.check_pair_counts(_copied_counts), "another dict", "add into the counts you are given")
    assert ch01.check_pair_counts(solutions[1].pair_counts).passed


def test_1_1a_the_training_loop_with_such_counts_learns_nothing():
    # why it matters: the loop passes one empty dict and reads it, ignoring what comes back
    counts = {}
    _counts_or_new([1, 2, 1, 2], counts)
    assert counts == {}
    solutions[1].pair_counts([1, 2, 1, 2], counts)
    assert counts == {(1, 2): 2, (2, 1): 1}


def _merge_as_text(ids, pair, new_id):
    text = " ".join(map(str, ids)).replace(f"{pair[0]} {pair[1]}", str(new_id))
    return [int(t) for t in text.split()]


def test_1_1b_a_string_replace_merge_is_refused_on_ids_of_several_digits():
    assert _merge_as_text([11, 2], (1, 2), 9) == [19]  # the mistake: the digits of 11, 2 hold "1 2"
    assert _merge_as_text([1, 2, 3, 1, 2], (1, 2), 9) == [9, 3, 9]  # right on every one-digit case
    not_yet(ch01.check_merge(_merge_as_text), "not on their digits")
    assert ch01.check_merge(solutions[1].merge).passed


def _train_counting_once(text, vocab_size):
    chunks = [list(c.encode("utf-8")) for c in bpe.PreSplitter()(text)]
    merges = {}
    for new_id in range(256, vocab_size):
        counts = {}
        for ids in chunks:
            for pair in set(zip(ids, ids[1:])):  # once per chunk: ' banana' gives 'an' once
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        best = bpe.most_frequent(counts)
        merges[best] = new_id
        chunks = [bpe.merge(ids, best, new_id) for ids in chunks]
    return merges


@pytest.mark.parametrize("attempt", range(3))  # the third text is made up at each check: three draws
def test_1_1_counting_a_pair_once_per_chunk_is_refused_and_named(attempt):
    not_yet(ch01.check_train(_train_counting_once), "once per chunk", "banana")


def test_1_1_the_generated_text_repeats_pairs_inside_words_and_tells_the_counts_apart():
    text = ch01._generated_text(256 + 20)
    assert text != ch01._generated_text(256 + 20)  # made up at check time, not a fixed text to memorise
    assert list(_train_counting_once(text, 256 + 20)) != list(bpe.train_plain(text, 256 + 20)[0])
    assert ch01.check_train(solutions[1].train).passed


# =========================================================================== 2.2: nearest neighbours, no loop

def _neighbours_loop_in_torch(table, ids, k):
    rows = table / table.norm(dim=-1, keepdim=True)
    sims = []
    for i in ids:  # one query at a time, no matrix product: the whole-table method is the lesson
        s = (rows * rows[i]).sum(-1)
        s[i] = -2.0
        sims.append(s)
    return torch.stack(sims).topk(k, dim=-1).indices


def _neighbours_loop_in_numpy(table, ids, k):
    rows = table.numpy() / np.linalg.norm(table.numpy(), axis=-1, keepdims=True)
    out = []
    for i in ids.numpy():
        s = rows @ rows[i]
        s[i] = -2.0
        out.append(np.argsort(-s)[:k])
    return torch.as_tensor(np.stack(out))


def test_2_2_a_loop_over_the_queries_in_python_or_numpy_is_refused():
    not_yet(ch02.check_nearest_neighbours(_neighbours_loop_in_torch), "for one query", "loop over the queries")
    not_yet(ch02.check_nearest_neighbours(_neighbours_loop_in_numpy), "don't call", "stay in torch")
    assert ch02.check_nearest_neighbours(solutions[2].neighbours).passed


# =========================================================================== 3.3: grouped scores with no copy of K

def _scores_with(copy):
    def grouped_scores(q, k):
        n_rep = q.shape[0] // k.shape[0]
        return q @ copy(k, n_rep).transpose(-2, -1) / math.sqrt(q.shape[-1])
    return grouped_scores


K_COPIES = {
    "arange-index": lambda k, n: k[torch.arange(k.shape[0] * n) // n],
    "cat": lambda k, n: torch.cat([k[g:g + 1] for g in range(k.shape[0]) for _ in range(n)]),
    "stack": lambda k, n: torch.stack([k[h // n] for h in range(k.shape[0] * n)]),
    "index_select": lambda k, n: k.index_select(0, torch.arange(k.shape[0] * n) // n),
    "broadcast_to": lambda k, n: k[:, None].broadcast_to(k.shape[0], n, *k.shape[1:]).reshape(-1, *k.shape[1:]),
}


@pytest.mark.parametrize("copy", sorted(K_COPIES))
def test_3_3_a_k_copied_for_every_query_head_is_refused(copy):
    not_yet(ch03.check_grouped_scores(_scores_with(K_COPIES[copy])), "K was copied for every query head")


def test_3_3_no_copy_passes_a_per_head_view_too_and_3_2_no_longer_recommends_indexing():
    def per_head_views(q, k):  # k[h // n_rep] is a view: no copy, though not the reshape the text shows
        n_rep = q.shape[0] // k.shape[0]
        return torch.stack([q[h] @ k[h // n_rep].T for h in range(q.shape[0])]) / math.sqrt(q.shape[-1])

    assert ch03.check_grouped_scores(solutions[3].grouped_scores).passed
    assert ch03.check_grouped_scores(per_head_views).passed
    assert not any("index it" in text for text in ch03.check_expand_kv.hints)


# =========================================================================== 6.1, 6.2, 6.3: the KV cache

def _generate_one_call_too_many(model, ids, max_new_tokens, stop_ids):
    cache = model.new_cache(1, ids.shape[1] + max_new_tokens + 1)
    logits, out = model(ids, cache), []
    while True:
        next_id = logits[:, -1:].argmax(-1)
        out.append(int(next_id))
        logits = model(next_id, cache)  # one pass too many: after the last token, before deciding to stop
        if out[-1] in stop_ids:
            return out, "stop"
        if len(out) == max_new_tokens:
            return out, "length"


def test_6_1_a_forward_pass_after_the_last_token_is_named():
    not_yet(ch06.check_generate_with_cache(_generate_one_call_too_many), "wasted forward pass")
    assert ch06.check_generate_with_cache(solutions[6].generate_with_cache).passed


def _update_by_clone_and_cat(self, layer, k, v):
    end = self.length + k.shape[2]
    old_k, old_v = self.keys[layer][:, :, :self.length].clone(), self.values[layer][:, :, :self.length].clone()
    self.keys[layer][:, :, :end] = torch.cat([old_k, k], dim=2)  # the whole cache so far copied at every step
    self.values[layer][:, :, :end] = torch.cat([old_v, v], dim=2)
    return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


def test_6_2_an_update_that_clones_and_cats_the_stored_positions_is_named():
    not_yet(ch06.check_cache_update(_update_by_clone_and_cat), "copied", "Write only the new k and v")
    assert ch06.check_cache_update(solutions[6].update).passed


def test_6_3_ignoring_the_configs_head_dim_is_named_as_such():
    def default_head_dim(config, context, size):  # the right formula with hidden_size // heads always
        return solutions[6].kv_cache_bytes({k: v for k, v in config.items() if k != "head_dim"}, context, size)

    verdict = ch06.check_kv_cache_bytes(default_head_dim)
    not_yet(verdict, "head_dim")
    assert "only the keys" not in verdict.message


# =========================================================================== 8.3: chained block keys

def _order_blind(combine):
    def block_keys(tokens, block_size):
        keys, parent = [], 0
        for start in range(0, len(tokens) - block_size + 1, block_size):
            block = int(hashlib.sha256(str(tokens[start:start + block_size]).encode()).hexdigest(), 16)
            parent = combine(parent, block)
            keys.append(parent)
        return keys
    return block_keys


@pytest.mark.parametrize("combine", [operator.xor, operator.add], ids=["xor", "plus"])
def test_8_3_order_blind_chaining_is_refused(combine):
    not_yet(ch08.check_block_keys(_order_blind(combine)), "swapped", "forgets the order")
    assert ch08.check_block_keys(solutions[8].block_keys).passed


# =========================================================================== 11.1, 11.2, 11.3: behind the API

def test_11_1_an_event_ended_by_crlf_pairs_is_accepted():
    crlf = lambda payload: b"data: " + json.dumps(payload).encode() + b"\r\n\r\n"  # noqa: E731  (the SSE spec allows it)
    assert ch11.check_sse_event(crlf).passed
    not_yet(ch11.check_sse_event(lambda payload: b"data: " + json.dumps(payload).encode() + b"\r\n"), "empty line")


class _MatcherVariant:
    """The solution's matcher with one typical mistake switched on."""

    def __init__(self, stops, mistake):
        self.right, self.mistake, self.stops = solutions[11].Matcher(stops), mistake, list(stops)

    @property
    def stopped(self):
        return self.right.stopped

    def feed(self, text):
        if self.mistake == "stops in list order":  # cuts at the first stop of the list found, not the first in the text
            if self.right.stopped:
                return ""
            held = self.right.pending + text
            for stop in self.stops:
                if stop in held:
                    self.right.stopped, self.right.pending = True, ""
                    return held[:held.index(stop)]
        return self.right.feed(text)

    def flush(self):
        if self.mistake == "flush forgets":
            self.right.pending = ""
            return ""
        return self.right.flush()


def test_11_2_flush_that_forgets_the_held_text_is_refused():
    not_yet(ch11.check_stop_matcher(lambda stops: _MatcherVariant(stops, "flush forgets")), "flush()", "'ST'")


def test_11_2_two_stops_in_one_text_cut_at_the_first_in_the_text():
    not_yet(ch11.check_stop_matcher(lambda stops: _MatcherVariant(stops, "stops in list order")), "two stop strings",
            "comes first in the text")
    assert ch11.check_stop_matcher(solutions[11].Matcher).passed


def test_11_2_a_second_stop_split_across_pieces_is_looked_for_in_the_held_text():
    class OnlyFirstStopHeld(solutions[11].Matcher):  # holds back only what could begin the FIRST stop string
        def feed(self, text):
            all_stops, self.stops = self.stops, self.stops[:1]
            try:
                if any(s in self.pending + text for s in all_stops):
                    self.stops = all_stops
                return super().feed(text)
            finally:
                self.stops = all_stops

    not_yet(ch11.check_stop_matcher(OnlyFirstStopHeld), "could still become 'END'", "longest end")


@pytest.mark.parametrize("after", [np.int64(1), 4.0], ids=["np.int64", "float"])
def test_11_3_whole_seconds_of_another_type_are_accepted(after):
    def answer(waiting, limit, each):
        queued, seconds = solutions[11].admit_or_refuse(waiting, limit, each)
        return queued, (type(after)(seconds) if not queued else 0)

    assert ch11.check_admission(answer).passed


def test_11_3_no_floor_of_one_second_is_refused_and_the_text_states_the_rule():
    def no_floor(waiting, limit, each):
        if limit is None or waiting < limit:
            return True, 0
        return False, math.ceil((waiting - limit + 1) * each)

    not_yet(ch11.check_admission(no_floor), "Retry-After 0", "at least 1")
    text = "".join(c["source"] for c in notebook_cells("11_behind_the_api.ipynb") if "Exercise 11.3" in c["source"])
    assert "at least 1" in text


# =========================================================================== right answers once refused: 5.4, 9.2

def test_5_4_min_p_in_log_space_is_accepted_and_a_strict_threshold_still_refused():
    in_log_space = lambda logits, m: set(torch.nonzero(logits >= logits.max() + math.log(m)).flatten().tolist())  # noqa: E731
    assert ch05.check_min_p(in_log_space).passed
    strict = lambda logits, m: set(torch.nonzero(logits > logits.max() + math.log(m)).flatten().tolist())  # noqa: E731
    not_yet(ch05.check_min_p(strict), "exactly on the threshold")


def _kl_float64(a, b):
    a, b = a.double().log_softmax(-1), b.double().log_softmax(-1)
    return float((a.exp() * (a - b)).sum(-1).mean())


def _kl_cross_entropy_minus_entropy(a, b):
    p = a.softmax(-1)
    return float((-(p * b.log_softmax(-1)).sum(-1) + (p * a.log_softmax(-1)).sum(-1)).mean())


def _kl_by_hand(a, b):
    def log_softmax(x):  # a logsumexp written out, in float32
        top = x.max(-1, keepdim=True).values
        return x - (top + (x - top).exp().sum(-1, keepdim=True).log())
    a, b = log_softmax(a), log_softmax(b)
    return float((a.exp() * (a - b)).sum(-1).mean())


@pytest.mark.parametrize("kl", [_kl_float64, _kl_cross_entropy_minus_entropy, _kl_by_hand],
                         ids=["float64", "cross-entropy-minus-entropy", "logsumexp-by-hand"])
def test_9_2_a_right_kl_of_another_precision_or_form_is_accepted(kl):
    assert ch09.check_int8_per_channel(solutions[9].quantize_int8, kl).passed


def test_9_2_the_reverse_kl_and_the_sum_are_still_refused():
    reverse = lambda a, b: _kl_float64(b, a)  # noqa: E731
    not_yet(ch09.check_int8_per_channel(solutions[9].quantize_int8, reverse), "KL(other || ref)")
    summed = lambda a, b: _kl_float64(a, b) * a.shape[0]  # noqa: E731
    not_yet(ch09.check_int8_per_channel(solutions[9].quantize_int8, summed), "not their sum")


# =========================================================================== messages that blamed the wrong mistake

def test_10_2_a_number_as_text_or_none_is_told_what_to_return():
    right = solutions[10].traffic
    verdict = ch10.check_all_reduce_traffic(lambda *a: (str(right(*a)[0]), right(*a)[1]))
    not_yet(verdict, "whole number", "str '65'")
    not_yet(ch10.check_all_reduce_traffic(lambda *a: (None, right(*a)[1])), "you gave None")
    assert "TypeError" not in ch10.check_all_reduce_traffic(lambda *a: None).message


def test_7_1_a_count_off_by_a_little_shows_the_difference():
    def off_by_one_flop(cfg, past, size):  # the right counts, one FLOP too many
        work = solutions[7].decode_work(cfg, past, size)
        return work[0] + 1, work[1]

    verdict = ch07.check_decode_work(off_by_one_flop)
    not_yet(verdict, "(+1,")
    want, got = verdict.message.split("expected ")[1].split(", got ")[:2]
    assert want != got.split(" (")[0]  # never "expected 2.603e+09, got 2.603e+09"


def _q4_1_bytes(weights, order="dm", endian="<"):
    w = np.asarray(weights, dtype=np.float32)
    m, d = float(w.min()), (float(w.max()) - float(w.min())) / 15
    codes = np.clip(np.round((w - m) / d), 0, 15).astype(np.uint8)
    first, second = (d, m) if order == "dm" else (m, d)
    head = np.array([first, second], dtype=f"{endian}f2").view(np.uint8)
    return np.concatenate([head, codes[:16] | (codes[16:] << 4)])


def test_9_1_big_endian_fp16_and_m_before_d_are_named():
    assert ch09.check_quantize_q4_1_block(_q4_1_bytes).passed
    not_yet(ch09.check_quantize_q4_1_block(lambda w: _q4_1_bytes(w, endian=">")), "big-endian")
    not_yet(ch09.check_quantize_q4_1_block(lambda w: _q4_1_bytes(w, order="md")), "m comes before d")


def test_2_1_a_missing_dtype_cast_is_named():
    verdict = ch02.check_one_hot_embed(lambda ids, table: torch.nn.functional.one_hot(ids, table.shape[0]) @ table)
    not_yet(verdict, "int64", ".to(table.dtype)")


def test_2_2_ids_returned_as_a_list_are_ids_and_3_2_a_list_of_tensors_is_told_to_stack():
    as_list = lambda table, ids, k: solutions[2].neighbours(table, ids, k).tolist()  # noqa: E731
    assert ch02.check_nearest_neighbours(as_list).passed  # a list of ids is ids, not "cosines"
    verdict = ch03.check_expand_kv(lambda k, n: [k[h // (n // k.shape[0])] for h in range(n)])
    not_yet(verdict, "one tensor", "torch.stack")


def _cached_loop(stop_rule):
    """A cached loop (exercise 6.1) whose stop rule is `stop_rule(prompt, made, stop_ids)`."""
    def generate_with_cache(model, ids, max_new_tokens, stop_ids):
        prompt, out = ids[0].tolist(), []
        if stop_rule(prompt, out, stop_ids):
            return out, "stop"
        cache = model.new_cache(1, ids.shape[1] + max_new_tokens)
        logits = model(ids, cache)
        while True:
            out.append(int(logits[0, -1].argmax()))
            if stop_rule(prompt, out, stop_ids):
                return out, ("stop" if out[-1] in stop_ids else "length")
            if len(out) == max_new_tokens:
                return out, "length"
            logits = model(torch.tensor([[out[-1]]]), cache)
    return generate_with_cache


@pytest.mark.parametrize("rule", ["the whole sequence", "the prompt first"])
def test_6_1_a_stop_id_in_the_prompt_is_named_whatever_the_loop_returns(rule):
    look = {"the whole sequence": lambda prompt, out, stops: any(t in stops for t in prompt + out),
            "the prompt first": lambda prompt, out, stops: any(t in stops for t in prompt)}[rule]
    not_yet(ch06.check_generate_with_cache(_cached_loop(look)), "the PROMPT holds stop id")
    assert ch06.check_generate_with_cache(_cached_loop(lambda prompt, out, stops: bool(out) and out[-1] in stops)).passed


# =========================================================================== the guard: no way round it

def _rope_by_mistral(x, positions, theta):
    from transformers.models.mistral.modeling_mistral import apply_rotary_pos_emb

    d = x.shape[-1]
    freqs = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions[:, None].double() * freqs
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1) for f in (torch.cos, torch.sin))
    out, _ = apply_rotary_pos_emb(x.double()[None, None], x.double()[None, None], cos[None], sin[None])
    return out[0, 0].to(x.dtype)


def _rms_norm_by_qwen(x, weight, eps):
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    norm = Qwen2RMSNorm(x.shape[-1], eps)
    norm.weight.data = weight.clone()
    return norm(x)


def _swiglu_by_qwen(x, gate_w, up_w, down_w):
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    mlp = Qwen2MLP(Qwen2Config(hidden_size=x.shape[-1], intermediate_size=gate_w.shape[0]))
    for layer, w in ((mlp.gate_proj, gate_w), (mlp.up_proj, up_w), (mlp.down_proj, down_w)):
        layer.weight.data = w.clone()
    return mlp(x)


def _expand_by_qwen(k, n_heads):
    from transformers.models.qwen2.modeling_qwen2 import repeat_kv

    return repeat_kv(k[None], n_heads // k.shape[0])[0]


def test_transformers_copies_of_a_refused_function_in_other_families_are_refused():
    not_yet(ch02.check_rope(_rope_by_mistral), "don't call", "apply_rotary_pos_emb", "any model family")
    not_yet(ch04.check_rms_norm(_rms_norm_by_qwen), "don't call", "Qwen2RMSNorm.forward")
    not_yet(ch04.check_swiglu(_swiglu_by_qwen), "don't call", "Qwen2MLP.forward")
    not_yet(ch03.check_expand_kv(_expand_by_qwen), "don't call", "repeat_kv")


def test_aten_overloads_of_a_refused_op_are_refused():
    sdpa = lambda q, k, v: torch.ops.aten.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]  # noqa: E731
    not_yet(ch03.check_one_head(sdpa), "don't call", "scaled_dot_product_attention")
    default = lambda q, k, v: torch.ops.aten.scaled_dot_product_attention.default(q[None], k[None], v[None],  # noqa: E731
                                                                                   is_causal=True)[0]
    not_yet(ch03.check_one_head(default), "don't call", "scaled_dot_product_attention")
    rms = lambda x, w, eps: torch.ops.aten.rms_norm(x, [x.shape[-1]], w, eps)  # noqa: E731
    not_yet(ch04.check_rms_norm(rms), "don't call", "rms_norm")
    loss = lambda logits, ids: torch.ops.aten.cross_entropy_loss(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())  # noqa: E731
    not_yet(ch04.check_next_token_loss(loss), "don't call", "cross_entropy_loss")


def test_the_checks_own_references_are_refused_to_the_learner():
    from llm_anatomy.exercises.ch04_block import block_variant

    not_yet(ch03.check_one_head(lambda q, k, v: ch03._head(q, k, v).float()), "the check's own ch03._head")
    not_yet(ch04.check_block(lambda block, x, cos, sin: block_variant(block, x, cos, sin)),
            "the check's own ch04_block.block_variant")


def test_the_other_shortcuts_the_learner_found_are_refused():
    def by_torch_mha(q, k, v):
        n = q.shape[0]
        mask = torch.ones(n, n, dtype=torch.bool).triu(1)
        out, _ = torch.nn.functional.multi_head_attention_forward(
            q[:, None], k[:, None], v[:, None], q.shape[-1], 1, None, None, None, None, False, 0.0,
            torch.eye(q.shape[-1]), None, use_separate_proj_weight=True, q_proj_weight=torch.eye(q.shape[-1]),
            k_proj_weight=torch.eye(q.shape[-1]), v_proj_weight=torch.eye(q.shape[-1]), attn_mask=mask)
        return out[:, 0]

    not_yet(ch03.check_one_head(by_torch_mha), "don't call", "multi_head_attention_forward")

    def by_the_warper(logits, m):
        from transformers.generation.logits_process import MinPLogitsWarper

        kept = MinPLogitsWarper(m)(None, logits[None].clone())[0]
        return set(torch.nonzero(kept > -float("inf")).flatten().tolist())

    not_yet(ch05.check_min_p(by_the_warper), "don't call", "MinPLogitsWarper")

    def by_categorical(logits, ids):
        dist = torch.distributions.Categorical(logits=logits[:, :-1])
        return -dist.log_prob(ids[:, 1:]).mean()

    not_yet(ch04.check_next_token_loss(by_categorical), "don't call", "log_prob")


def test_the_recorder_does_not_hand_the_learner_the_real_model():
    from llm_anatomy.exercises._tiny import Recorder, tiny_model

    rec = Recorder(tiny_model())
    assert not hasattr(rec, "model") and not hasattr(rec, "__dict__")
    with pytest.raises(AttributeError):
        rec.model = None

    def round_the_recorder(model, ids, max_new_tokens, stop_ids):  # the library's loop on the model behind it
        from llm_anatomy.generate.decode import generate_greedy

        inner = getattr(model, "model", model)
        return generate_greedy(inner, ids, max_new_tokens).tokens[0].tolist(), "length"

    assert not ch06.check_generate_with_cache(round_the_recorder).passed


def test_switching_the_guards_profile_hook_off_is_refused():
    import sys

    def blind(q, k, v):
        sys.setprofile(None)  # the watch of Python calls gone: the fused kernel would pass unseen
        return solutions[3].attend(q, k, v)

    not_yet(ch03.check_one_head(blind), "switched off the check's watch")
    assert sys.getprofile() is None or "exercises" not in getattr(sys.getprofile(), "__module__", "")
    assert ch03.check_one_head(solutions[3].attend).passed


# =========================================================================== no answer on screen above its exercise

@pytest.mark.parametrize("notebook, exercise, formula", [
    ("04_forward_pass.ipynb", "Exercise 4.1", "sqrt(mean(x ** 2) + eps)"),
    ("04_forward_pass.ipynb", "Exercise 4.2", "down(silu(gate(x)) * up(x))"),
    ("05_generation.ipynb", "Exercise 5.2", "(running - ordered < p_cut)"),  # the funnel's code comes after it
    ("07_prefill_and_decode.ipynb", "Exercise 7.3", "2 x batch x params / FLOP/s"),
    ("09_making_decode_fast.ipynb", "Exercise 9.5", "min(1, p(x) / q(x))"),  # the rule comes after it
    ("10_beyond_one_device.ipynb", "Exercise 10.4", "two per block"),  # so does the count of collectives
    ("10_beyond_one_device.ipynb", "Exercise 10.5", "the predicted TP step = compute / TP"),  # and the step's formula
    ("10_beyond_one_device.ipynb", "Exercise 10.2", "inspect.getsource(part)"),  # the library's modules, printed
    ("10_beyond_one_device.ipynb", "Exercise 10.3", "inspect.getsource(part)"),  # after both exercises
])
def test_the_exercise_text_leaves_the_formula_to_derive(notebook, exercise, formula):
    cells = notebook_cells(notebook)
    at = next(i for i, c in enumerate(cells) if exercise in c["source"])
    above = "".join(c["source"] for c in cells[:at + 1])
    assert formula not in above, f"{exercise}'s formula is on screen above it"
    assert any(formula in c["source"] for c in cells) or notebook.startswith(("04", "07"))  # the others: shown after
