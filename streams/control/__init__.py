"""The pure control core: PID, latency windows, pool inventory, lever allocator, RMA and SBM
policies, and the ScopeController that ties them together.

Nothing here imports Kafka, Faust, torch or an HTTP library, and nothing reads a clock: time
comes in as ``now_ms``. That is what lets the live agents, the offline replayer and the
simulator run the exact same code.
"""
