"""Full float32 precision for mxkit's float32 matmuls, whatever the process-wide settings: :class:`exact_cublas`
switches cuBLAS's TF32 and bf16 / fp16 reduced-precision reductions off around a call (only where one is on) and
restores them; :class:`exact_float32` does the same for a device type, the CPU's oneDNN float32 matmul precision
included (``torch.set_float32_matmul_precision("medium")`` makes it bf16). Below the reference layer: the
reference GEMM (:func:`mxkit.reference.matmul_reference`) runs under it, as do the kernels' cuBLAS calls
(:mod:`mxkit.kernels.matmul_details._cublas`)."""

from __future__ import annotations

import threading
from typing import Optional

import torch


def _cublas_flags():
    """(getters, setters) of cuBLAS's TF32 and bf16 / fp16 reduced-precision reduction settings in ``torch._C``
    where this PyTorch has them and its getters give a bool or a (bool, bool) pair, else None (then the
    ``torch.backends.cuda.matmul`` properties, which cost ~4 µs of host time for the six reads and writes of
    :func:`exact_cublas`). Probed by reading only, at the first use."""
    C = torch._C
    try:
        get = (C._get_cublas_allow_tf32, C._get_cublas_allow_bf16_reduced_precision_reduction,
               C._get_cublas_allow_fp16_reduced_precision_reduction)
        put = (C._set_cublas_allow_tf32, C._set_cublas_allow_bf16_reduced_precision_reduction,
               C._set_cublas_allow_fp16_reduced_precision_reduction)
        vals = [g() for g in get]
    except (AttributeError, TypeError, RuntimeError):
        return None
    ok = isinstance(vals[0], bool) and all(
        isinstance(v, bool) or isinstance(v, tuple) and len(v) == 2 and all(isinstance(b, bool) for b in v)
        for v in vals[1:])
    return (get, put) if ok else None


_CUBLAS: list = []  # [_cublas_flags(), _fp32_precision_api()], filled at the first use (_probe)
_PROBE_LOCK = threading.Lock()


def _probe() -> list:
    """_CUBLAS, filled once (both entries together, under a lock: two threads' first exact blocks at once)."""
    if not _CUBLAS:
        with _PROBE_LOCK:
            if not _CUBLAS:
                _CUBLAS[:] = [_cublas_flags(), _fp32_precision_api()]
    return _CUBLAS


def _fp32_precision_api():
    """torch._C's getter and setter of the newer per-backend float32 precision (``fp32_precision``), where this
    PyTorch has them (2.9 on), else None."""
    C = torch._C
    get, put = getattr(C, "_get_fp32_precision_getter", None), getattr(C, "_set_fp32_precision_setter", None)
    try:
        return (get, put) if isinstance(get("cuda", "matmul"), str) and callable(put) else None
    except (TypeError, RuntimeError):
        return None


def _tf32_off_new_api(api) -> Optional[str]:
    """cuBLAS's TF32 switched off through the newer API (``torch.backends.cuda.matmul.fp32_precision`` to
    "ieee"), which keeps every view of the setting as it was once restored (a write through the legacy setters
    makes torch refuse to read ``get_float32_matmul_precision`` back: "mix of the legacy and new APIs"). Returns
    the precision to restore ("none" where the value was its parent's, so that it follows the parent again),
    None where it was "ieee" already (nothing written)."""
    get, put = api
    p = get("cuda", "matmul")
    if p == "ieee":
        return None
    put("cuda", "matmul", "ieee")
    return "none" if p == get("cuda", "all") else p


def _switch_exact() -> list:
    """TF32 and the reduced-precision reductions off where on; returns what :func:`_restore` puts back."""
    _probe()
    fns = _CUBLAS[0]
    m = torch.backends.cuda.matmul
    if fns is None:
        get = (lambda: m.allow_tf32, lambda: m.allow_bf16_reduced_precision_reduction,
               lambda: m.allow_fp16_reduced_precision_reduction)
    else:
        get = fns[0]
    try:
        on = get[0]()
    except RuntimeError:  # (a state of the newer API the legacy getter refuses to read)
        on = True
    tf32 = None
    if on:
        api = _CUBLAS[1]
        if api is not None:
            p = _tf32_off_new_api(api)
            tf32 = None if p is None else (p,)
        else:
            tf32 = True
            if fns is None:
                m.allow_tf32 = False
            else:
                fns[1][0](False)
    saved = [tf32, None, None]
    for i in (1, 2):
        v = get[i]()
        if v[0] if isinstance(v, tuple) else v:
            saved[i] = v
            if fns is None:
                setattr(m, _REDUCTIONS[i - 1], False)
            else:
                fns[1][i](False, v[1]) if isinstance(v, tuple) else fns[1][i](False)
    return saved


def _restore(saved: list) -> None:
    tf32, bf16, fp16 = saved
    if tf32 is None and bf16 is None and fp16 is None:
        return
    fns = _CUBLAS[0]
    m = torch.backends.cuda.matmul
    if isinstance(tf32, tuple):
        _CUBLAS[1][1]("cuda", "matmul", tf32[0])
    elif tf32 is not None:
        if fns is None:
            m.allow_tf32 = True
        else:
            fns[1][0](True)
    for i, v in ((1, bf16), (2, fp16)):
        if v is None:
            continue
        if fns is None:
            setattr(m, _REDUCTIONS[i - 1], v)
        else:
            fns[1][i](*v) if isinstance(v, tuple) else fns[1][i](v)


_REDUCTIONS = ("allow_bf16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction")


def _mkldnn_ieee() -> Optional[str]:
    """oneDNN's float32 matmul precision set to "ieee" where its effective value (its own, else its parents')
    is lower; returns the raw value to restore, None where nothing was written (or this PyTorch lacks the API)."""
    _probe()
    api = _CUBLAS[1]
    if api is None:
        return None
    get, put = api
    p = get("mkldnn", "matmul")
    effective = next((v for v in (p, get("mkldnn", "all"), get("generic", "all")) if v != "none"), "ieee")
    if effective == "ieee":
        return None
    put("mkldnn", "matmul", "ieee")
    return p


def _mkldnn_restore(saved: Optional[str]) -> None:
    if saved is not None:
        _CUBLAS[1][1]("mkldnn", "matmul", saved)


class _Held:
    """A process-wide setting switched by the first block to open (in any thread) and restored by the last to
    close, so one thread's block never ends another's."""

    __slots__ = ("lock", "depth", "saved", "switch", "restore")

    def __init__(self, switch, restore) -> None:
        self.lock, self.depth, self.saved, self.switch, self.restore = threading.Lock(), 0, None, switch, restore

    def enter(self) -> None:
        with self.lock:
            if self.depth == 0:
                self.saved = self.switch()
            self.depth += 1

    def exit(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                saved, self.saved = self.saved, None
                self.restore(saved)


_CUDA = _Held(_switch_exact, _restore)
_MKLDNN = _Held(_mkldnn_ieee, _mkldnn_restore)


class exact_cublas:
    """Context: TF32 off and no reduced-precision reductions in cuBLAS for the duration (cuBLAS reads these per
    call; a split-K setting stays as it is), the settings before restored after, and CUDA autocast off (it would
    run the GEMMs in bf16 / fp16). Only a setting that is on is written (with all off, the default, nothing is);
    TF32 through torch's newer ``fp32_precision`` API where this PyTorch has it (:func:`_tf32_off_new_api`), else
    the legacy setters. The settings are process-wide: the first block to open (in any thread) switches them and
    the last to close restores them, so a thread's block never ends another's (the other threads' own cuBLAS
    calls run exact meanwhile too)."""

    __slots__ = ("autocast",)

    def __enter__(self):
        self.autocast = None
        if torch.is_autocast_enabled("cuda"):
            self.autocast = torch.autocast("cuda", enabled=False)
            self.autocast.__enter__()
        try:
            _CUDA.enter()
        except BaseException:
            if self.autocast is not None:
                self.autocast.__exit__(None, None, None)
            raise

    def __exit__(self, *exc) -> None:
        try:
            if self.autocast is not None:
                self.autocast.__exit__(*exc)
        finally:
            _CUDA.exit()


class exact_float32:
    """Context: float32 matmuls on ``device_type`` ("cuda": :class:`exact_cublas`; "cpu": oneDNN's float32 matmul
    precision "ieee", restored after, counted across threads as exact_cublas is) at full float32 precision."""

    __slots__ = ("inner",)

    def __init__(self, device_type: str) -> None:
        self.inner = exact_cublas() if device_type == "cuda" else _MKLDNN if device_type == "cpu" else None

    def __enter__(self):
        if isinstance(self.inner, exact_cublas):
            self.inner.__enter__()
        elif self.inner is not None:
            self.inner.enter()

    def __exit__(self, *exc) -> None:
        if isinstance(self.inner, exact_cublas):
            self.inner.__exit__(*exc)
        elif self.inner is not None:
            self.inner.exit()


def exact_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` under :class:`exact_float32` for a's device type; inside ``torch.compile`` the plain product (the
    context switches process-wide settings, which dynamo does not trace)."""
    if torch.compiler.is_compiling():
        return a @ b
    with exact_float32(a.device.type):
        return a @ b
