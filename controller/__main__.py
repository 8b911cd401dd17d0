"""`python -m controller` runs the controller."""

import sys

from controller import main

sys.exit(main.main())
