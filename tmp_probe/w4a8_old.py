# replay the W4A8 stages test at a seed on the code of HEAD (tmp_probe/old/src) and on the working tree
import sys, subprocess, os
seed = sys.argv[1]
for src in ("tmp_probe/old/src", "src"):
    code = f"""
import sys
sys.path.insert(0, 'tests'); sys.path.insert(0, 'tests/kernels')
import test_moe_kernels as t
from conftest import make_generator
for act in ('swiglu', 'swiglu_gpt_oss'):
    g, s = make_generator({seed})
    try:
        t.test_gpu_moe_w4a8_stages(act, 300, 32, g); print({src!r}, act, 'pass')
    except AssertionError as e:
        print({src!r}, act, 'FAIL', str(e)[:200])
"""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    print(r.stdout.strip()[-600:], r.stderr.strip()[-300:] if r.returncode else "")
