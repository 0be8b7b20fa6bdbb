"""Supervision, engine-neutral and torch-free: failures judged by one thread, restarts through one port, teardown in stages."""
