"""Where decode-mma's envelope should end on this GPU: bf16 x packed MXFP4 at M = 9 .. 64, the path the packaged
table picks against decode-mma forced (its kernel for the shape: m16 / m16l / m16n) and against the path past
decode-mma's envelope (decode-mma's max_m 0), and cuBLAS bf16 on the dequantized weight. µs after the clean-L2 read flush; each output checked against float64 within issue #22's
bound.

    PYTHONPATH=src python3 benchmarks/probes/decode_envelope.py 16x8192x8192,64x28672x8192,...   # on the GPU
"""
import torch
from _probe import main_shapes, w16_case

import mxkit
from mxkit.bench.timing import TimingConfig, time_us
from mxkit.kernels.matmul import gemm_table
from mxkit.kernels.matmul_details._mma_decode import dense_kernel_name
from mxkit.kernels.matmul_table import gemm_table_override, mma_m8_loop


def row(M: int, N: int, K: int, cfg: TimingConfig) -> str:
    x, _, pw, wd, y64, bound = w16_case(M, N, K, "mxfp4_e2m1")

    def timed(fn) -> str:
        err = ((fn().double() - y64).norm() / y64.norm()).item()
        return f"{time_us(fn, cfg)[0]:.1f}{'' if err <= bound else ' BOUND'}"

    cells = [f"{M}x{N}x{K}: cuBLAS bf16 {time_us(lambda: x @ wd.T, cfg)[0]:.1f}",
             f"{mxkit.gemm_plan(x, pw).path} {timed(lambda: mxkit.matmul(x, pw))}"]
    table, gpu = dict(gemm_table()), torch.cuda.get_device_name(0)
    entry = dict(table.get(gpu, {}))
    entry["decode_mma"] = dict(entry.get("decode_mma", {}), max_m=64)
    with gemm_table_override({**table, gpu: entry}):
        name = dense_kernel_name(M, N, K, torch.bfloat16, False, mma_m8_loop(x.device, K, N, M))
        cells.append(f"{mxkit.gemm_plan(x, pw).path} ({name.split('_')[3]}) {timed(lambda: mxkit.matmul(x, pw))}")
    entry["decode_mma"] = dict(entry.get("decode_mma", {}), max_m=0)  # the path past decode-mma's envelope
    with gemm_table_override({**table, gpu: entry}):
        cells.append(f"without decode-mma: {mxkit.gemm_plan(x, pw).path} {timed(lambda: mxkit.matmul(x, pw))}")
    return " | ".join(cells)


if __name__ == "__main__":
    main_shapes(row)
