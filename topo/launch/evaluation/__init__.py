"""topo.launch.evaluation.run."""
