"""Checks for notebook 06 (the KV cache)."""

from __future__ import annotations

from . import exercise, expect

# (layers, kv_heads, head_dim, bytes per number) -> bytes per token, from published configs
_KNOWN = {
    "Llama-2-7B (fp16)": ((32, 32, 128, 2), 524_288),
    "Llama-3-8B (bf16)": ((32, 8, 128, 2), 131_072),
    "Falcon-7B (bf16)": ((32, 1, 64, 2), 8_192),
    "SmolLM2-135M (bf16)": ((30, 3, 64, 2), 23_040),
    "SmolLM2-135M (fp32)": ((30, 3, 64, 4), 46_080),
}


@exercise
def check_kv_bytes_per_token(fn) -> str:
    """fn(layers, kv_heads, head_dim, bytes_per_element) -> bytes of K and V for one token."""
    expect(callable(fn), "give a function kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element).")
    for name, (args, expected) in _KNOWN.items():
        got = fn(*args)
        expect(got is not None, "your function returns None: end it with `return ...`.")
        if got == expected / 2:
            expect(False, f"{name}: you got {got:,}, half the answer. Both K and V are stored: multiply by 2.")
        if got == expected // args[0]:
            expect(False, f"{name}: you got {got:,}. Every layer has its own K and V: multiply by the layers.")
        expect(got == expected, f"{name}: expected {expected:,} bytes per token, got {got!r}. "
                                "Multiply 2 (K and V) x layers x kv_heads x head_dim x bytes per number.")
    return "2 x layers x kv_heads x head_dim x bytes per number: 524,288 B for Llama-2-7B, 8,192 B for Falcon-7B."


@exercise
def check_mqa_saving(answer) -> str:
    """How many times less KV memory per token Falcon-7B (MQA) needs than Llama-2-7B (MHA), both in fp16."""
    expect(answer is not None, "assign a number to `answer`.")
    expect(isinstance(answer, (int, float)) and not isinstance(answer, bool), "give a number, such as 10.")
    expect(abs(answer - 64) < 0.5,
           f"{answer} is off. Divide the two bytes-per-token figures in the table above; remember Falcon-7B's "
           "head_dim is 64, not 128.")
    return "64 times: one KV head of 64 numbers instead of 32 heads of 128."


@exercise
def check_users_that_fit(answer) -> str:
    """Users of Llama-3-8B at 8,192 tokens (bf16) whose caches fit in an 80 GB GPU beside the 16.06 GB of weights."""
    expect(answer is not None, "assign a whole number of users (your answer).")
    expect(isinstance(answer, int) and not isinstance(answer, bool),
           "give a whole number of users (round down: half a user's cache is no use).")
    expect(answer != 74, "74 forgets the weights: they take 16.06 GB of the 80 GB before any cache.")
    expect(answer != 60, "round down: the 60th user's cache would not fit entirely.")
    expect(answer == 59, f"{answer} is off. One user needs 131,072 B x 8,192 = 1,073,741,824 B; "
                         "divide the memory left after the weights, (80 - 16.06) x 1e9 bytes, by that.")
    return "59 users: each 8K-token conversation takes about 1.07 GB of cache."
