"""topo bench: startup of one topology, launched the ways people build it today and topo's way."""
