"""DistributedDataParallel training of a small CNN on the UCI digits, one rank per process.

Run it under torchrun, with each rank pinned to its own cores by cpuopt:

    cpuopt launch --nproc-per-node 2 -- python examples/ddp_train.py --epochs 3

or across machines (run on each, with the same endpoint and id):

    cpuopt launch --nproc-per-node 4 --nnodes 2 --node-rank 0 --rdzv-backend c10d \\
        --rdzv-endpoint head-node:29400 --rdzv-id job1 -- python examples/ddp_train.py

Every rank prints one line: where it ran (cores, threads) and how training went; rank 0
also says whether all ranks ended with identical parameters.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from cpuopt_helpers.accuracy import load_digits_tensors, small_cnn
from cpuopt_helpers.worker import param_checksum


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = load_digits_tensors()
    mine = torch.arange(rank, len(y_train), world)  # this rank's shard of the training set
    model = torch.nn.parallel.DistributedDataParallel(small_cnn())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    for _ in range(args.epochs):
        order = mine[torch.randperm(len(mine), generator=g)]
        for start in range(0, len(order), args.batch_size):
            idx = order[start:start + args.batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    checksums = [None] * world
    dist.all_gather_object(checksums, param_checksum(model))
    print(f"rank {rank}/{world} local_rank {os.environ.get('LOCAL_RANK')} cores {sorted(os.sched_getaffinity(0))} "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} torch_threads={torch.get_num_threads()} "
          f"pinned_by={os.environ.get('CPUOPT_PINNING', 'nobody')} loss {loss.item():.4f} "
          f"test_accuracy {accuracy:.3f}", flush=True)
    if rank == 0:
        print(f"params_in_sync={len(set(checksums)) == 1}", flush=True)
    del model, optimizer
    dist.barrier()  # every rank done with the job's collectives before any tears its connections down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
