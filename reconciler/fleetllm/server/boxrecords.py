"""What a box request leaves behind, built once per kind of answer: its fetch record and the fields of its
`box request` log line (no secret in either). A box sends the same request at every poll (the same
claimed host, X-Forwarded-For and peer) and gets the same status and revision until the revision
changes, so both repeat but for the time and the duration: boxcontract.BoxCall.record stores the record
at each answer's time and adds the duration to the line, and neither is built nor encoded again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fleetllm.adapters.state.records import BoxApi, FetchRecord
from fleetllm_contract.logfmt import EncodedFields

MAX_ENTRIES = 16_384  # kinds of answer remembered; the memo is emptied when full
MAX_TEXT = 512  # the longest fields (encoded, `text`) of a line whose kind is remembered

# Everything a record and its line depend on: the endpoint, the status, the revision served, the claimed
# host, X-Forwarded-For, the peer, the resolved box name and where it came from, the replica answering.
Key = tuple[BoxApi, int, str | None, str | None, str | None, str, str | None, str | None, str]


@dataclass(frozen=True, slots=True)
class BoxRecord:
    fetch: FetchRecord  # as the request made it (the store bounds it); stored at each answer's time (`at`)
    level: int  # the line's
    fields: EncodedFields  # the line's, but its duration (`ms`)


def box_record(key: Key) -> BoxRecord:
    endpoint, status, revision, claimed, forwarded_for, peer, box, host_source, replica = key
    fetch = FetchRecord(at=0.0, endpoint=endpoint, status=status, peer=peer, claimed_host=claimed,
                        forwarded_for=forwarded_for, box=box, revision=revision, replica=replica)
    fields = EncodedFields({"endpoint": endpoint.value, "status": status, "box": box, "host_source": host_source,
                            "claimed_host": claimed, "peer": peer, "forwarded_for": forwarded_for,
                            "revision": revision})
    return BoxRecord(fetch, logging.INFO if status < 500 else logging.WARNING, fields)


class BoxRecords:
    """The BoxRecord of each kind of answer (`Key`), built at its first. A key holds client text (headers,
    the peer), so what a client sends must not grow memory: an answer whose line's fields encode to more
    than MAX_TEXT characters (a box's take 200 to 300) is built each time and not kept, and the memo is
    emptied when it holds MAX_ENTRIES (at most about 2 KB each: 30 MB). The record is kept as the request
    made it: the store bounds what it stores (records.STORED_CHARS), which for a box's few dozen
    characters a field is the record itself, with no copy. Request threads share it without
    a lock: a dict's get and set are atomic, and an emptying that races a get costs that request a new
    record, never an error."""

    def __init__(self) -> None:
        self._memo: dict[Key, BoxRecord] = {}

    def __len__(self) -> int:
        return len(self._memo)

    def get(self, key: Key) -> BoxRecord:
        record = self._memo.get(key)
        if record is None:
            record = box_record(key)
            if len(record.fields.text) <= MAX_TEXT:
                if len(self._memo) >= MAX_ENTRIES:
                    self._memo.clear()
                self._memo[key] = record
        return record
