"""The op vocabulary of modar (include/modar/ops.hpp, profiles/README.md) written
with PyTorch kernels, for the PyTorch profile (`_torch_profile.py`).

Each (op kind, pass, dims) of the profiler's grid becomes a Bench: the tensors
of one copy (random values, never zeros; valid indices) and the call to time.
The calls are what a PyTorch training step runs for that op: torch.matmul,
scaled_dot_product_attention, rms_norm, index_select / index_add_ for the MoD
gather / scatter, the AttnRes / DAR depth read and coefficient head written
with torch ops, cross_entropy, AdamW, and grouped GEMMs (torch._grouped_mm
where the device has it, else one matmul per expert).  A backward pass is the
autograd backward of the op: the forward that builds its graph runs untimed
before each timed backward (`Bench.prepare`).

The dims mean what ops.hpp says; where the C++ profiler
(runtime/calibration/profiler_ops.cpp) picks a convention (the gather source
has 2 x rows rows, the embedding table 4096 rows, the expert with the most
rows, the permutation's slot map), the same one is used here, so both
profiles time the same work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

EMBEDDING_TABLE_ROWS = 4096
SINKHORN_ITERATIONS = 20  # include/modar/runtime/op_args.hpp
RMS_EPS = 1e-6

# DarVariant values carried in the dims (include/modar/config.hpp).
ATTNRES, DAR, SELFKV, FIXEDKV, CROSSV = 1, 2, 3, 4, 5


class Unsupported(Exception):
    """This shape cannot run here (recorded as skipped, like the C++ profiler)."""


@dataclass
class Bench:
    """One copy's tensors come from make(generator); run(ctx) is the timed
    call; for a backward pass prepare(ctx) builds the autograd graph untimed
    first and run(ctx, prepared) is the backward alone."""

    make: Callable[[torch.Generator], dict]
    run: Callable[..., Any]
    prepare: Callable[[dict], Any] | None = None
    bytes_per_copy: int = 0
    notes: list[str] = field(default_factory=list)


TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                "fp64": torch.float64}


class Tensors:
    """Allocates the random tensors of one bench copy on `device`."""

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device, self.dtype = device, dtype
        self.stats = torch.float32 if dtype != torch.float64 else torch.float64

    def uniform(self, g: torch.Generator, *shape: int, dtype: torch.dtype | None = None,
                grad: bool = False) -> torch.Tensor:
        t = torch.rand(*shape, generator=g, device=self.device, dtype=torch.float32)
        t = (t * 2.0 - 1.0).to(dtype or self.dtype)
        return t.requires_grad_(grad)

    def positive(self, g: torch.Generator, *shape: int, dtype: torch.dtype | None = None,
                 low: float = 0.5, width: float = 1.0, grad: bool = False) -> torch.Tensor:
        t = torch.rand(*shape, generator=g, device=self.device, dtype=torch.float32)
        t = (t * width + low).to(dtype or self.dtype)
        return t.requires_grad_(grad)

    def below(self, g: torch.Generator, limit: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, limit, shape, generator=g, device=self.device)

    def ascending_every_other(self, g: torch.Generator, rows: int) -> torch.Tensor:
        """rows ascending distinct indices into 2 x rows source rows."""
        pick = torch.randint(0, 2, (rows,), generator=g, device=self.device)
        return torch.arange(rows, device=self.device) * 2 + pick


def _element_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _nbytes(shapes: list[tuple[tuple[int, ...], torch.dtype]]) -> int:
    return sum(math.prod(shape) * _element_bytes(dtype) for shape, dtype in shapes)


def _backward(outputs: Callable[[dict], tuple], wrt: tuple[str, ...], grads: tuple[str, ...]):
    """(prepare, run) of an autograd backward: prepare runs the forward,
    run computes the gradients of `wrt` given the incoming gradients."""

    def prepare(ctx: dict):
        with torch.enable_grad():
            return outputs(ctx)

    def run(ctx: dict, prepared: tuple):
        return torch.autograd.grad(prepared, [ctx[name] for name in wrt],
                                   [ctx[name] for name in grads], allow_unused=True)

    return prepare, run


def _one_output_bench(make, forward, backward: bool, wrt: tuple[str, ...], grads: tuple[str, ...],
                      forward_bytes: int, backward_bytes: int) -> "Bench":
    """The bench of an op with one output: its forward, or (backward) the
    autograd backward of that output to `wrt`, given the gradients `grads`."""
    if not backward:
        return Bench(make, forward, bytes_per_copy=forward_bytes)
    prepare, run = _backward(lambda ctx: (forward(ctx),), wrt, grads)
    return Bench(make, run, prepare, bytes_per_copy=backward_bytes)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), weight, eps=RMS_EPS)
    y = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + RMS_EPS).to(x.dtype)
    return y * weight if weight is not None else y


def _key_stream(variant: int, j: int, n: int) -> int:
    if n <= 1:
        return 0
    if variant == DAR:
        return (j + 1) % n
    if variant == FIXEDKV:
        return 0
    return j


def _value_stream(variant: int, j: int, n: int) -> int:
    if n <= 1:
        return 0
    if variant == FIXEDKV:
        return 1
    if variant == CROSSV:
        return (j + 1) % n
    return j


def depth_read(bank_keys: torch.Tensor, key_rstd: torch.Tensor, bank_values: torch.Tensor,
               queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """AttnRes / DAR depth read over R sources (docs/dar_math.md section 5.1), in
    PyTorch: for every token t and query q, softmax over the sources r of
    q . (k_r[t] rstd_r[t]) (no 1/sqrt(d)), then the weighted sum of the values.
    bank_* [R, T, d], key_rstd [R, T], queries [Q, d] -> out [Q, T, d], lse [Q, T]."""
    keys = bank_keys * key_rstd.unsqueeze(-1).to(bank_keys.dtype)
    logits = torch.einsum("qd,rtd->qtr", queries.to(keys.dtype), keys).float()
    lse = torch.logsumexp(logits, dim=-1)
    weights = torch.exp(logits - lse.unsqueeze(-1)).to(bank_values.dtype)
    return torch.einsum("qtr,rtd->qtd", weights, bank_values), lse


def depth_merge(prefix_out: torch.Tensor, prefix_lse: torch.Tensor, partial_keys: torch.Tensor,
                partial_rstd: torch.Tensor, partial_values: torch.Tensor,
                query: torch.Tensor) -> torch.Tensor:
    """Phase 2: merge the prefix read with the block's partial sum (one more
    source): p = sigmoid(s_P - lse), h = o + p (P - o).  [T, d], [T], [d]."""
    keys = partial_keys * partial_rstd.unsqueeze(-1).to(partial_keys.dtype)
    score = (keys.float() @ query.float())
    p = torch.sigmoid(score - prefix_lse).unsqueeze(-1).to(prefix_out.dtype)
    return prefix_out + p * (partial_values - prefix_out)


def sinkhorn(logits: torch.Tensor, iterations: int = SINKHORN_ITERATIONS) -> torch.Tensor:
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iterations):
        m = m / m.sum(dim=-1, keepdim=True)
        m = m / m.sum(dim=-2, keepdim=True)
    return m


def dar_coefficients(retrieved: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                     scale: torch.Tensor, n: int, outputs: int):
    """The DAR coefficient head and the read mix (runtime/cpu/dar.cpp):
    z = RMSNorm([R_0..R_{n-1}]), c = scale_group (z W) + bias, alpha = sigmoid,
    beta = 2 sigmoid, M (n = 2: [[rho, 1-rho], [1-rho, rho]]; n > 2: Sinkhorn),
    h = sum_j alpha_j R_j.  retrieved [n, T, d]."""
    T, d = retrieved.shape[1], retrieved.shape[2]
    z = _rms_norm(retrieved.permute(1, 0, 2).reshape(T, n * d).float(), None)
    u = z @ weight
    groups = torch.cat([scale[0].expand(n), scale[1].expand(n),
                        scale[2].expand(outputs - 2 * n)])
    c = u * groups + bias
    alpha = torch.sigmoid(c[:, :n])
    beta = 2.0 * torch.sigmoid(c[:, n:2 * n])
    transport = None
    if outputs > 2 * n:
        if n == 2:
            rho = torch.sigmoid(c[:, 2 * n:2 * n + 1])
            transport = torch.stack([torch.cat([rho, 1 - rho], -1),
                                     torch.cat([1 - rho, rho], -1)], dim=-2)
        else:
            transport = sinkhorn(c[:, 2 * n:].reshape(T, n, n))
    mixed = torch.einsum("tj,jtd->td", alpha.to(retrieved.dtype), retrieved)
    return mixed, alpha, beta, transport


def dar_write(y: torch.Tensor, beta: torch.Tensor, transport: torch.Tensor | None,
              partial: torch.Tensor | None) -> torch.Tensor:
    """P_new[j] = sum_k M[j, k] P[k] + beta_j y (first branch: beta_j y).
    y [T, d], beta [T, n], transport [T, n, n], partial [n, T, d] -> [n, T, d]."""
    out = beta.t().unsqueeze(-1).to(y.dtype) * y.unsqueeze(0)
    if transport is not None and partial is not None:
        out = out + torch.einsum("tjk,ktd->jtd", transport.to(y.dtype), partial)
    return out


def expert_rows(groups: int, rows: int, imbalance_permille: int) -> list[int]:
    """Rows per expert: the busiest min(M, ceil(M / G x imbalance)), the rest
    spread evenly (profiler_ops.cpp expert_gemm_rows)."""
    imbalance = max(1.0, imbalance_permille / 1000.0)
    counts = [0] * groups
    busiest = min(rows, math.ceil(rows / groups * imbalance - 1e-9))
    counts[0] = busiest
    left = rows - busiest
    for g in range(1, groups):
        share = left // (groups - g)
        counts[g] = share
        left -= share
    counts[0] += left
    return counts


def grouped_mm_forms(device: torch.device, dtype: torch.dtype) -> set[int]:
    """The expert_gemm forms (ragged_inner 0: C = A B_g; 1: the weight
    gradient C_g = A_g^T B_g) that torch._grouped_mm (PyTorch's grouped GEMM:
    CUDA, 16-bit) runs here; the others run one matmul per expert."""
    if device.type != "cuda" or dtype != torch.bfloat16 or not hasattr(torch, "_grouped_mm"):
        return set()
    forms = set()
    a = torch.ones(32, 16, device=device, dtype=dtype)
    offsets = torch.tensor([16, 32], device=device, dtype=torch.int32)
    for form, call in ((0, lambda: torch._grouped_mm(a, torch.ones(2, 16, 16, device=device,
                                                                   dtype=dtype), offs=offsets)),
                       (1, lambda: torch._grouped_mm(a.t(), a, offs=offsets))):
        try:
            call()
            forms.add(form)
        except (RuntimeError, TypeError, ValueError):
            pass
    return forms


def make_bench(kind: str, pass_: str, dims: list[int], dtype_name: str,
               device: torch.device, options: dict | None = None) -> Bench:
    """The Bench of one grid point; raises Unsupported for shapes that cannot run."""
    options = options or {}
    dtype = TORCH_DTYPES[dtype_name]
    T = Tensors(device, dtype)
    st = T.stats
    backward = pass_ == "backward"
    if any(v < 0 for v in dims):
        raise Unsupported("negative dimension")
    maker = _MAKERS.get(kind)
    if maker is None:
        raise Unsupported(f"no PyTorch implementation of {kind}")
    return maker(dims, backward, T, dtype, st, options)


def _gemm(dims, backward, T, dtype, st, options):
    m, n, k, batch = dims[0], dims[1], dims[2], max(dims[3], 1)
    if min(m, n, k) < 1:
        raise Unsupported("m, n, k must be >= 1")
    lead = (batch,) if batch > 1 else ()

    def make(g):
        return {"a": T.uniform(g, *lead, m, k), "b": T.uniform(g, *lead, k, n),
                "c": torch.empty(*lead, m, n, device=T.device, dtype=dtype)}

    def run(ctx):
        torch.matmul(ctx["a"], ctx["b"], out=ctx["c"])

    return Bench(make, run, bytes_per_copy=_nbytes([(lead + (m, k), dtype), (lead + (k, n), dtype),
                                                    (lead + (m, n), dtype)]))


def _attention(dims, backward, T, dtype, st, options):
    b, H, G, s_q, s_k, dh, causal = dims
    if s_q != s_k:
        raise Unsupported("s_q != s_k (decode is not profiled)")
    if G < 1 or H % G != 0:
        raise Unsupported("H must be a multiple of G")
    gqa = G != H
    native_gqa = "enable_gqa" in getattr(F.scaled_dot_product_attention, "__doc__", "")

    def make(g):
        # [b, s, heads, d_h] as a model's projections produce them, viewed
        # [b, heads, s, d_h] for SDPA (the transpose nanoGPT / HF do).
        ctx = {"q": T.uniform(g, b, s_q, H, dh, grad=backward),
               "k": T.uniform(g, b, s_k, G, dh, grad=backward),
               "v": T.uniform(g, b, s_k, G, dh, grad=backward)}
        if backward:
            ctx["dout"] = T.uniform(g, b, H, s_q, dh)
        return ctx

    def forward(ctx):
        q, k, v = (ctx[name].transpose(1, 2) for name in ("q", "k", "v"))
        if gqa and native_gqa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), enable_gqa=True)
        if gqa:
            k = k.repeat_interleave(H // G, dim=1)
            v = v.repeat_interleave(H // G, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))

    shapes = [((b, s_q, H, dh), dtype), ((b, s_k, G, dh), dtype), ((b, s_k, G, dh), dtype),
              ((b, s_q, H, dh), dtype)]
    return _one_output_bench(make, forward, backward, ("q", "k", "v"), ("dout",),
                             _nbytes(shapes), _nbytes(shapes * 2))


def _rmsnorm(dims, backward, T, dtype, st, options):
    rows, d = dims

    def make(g):
        ctx = {"x": T.uniform(g, rows, d, grad=backward), "w": T.positive(g, d, grad=backward)}
        if backward:
            ctx["dout"] = T.uniform(g, rows, d)
        return ctx

    def forward(ctx):
        return _rms_norm(ctx["x"], ctx["w"])

    size = _nbytes([((rows, d), dtype)] * (4 if backward else 2))
    return _one_output_bench(make, forward, backward, ("x", "w"), ("dout",), size, size)


def _rope(dims, backward, T, dtype, st, options):
    rows, heads, dh = dims
    if dh % 2:
        raise Unsupported("d_h must be even")
    half = dh // 2

    def make(g):
        positions = torch.arange(rows, device=T.device) % 4096
        inv = 1.0 / (10000.0 ** (torch.arange(half, device=T.device, dtype=torch.float32) / half))
        angles = positions.float().unsqueeze(-1) * inv
        ctx = {"x": T.uniform(g, rows, heads, dh, grad=backward),
               "cos": torch.cos(angles).repeat(1, 2).unsqueeze(1).to(dtype),
               "sin": torch.sin(angles).repeat(1, 2).unsqueeze(1).to(dtype)}
        if backward:
            ctx["dout"] = T.uniform(g, rows, heads, dh)
        return ctx

    def forward(ctx):  # the rotate-half form of Llama / GPT-NeoX
        x = ctx["x"]
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * ctx["cos"] + rotated * ctx["sin"]

    size = _nbytes([((rows, heads, dh), dtype)] * (3 if backward else 2))
    return _one_output_bench(make, forward, backward, ("x",), ("dout",), size, size)


def _router(dims, backward, T, dtype, st, options):
    rows, d = dims

    def make(g):
        ctx = {"x": T.uniform(g, rows, d, grad=backward), "w": T.uniform(g, d, grad=backward)}
        if backward:
            ctx["dlogits"] = T.uniform(g, rows, dtype=st)
        return ctx

    def forward(ctx):  # MoD router logits r = x . w_r, kept in fp32
        return (ctx["x"] @ ctx["w"]).float()

    size = _nbytes([((rows, d), dtype)] * (2 if backward else 1))
    return _one_output_bench(make, forward, backward, ("x", "w"), ("dlogits",), size, size)


def _topk(dims, backward, T, dtype, st, options):
    b, s, k = dims
    if k < 1 or k > s:
        raise Unsupported("k must be in [1, s]")

    def make(g):
        return {"scores": T.uniform(g, b, s, dtype=st)}

    def run(ctx):  # the MoD top-k, kept in ascending position order
        return torch.topk(ctx["scores"], k, dim=-1, sorted=False).indices.sort(dim=-1).values

    return Bench(make, run, bytes_per_copy=_nbytes([((b, s), st)]))


def _gather_scatter(kind, dims, backward, T, dtype, st):
    rows, d = dims
    source = 2 * rows
    gather_rows = (kind == "gather") != backward

    def make(g):
        ctx = {"x": T.uniform(g, source, d, grad=backward and not gather_rows),
               "idx": T.ascending_every_other(g, rows)}
        if not gather_rows:  # the routed, scaled scatter-add: x[idx] += g(r) delta
            ctx["logits"] = T.uniform(g, source, dtype=st, grad=backward)
            ctx["delta"] = T.uniform(g, rows, d, grad=backward)
            if backward:
                ctx["dout"] = T.uniform(g, source, d)
        elif backward:  # the gradient of a gather: dx[idx] += dout
            ctx["x"].requires_grad_(True)
            ctx["dout"] = T.uniform(g, rows, d)
        return ctx

    def gather(ctx):
        return ctx["x"].index_select(0, ctx["idx"])

    def scatter(ctx, inplace: bool):
        scale = ctx["logits"].index_select(0, ctx["idx"]).unsqueeze(-1).to(dtype)
        if inplace:
            return ctx["x"].index_add_(0, ctx["idx"], ctx["delta"] * scale)
        return ctx["x"].index_add(0, ctx["idx"], ctx["delta"] * scale)

    size = _nbytes([((source, d), dtype), ((rows, d), dtype)])
    if kind == "gather" and not backward:
        return Bench(make, gather, bytes_per_copy=size)
    if kind == "scatter_add" and not backward:
        return Bench(make, lambda ctx: scatter(ctx, True), bytes_per_copy=size)
    if kind == "gather":  # backward of the routed scatter
        prepare, run = _backward(lambda ctx: (scatter(ctx, False),), ("delta", "logits"), ("dout",))
    else:  # backward of the gather
        prepare, run = _backward(lambda ctx: (gather(ctx),), ("x",), ("dout",))
    return Bench(make, run, prepare, bytes_per_copy=2 * size)


def _gather(dims, backward, T, dtype, st, options):
    return _gather_scatter("gather", dims, backward, T, dtype, st)


def _scatter_add(dims, backward, T, dtype, st, options):
    return _gather_scatter("scatter_add", dims, backward, T, dtype, st)


def _embedding(dims, backward, T, dtype, st, options):
    rows, d = dims

    def make(g):
        ctx = {"table": T.uniform(g, EMBEDDING_TABLE_ROWS, d, grad=backward),
               "tokens": T.below(g, EMBEDDING_TABLE_ROWS, rows)}
        if backward:
            ctx["dout"] = T.uniform(g, rows, d)
        return ctx

    def forward(ctx):
        return F.embedding(ctx["tokens"], ctx["table"])

    size = _nbytes([((EMBEDDING_TABLE_ROWS, d), dtype), ((rows, d), dtype)])
    return _one_output_bench(make, forward, backward, ("table",), ("dout",), size, 2 * size)


def _depth_read_prefix(dims, backward, T, dtype, st, options):
    tokens, sources, queries, d, n, variant = dims
    n = max(n, 1)
    if queries % n:
        raise Unsupported("queries must be a multiple of n")
    q = queries // n

    def make(g):
        ctx = {"bank": T.uniform(g, n, sources, tokens, d, grad=backward),
               "rstd": T.positive(g, n, sources, tokens, dtype=st),
               "queries": T.uniform(g, n, q, d, dtype=st, grad=backward)}
        if backward:
            ctx["dout"] = T.uniform(g, n, q, tokens, d)
        return ctx

    def forward(ctx):  # one read per output stream j
        outs = []
        for j in range(n):
            kj, vj = _key_stream(variant, j, n), _value_stream(variant, j, n)
            out, _ = depth_read(ctx["bank"][kj], ctx["rstd"][kj], ctx["bank"][vj],
                                ctx["queries"][j])
            outs.append(out)
        return torch.stack(outs)

    size = _nbytes([((n, sources, tokens, d), dtype), ((n, q, tokens, d), dtype)])
    return _one_output_bench(make, forward, backward, ("bank", "queries"), ("dout",), size, 2 * size)


def _depth_read_merge(dims, backward, T, dtype, st, options):
    tokens, n, d, variant = dims
    n = max(n, 1)

    def make(g):
        ctx = {"prefix_out": T.uniform(g, n, tokens, d, grad=backward),
               "prefix_lse": T.uniform(g, n, tokens, dtype=st, grad=backward),
               "partial": T.uniform(g, n, tokens, d, grad=backward),
               "partial_rstd": T.positive(g, n, tokens, dtype=st),
               "query": T.uniform(g, n, d, dtype=st, grad=backward)}
        if backward:
            ctx["dout"] = T.uniform(g, n, tokens, d)
        return ctx

    def forward(ctx):
        outs = []
        for j in range(n):
            kj, vj = _key_stream(variant, j, n), _value_stream(variant, j, n)
            outs.append(depth_merge(ctx["prefix_out"][j], ctx["prefix_lse"][j],
                                    ctx["partial"][kj], ctx["partial_rstd"][kj],
                                    ctx["partial"][vj], ctx["query"][j]))
        return torch.stack(outs)

    size = _nbytes([((n, tokens, d), dtype)] * 3)
    return _one_output_bench(make, forward, backward, ("prefix_out", "prefix_lse", "partial", "query"),
                             ("dout",), size, 2 * size)


def _dar_coefficients(dims, backward, T, dtype, st, options):
    tokens, n, d, outputs = dims
    if n < 2:
        raise Unsupported("dar_coefficients needs n >= 2 streams")

    def make(g):
        ctx = {"retrieved": T.uniform(g, n, tokens, d, grad=backward),
               "weight": T.positive(g, n * d, outputs, dtype=st, low=0.01, width=0.01,
                                    grad=backward),
               "bias": T.uniform(g, outputs, dtype=st, grad=backward),
               "scale": T.positive(g, 3, dtype=st, grad=backward)}
        if backward:
            ctx["dmixed"] = T.uniform(g, tokens, d)
        return ctx

    def forward(ctx):
        return dar_coefficients(ctx["retrieved"], ctx["weight"], ctx["bias"], ctx["scale"], n,
                                outputs)

    size = _nbytes([((n, tokens, d), dtype), ((n * d, outputs), st), ((tokens, d), dtype)])
    if not backward:
        return Bench(make, forward, bytes_per_copy=size)
    # The mix's output gradient flows back through alpha into the head.
    prepare, run = _backward(lambda ctx: (forward(ctx)[0],),
                             ("retrieved", "weight", "bias", "scale"), ("dmixed",))
    return Bench(make, run, prepare, bytes_per_copy=2 * size)


def _dar_write(dims, backward, T, dtype, st, options):
    tokens, n, d, mode, emit_rstd = dims
    n = max(n, 1)
    if mode not in (0, 1, 2):
        raise Unsupported("mode must be 0, 1 or 2")

    def make(g):
        ctx = {"y": T.uniform(g, tokens, d, grad=backward),
               "partial": T.uniform(g, n, tokens, d, grad=backward and mode == 1 and n > 1),
               "out": torch.empty(n, tokens, d, device=T.device, dtype=dtype),
               "beta": T.positive(g, tokens, n, dtype=st, grad=backward and n > 1 and mode != 2),
               "transport": T.positive(g, tokens, n, n, dtype=st,
                                       grad=backward and n > 1 and mode == 1)}
        if backward:
            ctx["dout"] = T.uniform(g, n, tokens, d)
        return ctx

    def forward(ctx):
        y = ctx["y"]
        if mode == 2:  # bank initialisation: every stream starts as the embedding
            out = y.unsqueeze(0).expand(n, tokens, d).clone()
        elif n == 1:
            out = (y if mode == 0 else ctx["partial"][0] + y).unsqueeze(0).clone()
        else:
            out = dar_write(y, ctx["beta"], ctx["transport"] if mode == 1 else None,
                            ctx["partial"] if mode == 1 else None)
        if emit_rstd:  # the entry's RMS statistics at a block end
            rstd = torch.rsqrt(out.detach().float().pow(2).mean(-1) + RMS_EPS)
            return out, rstd
        return (out,)

    size = _nbytes([((tokens, d), dtype), ((n, tokens, d), dtype), ((n, tokens, d), dtype)])
    if not backward:
        return Bench(make, forward, bytes_per_copy=size)
    wrt = ["y"]
    if n > 1 and mode != 2:
        wrt.append("beta")
        if mode == 1:
            wrt += ["transport", "partial"]
    prepare, run = _backward(lambda ctx: (forward(ctx)[0],), tuple(wrt), ("dout",))
    return Bench(make, run, prepare, bytes_per_copy=2 * size)


def _elementwise(dims, backward, T, dtype, st, options):
    elements, inputs, outputs = dims[0], max(dims[1], 1), dims[2]
    if not backward:
        def make(g):
            return {f"x{i}": T.uniform(g, elements) for i in range(inputs)}

        if inputs == 1:
            def run(ctx):
                return F.gelu(ctx["x0"], approximate="tanh")
        else:
            def run(ctx):  # residual adds
                out = ctx["x0"] + ctx["x1"]
                for i in range(2, inputs):
                    out.add_(ctx[f"x{i}"])
                return out
        return Bench(make, run, bytes_per_copy=_nbytes([((elements,), dtype)] * (inputs + 1)))
    if outputs >= 2:  # SwiGLU backward: d(silu(gate) up)
        def make(g):
            return {"gate": T.uniform(g, elements, grad=True), "up": T.uniform(g, elements, grad=True),
                    "dout": T.uniform(g, elements)}

        prepare, run = _backward(lambda ctx: (F.silu(ctx["gate"]) * ctx["up"],), ("gate", "up"),
                                 ("dout",))
        return Bench(make, run, prepare, bytes_per_copy=_nbytes([((elements,), dtype)] * 5))

    def make(g):
        return {"x": T.uniform(g, elements, grad=True), "dout": T.uniform(g, elements)}

    prepare, run = _backward(lambda ctx: (F.gelu(ctx["x"], approximate="tanh"),), ("x",), ("dout",))
    return Bench(make, run, prepare, bytes_per_copy=_nbytes([((elements,), dtype)] * 3))


def _cross_entropy(dims, backward, T, dtype, st, options):
    rows, vocab = dims

    def make(g):
        ctx = {"logits": T.uniform(g, rows, vocab, grad=backward),
               "targets": T.below(g, vocab, rows)}
        if backward:
            ctx["dloss"] = torch.ones((), device=T.device, dtype=torch.float32)
        return ctx

    def forward(ctx):
        return F.cross_entropy(ctx["logits"], ctx["targets"]).float()

    size = _nbytes([((rows, vocab), dtype)])
    return _one_output_bench(make, forward, backward, ("logits",), ("dloss",), size, 2 * size)


def _optimizer_update(dims, backward, T, dtype, st, options):
    params = dims[0]
    low_precision = dtype != torch.float32 and dtype != torch.float64
    master = torch.float64 if dtype == torch.float64 else torch.float32
    fused = options.get("adamw_fused")

    def make(g):
        p = T.uniform(g, params, dtype=master).requires_grad_(True)
        p.grad = T.uniform(g, params, dtype=master)
        kwargs = {"lr": 1e-6}
        if fused:
            kwargs["fused"] = True
        else:
            kwargs["foreach"] = True
        opt = torch.optim.AdamW([p], **kwargs)
        # First step (untimed): the moment buffers exist, as in training.
        opt.step()
        ctx = {"p": p, "opt": opt}
        if low_precision:
            ctx["lowp"] = torch.empty(params, device=T.device, dtype=dtype)
        return ctx

    def run(ctx):  # AdamW on the fp32 master weights, then their 16-bit copy
        ctx["opt"].step()
        if low_precision:
            ctx["lowp"].copy_(ctx["p"].detach())

    return Bench(make, run, bytes_per_copy=params * (16 + (_element_bytes(dtype) if low_precision
                                                            else 0)))


def _expert_gemm(dims, backward, T, dtype, st, options):
    groups, rows, n, k, imbalance, ragged = dims
    if min(groups, rows, n, k) < 1:
        raise Unsupported("G, M, n, k must be >= 1")
    counts = expert_rows(groups, rows, imbalance)
    grouped = ragged in options.get("grouped_mm_forms", ())

    def make(g):
        ctx = {"offsets": torch.tensor(list(_cumulative(counts)), device=T.device,
                                       dtype=torch.int32)}
        if ragged == 0:  # C[M, n] = A[M, k] B_g[k, n]
            ctx.update(a=T.uniform(g, rows, k), b=T.uniform(g, groups, k, n),
                       c=torch.empty(rows, n, device=T.device, dtype=dtype))
        else:  # weight gradient: C_g[n, k] = A_g^T B_g
            ctx.update(a=T.uniform(g, rows, n), b=T.uniform(g, rows, k),
                       c=torch.empty(groups, n, k, device=T.device, dtype=dtype))
        return ctx

    def run(ctx):
        if grouped and ragged == 0:
            return torch._grouped_mm(ctx["a"], ctx["b"], offs=ctx["offsets"])
        if grouped:
            return torch._grouped_mm(ctx["a"].t(), ctx["b"], offs=ctx["offsets"])
        start = 0
        for expert, count in enumerate(counts):  # one matmul per expert (HF MoE style)
            if count:
                if ragged == 0:
                    torch.matmul(ctx["a"][start:start + count], ctx["b"][expert],
                                 out=ctx["c"][start:start + count])
                else:
                    torch.matmul(ctx["a"][start:start + count].t(), ctx["b"][start:start + count],
                                 out=ctx["c"][expert])
            start += count

    if ragged == 0:
        size = _nbytes([((rows, k), dtype), ((groups, k, n), dtype), ((rows, n), dtype)])
    else:
        size = _nbytes([((rows, n), dtype), ((rows, k), dtype), ((groups, n, k), dtype)])
    return Bench(make, run, bytes_per_copy=size)


def _cumulative(counts: list[int]):
    total = 0
    for count in counts:
        total += count
        yield total


def _moe_topk(dims, backward, T, dtype, st, options):
    rows, choices, k = dims
    if rows < 1 or k < 1 or k > choices:
        raise Unsupported("needs rows >= 1 and k in [1, choices]")

    def make(g):
        ctx = {"logits": T.uniform(g, rows, choices, dtype=st, grad=backward)}
        if backward:
            ctx["dgates"] = T.uniform(g, rows, k, dtype=st)
            ctx["dloss"] = torch.ones((), device=T.device, dtype=st)
        return ctx

    def route(ctx):  # softmax router, top-k gates, load-balancing and z losses
        logits = ctx["logits"]
        probs = torch.softmax(logits, dim=-1)
        gates, chosen = torch.topk(probs, k, dim=-1)
        load = torch.zeros(choices, device=logits.device, dtype=probs.dtype).index_add_(
            0, chosen.flatten(), torch.ones_like(gates).flatten()) / (rows * k)
        balance = choices * (load * probs.mean(0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).mean()
        return gates, chosen, 0.01 * balance + 0.001 * z

    def forward(ctx):  # + the dispatch: tokens per expert and each one's slot
        gates, chosen, loss = route(ctx)
        flat = chosen.flatten()
        counts = torch.bincount(flat, minlength=choices)
        order = torch.argsort(flat, stable=True)
        return gates, loss, counts, order

    size = _nbytes([((rows, choices), st)] * 2)
    if not backward:
        return Bench(make, forward, bytes_per_copy=size)

    def outputs(ctx):
        gates, _, loss = route(ctx)
        return gates, loss

    prepare, run = _backward(outputs, ("logits",), ("dgates", "dloss"))
    return Bench(make, run, prepare, bytes_per_copy=2 * size)


def _permutation(kind, dims, backward, T, dtype, st):
    slots, d, rows = dims[0], dims[1], dims[2]
    k = dims[3] if kind == "unpermute" else -(-slots // max(rows, 1))
    if min(slots, rows, d, k) < 1:
        raise Unsupported("needs slots, d, rows, k >= 1")
    assignments = rows * k
    valid = min(slots, assignments)

    def make(g):
        # Assignment t k + j goes to expert row t k + j while that is < slots.
        token_of_slot = torch.arange(valid, device=T.device) // k
        ctx = {"token_of_slot": token_of_slot,
               "tokens": T.uniform(g, rows, d, grad=backward and kind == "permute"),
               "expert_rows": T.uniform(g, slots, d, grad=backward and kind == "unpermute"),
               "gates": T.positive(g, rows, k, dtype=st, grad=backward and kind == "unpermute")}
        if backward:
            ctx["dout"] = T.uniform(g, slots if kind == "permute" else rows, d)
        return ctx

    def permute(ctx):
        out = ctx["tokens"].index_select(0, ctx["token_of_slot"])
        if valid < slots:
            out = torch.cat([out, out.new_zeros(slots - valid, d)])
        return out

    def unpermute(ctx):  # out[t] = sum_j gate[t, j] expert_rows[slot(t, j)]
        weights = ctx["gates"].flatten()[:valid].to(dtype).unsqueeze(-1)
        contributions = ctx["expert_rows"][:valid] * weights
        return torch.zeros(rows, d, device=T.device, dtype=dtype).index_add(
            0, ctx["token_of_slot"], contributions)

    forward = permute if kind == "permute" else unpermute
    size = _nbytes([((rows, d), dtype), ((slots, d), dtype)])
    wrt = ("tokens",) if kind == "permute" else ("expert_rows", "gates")
    return _one_output_bench(make, forward, backward, wrt, ("dout",), size, 2 * size)


def _permute(dims, backward, T, dtype, st, options):
    return _permutation("permute", dims, backward, T, dtype, st)


def _unpermute(dims, backward, T, dtype, st, options):
    return _permutation("unpermute", dims, backward, T, dtype, st)


_MAKERS = {
    "gemm": _gemm, "attention": _attention, "rmsnorm": _rmsnorm, "rope": _rope,
    "router": _router, "topk": _topk, "gather": _gather, "scatter_add": _scatter_add,
    "embedding": _embedding, "depth_read_prefix": _depth_read_prefix,
    "depth_read_merge": _depth_read_merge, "dar_coefficients": _dar_coefficients,
    "dar_write": _dar_write, "elementwise": _elementwise, "cross_entropy": _cross_entropy,
    "optimizer_update": _optimizer_update, "expert_gemm": _expert_gemm, "moe_topk": _moe_topk,
    "permute": _permute, "unpermute": _unpermute,
}
