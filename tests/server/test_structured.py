"""response_format (server/structured.py): answers constrained to JSON, through the real `openai` client against the
shared server (conftest.py), whole, streamed and parsed into a pydantic model; schemas outside the subset refused
with a 400 that names the feature; an answer cut by max_tokens ends "length"; and on the course's scheduler, a
constrained row beside plain rows leaves their greedy tokens those of transformers' generate."""

from __future__ import annotations

import concurrent.futures as cf
import json

import jsonschema
import openai
import pydantic
import pytest

from llm_anatomy.constrained import UnsupportedSchema, compile_pattern
from llm_anatomy.server.schemas import ChatRequest
from llm_anatomy.server.structured import Formats, format_pattern, inline_refs, json_object_pattern

ASK = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
OBJECT = {"type": "json_object"}


class Country(pydantic.BaseModel):
    name: str
    capital: str


class Where(pydantic.BaseModel):
    city: str


class Nested(pydantic.BaseModel):  # pydantic writes Where as a "$defs" entry and a "$ref" to it
    country: str
    where: Where


@pytest.fixture(scope="module")
def formats(reference_tokenizer):
    """The maskers of this module's formats, over the default model's vocabulary (its bytes and trie made once)."""
    return Formats(reference_tokenizer, keep=4)


def _format(schema: dict, name: str = "answer") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def _parsed_format(body: dict):
    return ChatRequest.model_validate({"model": "m", "messages": ASK, "response_format": body}).response_format


# --------------------------------------------------------------------------- the patterns, without a model


def test_json_object_takes_objects_nested_three_deep_as_json_dumps_writes_them():
    dfa = compile_pattern(json_object_pattern())
    good = [{}, {"a": 1}, {"a": "x", "b": [1, 2.5, -3e4, True, None]}, {"a": {"b": {"c": "é"}}}, {"a": [[], {}]},
            {"a": [{"b": 1}]}]
    for value in good:
        assert dfa.matches(json.dumps(value, ensure_ascii=False)), value
    for text in ['{"a": {"b": {"c": {"d": 1}}}}', '{"a": [[[1]]]}', '{"a": [{"b": [1]}]}',  # four levels: too deep
                 '{"a":1}', '{"a": 1,}', '[1]', '"x"', '{"a": 01}', '{\n"a": 1}', '{"a": nul}']:
        assert not dfa.matches(text), text


def test_pydantic_refs_are_written_out_in_place_and_recursive_ones_refused():
    schema = inline_refs(Nested.model_json_schema())
    assert "$defs" not in schema and schema["properties"]["where"]["properties"] == {"city": {"title": "City",
                                                                                              "type": "string"}}
    dfa = compile_pattern(format_pattern(_parsed_format(_format(Nested.model_json_schema()))))
    assert dfa.matches('{"country": "France", "where": {"city": "Paris"}}')
    loop = {"$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}},
                               "required": ["next"]}}, "$ref": "#/$defs/Node"}
    with pytest.raises(UnsupportedSchema, match="recursive"):
        inline_refs(loop)
    with pytest.raises(UnsupportedSchema, match="does not point into its own"):
        inline_refs({"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}})
    with pytest.raises(UnsupportedSchema, match="maxLength 100000 is over 256"):
        format_pattern(_parsed_format(_format({"type": "string", "maxLength": 100_000})))
    assert format_pattern(_parsed_format({"type": "text"})) is None


def test_a_pattern_is_compiled_once_and_its_maskers_share_the_vocabulary(formats, reference_tokenizer):
    first, again = formats.row_mask(_parsed_format(_format({"type": "boolean"}))), \
        formats.row_mask(_parsed_format(_format({"type": "boolean"})))
    other = formats.row_mask(_parsed_format(_format({"enum": ["yes", "no"]})))
    assert first.masker is again.masker and first is not again  # one masker, a state per request
    assert other.masker.trie is first.masker.trie and other.masker.dfa is not first.masker.dfa
    quote = reference_tokenizer.encode('"')  # an enum's string starts with it; a boolean does not
    assert len(quote) == 1 and bool(other.masker.allowed(other.state)[quote[0]])
    assert not bool(first.masker.allowed(first.state)[quote[0]])  # each pattern its own masks
    other.advance(quote[0])
    assert other.state != other.masker.dfa.start and again.state == again.masker.dfa.start


# --------------------------------------------------------------------------- on the course's scheduler


def test_plain_rows_keep_their_greedy_tokens_beside_constrained_rows(real, real_scratch, greedy_reference, formats):
    from llm_anatomy.generate.chat import chat_prompt_ids
    from llm_anatomy.serve.batching import Request
    from llm_anatomy.serve.paged_kv import PagedKVPool
    from llm_anatomy.serve.scheduler import ContinuousScheduler

    eos = real.tokenizer.eos_token_id
    ids = chat_prompt_ids(real.tokenizer, ASK)[0].tolist()
    plain = [Request(ids, 8), Request(real.tokenizer("The capital of France is").input_ids, 8)]
    shaped = [Request(ids, 24, eos_token_id=eos, constraint=formats.row_mask(_parsed_format(OBJECT))),
              Request(ids, 24, eos_token_id=eos, constraint=formats.row_mask(_parsed_format(
                  _format(Country.model_json_schema()))))]
    sched = ContinuousScheduler(real_scratch, PagedKVPool.for_model(real_scratch, 32, 16), max_batch=4)
    done = sched.run([plain[0], shaped[0], plain[1], shaped[1]])
    assert [r.output for r in done if r.constraint is None] == [greedy_reference(r.prompt, 8, eos_token_id=None)
                                                                for r in plain]
    texts = [real.tokenizer.decode(r.output[:-1]) for r in done if r.constraint is not None]
    assert all(r.finish_reason == "stop" for r in done if r.constraint is not None), texts
    assert isinstance(json.loads(texts[0]), dict)
    Country.model_validate_json(texts[1])


# --------------------------------------------------------------------------- through the API


def test_a_json_object_answer_whole_and_streamed_is_the_same_json(client, model_id):
    whole = client.chat.completions.create(model=model_id, messages=ASK, max_tokens=40, temperature=0,
                                           response_format=OBJECT, logprobs=True, top_logprobs=2)
    text = whole.choices[0].message.content
    assert whole.choices[0].finish_reason == "stop" and isinstance(json.loads(text), dict)
    # the logprobs are the model's own, before the mask (vLLM's default): finite, the chosen token's included
    entries = whole.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == text and all(e.logprob > float("-inf") for e in entries)
    chunks = list(client.chat.completions.create(model=model_id, messages=ASK, max_tokens=40, temperature=0,
                                                 response_format=OBJECT, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_json_schema_answer_validates_and_parse_fills_a_pydantic_model(client, model_id):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "big": {"type": "boolean"}}, "required": ["city", "big"],
              "additionalProperties": False}  # a bounded string: a sampled answer can always end in time
    r = client.chat.completions.create(model=model_id, messages=ASK, max_tokens=40, temperature=1.0, seed=0,
                                       response_format=_format(schema, "place"))  # sampled: whatever it draws
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    for model in (Country, Nested):
        r = client.chat.completions.parse(model=model_id, messages=ASK, max_tokens=40, temperature=0,
                                          response_format=model)
        assert r.choices[0].finish_reason == "stop" and isinstance(r.choices[0].message.parsed, model)


@pytest.mark.parametrize("schema, feature", [
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "a+"}}, "required": ["a"]}, "'pattern'"),
    ({"type": "object", "properties": {"a": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}, "required": ["a"]},
     "'anyOf'"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, "optional properties"),
])
def test_an_unsupported_schema_is_a_400_naming_the_feature_and_the_server_goes_on(client, model_id, schema, feature):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model_id, messages=ASK, max_tokens=4, response_format=_format(schema))
    error = refused.value.body
    assert feature in error["message"] and error["message"].count(". ") == 0  # one sentence
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "response_format",
                                                              "unsupported_schema")
    assert client.chat.completions.create(model=model_id, messages=ASK, max_tokens=1).choices[0].finish_reason


def test_a_cut_answer_ends_length_while_a_plain_request_beside_it_is_unaffected(client, model_id):
    alone = client.chat.completions.create(model=model_id, messages=ASK, max_tokens=12, temperature=0)
    with cf.ThreadPoolExecutor(2) as pool:
        cut = pool.submit(client.chat.completions.create, model=model_id, messages=ASK, max_tokens=3, temperature=0,
                          response_format=_format(Country.model_json_schema()))
        plain = pool.submit(client.chat.completions.create, model=model_id, messages=ASK, max_tokens=12,
                            temperature=0)
        cut, plain = cut.result(timeout=120), plain.result(timeout=120)
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 3
    assert cut.choices[0].message.content.startswith('{"name"')  # the schema's start, unfinished
    assert plain.choices[0].message.content == alone.choices[0].message.content
