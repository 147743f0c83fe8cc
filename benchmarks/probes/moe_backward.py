"""MXMoE's gradient path on the GPU: forward + backward of one GPT-OSS MoE layer (MXFP4 experts packed in place,
hidden = intermediate = 2880, top-4, random bytes), ms per step and the peak memory above the layer, at 64 /
1024 / 4096 tokens, for 32 and 128 experts; then one expert's weights dequantized from the packed layout.

    PYTHONPATH=src python3 benchmarks/probes/moe_backward.py   # on the GPU
"""
import time

import torch

from mxkit.nn import MXMoE


def layer(E: int, H: int = 2880, k: int = 4) -> MXMoE:
    m = MXMoE(H, H, E, k, "mxfp4", device="cuda")
    with torch.no_grad():
        for n in ("gate_up_qdata", "down_qdata"):
            t = getattr(m, n)
            t.copy_(torch.randint(0, 256, t.shape, device="cuda", dtype=torch.uint8))
        for n in ("gate_up_scale", "down_scale"):
            t = getattr(m, n)
            t.copy_(torch.randint(117, 123, t.shape, device="cuda", dtype=torch.uint8))
        m.router.weight.normal_(0, 0.02)
    return m.to(torch.bfloat16)


def main():
    print(torch.cuda.get_device_name(0))
    for E in (32, 128):
        m = layer(E)
        for T in (64, 1024, 4096):
            x = torch.randn(T, 2880, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            m(x.detach())  # packs the experts in place

            def step():
                x.grad = None
                m(x).float().square().sum().backward()

            step()
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) / 3 * 1e3
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            print(f"E={E} tokens={T}: forward + backward {ms:.1f} ms, peak +{peak:.0f} MiB", flush=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for e in range(8):
            m._expert_weight("gate_up", e), m._expert_weight("down", e)
        torch.cuda.synchronize()
        print(f"  one expert's two weights dequantized: {(time.perf_counter() - t0) / 8 * 1e3:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
