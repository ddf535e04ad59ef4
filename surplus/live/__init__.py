"""A scenario played against a real fleet: what `surplus scheduler`, `surplus loadgen` and
`surplus demo` share.

``plan`` reads a simulator scenario (``sim/scenarios/*.toml``) as the description of a live
fleet, whose opportunistic replicas run while the capacity schedule (``sim.schedule``, the
simulator's own) lends them; ``scheduler`` sends that schedule's grants, renewals, revokes and
preemption notices and ``loadgen`` the traffic, against real Kafka and real workers; ``procs``
runs each as a child process that cannot outlive its parent.
"""
