"""``python -m topo.launch`` is ``topo launch``."""
from .command import launch

launch(prog_name="topo launch")
