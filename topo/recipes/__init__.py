"""Drop-ins for public training recipes: a recipe's own factory, with its signature and return value, built from a
topo plan, so that switching the recipe to topo is a change of imports (:mod:`.vla_grpo`: torchrl's vla_grpo)."""
