"""Tensor parallelism (claim C21): every layer's matrices split across TP ranks, the Megatron way.

A linear layer computes x @ W.T with the weight stored [out, in]. Split it two ways:
- by columns of W.T (rows of the stored weight, its outputs): each rank computes some of the outputs, all of them
  from the whole input. q/k/v (whole heads) and gate/up (a slice of the MLP's width) are split so; no talk needed.
- by rows of W.T (columns of the stored weight, its inputs): each rank multiplies only the inputs it holds, and
  the ranks' partial outputs must be added up, an all-reduce. o_proj and down are split so, right after the column
  layers whose outputs they take: a block needs one all-reduce after attention and one after the MLP, no more.
- the tied embedding and LM head are split by vocabulary: a rank looks up only the tokens it holds (zeros for the
  others, then an all-reduce), and computes only its share of the logits (then an all-gather). A vocabulary that
  TP does not divide is padded with rows of zeros on the last rank (as vLLM and Megatron do), cut off again after
  the all-gather.

A rank's model is the plain ScratchLlama built for its share of the heads and of the MLP's width (`local_config`),
its weights sliced from the checkpoint, and four modules swapped for the parallel ones below (marked `# new`).
Nothing of the model is written twice: the blocks, the attention and the decoding loop are the plain ones.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace
from math import gcd
from pathlib import Path

import torch
from torch import nn

from ..claims import claim
from ..device import timed
from ..errors import CourseError
from ..model.scratch import ScratchConfig, ScratchLlama
from ..weights.load import checkpoint_name

COLUMN, ROW = 0, 1  # the dim of a stored weight [out, in] that a split cuts: outputs (and vocabulary) or inputs
SPLITS = {"q_proj": COLUMN, "k_proj": COLUMN, "v_proj": COLUMN, "gate_proj": COLUMN, "up_proj": COLUMN,
          "o_proj": ROW, "down_proj": ROW, "embed_tokens": COLUMN, "lm_head": COLUMN}


def split_dim(name: str) -> int | None:
    """The dim of parameter `name` that TP cuts: 0 (outputs, or vocabulary), 1 (inputs), None (kept whole: norms)."""
    parts = name.split(".")
    return SPLITS.get(parts[-2]) if len(parts) >= 2 else None


def valid_tp_sizes(cfg: ScratchConfig, up_to: int = 64, replicate_kv: bool = False) -> list[int]:
    """The TP sizes that give every rank whole query heads, whole KV heads and an equal share of the MLP's width.

    replicate_kv=False: TP divides the KV heads too (this course's TP model, where each rank holds its own KV heads).
    replicate_kv=True: vLLM's rule. It checks only that TP divides the query heads (and its layers divide the MLP's
    width); where TP exceeds the KV heads, each rank holds one KV head and TP / KV heads ranks hold copies of it
    (QKVParallelLinear's num_kv_head_replicas), so TP must then be a multiple of the KV heads (`kv_head_replicas`).
    """
    if not replicate_kv:
        common = gcd(gcd(cfg.num_heads, cfg.num_kv_heads), cfg.intermediate_size)
        return [n for n in range(1, up_to + 1) if common % n == 0]
    return [n for n in range(1, up_to + 1) if cfg.num_heads % n == 0 and cfg.intermediate_size % n == 0
            and (cfg.num_kv_heads % n == 0 or n % cfg.num_kv_heads == 0)]


def kv_head_replicas(cfg: ScratchConfig, tp: int) -> int:
    """How many ranks hold a copy of each KV head under vLLM's rule: 1 while TP divides the KV heads, TP / KV heads
    beyond them (each rank then holds a single KV head, the one its query heads read)."""
    if tp not in valid_tp_sizes(cfg, max(tp, 1), replicate_kv=True):
        raise CourseError(f"TP = {tp} fits neither way: TP must divide the {cfg.num_heads} query heads and the MLP "
                          f"width, and either divide the {cfg.num_kv_heads} KV heads or be a multiple of them; choose "
                          f"from {valid_tp_sizes(cfg, replicate_kv=True)}.")
    return max(1, tp // cfg.num_kv_heads)


def kv_heads_of_rank(cfg: ScratchConfig, tp: int) -> list[list[int]]:
    """For each rank, the KV heads it holds (vLLM's rule): a contiguous block of KV heads / TP of them, or, beyond the
    KV heads, the single KV head that its block of query heads reads (so neighbouring ranks hold the same one)."""
    replicas = kv_head_replicas(cfg, tp)
    if replicas == 1:
        k = cfg.num_kv_heads // tp
        return [list(range(r * k, (r + 1) * k)) for r in range(tp)]
    return [[r // replicas] for r in range(tp)]


def check_tp_size(cfg: ScratchConfig, tp) -> None:
    """Refuse a TP size that does not divide the model, in one sentence, before any rank starts."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise CourseError(f"The TP size must be a whole number of ranks, at least 1, not {tp!r}.")
    parts = [("query heads", cfg.num_heads), ("KV heads", cfg.num_kv_heads), ("MLP width", cfg.intermediate_size)]
    wrong = [f"{n:,} {what}" for what, n in parts if n % tp]
    if wrong:
        raise CourseError(f"TP = {tp} does not divide this model's {' and '.join(wrong)}: each rank must hold whole "
                          f"heads and an equal share, so choose a TP size from {valid_tp_sizes(cfg)}.")


def local_config(cfg: ScratchConfig, tp: int) -> ScratchConfig:
    """One rank's share of the model: heads / TP, KV heads / TP, MLP width / TP (the vocabulary is split by its modules)."""
    check_tp_size(cfg, tp)
    return replace(cfg, num_heads=cfg.num_heads // tp, num_kv_heads=cfg.num_kv_heads // tp,
                   intermediate_size=cfg.intermediate_size // tp)


def shard(weight: torch.Tensor, dim: int | None, rank: int, tp: int) -> torch.Tensor:
    """Rank `rank`'s contiguous 1/TP of `weight` along `dim` (the whole weight for dim None), as a new tensor."""
    if dim is None:
        return weight.clone()
    if weight.shape[dim] % tp:
        raise CourseError(f"A weight of shape {tuple(weight.shape)} cannot be cut into {tp} equal parts along dim {dim}.")
    return weight.chunk(tp, dim)[rank].clone()


# --------------------------------------------------------------------------- the collectives, counted


@dataclass
class Collective:
    op: str  # "all_reduce" or "all_gather"
    site: str  # "attention", "mlp", "embedding", "logits"
    bytes: int  # this rank's message: numel x bytes per element
    seconds: float | None = None  # wall time inside the call, when timing is on


@dataclass
class Communicator:
    """The collectives of one rank's model, in one place: each call is recorded (and timed when `timing`).

    group: the torch.distributed group of the TP ranks (dist.group.WORLD for all of them); None for a rank alone,
    which sends nothing (TP = 1) but still records where the collectives would be.
    """

    group: object = None
    timing: bool = False
    calls: list[Collective] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        import torch.distributed as dist

        return 1 if self.group is None else dist.get_world_size(self.group)

    def all_reduce(self, x: torch.Tensor, site: str) -> torch.Tensor:
        """x summed over the ranks, in place (every rank ends with the same sum)."""
        import torch.distributed as dist

        self._record("all_reduce", site, x, lambda: None if self.group is None else dist.all_reduce(x, group=self.group))
        return x

    def all_gather(self, x: torch.Tensor, site: str) -> torch.Tensor:
        """The ranks' `x` side by side along the last dim, in rank order."""
        import torch.distributed as dist

        if self.group is None:
            self._record("all_gather", site, x, lambda: None)
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        self._record("all_gather", site, x, lambda: dist.all_gather(parts, x.contiguous(), group=self.group))
        return torch.cat(parts, dim=-1)

    def _record(self, op: str, site: str, x: torch.Tensor, call) -> None:
        seconds = None
        if self.timing:
            seconds = timed(call, x.device)[0]
        else:
            call()
        self.calls.append(Collective(op, site, x.numel() * x.element_size(), seconds))

    def counts(self) -> dict[str, int]:
        """Calls per site since the last reset, such as {"attention": 30, "mlp": 30, "embedding": 1, "logits": 1}."""
        out: dict[str, int] = {}
        for c in self.calls:
            out[c.site] = out.get(c.site, 0) + 1
        return out

    def reset(self) -> None:
        self.calls.clear()


# --------------------------------------------------------------------------- the four parallel modules


class RowParallelLinear(nn.Linear):
    """o_proj and down: this rank's in_features / TP inputs; an all-reduce adds up the ranks' partial outputs."""

    def __init__(self, in_features: int, out_features: int, comm: Communicator, site: str):
        super().__init__(in_features, out_features, bias=False)
        self.comm, self.site = comm, site

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = super().forward(x)  # [batch, seq, hidden]: this rank's share of the sum
        return self.comm.all_reduce(partial, self.site)  # new: the sum over ranks, on every rank


class VocabParallelEmbedding(nn.Embedding):
    """The embedding table's rows `start .. start + rows`: zeros for the other ids, then an all-reduce."""

    def __init__(self, rows: int, hidden: int, start: int, comm: Communicator):
        super().__init__(rows, hidden)
        self.start, self.comm = start, comm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        mine = (local >= 0) & (local < self.num_embeddings)  # [batch, seq]: the ids this rank holds
        x = super().forward(local.clamp(0, self.num_embeddings - 1))  # [batch, seq, hidden]
        x = x.masked_fill(~mine.unsqueeze(-1), 0.0)  # new: another rank holds these rows
        return self.comm.all_reduce(x, "embedding")  # new: each id's row, from the rank that holds it


class VocabParallelLMHead(nn.Linear):
    """The LM head's vocabulary rows `start .. start + rows`: this rank's logits, then an all-gather of all of them."""

    def __init__(self, hidden: int, rows: int, vocab_size: int, comm: Communicator):
        super().__init__(hidden, rows, bias=False)
        self.vocab_size, self.comm = vocab_size, comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = super().forward(x)  # [batch, seq, vocab / TP]
        logits = self.comm.all_gather(local, "logits")  # new: [batch, seq, TP x rows]
        return logits[..., :self.vocab_size]  # new: without the padding rows (none when TP divides the vocabulary)


# --------------------------------------------------------------------------- one rank's model


def checkpoint_reader(folder: str | Path):
    """read(name, dim, start, stop): the slice start:stop along dim of one of our weights (all of it for dim None),
    read from the folder's safetensors: only those bytes are read."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise CourseError(f"{folder} holds no .safetensors file: pass the folder of a converted model.")
    where = {}
    for path in files:
        with safe_open(path, "pt") as f:
            where.update(dict.fromkeys(f.keys(), path))

    def read(name: str, dim: int | None = None, start: int = 0, stop: int | None = None) -> torch.Tensor:
        key = checkpoint_name(name)
        if key not in where:
            raise CourseError(f"The checkpoint has no weight named {key}: is it a Llama-family model?")
        with safe_open(where[key], "pt") as f:
            part = f.get_slice(key)
            if dim is None:
                return part[:]
            return part[start:stop] if dim == 0 else part[:, start:stop]

    return read


def state_dict_reader(model: ScratchLlama):
    """read(name, dim, start, stop) for a model already in memory (a ScratchLlama): slices of its own weights."""
    weights = model.state_dict()

    def read(name: str, dim: int | None = None, start: int = 0, stop: int | None = None) -> torch.Tensor:
        weight = weights[name]
        if dim is None:
            return weight.clone()
        return weight.narrow(dim, start, (weight.shape[dim] if stop is None else stop) - start).clone()

    return read


@dataclass(frozen=True)
class RandomWeights:
    """A model of shape `cfg` with random weights, the same in every rank: each weight drawn from a generator seeded by
    `seed` and its name, so a rank makes only the weights it asks for (speed does not depend on the values)."""

    cfg: ScratchConfig
    seed: int = 0

    def reader(self):
        """read(name, dim, start, stop), as checkpoint_reader's."""
        with torch.device("meta"):
            shapes = {name: tuple(p.shape) for name, p in ScratchLlama(self.cfg).named_parameters()}

        def read(name: str, dim: int | None = None, start: int = 0, stop: int | None = None) -> torch.Tensor:
            if name not in shapes:
                raise CourseError(f"A model of this shape has no weight named {name}.")
            if "norm" in name:
                weight = torch.ones(shapes[name])
            else:
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
                weight = torch.randn(shapes[name], generator=g) * 0.02
            if dim is None:
                return weight
            return weight.narrow(dim, start, (weight.shape[dim] if stop is None else stop) - start).clone()

        return read


def reader_for(weights):
    """The reader of `weights`: a folder of safetensors (checkpoint_reader) or RandomWeights."""
    return weights.reader() if isinstance(weights, RandomWeights) else checkpoint_reader(weights)


def tensor_parallel_llama(read, cfg: ScratchConfig, rank: int, tp: int, comm: Communicator | None = None,
                          dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> ScratchLlama:
    """Rank `rank`'s model of a TP group of `tp`: the plain ScratchLlama for its share, its weights read by `read`.

    Call it like the plain model (logits `[batch, seq, vocab]`, all of the vocabulary on every rank) and decode
    with generate/decode.py: every rank runs the same loop and gets the same tokens. `model.comm` counts the
    collectives. Its KV cache (`new_cache`) holds this rank's KV heads only: 1/TP of the whole.
    """
    local = local_config(cfg, tp)
    comm = comm or Communicator()
    rows = -(-cfg.vocab_size // tp)  # this rank's share of the vocabulary, rounded up
    with torch.device("meta"):  # shapes only; the weights come next
        model = ScratchLlama(local)
        for block in model.layers:
            attn, mlp = block.self_attn, block.mlp
            attn.o_proj = RowParallelLinear(attn.o_proj.in_features, cfg.hidden_size, comm, "attention")  # new
            mlp.down_proj = RowParallelLinear(mlp.down_proj.in_features, cfg.hidden_size, comm, "mlp")  # new
        model.embed_tokens = VocabParallelEmbedding(rows, cfg.hidden_size, rank * rows, comm)  # new
        model.lm_head = VocabParallelLMHead(cfg.hidden_size, rows, cfg.vocab_size, comm)  # new
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
    weights = {}
    for name, param in model.named_parameters():
        dim = split_dim(name)
        if dim is None:
            weight = read(name)
        else:
            size = param.shape[dim]
            whole = cfg.vocab_size if name in ("embed_tokens.weight", "lm_head.weight") else size * tp
            weight = read(name, dim, min(rank * size, whole), min((rank + 1) * size, whole))
            if weight.shape[dim] < size:  # the last rank's vocabulary rows, padded with zeros
                pad = list(weight.shape)
                pad[dim] = size - weight.shape[dim]
                weight = torch.cat([weight, weight.new_zeros(pad)], dim=dim)
        if weight.shape != param.shape:
            raise CourseError(f"{name}: rank {rank}'s share has shape {tuple(weight.shape)}, the model expects "
                              f"{tuple(param.shape)}.")
        weights[name] = weight.to(device=device, dtype=dtype)
    model.load_state_dict(weights, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.tp, model.rank, model.comm = tp, rank, comm
    return model.eval()


def weight_bytes(model: nn.Module) -> int:
    """Bytes of a model's parameters (a tied weight counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


# --------------------------------------------------------------------------- the checks of claim C21


def check_tp_logits(diff: float, scale: float, same_tokens: bool, shards_equal: int, shards: int, tp: int,
                    new_tokens: int):
    """C21: TP = tp gives one process's logits (max |difference| `diff` within 1e-5 of the logits' `scale`), the same
    greedy tokens, and every rank's weights equal to transformers' tp_plan shards. A green line, or ClaimFailed."""
    return claim("C21", diff / scale <= 1e-5 and same_tokens and shards_equal == shards > 0,
                 f"TP = {tp}: max |logit difference| from one process {diff:.1e} on logits up to {scale:.1f} "
                 f"({diff / scale:.1e} of the scale); {new_tokens} cached greedy tokens identical on every rank: "
                 f"{same_tokens}; weights equal to transformers' tp_plan='auto' shards (to_local()): {shards_equal} "
                 f"of {shards}")


def check_tp_traffic(calls: list[tuple[str, str, int]], num_layers: int, hidden_state_bytes: int, tp: int,
                     kv_bytes: list[int], kv_whole: int, weight_bytes_per_rank: list[int], weights_whole: int,
                     kept_whole: int):
    """C21: one forward pass makes exactly two all-reduces per layer (after attention, after the MLP), each of one
    hidden state per token, plus the embedding's and the logits' all-gather; every rank holds 1/tp of the split
    weights (`kept_whole`: the bytes kept whole on every rank, the norms) and 1/tp of the KV cache.

    calls: (op, site, bytes) of one rank's forward pass, in order. A green line, or ClaimFailed."""
    sites = [site for _, site, _ in calls]
    reduces = [(site, b) for op, site, b in calls if op == "all_reduce"]
    per_layer = [s for s, _ in reduces if s in ("attention", "mlp")]
    expected = ["embedding"] + ["attention", "mlp"] * num_layers + ["logits"]
    each = {b for _, b in reduces}
    kv_ok = len(kv_bytes) == tp and all(tp * k == kv_whole for k in kv_bytes)
    weights_ok = len(weight_bytes_per_rank) == tp and all(
        tp * (w - kept_whole) == weights_whole - kept_whole for w in weight_bytes_per_rank)
    return claim("C21", sites == expected and each == {hidden_state_bytes} and kv_ok and weights_ok,
                 f"{len(per_layer)} all-reduces in the blocks for {num_layers} layers ({sites.count('attention')} after "
                 f"attention, {sites.count('mlp')} after the MLP: {len(per_layer) / max(num_layers, 1):g} per layer "
                 f"per forward), each of {sorted(each)} bytes (one hidden state per token: {hidden_state_bytes:,}); "
                 f"every rank holds 1/{tp} of the split weights: {weights_ok}, and 1/{tp} of the KV cache: {kv_ok}")
