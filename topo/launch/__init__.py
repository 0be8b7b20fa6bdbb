"""``topo launch``: the runtime half. A plan becomes a running TorchRL topology, supervised.

- :mod:`.command`: the click command (no torch import);
- :mod:`.supervisor`: the top process, watching a collector process it starts in a new session;
- :mod:`.runner`: that collector process; :mod:`.collectors`: the torchrl objects it builds;
- :mod:`.markers`: the run directory workers report to; :mod:`.state`, :mod:`.processes`;
- :mod:`.observe`, :mod:`.report`, :mod:`.progress`: what a launch shows.
"""
