"""FLOPs per training step: the counter against hand counts, and the GEMM ceilings by dtype.

Hand counts follow the workbook's convention: a GEMM (m, k) x (k, n) is 2*m*k*n FLOPs, a convolution
2 FLOPs per weight element per input element it meets (``taps``: the kernel's taps on padding are not
work, as benchdnn counts; torch's own formula counts them); biases, activations, norms,
softmax, losses and the optimizer update count nothing. A trained layer's backward costs its
forward twice over (the input gradient and the weight gradient, each a GEMM/convolution as
large as the forward), minus what autograd skips: no input gradient where the layer's input
needs none (images, frozen layers before it), no weight gradient for frozen weights.
"""

import ast
import pathlib

import pytest
import torch
from torch import nn

from cpuopt_helpers import flops, roofline, worker
from cpuopt_helpers.workloads import build_workload

TOLERANCE = 0.05


def taps(inner: int, outer: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """Along one axis, the kernel taps that land on the input, enumerated one by one (the hand count)."""
    return sum(0 <= o * stride - padding + k * dilation < inner for o in range(outer) for k in range(kernel))


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared two-core machine; the counts do not depend on it
    yield
    torch.set_num_threads(threads)


def counted_step(model, inputs, loss_fn=lambda out, _: out.float().sum(), targets=None) -> float:
    """count_flops of one training step as the worker runs it: forward, loss, backward, SGD."""
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01, momentum=0.9)
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)

    def step():
        optimizer.zero_grad(set_to_none=True)
        out = model(*inputs)
        loss_fn(out[0] if isinstance(out, tuple) else out, targets).backward()
        optimizer.step()

    model.train()
    step()  # the first step allocates the optimizer's state; count a later one, as the worker does
    return flops.count_flops(step)


def assert_close(counted, expected):
    assert counted is not None and expected > 0
    assert abs(counted - expected) <= TOLERANCE * expected, f"counted {counted:.4g}, hand count {expected:.4g}"


# ---------------------------------------------------------------- hand counts of small models

T, B, I, H = 16, 4, 24, 32  # sequence, batch, input features, hidden


def recurrent_hand_count(gates: int, layers: int, directions: int, head: int = 10) -> float:
    """Every layer and direction runs, per token, a GEMM (1, I_l) x (I_l, gates*H) on its input
    and (1, H) x (H, gates*H) on its hidden state: forward 2*T*B*gates*H*(I_l + H), with I_l = I
    for the first layer and directions*H above it. Training: x3 (data and weight gradients).
    The head Linear(directions*H, head) on every token: 2*T*B*directions*H*head, x3.
    (GRU/RNN run as mm on CPU, where autograd skips the gradient of the zero initial state:
    one (B, H) x (H, gates*H) GEMM per layer and direction, under 2% at T = 16.)
    """
    total = 0
    for layer in range(layers):
        inputs = I if layer == 0 else directions * H
        total += directions * 3 * 2 * T * B * gates * H * (inputs + H)
    return total + 3 * 2 * T * B * directions * H * head


class Recurrent(nn.Module):
    def __init__(self, rnn: nn.Module, features: int):
        super().__init__()
        self.rnn, self.head = rnn, nn.Linear(features, 10)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def sequence():
    # requires grad like an embedding's output, so the first layer's input gradient is computed
    return torch.randn(T, B, I, requires_grad=True)


@pytest.mark.parametrize("layers, bidirectional", [(1, False), (2, False), (2, True)])
def test_lstm_counts_its_gate_gemms(layers, bidirectional):
    torch.manual_seed(0)
    model = Recurrent(nn.LSTM(I, H, layers, bidirectional=bidirectional), H * (1 + bidirectional))
    assert_close(counted_step(model, sequence()), recurrent_hand_count(4, layers, 1 + bidirectional))


def test_batch_first_lstm_counts_the_same():
    torch.manual_seed(0)
    model = Recurrent(nn.LSTM(I, H, batch_first=True), H)
    assert_close(counted_step(model, sequence().transpose(0, 1)), recurrent_hand_count(4, 1, 1))


@pytest.mark.parametrize("make, gates", [
    (lambda: nn.GRU(I, H), 3),
    (lambda: nn.GRU(I, H, 2, bidirectional=True), 3),
    (lambda: nn.RNN(I, H), 1),
    (lambda: nn.RNN(I, H, 2, nonlinearity="relu"), 1),
])
def test_gru_and_rnn_count_their_gate_gemms(make, gates):
    torch.manual_seed(0)
    rnn = make()
    model = Recurrent(rnn, H * (1 + rnn.bidirectional))
    assert_close(counted_step(model, sequence()), recurrent_hand_count(gates, rnn.num_layers, 1 + rnn.bidirectional))


def test_grouped_convolutions_count_their_groups_once():
    """conv1 (no groups) sees images, which need no gradient: forward + weight gradient.
    The grouped conv2 (C_in/groups = 4 input channels per output channel), the grouped
    transposed conv3 (each input position meets C_out/groups = 2 outputs per input channel)
    and the head: forward + input gradient + weight gradient."""
    torch.manual_seed(0)
    n, size = 4, 16
    model = nn.Sequential(
        nn.Conv2d(8, 32, 3, padding=1), nn.ReLU(),                       # 16x16 out
        nn.Conv2d(32, 64, 3, stride=2, padding=1, groups=8), nn.ReLU(),  # 8x8 out
        nn.ConvTranspose2d(64, 32, 2, stride=2, groups=16), nn.ReLU(),   # 8x8 in, 16x16 out
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    conv1 = 2 * n * 32 * 8 * taps(16, 16, 3, padding=1) ** 2  # 46 taps a row of 16, not 48
    conv2 = 2 * n * 64 * (32 // 8) * taps(16, 8, 3, stride=2, padding=1) ** 2
    conv3 = 2 * n * 8 * 8 * 64 * (32 // 16) * 2 * 2  # no padding: every tap
    head = 2 * n * 32 * 10
    expected = 2 * conv1 + 3 * conv2 + 3 * conv3 + 3 * head
    assert_close(counted_step(model, torch.randn(n, 8, size, size)), expected)


def test_resnext_bottleneck_counts_its_grouped_convolution_once():
    """RetinaNet's standard-preset block (32 groups of 4 channels) on an input that needs a
    gradient: 1x1 256->128, 3x3 128->128 in 32 groups (4 input channels per output), 1x1
    128->256, each x3. Counting the groups 32 times in the weight gradient would add 68%."""
    from cpuopt_helpers.workloads.retinanet import Bottleneck

    torch.manual_seed(0)
    n, size = 2, 8
    block = Bottleneck(256, 64, 1, groups=32, width_per_group=4, bn="separate")
    conv1 = 2 * n * size * size * 128 * 256
    conv2 = 2 * n * 128 * 4 * taps(size, size, 3, padding=1) ** 2
    conv3 = 2 * n * size * size * 256 * 128
    assert_close(counted_step(block, torch.randn(n, 256, size, size, requires_grad=True)), 3 * (conv1 + conv2 + conv3))


def test_a_convolutions_taps_on_padding_are_not_counted_as_profiledn_counts_its_primitive():
    """The FLOP counter, the whole-step rows and ProfileDNN count a convolution alike: a 3x3 conv with padding 1
    on a 4x4 image meets 10 input elements a row, not 12 (benchdnn's ``count_ops``; torch's formula: 12)."""
    from cpuopt_helpers.profiledn.parse import conv_taps, parse_conv

    conv = nn.Conv2d(16, 16, 3, padding=1, bias=False)
    x = torch.randn(2, 16, 4, 4)
    counted = flops.count_flops(lambda: conv(x))
    assert counted == 2 * 2 * 16 * 16 * 10 * 10
    assert counted == 2 * 2 * 16 * 16 * conv_taps(parse_conv("mb2_ic16oc16_ih4oh4kh3ph1"))
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as torchs:
        conv(x)
    assert torchs.get_total_flops() == 2 * 2 * 16 * 16 * 12 * 12  # what the workbook no longer counts


@pytest.mark.parametrize("stride, padding, dilation, output_padding", [
    (1, 0, 1, 0), (1, 2, 1, 0), (2, 1, 1, 1), (3, 4, 2, 0), (2, 5, 1, 1), (4, 1, 3, 2)])
def test_the_count_is_the_multiply_accumulates_a_convolution_really_does(stride, padding, dilation, output_padding):
    """Ground truth, not the formula again: on all-ones inputs and weights each output element is the number of
    multiply-accumulates that made it, so the output's sum is the convolution's (transposed: its input's
    positions are where the kernel is applied) work."""
    import torch.nn.functional as F

    x, w = torch.ones(2, 3, 11), torch.ones(4, 3, 3)
    out = F.conv1d(x, w, stride=stride, padding=padding, dilation=dilation)
    assert flops.count_flops(lambda: F.conv1d(x, w, stride=stride, padding=padding, dilation=dilation)) == \
        2 * out.sum().item()
    wt = torch.ones(3, 4, 3)  # transposed: (C_in, C_out, k)
    if output_padding < max(stride, dilation):
        out = F.conv_transpose1d(x, wt, stride=stride, padding=padding, dilation=dilation,
                                 output_padding=output_padding)
        assert flops.count_flops(lambda: F.conv_transpose1d(x, wt, stride=stride, padding=padding, dilation=dilation,
                                                            output_padding=output_padding)) == 2 * out.sum().item()


def test_the_tap_count_agrees_with_enumerating_the_taps():
    import random

    rng = random.Random(0)
    for _ in range(2000):
        inner, outer, kernel = rng.randint(1, 30), rng.randint(1, 30), rng.randint(1, 7)
        stride, padding, dilation = rng.randint(1, 4), rng.randint(0, 6), rng.randint(1, 3)
        assert flops.axis_taps(inner, outer, kernel, stride, padding, dilation) == taps(
            inner, outer, kernel, stride, padding, dilation), (inner, outer, kernel, stride, padding, dilation)


class SelfAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.attention = nn.MultiheadAttention(d, heads, dropout=0.0, batch_first=True)

    def forward(self, x):
        return self.attention(x, x, x, need_weights=False)[0]


def test_cpu_attention_without_dropout_is_counted():
    """Attention with dropout runs as bmm; without, as CPU flash attention (counted zero by
    torch): the projections (to 3d and to d) and Q K^T, P V (2*B*S*S*d each), all x3."""
    torch.manual_seed(0)
    b, s, d = 2, 24, 32
    forward = 2 * b * s * d * 3 * d + 2 * 2 * b * s * s * d + 2 * b * s * d * d
    assert_close(counted_step(SelfAttention(d, 4), torch.randn(b, s, d, requires_grad=True)), 3 * forward)


# ---------------------------------------------------------------- the built-in workloads

def analytic_step_flops(model, inputs) -> float:
    """A hand count of one training step from the layer shapes one forward pass shows.

    Counted per call of a layer (shared layers, like RetinaNet's heads over five levels,
    count per call): Conv2d 2*N*C_out*(C_in/groups)*taps on the input; Linear 2*tokens*in*out;
    LSTM 2*T*B*4H*(I_l + H) per layer and direction; MultiheadAttention its input projection
    (to 3d), Q K^T and P V (2*B*S*S*d each) and its output projection. Backward: the same
    again for the input gradient when the layer's input requires grad (not for images, nor
    after frozen layers) and again for the weight gradient when the weight requires grad (not
    for RetinaNet's frozen backbone stages); the LSTM's and attention's backward is 2x their
    forward (oneDNN's LSTM backward computes every gradient). Embeddings, norms, activations,
    pooling, interpolation, losses and the SGD update: nothing.
    """
    total = [0.0]

    def trained(forward, x, weight):
        return forward * (1 + bool(x.requires_grad) + bool(weight.requires_grad))

    def conv(m, args, out):
        fwd = 2 * out.shape[0] * m.out_channels * (m.in_channels // m.groups)
        for axis in (0, 1):
            fwd *= taps(args[0].shape[2 + axis], out.shape[2 + axis], m.kernel_size[axis], m.stride[axis],
                        m.padding[axis], m.dilation[axis])
        total[0] += trained(fwd, args[0], m.weight)

    def linear(m, args, out):
        total[0] += trained(2 * args[0].numel() * m.out_features, args[0], m.weight)

    def lstm(m, args, out):
        x = args[0]
        steps, batch = x.shape[0], x.shape[1]  # either layout: T*B tokens
        dirs = 1 + m.bidirectional
        for layer in range(m.num_layers):
            inputs = m.input_size if layer == 0 else dirs * m.hidden_size
            total[0] += 3 * dirs * 2 * steps * batch * 4 * m.hidden_size * (inputs + m.hidden_size)

    def attention(m, args, out):
        x = args[0]
        tokens, d = x.shape[0] * x.shape[1], m.embed_dim
        seq = x.shape[1] if m.batch_first else x.shape[0]
        total[0] += trained(2 * tokens * d * 3 * d, x, m.in_proj_weight)
        total[0] += 3 * 2 * 2 * tokens * seq * d  # Q K^T and P V, forward + backward
        total[0] += trained(2 * tokens * d * d, x, m.out_proj.weight)  # out_proj's input needs grad

    hooks = []
    for m in model.modules():
        hook = {nn.Conv2d: conv, nn.Linear: linear, nn.LSTM: lstm, nn.MultiheadAttention: attention}.get(type(m))
        if hook:
            hooks.append(m.register_forward_hook(hook))
    try:
        model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return total[0]


@pytest.mark.parametrize("name", ["cnn", "transformer", "rnn", "retinanet"])
def test_workload_counts_match_the_hand_count(monkeypatch, name):
    w = build_workload(name, "quick")  # RetinaNet's defaults: 80 classes, 3 trained stages
    x, targets = w.make_batch(w.default_batch_size)
    inputs = x if isinstance(x, tuple) else (x,)
    w.model.train()
    expected = analytic_step_flops(w.model, inputs)
    assert_close(counted_step(w.model, inputs, w.loss_fn, targets), expected)


# ---------------------------------------------------------------- wiring

def test_worker_counts_with_these_formulas():
    torch.manual_seed(0)
    lstm = nn.LSTM(I, H)
    x = torch.randn(T, B, I)

    def step():
        lstm(x)[0].sum().backward()

    assert worker.count_flops(step) == flops.count_flops(step) == 3 * 2 * T * B * 4 * H * (I + H)
    assert flops.count_flops(lambda: None) is None  # nothing counted: no number


def test_counting_twice_counts_the_same():
    torch.manual_seed(0)
    model = Recurrent(nn.LSTM(I, H), H)
    assert counted_step(model, sequence()) == counted_step(model, sequence())


def test_flops_module_imports_only_stdlib_and_torch():
    import sys

    tree = ast.parse(pathlib.Path(flops.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names - {"__future__", "torch"} <= set(sys.stdlib_module_names), names


def test_ceiling_by_dtype():
    roof = {"gemm_gflops_best": 100.0, "gemm_gflops_bf16_best": 250.0, "copy_gbs_best": 20.0}
    assert roofline.ceiling_gflops(roof, "fp32") == 100.0
    assert roofline.ceiling_gflops(roof, "bf16") == 250.0
    old = {"gemm_gflops_best": 100.0, "copy_gbs_best": 20.0}  # stored before bf16 was measured
    assert roofline.ceiling_gflops(old, "bf16") is None and roofline.ceiling_gflops(old, "fp32") == 100.0
    assert roofline.ceiling_gflops({**roof, "gemm_gflops_bf16_best": None}, "bf16") is None  # bf16 GEMM failed
    assert roofline.ceiling_gflops(None, "fp32") is None
    with pytest.raises(Exception, match="fp16"):
        roofline.ceiling_gflops(roof, "fp16")


def test_bf16_gemm_is_measured_next_to_fp32():
    result = roofline.measure_bf16_gemm(128, 2)
    assert set(result) == {"gemm_gflops_bf16", "gemm_gflops_bf16_best", "gemm_size_bf16", "gemm_paths_bf16"}
    assert result["gemm_size_bf16"] == 128 and result["gemm_gflops_bf16_best"] >= result["gemm_gflops_bf16"] > 0
    paths = result["gemm_paths_bf16"]  # the ceiling is the best of every path, as fp32's
    assert set(paths) == {"mm 64", "mm 128", "conv1x1 channels-last 128"}
    assert result["gemm_gflops_bf16_best"] == max(result["gemm_gflops_bf16_best"], *paths.values()) > 0
    slow = roofline.measure_bf16_gemm(1024, 2, budget_s=1e-6)  # no time: the smallest size, and no paths
    assert slow["gemm_size_bf16"] == 256 and slow["gemm_paths_bf16"] is None


def test_runs_of_one_model_share_a_flop_count_and_others_do_not(monkeypatch, tmp_path):
    from cpuopt_helpers import launch
    from cpuopt_helpers.config import RunConfig

    monkeypatch.setenv("CPUOPT_BUILD", str(tmp_path))
    base = RunConfig(workload="cnn", threads=2)
    same_work = [base.replace(threads=1), base.replace(allocator="jemalloc"), base.replace(steps=3, warmup=0),
                 base.replace(affinity="none"), base.replace(omp_runtime="intel", kmp_blocktime=1)]
    other_work = [base.replace(batch_size=7), base.replace(workload="rnn"), base.replace(preset="standard"),
                  base.replace(dtype="bf16"), base.replace(options={"depth": "2"}),
                  base.replace(instances=2, batch_policy="global")]
    path = launch.flops_cache_file(base)
    assert path.startswith(str(tmp_path / "cache" / "flops"))
    assert all(launch.flops_cache_file(c) == path for c in same_work)
    assert len({launch.flops_cache_file(c) for c in other_work} | {path}) == len(other_work) + 1
    assert launch.flops_cache_file(base.replace(instances=2, mode="ddp")) is None  # every rank must count


def test_a_cached_count_is_read_a_missing_or_corrupt_one_counted_and_left(monkeypatch, tmp_path):
    cache = tmp_path / "sub" / "k.json"
    monkeypatch.setenv("CPUOPT_FLOPS_CACHE", str(cache))
    counted = []

    def count():
        counted.append(1)
        return 123.0

    assert worker.cached_flops(count) == 123.0 and len(counted) == 1  # missing: counted and left
    assert worker.cached_flops(count) == 123.0 and len(counted) == 1  # read, not counted again
    cache.write_text("{not json")
    assert worker.cached_flops(count) == 123.0 and len(counted) == 2  # corrupt: counted again
    monkeypatch.delenv("CPUOPT_FLOPS_CACHE")
    assert worker.cached_flops(count) == 123.0 and len(counted) == 3  # no cache named: always counted
