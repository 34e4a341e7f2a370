"""How exactly the from-scratch model matches transformers: the reference checks behind `python -m llm_anatomy check`.

Every figure is a maximum absolute difference of logits (the vocabulary's raw scores), or a yes/no for identical
tokens. Our side always runs through the course's one decoding loop (generate/decode.py: `prefill`, `decode_step`,
`generate_greedy`); transformers' side through its own forward, DynamicCache and generate(). Cached runs are compared
two ways: with transformers fed the same tokens one by one through its DynamicCache (cached vs cached: the same sums
in the same order), and with transformers' full forward over the whole text (cached vs full: the same maths, summed
in a different order, so fp32 rounding differs a little more).

transformers computes attention with torch's fused SDPA kernel by default; we write it out, as its "eager"
implementation does (`eager_difference` compares with that one).
"""

from __future__ import annotations

import torch

from ..generate.decode import decode_step, greedy_tokens, left_pad, prefill
from ..model.scratch import ScratchLlama
from ..texts import python_topics
from ..weights.load import transformers_model


@torch.inference_mode()
def full_difference(hf_model, scratch: ScratchLlama, input_ids: torch.Tensor) -> float:
    """max |ours - transformers| over all logits of one full forward pass."""
    return float((scratch(input_ids) - transformers_model(hf_model)(input_ids).logits).abs().max())


@torch.inference_mode()
def eager_difference(hf_model, scratch: ScratchLlama, input_ids: torch.Tensor) -> float:
    """Like full_difference, with transformers' written-out ("eager") attention instead of its SDPA kernel."""
    hf = transformers_model(hf_model)
    before = hf.config._attn_implementation
    hf.set_attn_implementation("eager")
    try:
        return full_difference(hf, scratch, input_ids)
    finally:
        hf.set_attn_implementation(before)


@torch.inference_mode()
def cached_differences(hf_model, scratch: ScratchLlama, prompt_ids: torch.Tensor, steps: int) -> dict:
    """Prefill `prompt_ids` `[1, n]`, then decode `steps` greedy tokens one at a time, both models cached.

    Returns {"cached_vs_cached": max diff of every position's logits (the prompt's and each step's) against
    transformers' own cached run, "cached_vs_full": max diff against transformers' full forward over the final
    text, "tokens": positions compared}.
    """
    from transformers import DynamicCache

    hf = transformers_model(hf_model)
    ref_cache = DynamicCache(config=hf.config)
    cache = scratch.new_cache(1, prompt_ids.shape[1] + steps)
    ours_steps, worst, ids, feed = [], 0.0, prompt_ids, prompt_ids
    for step in range(steps + 1):
        ref = hf(feed, cache=ref_cache, use_cache=True).logits
        # the prefill keeps every position's logits, to compare the whole prompt too
        mine = (prefill(scratch, feed, cache, logits_to_keep=0) if step == 0 else decode_step(scratch, feed, cache)).logits
        worst = max(worst, float((mine - ref).abs().max()))
        ours_steps.append(mine)
        feed = ref[:, -1:].argmax(-1)  # both continue with the same token
        ids = torch.cat([ids, feed], dim=1)
    ours_all = torch.cat(ours_steps, dim=1)  # [1, n + steps, vocab]
    full = hf(ids[:, :-1]).logits
    return {"cached_vs_cached": worst, "cached_vs_full": float((ours_all - full).abs().max()),
            "tokens": ids.shape[1] - 1}


def padded_prompts(tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids `[batch, longest]` of `prompts` with left padding, and the attention mask (1 = token, 0 = padding)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return left_pad([tokenizer.encode(p, add_special_tokens=False) for p in prompts], pad)


@torch.inference_mode()
def padded_differences(hf_model, scratch: ScratchLlama, ids: torch.Tensor, mask: torch.Tensor,
                       steps: int = 8) -> dict:
    """A left-padded batch: full forward, then `steps` cached greedy steps, vs transformers (real tokens only).

    transformers gets the positions as generate() computes them (padding does not count); ours is given the same
    mask at every call, extended by a column each step (the cache stores keys and values, never the padding). Also
    compares each row with the same prompt run alone, without padding.
    """
    from transformers import DynamicCache

    hf = transformers_model(hf_model)
    real_tokens = mask.bool()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    ref = hf(ids, attention_mask=mask, position_ids=positions).logits
    mine = scratch(ids, attention_mask=mask)
    full = float((mine - ref)[real_tokens].abs().max())
    alone = 0.0
    for row in range(ids.shape[0]):
        own = scratch(ids[row:row + 1][:, real_tokens[row]])  # the prompt alone, no padding
        alone = max(alone, float((own[0] - mine[row, real_tokens[row]]).abs().max()))
    ref_cache = DynamicCache(config=hf.config)
    cache = scratch.new_cache(ids.shape[0], ids.shape[1] + steps)
    feed, feed_positions, worst = ids, positions, 0.0
    for step in range(steps + 1):
        ref = hf(feed, attention_mask=mask, position_ids=feed_positions, cache=ref_cache, use_cache=True).logits
        out = prefill(scratch, feed, cache, attention_mask=mask, logits_to_keep=0) if step == 0 else \
            decode_step(scratch, feed, cache, attention_mask=mask)
        rows_real = mask[:, -feed.shape[1]:].bool()
        worst = max(worst, float((out.logits - ref)[rows_real].abs().max()))
        feed = ref[:, -1:].argmax(-1)
        mask = torch.cat([mask, torch.ones_like(feed)], dim=1)
        feed_positions = feed_positions[:, -1:] + 1
    return {"padded_full": full, "padded_vs_alone": alone, "padded_cached": worst}


@torch.inference_mode()
def greedy_matches(hf_model, tokenizer, scratch: ScratchLlama, prompt_ids: torch.Tensor,
                   max_new_tokens: int = 128) -> dict:
    """Our greedy tokens vs transformers' generate(do_sample=False); identical when the lists are equal."""
    hf = transformers_model(hf_model)
    ref = hf.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), do_sample=False,
                      max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    theirs = ref[0, prompt_ids.shape[1]:].tolist()
    ours = greedy_tokens(scratch, prompt_ids, max_new_tokens, eos_token_id=hf.generation_config.eos_token_id)
    return {"identical": ours == theirs, "ours": ours, "theirs": theirs}


def natural_text_ids(tokenizer, n: int, topic: str = "assignment") -> torch.Tensor:
    """`[1, n]` ids of real English text that ships with Python (its documentation topics, `topic` first)."""
    ids = []
    for text in python_topics(topic):
        ids += tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= n:
            break
    return torch.tensor([ids[:n]])
