"""Probe: persistent-grid and TMA (tensor descriptor) variants of the quantize kernel body.

Same jit helpers as mxkit.kernels._quantize (so the bytes are the same function); only the tile loop and
the load change:
  * ptr:   one tile per program (the production launcher's grid), pointer loads;
  * pers:  persistent grid (SMs * k programs), tl.range over tiles with num_stages, pointer loads;
  * tma:   persistent grid, x read through a host TensorDescriptor (TMA, bulk copies into shared memory,
           pipelined num_stages deep by Triton when it can).

    PYTHONPATH=src python3 scripts/probe_tma.py            # GPU: check bytes + time, table last
    PYTHONPATH=src python3 scripts/probe_tma.py --ir       # no GPU: sm_90 build, was the load pipelined?
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

import torch
import triton
import triton.language as tl

from mxkit.kernels import _quantize as K
from mxkit.kernels import quantize as kq
from mxkit.reference import quantize_reference


@triton.jit
def _q_persistent(
    x_desc, x_ptr, qr_ptr, sr_ptr, qc_ptr, sc_ptr,
    R, C, tiles_r, tiles_c, colsp_r, colsp_c, scale_mode, nprog,
    DO_ROW: tl.constexpr, DO_COL: tl.constexpr,
    BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
    IS_INT: tl.constexpr, MAX_NORMAL: tl.constexpr, MAX_FRAC: tl.constexpr, AWAY: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, DENORM_BRANCH: tl.constexpr, HW_CVT: tl.constexpr,
    COL_DIRECT: tl.constexpr, USE_TMA: tl.constexpr, STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    ntiles = tiles_r * tiles_c
    for t in tl.range(pid, ntiles, nprog, num_stages=STAGES):
        pc = t % tiles_c
        pr = t // tiles_c
        r = pr * BLOCK_R + tl.arange(0, BLOCK_R)
        c = pc * BLOCK_C + tl.arange(0, BLOCK_C)
        if USE_TMA:
            raw = x_desc.load([pr * BLOCK_R, pc * BLOCK_C]).to(tl.int16, bitcast=True)
        else:
            raw = tl.load(x_ptr + r[:, None] * C + c[None, :])
        rmask = r < R
        cmask = c < C
        if DO_ROW:
            codes, sbyte = K._quantize_rows(K._to_bits(raw, 1), BLOCK_R, BLOCK_C, BITS, MBITS, EMIN, EMAX, IS_INT,
                                            MAX_NORMAL, MAX_FRAC, scale_mode, AWAY, DENORM_BRANCH, HW_CVT)
            K._store_quantized(qr_ptr, sr_ptr, codes, sbyte, r, rmask, pc * BLOCK_C, C, colsp_r,
                               BLOCK_R, BLOCK_C, BITS, 0, False)
        if DO_COL and COL_DIRECT:
            codes, sbyte = K._quantize_cols(K._to_bits(raw, 1), BLOCK_R, BLOCK_C, BITS, MBITS, EMIN, EMAX, IS_INT,
                                            MAX_NORMAL, MAX_FRAC, scale_mode, AWAY, DENORM_BRANCH, HW_CVT)
            K._store_cols_direct(qc_ptr, sc_ptr, codes, sbyte, c, cmask, pr * BLOCK_R, R, colsp_c,
                                 BLOCK_C, BLOCK_R, BITS, 0, False)
        elif DO_COL:
            codes, sbyte = K._quantize_rows(K._to_bits(tl.trans(raw), 1), BLOCK_C, BLOCK_R, BITS, MBITS, EMIN, EMAX,
                                            IS_INT, MAX_NORMAL, MAX_FRAC, scale_mode, AWAY, DENORM_BRANCH, HW_CVT)
            K._store_quantized(qc_ptr, sc_ptr, codes, sbyte, c, cmask, pr * BLOCK_R, R, colsp_c,
                               BLOCK_C, BLOCK_R, BITS, 0, False)


_SMS = None



def _data(lead, n, f, device):
    """The qdata view the kernel writes: uint8 (*lead, n packed), int32 words for FP6."""
    q = torch.empty(*lead, n * f.pack_bytes // f.pack, dtype=torch.uint8, device=device)
    return q.view(torch.int32) if f.bits == 6 else q


def launch(x, fmt, kind, mode, br, bc, warps, stages, use_tma, per_sm=None, cd=False, db=False, out=None):
    """x: bf16 [R, C] CUDA, tiles dividing it. kind rows | cols | ct. Returns (q, s) or (qr, sr, qc, sc)."""
    global _SMS
    f = kq.get_format(fmt)
    R, C = x.shape
    do_row, do_col = kind in ("rows", "ct"), kind in ("cols", "ct")
    if out is None:
        out = []
        if do_row:
            out += [_data((R,), C, f, x.device)] + [torch.empty(R, C // 32, dtype=torch.uint8,
                                                                                device=x.device)]
        if do_col:
            out += [_data((C,), R, f, x.device)] + [torch.empty(C, R // 32, dtype=torch.uint8,
                                                                                device=x.device)]
    qr, sr = (out[0], out[1]) if do_row else (None, None)
    qc, sc = (out[-2], out[-1]) if do_col else (None, None)
    dummy = out[0]
    tiles_r, tiles_c = R // br, C // bc
    ntiles = tiles_r * tiles_c
    if _SMS is None:
        _SMS = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
    grid = (ntiles,) if per_sm is None else (min(ntiles, _SMS * per_sm),)
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        desc = TensorDescriptor.from_tensor(x, [br, bc])
    else:
        desc = x  # unused
    hw = f.is_float and f.bits == 8 and x.is_cuda
    _q_persistent[grid](
        desc, x.view(torch.int16), qr if qr is not None else dummy, sr if sr is not None else dummy,
        qc if qc is not None else dummy, sc if sc is not None else dummy,
        R, C, tiles_r, tiles_c, 0, 0, kq._MODE[kq.ScaleMode.parse(mode)], grid[0],
        DO_ROW=do_row, DO_COL=do_col, AWAY=False, BLOCK_R=br, BLOCK_C=bc, DENORM_BRANCH=db, HW_CVT=hw,
        COL_DIRECT=cd, USE_TMA=use_tma, STAGES=stages, num_warps=warps, **kq._format_constexprs(f),
    )
    return out


def variants():
    """(path, kind, fmt, name, kwargs or None for the production default)."""
    V = []
    for fmt, tag in (("mxfp8_e4m3", "fp8"), ("mxfp4_e2m1", "fp4")):
        p = f"rows {tag}"
        V.append((p, "rows", fmt, "default", None))
        V.append((p, "rows", fmt, "ptr grid 16x256w4", dict(br=16, bc=256, warps=4, stages=1, use_tma=False, db=True)))
        V.append((p, "rows", fmt, "pers 16x256w8x4", dict(br=16, bc=256, warps=8, stages=1, use_tma=False, per_sm=4,
                                                            db=True)))
        for br, bc, w, s, k, db in ((16, 256, 4, 3, 4, True), (16, 256, 4, 3, 4, False), (16, 256, 8, 3, 4, True),
                                    (32, 256, 8, 3, 2, True), (8, 256, 4, 3, 8, True), (8, 512, 4, 3, 4, True),
                                    (16, 256, 4, 4, 4, False), (32, 128, 4, 3, 4, False), (8, 256, 2, 3, 8, False)):
            V.append((p, "rows", fmt, f"tma {br}x{bc}w{w}s{s}x{k}{' db' if db else ''}",
                      dict(br=br, bc=bc, warps=w, stages=s, use_tma=True, per_sm=k, db=db)))
    for fmt, tag in (("mxfp8_e4m3", "fp8"), ("mxfp4_e2m1", "fp4")):
        for kind in ("cols", "ct"):
            p = f"{kind} {tag}"
            V.append((p, kind, fmt, "default", None))
            for br, bc, w, s, k, cd in ((32, 64, 2, 3, 8, False), (32, 64, 2, 3, 8, True), (32, 64, 4, 3, 8, False),
                                        (64, 64, 4, 3, 4, False), (64, 64, 4, 3, 4, True), (64, 64, 8, 3, 4, True),
                                        (64, 64, 8, 3, 4, False), (32, 128, 4, 3, 4, True), (64, 128, 8, 3, 2, True),
                                        (128, 64, 8, 3, 2, True)):
                V.append((p, kind, fmt, f"tma {br}x{bc}w{w}s{s}x{k}{' cd' if cd else ''}",
                          dict(br=br, bc=bc, warps=w, stages=s, use_tma=True, per_sm=k, cd=cd)))
    return V


def run_default(kind, x, fmt, mode):
    if kind == "rows":
        return list(kq._quantize_impl(x, fmt, -1, mode, "rne", "plain"))
    if kind == "cols":
        return list(kq._quantize_impl(x, fmt, 0, mode, "rne", "plain"))
    return list(kq._cast_transpose_impl(x, fmt, mode, "rne", "plain"))


def ir_report(cases_text: str = ""):
    """Offline sm_90 build of a few variants: registers, shared memory, and whether the TTGIR has the
    async TMA copies / cp.async of a pipelined load."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    f = kq.get_format("mxfp8_e4m3")

    import ast

    # (kind, block_r, block_c, warps, stages, tma, col_direct) tuples
    cases = ast.literal_eval(cases_text) if cases_text else (
        ("rows", 32, 256, 4, 3, True, False), ("cols", 64, 64, 4, 3, True, True))
    for kind, br, bc, w, s, tma, cd in cases:
        sig = {"x_desc": f"tensordesc<bf16[{br},{bc}]>" if tma else "*i16", "x_ptr": "*i16",
               "qr_ptr": "*u8", "sr_ptr": "*u8", "qc_ptr": "*u8", "sc_ptr": "*u8"}
        for a in ("R", "C", "tiles_r", "tiles_c", "colsp_r", "colsp_c", "scale_mode", "nprog"):
            sig[a] = "i32"
        cx = dict(DO_ROW=kind in ("rows", "ct"), DO_COL=kind in ("cols", "ct"), AWAY=False, BLOCK_R=br, BLOCK_C=bc,
                  DENORM_BRANCH=os.environ.get("DB", "1") == "1", HW_CVT=os.environ.get("HW", "1") == "1", COL_DIRECT=cd, USE_TMA=tma, STAGES=s, **kq._format_constexprs(f))
        for a in cx:
            sig[a] = "constexpr"
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(1, 6)}
        k = triton.compile(ASTSource(_q_persistent, sig, constexprs=cx, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": w})
        ttg = k.asm["ttgir"]
        ptx = k.asm["ptx"]
        import subprocess
        import tempfile

        bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
            fh.write(k.asm["cubin"])
        res = subprocess.run([os.path.join(bindir, "cuobjdump"), "--dump-resource-usage", fh.name],
                             capture_output=True, text=True).stdout
        os.unlink(fh.name)
        regs = re.search(r"REG:(\d+)", res)
        print(f"{kind} {br}x{bc} w{w} s{s} tma={tma} cd={cd}: regs {regs.group(1) if regs else '?'} smem {k.metadata.shared} "
              f"tma_copies {ttg.count('async_tma_copy_global_to_local')} cp.async {ptx.count('cp.async.ca') + ptx.count('cp.async.cg')} "
              f"bulk {ptx.count('cp.async.bulk.tensor')} mbarrier.wait {ptx.count('mbarrier.try_wait')}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ir", nargs="?", const="", default=None, help="offline build; optional tuple of cases")
    ap.add_argument("--dry", action="store_true", help="CPU interpreter byte check (TRITON_INTERPRET=1)")
    ap.add_argument("--budget-s", type=float, default=420.0)
    args = ap.parse_args()
    if args.ir is not None:
        ir_report(args.ir)
        return
    if args.dry:  # CPU interpreter: bytes of every variant on a small wide-range tensor
        import triton.runtime.interpreter as ti

        # triton 3.6's interpreter turns 1-element arrays into loop bounds with int(), which numpy 2 rejects
        _orig = ti._patch_lang_tensor

        def _patched(tensor, scope):
            _orig(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

        ti._patch_lang_tensor = _patched
        gen = torch.Generator().manual_seed(2)
        xw = (torch.randn(256, 256, generator=gen)
              * torch.exp2(torch.randint(-30, 31, (256, 1), generator=gen).float())).to(torch.bfloat16)
        seen = set()
        for path, kind, fmt, name, kw in variants():
            if kw is None or (kind, fmt, kw.get("use_tma"), kw.get("cd")) in seen:
                continue
            seen.add((kind, fmt, kw.get("use_tma"), kw.get("cd")))
            got = launch(xw, fmt, kind, "rceil", **kw)
            exp = []
            for ax in ((-1,) if kind == "rows" else (0,) if kind == "cols" else (-1, 0)):
                r = quantize_reference(xw, fmt, axis=ax, scale_mode="rceil")
                exp += [r.qdata, r.scale]
            ok = all(torch.equal(a.view(torch.uint8).reshape(-1), b.view(torch.uint8).reshape(-1))
                     for a, b in zip(got, exp))
            print(f"{path:9s} {name:26s} {'ok' if ok else 'MISMATCH'}", flush=True)
        return
    import triton.testing as tt

    t0 = time.time()
    dev = torch.cuda.get_device_name()
    print(f"# {dev} torch {torch.__version__} triton {triton.__version__}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(1)
    n = 8192
    xw = (torch.randn(n, n, device="cuda", generator=gen)
          * torch.exp2(torch.randint(-30, 31, (n, 1), device="cuda", generator=gen).float())).to(torch.bfloat16)
    refs = {}

    def ref(kind, fmt, mode):
        key = (kind, fmt, mode)
        if key not in refs:
            if kind == "ct":
                refs[key] = ref("rows", fmt, mode) + ref("cols", fmt, mode)
            else:
                r = quantize_reference(xw, fmt, axis=-1 if kind == "rows" else 0, scale_mode=mode)
                refs[key] = [r.qdata, r.scale]
        return refs[key]

    rows = []
    xs = {s: torch.randn(s, s, device="cuda", dtype=torch.bfloat16, generator=gen) for s in (8192, 16384)}
    copy = {}
    for s, x in xs.items():
        d = torch.empty_like(x)
        copy[s] = tt.do_bench(lambda: d.copy_(x), warmup=10, rep=60, return_mode="median") * 1e3
        print(f"copy {s}: {copy[s]:.1f} us {4 * s * s / copy[s] / 1e3:.0f} GB/s", flush=True)
    for path, kind, fmt, name, kw in variants():
        if time.time() - t0 > args.budget_s:
            rows.append((path, name, None, None, "skipped"))
            continue
        f = kq.get_format(fmt)

        def fn(x, mode="floor"):
            return run_default(kind, x, fmt, mode) if kw is None else launch(x, fmt, kind, mode, **kw)

        try:
            st = "ok"
            for mode in ("floor", "rceil"):
                got = fn(xw, mode)
                exp = ref(kind, fmt, mode)
                for a, b in zip(got, exp):
                    if not torch.equal(a.view(torch.uint8).reshape(-1), b.view(torch.uint8).reshape(-1)):
                        st = f"MISMATCH({mode})"
            res = []
            for s, x in xs.items():
                qb = s * s * f.pack_bytes // f.pack + s * s // 32
                nb = 2 * s * s + (2 * qb if kind == "ct" else qb)
                if kw is None:
                    t = tt.do_bench(lambda: fn(x), warmup=10, rep=60, return_mode="median") * 1e3
                else:
                    out = launch(x, fmt, kind, "floor", **kw)
                    t = tt.do_bench(lambda: launch(x, fmt, kind, "floor", out=out, **kw), warmup=10, rep=60,
                                    return_mode="median") * 1e3
                res.append((t, 100 * nb / t / (4 * s * s / copy[s])))
            rows.append((path, name, res[0], res[1], st))
            print(f"{path:9s} {name:26s} {res[0][0]:7.1f} us {res[0][1]:5.1f}%  {res[1][0]:7.1f} us {res[1][1]:5.1f}%  {st}",
                  flush=True)
        except Exception as e:
            msg = " ".join(str(e).split())[-200:]
            rows.append((path, name, None, None, f"ERR {type(e).__name__}: {msg}"))
            print(f"{path:9s} {name:26s} ERR {type(e).__name__}: {msg}", flush=True)
    lines = [f"== probe ({dev}; median L2 flushed; %copy vs torch copy same run: 8192^2 {copy[8192]:.1f} us, "
             f"16384^2 {copy[16384]:.1f} us)"]
    for path, name, a, b, st in rows:
        fa = f"{a[0]:7.1f} {a[1]:5.1f}" if a else "      -     -"
        fb = f"{b[0]:7.1f} {b[1]:5.1f}" if b else "      -     -"
        lines.append(f"{path:9s} {name:26s} {fa} {fb}  {st}")
    lines.append(f"== {time.time() - t0:.0f} s")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ab_quantize import emit_table

    emit_table(lines, "probe_table.txt")


if __name__ == "__main__":
    main()
