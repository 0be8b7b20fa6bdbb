"""topo.runs.command."""
