"""cpuopt: profile, project and optimise deep-learning training on CPUs, by measurement."""

from cpuopt_helpers.errors import CpuoptError

__all__ = ["CpuoptError"]
__version__ = "0.1.0"
