"""Production kernels for an Nsight Compute look: each case launched once after a warm-up, inside
cudaProfilerStart / Stop, through the public API (so the kernels and configs are the ones users get).

    ncu --profile-from-start off --clock-control none --metrics <see scripts/gpu_ncu.sh> \\
        python3 scripts/ncu_cases.py [--set field=value ...] [case names...]

``--set field=value,...`` runs every case with those quantize config fields (``table=[]``: no per-GPU tuning
entries) through ``mxkit.kernels.opt_flags.override``, as scripts/ab.py does, to profile a variant. Without
names, every case below runs.
"""

import argparse
import sys
from pathlib import Path

import torch

import mxkit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab import override, parse_variant  # noqa: E402  (the A/B tool's override and field=value parsing)

FMTS = {"fp8": "mxfp8_e4m3", "fp4": "mxfp4_e2m1", "fp6": "mxfp6_e2m3"}


def cases(n: int = 8192) -> dict:
    """name -> zero-argument callable, bf16 n x n (GEMMs n^3)."""
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = {}
    for short, fmt in FMTS.items():
        q = mxkit.quantize(x, fmt)
        out[f"rows {short}"] = lambda fmt=fmt: mxkit.quantize(x, fmt, axis=-1)
        out[f"cols {short}"] = lambda fmt=fmt: mxkit.quantize(x, fmt, axis=0)
        out[f"castT {short}"] = lambda fmt=fmt: mxkit.quantize(x, fmt, axis=(-1, 0))
        out[f"dq {short}"] = lambda q=q: mxkit.dequantize(q, torch.bfloat16)
        if hasattr(mxkit, "pack_weight"):
            packed = mxkit.pack_weight(q)
            out[f"gemm {short}"] = lambda q=q, packed=packed: mxkit.matmul(q, packed)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", default="", help="quantize config field=value,... for the config override")
    p.add_argument("names", nargs="*")
    args = p.parse_args()
    _, fields = parse_variant("set:" + args.set)
    with override(fields):
        todo = cases()
        names = args.names or list(todo)
        for n in names:
            todo[n]()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for n in names:
            print("ncu case:", n, flush=True)
            todo[n]()
            torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
