"""`surplus soak`: the demo's system under steady load for a long while, watched for growth.

``probe`` reads what each process holds (RSS, open file descriptors and threads from
``/proc``) and what its metrics say (consumer lag, age of the targets held); ``growth`` judges
the samples after the warm-up, start against end, pure code; ``run`` drives a demo run
(``surplus.demo.run``: the same processes, started and stopped the same way) and samples it.
"""
