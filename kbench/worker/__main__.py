import sys

from kbench.worker.serve import main

sys.exit(main(sys.argv[1:]))
