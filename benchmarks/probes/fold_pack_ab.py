"""Where ``pack_weight(w, act="fp8_rowwise")`` (the FP8 fold of an MXFP4 weight: W4A8 and MX x MX) spends its
time, against a copy moving the same bytes (codes and scales read, E4M3 bytes and row scales written): the fold
kernel alone at its config and at others (the same bytes checked), with the weight statistics it makes for
pack_weight (session 32), and the whole call (its one host sync included). µs after a clean-L2 read flush with a
GPU spin ahead. (The first run's baseline, `h100-2026-11-25h/fold_pack_ab.txt`, moved ~1.8x those bytes.)

    PYTHONPATH=src python3 benchmarks/probes/fold_pack_ab.py   # on the GPU
"""
import torch
import triton

import mxkit
from mxkit.bench.timing import cuda_event_bench
from mxkit.kernels.fold import FoldConfig, _outputs, _run_fold, fold_config


def t(fn):
    return cuda_event_bench(fn, 10, 60, 100.0, "read")


def row(N: int, K: int) -> str:
    w = mxkit.quantize(torch.randn(N, K, device="cuda", dtype=torch.bfloat16), "mxfp4")
    q, s = w.qdata, w.scale
    data, scale, status = _outputs(N, K, w.device)
    nb = q.numel() + s.numel() + data.numel() + 5 * N  # read: codes, scales; written: E4M3 bytes, row scales
    src = torch.empty(nb // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = t(lambda: dst.copy_(src))  # a copy moving the same bytes (half read, half written)
    base = fold_config(N, K, w.fmt)
    _run_fold(w, data, scale, status)
    want = data.clone()
    cells = [f"{N}x{K}: {nb / 1e6:.0f} MB moved, copy {copy:.1f} us | config {base}"]
    for cfg in dict.fromkeys([base, FoldConfig(1, 2048, 4), FoldConfig(1, 4096, 8), FoldConfig(2, 2048, 8),
                              FoldConfig(1, 1024, 2), FoldConfig(4, 1024, 8), FoldConfig(1, 8192, 16)]):
        if cfg.block_k > 2 * triton.next_power_of_2(K):
            continue
        data.fill_(0xAA)
        _run_fold(w, data, scale, status, cfg)
        ok = torch.equal(data, want)
        us = t(lambda: _run_fold(w, data, scale, status, cfg))
        cells.append(f"r{cfg.block_r} k{cfg.block_k} w{cfg.num_warps} {us:.1f} ({100 * copy / us:.0f}%)"
                     f"{'' if ok else ' MISMATCH'}")
    us = t(lambda: _run_fold(w, data, scale, status, stats=True))
    cells.append(f"config + weight stats {us:.1f} ({100 * copy / us:.0f}%)")
    whole = t(lambda: mxkit.pack_weight(w, act="fp8_rowwise"))
    cells.append(f"pack_weight fp8_rowwise {whole:.1f} ({100 * copy / whole:.0f}%)")
    return " | ".join(cells)


def main():
    print(torch.cuda.get_device_name(0), "| torch", torch.__version__, "| triton", triton.__version__)
    for N, K in [(4096, 4096), (8192, 8192), (28672, 8192), (8192, 28672), (5760, 2880)]:
        print(row(N, K), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
