"""What the A/B probes share: the kernels of a PTX file, the timing, the split-K buffers, fp8-wgmma's MoE rows."""
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from mxkit.bench.timing import cuda_event_bench  # noqa: E402
from mxkit.kernels.cuda_driver import Kernel  # noqa: E402

DEV = torch.device("cuda")


def kernels(ptx: str) -> dict:
    """{entry name: Kernel} of every kernel of the PTX file ``ptx``."""
    return {n: Kernel(ptx, n, DEV) for n in re.findall(r"^\.visible \.entry (\w+)\(", Path(ptx).read_text(), re.M)}


def time_us(fn) -> float:
    """Median µs of ``fn`` after a clean-L2 read flush."""
    return cuda_event_bench(fn, 10, 50, 20, "read")


def split_buffers(tiles: int, split: int, per_tile: int):
    """(float32 workspace, int32 counters) of a launch split over ``split`` blocks along K, (None, None) unsplit."""
    if split == 1:
        return None, None
    return (torch.empty(tiles * split * per_tile, device=DEV),
            torch.zeros(tiles, device=DEV, dtype=torch.int32))


def main_shapes(row, warmup_ms: float = 5, rep_ms: float = 15) -> None:
    """The GPU's name, then ``row(M, N, K, cfg)`` for each ``MxNxK`` of the comma list in ``sys.argv[1]``."""
    from mxkit.bench.timing import TimingConfig

    cfg = TimingConfig(warmup_ms=warmup_ms, rep_ms=rep_ms)
    print(torch.cuda.get_device_name(0))
    for s in sys.argv[1].split(","):
        print(row(*(int(v) for v in s.split("x")), cfg), flush=True)
        torch.cuda.empty_cache()


def w16_case(M: int, N: int, K: int, fmt: str, act="float"):
    """A bf16 x MX weight case: (x bf16 [M, K], the MX weight, ``pack_weight(w, act=act)``, its bf16 values, y64
    the float64 product, issue #22's bf16 bound as a relative error). Rows of the weight at magnitudes 2^-7 .. 2^-1."""
    import mxkit
    from mxkit.reference import dequantize_reference

    w = torch.randn(N, K, device="cuda") * 2.0 ** torch.randint(-7, 0, (N, 1), device="cuda")
    wq = mxkit.quantize(w.to(torch.bfloat16), fmt)
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    wd = dequantize_reference(wq, torch.bfloat16)
    y64 = x.double() @ wd.double().T
    bound = 1.2 * ((y64.to(torch.bfloat16).double() - y64).norm() / y64.norm()).item()
    return x, wq, mxkit.pack_weight(wq, act=act), wd, y64, bound


def launches(fn, prefix: str, reps: int = 5) -> list:
    """µs of each launch of kernels named ``prefix``... in one call of ``fn``, in call order (torch profiler, the
    mean of ``reps`` calls; the profiler inflates them: compare within a run)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    ev = [e.device_time for e in prof.events()
          if e.device_type == torch.autograd.DeviceType.CUDA and e.name.startswith(prefix)]
    per = max(1, len(ev) // reps)
    return [sum(ev[i::per]) / reps for i in range(per)]


def host_us(fn, calls: int = 20, gpu_ms_per_call: float = 2.0) -> float:
    """Host µs a call of ``fn`` over ``calls`` calls, the GPU kept busy ahead by a spin (no back-pressure): the
    launch path alone."""
    import time

    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9 * calls * gpu_ms_per_call * 1e-3))
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def moe_prefill_case(model: str, w, packed, T: int, cfg):
    """(call, µs of the torch._grouped_mm bf16 GEMMs) for GPT-OSS ``model``'s experts ``w`` (mxkit.bench.moe
    weights) packed for the decode-mma layout, at ``T`` tokens of uniform routing: ``call()`` runs the MoE layer
    (moe_triton on ``packed``)."""
    from mxkit.bench import moe as bm
    from mxkit.bench.timing import time_us as bench_us
    from mxkit.kernels.moe import moe_triton

    tw, ids = bm.routing(T, bm.MODELS[model], "uniform", "cuda")
    x = torch.randn(T, bm.HIDDEN, device="cuda", dtype=torch.bfloat16)
    case = bm.MoeCase(model=model, T=T, routing="uniform", mode="w4a16")
    t_peer = bench_us(bm._grouped(case, bm.Inputs(x, tw, ids, w), None, gemms_only=True), cfg)[0]
    return (lambda: moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids, packed=packed)), t_peer


def fp8_moe_rows(E: int = 128, T: int = 16384, K: int = 2880):
    """fp8-wgmma's grouped operand a on GPT-OSS's MoE (uniform top-4 routing of T tokens over E experts, each group
    padded to 16 rows): (a float8_e4m3fn [R, K], sa float32 [R], offs int32 [E], the tile table, R)."""
    from mxkit.kernels.matmul_details import _fp8_wgmma as f8

    ids = torch.rand(T, E, device=DEV).topk(4, 1).indices
    pad = (torch.bincount(ids.flatten(), minlength=E) + 15) // 16 * 16
    offs = pad.cumsum(0).to(torch.int32)
    R = int(offs[-1])
    a = torch.randn(R, K, device=DEV).to(torch.float8_e4m3fn)
    return a, torch.rand(R, device=DEV), offs, f8.tile_table(offs, R), R
