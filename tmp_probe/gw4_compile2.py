import sys, re
sys.path.insert(0, '/work/main/tmp_probe')
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
import gw4
BN, BM, ST, NW, MODE = [int(a) for a in sys.argv[1:6]]
xl = gl.NVMMASharedLayout.get_default_for([BM, 64], gl.bfloat16)
u8 = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
sig = {"x_desc": "tensordesc<bf16[%d, 64],%s>" % (BM, xl), "w_desc": "tensordesc<u8[%d, 32],%s>" % (BN, u8),
       "s_desc": "tensordesc<u8[1, %d],%s>" % (2 * BN, u8), "y_ptr": "*bf16", "M": "i32", "N": "i32", "K_TILES": "i32"}
BL, SL, acc_l, dot_l = gw4.layouts(BN, BM, NW)
cx = {"BN": BN, "BM": BM, "STAGES": ST, "BL": BL, "SL": SL, "B2": gw4.byte2_layout(BN, NW), "S2": gw4.scale2_layout(BN, NW),
      "acc_l": acc_l, "dot_l": dot_l, "num_warps": NW, "MODE": MODE, "PAIRS": int(sys.argv[6]) if len(sys.argv) > 6 else 1, "ONE_MUL": int(sys.argv[7]) if len(sys.argv) > 7 else 0}
for k in cx: sig[k] = "constexpr"
attrs = {(list(sig).index(k),): [["tt.divisibility", 16]] for k in ("y_ptr", "N")}
src = GluonASTSource(gw4.w4a16_tma_kernel, sig, constexprs={(list(sig).index(k),): v for k, v in cx.items()}, attrs=attrs)
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": NW})
open('/tmp/gw4.ptx', 'w').write(k.asm["ptx"])
print("shared", k.metadata.shared)
