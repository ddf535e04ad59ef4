"""The contract's schema versions: which a reader accepts, and the one each addition is
written with.

Each version after 2 added fields or types that only the messages using them are written with,
so an older reader refuses just those by version and reads the rest; readers upgrade first,
then writers. What each version added, and the upgrade order it asks for, is written once, in
DESIGN.md (Data flow: "Every value carries a schema version"), and at each field of
`schemas.contract` and `schemas.precompute`.
"""

from __future__ import annotations

SCHEMA_VERSION = 2
#: Versions a reader accepts.
READABLE_VERSIONS = frozenset({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13})
OPERATOR_VERSION = 3
DECISION_VERSION = 4
POWERFUL_EXTRA_VERSION = 5
SUPPLY_VERSION = 6
REPLICA_GRANT_VERSION = 7
SIGNED_VERSION = 8
SAMPLED_VERSION = 9
ROOM_VERSION = 10
PRECOMPUTE_VERSION = 11
ANSWER_VERSION = 12
PRECOMPUTE_SHARE_VERSION = 13
