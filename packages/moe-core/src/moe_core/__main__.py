import sys

from moe_core.cli import main

sys.exit(main())
