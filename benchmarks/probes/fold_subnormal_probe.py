"""Hopper subnormal handling on the exact GEMM paths (a review probe, 2026-12-07): E4M3 subnormal data in the FP8
GEMM (sub8), bf16 subnormals in the fix-up and cuBLAS bf16 (bf16sub, wsub), E3M2 subnormals (e3m2); each line prints
the path, the GEMM's output and the float64 product of the dequantized operands, which must agree.

    PYTHONPATH=src python3 benchmarks/probes/fold_subnormal_probe.py cuda
"""
import sys,torch,mxkit
from mxkit.tensor import MXTensor as T
from mxkit.reference import pack_codes as P, dequantize_reference as D
dev=sys.argv[1] if len(sys.argv)>1 else "cuda"
def mk(c,s,f="mxfp4_e2m1"):
    c=torch.tensor(c,dtype=torch.uint8);s=torch.tensor(s,dtype=torch.uint8)
    return T(P(c,f),s,f,1,32,tuple(c.shape)).to(dev)
def go(n,a,w,out=torch.bfloat16):
    y=mxkit.matmul(a,w,out_dtype=out,backend="triton");p=mxkit.gemm_plan(a,w,out_dtype=out,backend="triton").path
    r=(D(a.to("cpu"),torch.float64)@D(w.to("cpu"),torch.float64).T)
    print(n,p,"got",y.float().cpu().flatten().tolist(),"f64",r.flatten().tolist())
z=[0]*32
# 1 fp8 subnormal data, status 0: a block1 at d=-8 -> E4M3 2^-9
go("sub8",mk([[1]+[0]*31+[1]*32],[[141,127]]),mk([z+[2]*32],[[127,127]]))
# 2 bf16 subnormal a values in fixup: status1 row (bytes 0 and 30), weight scale 247 special
a=mk([[1]*32+[1]+[0]*31],[[0,30]]);w=mk([[2]*32+z],[[247,247]])
go("bf16sub",a,w)
w2=mk([[2]*32+z],[[150,150]]);go("bf16sub_w150",a,w2)
# 3 envelope edge e=-54 both (acc 2^-18)
a=mk([[0,7]+[0]*30+[1]+[0]*31],[[79,65]]);w=mk([[7,0]+[0]*30+[1]+[0]*31],[[79,65]])
go("edge54",a,w,torch.float32 if dev=="cpu" else torch.bfloat16)
a=mk([[0,7]+[0]*30+[1]+[0]*31],[[78,64]]);go("edge55",a,w)
# 4 NaN
go("nanA",mk([[2]*64],[[255,127]]),mk([[2]*64,[2]*64],[[127,127],[127,255]]))
# 5 E3M2 fold subnormal
go("e3m2",mk([[1]+[0]*31+[1]*32],[[131,127]],"mxfp6_e3m2"),mk([z+[4]*32],[[127,127]],"mxfp6_e3m2"))
# 6 Fp8Rowwise tiny
go("wsub",mk([[2]*64],[[200,200]]),mk([[1]*64],[[0,0]]))
go("wsub_a_in",mk([[2]*64],[[127,127]]),mk([[1]*64],[[0,0]]))
x=torch.zeros(2,64);x[0,:32]=2.0**-100;x[0,32:]=2.0**-60;x[1]=1
xb=x.to(dev).bfloat16();wq=mk([[1]*64,[1]*64],[[240,240],[127,127]])
pf=mxkit.quantize_fold(xb,"mxfp4_e2m1")
y=mxkit.matmul(pf,wq,backend="triton");print("qfold",y.float().cpu().tolist(),(D(mxkit.quantize(x,"mxfp4_e2m1"),torch.float64)@D(wq.to("cpu"),torch.float64).T).tolist())
