"""`surplus demo`: the whole system on one machine, then a report.

``run`` starts and stops every process of a demo (the pieces it plays a scenario with live in
``surplus.live``); ``slices`` gives each opportunistic replica a CPU slice of its grant;
``analysis`` and ``report`` turn what was recorded into ``summary.json``, plots and
``report.html``.
"""
