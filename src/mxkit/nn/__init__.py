"""Modules and model conversion: :class:`MXLinear`, :func:`quantize_model` (layer ``nn``; imports ``ops``)."""

from .linear import LayerReport, MXLinear, qsnr_db, quantize_model

__all__ = ["MXLinear", "LayerReport", "quantize_model", "qsnr_db"]
