"""The PyTorch profile: `python -m modar profile --backend torch --out P.toml`
and modar.profile(out, backend="torch").

Times modar's op vocabulary with the PyTorch kernels a user trains with
(`_torch_ops.py`) on the current device (CUDA when PyTorch sees a GPU, else
the CPU) over the profiler's grid, and writes a modar device profile that
`modar estimate --profile P.toml` (and optimal, sweep, calibrate, Python)
reads.  PyTorch is the user's: it is imported only here, never a dependency
of the package.  docs/profiler.md "The PyTorch profile".

The grid, its defaults (threads, clock, budget, dtype) and their checks are
the C++ profiler's (runtime::resolve_profile_options through
_core.profile_plan), and so are the timing rules (docs/profiler.md "Timing
rules"): random inputs, never zeros; untimed warm-up; CUDA events on a GPU
(the process CPU time or the wall clock on the CPU); enough back-to-back calls
per sample that a sample lasts 0.2 ms; inputs rotated over copies that
together exceed twice the last-level cache / L2; the median of at least 5
samples within a time budget per shape, the (p90 - p10) / median spread and
the sample count recorded.  A backward is timed alone: the forward that
builds its autograd graph runs untimed before it.

Under torchrun (WORLD_SIZE > 1) rank 0 times the op grid, then every rank
times the collectives (all-reduce, reduce-scatter, all-gather, all-to-all,
send/recv) with torch.distributed over message and group sizes, with
nccl-tests' definitions, into the profile's [network] tables, as
`modar profile --comm` does for modar's own communicator.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys
import time
from typing import Any, Callable, Sequence

from . import _core

PROG = "modar profile"
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv")


class UsageError(ValueError):
    """Bad input: one line naming the field, the value and what is allowed."""


# ---- the machine -------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _cpu_cache_bytes() -> tuple[int, str]:
    """The last-level cache of cpu0 (sysfs), or 32 MiB when it says nothing."""
    best, level = 0, 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    for index in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        text = _read(f"{base}/{index}/size")
        lvl = _read(f"{base}/{index}/level")
        if not text or not lvl.isdigit():
            continue
        factor = {"K": 1024, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
        size = int(text.rstrip("KMG")) * factor if text.rstrip("KMG").isdigit() else 0
        if int(lvl) > level or (int(lvl) == level and size > best):
            best, level = size, int(lvl)
    if best <= 0:
        return 32 << 20, "assumed 32 MiB (sysfs has no cache sizes)"
    return best, f"L{level} {best >> 20} MiB from sysfs"


def _mem_available_bytes() -> int:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 8 << 30


def _mem_total_bytes() -> int:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 16 << 30


def _cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


# ---- timing --------------------------------------------------------------------------


class Clock:
    """Segments of work timed on the device: CUDA events on a GPU, the
    process CPU time (clock "cpu") or the wall clock on the CPU."""

    def __init__(self, torch, device, kind: str) -> None:
        self.torch, self.device, self.kind = torch, device, kind
        self.cuda = device.type == "cuda"
        self._pairs: list = []
        self._total = 0.0

    def start(self):
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.process_time() if self.kind == "cpu" else time.perf_counter()

    def stop(self, started) -> None:
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self._pairs.append((started, event))
        else:
            now = time.process_time() if self.kind == "cpu" else time.perf_counter()
            self._total += now - started

    def collect(self) -> float:
        """Seconds of the segments since the last collect."""
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            total = sum(a.elapsed_time(b) for a, b in self._pairs) / 1e3
            self._pairs = []
            return total
        total, self._total = self._total, 0.0
        return total

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)


def summarize(samples: Sequence[float]) -> tuple[float, float, float]:
    """Median, p10, p90 by linear interpolation between order statistics
    (numpy's default, as runtime::summarize_samples)."""
    ordered = sorted(samples)

    def quantile(q: float) -> float:
        position = q * (len(ordered) - 1)
        low = math.floor(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    return quantile(0.5), quantile(0.1), quantile(0.9)


def _call(bench, ctx, clock: Clock) -> None:
    """One timed call: a backward's forward (prepare) runs before the timer."""
    if bench.prepare is None:
        started = clock.start()
        bench.run(ctx)
        clock.stop(started)
    else:
        prepared = bench.prepare(ctx)
        started = clock.start()
        bench.run(ctx, prepared)
        clock.stop(started)


def measure(bench, copies: list[dict], clock: Clock, plan: dict,
            should_stop: Callable[[], bool]) -> dict:
    """The timing rules on one bench: warm-up, calls per sample, samples
    within the budget, median and spread."""
    budget = plan["budget_s"]
    began = time.perf_counter()
    # Warm-up: at least two calls, until every copy was touched or a fifth
    # of the budget is spent.
    calls = 0
    while calls < 2 or (calls < len(copies) and time.perf_counter() - began < budget / 5):
        _call(bench, copies[calls % len(copies)], clock)
        calls += 1
    clock.collect()
    # Calls per sample: a sample lasts at least min_sample_s.
    _call(bench, copies[calls % len(copies)], clock)
    calls += 1
    one = max(clock.collect(), 1e-9)
    inner = max(1, min(1 << 20, math.ceil(plan["min_sample_s"] / one)))
    samples: list[float] = []
    while len(samples) < plan["min_repeats"] or (
            time.perf_counter() - began < budget and len(samples) < plan["max_repeats"]):
        if should_stop():
            raise KeyboardInterrupt
        for _ in range(inner):
            _call(bench, copies[calls % len(copies)], clock)
            calls += 1
        samples.append(clock.collect() / inner)
    median, p10, p90 = summarize(samples)
    return {"median_s": median, "spread": (p90 - p10) / median if median > 0 else 0.0,
            "repeats": len(samples), "inner": inner}


def _time_simple(run: Callable[[], Any], clock: Clock, seconds: float) -> float:
    """Median seconds of one call of `run` (warm-up 2 calls, >= 5 samples)."""
    for _ in range(2):
        started = clock.start()
        run()
        clock.stop(started)
    clock.collect()
    samples: list[float] = []
    began = time.perf_counter()
    while len(samples) < 5 or (time.perf_counter() - began < seconds and len(samples) < 101):
        started = clock.start()
        run()
        clock.stop(started)
        samples.append(clock.collect())
    return summarize(samples)[0]


# ---- the profile -----------------------------------------------------------------------


def _describe(kind: str, pass_: str, dtype: str, dims: Sequence[int]) -> str:
    return f"{kind} {pass_} {dtype} [{', '.join(str(d) for d in dims)}]"


def _format_time(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def measure_ceilings(torch, device, clock: Clock, dtype_name: str, plan: dict,
                     cache_bytes: int, memory_limit: int, max_dim: int) -> tuple[dict, str]:
    """GEMM rate per dtype (a square GEMM: 2048^3 on the CPU, 16384^3 on a
    GPU, no larger than max_dim when the grid is reduced), device copy
    bandwidth (bytes read + written, max(8 x cache, 256 MiB), 2 GiB on a GPU,
    within the memory limit), dispatch overhead (a 16-element add timed 1000
    calls at a time)."""
    cuda = device.type == "cuda"
    n = 16384 if cuda else 2048
    if max_dim > 0:
        n = min(n, max(16, max_dim))
    seconds = min(1.0, max(plan["budget_s"], 0.05))
    ceilings: dict[str, float] = {}
    how: list[str] = []
    generator = torch.Generator(device=device).manual_seed(11)
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a = (torch.rand(n, n, generator=generator, device=device) * 2 - 1).to(dtype)
        b = (torch.rand(n, n, generator=generator, device=device) * 2 - 1).to(dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        rate = 2.0 * n ** 3 / _time_simple(lambda: torch.matmul(a, b, out=out), clock, seconds)
        ceilings[f"peak_flops_{name}"] = ceilings[f"achievable_flops_{name}"] = rate
        how.append(f"GEMM {n}^3 {name}: {rate / 1e9:.4g} GFLOP/s")
        del a, b, out
    copy_bytes = max(8 * cache_bytes, 256 << 20, (2 << 30) if cuda else 0)
    copy_bytes = min(copy_bytes, max(memory_limit // 4, 1 << 20))
    elements = copy_bytes // 4
    source = torch.rand(elements, generator=generator, device=device) + 0.5
    target = torch.empty_like(source)
    copy_s = _time_simple(lambda: target.copy_(source), clock, seconds)
    bandwidth = 2.0 * elements * 4 / copy_s
    ceilings["memory_bandwidth"] = ceilings["achievable_bandwidth"] = bandwidth
    how.append(f"copy of {elements * 4 >> 20} MiB: {bandwidth / 1e9:.4g} GB/s (read + write)")
    del source, target
    x = torch.rand(16, generator=generator, device=device) + 0.5
    y = torch.rand(16, generator=generator, device=device) + 0.5
    z = torch.empty(16, device=device)

    def thousand_adds():
        for _ in range(1000):
            torch.add(x, y, out=z)

    overhead = _time_simple(thousand_adds, clock, seconds) / 1000
    ceilings["launch_overhead_s"] = overhead
    how.append(f"dispatch: 16-element add {overhead * 1e6:.3g} us per call")
    return ceilings, "; ".join(how)


def _torch_provenance(torch, device, threads: int) -> dict[str, str]:
    p = {"torch": torch.__version__, "python": platform.python_version(),
         "host_cpu": _cpu_model(), "logical_cpus": str(os.cpu_count() or 0)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        p.update(device=props.name, compute_capability=f"{props.major}.{props.minor}",
                 sm_count=str(props.multi_processor_count),
                 memory_bytes_device=str(props.total_memory),
                 cuda_runtime=str(torch.version.cuda), cudnn=str(torch.backends.cudnn.version()))
        p["threads"] = "0"
    else:
        p.update(device=f"cpu: {_cpu_model()}", threads=str(threads))
        p["torch_parallel_info"] = " ".join(torch.__config__.parallel_info().split())[:400]
    return p


def _measurement_toml(kind: str, pass_: str, dtype: str, dims: Sequence[int], m: dict) -> str:
    return (f"[[measurements]]\nkind = \"{kind}\"\npass = \"{pass_}\"\ndtype = \"{dtype}\"\n"
            f"dims = [{', '.join(str(d) for d in dims)}]\nmedian_s = {m['median_s']!r}\n"
            f"spread = {m['spread']!r}\nrepeats = {m['repeats']}\n")


def _toml_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(c if c >= " " else f"\\u{ord(c):04x}" for c in escaped)
    return f'"{escaped}"'


def _profile_text(name: str, provenance: dict, ceilings: dict, measurements: list[str],
                  network: str) -> str:
    lines = [f"# modar device profile measured with PyTorch kernels ({PROG} --backend torch)",
             f"name = {_toml_string(name)}", 'backend = "torch"', "measured = true", "",
             "[provenance]"]
    lines += [f"{key} = {_toml_string(str(value))}" for key, value in sorted(provenance.items())]
    lines += ["", "[ceilings]"]
    lines += [f"{key} = {value!r}" for key, value in ceilings.items()]
    return "\n".join(lines) + "\n\n" + "\n".join(measurements) + network


def _write_atomically(text: str, out: str) -> Any:
    """Parse the text with the core's strict reader, then write it with the
    core's atomic writer: nothing half-written, nothing unreadable."""
    parsed = _core.parse_profile_toml(text, out)
    _core.save_profile(parsed, out)
    return parsed


# ---- collectives (torchrun) -------------------------------------------------------------


def _bus_factor(kind: str, p: int) -> float:
    if kind == "all_reduce":
        return 2.0 * (p - 1) / p
    if kind == "send_recv":
        return 1.0
    return (p - 1) / p


def measure_collectives(torch, dist, device, plan: dict, max_bytes: int | None,
                        log: Callable[[str], None]) -> tuple[str, dict]:
    """Every rank: collectives over group sizes 2, 4, ... and message sizes,
    nccl-tests definitions, the max over the group's ranks of the median time.
    Returns the [network] TOML (rank 0) and provenance keys."""
    world, rank = dist.get_world_size(), dist.get_rank()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = max(1, world // max(local, 1))
    cuda = device.type == "cuda"
    sizes = []
    size, top = 1024, max_bytes or ((1 << 30) if cuda else (16 << 20))
    while size <= top:
        sizes.append(size)
        size *= 2 if cuda else 4
    levels = {"intra_node": [g for g in _powers_of_two(local) if g >= 2]}
    if nodes >= 2:
        levels["inter_node"] = [g for g in _powers_of_two(nodes) if g >= 2]
    clock = Clock(torch, device, "wall")
    tables: dict[str, list[tuple[str, int, list[int], list[float]]]] = {}
    skipped: list[str] = []
    for level, group_sizes in levels.items():
        for g in group_sizes:
            members = list(range(g)) if level == "intra_node" else [i * local for i in range(g)]
            group = dist.new_group(members)
            inside = rank in members
            for kind in COLLECTIVES:
                times: list[float] = []
                ok = True
                for nbytes in sizes:
                    seconds = _time_collective(torch, dist, device, clock, kind, nbytes, members,
                                               group, inside, plan) if ok else None
                    if seconds is None:
                        ok = False
                        continue
                    times.append(seconds)
                if ok and inside and rank == 0:
                    tables.setdefault(level, []).append((kind, g, sizes, times))
                    log(f"{PROG}: {level} {kind} on {g} ranks: {len(sizes)} sizes, "
                        f"{_format_time(times[0])} .. {_format_time(times[-1])}")
                elif not ok and rank == 0:
                    skipped.append(f"{kind} ({dist.get_backend()})")
            dist.barrier()
    if rank != 0:
        return "", {}
    text = [f"\n[network]\ngpus_per_node = {local}\n"]
    for level in levels:
        rows = tables.get(level, [])
        reduces = [r for r in rows if r[0] == "all_reduce"]
        if not reduces:
            continue
        _, g, s, t = max(reduces, key=lambda r: r[1])
        busbw = _bus_factor("all_reduce", g) * s[-1] / t[-1]
        latency = min(t) / (2 * math.ceil(math.log2(g)))
        name = f"torch.distributed {dist.get_backend()}, {level.replace('_', '-')}"
        text.append(_level_toml(level, name, busbw, latency, rows))
        if level == "intra_node" and "inter_node" not in levels:
            # One node: the inter-node level is not measured; the planner
            # needs one, so it gets the intra-node figures, named so.
            text.append(_level_toml("inter_node", name + " (copied: one node measured)", busbw,
                                    latency, []))
    version = ".".join(str(v) for v in torch.cuda.nccl.version()) if cuda else ""
    provenance = {
        "network_engine": f"torch.distributed {dist.get_backend()}" + (f" {version}" if version
                                                                        else ""),
        "network_ranks": str(world), "network_ranks_per_node": str(local),
        "network_nodes": str(nodes), "network_arrival": "hot",
        "network_how": "torch.distributed collectives, nccl-tests definitions (size = the full "
                       "vector; busbw = algbw x 2(p-1)/p, (p-1)/p or 1), 5 warm-up calls, "
                       "samples of back-to-back calls, median, max over the group's ranks",
        "network_date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "network_load_average": _read("/proc/loadavg"),
    }
    if skipped:
        provenance["network_skipped"] = ", ".join(sorted(set(skipped)))
    return "".join(text), provenance


def _level_toml(level: str, name: str, busbw: float, latency: float, rows: list) -> str:
    text = (f"\n[network.{level}]\nname = {_toml_string(name)}\nbus_bandwidth = {busbw!r}\n"
            f"latency_s = {latency!r}\n")
    for kind, g, sizes, times in rows:
        text += (f"\n[[network.{level}.collectives]]\nkind = \"{kind}\"\nranks = {g}\n"
                 f"sizes_bytes = [{', '.join(repr(float(v)) for v in sizes)}]\n"
                 f"times_s = [{', '.join(repr(v) for v in times)}]\n")
    return text


def _powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    if out and out[-1] != limit:
        out.append(limit)
    return out


def _time_collective(torch, dist, device, clock: Clock, kind: str, nbytes: int,
                     members: list[int], group, inside: bool, plan: dict) -> float | None:
    """Median seconds of one call over `members` (max over the ranks);
    None where this backend lacks the collective (every rank agrees)."""
    p = len(members)
    elements = max(p, nbytes // 4 // p * p)
    error = torch.zeros(1, device=device)
    call = None
    if inside:
        me = members.index(dist.get_rank())
        full = torch.rand(elements, device=device) + 0.5
        part = torch.empty(elements // p, device=device)
        if kind == "all_reduce":
            call = lambda: dist.all_reduce(full, group=group)  # noqa: E731
        elif kind == "reduce_scatter":
            call = lambda: dist.reduce_scatter_tensor(part, full, group=group)  # noqa: E731
        elif kind == "all_gather":
            call = lambda: dist.all_gather_into_tensor(full, part, group=group)  # noqa: E731
        elif kind == "all_to_all":
            other = torch.empty_like(full)
            call = lambda: dist.all_to_all_single(other, full, group=group)  # noqa: E731
        else:
            send, recv = full[: max(1, nbytes // 4)], torch.empty(max(1, nbytes // 4),
                                                                  device=device)
            peer_next, peer_prev = members[(me + 1) % p], members[(me - 1) % p]

            def call():
                ops = [dist.P2POp(dist.isend, send, peer_next, group),
                       dist.P2POp(dist.irecv, recv, peer_prev, group)]
                for request in dist.batch_isend_irecv(ops):
                    request.wait()
        try:
            for _ in range(5):
                call()
            clock.sync()
        except (RuntimeError, NotImplementedError, ValueError):
            error.fill_(1.0)
    dist.all_reduce(error, op=dist.ReduceOp.MAX)
    if error.item() > 0:
        return None
    result = torch.zeros(1, device=device, dtype=torch.float64)
    if inside:
        # Every rank of the group must issue the same calls: the calls per
        # sample and the number of samples are agreed (max over the group),
        # never decided by each rank's own clock (that deadlocked: one rank
        # left the loop while another waited in its next collective).
        began = time.perf_counter()
        started = clock.start()
        call()
        clock.stop(started)
        agreed = torch.tensor([max(1, min(1000, math.ceil(1e-3 / max(clock.collect(), 1e-9))))],
                              device=device, dtype=torch.float64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
        inner = int(agreed.item())
        samples: list[float] = []
        while True:
            more = len(samples) < 5 or (time.perf_counter() - began < plan["comm_budget_s"]
                                        and len(samples) < 50)
            agreed.fill_(1.0 if more else 0.0)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)  # also the barrier
            if agreed.item() == 0.0:
                break
            started = clock.start()
            for _ in range(inner):
                call()
            clock.stop(started)
            samples.append(clock.collect() / inner)
        result.fill_(summarize(samples)[0])
    dist.all_reduce(result, op=dist.ReduceOp.MAX)
    return float(result.item())


# ---- a whole run ----------------------------------------------------------------------


def _import_torch():
    try:
        import torch  # noqa: F401
    except ImportError as error:
        raise UsageError(f"backend = \"torch\": PyTorch is not importable here ({error}); "
                         "install it (pip install torch) into this Python") from None
    return torch


def run(out: str, *, device: str | None = None, quick: bool = False, dtype: str | None = None,
        threads: int | None = None, clock: str | None = None, budget_s: float | None = None,
        rotate_bytes: int | None = None, kinds: Sequence[str] | None = None,
        max_dim: int | None = None, name: str | None = None,
        comm_max_bytes: int | None = None, dry_run: bool = False,
        progress: Callable[[str], None] | None = None,
        should_stop: Callable[[], bool] = lambda: False) -> dict | Any:
    """Measure and write the profile (see the module's docstring).  Returns
    the parsed profile (_core.DeviceProfile) or, with dry_run, the resolved
    settings."""
    log = progress or (lambda line: None)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    rank = int(os.environ.get("RANK", "0") or 0)
    if device is not None and device not in ("cpu", "cuda"):
        raise UsageError(f"device = \"{device}\": allowed: cpu, cuda")
    torch = None
    if device is None:  # PyTorch's current device
        torch = _import_torch()
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not out:
        raise UsageError("out: required (the profile TOML to write)")
    out = os.fspath(out)
    if os.path.isdir(out):
        raise UsageError(f"out = \"{out}\": is a directory; allowed: a file path")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise UsageError(f"out = \"{out}\": the folder {folder} does not exist")
    if comm_max_bytes is not None and comm_max_bytes < 1024:
        raise UsageError(f"comm_max_bytes = {comm_max_bytes}: must be >= 1024")
    said = {"backend": "torch", "out": out, "quick": bool(quick)}
    for key, value in (("dtype", dtype), ("threads", threads), ("clock", clock),
                       ("budget_s", budget_s), ("rotate_bytes", rotate_bytes),
                       ("max_dim", max_dim)):
        if value is not None:
            said[key] = value
    if kinds:
        said["kinds"] = list(kinds)
    try:
        plan = dict(_core.profile_plan(said, device))
    except _core.ConfigError as error:
        raise UsageError(str(error)) from None
    if dry_run:  # the settings are checked; PyTorch is not needed for them
        settings = {k: v for k, v in plan.items() if k != "points"}
        settings.update(backend="torch", device=device, out_path=out, points=len(plan["points"]),
                        world_size=world)
        return settings
    torch = torch or _import_torch()
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("device = \"cuda\": PyTorch sees no CUDA device here; allowed: cpu")
    if device == "cuda":  # under torchrun, each rank its node-local GPU
        torch_device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0") or 0))
        torch.cuda.set_device(torch_device)
    else:
        torch_device = torch.device("cpu")
        if plan["threads"] > 0:
            torch.set_num_threads(plan["threads"])
    threads = torch.get_num_threads() if device == "cpu" else 0
    dist = None
    if world > 1:
        import torch.distributed as dist  # noqa: F811
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    try:
        parsed = None
        if rank == 0:
            text_parts = _measure_grid(torch, torch_device, plan, max_dim or 0, threads, log,
                                       should_stop)
        network, net_provenance = "", {}
        if dist is not None:
            dist.barrier()
            # Per point: 0.1 s (GPU) / 0.2 s (CPU), less when the grid's budget is smaller.
            plan["comm_budget_s"] = min(0.1 if device == "cuda" else 0.2, 10 * plan["budget_s"])
            network, net_provenance = measure_collectives(torch, dist, torch_device, plan,
                                                          comm_max_bytes, log)
        if rank == 0:
            provenance, ceilings, measurements = text_parts
            provenance.update(net_provenance)
            provenance["status"] = "complete"
            provenance["measurement_count"] = str(len(measurements))
            profile_name = name or f"torch-{device}"
            text = _profile_text(profile_name, provenance, ceilings, measurements, network)
            parsed = _write_atomically(text, out)
            log(f"{PROG}: wrote {out} ({len(measurements)} measurements)")
        return parsed
    finally:
        if dist is not None:
            dist.destroy_process_group()


def _measure_grid(torch, device, plan: dict, max_dim: int, threads: int,
                  log: Callable[[str], None], should_stop: Callable[[], bool]):
    from . import _torch_ops as ops

    began = time.perf_counter()
    clock = Clock(torch, device, plan["clock"])
    cuda = device.type == "cuda"
    if cuda:
        props = torch.cuda.get_device_properties(device)
        cache = int(getattr(props, "L2_cache_size", 0) or (50 << 20))
        cache_source = f"L2 {cache >> 20} MiB (CUDA device properties)"
        free, total = torch.cuda.mem_get_info(device)
        memory_limit, memory_bytes = int(0.8 * total), float(total)
    else:
        cache, cache_source = _cpu_cache_bytes()
        memory_limit, memory_bytes = _mem_available_bytes() // 2, float(_mem_total_bytes())
    rotation = plan["rotation_bytes"] or 2 * cache
    dtype_name = plan["dtype"]
    provenance = _torch_provenance(torch, device, threads)
    provenance.update(
        how=f"{PROG} --backend torch: PyTorch kernels ({ops.__name__}) timed per "
            "docs/profiler.md's rules", grid=plan["grid"], dtype=dtype_name, clock=plan["clock"],
        timing=f"median of >= {plan['min_repeats']} samples (<= {plan['max_repeats']}), each >= "
               f"{plan['min_sample_s'] * 1e3:g} ms of back-to-back calls, {plan['budget_s']:g} s "
               f"per shape; {'CUDA events' if cuda else plan['clock'] + ' clock'}; backward timed "
               "alone (its forward untimed before each call)",
        rotation_bytes=f"{rotation} (2 x {cache_source})" if not plan["rotation_bytes"]
        else str(rotation),
        memory_limit_bytes=str(memory_limit), load_average_at_start=_read("/proc/loadavg"),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        modar_version=_core.__version__)
    attention_doc = getattr(torch.nn.functional.scaled_dot_product_attention, "__doc__", "") or ""
    provenance["attention"] = ("torch.nn.functional.scaled_dot_product_attention"
                               + (" (native GQA)" if "enable_gqa" in attention_doc
                                  else " (K, V repeated for GQA)"))
    torch_dtype = ops.TORCH_DTYPES[dtype_name]
    options = {"grouped_mm_forms": ops.grouped_mm_forms(device, torch_dtype),
               "adamw_fused": _adamw_fused_works(torch, device)}
    provenance["expert_gemm"] = (
        "torch._grouped_mm for the forms " + ", ".join(map(str, sorted(options["grouped_mm_forms"])))
        + "; " if options["grouped_mm_forms"] else "") + "one torch.matmul per expert otherwise"
    provenance["optimizer"] = "torch.optim.AdamW(" + (
        "fused=True" if options["adamw_fused"] else "foreach=True") + ") on fp32 master weights"
    log(f"{PROG}: measuring ceilings (GEMM, copy, dispatch) on {device}")
    ceilings, how = measure_ceilings(torch, device, clock, dtype_name, plan, cache, memory_limit,
                                     max_dim)
    ceilings["memory_bytes"] = memory_bytes
    provenance["ceilings_how"] = how + "; peak = achievable = measured (no datasheet)"
    points = plan["points"]
    log(f"{PROG}: {len(points)} shapes, grid {plan['grid']}, {dtype_name}, "
        f"torch {torch.__version__} on {provenance['device']}")
    measurements: list[str] = []
    skipped = 0
    generator = torch.Generator(device=device)
    for index, (kind, pass_, dtype, dims) in enumerate(points, start=1):
        if should_stop():
            raise KeyboardInterrupt
        label = _describe(kind, pass_, dtype, dims)
        reason = None
        try:
            bench = ops.make_bench(kind, pass_, list(dims), dtype, device, options)
            if bench.bytes_per_copy > memory_limit:
                raise ops.Unsupported(f"{bench.bytes_per_copy} bytes exceed the memory limit "
                                      f"{memory_limit}")
            count = max(1, min(plan["max_copies"],
                               math.ceil(rotation / max(bench.bytes_per_copy, 1)),
                               max(1, memory_limit // max(bench.bytes_per_copy, 1))))
            generator.manual_seed(0x6D6F646172 + index)
            copies = [bench.make(generator) for _ in range(count)]
            result = measure(bench, copies, clock, plan, should_stop)
            del copies
        except ops.Unsupported as why:
            reason = str(why)
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as error:
            reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        if reason is not None:
            skipped += 1
            provenance[f"skipped.{skipped:04d}"] = f"{label}: {reason}"
            log(f"[{index:4d}/{len(points)}] {label}  skipped: {reason}")
            continue
        measurements.append(_measurement_toml(kind, pass_, dtype, dims, result))
        if kind == "gemm":
            rate = 2.0 * dims[0] * dims[1] * dims[2] * max(dims[3], 1) / result["median_s"]
            for key in (f"peak_flops_{dtype}", f"achievable_flops_{dtype}"):
                ceilings[key] = max(ceilings.get(key, 0.0), rate)
        elapsed = time.perf_counter() - began
        eta = elapsed / index * (len(points) - index)
        log(f"[{index:4d}/{len(points)}] {label:<52} {_format_time(result['median_s']):>10} "
            f"+-{50 * result['spread']:4.1f}% x{count:<3d} elapsed {_duration(elapsed)} "
            f"ETA {_duration(eta)}")
    if not measurements:
        raise UsageError("kinds / max_dim: no point of the grid could be measured here "
                         f"({skipped} skipped; see the progress lines)")
    provenance["skipped_count"] = str(skipped)
    provenance["duration_s"] = f"{time.perf_counter() - began:.1f} (grid and ceilings)"
    return provenance, ceilings, measurements


def _adamw_fused_works(torch, device) -> bool:
    """AdamW(fused=True) runs on this CUDA device (the CPU keeps foreach, its
    default: probing fused there imports the compiler stack, tens of seconds)."""
    if device.type != "cuda":
        return False
    try:
        p = torch.zeros(4, device=device, requires_grad=True)
        p.grad = torch.ones(4, device=device)
        torch.optim.AdamW([p], lr=1e-3, fused=True).step()
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


# ---- the command line -------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (as the C++ CLI)
        raise UsageError(message)


def _parser() -> _Parser:
    p = _Parser(prog=f"python -m modar profile --backend torch", add_help=True,
                description="Time modar's op vocabulary with PyTorch kernels on this device and "
                            "write a modar profile (docs/profiler.md, 'The PyTorch profile').")
    p.add_argument("--backend", required=True, choices=["torch"])
    p.add_argument("--out", required=True, metavar="PATH", help="profile TOML to write (atomic)")
    p.add_argument("--device", choices=["cpu", "cuda"],
                   help="default: cuda when PyTorch sees a GPU, else cpu")
    p.add_argument("--quick", action="store_true", help="the quick grid")
    p.add_argument("--dtype", choices=["fp32", "bf16"], help="default fp32 (cpu), bf16 (cuda)")
    p.add_argument("--threads", type=int, help="CPU threads (default 1; 0 = PyTorch's default)")
    p.add_argument("--clock", choices=["wall", "cpu"], help="default cpu (cpu), wall (cuda)")
    p.add_argument("--budget", type=float, metavar="S", help="seconds per shape (0.08 quick)")
    p.add_argument("--rotate-bytes", type=int, metavar="B", help="default 2 x LLC / L2")
    p.add_argument("--kinds", metavar="K1,K2", help="only these op kinds")
    p.add_argument("--max-dim", type=int, metavar="N", help="only points with every dim <= N")
    p.add_argument("--name", help="the profile's name (default torch-DEVICE)")
    p.add_argument("--comm-max-bytes", type=int, metavar="B",
                   help="under torchrun: largest collective message (1 GiB GPU, 16 MiB CPU)")
    p.add_argument("--dry-run", action="store_true", help="print the resolved settings as JSON")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: Sequence[str]) -> int:
    """`python -m modar profile --backend torch ...`: exit 0, 2 (bad input),
    130 (Ctrl-C: nothing written)."""
    import json

    try:
        args = _parser().parse_args(list(argv))
        kinds = [k for k in args.kinds.split(",") if k] if args.kinds else None
        quiet = args.quiet or int(os.environ.get("RANK", "0") or 0) != 0

        def log(line: str) -> None:
            if not quiet:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()

        result = run(args.out, device=args.device, quick=args.quick, dtype=args.dtype,
                     threads=args.threads, clock=args.clock, budget_s=args.budget,
                     rotate_bytes=args.rotate_bytes, kinds=kinds, max_dim=args.max_dim,
                     name=args.name, comm_max_bytes=args.comm_max_bytes, dry_run=args.dry_run,
                     progress=log)
        if args.dry_run:
            print(json.dumps(result, indent=2, sort_keys=True))
        return 0
    except UsageError as error:
        sys.stderr.write(f"{PROG}: error: {error}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted; nothing written\n")
        return 130


def wants_torch(argv: Sequence[str]) -> bool:
    """`profile --backend torch` (or --backend=torch) among the arguments."""
    if not argv or argv[0] != "profile":
        return False
    for i, arg in enumerate(argv):
        if arg == "--backend=torch" or (arg == "--backend" and i + 1 < len(argv)
                                         and argv[i + 1] == "torch"):
            return True
    return False
