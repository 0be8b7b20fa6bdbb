"""topo.launch.ray."""
