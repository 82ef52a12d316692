import sys

from kbench.cli.main import main

sys.exit(main())
