"""The embedding table: one learned vector per token id (claim C2), and ways to look at it.

Looking a token up is taking a row of the table, which is the same as multiplying a one-hot
vector by the table. Tokens used in similar ways end up with similar vectors; cosine similarity
measures how similar (1 = same direction, 0 = unrelated), and a 2-D projection (PCA) draws a few.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import CourseError
from ..weights.load import transformers_model


def embedding_table(model) -> torch.Tensor:
    """The input embedding table `[vocab, hidden]` of a transformers model, LoadedModel or ScratchLlama."""
    model = transformers_model(model)
    if hasattr(model, "get_input_embeddings"):
        return model.get_input_embeddings().weight
    if hasattr(model, "embed_tokens"):
        return model.embed_tokens.weight
    raise CourseError("This object has no embedding table: pass a loaded model.")


def one_hot_lookup(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Embeddings by matrix product: one_hot(ids) `[..., vocab]` @ table `[vocab, hidden]` -> `[..., hidden]`."""
    ids = torch.as_tensor(ids)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= table.shape[0]):
        raise CourseError(f"token ids must be from 0 to {table.shape[0] - 1}.")
    one_hot = torch.nn.functional.one_hot(ids.long(), table.shape[0]).to(table.dtype)  # [..., vocab]
    return one_hot @ table


def token_id(tokenizer, text: str) -> int:
    """The id of `text` when it is exactly one token (a leading space is part of many tokens: ' cat')."""
    if not isinstance(text, str) or not text:
        raise CourseError("Give a non-empty string, for example ' cat' (with its leading space).")
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        pieces = [tokenizer.decode([i]) for i in ids]
        raise CourseError(f"{text!r} is {len(ids)} tokens {pieces}, not one: pick a word that is a single token.")
    return ids[0]


def cosine_similarities(table: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of `vector` `[hidden]` with every row of `table` `[n, hidden]`: `[n]`, from -1 to 1."""
    table32, vector32 = table.detach().float(), vector.detach().float()
    return torch.nn.functional.cosine_similarity(table32, vector32[None, :], dim=-1)


@dataclass
class Neighbour:
    token_id: int
    token: str
    similarity: float  # cosine similarity, -1 .. 1

    def __str__(self) -> str:
        return f"{self.token!r} ({self.similarity:.3f})"


def nearest_neighbours(table: torch.Tensor, query: int | torch.Tensor, k: int = 5, tokenizer=None,
                       exclude=()) -> list[Neighbour]:
    """The k rows of `table` most similar (by cosine) to token id `query` or to a vector.

    The query token itself is left out; so are the ids in `exclude`. Token strings come from
    `tokenizer` when given.
    """
    if not isinstance(k, int) or k < 1:
        raise CourseError(f"k must be a whole number of neighbours, 1 or more, not {k!r}.")
    skip = set(int(i) for i in exclude)
    if isinstance(query, int):
        if not 0 <= query < table.shape[0]:
            raise CourseError(f"token id must be from 0 to {table.shape[0] - 1}, not {query}.")
        skip.add(query)
        vector = table[query]
    else:
        vector = torch.as_tensor(query)
        if vector.shape != table.shape[1:]:
            raise CourseError(f"the query vector must have {table.shape[1]} numbers, not shape {tuple(vector.shape)}.")
    sims = cosine_similarities(table, vector)
    if skip:
        sims[list(skip)] = -2.0  # below any real cosine similarity
    top = torch.topk(sims, min(k, table.shape[0] - len(skip)))
    return [Neighbour(int(i), tokenizer.decode([int(i)]) if tokenizer is not None else str(int(i)), float(v))
            for v, i in zip(top.values, top.indices)]


def pca_2d(vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Project rows `[n, hidden]` onto their two main directions (PCA by SVD).

    Returns the coordinates `[n, 2]` (on the CPU) and the fraction of the variance each direction explains `[2]`.
    """
    if vectors.dim() != 2 or vectors.shape[0] < 3:
        raise CourseError("PCA needs a 2-D tensor of at least 3 vectors, one per row.")
    x = vectors.detach().float().cpu()  # small: a few words' vectors, on the CPU for plotting
    x = x - x.mean(0, keepdim=True)  # centre, so the directions are about spread, not position
    _, s, vh = torch.linalg.svd(x, full_matrices=False)
    coords = x @ vh[:2].T  # [n, 2]
    variance = s.pow(2)
    return coords, variance[:2] / variance.sum()


def tied_embeddings(model) -> bool:
    """True when the output layer (LM head) uses the same storage as the input embedding table."""
    model = transformers_model(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else model.lm_head
    return head is not None and head.weight.data_ptr() == embedding_table(model).data_ptr()
