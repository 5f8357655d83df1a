"""The workload registry and protocol: `build(preset, **options) -> Workload`.

A workload knows nothing about launching. Built-ins are registered by name; any
``package.module:function`` on the import path is a user workload, built the same way.
Its options are the keyword parameters of ``build`` with their defaults (RetinaNet's
``classes=80, trainable_layers=3, frozen_bn="separate", focal="reference"``): a config
carries them as strings, converted here to the type of each default; a module may add
``validate_options(options)`` to refuse values before any process starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
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

    ``make_batch(batch_size) -> (inputs, targets)``: inputs is a tensor (``model(inputs)``), a
    tuple (``model(*inputs)``) or a dict (``model(**inputs)``). ``loss_fn(outputs, targets)``
    returns a scalar tensor; ``outputs`` is whatever the model returns (a tensor, a tuple, a dict,
    an output object), handed over as it is (in bf16 autocast its floating-point tensors are
    cast to fp32 first, where they sit in a tensor, tuple, list or dict).
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


def build_function(spec: str) -> Callable:
    """The ``build`` function a workload name or ``package.module:function`` stands for."""
    target = BUILTINS.get(spec, spec)
    if ":" not in target:
        raise CpuoptError(f"unknown workload {spec!r}; use one of {', '.join(sorted(BUILTINS))} "
                          "or package.module:function")
    module_name, _, func_name = target.partition(":")
    if spec in BUILTINS:
        return getattr(importlib.import_module(module_name), func_name)
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise CpuoptError(f"cannot import {module_name!r} for workload {spec!r}; "
                          "run from the folder that holds it or add it to PYTHONPATH")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # the user's module failed (or exited) while importing
        raise CpuoptError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}; a workload's module "
                          "should only define things when imported (run its script part under "
                          "if __name__ == '__main__')") from None
    function = getattr(module, func_name, None)
    if not callable(function):
        raise CpuoptError(f"{module_name!r} has no function {func_name!r}; a workload is "
                          "package.module:function with function(preset) -> Workload")
    return function


def declared_options(spec: str) -> dict[str, Any]:
    """The options a workload declares: its build's keyword parameters and their defaults."""
    params = list(inspect.signature(build_function(spec)).parameters.values())[1:]  # after the preset
    return {p.name: p.default for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is not p.empty}


def check_options(spec: str, options: dict[str, str]) -> dict[str, Any]:
    """The options converted to the types of their defaults; a clear error for an unknown
    name or a bad value. Without options nothing is imported (a built-in's module imports torch:
    seconds of every `cpuopt bench` before its worker starts)."""
    if not options:
        return {}
    declared = declared_options(spec)
    typed = {}
    for name, text in options.items():
        if name not in declared:
            offered = ", ".join(f"{k}={v}" for k, v in declared.items()) or "none"
            raise CpuoptError(f"workload {spec!r} has no option {name!r}; its options (with defaults): {offered}")
        default = declared[name]
        try:
            if isinstance(default, bool):
                if str(text).lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                typed[name] = str(text).lower() in ("true", "1")
            else:
                typed[name] = type(default)(text) if default is not None else text
        except (TypeError, ValueError):
            kind = {"int": "an integer", "float": "a number"}.get(type(default).__name__,
                                                                  f"a {type(default).__name__}")
            raise CpuoptError(f"workload {spec!r}: option {name}={text!r} is not {kind} "
                              f"(default {default!r})") from None
    validate = getattr(importlib.import_module(build_function(spec).__module__), "validate_options", None)
    if callable(validate):
        validate(typed)
    return typed


def build_workload(spec: str, preset: str, options: dict[str, str] | None = None) -> Workload:
    """Build a built-in (by name) or user workload (``package.module:function``)."""
    typed = check_options(spec, options or {})
    workload = build_function(spec)(preset, **typed)
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
