"""``python -m topo``: the ``topo`` command."""
from .cli import main

main(prog_name="topo")
