#!/usr/bin/env bash
# Host µs of a CUDA uint8 allocation from C++ (at::empty, wrapped for Python) against torch.empty, on the device host.
set -e
D=$(mktemp -d)
cat > $D/t.cpp <<'CPP'
#include <Python.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/python_variable.h>
static PyObject* one(PyObject*, PyObject* arg) {
  at::Tensor t = at::empty({PyLong_AsLongLong(arg)}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0));
  return THPVariable_Wrap(std::move(t));
}
static PyObject* two(PyObject*, PyObject* arg) {
  auto o = at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0);
  at::Tensor a = at::empty({256, 1024}, o);
  at::Tensor b = at::empty({256, 32}, o);
  return PyTuple_Pack(2, THPVariable_Wrap(std::move(a)), THPVariable_Wrap(std::move(b)));
}
static PyMethodDef m[] = {{"one", one, METH_O, ""}, {"two", two, METH_O, ""}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "t", nullptr, -1, m};
PyMODINIT_FUNC PyInit_t(void) { return PyModule_Create(&mod); }
CPP
INC=$(python -c "from torch.utils.cpp_extension import include_paths; print(' '.join('-I'+p for p in include_paths()))")
LIB=$(python -c "from torch.utils.cpp_extension import library_paths; print(' '.join('-L'+p+' -Wl,-rpath,'+p for p in library_paths()))")
PYINC=$(python -c "import sysconfig; print(sysconfig.get_paths()['include'])")
SUF=$(python -c "import importlib.machinery as m; print(m.EXTENSION_SUFFIXES[0])")
time g++ -O2 -std=c++20 -w -shared -fPIC $INC -I$PYINC $D/t.cpp -o $D/t$SUF $LIB -lc10 -ltorch -ltorch_cpu -ltorch_python
python - "$D" <<'PY'
import sys, time, statistics, torch
sys.path.insert(0, sys.argv[1]); import t
x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16); u8 = torch.uint8; dev = x.device
def bench(fn, n=4000):
    for _ in range(100): fn()
    torch.cuda.synchronize(); out = []
    for i in range(n):
        t0 = time.perf_counter_ns(); fn(); out.append(time.perf_counter_ns() - t0)
        if i % 64 == 0: torch.cuda.synchronize()
    return statistics.median(out) / 1e3
for r in range(3):
    print("x*2", bench(lambda: x * 2), "| torch.empty", bench(lambda: torch.empty((256, 1024), dtype=u8, device=dev)),
          "| 2x torch.empty", bench(lambda: (torch.empty((256, 1024), dtype=u8, device=dev), torch.empty((256, 32), dtype=u8, device=dev))),
          "| C++ one", bench(lambda: t.one(262144)), "| C++ two", bench(lambda: t.two(0)))
PY
