"""The trainer's side of evaluation: the eval process (`service`) and each round's figures (`results`)."""
