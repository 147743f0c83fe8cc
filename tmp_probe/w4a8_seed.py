# replay the W4A8 stages test at a seed with the per-expert align kernel and with the PyTorch sort
import os, sys, subprocess
seed = sys.argv[1]
for mode in ("kernel", "torch"):
    code = f"""
import sys, os
sys.path.insert(0, 'tests'); sys.path.insert(0, 'tests/kernels')
import torch
from mxkit.kernels import moe
if {mode!r} == 'torch':
    moe._align_experts = moe._align_torch
import test_moe_kernels as t
from conftest import make_generator
g, s = make_generator({seed})
for act in ('swiglu', 'swiglu_gpt_oss'):
    g, s = make_generator({seed})
    try:
        t.test_gpu_moe_w4a8_stages(act, 300, 32, g); print({mode!r}, act, 'pass')
    except AssertionError as e:
        print({mode!r}, act, 'FAIL', str(e)[:200])
"""
    print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()[-600:])
