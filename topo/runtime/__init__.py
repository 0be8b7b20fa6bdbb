"""What every process of a run shares (trainer, subcollectors, env workers, the server): the run directory, heartbeats,
episode records, GL, child interpreters, the model cache. Never imports torch."""
