"""`surplus chaos`: the fault suite's fleet under load, with a seeded random schedule of faults,
every request, notice, target and label recorded, then invariants checked over the history.

``schedule`` draws the faults (pure, seeded); ``history`` is the record of a run (pure types,
JSONL); ``check`` judges the invariants over a history (pure); ``run`` is the edge: the
processes, the nemesis that injects the schedule, and the recorder.
"""
