"""`python -m cpuopt_helpers` is the `cpuopt` command."""

import sys

from cpuopt_helpers.cli import main

sys.exit(main())
