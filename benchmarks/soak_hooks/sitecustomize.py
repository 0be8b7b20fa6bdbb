"""The chaos soak's leak (``benchmarks/chaos_soak.py``): on PYTHONPATH in a soak only, so every process of the run
imports it at start. SIGUSR2 makes the process that gets it hold ``TOPO_SOAK_LEAK_MB`` more MB (written, so
resident) every ``TOPO_SOAK_LEAK_EVERY_S`` seconds, for the rest of its life: a leak in a real worker, whatever its
env, without wrapping the env or changing the spec's backend. The soak sends it to env workers only.
"""
import os
import signal


def _leak(signum, frame):
    import threading
    import time

    mb, every = int(os.environ.get("TOPO_SOAK_LEAK_MB", "32")), float(os.environ.get("TOPO_SOAK_LEAK_EVERY_S", "0.5"))
    held = []

    def grow():
        while True:
            held.append(b"\x01" * (mb << 20))
            time.sleep(every)

    threading.Thread(target=grow, name="topo-soak-leak", daemon=True).start()


if os.environ.get("TOPO_SOAK_LEAK_MB"):
    signal.signal(signal.SIGUSR2, _leak)

