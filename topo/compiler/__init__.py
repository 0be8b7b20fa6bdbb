"""The compile half: a spec loaded, validated, compiled to a plan and rendered; pure, deterministic, never imports torch."""
