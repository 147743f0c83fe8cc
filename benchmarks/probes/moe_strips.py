"""``mxkit bench moe`` (or any mxkit command) with this GPU's dispatch table but ``moe.mma_strips`` = argv[1]: the
grouped decode kernels' strips a block (session 38: 1, 2, 4 on the H200, h200-2026-12-02c/moe_strips/).

    PYTHONPATH=src python3 benchmarks/probes/moe_strips.py 2 bench moe --models gpt-oss-120b --tokens 16,64,256 \
        --routings uniform --modes w4a16 --peers none --rep-ms 40   # on the GPU
"""
import sys

import torch

from mxkit import cli
from mxkit.kernels.matmul_table import gemm_table, gemm_table_override

table, gpu = dict(gemm_table()), torch.cuda.get_device_name(0)
entry = dict(table.get(gpu, {}))
entry["moe"] = dict(entry.get("moe", {}), mma_strips=int(sys.argv[1]))
with gemm_table_override({**table, gpu: entry}):
    cli.main(sys.argv[2:])
