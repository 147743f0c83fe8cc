# compile the module's Gluon kernel for sm_90 without a GPU (triton 3.6 venv): python wg_compile.py BM GROUPED ACT
import sys
sys.path.insert(0, '/work/main/src')
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
from mxkit.kernels.matmul_details import _w4a16_wgmma as W
BM, GROUPED, ACT = [int(a) for a in sys.argv[1:4]]
OUT = sys.argv[4] if len(sys.argv) > 4 else "bf16"
xl = gl.NVMMASharedLayout.get_default_for([BM, 64], gl.bfloat16)
u8 = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
sig = {"x_desc": "tensordesc<bf16[%d, 64],%s>" % (BM, xl), "w_desc": "tensordesc<u8[%d, 32],%s>" % (W.BN, u8),
       "s_desc": "tensordesc<u8[1, %d],%s>" % (2 * W.BN, u8), "y_ptr": "*" + OUT, "b_ptr": "*fp32", "e_ptr": "*i32",
       "M": "i32", "N": "i32", "STEPS": "i32", "stride_ym": "i32"}
b2, s2, bl, l3, acc, dot = W._layouts(BM)
cx = dict(BNc=W.BN, BM=BM, STAGES=W.STAGES, GROUP=W.GROUP_M, B2=b2, S2=s2, BL=bl, L3=l3, ACC=acc, DOT=dot,
          ONE_MUL=True, HAS_BIAS=True, GROUPED=bool(GROUPED), ACT=ACT, WS=bool(int(__import__('os').environ.get('WS','0'))), num_warps=W.WARPS)
for k in cx: sig[k] = "constexpr"
attrs = {(list(sig).index(k),): [["tt.divisibility", 16]] for k in ("y_ptr", "b_ptr", "e_ptr", "stride_ym")}
src = GluonASTSource(W._kernel(), sig,
                     constexprs={(list(sig).index(k),): v for k, v in cx.items()}, attrs=attrs)
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": W.WARPS})
open(f'/tmp/wg_{BM}_{GROUPED}_{ACT}.ptx', 'w').write(k.asm["ptx"])
print("ok shared", k.metadata.shared, "regs?", k.n_regs if hasattr(k, "n_regs") else "")
