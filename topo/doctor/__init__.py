"""topo.doctor.host."""
