"""``python -m topo``: the ``topo`` command."""
from topo.cli import main

main(prog_name="topo")
