"""Runtime builders: ``build(env: dict, render_gpu: int | None) -> EnvBase``, called in env workers only.

Each plan row names one (``kwargs["builder"]``); :func:`topo.worker.make_env` imports and calls it.
"""
