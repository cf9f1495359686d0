"""``python -m cantrip`` is the ``cantrip`` command."""

import sys

from cantrip._cli import main

sys.exit(main())
