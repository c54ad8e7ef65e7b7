"""python -m ewkern.bench: see ewkern.bench.cli."""

import sys

from .cli import main

sys.exit(main())
