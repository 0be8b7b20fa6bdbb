"""topo.launch.supervision."""
