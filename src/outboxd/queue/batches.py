"""The batch calls by receipt handle (DeleteMessageBatch, ChangeMessageVisibilityBatch), for
SqsQueues: up to ten entries a request, the ones SQS failed read back by receipt handle."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

MAX_BATCH_ENTRIES: Final = 10  # SendMessageBatch / ReceiveMessage / *Batch hard limit

Call = Callable[[str, Mapping[str, Any]], Awaitable[dict[str, Any]]]


async def by_receipt_handle(
    call: Call, operation: str, url: str, entries: Sequence[Mapping[str, Any]]
) -> dict[str, str]:
    """One batch call (`operation`) of up to ten entries, each with its `ReceiptHandle`:
    the entries SQS failed, receipt handle -> "Code: Message". QueueError (from `call`)
    when the request as a whole failed, so nothing was done."""
    if not 1 <= len(entries) <= MAX_BATCH_ENTRIES:
        raise ValueError(f"1..{MAX_BATCH_ENTRIES} entries per batch, got {len(entries)}")
    params = {"QueueUrl": url, "Entries": [{"Id": str(i), **e} for i, e in enumerate(entries)]}
    resp = await call(operation, params)
    failed: dict[str, str] = {}
    for bad in resp.get("Failed", []):
        try:
            handle = str(entries[int(bad["Id"])]["ReceiptHandle"])
        except (KeyError, ValueError, IndexError):
            continue
        failed[handle] = f"{bad.get('Code', 'Unknown')}: {bad.get('Message', '')}"
    return failed
