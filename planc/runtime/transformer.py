"""The reference decoder-only transformer: exactly the model a :class:`~planc.spec.ModelSpec` describes.

Pre-norm blocks (GPT-2 / Llama), fused causal attention
(``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``), no dropout.

Module names follow torchtitan's Llama so that tensor- and pipeline-parallel plans can address
modules by name, and they are part of planc's interface::

    tok_embeddings            nn.Embedding(padded_vocab, hidden)
    pos_embeddings            nn.Embedding(seq_len, hidden), or None with RoPE
    layers                    nn.ModuleDict {"0": block, ..., "L-1": block}
      attention_norm          LayerNorm or RMSNorm
      attention.wq wk wv wo   nn.Linear
      ffn_norm
      feed_forward.w1 w2 (w3) swiglu: w1 = gate, w3 = up, w2 = down; gelu: w1 = up, w2 = down
    norm                      final norm
    output                    nn.Linear(hidden, padded_vocab, bias=False); tied: the embedding's weight

``layers`` is a ModuleDict keyed by the layer index, so a pipeline splitter can delete blocks (and set
``tok_embeddings``/``pos_embeddings``/``norm``/``output`` to None) and every remaining parameter keeps
its fully-qualified name. :meth:`Transformer.forward` then passes hidden states through.

Attention infers its number of heads from the *local* width of ``wq``/``wk`` output (torchtitan's
``view(bs, seqlen, -1, head_dim)``), so after column-parallel sharding of wq/wk/wv with
``use_local_output=True`` each rank simply runs heads/tp local heads.

Weights are created by PyTorch's default initialisers and are meant to be overwritten by
:func:`init_weights`, whose values depend only on (seed, parameter name, full shape) -- identical for
every parallel layout.
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from planc.spec import ModelSpec

if TYPE_CHECKING:
    from planc.runtime.loss import Backward

#: Standard deviation of the normal init of matrices and embeddings (GPT-2; Radford et al. 2019).
INIT_STD = 0.02

#: Name segments that wrappers insert into parameter names (DDP, torch.compile, activation
#: checkpointing, FSDP1). :func:`canonical_name` drops them so a wrapped model initialises like a bare one.
WRAPPER_SEGMENTS = frozenset({"module", "_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"})


# --------------------------------------------------------------------------------------------------
# Rotary position embedding (Su et al. 2021, "RoFormer", Eq. 34), in Llama's interleaved-pair form:
# feature pairs (x[2i], x[2i+1]) are rotated by the angle  position * theta^(-2i / head_dim).
# --------------------------------------------------------------------------------------------------


def rope_table(seq_len: int, head_dim: int, theta: float, device: torch.device | str | None = None) -> torch.Tensor:
    """cos and sin of every (position, frequency) pair: a float32 tensor ``[seq_len, head_dim/2, 2]``.

    Computed on the fly in every forward (it is tiny), so the model holds no buffer that meta-device
    construction, ``to_empty`` or a pipeline split would have to recreate.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    positions = torch.arange(seq_len, device=device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)  # [seq, head_dim/2]
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[batch, seq, heads, head_dim]`` by ``table`` from :func:`rope_table` (in float32)."""
    pairs = x.float().unflatten(-1, (-1, 2))  # [b, s, heads, head_dim/2, 2]
    x0, x1 = pairs[..., 0], pairs[..., 1]
    cos = table[None, :, None, :, 0]
    sin = table[None, :, None, :, 1]
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


# --------------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------------


def build_norm(spec: ModelSpec) -> nn.Module:
    """LayerNorm (with a bias when the model has biases) or RMSNorm (Zhang & Sennrich 2019)."""
    if spec.norm == "layernorm":
        return nn.LayerNorm(spec.hidden, eps=spec.norm_eps, bias=spec.bias)
    return nn.RMSNorm(spec.hidden, eps=spec.norm_eps)


class Attention(nn.Module):
    """Multi-head (or grouped-query) causal self-attention with fused SDPA."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.head_dim = spec.head_dim
        qkv_bias = spec.bias or spec.qkv_bias
        self.wq = nn.Linear(spec.hidden, spec.heads * spec.head_dim, bias=qkv_bias)
        self.wk = nn.Linear(spec.hidden, spec.kv_dim, bias=qkv_bias)
        self.wv = nn.Linear(spec.hidden, spec.kv_dim, bias=qkv_bias)
        self.wo = nn.Linear(spec.heads * spec.head_dim, spec.hidden, bias=spec.bias)

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: the local count after tensor-parallel sharding of wq/wk/wv (heads/tp, kv_heads/tp).
        q = self.wq(x).view(batch, seq, -1, self.head_dim)
        k = self.wk(x).view(batch, seq, -1, self.head_dim)
        v = self.wv(x).view(batch, seq, -1, self.head_dim)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [b, heads, s, head_dim]
        # Grouped-query attention (Ainslie et al. 2023): query head i reads kv head i // (heads/kv_heads).
        # In bf16/fp16 SDPA's flash kernel does that itself (enable_gqa). In fp32 only the unfused math
        # kernel accepts unequal head counts (O(s^2) memory; pytorch/pytorch#139586), so the kv heads are
        # repeated first and the memory-efficient kernel stays eligible.
        repeats = q.shape[1] // k.shape[1]
        if repeats > 1 and q.dtype not in (torch.bfloat16, torch.float16):
            k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """GELU MLP (w2(gelu(w1 x)), GPT-2's tanh GELU) or SwiGLU (w2(silu(w1 x) * w3 x), Shazeer 2020)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.swiglu = spec.mlp == "swiglu"
        self.w1 = nn.Linear(spec.hidden, spec.ffn, bias=spec.bias)
        self.w2 = nn.Linear(spec.ffn, spec.hidden, bias=spec.bias)
        self.w3 = nn.Linear(spec.hidden, spec.ffn, bias=spec.bias) if self.swiglu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:  # SwiGLU
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class TransformerBlock(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then + feed_forward(norm(.))."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.attention_norm = build_norm(spec)
        self.attention = Attention(spec)
        self.ffn_norm = build_norm(spec)
        self.feed_forward = FeedForward(spec)

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None = None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The decoder-only language model of a :class:`ModelSpec`; any part may be None (a pipeline stage)."""

    #: Set by tensor parallelism with sequence parallelism on a stage without the embedding: the hidden
    #: states it receives are split along the sequence into this many shards (RoPE needs the full length).
    sequence_shards: int = 1

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(spec.padded_vocab, spec.hidden)
        self.pos_embeddings = nn.Embedding(spec.seq_len, spec.hidden) if spec.position == "learned" else None
        self.layers = nn.ModuleDict({str(i): TransformerBlock(spec) for i in range(spec.layers)})
        self.norm: nn.Module | None = build_norm(spec)
        self.output: nn.Linear | None = nn.Linear(spec.hidden, spec.padded_vocab, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding with the output projection when the spec ties them and both are here.

        ``nn.Module.to_empty`` (meta -> real device) creates a new tensor per module and so unties
        them; :meth:`to_empty` calls this again.
        """
        if self.spec.tie_embeddings and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def to_empty(self, *, device, recurse: bool = True):
        result = super().to_empty(device=device, recurse=recurse)
        self.tie_weights()
        return result

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids ``[batch, seq]`` -> logits ``[batch, seq, padded_vocab]``.

        On a pipeline stage without ``tok_embeddings`` the input is hidden states ``[batch, seq, hidden]``;
        without ``output`` the hidden states are returned.
        """
        # A later pipeline stage under sequence parallelism receives 1/sequence_shards of the sequence.
        seq = tokens.shape[1] * (self.sequence_shards if self.tok_embeddings is None else 1)
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        if self.pos_embeddings is not None:
            # positions [1, seq]: the sum keeps the sequence on dim 1, as sequence parallelism shards it.
            positions = torch.arange(seq, device=tokens.device).unsqueeze(0)
            h = h + self.pos_embeddings(positions)
        rope = None
        if self.spec.position == "rope":
            rope = rope_table(seq, self.spec.head_dim, self.spec.rope_theta, device=tokens.device)
        for layer in self.layers.values():
            h = layer(h, rope)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h


def build_model(spec: ModelSpec, *, device: torch.device | str | None = None) -> Transformer:
    """Construct the model on ``device`` (``"meta"`` allocates nothing); call :func:`init_weights` next."""
    with torch.device(device if device is not None else "cpu"):
        return Transformer(spec)


def loss_fn(
    logits: torch.Tensor, targets: torch.Tensor, vocab: int | None = None, backward: Backward = "in_forward"
) -> torch.Tensor:
    """Mean next-token cross-entropy over all tokens, in float32, chunked so that the float32 copies
    of the logits never exist whole; ``vocab`` leaves the padding columns out of the softmax;
    ``backward`` says whether each chunk's gradient is computed in the forward or recomputed
    (see :mod:`planc.runtime.loss`). With gradients, the model's logits are overwritten by their
    gradient (``overwrite_logits``): planc's steps hand the head's output straight to the loss and
    never read it again."""
    from planc.runtime.loss import chunked_cross_entropy

    return chunked_cross_entropy(logits, targets, vocab=vocab, backward=backward, overwrite_logits=True)


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once), by their full (global) shapes."""
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------------
# Layout-independent initialisation
# --------------------------------------------------------------------------------------------------


def canonical_name(fqn: str, spec: ModelSpec) -> str:
    """The parameter's name in the bare, full model: wrapper prefixes dropped; a tied output is the embedding."""
    fqn = ".".join(part for part in fqn.split(".") if part not in WRAPPER_SEGMENTS)
    if spec.tie_embeddings and fqn == "output.weight":
        return "tok_embeddings.weight"
    return fqn


def parameter_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed from (seed, name) -- a stable hash, unlike Python's salted ``hash``."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


#: Random initial values are drawn in tiles of this many rows x columns, each from its own generator
#: seeded by (seed, name, tile), so that a rank draws only the tiles its shard overlaps: drawing every
#: whole tensor on every rank took minutes at 70B (one CPU stream, 70 G draws per rank), repeated at
#: every restart. 64 rows keeps an FSDP shard at 512 ranks (16 rows of a 8192-row matrix) within one
#: tile band; 1024 columns is a row-parallel TP 8 shard of a 8192-wide matrix.
INIT_TILE = (64, 1024)


def full_init_value(name: str, shape: torch.Size, spec: ModelSpec, seed: int) -> torch.Tensor:
    """The full float32 CPU tensor that parameter ``name`` of shape ``shape`` starts from: the whole
    of :func:`init_value_slice`, which every layout's shards are pieces of."""
    return init_value_slice(name, shape, (0,) * len(shape), tuple(shape), spec, seed)


def init_value_slice(
    name: str,
    shape: torch.Size | tuple[int, ...],
    offset: tuple[int, ...],
    local_shape: tuple[int, ...],
    spec: ModelSpec,
    seed: int,
) -> torch.Tensor:
    """The float32 CPU block ``[offset, offset + local_shape)`` of parameter ``name``'s initial value
    (full shape ``shape``), drawn without drawing the rest.

    * biases: 0; normalisation weights: 1;
    * matrices and embeddings: normal(0, 0.02) (GPT-2, Radford et al. 2019);
    * the residual projections ``wo`` and ``w2``: normal(0, 0.02 / sqrt(2 * layers)) -- GPT-2's
      "scale the weights of residual layers at initialization by 1/sqrt(N) where N is the number of
      residual layers" (Radford et al. 2019, Sec. 2.3), two residual layers per block (as nanoGPT).

    The random values are drawn tile by tile (:data:`INIT_TILE`), so they depend on (seed, name,
    full shape) alone, never on which block is asked for.
    """
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return torch.zeros(local_shape)
    if "norm" in name.rsplit(".", 2)[-2]:  # attention_norm / ffn_norm / norm weights
        return torch.ones(local_shape)
    if len(shape) != 2:
        raise ValueError(f"init of {name!r}: random initial values are drawn for matrices; shape {tuple(shape)}")
    std = INIT_STD
    if name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
        std = INIT_STD / math.sqrt(2 * spec.layers)
    (row0, col0), (rows, cols) = offset, local_shape
    block = torch.empty(local_shape)
    tile_rows, tile_cols = INIT_TILE
    for tile_row in _tiles_over(row0, rows, tile_rows):
        for tile_col in _tiles_over(col0, cols, tile_cols):
            tile = _init_tile(name, shape, tile_row, tile_col, std, seed)
            # The tile's overlap with the block, in global coordinates, then in each's own.
            r_lo, r_hi = max(row0, tile_row * tile_rows), min(row0 + rows, (tile_row + 1) * tile_rows)
            c_lo, c_hi = max(col0, tile_col * tile_cols), min(col0 + cols, (tile_col + 1) * tile_cols)
            block[r_lo - row0 : r_hi - row0, c_lo - col0 : c_hi - col0] = tile[
                r_lo - tile_row * tile_rows : r_hi - tile_row * tile_rows,
                c_lo - tile_col * tile_cols : c_hi - tile_col * tile_cols,
            ]
    return block


def _tiles_over(start: int, length: int, size: int) -> range:
    """Indices of the tiles of ``size`` that ``[start, start + length)`` overlaps (none when empty)."""
    return range(start // size, -(-(start + length) // size)) if length else range(0)


def _init_tile(name: str, shape, tile_row: int, tile_col: int, std: float, seed: int) -> torch.Tensor:
    """Tile (``tile_row``, ``tile_col``) of a matrix's random initial value (edge tiles are cut to
    the matrix)."""
    tile_rows, tile_cols = INIT_TILE
    rows = min(tile_rows, shape[0] - tile_row * tile_rows)
    cols = min(tile_cols, shape[1] - tile_col * tile_cols)
    generator = torch.Generator(device="cpu").manual_seed(parameter_seed(seed, f"{name}[{tile_row},{tile_col}]"))
    return torch.empty(rows, cols).normal_(0.0, std, generator=generator)


def _local_block(param: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global offset, local shape) of this rank's piece of ``param``: the whole tensor unless it is a
    DTensor (TP/FSDP), whose piece DTensor's own sharding rules place (as DCP's checkpoints do)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(param, DTensor):
        return (0,) * param.dim(), tuple(param.shape)
    # DTensor computes the offsets with small index tensors and reads them back: real ones, also
    # under `planc verify --simulate`'s fake tensors, which hold no values to read.
    with unset_fake_temporarily():
        local_shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return tuple(offset), tuple(local_shape)


@torch.no_grad()
def init_weights(model: nn.Module, seed: int, spec: ModelSpec | None = None) -> None:
    """Initialise every parameter from (seed, its full-model name, its full shape) alone.

    So a pipeline stage, a tensor-parallel shard or an FSDP shard holds exactly the values that the
    same parameter has in the single-process model. Modules that are None are simply absent.
    """
    from torch._subclasses.fake_tensor import is_fake

    spec = spec if spec is not None else _find_spec(model)
    for fqn, param in model.named_parameters():
        if param.is_meta:
            raise ValueError(
                f"parameter {fqn!r} is on the meta device; call model.to_empty(device=...) before init_weights"
            )
        target = param.to_local() if hasattr(param, "to_local") else param
        name = canonical_name(fqn, spec)
        offset, local_shape = _local_block(param)
        if tuple(local_shape) != tuple(target.shape):
            raise ValueError(
                f"init of {fqn!r}: this rank's shard of the full tensor has shape {tuple(local_shape)} "
                f"but the parameter holds {tuple(target.shape)}"
            )
        if is_fake(target):  # `planc verify --simulate`: fake tensors hold no values to draw
            continue
        # Only this rank's block is drawn, on the CPU, and only it is copied to the device.
        local = init_value_slice(name, param.shape, offset, local_shape, spec, seed)
        target.copy_(local)
    # Buffers: the model has none that need values (RoPE is computed in forward).


def _find_spec(model: nn.Module) -> ModelSpec:
    """The spec of the (possibly wrapped) Transformer inside ``model``."""
    for module in model.modules():
        spec = getattr(module, "spec", None)
        if isinstance(spec, ModelSpec):
            return spec
    raise ValueError("init_weights needs the ModelSpec: pass spec=... (the model has no .spec attribute)")
