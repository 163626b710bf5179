"""``python -m fl_app.privacy.fdp``: the f-DP bound calculator's command line (:func:`fl_app.privacy.fdp.cli.main`)."""

import sys

from fl_app.privacy.fdp.cli import main

if __name__ == "__main__":
    sys.exit(main())
