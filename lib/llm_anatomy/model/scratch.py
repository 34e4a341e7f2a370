"""The Llama-family model from scratch, in plain PyTorch, running the real weights.

Read it top to bottom: small modules named after what they are (RMSNorm, MLP, Attention, Block), then the model;
its numbers come from a ScratchConfig (config.py). `ScratchLlama.from_hf(hf_model)` takes the weights of a loaded
transformers model (shared, not copied) and checks every shape. Calling the model on token ids gives logits
`[batch, seq, vocab]`; `trace(...)` also gives each layer's residual stream and, for the layers you ask for, the
attention weights. A KVCache from `new_cache()` makes decoding feed only the newest token (notebook 06); any cache
with its interface (kv_cache.KVCacheInterface) works the same way. As in transformers, each new token's RoPE position
(`positions`, transformers' position_ids) and the keys it may read (`attention_mask`) come with the tokens, from
whoever built the batch; the cache only stores and attends. Without them the model counts from the mask, or places
the tokens after the cache's `length`, and checks the largest position against the context once, for every cache.
`attention="sdpa"` (or `model.attention = "sdpa"`) swaps the written-out attention for torch's fused kernel, the same
numbers to rounding (notebook 07). Like transformers' model, ours is differentiable; the inference paths
(generate/decode.py) run it under torch.inference_mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from .attention import attention, check_attention_path, sdpa_attention
from .config import ScratchConfig, check_context
from ..errors import CourseError
from .kv_cache import KVCache, KVCacheInterface, rope_positions
from ..weights.load import checkpoint_name, transformers_model
from .rope import apply_rope, rope_cos_sin, rope_frequencies


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in fp32."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ScratchConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE, reading and writing the KV cache when given one."""

    def __init__(self, cfg: ScratchConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.path = "naive"  # or "sdpa"; the model's `attention` setting sets it in every layer

    def forward(self, x, cos, sin, cache: KVCacheInterface | None = None, key_mask=None, return_weights=False):
        b, s, _ = x.shape
        q, k, v = self.project(x, cos, sin)  # [b, heads, s, d], [b, kv_heads, s, d] twice
        kernel = partial(self.masked_kernel, key_mask=key_mask, return_weights=return_weights)
        # with a cache, attention goes through it: it stores k and v and runs the kernel over every position it holds
        out, weights = kernel(q, k, v) if cache is None else cache.attend(self.layer, q, k, v, kernel)
        out = out.transpose(1, 2).reshape(b, s, self.cfg.num_heads * self.cfg.head_dim)
        return self.o_proj(out), weights

    def project(self, x, cos, sin):
        """q, k, v of the tokens `x` `[b, s, hidden]`, q and k rotated to their positions."""
        b, s, _ = x.shape
        d = self.cfg.head_dim
        q = self.q_proj(x).view(b, s, self.cfg.num_heads, d).transpose(1, 2)  # [b, heads, s, d]
        k = self.k_proj(x).view(b, s, self.cfg.num_kv_heads, d).transpose(1, 2)  # [b, kv_heads, s, d]
        v = self.v_proj(x).view(b, s, self.cfg.num_kv_heads, d).transpose(1, 2)  # [b, kv_heads, s, d]
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def masked_kernel(self, q, k, v, *, key_mask=None, return_weights=False):
        """The kernel, once the mask is known to cover every key `[b, kv_heads, keys, d]` that attention reads here
        (only here are the keys known: a paged view or a flattened batch decides them)."""
        if key_mask is not None and key_mask.shape[-1] != k.shape[2]:
            raise CourseError(f"attention_mask must have one column per key attention reads: {k.shape[2]} keys, "
                              f"not {key_mask.shape[-1]} columns.")
        return self.kernel(q, k, v, key_mask=key_mask, return_weights=return_weights)

    def kernel(self, q, k, v, *, key_mask=None, return_weights=False):
        """Attention of q over every key and value `[b, kv_heads, k_len, d]`: (out `[b, heads, s, d]`, weights or None).

        Grouped-query attention: each KV head serves n_rep = heads // kv_heads query heads. The plain way, which
        transformers' eager attention takes, copies each KV head for its group and then attends head by head:
            n_rep = self.cfg.num_heads // self.cfg.num_kv_heads
            out = attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep))   # k, v: [b, heads, past + s, d]
        attention() gives the same numbers (to float rounding) without the copy: it stacks a group's query heads as
        rows against their shared KV head (attention.py). At decode, reading K and V is most of attention's own
        work; the copy would triple it here.
        """
        if self.path == "sdpa" and not return_weights:  # the fused kernel keeps no weights to return
            return sdpa_attention(q, k, v, causal=True, key_mask=key_mask), None
        out = attention(q, k, v, causal=True, key_mask=key_mask, return_weights=return_weights)
        return out if return_weights else (out, None)


class Block(nn.Module):
    """One transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ScratchConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache=None, key_mask=None, return_weights=False):
        attn_out, weights = self.self_attn(self.input_layernorm(x), cos, sin, cache, key_mask, return_weights)
        x = x + attn_out
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, weights


@dataclass
class ScratchOutput:
    logits: torch.Tensor  # [batch, seq, vocab]
    hidden_states: list[torch.Tensor] = field(default_factory=list)  # residual stream: embeddings, then after each block
    attentions: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [batch, heads, q_len, k_len]


class ScratchLlama(nn.Module):
    """The whole model: embedding, blocks, final norm, LM head (tied to the embedding when the config says so)."""

    def __init__(self, cfg: ScratchConfig, attention: str = "naive"):
        super().__init__()
        cfg.check_runnable()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self._inv_freq = None  # RoPE frequencies on the model's device, made on first use
        self.attention = attention

    @property
    def attention(self) -> str:
        """Which attention every layer runs: "naive" (written out, the default) or "sdpa" (torch's fused kernel)."""
        return self.layers[0].self_attn.path

    @attention.setter
    def attention(self, path: str) -> None:
        check_attention_path(path)
        for block in self.layers:
            block.self_attn.path = path

    @classmethod
    def from_hf(cls, hf_model, attention: str = "naive") -> "ScratchLlama":
        """Build from a loaded transformers Llama-family model, sharing its weight tensors (no copy).

        Accepts the transformers model itself or the course's LoadedModel. Every shape is checked.
        attention: "naive" (the written-out attention) or "sdpa" (torch's fused kernel).
        """
        check_attention_path(attention)
        hf_model = transformers_model(hf_model)
        cfg = ScratchConfig.from_hf(hf_model.config)
        with torch.device("meta"):  # no memory and no random init: the real weights come next
            ours = cls(cfg, attention)
        theirs = hf_model.state_dict(keep_vars=True)  # the Parameters themselves: one tensor, one gradient
        weights = {}
        for name, param in ours.named_parameters():
            key = checkpoint_name(name)
            if key not in theirs:
                raise CourseError(f"The model has no weight named {key}: is it a Llama-family model?")
            if theirs[key].shape != param.shape:
                raise CourseError(f"Shape mismatch for {name}: ours {tuple(param.shape)}, "
                                  f"theirs {tuple(theirs[key].shape)}.")
            param.requires_grad_(theirs[key].requires_grad)  # assign gives their tensor this flag: keep theirs
            weights[name] = theirs[key]
        ours.load_state_dict(weights, strict=False, assign=True)  # assign: share the storage, no copy
        if cfg.tie_word_embeddings:
            ours.lm_head.weight = ours.embed_tokens.weight
        return ours.eval()

    @property
    def device(self) -> torch.device:
        return self.layers[0].input_layernorm.weight.device  # every block has one (a pipeline stage no embedding)

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].input_layernorm.weight.dtype

    def new_cache(self, batch_size: int = 1, max_len: int | None = None) -> KVCache:
        """An empty KV cache for this model (max_len defaults to the model's context length)."""
        cfg = self.cfg
        return KVCache.allocate(cfg.num_layers, batch_size, cfg.num_kv_heads, max_len or cfg.max_position_embeddings,
                                cfg.head_dim, dtype=self.dtype, device=self.device)

    def forward(self, input_ids: torch.Tensor, cache: KVCacheInterface | None = None,
                attention_mask: torch.Tensor | None = None, logits_to_keep: int = 0, *,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits `[batch, seq, vocab]` for token ids `[batch, seq]`; with a cache, appends to it.

        logits_to_keep: compute logits for the last n positions only (0 = all). Generation needs
        only the last one, and the LM head is the largest matrix of a small model.
        """
        return self.trace(input_ids, cache, attention_mask, positions=positions, keep_hidden=False,
                          logits_to_keep=logits_to_keep).logits

    def trace(self, input_ids: torch.Tensor | None, cache: KVCacheInterface | None = None,
              attention_mask: torch.Tensor | None = None, *, positions: torch.Tensor | None = None,
              logits_at: torch.Tensor | None = None, keep_hidden: bool = True, attention_layers=(),
              logits_to_keep: int = 0, check_range: bool = True,
              inputs_embeds: torch.Tensor | None = None) -> ScratchOutput:
        """Run the model and keep what the notebooks look at.

        attention_mask: optional `[batch, keys]` of 1 (token) and 0 (padding), as in transformers: one column per key
            attention reads (with a KVCache, the cached positions and the new ones). None: every key may be read.
        positions: the RoPE position of each new token, `[seq]` or `[batch, seq]` (transformers' position_ids), from
            whoever built the batch. None: counted from attention_mask (the real tokens before each token) when one
            is given, else after the cache's `length` (0 without a cache); a cache that keeps no count of its
            positions (a paged view, a flattened batch, the fixed-shape slots) needs them given.
        logits_at: a tensor of positions `[n]`: the logits at those positions only.
        keep_hidden: keep the residual stream `[batch, seq, hidden]` before the first block and after each.
        attention_layers: layers whose attention weights to keep (computing them costs memory).
        logits_to_keep: as in forward().
        check_range: False skips reading the ids and the positions back to check them (the vocabulary, the
            context); the fixed-shape decode step feeds only ids the model chose itself, and a read back to the host
            would break its CUDA graph.
        inputs_embeds: the residual stream `[batch, seq, hidden]` to start from instead of input_ids (give None as
            input_ids), as in transformers: a pipeline stage after the first gets its stage's input this way.
        """
        if inputs_embeds is None:
            self._check_ids(input_ids, check_range)
        elif input_ids is not None or inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != self.cfg.hidden_size:
            raise CourseError(f"Give input_ids or inputs_embeds [batch, seq, {self.cfg.hidden_size}], not both.")
        if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
            raise CourseError(f"logits_to_keep must be a whole number >= 0 (0: all), not {logits_to_keep!r}; "
                              "give a tensor of positions as logits_at.")
        start = input_ids if inputs_embeds is None else inputs_embeds
        b, s = start.shape[:2]
        if cache is not None and cache.batch_size != b:
            raise CourseError(f"The cache was made for batch size {cache.batch_size}, not {b}.")
        past = 0 if cache is None else getattr(cache, "length", None)  # None: a cache that counts no positions
        key_mask = None
        if attention_mask is not None:
            keys = None if past is None else past + s  # else only attention knows them (Attention.masked_kernel)
            shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else ()
            if len(shape) != 2 or shape[0] != b or (shape[1] != keys if keys else shape[1] < s):
                want = f"{(b, keys)}" if keys is not None else f"({b}, keys >= {s})"
                raise CourseError(f"attention_mask must be [batch, keys] = {want}, one column per key attention "
                                  f"reads, not {shape or type(attention_mask).__name__}.")
            key_mask = attention_mask.to(start.device).bool()  # a mask made on the CPU for ids on a GPU
        positions = self._positions(positions, key_mask, past, b, s, start.device, check_range)
        cos, sin = self.rope(positions)
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds  # [b, s, hidden]
        out = ScratchOutput(logits=x)
        wanted = set(attention_layers)
        if keep_hidden:
            out.hidden_states.append(x)
        for i, block in enumerate(self.layers):
            x, weights = block(x, cos, sin, cache, key_mask, return_weights=i in wanted)
            if weights is not None:
                out.attentions[i] = weights
            if keep_hidden:
                out.hidden_states.append(x)
        if cache is not None:
            cache.advance(s)
        if logits_at is not None:
            x = x[:, logits_at]  # [b, n, hidden]: the positions asked for
        elif logits_to_keep:
            x = x[:, -logits_to_keep:]  # [b, logits_to_keep, hidden]
        out.logits = self.lm_head(self.norm(x))
        return out

    def _positions(self, positions, key_mask, past, b: int, s: int, device, check: bool) -> torch.Tensor:
        """The new tokens' RoPE positions `[s]` or `[b, s]` (given, or the default of trace), the largest checked
        against the context: the one rule for every cache."""
        top = None  # the largest position, when known without reading a tensor back
        if positions is None:
            if key_mask is not None:  # as transformers: the count of real tokens before each token
                positions = rope_positions(key_mask, key_mask.shape[1] - s, s, device)
            elif past is None:
                raise CourseError("This cache keeps no count of its positions: pass positions= (and attention_mask=) "
                                  "from whoever built the batch.")
            else:
                positions, top = torch.arange(past, past + s, device=device), past + s - 1
        elif (not isinstance(positions, torch.Tensor) or positions.shape not in ((s,), (b, s))
              or positions.dtype not in (torch.int64, torch.int32)):
            shape = tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__
            raise CourseError(f"positions must be whole numbers of shape [seq] = ({s},) or [batch, seq] = {(b, s)}, "
                              f"not {shape}.")
        else:
            positions = positions.to(device)
        if top is None and check:
            top = int(positions.max())
        if top is not None:
            check_context(top + 1, self.cfg.max_position_embeddings)
        return positions

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin `[..., seq, head_dim]` for positions `[..., seq]`, in the model's dtype.

        The frequencies are computed once on the CPU, as transformers does (so both agree bit for bit),
        and kept on the model's device: a decode step then makes no host-to-device copy.
        """
        if self._inv_freq is None or self._inv_freq.device != positions.device:
            self._inv_freq = rope_frequencies(self.cfg.head_dim, self.cfg.rope_theta).to(positions.device)
        return rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, dtype=self.dtype,
                            inv_freq=self._inv_freq)

    def _check_ids(self, input_ids: torch.Tensor, check_range: bool = True) -> None:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise CourseError(f"input_ids must be a tensor of shape [batch, seq], not {shape}: "
                              "wrap one prompt's ids as torch.tensor([ids]).")
        if input_ids.shape[1] == 0:
            raise CourseError("input_ids holds no token: give at least one.")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise CourseError(f"input_ids must be integer token ids, not {input_ids.dtype}.")
        # the range check reads the ids back from the device: skip it for one-token decode steps on a GPU
        if check_range and (input_ids.device.type == "cpu" or input_ids.shape[1] > 1):
            if int(input_ids.min()) < 0 or int(input_ids.max()) >= self.cfg.vocab_size:
                raise CourseError(f"input_ids must be integer token ids from 0 to {self.cfg.vocab_size - 1}.")

    @torch.no_grad()
    def attention_weights(self, input_ids: torch.Tensor, layer: int, head: int | None = None,
                          attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The attention weights of one layer, as its own attention computed them in one forward pass (no cache).

        Returns `[batch, heads, seq, seq]`, or `[batch, seq, seq]` for one `head`; each row sums to 1
        (a padding query's row is all zeros). Only the chosen layer's weights are kept.
        """
        self.cfg.check_layer_head(layer, head)
        out = self.trace(input_ids, attention_mask=attention_mask, keep_hidden=False, attention_layers=(layer,),
                         logits_to_keep=1)
        weights = out.attentions[layer]  # [batch, heads, seq, seq]
        return weights if head is None else weights[:, head]


def as_scratch(model) -> ScratchLlama:
    """A ScratchLlama for a ScratchLlama, a transformers Llama-family model or a LoadedModel (weights shared)."""
    return model if isinstance(model, ScratchLlama) else ScratchLlama.from_hf(model)
