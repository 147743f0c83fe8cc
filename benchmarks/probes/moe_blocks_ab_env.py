"""The env settings of the MoE prefill block-plan probes (moe_blocks_ab.py, moe_prefill_host.py)."""
import os

KEYS = ("MXKIT_MOE_WGMMA_BM", "MXKIT_MOE_MIXED", "MXKIT_WGMMA_PERSIST", "MXKIT_MOE_MIXED_SIZES",
        "MXKIT_MOE_MIXED_FROM")


def setenv(plan):
    """plan: default | s<bm> (one block size) | m (mixed 256 / 128 / 64, groups padded to 64) | f (mixed, groups
    padded to fit one block past their 256-row ones) | m32 / f32 (down to 32 rows); mixed plans from 48 pairs an
    expert; a last letter p / q / h: persistent on / off / on for 128-row launches alone."""
    for k in KEYS:
        os.environ.pop(k, None)
    if plan == "default":
        return
    if plan[-1] in "pqh":
        os.environ["MXKIT_WGMMA_PERSIST"] = {"p": "1", "q": "0", "h": "128"}[plan[-1]]
        plan = plan[:-1]
    if plan.startswith("s"):
        os.environ["MXKIT_MOE_WGMMA_BM"] = plan[1:]
        os.environ["MXKIT_MOE_MIXED"] = "0"
    elif plan[0] in "mf":
        os.environ["MXKIT_MOE_MIXED"] = "1" if plan[0] == "m" else "fit"
        os.environ["MXKIT_MOE_MIXED_FROM"] = "48"
        if len(plan) > 1:
            os.environ["MXKIT_MOE_MIXED_SIZES"] = plan[1:]
