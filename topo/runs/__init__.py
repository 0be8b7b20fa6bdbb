"""A kept run directory read back: `topo runs show` (`command`) and `topo replay` (`replay`)."""
