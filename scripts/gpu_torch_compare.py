#!/usr/bin/env python3
"""modar's CUDA backend side by side with PyTorch on the same GPU, same shapes.

`modar_cuda_peaks --side-by-side ours.tsv` times the cases (one row each:
kind, parameters, our median seconds, spread, the path that ran); this script
times the same shapes in PyTorch, bf16, with CUDA events (warm-up, median of
the repetitions, random data) and prints one table:

  gemm                 torch.matmul
  attention_fwd        F.scaled_dot_product_attention, causal, flash backend
  attention_fwd_bwd    the same, forward + torch.autograd.grad for q, k, v
                       (also the cuDNN backend where PyTorch has it)
  layer_dense_fwd_bwd  the dense layer written in PyTorch: pre-norm RMSNorm
                       (eps 1e-6), q / k / v / o projections (no bias), RoPE
                       (theta 1e4, half rotation), causal SDPA (flash), GELU
                       (tanh) MLP of width ff; forward + gradients of the
                       input and every weight, as modar's TransformerLayer
  layer_mod_fwd_bwd    the MoD routed layer: router logits x w_r, top-k per
                       sequence (k = round(capacity s), ascending positions),
                       the same block on the gathered tokens with RoPE at the
                       original positions, x[idx] += r[idx] * delta; as
                       modar's RoutedLayer (g(r) = r)

ratio = torch seconds / our seconds (above 1: ours is faster).

  python3 scripts/gpu_torch_compare.py --ours ours.tsv --out side_by_side.tsv
  python3 scripts/gpu_torch_compare.py --ours ours.tsv --dry-run   # no torch / GPU
"""
import argparse
import math
import sys


def parse_params(text):
    out = {}
    for item in text.split():
        key, _, value = item.partition("=")
        out[key] = float(value) if "." in value else int(value)
    return out


def read_cases(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        expected = ["kind", "params", "ours_median_s", "ours_spread", "ours_path"]
        if header != expected:
            raise ValueError(f"{path}: header {header}, expected {expected}")
        for number, line in enumerate(f, start=2):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 5:
                raise ValueError(f"{path}:{number}: {len(fields)} fields, expected 5")
            rows.append({"kind": fields[0], "params": fields[1], "p": parse_params(fields[1]),
                         "ours_s": float(fields[2]), "ours_spread": float(fields[3]),
                         "ours_path": fields[4]})
    return rows


def timer(torch, fn, warmup, reps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e-3)
    samples.sort()
    return samples[len(samples) // 2]


def make_torch_cases(torch):
    F = torch.nn.functional
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = "cuda"
    bf16 = torch.bfloat16

    def rand(*shape, scale=1.0):
        return ((torch.rand(*shape, device=dev, dtype=torch.float32) * 2 - 1) * scale).to(bf16)

    def sdpa(backend, q, k, v):  # q [b, s, h, d] -> SDPA's [b, h, s, d] views
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                enable_gqa=q.shape[2] != k.shape[2]).transpose(1, 2)

    def gemm(p, reps):
        a, b = rand(p["m"], p["k"]), rand(p["k"], p["n"])
        c = torch.empty(p["m"], p["n"], device=dev, dtype=bf16)
        return {"matmul": timer(torch, lambda: torch.matmul(a, b, out=c), 3, reps)}

    def attention(p, reps, backward):
        b, s, h, g, d = p["b"], p["s"], p["h"], p["g"], p["d"]
        q, k, v = rand(b, s, h, d), rand(b, s, g, d), rand(b, s, g, d)
        dout = rand(b, s, h, d)
        out = {}
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                              ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                if backward:
                    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))

                    def step():
                        o = sdpa(backend, qq, kk, vv)
                        torch.autograd.grad(o, (qq, kk, vv), dout)
                else:
                    def step():
                        with torch.no_grad():
                            sdpa(backend, q, k, v)
                out[name] = timer(torch, step, 2, reps)
            except Exception as error:  # noqa: BLE001 - a backend refusing the shape, an old API
                out[name] = None
                out[name + "_error"] = str(error).splitlines()[0][:120]
        return out

    def rope_tables(positions, d_head):
        half = d_head // 2
        inv = 10000.0 ** (-2.0 * torch.arange(half, device=dev, dtype=torch.float64) / d_head)
        angle = positions.to(torch.float64)[..., None] * inv
        return torch.cos(angle).float(), torch.sin(angle).float()

    def rope(x, cos, sin):  # x [b, s, h, d]; cos, sin [b, s, half]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        c, s_ = cos[:, :, None, :], sin[:, :, None, :]
        return torch.cat((x1 * c - x2 * s_, x2 * c + x1 * s_), dim=-1).to(x.dtype)

    def layer_weights(d, ff):
        std = 0.02
        w = {"n1": torch.ones(d, device=dev, dtype=bf16), "n2": torch.ones(d, device=dev, dtype=bf16)}
        for name, shape in (("q", (d, d)), ("k", (d, d)), ("v", (d, d)), ("o", (d, d)),
                            ("up", (d, ff)), ("down", (ff, d)), ("router", (d,))):
            w[name] = (torch.randn(*shape, device=dev) * std).to(bf16)
        return {k: t.requires_grad_(True) for k, t in w.items()}

    def block_delta(x, w, cos, sin, h):
        b, s, d = x.shape
        dh = d // h
        u = F.rms_norm(x, (d,), weight=w["n1"], eps=1e-6)
        q = rope((u @ w["q"]).view(b, s, h, dh), cos, sin)
        k = rope((u @ w["k"]).view(b, s, h, dh), cos, sin)
        v = (u @ w["v"]).view(b, s, h, dh)
        o = sdpa(SDPBackend.FLASH_ATTENTION, q, k, v).reshape(b, s, d)
        a = o @ w["o"]
        m = F.gelu(F.rms_norm(x + a, (d,), weight=w["n2"], eps=1e-6) @ w["up"],
                   approximate="tanh") @ w["down"]
        return a + m

    def layer(p, reps, routed):
        d, s, b, h, ff = p["d"], p["s"], p["b"], p["h"], p["ff"]
        w = layer_weights(d, ff)
        x0 = rand(b, s, d, scale=2.0)
        dy = rand(b, s, d)
        positions = torch.arange(s, device=dev)[None, :].expand(b, s)
        cos, sin = rope_tables(positions, d // h)
        k_routed = max(1, min(s, int(round(p.get("capacity", 1.0) * s))))
        params = list(w.values())

        def step():
            x = x0.clone().requires_grad_(True)
            if not routed:
                out = x + block_delta(x, w, cos, sin, h)
            else:
                r = x @ w["router"]                                     # [b, s]
                idx = torch.topk(r.detach().float(), k_routed, dim=1).indices.sort(dim=1).values
                xs = torch.gather(x, 1, idx[..., None].expand(b, k_routed, d))
                c, sn = cos.gather(1, idx[..., None].expand(b, k_routed, cos.shape[-1])), \
                    sin.gather(1, idx[..., None].expand(b, k_routed, sin.shape[-1]))
                delta = block_delta(xs, w, c, sn, h)
                gate = torch.gather(r, 1, idx)[..., None]
                out = x.scatter_add(1, idx[..., None].expand(b, k_routed, d), gate * delta)
            torch.autograd.grad(out, [x] + params, dy, allow_unused=True)

        return {"pytorch": timer(torch, step, 2, reps)}

    return {
        "gemm": lambda p, reps: gemm(p, reps),
        "attention_fwd": lambda p, reps: attention(p, reps, False),
        "attention_fwd_bwd": lambda p, reps: attention(p, reps, True),
        "layer_dense_fwd_bwd": lambda p, reps: layer(p, reps, False),
        "layer_mod_fwd_bwd": lambda p, reps: layer(p, reps, True),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ours", required=True, help="the TSV of modar_cuda_peaks --side-by-side")
    parser.add_argument("--out", help="write the joined table as TSV here")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--dry-run", action="store_true",
                        help="no PyTorch / GPU: parse the cases and print the table")
    args = parser.parse_args(argv)
    try:
        rows = read_cases(args.ours)
    except (OSError, ValueError) as error:
        print(f"gpu_torch_compare: {error}", file=sys.stderr)
        return 2
    torch_info = "dry run: PyTorch not timed"
    cases = {}
    if not args.dry_run:
        try:
            import torch
        except ImportError as error:
            print(f"gpu_torch_compare: PyTorch is not importable ({error})", file=sys.stderr)
            return 3
        if not torch.cuda.is_available():
            print("gpu_torch_compare: torch.cuda.is_available() is False", file=sys.stderr)
            return 3
        torch.manual_seed(0)
        torch_info = (f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
                      f"{torch.backends.cudnn.version()}, {torch.cuda.get_device_name(0)}")
        cases = make_torch_cases(torch)
    table = []
    for row in rows:
        result = {}
        if cases:
            reps = args.reps if row["kind"].startswith(("gemm", "attention")) else max(3, args.reps // 2)
            try:
                result = cases[row["kind"]](row["p"], reps)
            except KeyError:
                result = {"error": "unknown kind"}
            except Exception as error:  # noqa: BLE001 - report it in the table, go on
                result = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:100]}"}
        table.append((row, result))
    lines = [f"# {torch_info}", "# ratio = torch seconds / ours (above 1: ours faster); bf16"]
    header = f"{'kind':<20} {'params':<44} {'ours_ms':>9} {'path':<9} {'torch':<8} " \
             f"{'torch_ms':>9} {'ratio':>6}"
    lines.append(header)
    tsv = ["kind\tparams\tours_path\tours_s\ttorch_impl\ttorch_s\tratio"]
    for row, result in table:
        impls = [(k, v) for k, v in result.items() if not k.endswith("error") and k != "error"]
        if not impls:
            impls = [(result.get("error", "-") if result else "-", None)]
        for name, seconds in impls:
            ratio = seconds / row["ours_s"] if seconds else None
            lines.append(f"{row['kind']:<20} {row['params']:<44} {row['ours_s'] * 1e3:9.3f} "
                         f"{row['ours_path']:<9} {name[:8]:<8} "
                         f"{(seconds * 1e3 if seconds else float('nan')):9.3f} "
                         f"{(ratio if ratio else float('nan')):6.2f}")
            tsv.append(f"{row['kind']}\t{row['params']}\t{row['ours_path']}\t{row['ours_s']:.9g}\t"
                       f"{name}\t{seconds if seconds else ''}\t{ratio if ratio else ''}")
    # The MoD speed-up (dense / routed), ours and PyTorch's, same run.
    by_kind = {row["kind"]: (row, result) for row, result in table}
    if "layer_dense_fwd_bwd" in by_kind and "layer_mod_fwd_bwd" in by_kind:
        dense, mod = by_kind["layer_dense_fwd_bwd"], by_kind["layer_mod_fwd_bwd"]
        ours = dense[0]["ours_s"] / mod[0]["ours_s"]
        theirs = (dense[1].get("pytorch") or math.nan) / (mod[1].get("pytorch") or math.nan) \
            if dense[1] and mod[1] else math.nan
        lines.append(f"# MoD routed layer speed-up (dense / routed, fwd+bwd, capacity "
                     f"{mod[0]['p'].get('capacity')}): ours {ours:.2f}x, PyTorch {theirs:.2f}x")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("\n".join(tsv) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
