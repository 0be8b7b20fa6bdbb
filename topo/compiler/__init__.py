"""topo.compiler."""
