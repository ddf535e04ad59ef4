"""The live system on one machine: capacity scheduler, load generator and the `surplus demo` run.

``plan`` reads a simulator scenario (``sim/scenarios/*.toml``) as the description of a live
fleet, whose opportunistic replicas run while the capacity schedule (``sim.schedule``, the
simulator's own) lends them; ``scheduler`` sends that schedule's grants, renewals, revokes and
preemption notices and ``loadgen`` the traffic, against real Kafka and real workers;
``run`` starts and stops every process of a demo; ``report`` turns what was recorded into
``summary.json``, plots and ``report.html``.
"""
