"""`mxkit tune gemm`'s MoE envelope alone (moe.mma_max_pairs): decode against prefill on packed MXFP4 GPT-OSS
experts at 8 to 1024 (token, slot) pairs, on this GPU.

    PYTHONPATH=src python benchmarks/probes/tune_moe.py [--rep-ms 20]
"""

import argparse

import torch

from mxkit import tune

p = argparse.ArgumentParser()
p.add_argument("--rep-ms", type=float, default=20.0)
args = p.parse_args()
g = torch.Generator(device="cuda").manual_seed(0)
print(torch.cuda.get_device_name(), "->", tune._tune_moe(g, args.rep_ms, print))
