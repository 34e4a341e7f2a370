"""Every wrong and shortcut answer that a learner's pass through notebooks 00-09 found (issue 20), each refused
with the message that names its mistake; near-miss types that mean the right thing, accepted; and every check,
given None or nonsense, saying what to return instead of "your code raised TypeError"."""

from __future__ import annotations

import hashlib
import types

import numpy as np
import pytest
import torch
from exercise_helpers import as_learner_code, load_solutions, not_yet

from llm_anatomy.exercises import ch00, ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09
from llm_anatomy.model.kv_cache import KVCache
from llm_anatomy.tokens import bpe
from llm_anatomy.weights.random import RANDOM_SHAPES

solutions = {n: load_solutions(f"ch{n:02d}") for n in range(10)}
SMOL = ch07._config(RANDOM_SHAPES["135m"])


def notebook_cell(source: str) -> dict:
    """Run `source` as a notebook cell does, in a namespace of its own (a kernel's __main__), and return it."""
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<notebook cell>", "exec"), namespace)
    return namespace


# =========================================================================== 1. the guard cannot be got round


def test_3_1_sdpa_imported_by_name_is_refused():
    cell = notebook_cell("from torch.nn.functional import scaled_dot_product_attention\n"
                         "def attend(q, k, v):\n"
                         "    return scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]\n")
    not_yet(ch03.check_one_head(cell["attend"]), "don't call", "scaled_dot_product_attention")


def test_3_2_repeat_kv_bound_by_an_earlier_cell_is_refused():
    # notebook 03's own cell imports repeat_kv: after Run All the name is bound when the learner reruns 3.2
    cell = notebook_cell("from llm_anatomy.model.attention import kv_head_of, repeat_kv\n"
                         "def expand_kv(k, n_heads):\n"
                         "    return repeat_kv(k[None], n_heads // k.shape[0])[0]\n")
    not_yet(ch03.check_expand_kv(cell["expand_kv"]), "don't call", "repeat_kv")


def test_4_2_cross_entropy_imported_by_name_is_refused():
    cell = notebook_cell("from torch.nn.functional import cross_entropy\n"
                         "def next_token_loss(logits, ids):\n"
                         "    return cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())\n")
    not_yet(ch04.check_next_token_loss(cell["next_token_loss"]), "don't call", "cross_entropy")


def test_1_1_the_loop_on_chunks_imported_by_name_is_refused():
    cell = notebook_cell("from llm_anatomy.tokens.bpe_train import train_on_chunks\n"
                         "from llm_anatomy.tokens.bpe import PreSplitter\n"
                         "def train(text, vocab_size):\n"
                         "    chunks = [list(c.encode('utf-8')) for c in PreSplitter()(text)]\n"
                         "    return train_on_chunks(chunks, vocab_size)[0]\n")
    not_yet(ch01.check_train(cell["train"]), "don't call", "train_on_chunks")


def test_1_1_train_fast_imported_by_name_is_refused():
    cell = notebook_cell("from llm_anatomy.tokens.bpe_train import train_fast\n"
                         "def train(text, vocab_size):\n"
                         "    return train_fast(text, vocab_size).merges\n")
    not_yet(ch01.check_train(cell["train"]), "don't call", "train_fast")


def test_a_shortcut_held_in_a_default_argument_or_a_closure_is_refused():
    import torch.nn.functional as F

    def attend(q, k, v, fused=F.scaled_dot_product_attention):
        return fused(q[None], k[None], v[None], is_causal=True)[0]

    not_yet(ch03.check_one_head(attend), "don't call", "scaled_dot_product_attention")
    cross_entropy = torch.nn.functional.cross_entropy
    not_yet(ch04.check_next_token_loss(lambda logits, ids: cross_entropy(logits[0, :-1], ids[0, 1:])), "don't call")


# =========================================================================== 2. where the method is the lesson


def test_1_2_the_models_own_pre_split_is_refused(ours):
    not_yet(ch01.check_pre_split(ours.chunks), "don't call", "chunks")
    not_yet(ch01.check_pre_split(lambda text: ours.splitter(text)), "don't call", "isolates the digits")
    pre = ours.splitter  # a PreSplitter with SmolLM2's digits step, bound before the check
    not_yet(ch01.check_pre_split(lambda text: pre(text)), "don't call")


def test_1_2_the_tokenizers_pre_tokenizer_is_refused(reference_tokenizer):
    pre = reference_tokenizer.backend_tokenizer.pre_tokenizer
    to_bytes = bpe.token_text_to_bytes
    shortcut = lambda text: [to_bytes(p).decode() for p, _ in pre.pre_tokenize_str(text)]  # noqa: E731
    not_yet(ch01.check_pre_split(shortcut), "don't call", "pre_tokenize_str")


def test_5_4_the_librarys_nucleus_is_refused():
    from transformers.generation.logits_process import TopPLogitsWarper

    from llm_anatomy.generate.sampling import next_token_probs, top_p_mask

    not_yet(ch05.check_top_p(lambda logits, p: set((next_token_probs(logits, top_p=p) > 0).nonzero().flatten()
                                                   .tolist())), "don't call", "next_token_probs")
    not_yet(ch05.check_top_p(lambda logits, p: set(top_p_mask(logits, p).nonzero().flatten().tolist())),
            "don't call", "top_p_mask")
    warped = lambda logits, p: set(torch.isfinite(TopPLogitsWarper(p)(None, logits[None])[0]).nonzero()  # noqa: E731
                                   .flatten().tolist())
    not_yet(ch05.check_top_p(warped), "don't call", "TopPLogitsWarper")


def test_6_2_kvcache_update_itself_is_refused():
    not_yet(ch06.check_cache_update(lambda self, layer, k, v: KVCache.update(self, layer, k, v)), "don't call",
            "KVCache.update")

    def through_super(self, layer, k, v):
        return super(type(self), self).update(layer, k, v)

    not_yet(ch06.check_cache_update(through_super), "don't call", "KVCache.update")


def test_7_1_forward_work_is_refused():
    from llm_anatomy.measure.roofline import forward_work

    def shortcut(cfg, past, size):
        work = forward_work(cfg, 1, past, 1, size)
        return work.flops, work.bytes

    not_yet(ch07.check_decode_work(shortcut), "don't call", "forward_work")


def test_7_4_regime_times_and_regime_are_refused():
    from llm_anatomy.measure.overhead import regime, regime_times
    from llm_anatomy.measure.peaks import Peaks
    from llm_anatomy.measure.roofline import Work

    def shortcut(flops, moved, ops, peak, bandwidth, per_op):
        bounds = regime_times(Work(flops, moved), ops, Peaks("cpu", "fp32", peak, bandwidth, "x"), per_op)
        return bounds, regime(bounds)

    not_yet(ch07.check_step_bounds(shortcut), "don't call", "regime_times")


def test_8_2_admit_is_refused():
    from llm_anatomy.serve.scheduler import admit

    not_yet(ch08.check_admission(admit), "don't call", "admit")
    not_yet(ch08.check_admission(lambda *args: admit(*args)), "don't call", "admit")


def test_8_3_block_keys_is_refused():
    from llm_anatomy.serve.prefix_cache import block_keys

    not_yet(ch08.check_block_keys(lambda tokens, size: block_keys(tokens, size)), "don't call", "block_keys")


def test_8_4_the_librarys_slot_mapping_and_the_engines_view_are_refused():
    import torch

    from llm_anatomy.serve.paged_kv import PagedKVPool, RaggedPagedView, slot_mapping

    def through_the_library(tables, positions, size):
        width = max(len(t) for t in tables)
        padded = torch.tensor([t + t[:1] * (width - len(t)) for t in tables])  # [rows, blocks]
        return [s for row, ps in enumerate(positions) for s in slot_mapping(padded[row:row + 1], torch.tensor([ps]),
                                                                             size)[0].tolist()]

    def through_the_view(tables, positions, size):
        pool = PagedKVPool(1, 1 + max(b for t in tables for b in t), size, kv_heads=1, head_dim=1)
        view = RaggedPagedView(pool, tables, [ps[0] for ps in positions], [len(ps) for ps in positions])
        return (view.write_blocks * size + view.write_slots).tolist()

    not_yet(ch08.check_slot_mapping(through_the_library), "don't call", "slot_mapping")
    not_yet(ch08.check_slot_mapping(through_the_view), "don't call", "RaggedPagedView")


def test_8_1_the_librarys_allocator_is_refused():
    from llm_anatomy.serve.paged_kv import BlockAllocator

    class Wrapper(solutions[8].MyAllocator):
        def __init__(self, num_blocks):
            super().__init__(num_blocks)
            self.inner = BlockAllocator(num_blocks)

    not_yet(ch08.check_allocator(Wrapper), "don't call", "BlockAllocator")


def test_9_1_the_librarys_quantizers_are_refused():
    import gguf
    import gguf.quants as gq

    from llm_anatomy.fast.quantize import int4_codes

    def through_gguf(w):
        return gq.quantize(w.reshape(1, 32), gguf.GGMLQuantizationType.Q4_1).reshape(-1)

    def through_the_class(w):  # gguf's Q4_1 class, bound before the check
        return gq.Q4_1.quantize_blocks(w.reshape(1, 32)).reshape(-1)

    def through_int4_codes(w):
        codes, scale, minimum = int4_codes(torch.from_numpy(w).reshape(1, 32), 32)
        c = codes.reshape(-1).numpy().astype(np.uint8)
        return np.concatenate([np.float16(float(scale)).reshape(1).view(np.uint8),
                               np.float16(float(minimum)).reshape(1).view(np.uint8), c[:16] | (c[16:] << 4)])

    for answer, name in ((through_gguf, "quantize"), (through_the_class, "Q4_1"), (through_int4_codes, "int4_codes")):
        not_yet(ch09.check_quantize_q4_1_block(answer), "don't call", name)


def test_9_2_the_librarys_int8_and_kl_are_refused():
    from llm_anatomy.fast.quantize import quantize_int8_per_channel
    from llm_anatomy.measure.quality import logit_kl

    not_yet(ch09.check_int8_per_channel(quantize_int8_per_channel, solutions[9].kl), "don't call",
            "quantize_int8_per_channel")
    not_yet(ch09.check_int8_per_channel(solutions[9].quantize_int8, logit_kl), "don't call", "logit_kl")
    kl_div = torch.nn.functional.kl_div
    not_yet(ch09.check_int8_per_channel(solutions[9].quantize_int8, lambda a, b: float(kl_div(
        b.log_softmax(-1), a.log_softmax(-1), log_target=True, reduction="batchmean"))), "don't call", "kl_div")


def test_9_3_and_9_4_the_librarys_verify_and_update_are_refused():
    from llm_anatomy.fast import speculative
    from llm_anatomy.fast.tiled_attention import online_softmax_update

    verify = speculative._verify
    not_yet(ch09.check_greedy_verify(lambda logits, drafts: verify(logits, drafts, None, speculative.GREEDY, None)),
            "don't call", "_verify")
    not_yet(ch09.check_online_update(online_softmax_update), "don't call", "online_softmax_update")


# =========================================================================== 3. no wrong answer marked Correct


def test_2_2_neighbours_ranked_by_abs_cos_are_refused():
    # 2.2 was the cosine of two vectors, where abs(cos) passed; it is now nearest neighbours over the whole table,
    # and the held-back table has rows pointing the opposite way of a query (cosine -1)
    def absolute(table, ids, k):
        unit = table / torch.linalg.norm(table, dim=-1, keepdim=True)
        sims = (unit[ids] @ unit.T).abs()
        sims[torch.arange(len(ids)), ids] = -2.0
        return sims.topk(k, dim=-1).indices
    not_yet(ch02.check_nearest_neighbours(absolute), "abs(cos)")


def test_6_2_an_update_that_reallocates_with_cat_is_refused():
    def reallocates(self, layer, k, v):
        end = self.length + k.shape[2]
        self.keys[layer] = torch.cat([self.keys[layer][:, :, :self.length], k], dim=2)
        self.values[layer] = torch.cat([self.values[layer][:, :, :self.length], v], dim=2)
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    not_yet(ch06.check_cache_update(reallocates), "replaced the cache's tensors", "in place")


def _chained_to_first(tokens, block_size):
    keys, first = [], ""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        key = hashlib.sha256((first + str(tokens[start:start + block_size])).encode()).hexdigest()
        first = first or key
        keys.append(key)
    return keys


def _no_separator(tokens, block_size):
    keys, parent = [], ""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = "".join(str(t) for t in tokens[start:start + block_size])  # [1, 23] and [12, 3] are both "123"
        parent = hashlib.sha256((parent + block).encode()).hexdigest()
        keys.append(parent)
    return keys


def test_8_3_keys_chained_to_the_first_key_are_refused():
    not_yet(ch08.check_block_keys(_chained_to_first), "THIRD block", "key just before it")


def test_8_3_keys_that_glue_the_tokens_together_are_refused():
    not_yet(ch08.check_block_keys(_no_separator), "[1, 23] and [12, 3]")


def test_8_1_share_of_a_free_block_must_refuse():
    class SharesAnything(solutions[8].MyAllocator):
        def share(self, block):
            self.refs[block] += 1

    not_yet(ch08.check_allocator(SharesAnything), "share(", "free block must refuse")


def test_5_5_a_stop_id_in_the_prompt_does_not_stop_the_loop():
    def any_stop_in_ids(model, ids, n, stop_ids):
        new = []
        for _ in range(n):
            next_id = model(ids)[:, -1].argmax(-1, keepdim=True)
            new.append(int(next_id))
            ids = torch.cat([ids, next_id], dim=1)
            if any(int(t) in stop_ids for t in ids[0]):  # the prompt included
                return new, "stop"
        return new, "length"

    not_yet(ch05.check_generate_until_stop(any_stop_in_ids), "PROMPT holds stop id", "just made")

    def checks_before_generating(model, ids, n, stop_ids):
        if any(int(t) in stop_ids for t in ids[0]):
            return [], "stop"
        return solutions[5].generate_until_stop(model, ids, n, stop_ids)

    not_yet(ch05.check_generate_until_stop(checks_before_generating), "PROMPT holds stop id")


def test_6_1_a_stop_id_in_the_prompt_does_not_stop_the_cached_loop():
    def any_stop_in_ids(model, ids, n, stop_ids):
        cache = model.new_cache(1, ids.shape[1] + n)
        logits, seen, new = model(ids, cache), ids[0].tolist(), []
        for _ in range(n):
            next_id = logits[:, -1:].argmax(-1)
            new.append(int(next_id))
            seen.append(int(next_id))
            if set(seen) & set(stop_ids):
                return new, "stop"
            logits = model(next_id, cache)
        return new, "length"

    not_yet(ch06.check_generate_with_cache(any_stop_in_ids), "PROMPT holds stop id")


def test_7_1_past_instead_of_past_plus_one_is_refused():
    def past_only(cfg, past, size):
        flops, moved = solutions[7].decode_work(cfg, past - 1, size) if past else (None, None)
        if flops is None:  # past = 0: the off-by-one leaves attention and the cache out entirely
            flops, moved = solutions[7].decode_work(cfg, 0, size)
            kv = cfg.num_kv_heads * cfg.head_dim
            flops -= 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim
            moved -= 2 * cfg.num_layers * kv * size
        return flops, moved

    not_yet(ch07.check_decode_work(past_only), "past + 1 positions")


def test_1_1_a_precomputed_constant_is_refused():
    constant = dict(bpe.train_plain(ch01.HELD_BACK, 256 + 40)[0])  # the first held-back text's merges, learned once
    not_yet(ch01.check_train(lambda text, vocab_size: dict(constant)), "same merges for two different texts")


# =========================================================================== 4. the message names the mistake


def test_5_4_one_token_too_many():
    def one_too_many(logits, p):
        probs = torch.softmax(logits, -1)
        ordered, order = probs.sort(descending=True)
        kept = int(((ordered.cumsum(0) - ordered) < p).sum())
        return set(order[:kept + 1].tolist())

    verdict = ch05.check_top_p(one_too_many)
    not_yet(verdict, "one token too many")
    assert "softmax" not in verdict.message


def test_9_3_a_wrong_residual_is_blamed_not_the_acceptance():
    accept = solutions[9].acceptance_probability
    for residual, words in [(lambda p, q: (q - p).clamp(min=0) / (q - p).clamp(min=0).sum(), "max(q - p, 0)"),
                            (lambda p, q: (p - q) / (p - q).sum(), "negative entries"),
                            (lambda p, q: torch.full_like(p, 1 / p.numel()), "your residual")]:
        verdict = ch09.check_speculative_rule(accept, residual)
        not_yet(verdict, words)
        assert "accept with" not in verdict.message and "acceptance_probability should" not in verdict.message


def test_9_3_an_upside_down_acceptance_is_named():
    not_yet(ch09.check_speculative_rule(lambda p, q, x: min(1.0, float(q[x] / p[x])) if p[x] > 0 else 1.0,
                                        solutions[9].residual), "upside down")


def test_6_3_forgetting_the_bytes_per_number_is_named():
    verdict = ch06.check_kv_cache_bytes(lambda config, context, size: solutions[6].kv_cache_bytes(config, context, 1))
    not_yet(verdict, "bytes_per_element")
    assert "factor 2" not in verdict.message


def test_7_4_compute_bound_is_the_right_regime_named_by_its_key():
    def suffixed(*args):
        bounds, name = solutions[7].step_bounds(*args)
        return bounds, name + "-bound"

    not_yet(ch07.check_step_bounds(suffixed), "right regime", "by its key")


def test_8_2_arrival_at_now_counts():
    def strict(arrivals, needed, running, free, max_batch, now):
        joined = 0
        for arrival, need in zip(arrivals, needed):
            if arrival >= now or running + joined >= max_batch or need > free:
                break
            free -= need
            joined += 1
        return joined

    verdict = ch08.check_admission(strict)
    not_yet(verdict, "arrival time equals now", "arrival <= now")
    assert "slot" not in verdict.message


def test_5_5_returning_the_prompt_with_the_new_tokens_is_named():
    def with_prompt(model, ids, n, stop_ids):
        new, reason = solutions[5].generate_until_stop(model, ids, n, stop_ids)
        return ids[0].tolist() + new, reason

    verdict = ch05.check_generate_until_stop(with_prompt)
    not_yet(verdict, "returned the prompt too")
    assert "LAST position" not in verdict.message


def test_1_1_a_discarded_merge_is_named():
    def discards(text, vocab_size):
        chunks = [list(c.encode("utf-8")) for c in bpe.PreSplitter()(text)]
        merges = {}
        for new_id in range(256, vocab_size):
            counts = {}
            for ids in chunks:
                bpe.pair_counts(ids, counts)
            best = bpe.most_frequent(counts)
            merges[best] = new_id
            for ids in chunks:
                bpe.merge(ids, best, new_id)  # the merged ids are thrown away
        return merges

    verdict = ch01.check_train(discards)
    not_yet(verdict, "same pair", "bpe.merge returns")
    assert "256, 257" not in verdict.message


def test_1_1_chunks_from_str_split_are_named():
    def split_on_spaces(text, vocab_size):
        chunks, merges = [list(word.encode("utf-8")) for word in text.split()], {}
        for new_id in range(256, vocab_size):
            counts = {}
            for ids in chunks:
                bpe.pair_counts(ids, counts)
            if not counts:
                break
            merges[best := bpe.most_frequent(counts)] = new_id
            chunks = [bpe.merge(ids, best, new_id) for ids in chunks]
        return merges

    not_yet(ch01.check_train(split_on_spaces), "str.split", "bpe.PreSplitter")


def test_1_2_chunks_as_bytes_are_named():
    verdict = ch01.check_pre_split(lambda text: [c.encode("utf-8") for c in solutions[1].pre_split(text)])
    not_yet(verdict, "string (str)", "bytes")


def test_6_1_no_cache_on_the_decode_steps_is_named():
    def prefill_only(model, ids, n, stop_ids):
        cache = model.new_cache(1, ids.shape[1] + n)
        logits, new = model(ids, cache), []
        for _ in range(n):
            next_id = logits[:, -1:].argmax(-1)
            new.append(int(next_id))
            if int(next_id) in stop_ids:
                return new, "stop"
            logits = model(next_id)  # no cache: the step sees only the newest token
        return new, "length"

    verdict = ch06.check_generate_with_cache(prefill_only)
    not_yet(verdict, "a call got no cache")
    assert "caches" not in verdict.message


@pytest.mark.parametrize("change, words", [
    (dict(diagonal=1), ("lets query i see key i + 1",)),
    (dict(diagonal=-1), ("hides the diagonal",)),
    (dict(transposed=True), ("transposed", "q @ k.T")),
    (dict(mask_after=0.0), ("BEFORE the softmax",)),
    (dict(mask_after=float("-inf")), ("BEFORE the softmax",)),
    (dict(scale="d"), ("divided the scores by head_dim",)),
])
def test_3_1_each_mistake_is_named(change, words):
    def attend(q, k, v):
        return as_learner_code(ch03._head)(q, k, v, **change).float()

    verdict = ch03.check_one_head(attend)
    not_yet(verdict, *words)
    assert "not yet equal to attention" not in verdict.message


def test_3_1_the_mistakes_are_told_apart_by_hand_written_answers():
    def off_by_one(q, k, v):
        scores = q @ k.T / q.shape[-1] ** 0.5
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(), float("-inf"))  # j >= i hidden
        return torch.softmax(scores, -1) @ v

    def mask_after(q, k, v):
        weights = torch.softmax(q @ k.T / q.shape[-1] ** 0.5, -1)
        return weights.masked_fill(~torch.ones_like(weights, dtype=torch.bool).tril(), 0.0) @ v

    def transposed(q, k, v):
        scores = (k @ q.T) / q.shape[-1] ** 0.5
        return torch.softmax(scores.masked_fill(~torch.ones_like(scores, dtype=torch.bool).tril(), float("-inf")),
                             -1) @ v

    not_yet(ch03.check_one_head(off_by_one), "hides the diagonal")
    not_yet(ch03.check_one_head(mask_after), "BEFORE the softmax")
    not_yet(ch03.check_one_head(transposed), "transposed")


def test_near_miss_types_that_mean_the_right_answer_pass():
    assert ch06.check_users_that_fit(65.0).passed  # (80 * 2**30 - 8.03e9 * 2) // (131_072 * 8_192) on floats
    assert ch06.check_users_that_fit(np.int64(65)).passed
    not_yet(ch06.check_users_that_fit(65.5), "round down")
    assert ch05.check_next_probs(lambda logits, t, k: solutions[5].next_probs(logits, t, k).numpy()).passed
    assert ch05.check_next_probs(lambda logits, t, k: solutions[5].next_probs(logits, t, k).tolist()).passed
    assert ch06.check_kv_cache_bytes(lambda *a: np.int64(solutions[6].kv_cache_bytes(*a))).passed
    assert ch06.check_kv_cache_bytes(lambda *a: float(solutions[6].kv_cache_bytes(*a))).passed  # 65.0 from / is fine


class _Nothing:
    """A learner's allocator whose methods return None."""

    def __init__(self, num_blocks):
        self.free, self.refs = list(range(num_blocks)), [0] * num_blocks

    def allocate(self):
        return None

    def share(self, block):
        return None

    def release(self, block):
        return None


_TOKENIZER = types.SimpleNamespace(eos_token="<|im_end|>", eos_token_id=2)
_CALLED = [  # (check, how to call it with the learner's answer)
    (ch00.check_count_parameters, lambda check, a: check(a)),
    (ch01.check_pair_counts, lambda check, a: check(a)), (ch01.check_merge, lambda check, a: check(a)),
    (ch01.check_train, lambda check, a: check(a)), (ch01.check_pre_split, lambda check, a: check(a)),
    (ch01.check_encode_chunk, lambda check, a: check(a)),
    (ch02.check_one_hot_embed, lambda check, a: check(a)), (ch02.check_nearest_neighbours, lambda check, a: check(a)),
    (ch02.check_rope, lambda check, a: check(a)),
    (ch03.check_one_head, lambda check, a: check(a)), (ch03.check_expand_kv, lambda check, a: check(a)),
    (ch03.check_grouped_scores, lambda check, a: check(a)),
    (ch04.check_rms_norm, lambda check, a: check(a)), (ch04.check_swiglu, lambda check, a: check(a)),
    (ch04.check_forward, lambda check, a: check(a)), (ch04.check_next_token_loss, lambda check, a: check(a)),
    (ch04.check_block, lambda check, a: check(a)),
    (ch05.check_next_probs, lambda check, a: check(a)), (ch05.check_top_p, lambda check, a: check(a)),
    (ch05.check_min_p, lambda check, a: check(a)),
    (ch05.check_generate_until_stop, lambda check, a: check(a)),
    (ch06.check_generate_with_cache, lambda check, a: check(a)), (ch06.check_cache_update, lambda check, a: check(a)),
    (ch06.check_kv_cache_bytes, lambda check, a: check(a)),
    (ch07.check_decode_work, lambda check, a: check(a)), (ch07.check_step_bounds, lambda check, a: check(a)),
    (ch07.check_predict_step, lambda check, a: check(a)),
    (ch08.check_admission, lambda check, a: check(a)), (ch08.check_block_keys, lambda check, a: check(a)),
    (ch08.check_slot_mapping, lambda check, a: check(a)), (ch08.check_plan_iteration, lambda check, a: check(a)),
    (ch09.check_quantize_q4_1_block, lambda check, a: check(a)),
    (ch09.check_int8_per_channel, lambda check, a: check(a, a)),
    (ch09.check_greedy_verify, lambda check, a: check(a)),
    (ch09.check_online_update, lambda check, a: check(a)),
    (ch09.check_speculative_rule, lambda check, a: check(a, a)),
]
_VALUES = [
    (ch00.check_eos_token, lambda check, a: check(a, _TOKENIZER)),
    (ch06.check_users_that_fit, lambda check, a: check(a)),
    (ch07.check_ridge_batch, lambda check, a: check(a, SMOL, 16, 4, 6.0)),
]


def _says_what_to_return(verdict):
    assert not verdict.passed, verdict
    assert "raised" not in verdict.message and "could not use" not in verdict.message, verdict.message


@pytest.mark.parametrize("check, run", _CALLED, ids=[c.__name__ for c, _ in _CALLED])
@pytest.mark.parametrize("answer", [None, "nonsense", (1, 2, 3)], ids=["None", "a-string", "a-tuple"])
def test_a_function_that_returns_the_wrong_kind_is_told_what_to_return(check, run, answer):
    _says_what_to_return(run(check, lambda *args, **kwargs: answer))


def test_an_allocator_whose_methods_return_nothing_is_told_what_to_return():
    _says_what_to_return(ch08.check_allocator(_Nothing))


@pytest.mark.parametrize("check, run", _VALUES, ids=[c.__name__ for c, _ in _VALUES])
@pytest.mark.parametrize("answer", [None, "nonsense", [1.0]], ids=["None", "a-string", "a-list"])
def test_a_value_of_the_wrong_kind_is_told_what_to_give(check, run, answer):
    _says_what_to_return(run(check, answer))


# =========================================================================== 5. the learner cannot break the notebook


def test_1_3_a_function_that_pops_the_merges_leaves_the_tokenizer_whole(ours):
    before = dict(ours.merges)

    def greedy_popper(ids, merges):
        result = solutions[1].encode_chunk(ids, merges)
        while merges:
            merges.popitem()
        return result

    assert ch01.check_encode_chunk(greedy_popper, ours).passed
    assert ours.merges == before and ours.encode(" unbelievably") == ours._bpe(" unbelievably")


def test_arguments_the_learner_mutates_do_not_change_what_the_check_compares():
    def top_p_in_place(logits, p):
        kept = solutions[5].keep_top_p(logits, p)
        logits.fill_(0.0)  # the learner's copy only
        return kept

    assert ch05.check_top_p(top_p_in_place).passed

    def admit_popping(arrivals, needed, running, free, max_batch, now):
        joined = solutions[8].admit(arrivals, needed, running, free, max_batch, now)
        arrivals.clear()
        return joined

    assert ch08.check_admission(admit_popping).passed

    def keys_reversing(tokens, size):
        keys = solutions[8].block_keys(tokens, size)
        tokens.reverse()
        return keys

    assert ch08.check_block_keys(keys_reversing).passed


def test_an_allocator_may_keep_its_free_blocks_in_a_set_and_its_counts_in_a_dict():
    class SetAndDict(solutions[8].MyAllocator):
        def __init__(self, num_blocks):
            self.free, self.refs = set(range(num_blocks)), {b: 0 for b in range(num_blocks)}

        def allocate(self):
            if not self.free:
                raise RuntimeError("no free block")
            block = min(self.free)
            self.free.remove(block)
            self.refs[block] = 1
            return block

        def release(self, block):
            if self.refs[block] == 0:
                raise RuntimeError("free already")
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.add(block)

    assert ch08.check_allocator(SetAndDict).passed
    class Renamed(solutions[8].MyAllocator):  # works, but keeps its free list under another name
        def __init__(self, num_blocks):
            super().__init__(num_blocks)
            self.available = self.__dict__.pop("free")

        def allocate(self):
            block = self.available.pop()
            self.refs[block] = 1
            return block

    not_yet(ch08.check_allocator(Renamed), "self.free")


def test_5_3_and_6_1_the_librarys_stop_rule_is_refused():
    """generate/stops.finish_reason answers 'why did it stop' for a whole SamplingParams: a loop that asks it has not
    written the stop rule, the exercise."""
    from llm_anatomy.generate.sampling import SamplingParams
    from llm_anatomy.generate.stops import finish_reason

    def by_the_rule(model, ids, n, stop_ids, cache=None):
        params, new = SamplingParams(max_tokens=n, stop_token_ids=sorted(stop_ids)), []
        while True:
            if cache is None:
                next_id = model(ids)[:, -1].argmax(-1, keepdim=True)
            else:
                next_id = model(ids if not new else ids[:, -1:], cache)[:, -1].argmax(-1, keepdim=True)
            new.append(int(next_id))
            ids = torch.cat([ids, next_id], dim=1)
            if finish_reason(params, new):
                return new, finish_reason(params, new)

    def cached(model, ids, n, stop_ids):
        return by_the_rule(model, ids, n, stop_ids, model.new_cache(1, ids.shape[1] + n))

    not_yet(ch05.check_generate_until_stop(by_the_rule), "don't call", "finish_reason")
    not_yet(ch06.check_generate_with_cache(cached), "don't call", "finish_reason")


def _keys_of(summary):
    """8.3 answers that chain correctly but summarise each block by `summary(block)`, which forgets something."""
    def keys_fn(tokens, block_size):
        keys, parent = [], ""
        for start in range(0, len(tokens) - block_size + 1, block_size):
            parent = hashlib.sha256((parent + str(summary(tokens[start:start + block_size]))).encode()).hexdigest()
            keys.append(parent)
        return keys
    return keys_fn


def _cut_to_two_hex_digits(tokens, block_size):
    keys, parent = [], ""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hashlib.sha256((parent + str(tokens[start:start + block_size])).encode()).hexdigest()[:2]
        keys.append(parent)
    return keys


@pytest.mark.parametrize("summary, named", [(sorted, "order"), (lambda b: sorted(set(b)), "order"),
                                           (sum, "order"), (lambda b: (b[0], b[-1]), "every token")])
def test_8_3_keys_that_ignore_a_blocks_contents_or_their_order_are_refused(summary, named):
    not_yet(ch08.check_block_keys(_keys_of(summary)), named)


def test_8_3_keys_short_enough_to_collide_are_refused():
    not_yet(ch08.check_block_keys(_cut_to_two_hex_digits), "collide", "another's K and V")


def test_8_3_keys_cut_short_enough_to_pass_600_prefixes_are_refused_all_the_same():
    def cut_to_8(tokens, block_size):
        keys, parent = [], ""
        for start in range(0, len(tokens) - block_size + 1, block_size):
            parent = hashlib.sha256((parent + str(tokens[start:start + block_size])).encode()).hexdigest()[:8]
            keys.append(parent)
        return keys

    not_yet(ch08.check_block_keys(cut_to_8), "too short", "whole")

    def raw_digests(tokens, block_size):  # the whole digest as bytes passes
        keys, parent = [], b""
        for start in range(0, len(tokens) - block_size + 1, block_size):
            parent = hashlib.sha256(parent + str(tokens[start:start + block_size]).encode()).digest()
            keys.append(parent)
        return keys

    assert ch08.check_block_keys(raw_digests).passed
