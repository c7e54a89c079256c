"""`python -m specdec_core.bench ...`: see run.py."""

import sys

from .run import main

sys.exit(main())
