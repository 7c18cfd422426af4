"""`python -m attnserve ...` is the `attnserve` command."""

import sys

from attnserve.cli import main

sys.exit(main())
