"""Reference policies (they import torch): real, small, no download; for examples, tests and smoke runs."""
