#!/usr/bin/env python3
"""Checks an ``opledger export`` file without opledger.

Recomputes every event's link in its stream's hash chain and its event id from the bytes in the
file, and checks that positions and stream versions run without gaps or steps back, and that the
file ends with the closing line its header promises. Prints one line per problem, naming the
event (file line, global position, stream and version), and exits 1 if there is any; 0 and a
summary when the export is intact; 2 when the file cannot be read as an export.

Only Python's standard library for NDJSON, so an auditor can read all of it; pyarrow for a
Parquet export (``--format parquet``), whose header and closing count are the file's key-value
metadata. The construction it checks is
documented in opledger's book (docs/src/auditors/export.md):

    content(type, data)  = SHA-256(type || 0x00 || data)
    link(prev, v, type, data)
                         = SHA-256("opledger-chain-v1" || 0x00 || prev || u64be(v) || type || 0x00 || data)
                           where prev is the stored link of the stream's event at version v-1,
                           or 32 zero bytes for version 0
    event id (UUID v8)   = millis(48 bits) || SHA-256("opledger event id v8" || 0x00 || u64be(millis)
                           || operation uuid (16 bytes) || u64be(v) || content)[0..10],
                           (for a `subject-<key id>` stream, the key id's 16 bytes)
                           with the UUID version (8) and variant (0b10) bits set
    event id (UUID v5, older ledgers)
                         = UUIDv5(namespace 6f706c65-6467-4572-8000-000000000001,
                                  operation uuid || u64be(v) || content)

What a keyless chain cannot show: someone who rewrites an event *and* every later link of its
stream, and the closing line, passes. Keep the export's SHA-256 (or the last links) somewhere
the ledger's operators cannot write, and compare.
"""

import base64
import hashlib
import json
import sys
import uuid

CHAIN_TAG = b"opledger-chain-v1\x00"
EVENT_ID_TAG = b"opledger event id v8\x00"
NAMESPACE = uuid.UUID("6f706c65-6467-4572-8000-000000000001")
ZERO_LINK = bytes(32)
FORMAT_VERSION = 1
OPERATION_PREFIX = "operation-"
# An erasure's stream (SubjectErased) is named by the destroyed key's id, a UUID that stands in
# for the operation's in the event id.
SUBJECT_PREFIX = "subject-"


class Unreadable(Exception):
    """The file is not an export this verifier knows."""


def content_hash(event_type: bytes, data: bytes) -> bytes:
    return hashlib.sha256(event_type + b"\x00" + data).digest()


def link(previous, version: int, event_type: bytes, data: bytes) -> bytes:
    digest = hashlib.sha256()
    digest.update(CHAIN_TAG)
    digest.update(previous if previous is not None else ZERO_LINK)
    digest.update(version.to_bytes(8, "big"))
    digest.update(event_type)
    digest.update(b"\x00")
    digest.update(data)
    return digest.digest()


def event_id_matches(event_id: str, stream: str, version: int, event_type: bytes, data: bytes) -> bool:
    """Whether ``event_id`` is the id opledger derives for this content at this version."""
    if stream.startswith(OPERATION_PREFIX):
        named = stream[len(OPERATION_PREFIX):]
    elif stream.startswith(SUBJECT_PREFIX):
        named = stream[len(SUBJECT_PREFIX):]
    else:
        return False
    try:
        given = uuid.UUID(event_id)
        operation = uuid.UUID(named)
    except ValueError:
        return False
    content = content_hash(event_type, data)
    if given.version == 8:
        millis = int.from_bytes(given.bytes[:6], "big")
        digest = hashlib.sha256(
            EVENT_ID_TAG
            + millis.to_bytes(8, "big")
            + operation.bytes
            + version.to_bytes(8, "big")
            + content
        ).digest()
        raw = bytearray(given.bytes[:6] + digest[:10])
        raw[6] = (raw[6] & 0x0F) | 0x80
        raw[8] = (raw[8] & 0x3F) | 0x80
        return bytes(raw) == given.bytes
    if given.version == 5:
        name = operation.bytes + version.to_bytes(8, "big") + content
        raw = bytearray(hashlib.sha1(NAMESPACE.bytes + name).digest()[:16])
        raw[6] = (raw[6] & 0x0F) | 0x50
        raw[8] = (raw[8] & 0x3F) | 0x80
        return bytes(raw) == given.bytes
    return False


def stored_bytes(event: dict, name: str) -> bytes:
    """The exact bytes the ledger stored: text, or base64 where they were not UTF-8 (NDJSON), or
    bytes as such (Parquet)."""
    if isinstance(event.get(name + "_bytes"), bytes):
        return event[name + "_bytes"]
    if isinstance(event.get(name), str):
        return event[name].encode("utf-8")
    if isinstance(event.get(name + "_base64"), str):
        return base64.b64decode(event[name + "_base64"], validate=True)
    raise KeyError(name)


def parse_link(text):
    if text is None:
        return None
    if not isinstance(text, str) or len(text) != 64:
        raise ValueError("a chain link is 64 hex digits")
    return bytes.fromhex(text)


class Finding:
    def __init__(self, line_number: int, event: dict, kind: str, detail: str):
        self.line = line_number
        self.position = event.get("position")
        self.stream = event.get("stream")
        self.version = event.get("version")
        self.kind = kind
        self.detail = detail
        self.unit = "line"

    def __str__(self):
        where = f"{self.unit} {self.line}" if self.line else "the file's end"
        if self.position is not None:
            where += f", position {self.position}"
        if self.stream is not None:
            where += f", {self.stream} v{self.version}"
        return f"{self.kind.upper()} ({where}): {self.detail}"


class StreamState:
    __slots__ = ("version", "link")

    def __init__(self, version, stored_link):
        self.version = version
        self.link = stored_link


def verify_lines(lines):
    """Checks an NDJSON export given as an iterable of lines; returns (findings, summary)."""
    findings = []
    iterator = iter(enumerate(lines, start=1))
    header = read_header(iterator)
    end = None
    records = []

    def events():
        nonlocal end
        for number, line in iterator:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                findings.append(Finding(number, {}, "malformed", f"not JSON ({error})"))
                continue
            if end is not None:
                findings.append(Finding(number, record, "inserted", "a line after the closing line"))
                continue
            if isinstance(record, dict) and "end" in record:
                end = (number, record["end"])
                continue
            yield number, record

    return verify_records(header, events(), lambda: end, findings)


def verify_parquet(path):
    """Checks a Parquet export (needs pyarrow); returns (findings, summary)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as error:
        raise Unreadable("reading Parquet needs pyarrow (pip install pyarrow)") from error
    try:
        table = pq.read_table(path)
    except Exception as error:  # pyarrow raises several kinds for a damaged or cut file
        raise Unreadable(f"not a readable Parquet file ({error})") from error
    metadata = table.schema.metadata or {}
    try:
        header = json.loads(metadata[b"opledger_export.header"])
    except (KeyError, ValueError) as error:
        raise Unreadable("the Parquet file has no opledger_export.header metadata") from error
    check_header(header)
    end = metadata.get(b"opledger_export.end")
    closing = (0, json.loads(end)) if end is not None else None

    def events():
        for number, row in enumerate(table.to_pylist(), start=1):
            record = dict(row)
            time = record.get("time")
            if time is not None:
                record["time"] = time.isoformat()
            for name in ("data", "metadata"):
                value = record.pop(name, None)
                if isinstance(value, (bytes, bytearray)):
                    record[name + "_bytes"] = bytes(value)
            yield number, record

    findings, summary = verify_records(header, events(), lambda: closing, [])
    for finding in findings:
        finding.unit = "row"
    return findings, summary


def verify_records(header, records, end_of, findings):
    """Checks the events of an export, whichever its format; ``end_of()`` gives the closing
    count once the records are read."""
    contiguous = bool(header.get("contiguous_positions"))
    from_beginning = header.get("from") is None
    streams = {}
    last_position = None
    events = 0
    for number, record in records:
        events += 1
        last_position = check_event(
            number, record, streams, last_position, contiguous, from_beginning, findings
        )
    check_end(end_of(), events, last_position, findings)
    summary = {"events": events, "streams": len(streams), "findings": len(findings)}
    return findings, summary


def read_header(iterator):
    try:
        _, first = next(iterator)
        header = json.loads(first)
    except (StopIteration, json.JSONDecodeError) as error:
        raise Unreadable(f"the first line is not an export header ({error})") from error
    check_header(header)
    return header


def check_header(header):
    if not isinstance(header, dict) or "opledger_export" not in header:
        raise Unreadable("the first line is not an export header (no opledger_export)")
    if header["opledger_export"] != FORMAT_VERSION:
        raise Unreadable(
            f"export format {header['opledger_export']} is not one this verifier knows ({FORMAT_VERSION})"
        )
    if header.get("chain") != "opledger-chain-v1":
        raise Unreadable(f"chain {header.get('chain')!r} is not one this verifier knows")


def check_event(number, record, streams, last_position, contiguous, from_beginning, findings):
    """Checks one event line; returns the position the next line must follow."""
    try:
        position = int(record["position"])
        stream = str(record["stream"])
        version = int(record["version"])
        event_type = str(record["type"]).encode("utf-8")
        data = stored_bytes(record, "data")
        stored_link = parse_link(record.get("chain"))
        previous_given = parse_link(record.get("previous_chain"))
        event_id = str(record["event_id"])
    except (KeyError, TypeError, ValueError) as error:
        findings.append(Finding(number, record if isinstance(record, dict) else {}, "malformed", f"missing or bad field ({error})"))
        return last_position

    def found(kind, detail):
        findings.append(Finding(number, record, kind, detail))

    if last_position is not None and position <= last_position:
        found("moved or inserted", f"position {position} does not follow {last_position}")
    elif contiguous and last_position is not None and position > last_position + 1:
        missing = f"{last_position + 1}" if position == last_position + 2 else f"{last_position + 1}–{position - 1}"
        found("removed", f"position(s) {missing} missing before this event")

    seen = streams.get(stream)
    if seen is not None:
        previous = seen.link
        if version <= seen.version:
            found("moved or inserted", f"version {version} after version {seen.version} of its stream")
            # Judge its content against the link it names, so a moved event that is otherwise
            # intact is not also called edited.
            previous = previous_given
        elif version > seen.version + 1:
            missing = versions(seen.version + 1, version - 1)
            found("removed", f"{missing} of its stream missing before it")
            previous = previous_given
        elif previous_given != seen.link:
            found("edited", "its previous_chain is not the link of the stream's event before it")
    elif version == 0:
        previous = None
    else:
        if from_beginning:
            found("removed", f"the stream's {versions(0, version - 1)} missing before it")
        # The first event of a stream in a slice: the link before it is outside the export.
        previous = previous_given

    problems = []
    if stored_link is None:
        problems.append("it carries no chain link")
    elif link(previous, version, event_type, data) != stored_link:
        problems.append("its content does not hash to its chain link")
    if not event_id_matches(event_id, stream, version, event_type, data):
        problems.append("its event id does not belong to this content at this version")
    if problems:
        found("edited", "; ".join(problems))

    if seen is None or version > seen.version:
        streams[stream] = StreamState(version, stored_link)
    return position if last_position is None else max(position, last_position)


def versions(first, last):
    return f"version {first}" if first == last else f"versions {first}–{last}"


def check_end(end, events, last_position, findings):
    if end is None:
        findings.append(Finding(0, {}, "truncated", "the file has no closing line: events may be missing at its end"))
        return
    number, closing = end
    if not isinstance(closing, dict):
        findings.append(Finding(number, {}, "malformed", "the closing line is not an object"))
        return
    if closing.get("events") != events:
        findings.append(
            Finding(number, {}, "removed or inserted", f"the closing line counts {closing.get('events')} events, the file holds {events}")
        )
    if closing.get("last_position") != last_position:
        findings.append(
            Finding(number, {}, "removed or inserted", f"the closing line ends at position {closing.get('last_position')}, the file at {last_position}")
        )


def is_parquet(path):
    """Whether the file starts with Parquet's magic bytes."""
    with open(path, "rb") as file:
        return file.read(4) == b"PAR1"


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(f"usage: {argv[0]} EXPORT.ndjson\n\n{__doc__}", file=sys.stderr)
        return 2
    try:
        if is_parquet(argv[1]):
            findings, summary = verify_parquet(argv[1])
        else:
            with open(argv[1], encoding="utf-8") as file:
                findings, summary = verify_lines(file)
    except (OSError, UnicodeDecodeError, Unreadable) as error:
        print(f"error: cannot verify {argv[1]}: {error}", file=sys.stderr)
        return 2
    for finding in findings:
        print(finding)
    if findings:
        print(f"{len(findings)} problem(s) in {summary['events']} event(s) of {summary['streams']} stream(s)")
        return 1
    print(f"OK: {summary['events']} event(s) of {summary['streams']} stream(s); every link and id recomputed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
