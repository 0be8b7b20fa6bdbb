"""Running a plan: the runtime half, the only part of topo that imports torch and torchrl.

- :mod:`.run`: :class:`~.run.Run`, a plan's collector in the caller's process (the training loop's, or
  ``topo launch``'s), supervised; :func:`topo.collector` makes one with its :class:`~.options.Options`;
- :mod:`.command`: the ``topo launch`` and ``topo eval`` click commands (no torch import);
- :mod:`.engines`, :mod:`.local`, :mod:`.ray`, :mod:`.subcollector`: the engines that build the collector;
- :mod:`.supervision`: failures judged, restarts through one port, teardown, the watcher;
- :mod:`.policy`: where the policy runs and how weights reach it;
- :mod:`.evaluate`, :mod:`.evaluation`: the eval rows as a run of their own, and the trainer's side of it;
- :mod:`.observe`, :mod:`.report`: what a run shows.
"""
