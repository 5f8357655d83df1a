"""Test-wide setup: results, figures and executed notebooks go to a temporary build folder.

Set here, at import, so that the nbval kernels started by pytest inherit it too.
"""

import os
import tempfile

os.environ.setdefault("CPUOPT_BUILD", tempfile.mkdtemp(prefix="cpuopt-test-build-"))
os.environ.pop("CPUOPT_RESULTS", None)
