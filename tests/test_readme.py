"""README.md's API example must run as written (CPU), and its quick-start test command must be the one
.ci/run executes."""

import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_api_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "README.md has no python example"
    ns: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), ns)  # noqa: S102 - our own documentation
    q, y, out = ns["q"], ns["y"], ns["out"]
    assert tuple(q.qdata.shape) == (4096, 2048) and tuple(q.scale.shape) == (4096, 128)
    assert y.shape == (4096, 4096) and y.dtype == torch.bfloat16
    assert out.shape == (8, 1024)
    assert ns["q_nv"].scale_layout == "nvidia_128x4"
    assert "torch.Size([2, 64])" in capsys.readouterr().out
    x = torch.randn(3, 256)
    with torch.no_grad():  # the model saved and loaded into freshly quantized layers: the same bytes out
        assert torch.equal(ns["fresh"](x), ns["model"](x))
        assert torch.equal(ns["fresh"][0].weight_qdata, ns["model"][0].weight_qdata)


def test_readme_gemm_example_runs(capsys):
    """The scaled-GEMM example (on CPU here: the reference) runs as written, its operands defined in it."""
    block = next(b for b in re.findall(r"```python\n(.*?)```", README, flags=re.S) if "pack_weight(" in b)
    ns: dict = {}
    exec(compile("import torch, mxkit\n" + block, "README.md", "exec"), ns)  # noqa: S102 - our own documentation
    assert ns["y"].shape == (8, 4096) and ns["y"].dtype == torch.bfloat16
    assert capsys.readouterr().out.strip()  # (gemm_plan's reason)


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "<!-- test-command -->" in ci and "<!-- test-command -->" in README
    after = README.split("<!-- test-command -->", 1)[1]
    cmd = next(line for line in after.splitlines() if line.strip() and not line.startswith(("```", "<!--")))
    assert "pytest" in cmd and "pip install" in cmd
