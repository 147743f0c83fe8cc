/* mxkit's launch fast path: one cuLaunchKernel of a bound parameter block, called from Python without ctypes.
 *
 * Built at first use by mxkit/kernels/fast_launch.py with the C compiler and Python headers of the host (as
 * Triton builds its launcher); no CUDA or PyTorch headers: cuLaunchKernel's address and the current-stream
 * accessor come from Python through init(). The pointers given to a launch are written into the shared parameter
 * block (for later launches of the block as it stands) and into a private copy of the block on the C stack, which
 * the driver reads with the GIL released: another thread may rewrite the shared block meanwhile.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MAX_PARAMS 512 /* fast_launch.MAX_PARAMS: bound launches with more go through ctypes */

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

/* launch(function, gx, gy, gz, block, shared, device, params, nparams, *pointers) -> CUresult (int)
 *
 * params: the address of the launch's void *[nparams] (one entry per kernel parameter, each pointing at its value);
 * pointers: tensors (their data_ptr()) or None (0) for parameters 0, 1, ... (at most nparams), written into the
 * shared block and into the private copy the driver reads; the launch goes on the stream that stream_of(device)
 * returns. */
static PyObject *fl_launch(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t n) {
    if (n < 9) {
        PyErr_SetString(PyExc_TypeError,
                        "launch(function, gx, gy, gz, block, shared, device, params, nparams, *pointers)");
        return NULL;
    }
    if (cu_launch == NULL || stream_of == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "mxkit fast launch: init() was not called");
        return NULL;
    }
    void *fn = PyLong_AsVoidPtr(args[0]);
    unsigned gx, gy, gz, block, shared, nparams;
    if ((fn == NULL && PyErr_Occurred()) || as_uint(args[1], &gx) || as_uint(args[2], &gy) ||
        as_uint(args[3], &gz) || as_uint(args[4], &block) || as_uint(args[5], &shared) || as_uint(args[8], &nparams))
        return NULL;
    void **params = (void **)PyLong_AsVoidPtr(args[7]);
    if (params == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null parameter block");
        return NULL;
    }
    Py_ssize_t npointers = n - 9;
    if (nparams > MAX_PARAMS || npointers > (Py_ssize_t)nparams) {
        PyErr_Format(PyExc_ValueError, "%zd pointers for %u parameters (at most %d parameters)", npointers, nparams,
                     MAX_PARAMS);
        return NULL;
    }
    /* every Python call first (a data_ptr() or the stream getter may run Python code, and another thread with it) */
    uint64_t ptrs[MAX_PARAMS];
    for (Py_ssize_t i = 0; i < npointers; i++) {
        uint64_t v = 0;
        PyObject *t = args[9 + i];
        if (t != Py_None) {
            PyObject *r = PyObject_CallMethodNoArgs(t, data_ptr_name);
            if (r == NULL) return NULL;
            v = (uint64_t)PyLong_AsUnsignedLongLong(r);
            Py_DECREF(r);
            if (v == (uint64_t)-1 && PyErr_Occurred()) return NULL;
        }
        ptrs[i] = v;
    }
    PyObject *getter = stream_of; /* owned for the call: init() may replace the global meanwhile */
    Py_INCREF(getter);
    PyObject *s = PyObject_CallOneArg(getter, args[6]);
    Py_DECREF(getter);
    if (s == NULL) return NULL;
    void *stream = PyLong_AsVoidPtr(s);
    Py_DECREF(s);
    if (stream == NULL && PyErr_Occurred()) return NULL;
    void *local[MAX_PARAMS];
    for (unsigned i = 0; i < nparams; i++) local[i] = params[i];
    for (Py_ssize_t i = 0; i < npointers; i++) {
        *(uint64_t *)params[i] = ptrs[i];
        local[i] = &ptrs[i];
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cu_launch(fn, gx, gy, gz, block, 1, 1, shared, stream, local, NULL);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyMethodDef methods[] = {
    {"init", (PyCFunction)(void (*)(void))fl_init, METH_FASTCALL, "init(launch function address, stream getter)"},
    {"launch", (PyCFunction)(void (*)(void))fl_launch, METH_FASTCALL,
     "launch(function, gx, gy, gz, block, shared, device, params, nparams, *pointers) -> CUresult"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_mxkit_fast_launch", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__mxkit_fast_launch(void) {
    data_ptr_name = PyUnicode_InternFromString("data_ptr");
    if (data_ptr_name == NULL) return NULL;
    return PyModule_Create(&module);
}
