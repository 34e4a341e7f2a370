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


# =========================================================================== 5.2, 5.3: top-p on screen, the loop


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
