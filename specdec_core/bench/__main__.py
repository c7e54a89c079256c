"""`python -m specdec_core.bench [run | ceiling | cost-model | gpu-check] ...`: see cli.py."""

import sys

from .cli import main

sys.exit(main())
