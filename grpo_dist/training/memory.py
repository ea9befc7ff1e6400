"""Memory-driven defaults: gradient checkpointing and the update's micro-batches chosen from an estimate.

``enable_gradient_checkpointing="auto"`` and an unset micro-batch size (``ppo_micro_batch_size_per_gpu``
null, ``use_dynamic_bsz`` off) are decided per rank when the model is built, from the model's config,
the longest sequence the run can produce, the compute dtype and the memory the rank may use.

The estimate
------------
For a decoder layer of a Llama/Qwen2-style model (hidden ``h``, ``a`` query heads and ``k`` KV heads
of size ``d``, MLP width ``i``), computing in a dtype of ``b`` bytes, autograd keeps per token::

    2 RMSNorms      2 (4 + b) h      the float32 normalised input and its cast back
    q/k/v input     b h              (one tensor shared by the three projections)
    attention       b (a + 2k) d     q, k, v after the rotary embedding
                    + 2 b a d + 4 a  the attention output, its o_proj input, the log-sum-exp
    MLP             b h + 4 b i      the MLP input, gate, up, act(gate), act(gate) * up

so ``L`` layers keep ``L x layer_bytes`` per token (``act_bytes_per_token``). Outside the layers: the
embedding output and the final norm, ``(4 + 2b) h``, and the output layer: the logits and their
gradient at every response position, ``2 b V`` per response token, unless the fused log-prob head runs
(then nothing of size ``V``). With gradient checkpointing (Hugging Face's, one checkpoint per layer)
autograd keeps only each layer's input, ``L b h`` per token, plus one layer's full set while that
layer is recomputed. tests/unit/test_memory_plan.py checks the estimate against the bytes autograd
really saves for a Qwen2 model (within 10 %).

The model's own state is ``16 P / W`` bytes (float32 master weights, gradients and AdamW's two
moments of ``P`` parameters sharded over ``W`` ranks; another optimizer, ``optim.optimizer``, is counted
the same: over for SGD's one momentum, under for one that keeps three or more states) plus the gathered compute-dtype copy of the
unsharded modules (``b P_root``: embeddings, output layer, final norm) and of two layers. Under LoRA
(``A`` adapter parameters on a frozen base) it is ``4 P / W + 16 A / W``: only the adapters have
gradients and AdamW state; the activations are counted as without LoRA (each adapted layer keeps its
input for the adapter's gradient).

The budget
----------
:func:`available_bytes`: on CUDA 85 % of the device memory free when the model is built; on the CPU
half of the node's available memory (``MemAvailable``) shared by the node's ranks (the rollout
engine, the reference model and the other roles live in the same memory). The update's budget is
that minus the model's state.

The choice (:func:`choose_update_plan`)
---------------------------------------
A micro-batch's tokens are bounded by rows x the longest sequence (``max_seq_len``) when cut by count,
and by the token budget with ``use_dynamic_bsz``. Gradient checkpointing costs a second forward per
layer (about a third more compute), so ``auto`` turns it on only when that bound does not fit without
it. An unset micro-batch size becomes the whole mini-batch when it fits, else micro-batches cut by
real tokens (the token budget that fits, as ``use_dynamic_bsz`` does) without checkpointing, which
keeps the update unchanged (micro-batches are a memory knob) and costs no recomputation; only when
not even one longest sequence fits is checkpointing turned on (``auto``). Explicit settings are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grpo_dist.training.settings import module_matches

if TYPE_CHECKING:
    import torch

__all__ = [
    "ModelShape",
    "act_bytes_per_token",
    "model_state_bytes",
    "lora_parameter_count",
    "available_bytes",
    "UpdatePlan",
    "choose_update_plan",
    "GIB",
]

GIB = 2**30
CPU_SHARE = 0.5
"""Share of the node's available memory the trainable roles of its ranks may plan with (CPU)."""
CUDA_SHARE = 0.85
"""Share of the device's free memory a rank may plan with (CUDA)."""


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only model's config that the estimate reads."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """From a Hugging Face config (``ValueError`` names a missing field)."""
        def need(*names: str) -> int:
            for n in names:
                v = getattr(config, n, None)
                if v is not None:
                    return int(v)
            raise ValueError(f"the model's config has none of {names}: cannot estimate its memory")

        hidden, heads = need("hidden_size"), need("num_attention_heads")
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        return cls(hidden=hidden, layers=need("num_hidden_layers"), heads=heads,
                   kv_heads=int(getattr(config, "num_key_value_heads", None) or heads), head_dim=int(head_dim),
                   intermediate=need("intermediate_size"), vocab=need("vocab_size"),
                   tied=bool(getattr(config, "tie_word_embeddings", False)))

    @property
    def layer_params(self) -> int:
        h, d = self.hidden, self.head_dim
        attn = h * (self.heads + 2 * self.kv_heads) * d + self.heads * d * h
        return attn + 3 * h * self.intermediate + 2 * h

    @property
    def root_params(self) -> int:
        """Embeddings, the output layer (unless tied) and the final norm."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params


_MEGATRON_ALL_LINEAR = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}
"""The current layout's default ``lora.target_modules`` (Megatron's names of every linear layer of the
blocks): all-linear here."""


def decoder_linears(shape: ModelShape) -> list[tuple[str, int, int]]:
    """Every linear layer of the Llama-style decoder ``shape`` describes, as ``(name, in, out)`` under
    transformers' module names: per layer ``i`` the attention's ``q_proj`` (h -> heads*d), ``k_proj`` and
    ``v_proj`` (h -> kv_heads*d), ``o_proj`` (heads*d -> h) and the MLP's ``gate_proj``, ``up_proj``
    (h -> intermediate) and ``down_proj`` (intermediate -> h); then ``lm_head`` (h -> vocab)."""
    h, q, kv, inter = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    per_layer = [("self_attn.q_proj", h, q), ("self_attn.k_proj", h, kv), ("self_attn.v_proj", h, kv),
                 ("self_attn.o_proj", q, h), ("mlp.gate_proj", h, inter), ("mlp.up_proj", h, inter),
                 ("mlp.down_proj", inter, h)]
    out = [(f"model.layers.{i}.{name}", a, b) for i in range(shape.layers) for name, a, b in per_layer]
    return out + [("lm_head", h, shape.vocab)]


def lora_parameter_count(shape: ModelShape, rank: int, target_modules: Any, exclude_modules: Any = None) -> int:
    """Parameters of rank-``rank`` LoRA adapters on the decoder ``shape`` describes: ``rank * (in + out)``
    (A: rank x in, B: out x rank) for each linear layer of :func:`decoder_linears` that ``target_modules``
    matches and ``exclude_modules`` does not. ``"all-linear"`` is every linear layer but ``lm_head`` (so
    is the current layout's default list of Megatron names); a name matching no layer adds nothing."""
    if rank <= 0:
        return 0
    targets = list(target_modules) if isinstance(target_modules, (list, tuple)) else target_modules
    all_linear = targets == "all-linear" or (isinstance(targets, list) and set(targets) == _MEGATRON_ALL_LINEAR)
    total = 0
    for name, a, b in decoder_linears(shape):
        if exclude_modules and module_matches(name, exclude_modules):
            continue
        if (name != "lm_head") if all_linear else module_matches(name, targets):
            total += rank * (a + b)
    return total


def layer_bytes_per_token(shape: ModelShape, b: int) -> float:
    """Bytes autograd keeps per token in one decoder layer (module docstring)."""
    h, a, k, d, i = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.intermediate
    return 2 * (4 + b) * h + b * h + b * (a + 2 * k) * d + 2 * b * a * d + 4 * a + b * h + 4 * b * i


def act_bytes_per_token(shape: ModelShape, b: int, *, checkpointing: bool, fused_head: bool = False,
                        response_fraction: float = 1.0, value_head: bool = False) -> float:
    """Activation bytes per token of a training forward (module docstring).

    ``response_fraction``: the share of a micro-batch's tokens whose output-layer result is needed
    (response tokens; the logits are formed only there). ``value_head``: a scalar head (the critic).
    """
    layer = layer_bytes_per_token(shape, b)
    body = shape.layers * b * shape.hidden if checkpointing else shape.layers * layer
    outside = (4 + 2 * b) * shape.hidden
    head = 0.0 if (fused_head or value_head) else 2.0 * b * shape.vocab * response_fraction
    return body + outside + head


def checkpointing_extra_bytes(shape: ModelShape, b: int, tokens: int) -> float:
    """The one layer's activations held while it is recomputed in the backward."""
    return tokens * layer_bytes_per_token(shape, b)


def model_state_bytes(shape: ModelShape, b: int, world_size: int, *, trainable: bool = True,
                      adapter_params: int = 0) -> float:
    """Sharded float32 weights (+ gradients and AdamW state when trainable) and the gathered copies.
    ``adapter_params > 0``: LoRA adapters on a frozen base, ``4 P / W + 16 A / W`` (only the adapters
    have gradients and AdamW state)."""
    if adapter_params > 0:
        sharded = 4 * shape.params + 16 * adapter_params
    else:
        sharded = (16 if trainable else 4) * shape.params
    return sharded / world_size + b * (shape.root_params + 2 * shape.layer_params)


def available_bytes(device: torch.device | str, ranks_on_node: int = 1) -> tuple[float, str]:
    """``(bytes, how)``: the memory one rank may plan with (module docstring), and where it came from."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return CUDA_SHARE * free, f"{CUDA_SHARE:.0%} of the GPU's {free / GIB:.1f} GiB free"
    import psutil

    avail = psutil.virtual_memory().available
    n = max(1, ranks_on_node)
    return CPU_SHARE * avail / n, f"{CPU_SHARE:.0%} of {avail / GIB:.1f} GiB available / {n} rank(s) on the node"


@dataclass(frozen=True)
class UpdatePlan:
    """What the update runs with: the resolved settings and one line saying why."""

    gradient_checkpointing: bool
    micro_batch_size: int | None
    """Rows per micro-batch (None: the whole mini-batch, or a token budget when ``use_dynamic_bsz``)."""
    use_dynamic_bsz: bool
    max_token_len: int
    reason: str


def choose_update_plan(
    shape: ModelShape,
    *,
    dtype_bytes: int,
    budget_bytes: float,
    mini_batch_rows: int | None,
    max_seq_len: int,
    response_fraction: float,
    gradient_checkpointing: bool | str,
    micro_batch_size: int | None | str,
    use_dynamic_bsz: bool,
    max_token_len: int,
    fused_head: bool = False,
    value_head: bool = False,
) -> UpdatePlan:
    """Resolve ``"auto"`` gradient checkpointing and an ``"auto"`` micro-batch size (module docstring).

    ``mini_batch_rows``: rows of one rank's mini-batch (None: unknown, the whole rank's share);
    ``max_seq_len``: prompt + response length bound; ``budget_bytes``: memory for activations.
    Explicit values come back unchanged.
    """
    b = dtype_bytes

    def per_token(ckpt: bool) -> float:
        return act_bytes_per_token(shape, b, checkpointing=ckpt, fused_head=fused_head,
                                   response_fraction=response_fraction, value_head=value_head)

    def fits(tokens: int, ckpt: bool) -> bool:
        extra = checkpointing_extra_bytes(shape, b, tokens) if ckpt else 0.0
        return tokens * per_token(ckpt) + extra <= budget_bytes

    def max_tokens(ckpt: bool) -> int:
        per = per_token(ckpt) + (layer_bytes_per_token(shape, b) if ckpt else 0.0)
        return int(budget_bytes // per) if budget_bytes > 0 else 0

    budget = f"{budget_bytes / GIB:.2f} GiB"
    auto_ckpt = gradient_checkpointing == "auto"
    auto_micro = micro_batch_size == "auto" and not use_dynamic_bsz
    if auto_micro:
        rows = mini_batch_rows
        whole = rows * max_seq_len if rows else None
        if whole is not None and fits(whole, False if auto_ckpt else bool(gradient_checkpointing)):
            ckpt = False if auto_ckpt else bool(gradient_checkpointing)
            return UpdatePlan(ckpt, None, False, max_token_len,
                              f"micro-batch auto: the whole mini-batch ({rows} x {max_seq_len} tokens at most) fits in "
                              f"{budget}; gradient checkpointing {'auto: off' if auto_ckpt else ('on' if ckpt else 'off')}")
        ckpt = False if auto_ckpt else bool(gradient_checkpointing)
        tokens = max_tokens(ckpt)
        if tokens < max_seq_len and auto_ckpt:
            ckpt, tokens = True, max_tokens(True)
        tokens = max(tokens, max_seq_len)
        return UpdatePlan(ckpt, None, True, tokens,
                          f"micro-batch auto: cut by a budget of {tokens} real tokens (what fits in {budget}); "
                          f"gradient checkpointing {'auto: ' if auto_ckpt else ''}{'on' if ckpt else 'off'}"
                          + (" (not even one longest sequence fits without it)" if ckpt and auto_ckpt else ""))
    micro = None if micro_batch_size == "auto" else micro_batch_size
    if use_dynamic_bsz:
        bound, what = max(max_token_len, max_seq_len), f"token budget {max_token_len}"
    else:
        rows = micro or mini_batch_rows
        bound = rows * max_seq_len if rows else None
        what = f"{rows} rows x {max_seq_len} tokens" if rows else "unknown rows"
    if not auto_ckpt:
        return UpdatePlan(bool(gradient_checkpointing), micro, use_dynamic_bsz, max_token_len,
                          f"gradient checkpointing {'on' if gradient_checkpointing else 'off'} (set)")
    ckpt = bound is not None and not fits(bound, False)
    need = f"{bound * per_token(False) / GIB:.2f} GiB" if bound is not None else "?"
    return UpdatePlan(ckpt, micro, use_dynamic_bsz, max_token_len,
                      f"gradient checkpointing auto: {'on' if ckpt else 'off'} (a micro-batch of {what} needs about "
                      f"{need} of activations; {budget} available)")


def ranks_on_this_node() -> int:
    """How many ranks of the default process group share this machine (1 without a group)."""
    import socket

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return 1
    names: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(names, socket.gethostname())
    return max(1, names.count(socket.gethostname()))


def _min_over_ranks(value: float, device: torch.device) -> float:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    comm = device if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([value], dtype=torch.float64, device=comm)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return float(t.item())


def resolve_auto_settings(settings: Any, config: Any, *, device: torch.device, world_size: int,
                          compute_dtype: torch.dtype, value_head: bool = False) -> tuple[Any, str | None]:
    """``(settings, note)``: ``settings`` (an ``ActorSettings`` or ``CriticSettings``) with ``"auto"``
    gradient checkpointing and micro-batch size resolved by :func:`choose_update_plan`, and the line that
    says what was chosen and why (None when nothing was auto). Collective under a process group (every
    rank plans with the smallest budget, so all ranks choose the same)."""
    import torch

    from dataclasses import replace

    s = settings
    if s.enable_gradient_checkpointing != "auto" and s.ppo_micro_batch_size_per_gpu != "auto":
        return s, None
    shape = ModelShape.from_config(config)
    b = torch.empty((), dtype=compute_dtype).element_size()
    avail, how = available_bytes(device, ranks_on_this_node())
    avail = _min_over_ranks(avail, device)
    lora = getattr(s, "lora", None)
    adapters = (lora_parameter_count(shape, lora.rank, lora.target_modules, lora.exclude_modules)
                if lora is not None and lora.enabled else 0)
    state = model_state_bytes(shape, b, world_size, adapter_params=adapters)
    fused = bool(getattr(s, "use_fused_kernels", False))
    plan = choose_update_plan(
        shape, dtype_bytes=b, budget_bytes=avail - state, mini_batch_rows=s.ppo_mini_batch_size_per_gpu,
        max_seq_len=s.max_seq_len, response_fraction=(s.max_response_len or s.max_seq_len) / s.max_seq_len,
        gradient_checkpointing=s.enable_gradient_checkpointing, micro_batch_size=s.ppo_micro_batch_size_per_gpu,
        use_dynamic_bsz=s.use_dynamic_bsz, max_token_len=s.ppo_max_token_len_per_gpu, fused_head=fused,
        value_head=value_head,
    )
    resolved = replace(s, enable_gradient_checkpointing=plan.gradient_checkpointing,
                       ppo_micro_batch_size_per_gpu=plan.micro_batch_size, use_dynamic_bsz=plan.use_dynamic_bsz,
                       ppo_max_token_len_per_gpu=plan.max_token_len)
    what = "model state" if not adapters else f"model state: frozen base, {adapters:,} adapter parameters trained"
    return resolved, f"{plan.reason} [{how}, less {state / GIB:.2f} GiB of {what}]"


# ---- the rollout engine's KV cache on the CPU -----------------------------------------------------
KV_CPU_SHARE = 0.25
"""Most of the node's available memory the CPU KV caches of its engines may take together."""
KV_CAP_GIB = 8.0
"""Largest automatic CPU KV cache of one engine."""
KV_MIN_GIB = 0.25
KV_MARGIN = 1.25


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int) -> int:
    """Keys and values of one token in every layer: ``2 L k d b``."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_bytes


def auto_kv_cache_gib(shape: ModelShape, dtype_bytes: int, *, sequences: int, seq_len: int,
                      available: float, engines_on_node: int) -> tuple[float, str]:
    """``(GiB, why)``: a CPU KV cache that holds ``sequences`` sequences of ``seq_len`` tokens at once
    (x 1.25), within ``KV_CPU_SHARE`` of the node's ``available`` bytes shared by its engines and at
    most ``KV_CAP_GIB``; at least ``KV_MIN_GIB``; rounded up to 1/8 GiB. A smaller cache than the step
    needs only makes the engine run fewer sequences at a time."""
    need = sequences * seq_len * kv_bytes_per_token(shape, dtype_bytes) * KV_MARGIN
    limit = min(KV_CAP_GIB * GIB, KV_CPU_SHARE * available / max(1, engines_on_node))
    size = max(KV_MIN_GIB * GIB, min(need, limit))
    gib = -(-size // (GIB / 8)) / 8
    why = (f"{sequences} sequences x {seq_len} tokens need {need / GIB:.2f} GiB (x{KV_MARGIN}); limit "
           f"{limit / GIB:.2f} GiB ({KV_CPU_SHARE:.0%} of {available / GIB:.1f} GiB available / {max(1, engines_on_node)} "
           f"engine(s), at most {KV_CAP_GIB:g} GiB)")
    return float(gib), why


def forward_token_budget(config: Any, *, device: torch.device, world_size: int, compute_dtype: torch.dtype,
                         max_seq_len: int | None, response_fraction: float = 1.0, fused_head: bool = False,
                         trainable: bool = True) -> tuple[int, str]:
    """``(tokens, why)``: how many real tokens one no-grad forward (log-probs, values) may take at once.

    A no-grad forward keeps no activations; at any moment it holds the hidden states (in and out of a
    layer, ``2 b h`` per token), one layer's temporaries (at most what a training forward keeps per
    layer) and, on the logits path, the response positions' logits (``b V`` each). The budget is the
    rank's memory (:func:`available_bytes`) less the model's state; at least one longest sequence.
    Collective under a process group (the smallest budget over the ranks is used)."""
    import torch

    shape = ModelShape.from_config(config)
    b = torch.empty((), dtype=compute_dtype).element_size()
    avail, how = available_bytes(device, ranks_on_this_node())
    avail = _min_over_ranks(avail, device)
    state = model_state_bytes(shape, b, world_size, trainable=trainable)
    per = 2 * b * shape.hidden + layer_bytes_per_token(shape, b) + (0.0 if fused_head else b * shape.vocab * response_fraction)
    tokens = int(max(0.0, avail - state) // per)
    tokens = max(tokens, max_seq_len or 1)
    return tokens, f"no-grad forwards of up to {tokens} real tokens [{how}, less {state / GIB:.2f} GiB of model state]"
