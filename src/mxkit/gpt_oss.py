"""GPT-OSS checkpoints: the MXFP4 experts of a Hugging Face safetensors directory as :class:`~mxkit.MXTensor` s,
loaded memory-mapped and saved back byte for byte, never dequantized on the way (layer ``nn``: imports ``tensor``,
``ops`` and ``_table``).

Checkpoint layout of decoder layer ``i`` (E experts, hidden H, expert intermediate I; prefix
``model.layers.{i}.mlp.``), matched to transformers 5.23: ``integrations/mxfp4.py`` (``_convert_moe_packed_tensors``,
the dequantizer), ``quantizers/quantizer_mxfp4.py`` (``Mxfp4HfQuantizer.serialized_names``) and
``models/gpt_oss/modeling_gpt_oss.py`` (``GptOssExperts``, ``GptOssTopKRouter``):

* ``experts.gate_up_proj_blocks`` uint8 [E, 2I, H/32, 16], ``experts.gate_up_proj_scales`` uint8 [E, 2I, H/32],
  ``experts.gate_up_proj_bias`` bf16 [E, 2I];
* ``experts.down_proj_blocks`` uint8 [E, H, I/32, 16], ``experts.down_proj_scales`` uint8 [E, H, I/32],
  ``experts.down_proj_bias`` bf16 [E, H];
* ``router.weight`` bf16 [E, H], ``router.bias`` bf16 [E].

Conventions (each with the line of transformers it is read from):

* a block's 16 bytes hold its 32 E2M1 codes, element 2j in the low nibble of byte j
  (``sub[:, 0::2] = lut[blk & 0x0F]``, ``sub[:, 1::2] = lut[blk >> 4]``): blocks [E, N, G, 16] reshaped to
  [E, N, G·16] are exactly mxkit's FP4 ``qdata`` of an [E, N, K = 32·G] tensor quantized along its last axis;
* a scale byte s means 2^(s − 127) (``torch.ldexp(sub, scales - 127)``): E8M0. Byte 0xFF is NaN for mxkit
  (OCP MX v1.0 §5.4) and 2^128 for transformers; GPT-OSS checkpoints hold neither;
* weights are [E, N, K] in the checkpoint (output rows N, input K along the blocks), while transformers'
  dequantized ``GptOssExperts.gate_up_proj`` is [E, H, 2I] and ``down_proj`` [E, I, H], i.e. [E, K, N]
  (``_convert_moe_packed_tensors`` ends in ``.transpose(1, 2)``); :func:`hf_state_dict` transposes;
* gate_up rows interleave gate (even rows) and up (odd rows) (``GptOssExperts._apply_gate``:
  ``gate_up[..., ::2], gate_up[..., 1::2]``).

A directory is ``config.json`` (``model_type`` ``"gpt_oss"``, ``quantization_config`` ``{"quant_method": "mxfp4",
"modules_to_not_convert": [...]}``) plus either ``model.safetensors`` or shards listed by
``model.safetensors.index.json`` (``{"metadata": {"total_size": bytes}, "weight_map": {tensor: file}}``, each file a
path relative to the directory, subfolders allowed, ``..`` and absolute paths not).

Errors: :class:`CheckpointError` (a ValueError) names the tensor and the file for a missing, misshapen or mistyped
tensor, and the file for an unreadable (truncated, corrupt) one.

The code is in :mod:`mxkit.gpt_oss_details`, one file per concern: ``_layout`` (names, shapes, config.json,
safetensors headers, the blocks / scales view), ``_read``, ``_write``, ``_synthetic``, ``_summary`` (``mxkit inspect
DIR``) and ``_hf`` (transformers' model with the experts dequantized).
"""

from .gpt_oss_details._hf import hf_config, hf_state_dict, load_hf_model
from .gpt_oss_details._layout import (BLOCK, BLOCK_BYTES, INDEX_NAME, MOE_ROLES, REAL_20B_CONFIG, SINGLE_NAME,
                                      CheckpointError, GptOssDims, blocks_from_mxtensor, is_gpt_oss_mxfp4_dir,
                                      moe_tensor_name, mxtensor_from_blocks)
from .gpt_oss_details._read import GptOssCheckpoint, GptOssMoE, load_gpt_oss
from .gpt_oss_details._summary import GptOssSummary, print_gpt_oss_summary, summarize_gpt_oss
from .gpt_oss_details._synthetic import write_synthetic_gpt_oss
from .gpt_oss_details._write import save_gpt_oss

__all__ = [
    "CheckpointError",
    "GptOssDims",
    "GptOssMoE",
    "GptOssCheckpoint",
    "GptOssSummary",
    "MOE_ROLES",
    "REAL_20B_CONFIG",
    "moe_tensor_name",
    "mxtensor_from_blocks",
    "blocks_from_mxtensor",
    "is_gpt_oss_mxfp4_dir",
    "load_gpt_oss",
    "save_gpt_oss",
    "write_synthetic_gpt_oss",
    "summarize_gpt_oss",
    "print_gpt_oss_summary",
    "hf_state_dict",
    "hf_config",
    "load_hf_model",
]
