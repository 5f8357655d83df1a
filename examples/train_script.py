"""A plain PyTorch training loop, as a user's own script would be: a small CNN on random
images, SGD with momentum. It does not need cpuopt; where cpuopt is importable it reports
each step through the one optional line below, so that `cpuopt tune --script` and `cpuopt
compare --script` time its steps without the start-up:

    cpuopt compare --script 'python examples/train_script.py' --a '' --b '--allocator tcmalloc' --json
    cpuopt tune --script 'python examples/train_script.py' --budget-min 3

``--print-throughput`` prints the script's own line instead ("throughput: N samples/s"),
for `--metric 'throughput: ([0-9.]+)'`.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

try:
    from cpuopt_helpers import throughput  # optional: the one line that reports each step
except ImportError:
    throughput = None


def model(classes: int = 10) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, stride=2, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, classes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=32, help="image side in pixels")
    parser.add_argument("--print-throughput", action="store_true",
                        help="print 'throughput: N samples/s' over the last steps instead of reporting to cpuopt")
    args = parser.parse_args()

    torch.manual_seed(0)
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(args.batch_size, 3, args.size, args.size)
    y = torch.randint(0, 10, (args.batch_size,))
    start = None
    for i in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        if args.print_throughput:
            if i == 2:  # the first three steps are warm-up
                start = time.perf_counter()
        elif throughput is not None:
            throughput.step(args.batch_size)
    if args.print_throughput:
        rate = args.batch_size * (args.steps - 3) / (time.perf_counter() - start)
        print(f"loss {loss.item():.4f}; throughput: {rate:.1f} samples/s")
    else:
        print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
