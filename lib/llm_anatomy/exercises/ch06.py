"""Checks for notebook 06 (the KV cache): a model's cache bytes from its config (MHA, GQA, MQA, MLA, sliding and
hybrid windows), users that fit, the cached decoding loop, and the cache's own update (write at `length`, return a
view).

The loop and the update run on a tiny random model the notebook never showed, and are compared with the library.
"""

from __future__ import annotations

import torch

from ..generate import stops
from ..model.kv_cache import KVCache
from . import call, exercise, expect, forbidden_all, hint, hints, returned  # noqa: F401  (hint: for the notebook)
from ._watch import aten_made
from ._tiny import (Recorder, reference_tokens, stop_as_the_last_token, stop_cases, stopped_on_the_prompt,
                    tiny_model)

GIB = 2**30


def _held_back_configs() -> list[tuple[str, dict, int]]:
    """(what, config, bytes per number) the notebook never showed: one of each layout, with the traps real configs
    hold (no num_key_value_heads, a head_dim that is not hidden / heads, an MLA config that also names its heads)."""
    hybrid = ["full_attention" if i % 4 == 3 else "sliding_attention" for i in range(16)]
    return [("an MHA model in fp32 whose config has no num_key_value_heads",
             dict(num_hidden_layers=12, num_attention_heads=12, hidden_size=768), 4),
            ("a GQA model with head_dim 256 (not hidden_size / heads = 288)",
             dict(num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, hidden_size=2304,
                  head_dim=256), 2),  # Gemma-2-2B's shape: ignoring head_dim is not off by the factor 2 of K alone
            ("an MQA model", dict(num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=1,
                                  hidden_size=2048), 2),
            ("an MLA model (its config names 16 KV heads too)",
             dict(num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, hidden_size=2048,
                  kv_lora_rank=512, qk_rope_head_dim=64), 2),
            ("a model with a 2,048-token window on every layer",
             dict(num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=4, hidden_size=2048,
                  sliding_window=2048), 2),
            ("a hybrid model, one global layer in four, a 512-token window",
             dict(num_hidden_layers=16, num_attention_heads=8, num_key_value_heads=2, hidden_size=1024, head_dim=256,
                  sliding_window=512, layer_types=hybrid), 2)]


def _no_window(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in ("sliding_window", "layer_types")}


@exercise
@hints("Read the layout from the config first: an MLA config has kv_lora_rank; a windowed one has sliding_window "
       "(and layer_types, if only some layers are local); every other one is MHA, GQA or MQA by its KV heads.",
       "MHA/GQA/MQA: 2 (K and V) x kv_heads x head_dim x bytes per token per layer, with the defaults the config "
       "leaves out (kv_heads = heads, head_dim = hidden_size // heads). MLA: (kv_lora_rank + qk_rope_head_dim) x "
       "bytes per token per layer, no 2. A local layer holds min(context, sliding_window) tokens.",
       "if MLA: return layers * (rank + rope) * b * context; per_token_layer = 2 * kv * head_dim * b; local = "
       "[t == 'sliding_attention' for t in layer_types] (or all layers if only sliding_window); return "
       "sum(per_token_layer * (min(context, window) if l else context) for l in local)")
def check_kv_cache_bytes(kv_cache_bytes) -> str:
    """kv_cache_bytes(config dict, context, bytes_per_element) -> bytes of one sequence's KV cache, for MHA, GQA,
    MQA, MLA and sliding-window/hybrid configs the notebook never showed, below and beyond their windows."""
    from ..measure import kv_memory
    from ..model import kv_cache

    expect(callable(kv_cache_bytes), "define kv_cache_bytes(config, context, bytes_per_element) returning bytes.")
    library = [(kv_memory, "kv_cache_bytes_from_config"), (kv_memory, "kv_bytes_per_token"), (kv_cache, "kv_bytes"),
               (kv_cache, "kv_cache_bytes")]
    for what, config, size in _held_back_configs():
        for context in (300, 8_000):
            with forbidden_all(library, "read the config and count the bytes yourself: that is the exercise"):
                got = returned(call(kv_cache_bytes, dict(config), context, size), "whole", "the bytes")
            want = kv_memory.kv_cache_bytes_from_config(config, context, size)
            if got == want:
                continue
            where = f"for {what}, {context:,} tokens, {size}-byte numbers"
            L = config["num_hidden_layers"]
            as_heads = dict(config, kv_lora_rank=None)
            mistakes = [(want // 2 if config.get("kv_lora_rank") is None else None,
                         "you stored only the keys: K AND V are kept, a factor 2."),
                        (2 * want if config.get("kv_lora_rank") else None,
                         "MLA keeps ONE latent per token and layer, from which K and V are both rebuilt: no factor 2."),
                        (kv_memory.kv_cache_bytes_from_config(as_heads, context, size) if config.get("kv_lora_rank")
                         else None, "this is an MLA config (kv_lora_rank is set): it caches the latent of kv_lora_rank "
                                    "numbers plus the qk_rope_head_dim RoPE key per layer, not K and V per head."),
                        (L * config.get("kv_lora_rank", 0) * size * context if config.get("kv_lora_rank") else None,
                         "MLA also keeps the shared RoPE key, qk_rope_head_dim numbers per token and layer."),
                        (kv_memory.kv_cache_bytes_from_config(_no_window(config), context, size)
                         if config.get("sliding_window") else None,
                         "a local layer keeps at most sliding_window tokens: min(context, sliding_window)."),
                        (kv_memory.kv_cache_bytes_from_config(dict(config, layer_types=None), context, size)
                         if config.get("layer_types") else None,
                         "only the layers that layer_types calls 'sliding_attention' are local; the "
                         "'full_attention' ones keep every token."),
                        (kv_memory.kv_cache_bytes_from_config(dict(config, num_key_value_heads=1), context, size)
                         if "num_key_value_heads" not in config else None,
                         "a config without num_key_value_heads is MHA: one K and V head per attention head."),
                        (kv_memory.kv_cache_bytes_from_config(dict(config, head_dim=None), context, size)
                         if config.get("head_dim") else None,
                         "use the config's head_dim when it gives one: hidden_size // heads is only the default."),
                        (want // size, "you counted NUMBERS, not bytes: multiply by bytes_per_element "
                                       f"({size} bytes per number here)."),
                        (want // context, "that is the bytes of ONE token: multiply by the tokens each layer keeps.")]
            for wrong, message in mistakes:
                expect(wrong is None or got != wrong, f"{where}: {message}")
            expect(False, f"{where}: expected {want:,} bytes, got {got:,}.")
    return ("one formula per layout: K and V per head for MHA/GQA/MQA, one latent for MLA, a window for local layers. "
            "The model's config says which.")


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

def _no_stop_rule() -> forbidden_all:
    """The library's stop rule refused: deciding when and why to stop is part of the exercise."""
    return forbidden_all([(stops, "finish_reason")], "compare each new token with stop_ids and count the tokens "
                                                     "yourself, as in exercise 5.3.")


_OVERFLOWED = object()  # what the learner's loop "returned" when it overflowed the cache


def _fed_as_ids(rec: Recorder) -> None:
    """Every call must feed ids shaped [batch, seq]: the newest token alone is [1, 1], not [1] or a number."""
    flat = next((shape for shape in rec.fed if len(shape) != 2), None)
    expect(flat is None, f"you fed the model ids of shape {list(flat or ())}: it takes [batch, seq], so feed the newest "
                         "token as [1, 1] (torch.tensor([[next_id]]), or logits[:, -1:].argmax(-1)).")

@exercise
@hints("Start from your loop of exercise 5.3 and the cached loop above: the stop rule stays, the model calls change.",
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
            with _no_stop_rule():
                out = call(generate_with_cache, rec, ids.clone(), n, set(stop_ids))
        except Exception:
            _fed_as_ids(rec)
            if not any(shape[1] > 1 for shape in rec.fed[1:]):
                raise
            out = _OVERFLOWED  # it fed whole sequences into the cache until it overflowed: the checks below say so
        _fed_as_ids(rec)
        overflowed, out = out is _OVERFLOWED, ([], why) if out is _OVERFLOWED else out
        out = returned(out, "pair", "(the new ids, the reason)")
        got, reason = returned(out[0], "ids", "the new ids"), out[1]
        on_prompt = None if overflowed else stopped_on_the_prompt(ids, got, reason, want, stop_ids)
        expect(on_prompt is None, on_prompt or "")
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
        if why == "stop":
            expect(len(got) <= len(want) or got[:len(want)] != want,
                   f"you went on after the stop token {stop}: stop as soon as you have made one of stop_ids.")
        else:
            expect(len(got) == n, f"without a stop token, make exactly max_new_tokens = {n} tokens, not {len(got)}.")
        expect(got == want, f"expected {want}, got {got}: take the last position's logits each time, and keep "
                            "the stop token.")
        expect(len(rec.fed) != len(got) + 1, f"{len(got)} tokens need {len(got)} model calls (a prefill and "
                                             f"{len(got) - 1} steps); you made one more, after the last token: a "
                                             "wasted forward pass whose logits nobody reads. Decide whether to stop "
                                             "(a stop id, or max_new_tokens made) before calling the model again.")
        expect(len(rec.fed) <= len(got), f"{len(got)} tokens need {len(got)} model calls (a prefill and "
                                         f"{len(got) - 1} steps); you made {len(rec.fed)}.")
        last = stop_as_the_last_token(got, reason, want, why, n)
        expect(last is None, last or "")
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


class _Copies:
    """The largest tensor any torch op allocated while the block ran (cat, stack, dstack, clone, a torch.where over
    the whole cache, past * 1: whatever made it): an update that writes only the new k and v allocates none larger
    than them."""

    def __enter__(self):
        self.largest = 0

        def seen(t):
            self.largest = max(self.largest, t.numel())

        self._watch = aten_made(seen)
        self._watch.__enter__()
        return self

    def __exit__(self, *exc):
        return self._watch.__exit__(*exc)


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
        with _no_library_update(), _Copies() as copies:
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
        expect(copies.largest <= k.numel(), f"right, but your update copied {copies.largest} numbers for {k.numel()} "
                                            "new ones (the positions already stored were copied, by cat, clone, where "
                                            "or arithmetic, and written back): every step of every layer would copy "
                                            "the whole cache. "
                                            "Write only the new k and v: self.keys[layer][:, :, length:end] = k.")
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
