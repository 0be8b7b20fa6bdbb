"""`topo doctor`: whether this host (`host`), or a Ray cluster's nodes (`cluster`), can run a plan (`command`)."""
