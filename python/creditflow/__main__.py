"""``python -m creditflow``: the ``creditflow`` command (see :mod:`creditflow.tools.cli`)."""

import sys

from creditflow.tools.cli import main

sys.exit(main())
