"""The smallest training loop on a topo topology: three batches of the toy 2 x 3 topology, weights pushed after each.

    python examples/quickstart.py      # from the repository root; seconds, no simulator

``topo.load`` checks the spec and compiles its plan (no torch); ``plan.make_policy()`` is the trainer's
copy of the spec's policy (torchrl's TinyVLA); ``run.collector`` is the torchrl collector, supervised;
``run.update_weights()`` makes every acting copy act with the trainer's weights. Your update goes before it.
"""
import topo

if __name__ == "__main__":  # subcollectors import this file again: the loop stays here
    plan = topo.load("examples/toy_2x3.yaml")
    with topo.collector(plan, policy=plan.make_policy()) as run:
        for i, batch in zip(range(3), run.collector):
            run.update_weights()
    print(run.report)
