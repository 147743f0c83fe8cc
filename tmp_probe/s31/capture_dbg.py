import sys, traceback, torch
sys.path.insert(0, "src")
from mxkit.bench import decode as bd
from mxkit.nn import MXMoE

def try_capture(model, tag):
    dec = bd.Decoder(model, 1, 8, 8)
    try:
        with torch.no_grad():
            g = dec.capture()
            g.replay(); torch.cuda.synchronize()
        print(tag, "capture ok")
    except Exception:
        print(tag, "FAILED")
        traceback.print_exc(limit=-12)

m = bd.build_model("gpt-oss-20b", layers=1)
try_capture(m, "bf16 grouped_mm")
class NoMoE(torch.nn.Module):
    def forward(self, h):
        return torch.zeros_like(h), None
for l in m.model.layers:
    l.mlp = NoMoE()
try_capture(m, "no moe")
m = bd.build_model("gpt-oss-20b", layers=1)
bd.quantize(m, "mxfp4_e2m1+experts")
try_capture(m, "mxmoe")
