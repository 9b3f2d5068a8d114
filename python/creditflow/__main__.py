"""``python -m creditflow``: the ``creditflow`` command (see :mod:`creditflow.cli`)."""

import sys

from creditflow.cli import main

sys.exit(main())
