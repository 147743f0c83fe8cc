"""Host µs per eager call with the bound launches through the C fast launch against ctypes, in one process:
rounds alternate the two (``cuda_driver._fast_module`` set or None), each round timing the torch op and every
``mxkit bench overhead`` call; a call's ratio to the torch op is taken within its round (the device hosts drift).

    python3 benchmarks/probes/fast_launch_ab.py [rounds] [calls per round]
"""
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from mxkit.bench import overhead as bo  # noqa: E402
from mxkit.kernels import cuda_driver  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
per = int(sys.argv[2]) if len(sys.argv) > 2 else 300
fast = cuda_driver._fast()
print(torch.cuda.get_device_name(0), "fast launch built:", fast is not None)
calls = [c for c in bo.CALLS if "M=256" not in c.name]
fns = [c.make("cuda")[0] for c in calls]
med = {(c.name, m): [] for c in calls for m in ("ctypes", "fast")}
for r in range(rounds):
    for mode in (("ctypes", "fast") if r % 2 else ("fast", "ctypes")):
        cuda_driver._fast_module = fast if mode == "fast" else None
        for c, fn in zip(calls, fns):
            med[(c.name, mode)].append(statistics.median(bo.host_times_ns(fn, per, warmup=20)) / 1e3)
cuda_driver._fast_module = fast
base = {m: med[(bo.BASELINE, m)] for m in ("ctypes", "fast")}
print(f"{'call':40s} {'ctypes µs':>10s} {'fast µs':>9s} {'x torch op ctypes':>18s} {'fast':>6s}")
for c in calls:
    row = [statistics.median(med[(c.name, m)]) for m in ("ctypes", "fast")]
    ratio = [statistics.median(a / b for a, b in zip(med[(c.name, m)], base[m])) for m in ("ctypes", "fast")]
    print(f"{c.name:40s} {row[0]:10.1f} {row[1]:9.1f} {ratio[0]:18.2f} {ratio[1]:6.2f}")
