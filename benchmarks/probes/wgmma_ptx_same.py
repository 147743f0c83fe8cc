"""Whether a change to the w16 wgmma kernel's source changed its code: the PTX of every case of
``test_w4a16_wgmma_compiles_for_sm90`` (compiled for sm_90 on the CPU by the installed Triton), written to a folder,
and two such folders compared instruction by instruction (line info, labels' numbers and debug sections left out).

    python benchmarks/probes/wgmma_ptx_same.py dump DIR       # at the old commit, then at the new one
    python benchmarks/probes/wgmma_ptx_same.py compare OLD NEW

Session 66 split the kernel per weight layout (its layouts from constexpr arguments to closure constexprs of
``_layout_wgmma`` / ``_layout_mma``): all 31 kernels the same instructions as before.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _norm(ptx: str) -> list:
    body = ptx.split(".section", 1)[0]
    out = []
    for line in body.splitlines():
        line = re.sub(r"//.*", "", line).rstrip()
        if not line.strip() or re.match(r"\s*\.(loc|file)\b", line) or re.fullmatch(r"\$L__tmp\d+:", line.strip()):
            continue
        out.append(re.sub(r"\$L__tmp\d+", "TMP", line))
    return out


def dump(folder: pathlib.Path) -> None:
    import triton

    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "tests" / "kernel_tests")]
    import test_matmul as T

    folder.mkdir(parents=True, exist_ok=True)
    test = T.test_w4a16_wgmma_compiles_for_sm90
    cases = next(m.args[1] for m in test.pytestmark if m.name == "parametrize")
    compile_ = triton.compile
    got = []

    def keep(src, target=None, options=None):
        k = compile_(src, target=target, options=options)
        got.append(k.asm["ptx"])
        return k

    triton.compile = keep
    for case in cases:
        got.clear()
        test(*case)
        for i, ptx in enumerate(got):
            (folder / ("_".join(map(str, case)) + f"_{i}.ptx")).write_text(ptx)
    print(f"{len(list(folder.glob('*.ptx')))} kernels in {folder}")


def compare(old: pathlib.Path, new: pathlib.Path) -> int:
    names = sorted(p.name for p in old.glob("*.ptx"))
    differ = [n for n in names
              if not (new / n).exists() or _norm((old / n).read_text()) != _norm((new / n).read_text())]
    for n in differ:
        print("differs:", n)
    print(f"{len(names) - len(differ)} of {len(names)} kernels the same instructions")
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["dump"]:
        dump(pathlib.Path(sys.argv[2]))
    else:
        sys.exit(compare(pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])))
