"""``python -m topo.launch`` is ``topo launch``."""
import sys

from topo.cli import main

main(["launch", *sys.argv[1:]], prog_name="topo")
