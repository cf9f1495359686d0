"""``python -m cantrip`` is the ``cantrip`` command."""

import sys

from cantrip.cli import main

sys.exit(main())
