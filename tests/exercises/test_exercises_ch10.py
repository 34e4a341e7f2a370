"""Notebook 10's checks: the solutions pass on layers and models they never saw; the typical mistakes get a hint."""

from __future__ import annotations

import torch
from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.distributed import tensor_parallel
from llm_anatomy.exercises import ch10

solutions = load_solutions("ch10")


def test_the_solutions_pass():
    for verdict in (ch10.check_column_and_row_split(solutions.column_split, solutions.row_split),
                    ch10.check_all_reduce_traffic(solutions.traffic),
                    ch10.check_tp_step_prediction(solutions.predict)):
        assert verdict.passed, verdict.message


def test_unattempted_exercises_say_not_yet():
    assert "not attempted" in ch10.check_column_and_row_split(unattempted, unattempted).message
    assert "not attempted" in ch10.check_all_reduce_traffic(unattempted).message
    assert "not attempted" in ch10.check_tp_step_prediction(unattempted).message
    not_yet(ch10.check_column_and_row_split(None, None), "define")


def test_split_mistakes():
    swapped = (solutions.row_split, solutions.column_split)
    not_yet(ch10.check_column_and_row_split(*swapped), "that is a row split")

    def strided_column(weight, rank, tp):
        return weight[rank::tp]

    not_yet(ch10.check_column_and_row_split(strided_column, solutions.row_split), "contiguous block")

    def strided_row(weight, rank, tp):
        return weight[:, rank::tp]

    not_yet(ch10.check_column_and_row_split(solutions.column_split, strided_row), "summed over the ranks")
    not_yet(ch10.check_column_and_row_split(lambda w, r, tp: w, solutions.row_split), "whole weight")

    def off_by_one(weight, rank, tp):
        k = weight.shape[0] // tp
        return weight[rank * k:(rank + 1) * k + 1]

    not_yet(ch10.check_column_and_row_split(off_by_one, solutions.row_split), "should have shape")
    not_yet(ch10.check_column_and_row_split(lambda w, r, tp: None, solutions.row_split), "returns None")


def test_the_librarys_split_is_refused_however_it_is_reached():
    def library_column(weight, rank, tp):
        return tensor_parallel.shard(weight, 0, rank, tp)

    verdict = ch10.check_column_and_row_split(library_column, solutions.row_split)
    not_yet(verdict, "don't call", "shard")


def test_traffic_mistakes():
    not_yet(ch10.check_all_reduce_traffic(lambda cfg, b, t, e: (2 * cfg.num_layers, b * t * cfg.hidden_size * e)),
            "forgot the embedding")
    not_yet(ch10.check_all_reduce_traffic(lambda cfg, b, t, e: (cfg.num_layers + 1, b * t * cfg.hidden_size * e)),
            "two row-split layers")
    not_yet(ch10.check_all_reduce_traffic(lambda cfg, b, t, e: (2 * cfg.num_layers + 1, b * t * cfg.vocab_size * e)),
            "not logits")
    not_yet(ch10.check_all_reduce_traffic(lambda cfg, b, t, e: (2 * cfg.num_layers + 1, t * cfg.hidden_size * e)),
            "multiply by the batch")
    not_yet(ch10.check_all_reduce_traffic(lambda cfg, b, t, e: 7), "two things", "(all-reduces, bytes each)")


def test_prediction_mistakes():
    def whole_compute(c, tp, layers, lat, bw, n):
        return c + 2 * layers * (lat + n / bw)

    def one_per_layer(c, tp, layers, lat, bw, n):
        return c / tp + layers * (lat + n / bw)

    def shrinking_collectives(c, tp, layers, lat, bw, n):
        return c / tp + 2 * layers * (lat + n / bw) / tp

    def milliseconds(c, tp, layers, lat, bw, n):
        return 1e3 * solutions.predict(c, tp, layers, lat, bw, n)

    not_yet(ch10.check_tp_step_prediction(whole_compute), "1/")
    not_yet(ch10.check_tp_step_prediction(one_per_layer), "two all-reduces")
    not_yet(ch10.check_tp_step_prediction(shrinking_collectives), "does not shrink")
    not_yet(ch10.check_tp_step_prediction(milliseconds), "Seconds throughout")
    not_yet(ch10.check_tp_step_prediction(lambda *a: "fast"), "as a number")


def test_the_split_check_compares_real_outputs():
    """The check runs the learner's shards on inputs: zeros of the right shape do not pass."""
    def zeros(weight, rank, tp):
        return torch.zeros(weight.shape[0] // tp, weight.shape[1])

    not_yet(ch10.check_column_and_row_split(zeros, solutions.row_split), "bit for bit")


def test_the_prediction_cases_are_physical():
    """Each case's compute is at least what reading its model's weights takes: the NVLink case's 70B model (141 GB in
    bf16) needs 42.1 ms on one H100 at 3.35e12 bytes/s, not the 4 ms an earlier version gave it."""
    seen = []

    def record(compute_s, tp, layers, latency_s, bytes_per_s, message_bytes):
        seen.append((compute_s, tp, layers))
        return solutions.predict(compute_s, tp, layers, latency_s, bytes_per_s, message_bytes)

    assert ch10.check_tp_step_prediction(record).passed
    seventy = [compute for compute, tp, layers in seen if layers == 80]  # Llama-3-70B's 80 layers
    assert seventy and min(seventy) >= 141e9 / 3.35e12
