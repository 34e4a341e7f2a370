"""The quick chat turn (generate/chat.py): the model's own template, its end-of-turn ids, and ask() against our loop."""

from __future__ import annotations

import pytest

from llm_anatomy.errors import CourseError
from llm_anatomy.generate.chat import ask, chat_prompt_ids, end_of_turn_ids


def test_the_chat_prompt_is_the_models_own_template(reference_tokenizer):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = chat_prompt_ids(reference_tokenizer, messages)
    assert ids.shape[0] == 1 and ids[0].tolist() == reference_tokenizer.apply_chat_template(messages, tokenize=True,
                                                                                           add_generation_prompt=True,
                                                                                           return_dict=True)["input_ids"]
    text = reference_tokenizer.decode(ids[0])
    assert "What is the capital of France?" in text and text.endswith("<|im_start|>assistant\n")  # the answer's turn
    bare = chat_prompt_ids(reference_tokenizer, messages, add_generation_prompt=False)
    assert bare.shape[1] < ids.shape[1]


@pytest.mark.parametrize("messages", [[], [{"role": "user"}], ["hello"], [{"content": "hi"}]])
def test_malformed_messages_are_refused(reference_tokenizer, messages):
    with pytest.raises(CourseError, match="role"):
        chat_prompt_ids(reference_tokenizer, messages)


def test_end_of_turn_ids(reference_tokenizer):
    im_end = reference_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert set(end_of_turn_ids(reference_tokenizer)) == {reference_tokenizer.eos_token_id, im_end}

    class NoChat:
        eos_token_id, unk_token_id = 2, 0

        def convert_tokens_to_ids(self, token):
            return self.unk_token_id  # a tokenizer without <|im_end|> maps it to the unknown token

    class Raises(NoChat):
        def convert_tokens_to_ids(self, token):
            raise KeyError(token)

    assert end_of_turn_ids(NoChat()) == end_of_turn_ids(Raises()) == (2,)


def test_ask_answers_as_our_own_greedy_loop_does(real, real_scratch):
    from llm_anatomy.generate.session import generate

    answer = ask(real, "What is the capital of France?", max_new_tokens=12)
    ours = generate(real_scratch, real.tokenizer, "What is the capital of France?", 12)
    assert "Paris" in answer and answer == ours.strip()
    with pytest.raises(CourseError, match="empty"):
        ask(real, "   ")
    with pytest.raises(CourseError, match="context"):
        ask(real, "Hi", max_new_tokens=real.config.max_position_embeddings)
