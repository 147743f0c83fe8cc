import torch, mxkit, transformers, weakref
from mxkit.nn import fused as F
cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                               num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
mxkit.quantize_model(model, "mxfp4", skip="lm_head", progress=False, compute_qsnr=False, fuse=True)
ids = torch.randint(0, 256, (2, 1)).cuda()
real = F.FusedMXLinear.output
log = []
def output(self, x, i):
    if not torch.compiler.is_compiling():
        src = x if x._base is None else x._base
        last = self._last
        log.append((self.splits, i, id(x), id(src), x.data_ptr(), tuple(x.shape), x.stride(), x._version,
                    None if last is None else (last[0]() is src, last[4] == (x.data_ptr(), x.shape, x.stride()), last[1], sorted(last[3]))))
    return real(self, x, i)
F.FusedMXLinear.output = output
compiled = torch.compile(model, dynamic=False, fullgraph=True)
with torch.no_grad():
    compiled(ids); log.clear(); compiled(ids)
for r in log: print(r)
