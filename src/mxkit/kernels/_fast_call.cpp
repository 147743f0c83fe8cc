/* mxkit's eager call fast path: allocate a launch's outputs and launch it in one call from Python.
 *
 * A Plan is one bound launch (a CUfunction, its grid / block / shared bytes and its parameter block, which a
 * BoundLaunch of cuda_driver.py owns) plus the outputs each call makes: Plan(...)(*inputs) allocates them with
 * at::empty / at::zeros (no Python argument parsing: torch.empty from Python cost ~4 us of host time a call on the
 * device machines, at::empty ~2), writes the inputs' and outputs' data pointers into a private copy of the
 * parameter block and calls cuLaunchKernel with the GIL released. The shared block is never written, so threads
 * may share a Plan.
 *
 * A Plan may also take host TMA descriptors (CUtensorMap, 128 bytes) among its parameters: it keeps each one's bytes
 * as encoded for a first input, and each call copies them into its own 64-byte aligned buffer and points them at
 * that call's input with cuTensorMapReplaceAddress (the shape, strides, box and swizzle stay as encoded: the
 * caller's plan is made per shape and strides), in place of a cuTensorMapEncodeTiled per call.
 *
 * Built at first use by mxkit/kernels/fast_call.py against the installed PyTorch's headers and libraries (no
 * CUDA headers: cuLaunchKernel's address, the current-stream accessor, the context binder and the error check
 * come from Python through init()). Where it cannot be built, the Python path (torch.empty, then the C fast
 * launch) runs the same launch.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <c10/core/DeviceGuard.h>

#include <cstdint>
#include <cstring>

namespace {

constexpr int kMaxParams = 512;  // fast_launch.MAX_PARAMS
constexpr int kMaxSlots = 16;    // leading pointer parameters a Plan writes
constexpr int kMaxOuts = 8;
constexpr int kMaxDims = 8;
constexpr int kMaxMaps = 4;      // host TMA descriptors a Plan re-addresses
constexpr int kMapBytes = 128;   // sizeof(CUtensorMap)
constexpr int kInvalidContext = 201;  // CUDA_ERROR_INVALID_CONTEXT

typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shared, void *stream, void **params, void **extra);

typedef int (*replace_fn)(void *tensor_map, void *global_address);  // cuTensorMapReplaceAddress

launch_fn cu_launch = nullptr;
replace_fn cu_replace = nullptr;
PyObject *stream_of = nullptr;  // device index -> raw cudaStream_t (int)
PyObject *bind_context = nullptr;  // device index -> None: make the primary context current on this thread
PyObject *check_rc = nullptr;  // (CUresult, what) -> raises

/* Output allocation without the dispatcher (at::empty's operator lookup, BackendSelect and the backend's empty
 * kernel: ~1 us of host time an output on the device hosts): at::detail::empty_generic with the allocator that
 * at::empty itself used for this device (learned from the first output's storage, so the CUDA caching allocator
 * with its graph-capture pools and MemPools, or whatever allocator PyTorch was set up with), under one device guard
 * per call. The same tensors as at::empty's; at::empty still makes them where PyTorch fills new memory
 * (torch.use_deterministic_algorithms with fill_uninitialized_memory), and while fast_alloc(False). GIL held. */
constexpr int kMaxDevices = 64;
c10::Allocator *learned_alloc[kMaxDevices + 1] = {};  // [device + 1]; CPU at 0
bool fast_alloc_on = true;
unsigned long long fast_allocs = 0;  // outputs made by empty_generic (fast_alloc_count(): the tests' check)

/* Makes one call's outputs on one device (dev >= 0: that CUDA device; -1: the CPU): at::zeros where zero-filled,
 * else at::detail::empty_generic with the learned allocator (learned from the first at::empty output), under one
 * device guard for all of them. */
struct OutMaker {
  at::TensorOptions options;
  c10::Allocator *alloc = nullptr;
  c10::DispatchKeySet keys;
  c10::OptionalDeviceGuard guard;
  int slot;

  explicit OutMaker(int dev)
      : options(dev >= 0 ? at::TensorOptions().device(at::kCUDA, (c10::DeviceIndex)dev)
                         : at::TensorOptions().device(at::kCPU)),
        keys(dev >= 0 ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU),
        slot(dev < kMaxDevices ? dev + 1 : -1) {
    if (fast_alloc_on && slot >= 0 &&
        !(at::globalContext().deterministicAlgorithms() && at::globalContext().deterministicFillUninitializedMemory()))
      alloc = learned_alloc[slot];
    if (alloc != nullptr && dev >= 0) guard.reset_device(c10::Device(c10::DeviceType::CUDA, (c10::DeviceIndex)dev));
  }

  at::Tensor make(at::IntArrayRef sizes, at::ScalarType dtype, bool zero) {
    if (zero) return at::zeros(sizes, options.dtype(dtype));
    if (alloc != nullptr) {
      ++fast_allocs;
      return at::Tensor(at::detail::empty_generic(sizes, alloc, keys, dtype, std::nullopt));
    }
    at::Tensor t = at::empty(sizes, options.dtype(dtype));
    if (fast_alloc_on && slot >= 0 && learned_alloc[slot] == nullptr) learned_alloc[slot] = t.storage().allocator();
    return t;
  }

  /* One allocation of `bytes` for a group of outputs (see OutSpec), or none (false) where they are made one by one:
   * while the allocator is not learned, fast_alloc(False), or the deterministic fill. */
  c10::Storage group(int64_t bytes) {
    if (alloc == nullptr) return c10::Storage();
    return c10::Storage(c10::Storage::use_byte_size_t(), bytes, alloc, /*resizable=*/true);
  }

  /* An output in a group's allocation, `byte_offset` bytes in: a tensor of its own (its own version counter, no view
   * relation) over the shared storage, made as empty_generic makes one. */
  at::Tensor over(const c10::Storage &st, at::IntArrayRef sizes, at::ScalarType dtype, int64_t byte_offset) {
    ++fast_allocs;
    at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(st), keys, c10::scalarTypeToTypeMeta(dtype));
    c10::TensorImpl *impl = t.unsafeGetTensorImpl();
    impl->set_sizes_contiguous(sizes);
    if (byte_offset) impl->set_storage_offset(byte_offset / (int64_t)c10::elementSize(dtype));
    return t;
  }
};

constexpr int64_t kGroupAlign = 256;  // each output of a group starts at a multiple of it (the allocator's own)

/* One output of a Plan. Outputs may be grouped (plan_wrapping's group): a follower (lead >= 0) lives in its lead's
 * allocation, `offset` bytes in (past the lead and the followers before it, each at a multiple of kGroupAlign), so
 * one allocation serves them all (a cast-transpose's element bytes and scales: two allocations for four outputs). */
struct OutSpec {
  int64_t sizes[kMaxDims];
  int ndim;
  at::ScalarType dtype;
  bool zero;
  int64_t nbytes;       // its own bytes
  int lead;             // -1: its own allocation (with its followers'); else the output whose allocation holds it
  int64_t offset;       // a follower's byte offset in its lead's allocation
  int64_t group_bytes;  // a lead with followers: the bytes of the whole allocation; else 0
};

/* Makes output j of outs a follower of the earlier output `lead` (neither grouped yet but as the lead of the
 * followers before j): after the lead and those followers, at the next multiple of kGroupAlign. False with a
 * Python error where either is zero-filled (at::zeros makes those). */
bool follow(OutSpec *outs, int j, int lead) {
  if (outs[j].zero || outs[lead].zero) {
    PyErr_Format(PyExc_ValueError, "output %d or %d is zero-filled: they cannot share an allocation", j, lead);
    return false;
  }
  OutSpec &l = outs[lead];
  int64_t end = l.group_bytes ? l.group_bytes : l.nbytes;
  int64_t at = (end + kGroupAlign - 1) / kGroupAlign * kGroupAlign;
  if (__builtin_add_overflow(at, outs[j].nbytes, &l.group_bytes)) {
    PyErr_Format(PyExc_OverflowError, "output %d: too many bytes", j);
    return false;
  }
  outs[j].lead = lead;
  outs[j].offset = at;
  return true;
}

struct Spec {  // a Plan's plain fields, parsed and checked whole before a Plan takes them
  void *fn;
  unsigned gx, gy, gz, block, shared, nparams;
  int device;  // CUDA index; -1: CPU outputs (the CPU tests)
  void **params;
  int n_slots, n_outs, n_args;
  int slots[kMaxSlots];  // pointer slot i: >= 0 input slots[i]; < 0 output -1 - slots[i]
  int at[kMaxSlots];     // the parameter pointer slot i writes (by default i: the leading pointer parameters)
  int n_maps;
  int map_param[kMaxMaps], map_input[kMaxMaps];  // host TMA descriptor parameter, the input it is re-addressed to
  unsigned char map_bytes[kMaxMaps][kMapBytes];  // as encoded for the plan's first input
  OutSpec outs[kMaxOuts];
  bool single;
};

struct Plan {
  PyObject_HEAD
  Spec s;
  PyObject *device_obj;
  PyObject *keep;  // what owns the parameter block (a BoundLaunch)
  PyObject *name;
  PyObject *wraps;  // null, or wrapping()'s objects: the call returns them, made of the outputs
};

PyObject *empty_args = nullptr;  // () for object.__new__
PyObject *dict_name = nullptr;   // "__dict__", interned

int as_uint(PyObject *o, unsigned *out, const char *what) {
  unsigned long v = PyLong_AsUnsignedLong(o);
  if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
  if (v > 0xffffffffUL) {
    PyErr_Format(PyExc_OverflowError, "%s out of range", what);
    return -1;
  }
  *out = (unsigned)v;
  return 0;
}

/* Plan(function, (gx, gy, gz), block, shared, device, params, nparams, slots, outs, n_args, single, keep, name
 *      [, at[, maps]])
 * slots: a tuple of ints, one per pointer slot (>= 0: that input; < 0: output -1 - slot);
 * outs: a tuple of (sizes tuple, torch.dtype, zero-filled bool);
 * at: the parameter index each slot writes (default: slot i writes parameter i, the leading pointer parameters);
 * maps: a tuple of (parameter index, input index, 128 bytes): a host TMA descriptor parameter, re-addressed to that
 * input's data pointer each call from these bytes. */
int plan_init(PyObject *self_, PyObject *args, PyObject *kwds) {
  Plan *self = (Plan *)self_;
  PyObject *fn, *grid, *params, *slots, *outs, *keep, *name, *device_obj, *at = nullptr, *maps = nullptr;
  unsigned block, shared, nparams;
  int device, n_args, single;
  if (kwds != nullptr && PyDict_GET_SIZE(kwds)) {
    PyErr_SetString(PyExc_TypeError, "Plan takes positional arguments only");
    return -1;
  }
  if (self->s.fn != nullptr) {  // (a live Plan may be mid-launch in another thread: its fields never change)
    PyErr_SetString(PyExc_TypeError, "a Plan is initialised once");
    return -1;
  }
  if (!PyArg_ParseTuple(args, "OO!IIiOIO!O!ipOU|O!O!", &fn, &PyTuple_Type, &grid, &block, &shared, &device,
                        &params, &nparams, &PyTuple_Type, &slots, &PyTuple_Type, &outs, &n_args, &single, &keep,
                        &name, &PyTuple_Type, &at, &PyTuple_Type, &maps))
    return -1;
  /* every field is parsed into `plan` and checked first, then copied in: a failed init leaves the Plan as it was */
  Spec plan;
  std::memset(&plan, 0, sizeof(plan));
  plan.fn = PyLong_AsVoidPtr(fn);
  if (plan.fn == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null function");
    return -1;
  }
  plan.params = (void **)PyLong_AsVoidPtr(params);
  if (plan.params == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null parameter block");
    return -1;
  }
  if (PyTuple_GET_SIZE(grid) != 3 || as_uint(PyTuple_GET_ITEM(grid, 0), &plan.gx, "grid") ||
      as_uint(PyTuple_GET_ITEM(grid, 1), &plan.gy, "grid") || as_uint(PyTuple_GET_ITEM(grid, 2), &plan.gz, "grid")) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "grid must be 3 ints");
    return -1;
  }
  if (nparams > (unsigned)kMaxParams) {
    PyErr_Format(PyExc_ValueError, "%u parameters (at most %d)", nparams, kMaxParams);
    return -1;
  }
  Py_ssize_t ns = PyTuple_GET_SIZE(slots), no = PyTuple_GET_SIZE(outs);
  if (ns > kMaxSlots || ns > (Py_ssize_t)nparams || no > kMaxOuts || n_args < 0 || n_args > kMaxSlots) {
    PyErr_Format(PyExc_ValueError, "%zd pointer slots for %u parameters, %zd outputs, %d inputs (at most %d / %d)",
                 ns, nparams, no, n_args, kMaxSlots, kMaxOuts);
    return -1;
  }
  for (Py_ssize_t i = 0; i < ns; i++) {
    long v = PyLong_AsLong(PyTuple_GET_ITEM(slots, i));
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v >= n_args || v < -no) {
      PyErr_Format(PyExc_ValueError, "slot %zd names %ld: no such input (%d) or output (%zd)", i, v, n_args, no);
      return -1;
    }
    plan.slots[i] = (int)v;
    plan.at[i] = (int)i;
  }
  /* the parameters written per call (slots' and maps'): each once, each inside the block */
  bool written[kMaxParams] = {};
  if (at != nullptr) {
    if (PyTuple_GET_SIZE(at) != ns) {
      PyErr_Format(PyExc_ValueError, "at: %zd parameter indices for %zd pointer slots", PyTuple_GET_SIZE(at), ns);
      return -1;
    }
    for (Py_ssize_t i = 0; i < ns; i++) {
      long v = PyLong_AsLong(PyTuple_GET_ITEM(at, i));
      if (v == -1 && PyErr_Occurred()) return -1;
      if (v < 0 || v >= (long)nparams) {
        PyErr_Format(PyExc_ValueError, "at: slot %zd names parameter %ld of %u", i, v, nparams);
        return -1;
      }
      plan.at[i] = (int)v;
    }
  }
  for (Py_ssize_t i = 0; i < ns; i++) {
    if (written[plan.at[i]]) {
      PyErr_Format(PyExc_ValueError, "parameter %d is written twice", plan.at[i]);
      return -1;
    }
    written[plan.at[i]] = true;
  }
  Py_ssize_t nm = maps != nullptr ? PyTuple_GET_SIZE(maps) : 0;
  if (nm > kMaxMaps) {
    PyErr_Format(PyExc_ValueError, "%zd descriptors (at most %d)", nm, kMaxMaps);
    return -1;
  }
  for (Py_ssize_t m = 0; m < nm; m++) {
    int param, input;
    const char *bytes;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(maps, m), "iiy#", &param, &input, &bytes, &len)) return -1;
    if (param < 0 || param >= (int)nparams || written[param] || input < 0 || input >= n_args || len != kMapBytes) {
      PyErr_Format(PyExc_ValueError, "descriptor %zd: parameter %d of %u (each written once), input %d of %d, %zd "
                   "bytes (%d)", m, param, nparams, input, n_args, len, kMapBytes);
      return -1;
    }
    written[param] = true;
    plan.map_param[m] = param;
    plan.map_input[m] = input;
    std::memcpy(plan.map_bytes[m], bytes, kMapBytes);
  }
  plan.n_maps = (int)nm;
  for (Py_ssize_t j = 0; j < no; j++) {
    PyObject *spec = PyTuple_GET_ITEM(outs, j), *sizes, *dtype;
    int zero;
    if (!PyArg_ParseTuple(spec, "O!O!p", &PyTuple_Type, &sizes, &THPDtypeType, &dtype, &zero)) return -1;
    Py_ssize_t nd = PyTuple_GET_SIZE(sizes);
    if (nd > kMaxDims) {
      PyErr_Format(PyExc_ValueError, "output %zd has %zd dims (at most %d)", j, nd, kMaxDims);
      return -1;
    }
    OutSpec &o = plan.outs[j];
    o.dtype = ((THPDtype *)dtype)->scalar_type;
    int64_t bytes = (int64_t)c10::elementSize(o.dtype);
    for (Py_ssize_t d = 0; d < nd; d++) {
      long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, d));
      if (v == -1 && PyErr_Occurred()) return -1;
      if (v < 0) {
        PyErr_Format(PyExc_ValueError, "output %zd: negative size", j);
        return -1;
      }
      if (__builtin_mul_overflow(bytes, (int64_t)v, &bytes)) {
        PyErr_Format(PyExc_OverflowError, "output %zd: too many bytes", j);
        return -1;
      }
      o.sizes[d] = v;
    }
    o.nbytes = bytes;
    o.ndim = (int)nd;
    o.zero = zero != 0;
    o.lead = -1;
  }
  plan.n_slots = (int)ns;
  plan.n_outs = (int)no;
  plan.n_args = n_args;
  plan.single = single != 0;
  plan.nparams = nparams;
  plan.block = block;
  plan.shared = shared;
  plan.device = device;
  device_obj = PyLong_FromLong(device);
  if (device_obj == nullptr) return -1;
  Spec whole = plan;
  whole.fn = nullptr;
  self->s = whole;
  self->device_obj = device_obj;
  Py_INCREF(keep);
  self->keep = keep;
  Py_INCREF(name);
  self->name = name;
  self->s.fn = plan.fn;  // (last: a Plan with fn set is whole)
  return 0;
}

void plan_dealloc(PyObject *self_) {
  Plan *self = (Plan *)self_;
  Py_XDECREF(self->device_obj);
  Py_XDECREF(self->keep);
  Py_XDECREF(self->name);
  Py_XDECREF(self->wraps);
  Py_TYPE(self_)->tp_free(self_);
}

struct Owned {  // a new reference to a (possibly null) object for a scope
  PyObject *p;
  explicit Owned(PyObject *o) : p(o) { Py_XINCREF(p); }
  ~Owned() { Py_XDECREF(p); }
  Owned(const Owned &) = delete;
  Owned &operator=(const Owned &) = delete;
};

/* The objects of wraps (see plan_wrapping) made of a call's outputs: each object.__new__(cls) given a copy of its
 * field dict, the outputs named in it set, as its __dict__ (object.__setattr__(obj, "__dict__", d): a frozen
 * dataclass made without __init__, as MXTensor._trusted_maker makes one); a tuple, or the one object where wraps
 * holds one. */
struct OwnedArray {  // new references released at scope exit (THPVariable_Wrap may throw)
  PyObject *p[kMaxOuts] = {};
  ~OwnedArray() {
    for (PyObject *o : p) Py_XDECREF(o);
  }
};

PyObject *make_object(PyObject *w, PyObject *const *tensors) {
  PyObject *names = PyTuple_GET_ITEM(w, 2);
  Owned d(nullptr);
  d.p = PyDict_Copy(PyTuple_GET_ITEM(w, 1));
  if (d.p == nullptr) return nullptr;
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(names); k++) {
    PyObject *pair = PyTuple_GET_ITEM(names, k);
    if (PyDict_SetItem(d.p, PyTuple_GET_ITEM(pair, 0), tensors[PyLong_AsLong(PyTuple_GET_ITEM(pair, 1))]) < 0)
      return nullptr;
  }
  PyObject *obj = PyBaseObject_Type.tp_new((PyTypeObject *)PyTuple_GET_ITEM(w, 0), empty_args, nullptr);
  if (obj != nullptr && PyObject_GenericSetAttr(obj, dict_name, d.p) < 0) Py_CLEAR(obj);
  return obj;
}

PyObject *wrap_outputs(PyObject *wraps, at::Tensor *outs, int n_outs) {
  OwnedArray tensors;
  for (int j = 0; j < n_outs; j++)
    if ((tensors.p[j] = THPVariable_Wrap(std::move(outs[j]))) == nullptr) return nullptr;
  Py_ssize_t n = PyTuple_GET_SIZE(wraps);
  if (n == 1) return make_object(PyTuple_GET_ITEM(wraps, 0), tensors.p);
  PyObject *res = PyTuple_New(n);
  if (res == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *obj = make_object(PyTuple_GET_ITEM(wraps, i), tensors.p);
    if (obj == nullptr) {
      Py_DECREF(res);
      return nullptr;
    }
    PyTuple_SET_ITEM(res, i, obj);
  }
  return res;
}

int launch_once(Plan *self, void *stream, void **local) {
  int rc;
  Py_BEGIN_ALLOW_THREADS
  const Spec &p = self->s;
  rc = cu_launch(p.fn, p.gx, p.gy, p.gz, p.block, 1, 1, p.shared, stream, local, nullptr);
  Py_END_ALLOW_THREADS
  return rc;
}

PyObject *plan_call(PyObject *self_, PyObject *args, PyObject *kwds) {
  HANDLE_TH_ERRORS
  Plan *self = (Plan *)self_;
  if (cu_launch == nullptr || stream_of == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "mxkit fast call: init() was not called");
    return nullptr;
  }
  if (self->s.fn == nullptr || self->name == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "mxkit fast call: a Plan that was not initialised");
    return nullptr;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  if (n != self->s.n_args || (kwds != nullptr && PyDict_GET_SIZE(kwds))) {
    PyErr_Format(PyExc_TypeError, "%U takes %d tensors (or None), got %zd", self->name, self->s.n_args, n);
    return nullptr;
  }
  uint64_t in_ptrs[kMaxSlots];
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *t = PyTuple_GET_ITEM(args, i);
    if (t == Py_None) {
      in_ptrs[i] = 0;
    } else if (THPVariable_Check(t)) {
      in_ptrs[i] = (uint64_t)(uintptr_t)THPVariable_Unpack(t).data_ptr();
    } else {
      PyErr_Format(PyExc_TypeError, "%U: input %zd is a %s, not a tensor or None", self->name, i, Py_TYPE(t)->tp_name);
      return nullptr;
    }
  }
  at::Tensor outs[kMaxOuts];
  if (self->s.n_outs > 0) {
    OutMaker maker(self->s.device);
    c10::Storage groups[kMaxOuts];
    for (int j = 0; j < self->s.n_outs; j++) {
      const OutSpec &o = self->s.outs[j];
      at::IntArrayRef sizes(o.sizes, o.ndim);
      if (o.lead >= 0 && groups[o.lead])
        outs[j] = maker.over(groups[o.lead], sizes, o.dtype, o.offset);
      else if (o.group_bytes > 0 && (groups[j] = maker.group(o.group_bytes)))
        outs[j] = maker.over(groups[j], sizes, o.dtype, 0);
      else
        outs[j] = maker.make(sizes, o.dtype, o.zero);
    }
  }
  /* every Python call before the launch: the stream getter may run Python code. The callables are owned for the
   * call: init() may replace the globals meanwhile */
  Owned getter(stream_of), binder(bind_context), check(check_rc);
  PyObject *s = PyObject_CallOneArg(getter.p, self->device_obj);
  if (s == nullptr) return nullptr;
  void *stream = PyLong_AsVoidPtr(s);
  Py_DECREF(s);
  if (stream == nullptr && PyErr_Occurred()) return nullptr;
  uint64_t ptrs[kMaxSlots];
  void *local[kMaxParams];
  alignas(64) unsigned char maps[kMaxMaps][kMapBytes];
  std::memcpy(local, self->s.params, sizeof(void *) * self->s.nparams);
  for (int i = 0; i < self->s.n_slots; i++) {
    int v = self->s.slots[i];
    ptrs[i] = v >= 0 ? in_ptrs[v] : (uint64_t)(uintptr_t)outs[-1 - v].data_ptr();
    local[self->s.at[i]] = &ptrs[i];
  }
  for (int m = 0; m < self->s.n_maps; m++) {
    void *base = (void *)(uintptr_t)in_ptrs[self->s.map_input[m]];
    if (cu_replace == nullptr || base == nullptr) {
      PyErr_Format(PyExc_RuntimeError, "%U: descriptor %d: %s", self->name, m,
                   cu_replace == nullptr ? "init_maps() was not called" : "its input is None");
      return nullptr;
    }
    std::memcpy(maps[m], self->s.map_bytes[m], kMapBytes);
    int rc = cu_replace(maps[m], base);
    if (rc) {
      PyErr_Format(PyExc_RuntimeError, "%U: re-addressing descriptor %d: CUresult %d", self->name, m, rc);
      return nullptr;
    }
    local[self->s.map_param[m]] = maps[m];
  }
  if (self->s.gx && self->s.gy && self->s.gz) {  // (an empty grid: the outputs, nothing launched)
    int rc = launch_once(self, stream, local);
    if (rc == kInvalidContext && binder.p != nullptr) {  // a thread with no current context: bind it, launch again
      PyObject *r = PyObject_CallOneArg(binder.p, self->device_obj);
      if (r == nullptr) return nullptr;
      Py_DECREF(r);
      rc = launch_once(self, stream, local);
    }
    if (rc) {
      if (check.p != nullptr) {
        PyObject *r = PyObject_CallFunction(check.p, "iO", rc, self->name);
        if (r == nullptr) return nullptr;
        Py_DECREF(r);
      }
      PyErr_Format(PyExc_RuntimeError, "launching %U: CUresult %d", self->name, rc);
      return nullptr;
    }
  }
  if (self->wraps != nullptr) return wrap_outputs(self->wraps, outs, self->s.n_outs);
  if (self->s.single) return THPVariable_Wrap(std::move(outs[0]));
  PyObject *tup = PyTuple_New(self->s.n_outs);
  if (tup == nullptr) return nullptr;
  for (int j = 0; j < self->s.n_outs; j++) {
    PyObject *t = THPVariable_Wrap(std::move(outs[j]));
    if (t == nullptr) {
      Py_DECREF(tup);
      return nullptr;
    }
    PyTuple_SET_ITEM(tup, j, t);
  }
  return tup;
  END_HANDLE_TH_ERRORS
}

PyObject *plan_repr(PyObject *self_) {
  Plan *self = (Plan *)self_;
  if (self->s.fn == nullptr) return PyUnicode_FromString("<mxkit fast call: not initialised>");
  return PyUnicode_FromFormat("<mxkit fast call %U: grid (%u, %u, %u), block %u, %d inputs, %d outputs>", self->name,
                              self->s.gx, self->s.gy, self->s.gz, self->s.block, self->s.n_args, self->s.n_outs);
}

PyTypeObject PlanType = {PyVarObject_HEAD_INIT(nullptr, 0)};

/* plan.wrapping(wraps, group=False) -> a Plan of the same launch whose call returns objects made of its outputs in
 * place of them: wraps is a tuple of (cls, fields, ((name, output index), ...)), cls a class whose instances
 * object.__new__ makes and that have a __dict__, fields a dict (copied at each call; the named outputs set in the
 * copy). group: each object's outputs share one allocation (see OutSpec; the lowest-numbered leads), where no
 * output is named by two objects or zero-filled. Not for a custom op's body: PyTorch refuses outputs that share
 * a storage there. */
PyObject *plan_wrapping(PyObject *self_, PyObject *args) {
  Plan *self = (Plan *)self_;
  PyObject *wraps;
  int group = 0;
  if (!PyArg_ParseTuple(args, "O|p:wrapping", &wraps, &group)) return nullptr;
  if (self->s.fn == nullptr || self->name == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "mxkit fast call: a Plan that was not initialised");
    return nullptr;
  }
  if (!PyTuple_Check(wraps) || PyTuple_GET_SIZE(wraps) == 0) {
    PyErr_SetString(PyExc_TypeError, "wrapping(wraps): a non-empty tuple of (cls, fields, ((name, output), ...))");
    return nullptr;
  }
  Spec spec = self->s;
  bool named[kMaxOuts] = {};
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(wraps); i++) {
    PyObject *w = PyTuple_GET_ITEM(wraps, i);
    if (!PyTuple_Check(w) || PyTuple_GET_SIZE(w) != 3 || !PyType_Check(PyTuple_GET_ITEM(w, 0)) ||
        !PyDict_Check(PyTuple_GET_ITEM(w, 1)) || !PyTuple_Check(PyTuple_GET_ITEM(w, 2))) {
      PyErr_Format(PyExc_TypeError, "wrapping: object %zd is not (cls, fields dict, names tuple)", i);
      return nullptr;
    }
    PyTypeObject *cls = (PyTypeObject *)PyTuple_GET_ITEM(w, 0);
#ifdef Py_TPFLAGS_MANAGED_DICT
    const bool has_dict = cls->tp_dictoffset != 0 || PyType_HasFeature(cls, Py_TPFLAGS_MANAGED_DICT);
#else
    const bool has_dict = cls->tp_dictoffset != 0;
#endif
    if (cls->tp_new != PyBaseObject_Type.tp_new || !has_dict) {
      PyErr_Format(PyExc_TypeError, "wrapping: %s is not made by object.__new__ with a __dict__", cls->tp_name);
      return nullptr;
    }
    PyObject *names = PyTuple_GET_ITEM(w, 2);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(names); k++) {
      PyObject *pair = PyTuple_GET_ITEM(names, k);
      long j = -1;
      if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2 && PyUnicode_Check(PyTuple_GET_ITEM(pair, 0)) &&
          PyLong_Check(PyTuple_GET_ITEM(pair, 1)))
        j = PyLong_AsLong(PyTuple_GET_ITEM(pair, 1));
      if (j == -1 && PyErr_Occurred()) return nullptr;
      if (j < 0 || j >= self->s.n_outs) {
        PyErr_Format(PyExc_ValueError, "wrapping: object %zd field %zd is not (name, one of the %d outputs)", i, k,
                     self->s.n_outs);
        return nullptr;
      }
    }
    if (group) {  // the object's outputs after the lowest-numbered one, in order
      int idx[kMaxOuts], m = 0;
      for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(names); k++) {
        int j = (int)PyLong_AsLong(PyTuple_GET_ITEM(PyTuple_GET_ITEM(names, k), 1));
        if (named[j]) {
          PyErr_Format(PyExc_ValueError, "wrapping: output %d is named twice: its allocation cannot be grouped", j);
          return nullptr;
        }
        named[j] = true;
        int at = m++;
        for (; at > 0 && idx[at - 1] > j; at--) idx[at] = idx[at - 1];
        idx[at] = j;
      }
      for (int k = 1; k < m; k++)
        if (!follow(spec.outs, idx[k], idx[0])) return nullptr;
    }
  }
  Plan *w = (Plan *)PlanType.tp_alloc(&PlanType, 0);
  if (w == nullptr) return nullptr;
  w->s = spec;
  Py_INCREF(self->device_obj);
  w->device_obj = self->device_obj;
  Py_INCREF(self->keep);
  w->keep = self->keep;
  Py_INCREF(self->name);
  w->name = self->name;
  Py_INCREF(wraps);
  w->wraps = wraps;
  return (PyObject *)w;
}

PyMethodDef plan_methods[] = {
    {"wrapping", plan_wrapping, METH_VARARGS,
     "wrapping(wraps, group=False) -> a Plan of this launch returning objects (cls, fields, ((name, output), ...)) "
     "of its outputs; group: each object's outputs in one allocation"},
    {nullptr, nullptr, 0, nullptr}};

/* init(cuLaunchKernel address, stream getter, context binder, error check) */
PyObject *fc_init(PyObject *, PyObject *const *args, Py_ssize_t n) {
  if (n != 4 || !PyCallable_Check(args[1]) || !PyCallable_Check(args[2]) || !PyCallable_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError,
                    "init(launch function address: int, stream getter, context binder, error check: callables)");
    return nullptr;
  }
  void *p = PyLong_AsVoidPtr(args[0]);
  if (p == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null launch function");
    return nullptr;
  }
  cu_launch = (launch_fn)p;
  Py_INCREF(args[1]);
  Py_XSETREF(stream_of, args[1]);
  Py_INCREF(args[2]);
  Py_XSETREF(bind_context, args[2]);
  Py_INCREF(args[3]);
  Py_XSETREF(check_rc, args[3]);
  Py_RETURN_NONE;
}

/* fast_alloc() -> bool; fast_alloc(flag) -> the previous flag: outputs allocated without the dispatcher (on by
 * default; off: at::empty, as before; the A/B probe and the tests compare the two) */
PyObject *fc_fast_alloc(PyObject *, PyObject *const *args, Py_ssize_t n) {
  if (n > 1) {
    PyErr_SetString(PyExc_TypeError, "fast_alloc([flag: bool])");
    return nullptr;
  }
  const bool was = fast_alloc_on;
  if (n == 1) {
    int v = PyObject_IsTrue(args[0]);
    if (v < 0) return nullptr;
    fast_alloc_on = v != 0;
  }
  return PyBool_FromLong(was);
}

PyObject *fc_fast_alloc_count(PyObject *, PyObject *) { return PyLong_FromUnsignedLongLong(fast_allocs); }

/* init_maps(cuTensorMapReplaceAddress address): what Plans with descriptors re-address them with */
PyObject *fc_init_maps(PyObject *, PyObject *arg) {
  void *p = PyLong_AsVoidPtr(arg);
  if (p == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null function");
    return nullptr;
  }
  cu_replace = (replace_fn)p;
  Py_RETURN_NONE;
}

/* mm_t(a, w) -> a @ w.T: a [M, K] and w [N, K] of one dtype on one device (CUDA, or the CPU: the tests); y [M, N]
 * contiguous, made like a Plan's outputs. The backend's mm kernel is called directly (mm.out redispatched at the
 * tensors' backend key: no Python argument parsing, no autograd or other dispatch key on the way), so y holds
 * torch.mm(a, w.t())'s bytes: the same kernel, the same cuBLAS call, on the current stream, under the cuBLAS
 * settings in force. No autograd: for callers whose inputs need no gradient. */
PyObject *fc_mm_t(PyObject *, PyObject *const *args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  if (n != 2 || !THPVariable_Check(args[0]) || !THPVariable_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "mm_t(a: Tensor, w: Tensor)");
    return nullptr;
  }
  const at::Tensor &a = THPVariable_Unpack(args[0]);
  const at::Tensor &w = THPVariable_Unpack(args[1]);
  if (a.dim() != 2 || w.dim() != 2 || a.size(1) != w.size(1) || a.scalar_type() != w.scalar_type() ||
      a.device() != w.device() || !(a.is_cuda() || a.is_cpu())) {
    PyErr_SetString(PyExc_ValueError, "mm_t: a [M, K] and w [N, K] of one dtype on one CUDA (or CPU) device");
    return nullptr;
  }
  const int dev = a.is_cuda() ? (int)a.get_device() : -1;
  at::Tensor y;
  {
    OutMaker maker(dev);
    y = maker.make({a.size(0), w.size(0)}, a.scalar_type(), false);
  }
  at::_ops::mm_out::redispatch(c10::DispatchKeySet(dev >= 0 ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU), a,
                               w.t(), y);
  return THPVariable_Wrap(std::move(y));
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"init", (PyCFunction)(void (*)(void))fc_init, METH_FASTCALL,
     "init(launch function address, stream getter, context binder, error check)"},
    {"fast_alloc", (PyCFunction)(void (*)(void))fc_fast_alloc, METH_FASTCALL,
     "fast_alloc([flag]) -> the previous flag: outputs allocated without the dispatcher"},
    {"init_maps", fc_init_maps, METH_O, "init_maps(cuTensorMapReplaceAddress address)"},
    {"fast_alloc_count", fc_fast_alloc_count, METH_NOARGS, "fast_alloc_count() -> how many outputs were allocated without the dispatcher"},
    {"mm_t", (PyCFunction)(void (*)(void))fc_mm_t, METH_FASTCALL, "mm_t(a, w) -> a @ w.T by the backend's mm kernel"},
    {nullptr, nullptr, 0, nullptr},
};

struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_mxkit_fast_call", nullptr, -1, methods,
                                 nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__mxkit_fast_call(void) {
  PlanType.tp_name = "_mxkit_fast_call.Plan";
  PlanType.tp_basicsize = sizeof(Plan);
  PlanType.tp_flags = Py_TPFLAGS_DEFAULT;
  PlanType.tp_doc = "Plan(function, grid, block, shared, device, params, nparams, slots, outs, n_args, single, keep, "
                    "name[, at[, maps]])(*inputs) -> the outputs, launched";
  PlanType.tp_new = PyType_GenericNew;
  PlanType.tp_init = plan_init;
  PlanType.tp_dealloc = plan_dealloc;
  PlanType.tp_call = plan_call;
  PlanType.tp_repr = plan_repr;
  PlanType.tp_methods = plan_methods;
  if (PyType_Ready(&PlanType) < 0) return nullptr;
  if (empty_args == nullptr && (empty_args = PyTuple_New(0)) == nullptr) return nullptr;
  if (dict_name == nullptr && (dict_name = PyUnicode_InternFromString("__dict__")) == nullptr) return nullptr;
  PyObject *m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&PlanType);
  if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
    Py_DECREF(&PlanType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
