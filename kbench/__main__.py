import sys

from kbench.cli.commands import main

sys.exit(main())
