"""Does lower precision change what the model learns? A small CNN on real handwritten digits.

The UCI digits (1,797 8x8 images, shipped inside scikit-learn: no download) are trained
for a fixed number of epochs in fp32, in bf16 autocast with the loss in fp32 (the paper's
advice), and in bf16 with the loss in bf16 too. Each run is a fresh process
(``python -m cpuopt_helpers.accuracy``) printing one JSON line: per-epoch training loss and
test accuracy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

MODES = ("fp32", "bf16", "bf16_loss")
TEST_FRACTION = 0.2


def load_digits_tensors(seed: int = 0):
    """(x_train, y_train, x_test, y_test): images scaled to [0, 1], a fixed shuffled split."""
    import torch
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    split = int(len(y) * (1 - TEST_FRACTION))
    train, test = order[:split], order[split:]
    return x[train], y[train], x[test], y[test]


def small_cnn():
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))


def train_digits(mode: str, epochs: int, batch_size: int, lr: float = 0.05, seed: int = 0) -> dict:
    """Train in this process; return per-epoch loss and test accuracy."""
    import torch
    import torch.nn.functional as F

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
    torch.manual_seed(seed)
    x_train, y_train, x_test, y_test = load_digits_tensors(seed)
    model = small_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    bf16 = mode != "fp32"
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    history = []
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(y_train), generator=g)
        total, count = 0.0, 0
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                logits = model(x_train[idx])
            # outside autocast, which would run cross-entropy in fp32 whatever its input
            loss = F.cross_entropy(logits.to(torch.bfloat16) if mode == "bf16_loss" else logits.float(), y_train[idx])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
            count += len(idx)
        model.eval()
        with torch.no_grad(), autocast():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        history.append({"loss": total / count, "accuracy": accuracy})
    return {"mode": mode, "epochs": epochs, "batch_size": batch_size, "lr": lr, "seed": seed,
            "history": history, "final_accuracy": history[-1]["accuracy"], "final_loss": history[-1]["loss"],
            "train_samples": len(y_train), "test_samples": len(y_test)}


def run_accuracy(mode: str, epochs: int, batch_size: int, lr: float = 0.05, seed: int = 0,
                 threads: int | None = None, timeout_s: float = 900) -> dict:
    """Train in a fresh process (threads fixed before it starts) and return its result."""
    from cpuopt_helpers.runtimes import run_json_module

    args = ["--mode", mode, "--epochs", str(epochs), "--batch-size", str(batch_size), "--lr", str(lr), "--seed", str(seed)]
    return run_json_module("cpuopt_helpers.accuracy", args, f"accuracy run {mode}", threads=threads, timeout_s=timeout_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="train a small CNN on the UCI digits; print one JSON line")
    parser.add_argument("--mode", default="fp32", choices=MODES)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(json.dumps(train_digits(args.mode, args.epochs, args.batch_size, args.lr, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
