"""The fault suite's fleet on loopback, shared by tests/faults and `surplus chaos`.

``procs``: real worker and control-plane processes, grants, /metrics, publish and read back;
``load``: open-loop ranking load through the client library, recorded per request; ``fleet``:
those together (control plane, baseline and powerful workers, capacity, load); ``toxiproxy``
and ``tools``: the TCP proxy the network faults go through, built by `make toxiproxy`.
"""
