"""Modules and model conversion: :class:`MXLinear`, :func:`quantize_model` (layer ``nn``; imports ``ops``)."""

from .linear import LayerReport, MXLinear, qsnr_db, quantize_model
from .fused import FusedMXLinear, FusedPart, fuse_siblings  # q / k / v and gate / up as one GEMM
from .gated_mlp import MXGatedMLP, fuse_gated_mlp  # gate / up and SwiGLU as one GEMM and its epilogue
from .moe import MXMoE  # MoE layer
from .gpt_oss import load_gpt_oss_model, swap_gpt_oss_moe  # GPT-OSS conversion and loading
from .parallel import ColumnParallelMXLinear, RowParallelMXLinear, shard_mxlinear  # tensor parallelism

__all__ = ["MXLinear", "LayerReport", "quantize_model", "qsnr_db", "fuse_siblings", "FusedMXLinear", "FusedPart",
           "MXGatedMLP", "fuse_gated_mlp", "MXMoE", "load_gpt_oss_model", "swap_gpt_oss_moe", "ColumnParallelMXLinear",
           "RowParallelMXLinear", "shard_mxlinear"]
