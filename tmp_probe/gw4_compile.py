import sys, re
sys.path.insert(0, '/work/main/tmp_probe')
import triton, torch
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
import gw4
BN, BM, ST, NW = [int(a) for a in (sys.argv[1:5] if len(sys.argv) > 4 else (128, 128, 4, 8))]
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
layout = gl.NVMMASharedLayout.get_default_for([BM, 64], gl.bfloat16)
from triton.tools.tensor_descriptor import TensorDescriptor as _TD
sig = {"x_desc": "tensordesc<bf16[%d, 64],%s>" % (BM, layout), "q_ptr": "*u8", "s_ptr": "*u8", "y_ptr": "*bf16",
       "M": "i32", "N": "i32", "K_TILES": "i32", "KB": "i32", "KS": "i32",
       "BN": "constexpr", "BM": "constexpr", "STAGES": "constexpr", "BL": "constexpr", "SL": "constexpr",
       "acc_l": "constexpr", "dot_l": "constexpr", "num_warps": "constexpr", "MODE": "constexpr"}
BL, SL, acc_l, dot_l = gw4.layouts(BN, BM, NW)
cx = {"BN": BN, "BM": BM, "STAGES": ST, "BL": BL, "SL": SL, "acc_l": acc_l, "dot_l": dot_l, "num_warps": NW, "MODE": int(sys.argv[5]) if len(sys.argv) > 5 else 0}
attrs = {(list(sig).index(k),): [["tt.divisibility", 16]] for k in ("q_ptr", "s_ptr", "y_ptr", "KB", "KS", "N")}
src = GluonASTSource(gw4.w4a16_kernel, sig, constexprs={(list(sig).index(k),): v for k, v in cx.items()}, attrs=attrs)
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": NW})
ptx = k.asm["ptx"]
open('/tmp/gw4.ptx', 'w').write(ptx)
open('/tmp/gw4.ttgir', 'w').write(k.asm["ttgir"])
print("shared", k.metadata.shared)
for op in ["st.shared", "ld.shared", "wgmma.mma_async", "ld.global", "bar.sync", "ld.global.v2", "wgmma.wait"]:
    print(op, len(re.findall(re.escape(op), ptx)))
