"""Running a plan: the only part of topo that imports torch and torchrl.

- :mod:`.session`: :class:`~.session.Run`, a plan's collector in the caller's process (the training
  loop's, or ``topo launch``'s), supervised; :func:`topo.collector` makes one;
- :mod:`.command`: the ``topo launch`` click command (no torch import);
- :mod:`.plans`: what runs (a spec compiled now, or a saved plan still fresh);
- :mod:`.local`, :mod:`.ray_collector`: the engines that build the torchrl collector;
- :mod:`.policy`: where the policy runs and how weights reach it;
- :mod:`.monitor`, :mod:`.state`, :mod:`.failure`: records and deaths, the first failure named;
- :mod:`.processes`, :mod:`.watcher`: the run's processes, found and ended, even after the trainer died;
- :mod:`.observe`, :mod:`.report`, :mod:`.progress`: what a run shows.
"""
