"""Solutions to the exercises of notebook 10 (beyond one device)."""

from __future__ import annotations

import torch

from llm_anatomy.distributed.tensor_parallel import RowParallelLinear, VocabParallelEmbedding


def column_split(weight, rank, tp):
    """Exercise 10.1: rank's block of outputs: rows rank*k to (rank+1)*k - 1 of a weight stored [out, in]."""
    k = weight.shape[0] // tp
    return weight[rank * k:(rank + 1) * k]


def row_split(weight, rank, tp):
    """Exercise 10.1: rank's block of inputs: columns rank*k to (rank+1)*k - 1 (its output is a partial sum)."""
    k = weight.shape[1] // tp
    return weight[:, rank * k:(rank + 1) * k]


def traffic(cfg, batch, tokens, bytes_per_element):
    """Exercise 10.4: all-reduces of one forward pass (2 per block + the embedding's) and the bytes of each."""
    return 2 * cfg.num_layers + 1, batch * tokens * cfg.hidden_size * bytes_per_element


def predict(compute_s, tp, layers, latency_s, bytes_per_s, message_bytes):
    """Exercise 10.5: a TP step, seconds: each rank's share of the compute, plus 2 all-reduces per block."""
    return compute_s / tp + 2 * layers * (latency_s + message_bytes / bytes_per_s)


class MyRowParallelLinear(RowParallelLinear):
    """Exercise 10.2: this rank's inputs times its block of the weight (a partial sum), added up over the ranks."""

    def forward(self, x):
        partial = x @ self.weight.T  # [batch, seq, out]: every output, from this rank's inputs only
        return self.comm.all_reduce(partial, self.site)


def vocab_shard(table, rank, tp):
    """Exercise 10.3: rank's ceil(vocab / tp) rows of the table (the last rank's padded with zeros) and its first id."""
    rows = -(-table.shape[0] // tp)
    part = table[rank * rows:(rank + 1) * rows]
    return torch.cat([part, table.new_zeros(rows - part.shape[0], table.shape[1])]), rank * rows


class MyVocabParallelEmbedding(VocabParallelEmbedding):
    """Exercise 10.3: the rows of the ids this rank holds, zeros for the others, then an all-reduce."""

    def forward(self, input_ids):
        local = input_ids - self.start
        mine = (local >= 0) & (local < self.num_embeddings)  # [batch, seq]: the ids this rank holds
        x = self.weight[local.clamp(0, self.num_embeddings - 1)]  # [batch, seq, hidden]
        x = x * mine.unsqueeze(-1)  # another rank holds these rows
        return self.comm.all_reduce(x, "embedding")


def gpipe(stages, micro_batches):
    """Exercise 10.6: tick t, stage s works on micro-batch t - s; what it returns reaches stage s + 1 for tick t + 1."""
    p, m = len(stages), len(micro_batches)
    sent, ticks = {}, []
    for t in range(m + p - 1):
        work = [(s, t - s) for s in range(p) if 0 <= t - s < m]
        for s, i in work:
            sent[s, i] = stages[s](micro_batches[i] if s == 0 else sent[s - 1, i])
        ticks.append(work)
    return [sent[p - 1, i] for i in range(m)], ticks
