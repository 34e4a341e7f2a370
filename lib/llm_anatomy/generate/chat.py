"""A chat turn, the quick way: the chat template plus transformers' generate.

Notebook 05 opens this up into the decoding loop; here it is only a convenience for the tour.
"""

from __future__ import annotations

import torch

from ..errors import CourseError
from ..model.config import check_context


def chat_prompt_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> torch.Tensor:
    """Token ids `[1, seq]` of a chat rendered with the model's own chat template."""
    if not messages or not all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages):
        raise CourseError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts.")
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                            return_tensors="pt", return_dict=True)
    return encoded["input_ids"]


def ask(loaded, question: str, max_new_tokens: int = 60) -> str:
    """The model's greedy answer to one user message, as text (special tokens removed)."""
    if not isinstance(question, str) or not question.strip():
        raise CourseError("Ask a question: the message is empty.")
    ids = chat_prompt_ids(loaded.tokenizer, [{"role": "user", "content": question}]).to(loaded.device)
    check_context(ids.shape[1] + max_new_tokens, loaded.config.max_position_embeddings)
    with torch.no_grad():
        out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                    do_sample=False, pad_token_id=loaded.tokenizer.eos_token_id)
    return loaded.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


def end_of_turn_ids(tokenizer) -> tuple[int, ...]:
    """The end-of-sequence id and `<|im_end|>` (the end of a chat turn), where the tokenizer has them."""
    ids = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    try:
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    except Exception:  # a tokenizer without it
        im_end = None
    if isinstance(im_end, int) and im_end != getattr(tokenizer, "unk_token_id", None):
        ids.add(im_end)
    return tuple(sorted(ids))
