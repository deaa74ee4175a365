"""Row ids: time-ordered UUIDs (version 7, RFC 9562) as text.

The first 48 bits are the Unix time in milliseconds, the other 74 free bits random (the
kernel's CSPRNG, through `security.random_bytes`). Ids made in the same millisecond
sort in random order among themselves; ids made later sort after them.

Why time order (docs/architecture.md, "Time-ordered ids"): every table's primary key is
one of these. With random ids each new row went into a random leaf page of each
primary-key index, and a relay round's hundred rows (and their jobs) were found in a
hundred places; with ids in time order the new entries land at the right end of the
index, and a round's rows, made within moments of each other, on a few pages.

What an id tells: when its row was made, to the millisecond. The API shows that time
(`createdAt`) to whoever may see the row anyway. 74 random bits keep ids unguessable.
"""

from __future__ import annotations

import time

from outboxd.security import random_bytes


def new_id() -> str:
    """A version-7 UUID as `str(uuid.UUID(...))` writes it (lowercase, hyphenated)."""
    b = bytearray((time.time_ns() // 1_000_000).to_bytes(6, "big") + random_bytes(10))
    b[6] = (b[6] & 0x0F) | 0x70  # version 7
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 9562 variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
