"""The workload registry and protocol: `build(preset) -> Workload`.

A workload knows nothing about launching. Built-ins are registered by name; any
``package.module:function`` on the import path is a user workload, built the same way.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from cpuopt_helpers.errors import CpuoptError

BUILTINS = {
    "cnn": "cpuopt_helpers.workloads.cnn:build",
    "transformer": "cpuopt_helpers.workloads.transformer:build",
    "rnn": "cpuopt_helpers.workloads.rnn:build",
    "retinanet": "cpuopt_helpers.workloads.retinanet:build",
}


@dataclass
class Workload:
    """A model, a batch factory and a loss: what one training step needs.

    ``make_batch(batch_size) -> (inputs, targets)``: inputs is a tensor, or a tuple passed
    as ``model(*inputs)``. ``loss_fn(outputs, targets)`` returns a scalar tensor.
    ``flops_per_sample`` (forward + backward) may be None: the worker then counts them.
    ``image_like`` says whether channels-last applies to the inputs.
    """

    name: str
    model: Any
    make_batch: Callable[[int], tuple[Any, Any]]
    loss_fn: Callable[[Any, Any], Any]
    default_batch_size: int
    flops_per_sample: float | None = None
    image_like: bool = False


def build_workload(spec: str, preset: str) -> Workload:
    """Build a built-in (by name) or user workload (``package.module:function``)."""
    target = BUILTINS.get(spec, spec)
    if ":" not in target:
        raise CpuoptError(f"unknown workload {spec!r}; use one of {', '.join(sorted(BUILTINS))} "
                          "or package.module:function")
    module_name, _, func_name = target.partition(":")
    func = getattr(importlib.import_module(module_name), func_name)
    workload = func(preset)
    if not isinstance(workload, Workload):
        missing = [a for a in ("model", "make_batch", "loss_fn", "default_batch_size") if not hasattr(workload, a)]
        if missing:
            raise CpuoptError(f"{spec} returned {type(workload).__name__}, not a Workload "
                              f"(missing {', '.join(missing)})")
    return workload


def preset_value(preset: str, table: dict[str, Any]) -> Any:
    """Pick a preset's settings, with a clear error for unknown presets."""
    if preset not in table:
        raise CpuoptError(f"unknown preset {preset!r}; use one of {', '.join(table)}")
    return table[preset]
