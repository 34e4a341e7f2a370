"""Exercises 10.2 and 10.3 of notebook 10: the pieces of the parallel model that talk, built by the learner.

10.2: RowParallelLinear.forward (this rank's share of the inputs times its block of the weight, then an all-reduce).
10.3: the vocabulary split of the embedding: each rank's padded slice of the table, and VocabParallelEmbedding.forward
(zeros for the ids another rank holds, then an all-reduce).

The ranks are simulated as notebook 10's MLP cell simulates them: one after the other in this process, the all-reduce a
plain sum. A rank's all-reduce cannot wait for ranks that have not run yet, so it keeps the rank's tensor and hands it
back; once every rank has run, the check adds them up and writes the sum into each (dist.all_reduce works in place and
leaves the sum on every rank). Each check runs the library's module on the same shares for the reference, on sizes,
TP degrees and vocabularies the notebook never showed (some that TP does not divide), and refuses the library's own
forward while the learner's code runs. 10.6, the GPipe loop, is in ch10_gpipe.py.
"""

from __future__ import annotations

import random
from contextlib import nullcontext

import torch

from . import call, exercise, expect, forbidden, hints, returned
from .not_yet import NotYet, _LearnerFailed


class SimulatedRanks:
    """`tp` ranks run one after another; `comm(rank)` is a rank's communicator, `finish()` completes the all-reduces."""

    def __init__(self, tp: int, no_gather: str):
        self.tp, self.no_gather = tp, no_gather
        self.calls: dict[int, list] = {rank: [] for rank in range(tp)}  # rank -> [(site, tensor, its value then)]

    def comm(self, rank: int) -> "_RankComm":
        return _RankComm(self, rank)

    def finish(self) -> None:
        """The j-th all-reduce of every rank summed, the sum written into each rank's tensor (in place)."""
        counts = {rank: len(calls) for rank, calls in self.calls.items()}
        expect(len(set(counts.values())) == 1, f"the ranks made different numbers of all-reduces ({counts}): every "
                                               "rank must take part in the same collectives, in the same order.")
        for j in range(counts[0]):
            tensors = [self.calls[rank][j][1] for rank in range(self.tp)]
            shapes = {tuple(t.shape) for t in tensors}
            expect(len(shapes) == 1, f"all-reduce {j + 1}: the ranks gave tensors of shapes {sorted(shapes)}; the "
                                     "ranks can only add up tensors of the same shape.")
            total = sum(t.detach().clone() for t in tensors)
            with torch.no_grad():
                for t in tensors:
                    t.copy_(total)


class _RankComm:
    """What a rank's module sees as self.comm: all_reduce(x, site) as the library's Communicator (x comes back, and
    holds the sum once every rank has run); all_gather is refused: the layers of these exercises gather nothing."""

    def __init__(self, ranks: SimulatedRanks, rank: int):
        self.ranks, self.rank = ranks, rank

    @property
    def world_size(self) -> int:
        return self.ranks.tp

    def all_reduce(self, x, site: str = ""):
        expect(isinstance(x, torch.Tensor), f"all_reduce takes a tensor, not {type(x).__name__}.")
        self.ranks.calls[self.rank].append((site, x, x.detach().clone()))
        return x

    def all_gather(self, x, site: str = ""):
        raise NotYet(self.ranks.no_gather)


def _ints(shape, g) -> torch.Tensor:
    """Small whole numbers as floats: every sum of products is exact in fp32, in any order (compare bit for bit)."""
    return torch.randint(-4, 5, shape, generator=g).float()


def _module_class(cls, library_class, stub: str):
    name = library_class.__name__
    expect(isinstance(cls, type) and issubclass(cls, library_class),
           f"pass your class (the cell's My{name}), a subclass of {name}: the library's class builds the weight, "
           f"self.comm and the rest; you write its forward.")
    expect(cls.forward is not library_class.forward, f"your class has no forward of its own: write {stub}.")


def _one_all_reduce(ranks: SimulatedRanks, shape: tuple, site: str, what: str, wrong_shapes: dict) -> None:
    """Each rank made one all-reduce, of a tensor of `shape`, at `site` (wrong_shapes: shape -> what it means)."""
    made = len(ranks.calls[0])
    expect(made >= 1, what)
    for _, x, _ in ranks.calls[0]:
        got = tuple(x.shape)
        if got != shape:
            expect(got not in wrong_shapes, wrong_shapes.get(got, ""))
            expect(False, f"you all-reduced a tensor of shape {got}: all-reduce this rank's output {shape} and "
                          "nothing else (a rank never needs the whole input or the whole weight).")
    expect(made == 1, f"each rank made {made} all-reduces: one per forward, of the output, is all it takes.")
    got_site = ranks.calls[0][0][0]
    expect(got_site == site, f"pass self.site to the all-reduce (here {site!r}, not {got_site!r}): it names where the "
                             "collective is, and the notebook counts them by it.")


def _output_of(out, ranks: SimulatedRanks, rank: int, want: torch.Tensor, where: str) -> None:
    """A rank's output is the sum the all-reduce left in place."""
    reduced, before = ranks.calls[rank][0][1], ranks.calls[rank][0][2]
    if torch.equal(out, want):
        return
    expect(not (out.shape == before.shape and torch.equal(out, before) and out.data_ptr() != reduced.data_ptr()),
           f"{where}: you returned a copy of the tensor you passed to the all-reduce, taken before the sum: return "
           "what all_reduce gives back (it sums in place, so the tensor you pass it becomes the sum).")
    expect(not (out.shape == want.shape and torch.allclose(out * ranks.tp, want, atol=1e-3)),
           f"{where}: you divided by the TP degree: an all-reduce adds the ranks' tensors up, and the partial sums add "
           "up to the output.")
    expect(False, f"{where} should equal the library's, the layer's output on one device, bit for bit; it differs "
                  f"by up to {(out.double() - want.double()).abs().max().item():g}.")


# --------------------------------------------------------------------------------------------- 10.2


def _run_row(cls, weight, x, tp, site, guard):
    """Every rank's output of a row-parallel layer of class `cls` (rank r holds columns r*k.. of weight and of x)."""
    out_f, in_f = weight.shape
    k = in_f // tp
    ranks = SimulatedRanks(tp, "a row-parallel layer gathers nothing: gathering the whole input (and the weight) "
                               "to compute the full matmul on every rank sends everything to everyone and repeats "
                               "the work tp times. Multiply the inputs this rank holds by its block of the weight, "
                               "then all-reduce the product.")
    outs = []
    for rank in range(tp):
        layer = call(cls, k, out_f, ranks.comm(rank), site)
        with torch.no_grad():
            layer.weight.copy_(weight[:, rank * k:(rank + 1) * k])
        with guard(), torch.no_grad():
            out = call(layer, x[..., rank * k:(rank + 1) * k].clone())
        out = returned(out, "tensor", f"rank {rank}'s output")
        want = (*x.shape[:-1], out_f)
        expect(tuple(out.shape) == want, f"rank {rank}'s output should be [batch, seq, out], here {want}, not "
                                         f"{tuple(out.shape)}.")
        outs.append(out)
    return ranks, outs


@exercise
@hints("A rank holds a block of the inputs and the same block of the weight's columns: what can it compute alone, "
       "and what is missing from it?",
       "Its own inputs times its own columns give every output, but as a partial sum: the other ranks hold the rest "
       "of each dot product. self.comm.all_reduce(partial, self.site) adds the ranks' partial sums up, on every rank.",
       "def forward(self, x): partial = x @ self.weight.T  (x is [batch, seq, in / tp], self.weight [out, in / tp]); "
       "return self.comm.all_reduce(partial, self.site)")
def check_row_parallel_linear(layer_class) -> str:
    """Exercise 10.2: a subclass of RowParallelLinear whose forward(x) gives every rank the whole layer's output."""
    from ..distributed.tensor_parallel import RowParallelLinear

    _module_class(layer_class, RowParallelLinear, "forward(self, x)")
    rng, g = random.Random(1004), torch.Generator().manual_seed(1004)
    why = "write the forward yourself: this rank's matmul, then the all-reduce"
    cases = []
    for _ in range(4):
        tp, k = rng.choice((2, 3, 4, 5)), rng.randint(2, 6)
        out_f = rng.choice([n for n in range(3, 13) if n not in (k, k * tp)])  # a missing .T or an input sum shows
        cases.append((tp, k, out_f, rng.randint(1, 3), rng.randint(1, 5), rng.choice(("attention", "mlp"))))
    for tp, k, out_f, batch, seq, site in cases:
        weight, x = _ints((out_f, tp * k), g), _ints((batch, seq, tp * k), g)
        full = x @ weight.T  # [batch, seq, out]: the layer on one device
        ranks, outs = _run_row(layer_class, weight, x, tp, site, lambda: forbidden(RowParallelLinear, "forward", why))
        ranks.finish()
        where = f"TP = {tp}, a layer [{out_f}, {tp * k}]"
        _one_all_reduce(ranks, (batch, seq, out_f), site,
                        f"{where}: no all-reduce, so each rank's output is only its partial sum (rank 0's is off "
                        f"by up to {(outs[0].double() - full.double()).abs().max().item():.0f} from the full output): "
                        "add the ranks' partial sums up with self.comm.all_reduce(partial, self.site).",
                        {(batch, seq, k): f"{where}: you all-reduced the input. The ranks hold different inputs, and "
                                          "adding them mixes different features; multiply first, then all-reduce the "
                                          "product, which is a partial sum of the output."})
        reference, ref_outs = _run_row(RowParallelLinear, weight, x, tp, site, nullcontext)
        reference.finish()  # the library's module on the same shares: its output is the full one
        for rank, out in enumerate(outs):
            _output_of(out, ranks, rank, ref_outs[rank], f"{where}: rank {rank}'s output")
    return ("each rank multiplies the inputs it holds by its block of the weight, and one all-reduce of the partial "
            "sums gives every rank the whole output: o_proj and down, as the library runs them.")


# --------------------------------------------------------------------------------------------- 10.3


def _vocab_cases():
    """(vocab, hidden, tp): vocabularies the notebook never used; most of them TP does not divide."""
    rng = random.Random(1026)  # 9 on TP = 2, 11 on 3, 18 on 4
    cases = [(rng.choice((2, 3, 4)), rng.randint(2, 5), rng.randint(1, 3)) for _ in range(3)]  # tp, rows, missing
    out = [(tp * rows - min(missing, tp - 1), rng.randint(3, 7), tp) for tp, rows, missing in cases]
    out.append((10, 4, 4))  # 3 rows a rank: the last holds one id and two rows of padding
    out.append((12, 3, 3))  # one that TP divides
    return out


def _ids_for(vocab: int, rows: int, tp: int, g) -> torch.Tensor:
    """[2, seq] ids: every rank's first and last id, and random ones."""
    edges = sorted({i for r in range(tp) for i in (r * rows, r * rows + rows - 1) if i < vocab} | {0, vocab - 1})
    extra = torch.randint(0, vocab, (2 * (len(edges) + 3) - len(edges),), generator=g).tolist()
    return torch.tensor(edges + extra).reshape(2, -1)


@exercise
@hints("An id belongs to one rank's slice of the table; every rank sees every id. What should the other ranks "
       "contribute for it, so that adding up the ranks' lookups gives its row once?",
       "vocab_shard: rows = ceil(vocab / tp) for every rank, rank r's slice starts at r x rows, and the last slice is "
       "padded with rows of zeros. forward: local = ids - self.start; the ids with 0 <= local < self.num_embeddings "
       "are this rank's; look the others up at a clamped index and set their rows to zero; then all-reduce.",
       "vocab_shard: rows = -(-vocab // tp); part = table[rank * rows:(rank + 1) * rows]; pad it with "
       "table.new_zeros(rows - len(part), hidden) (torch.cat), return part, rank * rows. forward: "
       "mine = (local >= 0) & (local < self.num_embeddings); x = self.weight[local.clamp(0, self.num_embeddings - 1)]; "
       "x = x * mine.unsqueeze(-1); return self.comm.all_reduce(x, 'embedding')")
def check_vocab_parallel_embedding(vocab_shard, embedding_class) -> str:
    """Exercise 10.3: vocab_shard(table, rank, tp) -> (rank's padded rows, its first id), and a subclass of
    VocabParallelEmbedding whose forward(ids) gives every rank each id's row of the whole table."""
    from ..distributed import tensor_parallel
    from ..distributed.tensor_parallel import VocabParallelEmbedding

    expect(callable(vocab_shard), "define vocab_shard(table, rank, tp), returning (rows, start).")
    _module_class(embedding_class, VocabParallelEmbedding, "forward(self, input_ids)")
    g = torch.Generator().manual_seed(1005)
    why = "slice the table and look the ids up yourself"
    no_gather = "the embedding gathers nothing: each rank looks up the ids it holds, and an all-reduce adds them up."
    for vocab, hidden, tp in _vocab_cases():
        table = _ints((vocab, hidden), g)
        rows = -(-vocab // tp)
        padded = torch.cat([table, table.new_zeros(rows * tp - vocab, hidden)])
        where = f"a vocabulary of {vocab} on TP = {tp}"
        shares = []
        for rank in range(tp):
            with forbidden(tensor_parallel, "shard", why):
                got = call(vocab_shard, table.clone(), rank, tp)
            part, start = returned(got, "pair", "(rows, start)")
            part = returned(part, "tensor", f"rank {rank}'s rows").float()
            start = returned(start, "whole", f"rank {rank}'s first id")
            expect(part.dim() == 2 and part.shape[1] == hidden, f"{where}: rank {rank}'s rows should be [rows, "
                                                                f"{hidden}]: whole rows of the table, not "
                                                                f"{tuple(part.shape)}.")
            expect(not (vocab % tp and part.shape[0] == vocab // tp and start == rank * (vocab // tp)),
                   f"{where}: you gave each rank {vocab} // {tp} = {vocab // tp} rows, so the last "
                   f"{'id belongs' if vocab % tp == 1 else f'{vocab % tp} ids belong'} to no rank. Round up, "
                   f"ceil({vocab} / {tp}) = {rows} rows each, and pad the last rank's slice with rows of zeros.")
            expect(part.shape[0] == rows, f"{where}: rank {rank} holds {part.shape[0]} rows; every rank must hold "
                                          f"the same number, ceil({vocab} / {tp}) = {rows} (the tied LM head's "
                                          "all-gather needs equal shares): pad the last slice with rows of zeros.")
            expect(start == rank * rows, f"{where}: rank {rank}'s slice starts at id {rank} x {rows} = "
                                         f"{rank * rows}, not {start}.")
            real = max(0, min(rows, vocab - start))  # the rows that hold ids; the rest is padding
            expect(torch.equal(part[:real], table[start:start + real]),
                   f"{where}: rank {rank}'s rows should be rows {start} to {start + rows - 1} of the table.")
            expect(torch.equal(part, padded[start:start + rows]), f"{where}: rank {rank}'s padding rows (ids "
                                                                  f"{vocab} and beyond) should be zeros.")
            shares.append((part, start))
        ids = _ids_for(vocab, rows, tp, g)
        want = table[ids]  # [2, seq, hidden]: the embedding on one device
        ranks, outs = SimulatedRanks(tp, no_gather), []
        for rank, (part, start) in enumerate(shares):
            layer = call(embedding_class, rows, hidden, start, ranks.comm(rank))
            with torch.no_grad():
                layer.weight.copy_(part)
            try:
                with forbidden(VocabParallelEmbedding, "forward", why), torch.no_grad():
                    out = call(layer, ids.clone())
            except _LearnerFailed as failed:
                err = failed.args[0]
                expect(not isinstance(err, IndexError) and "out of range" not in str(err),
                       f"{where}: your lookup went out of range ({type(err).__name__}: {err}). An id that rank {rank} "
                       "does not hold gives a local index below 0 or beyond its rows: clamp the index into range for "
                       "the lookup, then set those rows to zero.")
                raise
            out = returned(out, "tensor", f"rank {rank}'s embeddings")
            expect(tuple(out.shape) == tuple(want.shape), f"{where}: rank {rank}'s embeddings should be [batch, seq, "
                                                          f"hidden], here {tuple(want.shape)}, not {tuple(out.shape)}.")
            outs.append(out)
        ranks.finish()
        unmasked = sum(part[(ids - start).clamp(0, rows - 1)] for part, start in shares)
        _one_all_reduce(ranks, (2, ids.shape[1], hidden), "embedding",
                        f"{where}: no all-reduce, so each rank returned only the rows it holds. Add the ranks' "
                        "lookups up with self.comm.all_reduce(x, 'embedding'): each id's row comes from the one rank "
                        "that holds it.",
                        {})
        reference = SimulatedRanks(tp, no_gather)
        library = []
        for rank, (part, start) in enumerate(shares):
            layer = VocabParallelEmbedding(rows, hidden, start, reference.comm(rank))
            with torch.no_grad():
                layer.weight.copy_(part)
                library.append(layer(ids.clone()))
        reference.finish()
        assert torch.equal(library[0], want)
        for rank, out in enumerate(outs):
            if not torch.equal(out, library[rank]):
                expect(not (out.shape == want.shape and torch.equal(out, unmasked)),
                       f"{where}: you forgot to zero the ids outside this rank's slice: a clamped id looks up a row at "
                       "the slice's edge, and the all-reduce adds it to the right one. Set the rows of the ids "
                       "another rank holds to zero before the all-reduce.")
            _output_of(out, ranks, rank, library[rank], f"{where}: rank {rank}'s embeddings")
    return ("each rank holds ceil(vocab / tp) rows, the last padded with zeros; it looks up the ids it holds, zeros "
            "for the others, and one all-reduce gives every rank each id's row: as the library's module does.")
