"""The live system on one machine: capacity scheduler, load generator and the `surplus demo` run.

``plan`` reads a simulator scenario (``sim/scenarios/*.toml``) as the description of a live
fleet; ``schedule`` turns its capacity shapes and storms into timed grants, renewals, revokes and
preemption notices; ``scheduler`` and ``loadgen`` run them against real Kafka and real workers;
``run`` starts and stops every process of a demo; ``report`` turns what was recorded into
``summary.json``, plots and ``report.html``.
"""
