"""`python3 -m bench` (make bench): runner.main."""

import sys

from .runner import main

sys.exit(main(sys.argv[1:]))
