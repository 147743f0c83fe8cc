"""cuBLAS with float32 accumulation and nothing less: :class:`exact_cublas` switches TF32 and the bf16 / fp16
reduced-precision reductions off around a call (only where one is on) and restores them; :func:`dense_gemm` and
:func:`fp32_gemm` are the exact paths' GEMMs under it (:mod:`mxkit.kernels.matmul`)."""

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


_CUBLAS: list = []  # [_cublas_flags(), _fp32_precision_api()], filled at the first use


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


_LOCK = threading.Lock()
_HELD = [0, None]  # [exact_cublas blocks open, in any thread; the settings the first one saved]


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
            with _LOCK:
                if _HELD[0] == 0:
                    _HELD[1] = _switch_exact()
                _HELD[0] += 1
        except BaseException:
            if self.autocast is not None:
                self.autocast.__exit__(None, None, None)
            raise

    def __exit__(self, *exc) -> None:
        if self.autocast is not None:
            self.autocast.__exit__(*exc)
        with _LOCK:
            _HELD[0] -= 1
            if _HELD[0] == 0:
                saved, _HELD[1] = _HELD[1], None
                _restore(saved)


def _switch_exact() -> list:
    """TF32 and the reduced-precision reductions off where on; returns what :func:`_restore` puts back."""
    if not _CUBLAS:
        _CUBLAS.append(_cublas_flags())
        _CUBLAS.append(_fp32_precision_api())
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


def fp32_gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T for float32 x, w with TF32 off (the fp32-exact path and the float32 route of special rows)."""
    with exact_cublas():
        return x @ w.t()


def dense_gemm(x: torch.Tensor, w: torch.Tensor, out: torch.dtype) -> torch.Tensor:
    """x @ w.T for 16-bit x, w with float32 accumulation; output in ``out`` with one rounding."""
    with exact_cublas():
        if out == x.dtype or x.device.type != "cuda":
            return (x @ w.t()) if x.device.type == "cuda" else (x.float() @ w.float().t()).to(out)
        try:
            return torch.mm(x, w.t(), out_dtype=torch.float32)
        except (RuntimeError, TypeError):
            return x.float() @ w.float().t()
