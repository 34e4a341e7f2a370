"""Notebook 10's checks: the solutions pass on layers and models they never saw; the typical mistakes get a hint."""

from __future__ import annotations

import pytest
import torch
from exercise_helpers import load_solutions, not_yet, unattempted

from llm_anatomy.distributed import pipeline, tensor_parallel
from llm_anatomy.distributed.tensor_parallel import RowParallelLinear, VocabParallelEmbedding
from llm_anatomy.exercises import ch10

solutions = load_solutions("ch10")


def test_the_solutions_pass():
    for verdict in (ch10.check_column_and_row_split(solutions.column_split, solutions.row_split),
                    ch10.check_all_reduce_traffic(solutions.traffic),
                    ch10.check_tp_step_prediction(solutions.predict),
                    ch10.check_row_parallel_linear(solutions.MyRowParallelLinear),
                    ch10.check_vocab_parallel_embedding(solutions.vocab_shard, solutions.MyVocabParallelEmbedding),
                    ch10.check_gpipe_loop(solutions.gpipe)):
        assert verdict.passed, verdict.message


def test_unattempted_exercises_say_not_yet():
    assert "not attempted" in ch10.check_column_and_row_split(unattempted, unattempted).message
    assert "not attempted" in ch10.check_all_reduce_traffic(unattempted).message
    assert "not attempted" in ch10.check_tp_step_prediction(unattempted).message
    not_yet(ch10.check_column_and_row_split(None, None), "define")

    class Stub(RowParallelLinear):
        def forward(self, x):
            raise NotImplementedError

    class StubEmbedding(VocabParallelEmbedding):
        def forward(self, input_ids):
            raise NotImplementedError

    assert "not attempted" in ch10.check_row_parallel_linear(Stub).message
    assert "not attempted" in ch10.check_vocab_parallel_embedding(unattempted, StubEmbedding).message
    assert "not attempted" in ch10.check_vocab_parallel_embedding(solutions.vocab_shard, StubEmbedding).message
    assert "not attempted" in ch10.check_gpipe_loop(unattempted).message


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


# --------------------------------------------------------------------------------------------- 10.2


def row_layer(forward):
    """A learner's RowParallelLinear subclass whose forward is `forward(self, x)`."""
    return type("MyRowParallelLinear", (RowParallelLinear,), {"forward": forward})


def test_row_parallel_mistakes():
    not_yet(ch10.check_row_parallel_linear(row_layer(lambda self, x: x @ self.weight.T)), "no all-reduce",
            "partial sum")

    def input_reduced(self, x):
        return self.comm.all_reduce(x.clone(), self.site) @ self.weight.T

    not_yet(ch10.check_row_parallel_linear(row_layer(input_reduced)), "all-reduced the input")

    def averaged(self, x):
        return self.comm.all_reduce(x @ self.weight.T / self.comm.world_size, self.site)

    not_yet(ch10.check_row_parallel_linear(row_layer(averaged)), "divided by the TP degree")
    not_yet(ch10.check_row_parallel_linear(row_layer(lambda self, x: self.comm.all_reduce(x @ self.weight.T, "x"))),
            "self.site")

    def twice(self, x):
        y = self.comm.all_reduce(x @ self.weight.T, self.site)
        return self.comm.all_reduce(y, self.site)

    not_yet(ch10.check_row_parallel_linear(row_layer(twice)), "2 all-reduces")

    def copied(self, x):
        return self.comm.all_reduce(x @ self.weight.T, self.site).clone()

    not_yet(ch10.check_row_parallel_linear(row_layer(copied)), "a copy")
    not_yet(ch10.check_row_parallel_linear(row_layer(lambda self, x: None)), "you gave None")
    not_yet(ch10.check_row_parallel_linear(solutions.vocab_shard), "subclass of RowParallelLinear")
    not_yet(ch10.check_row_parallel_linear(RowParallelLinear), "no forward of its own")


def test_a_row_layer_that_gathers_the_whole_input_and_computes_the_full_matmul_is_refused():
    def gathered(self, x):  # every rank: the whole input, the whole weight, the whole matmul, no sum
        return self.comm.all_gather(x, self.site) @ self.comm.all_gather(self.weight, self.site).T

    not_yet(ch10.check_row_parallel_linear(row_layer(gathered)), "gathers nothing", "repeats the work")

    def gathered_by_sums(self, x):  # the same, with all-reduces of zero-padded shares standing in for the gathers
        r, tp, k = self.comm.rank, self.comm.world_size, x.shape[-1]
        whole_x = torch.zeros(*x.shape[:-1], k * tp)
        whole_x[..., r * k:(r + 1) * k] = x
        whole_w = torch.zeros(self.weight.shape[0], k * tp)
        whole_w[:, r * k:(r + 1) * k] = self.weight
        return self.comm.all_reduce(whole_x, self.site) @ self.comm.all_reduce(whole_w, self.site).T

    not_yet(ch10.check_row_parallel_linear(row_layer(gathered_by_sums)), "never needs the whole input")


def test_the_librarys_row_forward_is_refused():
    not_yet(ch10.check_row_parallel_linear(row_layer(lambda self, x: super(type(self), self).forward(x))),
            "don't call", "RowParallelLinear.forward")


# --------------------------------------------------------------------------------------------- 10.3


def embedding(forward):
    return type("MyVocabParallelEmbedding", (VocabParallelEmbedding,), {"forward": forward})


def _lookup(self, input_ids, mask=True, clamp=True, reduce=True):
    local = input_ids - self.start
    mine = (local >= 0) & (local < self.num_embeddings)
    x = self.weight[local.clamp(0, self.num_embeddings - 1) if clamp else local]
    x = x * mine.unsqueeze(-1) if mask else x
    return self.comm.all_reduce(x, "embedding") if reduce else x


def test_embedding_mistakes():
    shard = solutions.vocab_shard
    not_yet(ch10.check_vocab_parallel_embedding(shard, embedding(lambda s, ids: _lookup(s, ids, mask=False))),
            "forgot to zero the ids outside")
    not_yet(ch10.check_vocab_parallel_embedding(shard, embedding(lambda s, ids: _lookup(s, ids, reduce=False))),
            "no all-reduce", "only the rows it holds")
    not_yet(ch10.check_vocab_parallel_embedding(shard, embedding(lambda s, ids: _lookup(s, ids, clamp=False))),
            "out of range", "clamp")

    def gathered(self, input_ids):
        return self.comm.all_gather(self.weight, "embedding")[input_ids]

    not_yet(ch10.check_vocab_parallel_embedding(shard, embedding(gathered)), "gathers nothing")
    not_yet(ch10.check_vocab_parallel_embedding(shard, embedding(lambda s, ids: s.comm.all_reduce(
        torch.nn.Embedding.forward(s, (ids - s.start).clamp(0, s.num_embeddings - 1)), "embedding"))),
        "forgot to zero")


def test_vocabulary_padding_mistakes():
    right = solutions.MyVocabParallelEmbedding

    def floor_rows(table, rank, tp):
        rows = table.shape[0] // tp
        return table[rank * rows:(rank + 1) * rows], rank * rows

    not_yet(ch10.check_vocab_parallel_embedding(floor_rows, right), "to no rank", "pad")

    def chunked(table, rank, tp):  # torch.chunk: equal shares but the last, which is short
        rows = -(-table.shape[0] // tp)
        return table.chunk(tp)[rank] if rank < len(table.chunk(tp)) else table[:0], rank * rows

    not_yet(ch10.check_vocab_parallel_embedding(chunked, right), "the same number", "zeros")

    def wrong_start(table, rank, tp):
        part, start = solutions.vocab_shard(table, rank, tp)
        return part, rank * (table.shape[0] // tp)

    not_yet(ch10.check_vocab_parallel_embedding(wrong_start, right), "starts at id")

    def padded_with_ones(table, rank, tp):
        part, start = solutions.vocab_shard(table, rank, tp)
        real = max(0, min(part.shape[0], table.shape[0] - start))
        part = part.clone()
        part[real:] = 1.0
        return part, start

    not_yet(ch10.check_vocab_parallel_embedding(padded_with_ones, right), "should be zeros")
    not_yet(ch10.check_vocab_parallel_embedding(lambda t, r, tp: None, right), "you gave None")
    not_yet(ch10.check_vocab_parallel_embedding(lambda t, r, tp: t, right), "two things")


def test_the_librarys_embedding_forward_and_shard_are_refused():
    def library_forward(self, input_ids):
        return VocabParallelEmbedding.forward(self, input_ids)

    not_yet(ch10.check_vocab_parallel_embedding(solutions.vocab_shard, embedding(library_forward)),
            "don't call", "VocabParallelEmbedding.forward")

    def library_shard(table, rank, tp):
        return tensor_parallel.shard(table, 0, rank, tp), rank * (table.shape[0] // tp)

    not_yet(ch10.check_vocab_parallel_embedding(library_shard, solutions.MyVocabParallelEmbedding), "don't call",
            "shard")


# --------------------------------------------------------------------------------------------- 10.6


def test_gpipe_mistakes():
    def serial(stages, micro_batches):  # one micro-batch through all the stages at a time
        outputs, ticks = [], []
        for i, x in enumerate(micro_batches):
            for s, stage in enumerate(stages):
                x = stage(x)
                ticks.append([(s, i)])
            outputs.append(x)
        return outputs, ticks

    not_yet(ch10.check_gpipe_loop(serial), "one micro-batch through all the stages at a time", "ticks")

    def no_wait(stages, micro_batches):  # every stage on micro-batch t at tick t: stage s has not been sent it yet
        outputs, ticks = solutions.gpipe(stages, micro_batches)
        return outputs, [[(s, i) for s in range(len(stages))] for i in range(len(micro_batches))]

    not_yet(ch10.check_gpipe_loop(no_wait), "sends it only at the end of tick")

    def ids_everywhere(stages, micro_batches):
        return [stages[-1](stages[0](x) if len(stages) == 1 else x) for x in micro_batches], []

    not_yet(ch10.check_gpipe_loop(ids_everywhere), "token ids", "hidden state")

    def reversed_outputs(stages, micro_batches):
        outputs, ticks = solutions.gpipe(stages, micro_batches)
        return outputs[::-1], ticks

    not_yet(ch10.check_gpipe_loop(reversed_outputs), "in the order of the micro-batches")

    def by_number(stages, micro_batches):
        outputs, ticks = solutions.gpipe(stages, micro_batches)
        return dict(enumerate(outputs)), ticks

    not_yet(ch10.check_gpipe_loop(by_number), "as a list")
    not_yet(ch10.check_gpipe_loop(lambda stages, mbs: None), "you gave None")


def test_a_loop_whose_work_does_not_follow_its_ticks_is_refused():
    def serial_work_gpipe_ticks(stages, micro_batches):
        outputs = []
        for x in micro_batches:
            for stage in stages:
                x = stage(x)
            outputs.append(x)
        p, m = len(stages), len(micro_batches)
        return outputs, [[(s, t - s) for s in range(p) if 0 <= t - s < m] for t in range(m + p - 1)]

    not_yet(ch10.check_gpipe_loop(serial_work_gpipe_ticks), "another order than your ticks say")


def test_the_librarys_schedule_is_refused():
    def library_ticks(stages, micro_batches):
        outputs, _ = solutions.gpipe(stages, micro_batches)
        plan = pipeline.schedule([[1.0] * len(micro_batches) for _ in stages])
        ticks = [[(s, i) for s, i, start, _ in plan if start == t] for t in range(len(stages) + len(micro_batches) - 1)]
        return outputs, ticks

    not_yet(ch10.check_gpipe_loop(library_ticks), "don't call", "schedule")


# --------------------------------------------------------------------------------------------- every kind of nonsense


@pytest.mark.parametrize("answer", [None, "nonsense", (1, 2, 3)], ids=["None", "a-string", "a-tuple"])
def test_an_answer_of_the_wrong_kind_is_told_what_to_return(answer):
    for verdict in (ch10.check_row_parallel_linear(row_layer(lambda self, x: answer)),
                    ch10.check_vocab_parallel_embedding(solutions.vocab_shard, embedding(lambda self, ids: answer)),
                    ch10.check_vocab_parallel_embedding(lambda table, rank, tp: answer,
                                                        solutions.MyVocabParallelEmbedding),
                    ch10.check_gpipe_loop(lambda stages, micro_batches: answer)):
        assert not verdict.passed, verdict
        assert "raised" not in verdict.message and "could not use" not in verdict.message, verdict.message
