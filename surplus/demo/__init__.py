"""`surplus demo`: the whole system on one machine, then a report.

``run`` starts and stops every process of a demo (the pieces it plays a scenario with live in
``surplus.live``); ``slices`` gives each opportunistic replica a CPU slice of its grant;
``analysis`` (the event log and the load's files) and ``reactions`` (the workers' preemption
histograms) read what was recorded; ``report`` turns it into ``summary.json`` and
``report.html``, ``plots`` into its PNGs.
"""
