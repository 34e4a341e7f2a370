"""Checks for notebook 02 (embeddings and positions): the one-hot lookup, nearest neighbours, RoPE by hand.

Each check runs the learner's function on tables, vectors and positions the notebook never showed, compares it
with the library (embeddings.one_hot_lookup, embeddings.nearest_neighbours, rope.apply_rope) and names the typical mistake.
Nearest neighbours must be the whole-table method: the check counts the products and the topk calls torch runs.
"""

from __future__ import annotations

import sys

import torch

from ..model import rope as rope_module
from . import NotYet, _LearnerFailed, call, exercise, expect, forbidden_all, hint, hints, returned  # noqa: F401  (hint: notebook)
from ._watch import torch_calls


def _table(seed: int = 0, vocab: int = 11, hidden: int = 6) -> torch.Tensor:
    return torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(seed))  # a small [vocab, hidden] table


_INDEXED = ("you read the rows by indexing the table or taking it apart (table[ids], index_select, F.embedding, "
            "F.embedding_bag, unbind, split, tolist): that is the lookup itself. Build one-hot rows and multiply them "
            "by the table.")


class _UnindexableTable(torch.Tensor):
    """An embedding table that refuses to be indexed, so that only the one-hot product can read it."""

    REFUSED = {torch.Tensor.__getitem__, torch.index_select, torch.Tensor.index_select, torch.nn.functional.embedding,
               torch.embedding, torch.nn.functional.embedding_bag, torch.embedding_bag, torch.gather,
               torch.Tensor.gather, torch.take, torch.Tensor.take,
               torch.Tensor.index_select, torch.take_along_dim,
               # every other way to get at one row: taking the table apart, or reading it out of torch
               torch.unbind, torch.Tensor.unbind, torch.Tensor.__iter__, torch.split, torch.Tensor.split,
               torch.chunk, torch.Tensor.chunk, torch.Tensor.tensor_split, torch.tensor_split, torch.narrow,
               torch.Tensor.narrow, torch.select, torch.Tensor.select, torch.Tensor.tolist, torch.Tensor.numpy,
               torch.Tensor.unfold, torch.Tensor.__array__, torch.Tensor.masked_select, torch.masked_select}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in cls.REFUSED:
            raise NotYet(_INDEXED)
        return super().__torch_function__(func, types, args, kwargs or {})


_ROW_READS = {"index", "_unsafe_index", "index_select", "embedding", "_embedding_bag", "_embedding_bag_forward_only",
              "embedding_bag", "gather", "take", "take_along_dim", "select", "slice", "narrow", "unbind", "split",
              "split_with_sizes", "unsafe_split", "chunk", "tensor_split", "unfold", "masked_select", "as_strided",
              "_local_scalar_dense"}


class _RowReads:
    """Refuses, at the level of torch's ATen ops, every op that reads rows of the table by position (index,
    index_select, embedding, embedding_bag, gather, select, slice, split ...), whichever way it was called:
    torch.ops.aten.index(table, [ids]) never reaches the table's __torch_function__."""

    def __init__(self, table: torch.Tensor):
        self.storage, self.tried = table.untyped_storage().data_ptr(), None
        self.values = table.as_subclass(torch.Tensor).clone()  # a copy of the table is the table too

    def _is_table(self, t) -> bool:
        if isinstance(t, _UnindexableTable):
            return True
        return isinstance(t, torch.Tensor) and (t.untyped_storage().data_ptr() == self.storage or (
            t.shape == self.values.shape and torch.equal(t.to(self.values.dtype), self.values)))

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        watch = self

        class Reads(TorchDispatchMode):
            def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
                if func._schema.name.split("::")[-1] in _ROW_READS and args and watch._is_table(args[0]):
                    watch.tried = watch.tried or str(func)
                    raise NotYet(_INDEXED)
                return func(*args, **(kwargs or {}))

        self.mode = Reads()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        if self.tried and not isinstance(exc[1], NotYet):  # the learner's code swallowed the refusal
            raise NotYet(_INDEXED)
        return False


@exercise
@hints("A one-hot row for id i is all zeros except a 1 at column i. What do you get when you multiply it by the table?",
       "torch.nn.functional.one_hot(ids, num_classes) makes the rows; num_classes is the vocabulary, table.shape[0]; "
       "convert them to the table's dtype before the product.",
       "one_hot = torch.nn.functional.one_hot(ids, table.shape[0]).to(table.dtype)  # [..., vocab]; "
       "return one_hot @ table  # [..., hidden]")
def check_one_hot_embed(embed) -> str:
    """Exercise 2.1: embed(ids, table) with a one-hot matrix product; indexing the table is refused."""
    expect(callable(embed), "define a function embed(ids, table) that returns one vector per id.")
    for table, ids in [(_table(), torch.tensor([3, 0, 7, 3])), (_table(1, 13, 5).double(), torch.tensor([[12, 1, 1],
                                                                                                         [0, 4, 9]]))]:
        guarded = table.clone().as_subclass(_UnindexableTable)
        try:
            with _RowReads(guarded):
                out = call(embed, ids.clone(), guarded)
        except _LearnerFailed as failed:  # the typical one: int64 one-hot rows times a float table
            err = failed.args[0]
            expect(not (isinstance(err, RuntimeError) and any(w in str(err) for w in ("dtype", "scalar type"))),
                   f"your product mixes two dtypes ({err}): one_hot makes int64 rows; convert them to the table's "
                   "dtype, .to(table.dtype), before multiplying.")
            raise
        out = returned(out, "tensor", "the embeddings").as_subclass(torch.Tensor)
        want = tuple(ids.shape) + (table.shape[1],)
        expect(tuple(out.shape) == want, f"for ids of shape {tuple(ids.shape)} and a {list(table.shape)} table the "
                                         f"result is {list(want)} (one row per id), not {list(out.shape)}: "
                                         "one_hot(ids, vocab) is [..., vocab], and [..., vocab] @ [vocab, hidden] is "
                                         "[..., hidden].")
        expect(torch.allclose(out.to(table.dtype), table[ids], atol=1e-6),
               "the vectors are not the table's rows: each one-hot row must hold a single 1, at the token's id.")
    return "a one-hot row times the table picks exactly that token's row: the lookup is a matrix product."


def _neighbour_table(seed: int, vocab: int, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A table whose rows have very different lengths, and whose query rows each have an opposite twin, so that a
    raw dot product, abs(cos) and a missing self-exclusion each give other neighbours: (table, query ids)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, hidden, generator=g) * torch.exp(1.5 * torch.randn(vocab, 1, generator=g))
    ids = torch.randperm(vocab // 2, generator=g)[:5]
    twins = vocab // 2 + torch.arange(len(ids))
    table[twins] = -3.0 * table[ids] + 0.05 * torch.randn(len(ids), hidden, generator=g)  # the opposite direction
    return table, ids


def _by_cosine(table: torch.Tensor, ids: torch.Tensor, k: int, keep_self=False, absolute=False, lengths=True,
               smallest=False) -> torch.Tensor:
    rows = table.double() / (table.double().norm(dim=-1, keepdim=True) if lengths else 1.0)
    sims = rows[ids] @ rows.T  # [queries, vocab]
    sims = sims.abs() if absolute else sims
    if not keep_self:
        sims[torch.arange(len(ids)), ids] = float("inf") if smallest else -float("inf")
    return sims.topk(k, dim=-1, largest=not smallest).indices


NEIGHBOUR_MISTAKES = [
    (dict(lengths=False), "you ranked by the raw dot product: long rows win whatever their direction. Divide every "
                          "row of the table by its length first, then the dot product is the cosine."),
    (dict(keep_self=True), "each token's first neighbour is itself (cosine 1): leave the query's own row out."),
    (dict(absolute=True), "you ranked by abs(cos): a vector pointing the opposite way (cosine -1) is the least "
                          "similar, not the most."),
    (dict(smallest=True), "you took the k least similar rows: topk picks the largest by default, largest first."),
]


_PRODUCTS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.mm,
             torch.Tensor.mm, torch.mv, torch.Tensor.mv, torch.bmm, torch.Tensor.bmm, torch.einsum, torch.dot,
             torch.Tensor.dot, torch.inner, torch.Tensor.inner, torch.tensordot, torch.nn.functional.linear,
             torch.nn.functional.cosine_similarity, torch.cosine_similarity}
_LEAVING_TORCH = [(torch.Tensor, "numpy"), (torch.Tensor, "__array__"), (torch.Tensor, "untyped_storage"),
                  (torch.Tensor, "storage")]  # NumPy's loops are none of torch's calls: the count below could not see them
_READ_OUT = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.__int__,
             torch.Tensor.__index__, torch.Tensor.__bool__, torch.Tensor.__complex__}  # numbers handed to Python
_CHOICES = {torch.topk, torch.Tensor.topk, torch.sort, torch.Tensor.sort, torch.argsort, torch.Tensor.argsort,
            torch.argmax, torch.Tensor.argmax, torch.kthvalue, torch.Tensor.kthvalue}


class _Counted:
    """Counts the matrix products and the choices (topk, sort, argmax) torch runs inside the block: a Python loop
    over queries or rows runs one of each per pass, the whole-table method one in all. It also counts the numbers
    handed to Python (tolist, item, float()): a loop in pure Python reads the table out first."""

    def __enter__(self):
        self.products = self.choices = self.calls = self.read_out = 0

        def seen(func, args, kwargs, out):
            self.products += func in _PRODUCTS
            self.choices += func in _CHOICES
            self.calls += 1
            if func in _READ_OUT and args and isinstance(args[0], torch.Tensor):
                self.read_out += args[0].numel()

        self._watch = torch_calls(seen)
        self._watch.__enter__()
        return self

    def __exit__(self, *exc):
        return self._watch.__exit__(*exc)


@exercise
@hints("Cosine similarity is a dot product between two vectors of length 1. If every row of the table had length 1, "
       "how could one matrix product compare the queries with every row at once?",
       "Divide each row by its own length (keep the dimension, so it broadcasts); then the queries' rows times the "
       "transposed table give a [queries, vocab] matrix of cosines. A query's own row is always its best match.",
       "Push each query's own entry below -1 before choosing, then torch.topk along the last dimension gives the k "
       "largest per row, largest first; return its indices.")
def check_nearest_neighbours(neighbours) -> str:
    """Exercise 2.2: neighbours(table, ids, k) -> [len(ids), k] row ids by cosine, most similar first, self left out."""
    from ..model import embeddings

    expect(callable(neighbours), "define a function neighbours(table, ids, k) that returns k row ids per query id.")
    library = [(torch.nn.functional, "cosine_similarity"), (torch, "cosine_similarity"),
               (embeddings, "cosine_similarities"), (embeddings, "nearest_neighbours")]
    for seed, vocab, hidden, k in [(5, 300, 12, 4), (6, 1000, 24, 7)]:
        table, ids = _neighbour_table(seed, vocab, hidden)
        with forbidden_all(library, "normalise the rows and take one matrix product yourself"), \
                forbidden_all(_LEAVING_TORCH, "stay in torch: one matrix product compares every query with every row"), \
                _Counted() as one:
            call(neighbours, table.clone(), ids[:1].clone(), k)  # one query: what a loop over queries does once
        with forbidden_all(library, "normalise the rows and take one matrix product yourself"), \
                forbidden_all(_LEAVING_TORCH, "stay in torch: one matrix product compares every query with every row"), \
                _Counted() as ran:
            out = call(neighbours, table.clone(), ids.clone(), k)
        expect(ran.read_out <= len(ids) * (k + 1), f"your code handed {ran.read_out} numbers to Python (tolist, "
                                                   "item, float) and compared them there: a Python loop over the "
                                                   f"table's rows. Compare all {len(ids)} queries with the whole table "
                                                   "in torch: one matrix product and one topk.")
        expect(ran.calls <= one.calls + 2, f"your code ran {one.calls} torch calls for one query and {ran.calls} for "
                                           f"{len(ids)}: a Python loop over the queries. Compare all of them with the "
                                           "whole table at once: one matrix product and one topk.")
        expect(ran.products <= 2 and ran.choices <= 2 and ran.calls <= 60,
               f"compare all {len(ids)} queries with the whole table at once: one matrix product (the normalised "
               f"query rows times the normalised table, transposed) and one topk. Your code ran {ran.products} "
               f"products, {ran.choices} topk/sort/argmax and {ran.calls} torch calls in all: a Python loop over "
               "the queries or the rows.")
        out = returned(out, "tensor", "the neighbours' row ids")
        expect(tuple(out.shape) == (len(ids), k), f"return one row of {k} ids per query, shape [{len(ids)}, {k}], not "
                                                  f"{list(out.shape)}.")
        expect(not out.dtype.is_floating_point, "return the neighbours' row ids (topk's indices), not their cosines.")
        out = out.long()
        want = torch.stack([torch.tensor([n.token_id for n in embeddings.nearest_neighbours(table, int(i), k)])
                            for i in ids])  # the library's answer, one query at a time
        if torch.equal(out, want):
            continue
        for change, message in NEIGHBOUR_MISTAKES:
            expect(not torch.equal(out, _by_cosine(table, ids, k, **change)), message)
        expect(torch.equal(out.sort(-1).values, want.sort(-1).values),
               f"not the {k} nearest rows by cosine yet: compare each query with every row of the table.")
        expect(False, "the right neighbours in the wrong order: most similar first (topk's order).")
    return "the same neighbours as the library's nearest_neighbours: one normalised matrix product ranks the whole table."


def _reference_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    cos, sin = rope_module.rope_cos_sin(positions, x.shape[-1], theta, dtype=torch.float64)
    return rope_module.apply_rope(x.double()[None, None], cos, sin)[0, 0]


def _interleaved(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    angles = rope_module.rope_angles(positions, x.shape[-1], theta, torch.float64)  # [seq, d/2]
    even, odd = x.double()[:, 0::2], x.double()[:, 1::2]
    out = torch.empty_like(x, dtype=torch.float64)
    out[:, 0::2], out[:, 1::2] = even * angles.cos() - odd * angles.sin(), even * angles.sin() + odd * angles.cos()
    return out


def _no_library_rope() -> forbidden_all:
    llama = sys.modules.get("transformers.models.llama.modeling_llama")
    names = ("apply_rope", "rotate_half", "rope_cos_sin", "rotate_2d", "rope_angles", "rope_frequencies")
    return forbidden_all([(rope_module, name) for name in names]
                         + [(llama, "apply_rotary_pos_emb"), (llama, "rotate_half")],
                         "turn each pair yourself: (x cos a - y sin a, x sin a + y cos a)",
                         transformers=("apply_rotary_pos_emb", "rotate_half"))


@exercise
@hints("Cut x into pairs, turn each pair by an angle that grows with the position, and put the numbers back where "
       "they were. Which number is paired with which in Llama's layout?",
       "Pair j is (x[:, j], x[:, j + d/2]): the two halves of the vector. Pair j turns by position * theta ** (-2j / d) "
       "radians, counter-clockwise: (x cos a - y sin a, x sin a + y cos a).",
       "d = x.shape[-1]; freqs = 1 / theta ** (torch.arange(0, d, 2) / d); a = positions[:, None] * freqs  # [seq, d/2]; "
       "x1, x2 = x[:, :d//2], x[:, d//2:]; return torch.cat([x1*a.cos() - x2*a.sin(), x1*a.sin() + x2*a.cos()], -1)")
def check_rope(rope) -> str:
    """Exercise 2.3: rope(x, positions, theta) turns one head's vectors x [seq, head_dim] by their positions [seq]."""
    expect(callable(rope), "define a function rope(x, positions, theta) that returns a tensor shaped like x.")
    g = torch.Generator().manual_seed(3)
    cases = [(torch.randn(4, 8, generator=g), torch.tensor([0, 1, 2, 3]), 10000.0),
             (torch.randn(5, 16, generator=g), torch.tensor([5, 3, 100, 4096, 7]), 100000.0)]
    for x, positions, theta in cases:
        with _no_library_rope():
            out = returned(call(rope, x.clone(), positions.clone(), theta), "tensor", "the turned vectors")
        expect(tuple(out.shape) == tuple(x.shape), f"return a tensor shaped like x, {list(x.shape)}, not "
                                                   f"{list(out.shape)}.")
        out = out.double()
        right = _reference_rope(x, positions, theta)
        if torch.allclose(out, right, atol=2e-3):
            continue
        expect(torch.allclose(out.norm(dim=-1), x.double().norm(dim=-1), atol=1e-3),
               "the lengths changed: a rotation keeps each pair's length, so mix each pair with cos and sin of one "
               "angle, both numbers of the pair with the same angle.")
        half = x.shape[-1] // 2
        expect(not torch.allclose(out, torch.cat([right[:, half:], right[:, :half]], dim=-1), atol=2e-3),
               "your two halves are swapped: the first half is x1 cos a - x2 sin a, the second x1 sin a + x2 cos a "
               "(x1 = x[:, :d/2], x2 = x[:, d/2:]), in that order.")
        expect(not torch.allclose(out, _interleaved(x, positions, theta), atol=2e-3),
               "you turned neighbours (x[2i], x[2i+1]); Llama's layout pairs x[j] with x[j + d/2], the two halves "
               "(the checkpoint's query and key rows are stored in that order).")
        expect(not torch.allclose(out, _reference_rope(x, -positions, theta), atol=2e-3),
               "you turned the pairs the wrong way round: (x cos a - y sin a, x sin a + y cos a) turns "
               "counter-clockwise.")
        expect(not torch.allclose(out, _reference_rope(x, torch.arange(len(positions)), theta), atol=2e-3),
               "use the positions you are given (here they are not 0, 1, 2 ...): the angle is position * frequency.")
        expect(False, f"not yet equal to RoPE for head_dim {x.shape[-1]}, theta {theta:,.0f}: pair j turns by "
                      "position * theta ** (-2j / head_dim) radians (pair 0 by 1 radian per position).")
    return "the same numbers as the library's apply_rope, which matches transformers: RoPE is just rotations."
