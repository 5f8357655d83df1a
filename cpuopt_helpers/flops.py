"""FLOPs of one training step: torch's FLOP counter, with the CPU formulas it lacks or counts otherwise."""

# Imports only the standard library and torch: worker.py imports this module, and the worker
# also runs under the legacy IPEX interpreter (torch 2.8).
#
# Convention: a GEMM (m, k) x (k, n) is 2*m*k*n FLOPs; a convolution is 2 FLOPs per multiply-accumulate
# of a weight with an input element: the kernel's taps that fall on padding are not work, as benchdnn
# counts a problem's ops (oneDNN's tests/benchdnn/conv/conv.cpp, ``prb_t::count_ops``), so the
# roofline of the whole step and ProfileDNN's of each primitive count alike (torch's formula counts
# every tap: a step of the quick cnn workload, whose 3x3 convolutions run down to 4x4 images,
# 88,897,536 FLOPs against the 74,901,504 its taps on the input make); biases,
# activations, normalisation, softmax and optimizer updates count nothing. What this module adds or
# corrects on torch's FLOP counter (torch.utils.flop_counter, checked on torch 2.13 and 2.8 CPU builds):
#
# - aten.convolution / aten._convolution: the taps on padding left out (above);
# - aten.mkldnn_rnn_layer / aten.mkldnn_rnn_layer_backward: what nn.LSTM runs on CPU (fp32 and
#   bf16), one call per layer and direction; torch has no formula, so LSTMs counted zero.
#   nn.GRU and nn.RNN (tanh and relu) decompose to addmm/mm on CPU and are counted already.
# - aten.convolution_backward: torch's formula ignores `groups` for the weight gradient, so a
#   grouped convolution (ResNeXt) counted `groups` times its weight-gradient work; padding as above.
# - aten._scaled_dot_product_flash_attention_for_cpu (+ backward): CPU attention without dropout
#   (e.g. nn.MultiheadAttention in eval or with dropout 0, F.scaled_dot_product_attention)
#   counted zero; attention with dropout decomposes to bmm and is counted already.
#
# The formulas go to FlopCounterMode's `custom_mapping`, so torch's own registry is left as it
# is and counting is idempotent: every count_flops call builds a fresh counter from the same
# mapping. Ops a torch build lacks are left out of the mapping (torch then counts them as before).

from __future__ import annotations

import functools
from math import prod

__all__ = ["count_flops", "flop_formulas", "rnn_layer_flops", "conv_flops", "axis_taps", "attention_flops"]


def rnn_layer_flops(input_shape, w_ih_shape, w_hh_shape) -> int:
    """Forward FLOPs of one recurrent layer and direction over a whole sequence.

    Every token (T*B of them; any leading layout, packed or padded) runs the input GEMM
    (1, I) x (I, G*H) and the recurrent GEMM (1, H) x (H, G*H), G gates (LSTM 4, GRU 3, RNN 1):
    2*T*B*G*H*(I + H), read off the weight shapes (G*H, I) and (G*H, H).
    """
    tokens = prod(input_shape[:-1])
    return 2 * tokens * (w_ih_shape[0] * w_ih_shape[1] + w_hh_shape[0] * w_hh_shape[1])


def _mkldnn_rnn_layer_flop(input_shape, w_ih_shape, w_hh_shape, *args, out_shape=None, **kwargs) -> int:
    return rnn_layer_flops(input_shape, w_ih_shape, w_hh_shape)


def _mkldnn_rnn_layer_backward_flop(input_shape, w_ih_shape, w_hh_shape, *args, out_shape=None, **kwargs) -> int:
    """oneDNN's LSTM backward computes every gradient: for each gate GEMM of the forward, the
    data gradient (dgates x W: d input, d hidden) and the weight gradient (dgates^T x input /
    hidden), each as many FLOPs as the forward GEMM: 2x the forward."""
    return 2 * rnn_layer_flops(input_shape, w_ih_shape, w_hh_shape)


def axis_taps(inner: int, outer: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """Along one spatial axis, the kernel taps that fall on the input (``inner`` positions), summed over the
    ``outer`` positions it is applied at: tap k of position o reads o * stride - padding + k * dilation."""
    taps = 0
    for k in range(kernel):
        offset = k * dilation - padding
        first = max(0, -(offset // stride))  # the first o with o * stride + offset >= 0
        last = min(outer - 1, (inner - 1 - offset) // stride)
        taps += max(0, last - first + 1)
    return taps


def _per_axis(value, axis: int, default: int) -> int:
    """A convolution argument for one axis: given per axis, once for all, or not at all (``default``)."""
    if isinstance(value, (list, tuple)):
        return int(value[axis] if len(value) > axis else value[0]) if value else default
    return int(value) if isinstance(value, int) else default


def conv_flops(x_shape, w_shape, out_shape, transposed: bool = False, stride=None, padding=None,
               dilation=None) -> int:
    """FLOPs of one convolution: 2 * batch * the weight's channel pairs (C_out x C_in/groups, which holds
    the groups) * the kernel's taps on the input (``axis_taps`` per axis). Without ``padding`` every tap
    counts (torch's formula); a string padding ('same') counts so too. A transposed convolution is counted as
    the convolution whose gradient it is: its input's positions are where the kernel is applied."""
    outer, inner = (x_shape, out_shape) if transposed else (out_shape, x_shape)
    known = padding is not None and not isinstance(padding, str)
    taps = 1
    for axis, k in enumerate(w_shape[2:]):
        if known:
            taps *= axis_taps(inner[2 + axis], outer[2 + axis], k, _per_axis(stride, axis, 1),
                              _per_axis(padding, axis, 0), _per_axis(dilation, axis, 1))
        else:
            taps *= outer[2 + axis] * k
    return 2 * x_shape[0] * w_shape[0] * w_shape[1] * taps


def _conv_flop(x_shape, w_shape, _bias, stride, padding, dilation, transposed, *args, out_shape=None,
               **kwargs) -> int:
    return conv_flops(x_shape, w_shape, out_shape, transposed, stride, padding, dilation)


def _conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, stride, padding, dilation, transposed,
                        _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
    """Input gradient and weight gradient each cost what the forward convolution costs (each
    pairs every weight element with every input element it meets once), counted when autograd asks for it."""
    forward = conv_flops(x_shape, w_shape, grad_out_shape, transposed, stride, padding, dilation)
    return forward * (bool(output_mask[0]) + bool(output_mask[1]))


def attention_flops(query_shape, key_shape, value_shape) -> int:
    """Forward FLOPs of softmax(Q K^T) V: two GEMMs per head (no saving for causal masks, as
    torch counts its other attention kernels); K/V may have fewer heads (grouped queries)."""
    b, heads, s_q, d = query_shape[0], query_shape[1], query_shape[-2], query_shape[-1]
    s_k, d_v = key_shape[-2], value_shape[-1]
    return 2 * b * heads * s_q * s_k * (d + d_v)


def _cpu_flash_attention_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return attention_flops(query_shape, key_shape, value_shape)


def _cpu_flash_attention_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args,
                                       out_shape=None, **kwargs) -> int:
    """dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q: twice the forward (recomputing the
    scores inside the kernel is not counted, as torch does for its flash kernels)."""
    return 2 * attention_flops(query_shape, key_shape, value_shape)


# aten op name -> formula (called with the shapes of the op's arguments, like torch's own)
FORMULAS = {
    "mkldnn_rnn_layer": _mkldnn_rnn_layer_flop,
    "mkldnn_rnn_layer_backward": _mkldnn_rnn_layer_backward_flop,
    "convolution": _conv_flop,
    "_convolution": _conv_flop,
    "convolution_backward": _conv_backward_flop,
    "_scaled_dot_product_flash_attention_for_cpu": _cpu_flash_attention_flop,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _cpu_flash_attention_backward_flop,
}


@functools.lru_cache(maxsize=None)
def _mapping() -> tuple:
    import torch

    found = []
    for name, formula in FORMULAS.items():
        try:
            op = getattr(torch.ops.aten, name)
        except (AttributeError, RuntimeError):  # this torch build has no such op: nothing to count
            continue
        found.append((op, formula))
    return tuple(found)


def flop_formulas() -> dict:
    """The formulas this torch build can use, {aten op packet: formula}, for
    ``FlopCounterMode(custom_mapping=...)``; they take precedence over torch's own."""
    return dict(_mapping())


def count_flops(step, *args) -> float | None:
    """FLOPs of one call of ``step(*args)`` (forward + backward + update), counted by torch's
    FLOP counter with the formulas above; None when nothing was counted."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        counter = FlopCounterMode(display=False, custom_mapping=flop_formulas())
    except TypeError:  # a torch without custom_mapping: its own formulas only
        counter = FlopCounterMode(display=False)
    with counter:
        step(*args)
    return float(counter.get_total_flops()) or None
