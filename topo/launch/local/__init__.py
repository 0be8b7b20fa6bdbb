"""topo.launch.local.engine."""
