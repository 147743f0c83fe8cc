/* mxkit's launch fast path: one cuLaunchKernel of a bound parameter block, called from Python without ctypes.
 *
 * Built at first use by mxkit/kernels/fast_launch.py with the C compiler and Python headers of the host (as
 * Triton builds its launcher); no CUDA or PyTorch headers: cuLaunchKernel's address and the current-stream
 * accessor come from Python through init(). The GIL is held from the writes of the parameter block to the
 * driver's return, so no other Python thread can rewrite the block while the driver reads it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MAX_POINTERS 64

typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shared, void *stream, void **params, void **extra);

static launch_fn cu_launch = NULL;
static PyObject *stream_of = NULL; /* device index -> raw cudaStream_t (int) */
static PyObject *data_ptr_name = NULL;

/* init(cuLaunchKernel address, stream getter) */
static PyObject *fl_init(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t n) {
    if (n != 2 || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "init(launch function address: int, stream getter: callable)");
        return NULL;
    }
    void *p = PyLong_AsVoidPtr(args[0]);
    if (p == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null launch function");
        return NULL;
    }
    cu_launch = (launch_fn)p;
    Py_INCREF(args[1]);
    Py_XSETREF(stream_of, args[1]);
    Py_RETURN_NONE;
}

static int as_uint(PyObject *o, unsigned *out) {
    unsigned long v = PyLong_AsUnsignedLong(o);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
    if (v > 0xffffffffUL) {
        PyErr_SetString(PyExc_OverflowError, "launch dimension out of range");
        return -1;
    }
    *out = (unsigned)v;
    return 0;
}

/* launch(function, gx, gy, gz, block, shared, device, params, *pointers) -> CUresult (int)
 *
 * params: the address of the launch's void *[] (one entry per kernel parameter, each pointing at its value);
 * pointers: tensors (their data_ptr()) or None (0), written into the values of parameters 0, 1, ... before the
 * launch, which goes on the stream that stream_of(device) returns. */
static PyObject *fl_launch(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t n) {
    if (n < 8) {
        PyErr_SetString(PyExc_TypeError, "launch(function, gx, gy, gz, block, shared, device, params, *pointers)");
        return NULL;
    }
    if (cu_launch == NULL || stream_of == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "mxkit fast launch: init() was not called");
        return NULL;
    }
    void *fn = PyLong_AsVoidPtr(args[0]);
    unsigned gx, gy, gz, block, shared;
    if ((fn == NULL && PyErr_Occurred()) || as_uint(args[1], &gx) || as_uint(args[2], &gy) ||
        as_uint(args[3], &gz) || as_uint(args[4], &block) || as_uint(args[5], &shared))
        return NULL;
    void **params = (void **)PyLong_AsVoidPtr(args[7]);
    if (params == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null parameter block");
        return NULL;
    }
    /* every Python call first (a data_ptr() or the stream getter may run Python code, and another thread with
     * it), then the writes and the launch with the GIL held throughout */
    uint64_t ptrs[MAX_POINTERS];
    if (n - 8 > MAX_POINTERS) {
        PyErr_SetString(PyExc_ValueError, "too many pointer arguments");
        return NULL;
    }
    for (Py_ssize_t i = 8; i < n; i++) {
        uint64_t v = 0;
        if (args[i] != Py_None) {
            PyObject *r = PyObject_CallMethodNoArgs(args[i], data_ptr_name);
            if (r == NULL) return NULL;
            v = (uint64_t)PyLong_AsUnsignedLongLong(r);
            Py_DECREF(r);
            if (v == (uint64_t)-1 && PyErr_Occurred()) return NULL;
        }
        ptrs[i - 8] = v;
    }
    PyObject *s = PyObject_CallOneArg(stream_of, args[6]);
    if (s == NULL) return NULL;
    void *stream = PyLong_AsVoidPtr(s);
    Py_DECREF(s);
    if (stream == NULL && PyErr_Occurred()) return NULL;
    for (Py_ssize_t i = 0; i < n - 8; i++) *(uint64_t *)params[i] = ptrs[i];
    int rc = cu_launch(fn, gx, gy, gz, block, 1, 1, shared, stream, params, NULL);
    return PyLong_FromLong(rc);
}

static PyMethodDef methods[] = {
    {"init", (PyCFunction)(void (*)(void))fl_init, METH_FASTCALL, "init(launch function address, stream getter)"},
    {"launch", (PyCFunction)(void (*)(void))fl_launch, METH_FASTCALL,
     "launch(function, gx, gy, gz, block, shared, device, params, *pointers) -> CUresult"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_mxkit_fast_launch", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__mxkit_fast_launch(void) {
    data_ptr_name = PyUnicode_InternFromString("data_ptr");
    if (data_ptr_name == NULL) return NULL;
    return PyModule_Create(&module);
}
