"""`python -m tokengrad.cli ...` (what torchrun and accelerate launch run): the `tokengrad` command."""

import sys

from tokengrad.cli import main

sys.exit(main())
