"""How many decode-mma GEMMs one decode step of `mxkit bench decode`'s model launches, eager and compiled (a fused
q / k / v or gate / up group should run one GEMM per step; before the parts shared one traced GEMM, a compiled
step ran some groups' GEMM two or three times).

    PYTHONPATH=src python3 benchmarks/probes/fused_compile_probe.py gpt-oss-20b 2     # on the GPU
"""
import sys

import torch
from mxkit.bench import decode as bd
from mxkit.kernels.matmul_details import _mma_calls as kmm

name, layers = sys.argv[1], int(sys.argv[2])
m = bd.build_model(name, layers=layers)
bd.quantize(m, "mxfp4_e2m1+fused", True)
calls = []
real = kmm.MmaCall.__call__


def counting(self, *a):
    calls.append(1)
    return real(self, *a)


kmm.MmaCall.__call__ = counting
dec = bd.Decoder(m, 1, 8, 32)
with torch.no_grad():
    for mode in ("eager", "compiled"):
        if mode == "compiled":
            dec.compile()
        dec.capture()
        dec.prefill()
        calls.clear()
        dec.step()
        torch.cuda.synchronize()
        print(f"{name} x {layers} layers, {mode} step: {len(calls)} decode-mma GEMMs")
