"""Checks for notebook 10 (beyond one device): the column and row split of one linear layer (10.1), the all-reduces
of one forward pass (10.4), and a TP step's time predicted from the measured latency (10.5); the row-parallel layer,
the embedding split by vocabulary, exercises 10.2 and 10.3, are in ch10_parallel.py; the GPipe loop, 10.6, in
ch10_gpipe.py."""

from __future__ import annotations

import torch

from . import call, exercise, expect, forbidden, hint, hints, returned  # noqa: F401  (hint: for the notebook)
from .ch10_gpipe import check_gpipe_loop  # noqa: F401
from .ch10_parallel import check_row_parallel_linear, check_vocab_parallel_embedding  # noqa: F401


def _integer_layer(out_features: int, in_features: int, seed: int):
    """A weight [out, in] and an input [2, 3, in] of small whole numbers: every sum of products is exact in fp32, in
    any order, so the outputs can be compared bit for bit on any machine."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randint(-4, 5, (out_features, in_features), generator=g).float()
    return weight, torch.randint(-4, 5, (2, 3, in_features), generator=g).float()


def _share(out, what: str) -> torch.Tensor:
    expect(out is not None, f"{what} returns None: end it with `return ...`.")
    expect(isinstance(out, torch.Tensor), f"{what} should return a tensor, not {type(out).__name__}.")
    return out


@exercise
@hints("A weight is stored [out, in] and a layer computes x @ weight.T: which dim holds the outputs, which the inputs?",
       "A column split keeps every input and cuts the outputs: rank r takes rows r*k to (r+1)*k - 1 of the weight, "
       "k = out / tp. A row split cuts the inputs: the same block of columns, k = in / tp.",
       "column_split: k = weight.shape[0] // tp; return weight[rank * k:(rank + 1) * k]. row_split: "
       "k = weight.shape[1] // tp; return weight[:, rank * k:(rank + 1) * k]")
def check_column_and_row_split(column_split, row_split) -> str:
    """Exercise 10.1: column_split(weight, rank, tp) and row_split(weight, rank, tp) -> rank's share of a weight."""
    from ..distributed import tensor_parallel

    expect(callable(column_split) and callable(row_split),
           "define column_split(weight, rank, tp) and row_split(weight, rank, tp).")
    why = "slice the weight yourself; this exercise is the slicing"
    for (out_f, in_f, tp), seed in zip(((12, 18, 3), (20, 8, 4), (6, 10, 2)), (101, 102, 103)):  # layers not seen
        weight, x = _integer_layer(out_f, in_f, seed)
        full = x @ weight.T  # [2, 3, out]: the layer on one device
        partial_sums = []
        for rank in range(tp):
            with forbidden(tensor_parallel, "shard", why):
                column, row = call(column_split, weight.clone(), rank, tp), call(row_split, weight.clone(), rank, tp)
            column, row = _share(column, "column_split"), _share(row, "row_split")
            k, j = out_f // tp, in_f // tp
            expect(tuple(column.shape) != (out_f, in_f) and tuple(row.shape) != (out_f, in_f),
                   "you returned the whole weight: each rank keeps 1/tp of it.")
            expect(tuple(column.shape) != (out_f, j), f"column_split gave shape {tuple(column.shape)}: that is a row "
                                                     "split. A column split keeps all the inputs and cuts the outputs, "
                                                     "dim 0 of a weight stored [out, in].")
            expect(tuple(column.shape) == (k, in_f),
                   f"column_split(weight [{out_f}, {in_f}], rank {rank}, tp {tp}) should have shape ({k}, {in_f}), "
                   f"not {tuple(column.shape)}.")
            expect(tuple(row.shape) != (k, in_f), f"row_split gave shape {tuple(row.shape)}: that is a column split. "
                                                  "A row split keeps all the outputs and cuts the inputs, dim 1.")
            expect(tuple(row.shape) == (out_f, j),
                   f"row_split(weight [{out_f}, {in_f}], rank {rank}, tp {tp}) should have shape ({out_f}, {j}), "
                   f"not {tuple(row.shape)}.")
            expect(not (tp > 1 and torch.equal(column, weight[rank::tp])),
                   "you took every tp-th row: take one contiguous block, so that a rank holds whole heads "
                   "(a head is a block of consecutive rows).")
            expect(torch.equal(x @ column.T, full[..., rank * k:(rank + 1) * k]),
                   f"rank {rank}'s column output should be columns {rank * k} to {(rank + 1) * k - 1} of the full "
                   "output, bit for bit: take rows rank*k to (rank+1)*k - 1 of the weight.")
            partial_sums.append(x[..., rank * j:(rank + 1) * j] @ row.T)  # this rank's inputs only
        expect(torch.equal(sum(partial_sums[1:], partial_sums[0]), full),
               "the row outputs summed over the ranks (the all-reduce) should equal the full output: rank r takes "
               "columns r*k to (r+1)*k - 1 of the weight, the inputs it holds.")
    return ("a column split is a slice of the output, bit for bit; the row split's partial sums add up to it: that "
            "addition is the all-reduce.")


@exercise
@hints("Count the places where our TP model must add up partial results across the ranks, in one forward pass.",
       "Each block ends two row-split layers (o_proj, down): one all-reduce each. The embedding, split by vocabulary, "
       "adds one more. Each all-reduce sums a whole hidden state: batch x tokens x hidden numbers.",
       "return 2 * cfg.num_layers + 1, batch * tokens * cfg.hidden_size * bytes_per_element")
def check_all_reduce_traffic(traffic) -> str:
    """Exercise 10.4: traffic(cfg, batch, tokens, bytes_per_element) -> (all-reduces, bytes each), one forward pass."""
    from ..distributed.collectives import tp_step_collectives
    from ..model.scratch import ScratchConfig

    expect(callable(traffic), "define a function traffic(cfg, batch, tokens, bytes_per_element).")
    models = {"Llama-3-8B": ScratchConfig(128256, 4096, 14336, 32, 32, 8, 128, 5e5, 1e-5, 8192),
              "SmolLM2-360M": ScratchConfig(49152, 960, 2560, 32, 15, 5, 64, 1e5, 1e-5, 8192),
              "Qwen2.5-0.5B": ScratchConfig(151936, 896, 4864, 24, 14, 2, 64, 1e6, 1e-6, 32768)}
    for (name, cfg), (batch, tokens, size) in zip(models.items(), ((1, 1, 2), (8, 1, 2), (2, 512, 4))):
        count, each = returned(call(traffic, cfg, batch, tokens, size), "pair", "(all-reduces, bytes each)")
        count = returned(count, "whole", "the number of all-reduces")  # "65" or None: say what to return
        each = returned(each, "whole", "the bytes of each all-reduce")
        calls = [(op, b) for op, _, b in tp_step_collectives(cfg, 2, batch, tokens, size) if op == "all_reduce"]
        want_count, want_bytes = len(calls), calls[0][1]
        layers, hidden = cfg.num_layers, cfg.hidden_size
        expect(count != 2 * layers, f"{name}: {count} all-reduces: you forgot the embedding's. Its table is split by "
                                    "vocabulary, so each rank finds only its own tokens and the ranks add up the rows.")
        expect(count != layers and count != layers + 1, f"{name}: {count} all-reduces: a block has two row-split "
                                                        "layers, o_proj and down, each followed by an all-reduce.")
        expect(count == want_count, f"{name} ({layers} layers): expected {want_count} all-reduces, not {count}.")
        expect(each != cfg.vocab_size * batch * tokens * size, f"{name}: an all-reduce sums a hidden state "
                                                               "(hidden numbers per token), not logits.")
        expect(each != tokens * hidden * size or batch == 1, f"{name}: every sequence of the batch has its own "
                                                             "hidden state: multiply by the batch too.")
        expect(each == want_bytes, f"{name}, batch {batch}, {tokens} tokens, {size}-byte numbers: expected "
                                   f"{want_bytes:,} bytes per all-reduce (batch x tokens x hidden x bytes), not {each:,}.")
    return "2 per block plus the embedding's, each one a whole hidden state: the same count on every rank, at every TP."


@exercise
@hints("Two things add up: each rank's share of the compute, and the all-reduces, each one a latency plus bytes.",
       "The compute is shared by tp devices; each block makes 2 all-reduces; each costs latency_s + message_bytes / "
       "bytes_per_s. Everything in seconds.",
       "return compute_s / tp + 2 * layers * (latency_s + message_bytes / bytes_per_s)")
def check_tp_step_prediction(predict) -> str:
    """Exercise 10.5: predict(compute_s, tp, layers, latency_s, bytes_per_s, message_bytes) -> a TP step, seconds."""
    from ..distributed.collectives import Link, predict_tp_step

    expect(callable(predict), "define predict(compute_s, tp, layers, latency_s, bytes_per_s, message_bytes).")
    # compute_s is one device's step: a 70B model's 141 GB of bf16 weights read at an H100's 3.35e12 bytes/s, 42.1 ms
    cases = {"8 H100s over NVLink, a 70B model": (0.0421, 8, 80, 8e-6, 450e9, 16_384),
             "3 CPU ranks on gloo": (0.09, 3, 30, 1e-3, 5e8, 2304),
             "2 GPUs over PCIe, a big batch": (0.03, 2, 32, 2e-5, 25e9, 4_194_304)}
    for name, (compute, tp, layers, latency, bandwidth, message) in cases.items():
        got = returned(call(predict, compute, tp, layers, latency, bandwidth, message), "number", "the step's seconds")
        want = predict_tp_step(compute, tp, [("all_reduce", "", message)] * (2 * layers), Link(latency, bandwidth))
        comm = 2 * layers * (latency + message / bandwidth)
        expect(abs(got - (compute + comm)) > 1e-9 * want["total_s"],
               f"{name}: you kept the whole compute: each of the {tp} ranks does 1/{tp} of it.")
        expect(abs(got - (compute / tp + comm / 2)) > 1e-9 * want["total_s"],
               f"{name}: a block makes two all-reduces (after attention, after the MLP), not one.")
        expect(abs(got - (compute / tp + comm / tp)) > 1e-9 * want["total_s"],
               f"{name}: TP does not shrink the collectives: every rank takes part in every all-reduce.")
        expect(abs(got - want["total_s"]) <= 1e-9 * want["total_s"],
               f"{name}: expected {want['total_s'] * 1e3:.3f} ms (compute {want['compute_s'] * 1e3:.3f} + latency "
               f"{want['latency_s'] * 1e3:.3f} + bytes {want['bytes_s'] * 1e3:.3f}), got {got * 1e3:.3f} ms. "
               "Seconds throughout: latency_s + message_bytes / bytes_per_s per all-reduce.")
    return "compute / TP, plus 2 x layers x (latency + bytes / bandwidth): now compare it with the measured step."
