"""Checks for notebook 06 (the KV cache): the byte formula, GQA and MQA, users that fit, the cached decoding loop,
and the cache's own update (write at `length`, return a view).

The loop and the update run on a tiny random model the notebook never showed, and are compared with the library.
"""

from __future__ import annotations

import torch

from ..model.kv_cache import KVCache
from . import call, exercise, expect, forbidden_all, hint, hints, returned  # noqa: F401  (hint: for the notebook)
from ._tiny import Recorder, reference_tokens, stop_cases, stopped_on_the_prompt, tiny_model

# (layers, kv_heads, head_dim, bytes per number) -> bytes per token, from published configs
_KNOWN = {
    "Llama-2-7B (fp16)": ((32, 32, 128, 2), 524_288),
    "Llama-3-8B (bf16)": ((32, 8, 128, 2), 131_072),
    "Falcon-7B (bf16)": ((32, 1, 64, 2), 8_192),
    "SmolLM2-135M (bf16)": ((30, 3, 64, 2), 23_040),
    "SmolLM2-135M (fp32)": ((30, 3, 64, 4), 46_080),
}
GIB = 2**30


@exercise
@hints("Count what one token leaves behind in one layer first, then in all of them.",
       "Per layer and per KV head, a key of head_dim numbers AND a value of head_dim numbers.",
       "return 2 * layers * kv_heads * head_dim * bytes_per_element")
def check_kv_bytes_per_token(fn) -> str:
    """fn(layers, kv_heads, head_dim, bytes_per_element) -> bytes of K and V for one token."""
    expect(callable(fn), "give a function kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element).")
    for name, (args, expected) in _KNOWN.items():
        got = returned(call(fn, *args), "whole", "the bytes per token")
        if got != expected and (got * args[3] == expected or got == expected / 2):
            twice = returned(call(fn, *args[:3], 2 * args[3]), "whole", "the bytes per token")
            expect(twice != got, f"{name}: you got {got:,}, the NUMBERS of K and V per token, the same whatever "
                                 f"the format; multiply by bytes_per_element ({args[3]} bytes per number here).")
            expect(got != expected / 2, f"{name}: you got {got:,}, half the answer. Both K and V are stored: "
                                        "multiply by 2.")
        if got == expected // args[0]:
            expect(False, f"{name}: you got {got:,}. Every layer has its own K and V: multiply by the layers.")
        expect(got == expected, f"{name}: expected {expected:,} bytes per token, got {got!r}. "
                                "Multiply 2 (K and V) x layers x kv_heads x head_dim x bytes per number.")
    return "2 x layers x kv_heads x head_dim x bytes per number: 524,288 B for Llama-2-7B, 8,192 B for Falcon-7B."


@exercise
@hints("Both models have 32 layers and 2-byte numbers: only what one layer stores per token differs.",
       "Compare kv_heads x head_dim: 32 x 128 for Llama-2-7B, 1 x 64 for Falcon-7B (same layers, same bytes).",
       "answer = 524_288 / 8_192")
def check_mqa_saving(answer) -> str:
    """How many times less KV memory per token Falcon-7B (MQA) needs than Llama-2-7B (MHA), both in fp16."""
    expect(answer is not None, "assign a number to `answer`.")
    answer = returned(answer, "number", "the saving (a number, such as 10)")
    expect(abs(answer - 64) < 0.5,
           f"{answer} is off. Divide the two bytes-per-token figures in the table above; remember Falcon-7B's "
           "head_dim is 64, not 128.")
    return "64 times: one KV head of 64 numbers instead of 32 heads of 128."


@exercise
@hints("The weights are loaded first; only what is left holds caches.",
       "An '80 GB' GPU holds 80 GiB = 80 x 2**30 bytes; one user needs 131,072 B x 8,192 tokens.",
       "users = int((80 * 2**30 - 8.03e9 * 2) // (131_072 * 8_192))")
def check_users_that_fit(answer) -> str:
    """Users of Llama-3-8B at 8,192 tokens (bf16) whose caches fit in an "80 GB" (80 GiB) GPU beside 16.06e9 bytes
    of weights."""
    expect(answer is not None, "assign a whole number of users (your answer).")
    answer = returned(answer, "number", "the number of users")
    expect(answer.is_integer(), f"{answer:g} is not a whole number of users: round down (half a user's cache is no "
                                "use).")
    answer = int(answer)  # 65.0 from // on floats, or np.int64(65), is 65
    expect(answer != 80, "80 forgets the weights: they take 16.06e9 bytes (15 GiB) of the 80 GiB before any cache.")
    expect(answer != 59, "59 counts the GPU's memory as 80e9 bytes: an '80 GB' GPU holds 80 GiB = 85.9e9 bytes.")
    expect(answer != 66, "round down: the 66th user's cache would not fit entirely.")
    expect(answer == 65, f"{answer} is off. One user needs 131,072 B x 8,192 = 2**30 B (1 GiB); divide the memory "
                         "left after the weights, 80 x 2**30 - 16.06e9 bytes, by that.")
    return ("65 users on paper, 1 GiB of cache each; a server keeps some memory back (the CUDA context, activations), "
            "so in practice a few less.")


# ---------------------------------------------------------------------------------------------- the cached loop

@exercise
@hints("Start from your loop of exercise 5.5 and the cached loop above: the stop rule stays, the model calls change.",
       "Make ONE cache before the loop, big enough for the prompt and max_new_tokens; the first call feeds the whole "
       "prompt with it (prefill), every later call feeds ONLY the newest token, shape [1, 1], with the same cache.",
       "cache = model.new_cache(1, ids.shape[1] + max_new_tokens); logits = model(ids, cache); loop: next_id = "
       "logits[:, -1:].argmax(-1); keep it; stop on a stop id; else logits = model(next_id, cache)")
def check_generate_with_cache(generate_with_cache) -> str:
    """generate_with_cache(model, ids [1, seq], max_new_tokens, stop_ids) -> (new ids, reason 'stop' or 'length'),
    with a prefill and then one token per model call."""
    expect(callable(generate_with_cache),
           "define generate_with_cache(model, ids, max_new_tokens, stop_ids) returning (new ids, reason).")
    model = tiny_model()
    for ids, n, stop_ids, want, why in stop_cases(model, 7, ((6, 10), (3, 6))):
        prompt_len, stop = ids.shape[1], want[-1]
        rec = Recorder(model)
        try:
            out = call(generate_with_cache, rec, ids.clone(), n, set(stop_ids))
        except Exception:
            if not any(shape[1] > 1 for shape in rec.fed[1:]):
                raise
            out = ([], why)  # it fed whole sequences into the cache until it overflowed: the checks below say so
        out = returned(out, "pair", "(the new ids, the reason)")
        got, reason = returned(out[0], "ids", "the new ids"), out[1]
        expect(rec.fed, "your loop never called the model: logits = model(ids, cache).")
        expect(any(c is not None for c in rec.caches),
               "you passed no cache: make one with model.new_cache(1, max_len) and pass it to every call.")
        expect(all(c is not None for c in rec.caches), "a call got no cache: pass the same cache to every call, the "
                                                       "prefill and each decode step (model(next_id) alone sees only "
                                                       "the newest token, with nothing before it).")
        caches = {id(c) for c in rec.caches}
        expect(len(caches) == 1, f"you used {len(caches)} caches: make ONE before the loop, so that each step adds "
                                 "to what the earlier ones stored.")
        expect(rec.fed[0] == (1, prompt_len), f"the first call should feed the whole prompt, [1, {prompt_len}] "
                                              f"(the prefill), not {list(rec.fed[0])}.")
        longer = [shape for shape in rec.fed[1:] if shape[1] != 1]
        expect(not longer, "after the prefill, feed only the newest token, shape [1, 1]; you fed "
                           f"{list(longer[0]) if longer else ''}: the cache already holds every earlier position.")
        on_prompt = stopped_on_the_prompt(ids, got, reason, want, stop_ids)
        expect(on_prompt is None, on_prompt or "")
        if why == "stop":
            expect(len(got) <= len(want) or got[:len(want)] != want,
                   f"you went on after the stop token {stop}: stop as soon as you have made one of stop_ids.")
        else:
            expect(len(got) == n, f"without a stop token, make exactly max_new_tokens = {n} tokens, not {len(got)}.")
        expect(got == want, f"expected {want}, got {got}: take the last position's logits each time, and keep "
                            "the stop token.")
        expect(len(rec.fed) <= len(got) + 1, f"{len(got)} tokens need at most {len(got)} model calls (a prefill and "
                                             f"{len(got) - 1} steps); you made {len(rec.fed)}.")
        expect(reason == why, f"the tokens are right, but the reason should be {why!r}, not {reason!r}.")
    return "one prefill, then one token per call: each step's work no longer grows with the text."


# ---------------------------------------------------------------------------------------------- KVCache.update

def _small_cache(cls, length: int) -> KVCache:
    cache = cls.allocate(num_layers=2, batch_size=2, kv_heads=3, max_len=8, head_dim=4)
    g = torch.Generator().manual_seed(3)
    for layer in range(2):  # positions already filled, as if earlier calls wrote them
        cache.keys[layer][:, :, :length] = torch.randn(2, 3, length, 4, generator=g)
        cache.values[layer][:, :, :length] = torch.randn(2, 3, length, 4, generator=g)
    cache.length = length
    return cache


def _no_library_update() -> forbidden_all:
    return forbidden_all([(KVCache, "update")], "write at self.length yourself and return a view: the update is the "
                                                "exercise")


@exercise
@hints("The cache already holds `self.length` positions in each layer; the new ones go right after them.",
       "Write k and v into self.keys[layer] and self.values[layer] at positions length .. length + new (the third "
       "dimension), then return a slice of each up to length + new: a view, no copy. Do not change self.length.",
       "end = self.length + k.shape[2]; self.keys[layer][:, :, self.length:end] = k; (same for values); "
       "return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]")
def check_cache_update(update) -> str:
    """update(self, layer, k, v) -> (keys, values) of every position so far, as KVCache.update does."""
    expect(callable(update), "define update(self, layer, k, v) returning (keys, values).")
    learner = type("LearnerCache", (KVCache,), {"update": update})
    for length, new in ((3, 2), (0, 4), (5, 1)):
        cache, before = _small_cache(learner, length), _small_cache(KVCache, length)
        preallocated = cache.keys[1], cache.values[1]  # [batch, kv_heads, max_len, head_dim] each
        k, v = torch.randn(2, 3, new, 4), torch.randn(2, 3, new, 4)  # [batch, kv_heads, new, head_dim]
        with _no_library_update():
            got = returned(call(update, cache, 1, k.clone(), v.clone()), "pair", "(keys, values)")
        keys, values = (returned(t, "tensor", "the keys and the values") for t in got)
        expect(cache.keys[1] is preallocated[0] and cache.values[1] is preallocated[1],
               f"you replaced the cache's tensors (torch.cat makes new ones, {tuple(cache.keys[1].shape)} here): the "
               f"cache is allocated once for max_len = {before.max_len} positions, so that a step copies nothing. "
               "Write the new k and v into it, in place: self.keys[layer][:, :, length:end] = k.")
        expect(cache.length == length, f"the cache's length changed from {length} to {cache.length} inside update: "
                                        "leave it; the model advances it once, after every layer has written.")
        if length and torch.equal(cache.keys[1][:, :, :new], k) and not torch.equal(before.keys[1][:, :, :new], k):
            expect(False, "you wrote the new keys at position 0, over what earlier steps stored: write at self.length.")
        end = length + new
        expect(torch.equal(cache.keys[1][:, :, length:end], k) and torch.equal(cache.values[1][:, :, length:end], v),
               f"after update, positions {length}..{end - 1} of layer 1 must hold the new k and v.")
        expect(torch.equal(cache.keys[1][:, :, :length], before.keys[1][:, :, :length]),
               "the positions written before were changed: write only the new ones.")
        expect(torch.equal(cache.keys[0], before.keys[0]), "layer 0 changed: write only the layer you are given.")
        expect(tuple(keys.shape) != tuple(k.shape) or end == new,
               "you returned only the new k and v: the new token must attend to every position so far, "
               "so return positions 0 .. length + new.")
        expect(keys.shape[2] != cache.max_len or end == cache.max_len,
               f"you returned all {cache.max_len} slots, the unwritten ones too (zeros, which attention would read "
               f"as real keys): return the first length + new = {end}.")
        expect(tuple(keys.shape) == (2, 3, end, 4) and tuple(values.shape) == (2, 3, end, 4),
               f"return keys and values of shape [batch, kv_heads, {end}, head_dim], not {tuple(keys.shape)}.")
        expect(torch.equal(keys, cache.keys[1][:, :, :end]) and torch.equal(values, cache.values[1][:, :, :end]),
               "the tensors you return must be the cache's first length + new positions.")
        expect(keys.data_ptr() == cache.keys[1].data_ptr() and values.data_ptr() == cache.values[1].data_ptr(),
               "you return a copy (torch.cat or .clone()): it is right, but copies the whole cache at every layer of "
               "every step. Return a slice of the preallocated tensor, a view: no copy.")
    model = tiny_model()  # the whole model, decoding with the learner's cache, gives the library's tokens
    ids = torch.randint(3, model.cfg.vocab_size, (1, 5), generator=torch.Generator().manual_seed(9))
    cfg = model.cfg
    cache = learner.allocate(cfg.num_layers, 1, cfg.num_kv_heads, 5 + 8, cfg.head_dim)
    from ..generate.decode import generate_greedy

    with _no_library_update():
        got = generate_greedy(model, ids, 8, cache=cache).tokens[0].tolist()
    expect(got == reference_tokens(model, ids, 8), "the model decoding with your cache makes other tokens than with "
                                                   "the library's: compare your update with the steps above.")
    return "a write at `length` and a view: the cache costs no copy, and attention sees exactly the filled positions."
