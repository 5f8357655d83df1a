"""ProfileDNN: parse oneDNN verbose logs, break time down, compare runs, project the ceiling.

The paper's toolkit (arXiv 2206.10034, section 3), rebuilt on PyTorch: ``parse_log``
streams any oneDNN verbose log into a table; ``breakdown`` and ``compare`` answer where
time goes and what changed between two runs; ``replay`` re-runs every distinct primitive
in isolation to give the efficiency ratio of a measured step; ``benchdnn_lines`` and
``converter_breakdown`` hand a log to oneDNN's own tools (benchdnn, verbose_converter);
``whole_step`` projects every operator of a torch.profiler trace of the step (``wholestep``).
"""

from cpuopt_helpers.profiledn.benchdnn import benchdnn_lines, converter_breakdown
from cpuopt_helpers.profiledn.breakdown import breakdown, compare, compare_findings, distinct_primitives, findings
from cpuopt_helpers.profiledn.parse import ParsedLog, parse_log
from cpuopt_helpers.profiledn.wholestep import Ceilings, whole_step

__all__ = ["ParsedLog", "parse_log", "breakdown", "compare", "compare_findings", "distinct_primitives", "findings",
           "benchdnn_lines", "converter_breakdown", "Ceilings", "whole_step"]
