"""topo.runtime."""
