"""Expert parallelism over ``torch.distributed`` (layer ``ops``): each rank holds a contiguous range of experts
and its own tokens; an all-to-all sends every (token, slot) pair to the rank that holds its expert and brings
the expert output back.

Per rank r holding experts ``ranges[r] = (lo_r, hi_r)`` (contiguous, covering [0, E), rank order) and tokens
x_r (T_r, H), :func:`ep_moe` does:

1. route locally (the router is replicated): ``topk_weights``, ``topk_ids`` (T_r, k);
2. sort the T_r·k pairs by destination rank (stable), exchange a header per rank (``all_to_all_single`` of int64:
   the count, whether this rank needs a gradient, whether its call passed validation, and its configuration:
   E, H, x's dtype, ``combine_dtype``, the activation, a checksum of the ranges; a rank whose call is bad, or
   ranks that disagree, make every rank raise there, before any data moves and without one rank left waiting
   in a collective), then ``all_to_all_single`` the pairs' token rows (x's dtype) and their (expert id, weight)
   metadata (float64: both exact);
3. on arrival, run the local experts on the received rows with top_k = 1 (:func:`mxkit.moe.moe_experts`,
   ``expert_range`` = this rank's range): each row becomes ``weight · expert(row)``;
4. ``all_to_all_single`` the rows back (``combine_dtype``), put them in pair order and sum the k pairs of each
   token in float64, then round once to x's dtype (:func:`mxkit.reference.round_from_float64`: no double
   rounding through float32 for bfloat16 / float16).

With ``combine_dtype=torch.float64`` (the default) and the reference backend, step 4 adds the same float64
products in the same order as one rank's :func:`~mxkit.moe_reference.combine_reference`, so the result equals
one rank holding every expert up to float64 matmul blocking (a float64 GEMM of other row counts may round
differently in the last bit; after the final rounding to float32 the outputs agree to 1 ulp and almost always
bit for bit). A narrower ``combine_dtype`` cuts the return traffic and adds one rounding per pair, and its range
bounds each pair's output: float16 overflows to ±Inf past 65504 (where x's own dtype might not), bfloat16 has
float32's range.

Autograd: steps 2 and 4 are autograd Functions (:class:`_Dispatch`, :class:`_Combine`) whose backwards run the
reverse exchanges (the counts swapped): the gradients of the expert outputs go back to the ranks that computed
them, those of the token rows and routing weights to the ranks that own the tokens. Where a gradient is needed
the local experts run the reference backend (float64, differentiable; the kernels have no backward). The counts
exchange also carries whether each rank needs a gradient (of x, router_logits or the expert biases): the backward
is collective, so every rank of the group must need one or none does. Each rank then runs both backwards, in the
same order (combine, then dispatch), also one where only the expert biases need a gradient (its peers still need
the gradients of the rows they sent it). Every exchange of a call, those a backward makes under
``create_graph=True`` included, is chained to the one before it by an empty token tensor (:class:`_Dispatch`), so
that every rank records the same exchanges and autograd runs them in one order on all of them, in a first backward
and in a second.

The gloo backend of torch 2.13 implements ``all_to_all_single`` with uneven split sizes on CPU (checked), so
no all_gather / send-recv fallback is needed; NCCL implements it on CUDA.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist

from .moe import moe_experts, resolve_moe_backend, route_tokens
from .moe_reference import check_moe_args
from .ops import needs_grad
from .reference import round_from_float64
from .tensor import MXTensor, as_int

__all__ = ["expert_ranges", "check_expert_ranges", "ep_moe", "group_position", "raise_collectively"]


def expert_ranges(num_experts: int, world_size: int) -> list[tuple[int, int]]:
    """Contiguous expert ranges, one per rank, as even as possible (the first ``num_experts % world_size`` ranks
    take one more). Either count may be a NumPy integer. The split is vLLM's default ``"linear"`` expert placement
    (``determine_expert_map``: rank r starts at ``r * (E // W) + min(r, E % W)``). Raises TypeError for a count that
    is not an integer (a bool included), ValueError if a rank would hold no expert."""
    num_experts, world_size = as_int(num_experts), as_int(world_size)
    for name, v in (("num_experts", num_experts), ("world_size", world_size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {v!r}")
    if not 1 <= world_size <= num_experts:
        raise ValueError(f"need 1 <= {world_size=} <= {num_experts=} (every rank holds at least one expert)")
    base, extra = divmod(num_experts, world_size)
    bounds = [0]
    for r in range(world_size):
        bounds.append(bounds[-1] + base + (r < extra))
    return list(zip(bounds[:-1], bounds[1:]))


def check_expert_ranges(ranges: Sequence[tuple[int, int]], num_experts: int,
                        world_size: int) -> tuple[tuple[int, int], ...]:
    """``ranges`` as a tuple of (lo, hi) tuples (an iterator read once) if it has one non-empty (lo, hi) per rank,
    contiguous in rank order, from 0 to ``num_experts``; else ValueError (TypeError for ranges that are not a
    sequence of pairs of ints, or counts that are not ints)."""
    num_experts, world_size = as_int(num_experts), as_int(world_size)
    for name, v in (("num_experts", num_experts), ("world_size", world_size)):
        if isinstance(v, bool) or not isinstance(v, int):  # ("8" made a misleading "[0, 8)" message)
            raise TypeError(f"{name} must be an int, got {v!r}")
    try:
        ranges = [tuple(as_int(v) for v in r) for r in ranges]  # (NumPy integers are integers)
    except TypeError:
        raise TypeError(f"expert ranges must be a sequence of (lo, hi) pairs, got {ranges!r}") from None
    if not all(len(r) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in r) for r in ranges):
        raise TypeError(f"expert ranges must be (lo, hi) pairs of ints, got {ranges}")
    ok = len(ranges) == world_size and len(ranges) > 0 and ranges[0][0] == 0 and ranges[-1][1] == num_experts
    ok = ok and all(lo < hi for lo, hi in ranges) and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    if not ok:
        raise ValueError(f"expert ranges {ranges} must be {world_size} contiguous non-empty (lo, hi) pairs in rank "
                         f"order covering [0, {num_experts})")
    return tuple(ranges)


# the header's fields after (count, needs a gradient): the call validated, then what every rank must agree on
_HEAD = ("ok", "the number of experts", "the hidden size", "the x dtype", "combine_dtype", "the activation",
         "the expert ranges")
_DTYPE_CODES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3, torch.float64: 4}
_ACTIVATION_CODES = {"swiglu_gpt_oss": 1, "swiglu": 2}
_OWNERS: dict = {}  # (ranges, device) -> the rank holding each expert id, int64 on the device


def _owners(ranges: Sequence[tuple[int, int]], device: torch.device) -> torch.Tensor:
    """The rank that holds each expert id under ``ranges`` (validated), made once per ranges and device (no host to
    device copy, and no host sync of ``repeat_interleave``, on later calls)."""
    key = (tuple(tuple(r) for r in ranges), device)
    t = _OWNERS.get(key)
    if t is None:
        if len(_OWNERS) >= 64:
            _OWNERS.clear()
        sizes = torch.tensor([hi - lo for lo, hi in ranges])
        t = _OWNERS[key] = torch.repeat_interleave(torch.arange(len(ranges)), sizes).to(device)
    return t


def _header_device(group) -> torch.device:
    """Where the header goes, the same on every rank whatever its inputs: the current GPU for a group whose backend
    is or may be NCCL ("nccl", "cpu:gloo,cuda:nccl", or "undefined" with CUDA present), else the CPU (gloo)."""
    backend = str(dist.get_backend(group))
    if "nccl" in backend or (backend == "undefined" and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def group_position(group: Optional[dist.ProcessGroup], who: str) -> tuple[int, int]:
    """(world size, rank) of this process in ``group`` (None: the world). Raises ValueError naming ``who`` where
    this process is not a member (torch.distributed's rank -1, which read as a world size of -1 or an index), and
    TypeError for a ``group`` that is neither None nor a ProcessGroup."""
    if not (group is None or isinstance(group, dist.ProcessGroup)  # ("foo": AttributeError .size)
            or group is dist.GroupMember.NON_GROUP_MEMBER):  # (new_group's answer on a rank outside it)
        raise TypeError(f"{who}: group must be a torch.distributed ProcessGroup or None, got {type(group).__name__}")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"{who}: this process (global rank {dist.get_rank()}) is not a member of the process "
                         f"group it was given")
    return world, rank


def raise_collectively(error: BaseException, group: Optional[dist.ProcessGroup] = None):
    """Raise ``error`` on this rank after joining :func:`ep_moe`'s header exchange as a rank whose call is bad, so
    that its peers in that exchange raise RuntimeError naming this rank instead of waiting in it: for a caller
    (``MXMoE.forward`` of a sharded module) that finds its input bad before it reaches ep_moe. Collective: the
    peers must be in ep_moe's call (or this same function) on ``group``."""
    _exchange_head(False, [0] * len(_HEAD), None, dist.get_world_size(group), group)  # count 0, not ok
    raise error


def _exchange_head(need: bool, fields: list, send_counts: Optional[torch.Tensor], world: int, group) -> list:
    """The header exchange: to each peer [pairs sent to it, needs a gradient, *fields] (``fields`` starting with
    ok); returns, per peer r, [pairs sent to r, then r's header for this rank] (one host sync)."""
    head = torch.tensor([0, int(need)] + fields, dtype=torch.int64, device=_header_device(group)).repeat(world, 1)
    if send_counts is not None:
        head[:, 0] = send_counts.to(head.device)
    head_in = torch.empty_like(head)
    dist.all_to_all_single(head_in, head, group=group)
    return torch.cat([head[:, :1], head_in], dim=1).tolist()


def _ranges_code(ranges: Sequence[tuple[int, int]]) -> int:
    """A checksum of the expert ranges, the same in every process (the header compares it across ranks)."""
    code = 0
    for lo, hi in ranges:
        code = (code * 1_000_003 + lo * 65_537 + hi) % (1 << 61)
    return code


def _exchange(send: torch.Tensor, send_counts: list[int], recv_counts: list[int], group) -> torch.Tensor:
    """all_to_all_single of the rows of ``send`` (grouped by destination rank, ``send_counts`` rows each)."""
    out = send.new_empty((sum(recv_counts),) + tuple(send.shape[1:]))
    dist.all_to_all_single(out, send.contiguous(), recv_counts, send_counts, group=group)
    return out


class _Dispatch(torch.autograd.Function):
    """Step 2's exchange of the (token, slot) pairs, grouped by destination rank (``send_counts`` pairs each).

    forward(rows (P, H) x's dtype, weights (P,) float, ids (P,) int64, token, send_counts, recv_counts, group): the
    rows, then (id, weight) as one float64 (P, 2) tensor (both exact), each in one ``all_to_all_single``. Returns
    the received ``rows_in`` (P_in, H), ``weights_in`` (P_in, 1) float32, ``ids_in`` (P_in, 1) int64 (not
    differentiable) and a token (an empty tensor: the exchange order, below). backward: the gradients of rows_in,
    then of weights_in (float32), each sent back through :class:`_Combine` with the counts swapped (zeros where
    autograd has none, so every rank issues both): an exchange autograd records under ``create_graph=True``, so
    second-order gradients cross the ranks too.

    The order of the exchanges: the tokens chain every exchange of a call to the one before it, in the forward
    (``token``: the previous exchange's, None for the first) and in each backward (a token's gradient is the next
    exchange's token), so that autograd runs them in one order on every rank. Without the chain, a rank whose
    experts got no pairs, or that holds no tokens, recorded fewer exchanges in the first backward, or ran them in
    another order in a second one, and the ranks' all_to_alls mismatched. The last exchange a backward makes (the
    routing weights' gradients) passes its token on to no one: a second backward runs it where the loss reaches its
    data, which is the same program, so the same on every rank.
    """

    @staticmethod
    def forward(ctx, rows, weights, ids, token, send_counts, recv_counts, group):
        ctx.counts, ctx.group, ctx.weights_dtype = (send_counts, recv_counts), group, weights.dtype
        meta = torch.stack([ids.to(torch.float64), weights.to(torch.float64)], dim=1)
        rows_in = _exchange(rows, send_counts, recv_counts, group)
        meta_in = _exchange(meta, send_counts, recv_counts, group)
        ids_in = meta_in[:, :1].to(torch.int64)
        ctx.mark_non_differentiable(ids_in)
        return rows_in, meta_in[:, 1:].to(torch.float32), ids_in, rows.new_empty(0)

    @staticmethod
    def backward(ctx, g_rows, g_weights, _, g_token):
        send_counts, recv_counts = ctx.counts
        g_rows, token = _Combine.apply(g_rows, g_token, recv_counts, send_counts, ctx.group)
        g_weights, _ = _Combine.apply(g_weights.to(torch.float32), token, recv_counts, send_counts, ctx.group)
        return g_rows, g_weights.view(-1).to(ctx.weights_dtype), None, None, None, None, None


class _Combine(torch.autograd.Function):
    """Step 4's exchange: the expert outputs y (P_in, H) back to the ranks that own their tokens (``send_counts``
    rows to each rank, ``recv_counts`` from each); returns them and a token (:class:`_Dispatch` says why). backward
    sends their gradients the other way, through itself, chained to this exchange's own token (so a second
    backward runs that exchange before this one's) and returning its token as the gradient of ``token`` (so the
    exchange before this one comes after it), so that a gradient taken with ``create_graph=True`` is differentiable
    again across the ranks."""

    @staticmethod
    def forward(ctx, y, token, send_counts, recv_counts, group):
        ctx.counts, ctx.group = (send_counts, recv_counts), group
        out = y.new_empty(0)
        ctx.save_for_backward(out)
        return _exchange(y, send_counts, recv_counts, group), out

    @staticmethod
    def backward(ctx, g, _):
        send_counts, recv_counts = ctx.counts
        (own,) = ctx.saved_tensors
        g, token = _Combine.apply(g, own, recv_counts, send_counts, ctx.group)
        return g, token, None, None, None


def ep_moe(
    x: torch.Tensor,
    w_gate_up: MXTensor,
    b_gate_up: Optional[torch.Tensor],
    w_down: MXTensor,
    b_down: Optional[torch.Tensor],
    router_logits: torch.Tensor,
    top_k: int,
    *,
    ranges: Sequence[tuple[int, int]],
    group: Optional[dist.ProcessGroup] = None,
    routing: str = "gpt_oss",
    activation: str = "swiglu_gpt_oss",
    backend: str = "auto",
    combine_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Expert-parallel :func:`mxkit.moe`: this rank's tokens through experts spread over the ranks of ``group``.

    x: (..., H) this rank's tokens (any count, 0 included); router_logits (..., E) for them.
    w_gate_up (E_r, 2I, H), b_gate_up (E_r, 2I) | None, w_down (E_r, H, I), b_down (E_r, H) | None: this rank's
      experts ``ranges[rank]``, E_r = hi - lo, as for :func:`mxkit.moe` with ``expert_range``.
    ranges: every rank's (lo, hi), e.g. :func:`expert_ranges` (E, world_size).
    group: the process group (default: the world). Collective: every rank of the group must call it.
    combine_dtype: dtype of the expert outputs on their way back (module docstring).
    backend: of the local experts (:func:`mxkit.moe`); where any rank needs a gradient, ``"reference"``.
    Returns (..., H) in x's dtype: what :func:`mxkit.moe` returns for these tokens with every expert on one rank.
    Differentiable with respect to x, router_logits and the expert biases (module docstring): the backward is
    collective too, every rank of the group must run it.
    Raises ValueError for a process outside ``group``, ranges that do not partition [0, E), weights that do not
    hold ``ranges[rank]``, a ``combine_dtype`` other than float32 / bfloat16 / float16 / float64, an unknown
    ``backend`` (or ``"triton"`` off CUDA; ImportError without Triton), and whatever
    :func:`mxkit.moe` raises for bad shapes, on the rank whose call is bad, and RuntimeError on its peers (TypeError
    for ranges that are not pairs of ints); RuntimeError
    on every rank when the ranks disagree on E, H, x's dtype, ``combine_dtype``, the activation or the ranges, or
    some need a gradient and others do not (all after the header exchange, before the data moves); RuntimeError
    under CUDA-graph capture (the exchange sizes are read on the host).
    Routing and activation are :func:`mxkit.moe`'s (its docstring names their sources: GPT-OSS / transformers);
    the exchange protocol (header, dispatch, combine; module docstring) is mxkit's own.
    """
    world, rank = group_position(group, "ep_moe")
    if isinstance(x, torch.Tensor) and x.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("ep_moe reads the pair counts of every rank on the host (its exchanges' sizes): it cannot "
                           "be captured in a CUDA graph; run the expert-parallel layer eagerly (or compiled without "
                           "CUDA graphs)")
    # validated before any data moves; a rank whose call is bad still joins the header exchange below (count 0,
    # not ok), so every rank of the group raises instead of its peers waiting in the next collective
    failure, fields = None, [0] * len(_HEAD)
    try:
        x2, weights, ids = route_tokens(x, router_logits, top_k, routing)
        (T, H), k, E = x2.shape, ids.shape[1], router_logits.shape[-1]
        ranges = check_expert_ranges(ranges, E, world)  # (a generator: read once, here)
        lo, hi = ranges[rank]
        check_moe_args(x2, w_gate_up, b_gate_up, w_down, b_down, weights, ids, activation=activation,
                       expert_range=(lo, hi), num_experts=E)
        if combine_dtype not in _DTYPE_CODES:
            raise ValueError(f"combine_dtype must be one of {list(_DTYPE_CODES)}, got {combine_dtype}")
        resolve_moe_backend(backend, x2.device)  # (an unknown name, or triton off CUDA: raised before the exchange)
        flat_ids = ids.reshape(-1).to(torch.int64)
        dest = _owners(ranges, ids.device)[flat_ids]
        send_counts_t = torch.bincount(dest, minlength=world)
        fields = [1, E, H, _DTYPE_CODES.get(x2.dtype, 0), _DTYPE_CODES[combine_dtype],
                  _ACTIVATION_CODES.get(activation, 0), _ranges_code(ranges)]
    except Exception as e:  # (any failure before the exchange: the peers must hear of it, not wait)
        failure = e
        send_counts_t = None

    # 2. the header: per peer, the pairs sent to it, whether this rank needs a gradient, its call's validity and
    # configuration; then the pairs, sorted by destination rank: their rows and metadata
    rows = _exchange_head(needs_grad(x, router_logits, b_gate_up, b_down), fields, send_counts_t, world, group)
    if failure is not None:
        raise failure
    bad = [r for r, row in enumerate(rows) if not row[3]]
    if bad:
        raise RuntimeError(f"ep_moe: rank(s) {bad} of the group raised on their inputs (their own error says why); "
                           "no data was exchanged")
    differ = [name for i, name in enumerate(_HEAD[1:], 4) if len({row[i] for row in rows}) > 1]
    if differ:
        raise RuntimeError(f"ep_moe: the ranks of the group disagree on {', '.join(differ)}: every rank must call it "
                           "with the same experts (E and ranges), hidden size, x dtype, combine_dtype and activation")
    send_counts, recv_counts, needs = [row[0] for row in rows], [row[1] for row in rows], [row[2] for row in rows]
    order = torch.sort(dest, stable=True).indices
    grad = any(needs)
    if grad and not all(needs):  # (every rank sees the same flags: all raise, none waits in the backward)
        raise RuntimeError(f"ep_moe under autograd: ranks {[r for r, n in enumerate(needs) if n]} of the group need a "
                           f"gradient (of x, router_logits or the expert biases) and ranks "
                           f"{[r for r, n in enumerate(needs) if not n]} do not; the backward is collective, so all "
                           "or none must")
    weights = weights.reshape(-1)[order]
    if grad and not weights.requires_grad:
        # only the expert biases need a gradient here, but the peers need their rows' back: a throwaway leaf puts
        # both exchanges in this rank's graph (the experts' output depends on the weights received)
        weights = weights.detach().requires_grad_()
    # (the first exchange: no token before it; _Dispatch's docstring)
    rows_in, weights_in, ids_in, token = _Dispatch.apply(x2[order // k], weights, flat_ids[order], None,
                                                         send_counts, recv_counts, group)

    # 3. the local experts, one pair per row (top_k = 1): weight * expert(row)
    y_local = moe_experts(rows_in, w_gate_up, b_gate_up, w_down, b_down, weights_in, ids_in, activation=activation,
                          out_dtype=combine_dtype, expert_range=(lo, hi), num_experts=E,
                          backend="reference" if grad else backend)
    if grad and rows_in.shape[0] == 0:
        # no pair reached these experts: their biases get a zero gradient (as on one rank, where every expert's
        # bias is in the graph), not None
        y_local = y_local + sum(b.sum() * 0 for b in (b_gate_up, b_down) if b is not None)

    # 4. back to the owners of the tokens, into pair order, summed over the k slots, rounded once
    y_back = _Combine.apply(y_local, token, recv_counts, send_counts, group)[0].to(torch.float64)
    pairs = y_back.new_zeros(T * k, H).index_copy(0, order, y_back)
    return round_from_float64(pairs.view(T, k, H).sum(1), x.dtype).reshape(x.shape)
