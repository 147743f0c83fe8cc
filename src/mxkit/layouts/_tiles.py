"""The host (PyTorch) swizzle shared by the scale layouts: every swizzled layout here stores the padded
(R, C) scale as tiles of ``tile = (tr, tc)`` bytes in row-major tile order, each tile permuted by the layout's
byte-offset formula (the same function the kernels call, so the formula is written once per layout)."""

from __future__ import annotations

from typing import Callable

import torch

from .._cache import traced_cache


@traced_cache
def _tile_perm(offsets: Callable, tr: int, tc: int) -> torch.Tensor:
    """perm[k] = stored offset, inside one tile, of the tile's row-major byte k (offsets of a tile-wide scale)."""
    # on the CPU whatever torch's default device (the cached permutation is moved to each caller's device)
    r = torch.arange(tr, device="cpu").view(tr, 1)
    c = torch.arange(tc, device="cpu").view(1, tc)
    perm = offsets(r, c, tc).reshape(-1)
    if not torch.compiler.is_compiling():  # (dynamo does not trace the sort of a list)
        assert sorted(perm.tolist()) == list(range(tr * tc)), "the offsets of one tile must be a permutation of it"
    return perm


def swizzle(padded: torch.Tensor, tile: tuple, offsets: Callable) -> torch.Tensor:
    """padded (R, C) uint8, R % tr == C % tc == 0 -> (R, C) uint8 whose flat bytes are the layout's."""
    (tr, tc), (R, C) = tile, padded.shape
    tiles = padded.view(R // tr, tr, C // tc, tc).permute(0, 2, 1, 3).reshape(-1, tr * tc)
    out = torch.empty_like(tiles)
    out[:, _tile_perm(offsets, tr, tc).to(padded.device)] = tiles
    return out.view(R, C)


def unswizzle(stored: torch.Tensor, R: int, C: int, tile: tuple, offsets: Callable) -> torch.Tensor:
    """The inverse of :func:`swizzle`: stored (R * C bytes, any shape) -> padded (R, C) uint8."""
    tr, tc = tile
    tiles = stored.reshape(-1, tr * tc)[:, _tile_perm(offsets, tr, tc).to(stored.device)]
    return tiles.view(R // tr, C // tc, tr, tc).permute(0, 2, 1, 3).reshape(R, C)
