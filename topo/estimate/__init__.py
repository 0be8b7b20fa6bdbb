"""``topo plan SPEC --estimate``: memory, ready time and frames/s of a plan on its nodes, from one worker measured
alone on this host (``probe``: the child's side, ``cache``: one probe per backend kwargs and host, ``model``:
the arithmetic, ``command``: the CLI glue and the check ``topo launch`` runs before anything starts)."""
