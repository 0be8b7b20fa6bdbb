"""``topo import``: topo specs written from other tools' configs, each value commented with where it came from."""
