"""``python -m fl_app.report``: the sweep report (see :mod:`fl_app.report`)."""

import sys

from fl_app.report.cli import main

sys.exit(main())
