#!/usr/bin/env python3
"""Tampers with proved exports in every way an auditor must catch, and checks the verifier names
each: run by tests/export.rs on real exports (NDJSON and Parquet; the whole log, a slice, one
tenant) made by the real binary from a real ledger of two tenants.

Usage: tamper_exports.py VERIFIER_KEY (WHOLE SLICE TENANT TENANT_SLICE FOREIGN_SOURCE)...
one group per format, where TENANT_SLICE is a slice of one tenant's export and FOREIGN_SOURCE a
proved slice holding another tenant's intent. Exit 0 when every case is
named as expected (and each intact export verifies), 1 with the cases that were not.
"""

import base64
import hashlib
import io
import json
import os
import sys
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import verify_export  # noqa: E402


def load(path):
    """(format, header, rows, schema, closing record) of an export."""
    if verify_export.is_parquet(path):
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        metadata = table.schema.metadata
        header = json.loads(metadata[b"opledger_export.header"])
        end = json.loads(metadata[b"opledger_export.end"])
        return "parquet", header, table.to_pylist(), table.schema.remove_metadata(), end
    with open(path, encoding="utf-8") as file:
        lines = [json.loads(line) for line in file if line.strip()]
    end = next(line["end"] for line in lines[1:] if "end" in line)
    return "ndjson", lines[0], [line for line in lines[1:] if "end" not in line], None, end


def closing(rows, original):
    """The closing record a tamperer writes to match the rows, keeping what it cannot forge (the
    tenant tree's proof in the checkpoint's map)."""
    events = [row for row in rows if row.get("context") is None]
    positions = [row["position"] for row in events]
    end = {
        "events": len(events),
        "first_position": positions[0] if positions else None,
        "last_position": max(positions) if positions else None,
    }
    if "tenant_tree" in original:
        end["tenant_tree"] = original["tenant_tree"]
    return end


def verify(fmt, header, rows, schema, key, original_end):
    """The verifier's findings on the export written back in its format."""
    end = closing(rows, original_end)
    if fmt == "ndjson":
        text = [json.dumps(header)] + [json.dumps(row) for row in rows] + [json.dumps({"end": end})]
        return verify_export.verify_lines(text, key)[0]
    import pyarrow as pa
    import pyarrow.parquet as pq

    metadata = {b"opledger_export.header": json.dumps(header), b"opledger_export.end": json.dumps(end)}
    table = pa.Table.from_pylist(rows, schema=schema.with_metadata(metadata))
    sink = io.BytesIO()
    pq.write_table(table, sink)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tampered-{os.getpid()}.parquet")
    with open(path, "wb") as file:
        file.write(sink.getvalue())
    try:
        return verify_export.verify_parquet(path, key)[0]
    finally:
        os.remove(path)


def replace_in(row, field, old, new):
    value = row[field]
    if isinstance(value, bytes):
        assert old.encode() in value, (field, old)
        row[field] = value.replace(old.encode(), new.encode(), 1)
    else:
        assert old in value, (field, old)
        row[field] = value.replace(old, new, 1)


def events_of(rows):
    return [i for i, row in enumerate(rows) if row.get("context") is None]


def middle(rows):
    """The index of an exported event with events of its stream after it in the file."""
    indexes = events_of(rows)
    for i in indexes:
        if any(rows[j]["stream"] == rows[i]["stream"] for j in indexes if j > i):
            return i
    return indexes[len(indexes) // 2]


def later(rows):
    """The index of an exported event that is not its stream's first in the file."""
    indexes = events_of(rows)
    for i in indexes:
        if any(rows[j]["stream"] == rows[i]["stream"] for j in indexes if j < i):
            return i
    raise AssertionError(f"no stream has two events in this export: {[(rows[i]['position'], rows[i]['stream'][-4:], rows[i].get('context')) for i in range(len(rows))]}")


def data_text(row):
    value = row["data"]
    return value.decode() if isinstance(value, bytes) else value


def edit_data(rows, **_):
    i = later(rows)
    replace_in(rows[i], "data", '"approver":"boss"', '"approver":"bose"')
    return rows[i]["position"]


def rewrite_with_link_and_id(rows, **_):
    """Edits an intent's arguments and recomputes its chain link and event id, as someone who knows
    the construction would: only the tree catches it."""
    i = middle(rows)
    row = rows[i]
    replace_in(row, "data", "Call client", "Call clientX")
    data = row["data"].encode() if isinstance(row["data"], str) else row["data"]
    event_type = row["type"].encode()
    previous = bytes.fromhex(row["previous_chain"]) if row.get("previous_chain") else None
    old_link = row["chain"]
    row["chain"] = verify_export.link(previous, row["version"], event_type, data).hex()
    replace_in(row, "metadata", old_link, row["chain"])
    given = uuid.UUID(row["event_id"])
    millis = int.from_bytes(given.bytes[:6], "big")
    operation = uuid.UUID(row["stream"][len("operation-"):])
    content = verify_export.content_hash(event_type, data)
    digest = hashlib.sha256(
        verify_export.EVENT_ID_TAG + millis.to_bytes(8, "big") + operation.bytes
        + row["version"].to_bytes(8, "big") + content
    ).digest()
    raw = bytearray(given.bytes[:6] + digest[:10])
    raw[6] = (raw[6] & 0x0F) | 0x80
    raw[8] = (raw[8] & 0x3F) | 0x80
    row["event_id"] = str(uuid.UUID(bytes=bytes(raw)))
    assert verify_export.event_id_matches(row["event_id"], row["stream"], row["version"], event_type, data)
    # The forger carries the new link down the stream: each later event's previous_chain and
    # link, and the copy of each link in its metadata.
    previous = row["chain"]
    for j in events_of(rows):
        if j > i and rows[j]["stream"] == row["stream"]:
            later_row = rows[j]
            later_data = later_row["data"].encode() if isinstance(later_row["data"], str) else later_row["data"]
            later_row["previous_chain"] = previous
            new_link = verify_export.link(bytes.fromhex(previous), later_row["version"], later_row["type"].encode(), later_data).hex()
            replace_in(later_row, "metadata", later_row["chain"], new_link)
            later_row["chain"] = previous = new_link
    return row["position"]


def edit_time(rows, **_):
    import datetime

    i = later(rows)
    time = rows[i]["time"]
    if isinstance(time, str):
        rows[i]["time"] = time[:-2] + ("1" if time[-2] != "1" else "2") + "Z"
    else:
        rows[i]["time"] = time + datetime.timedelta(milliseconds=1)
    return rows[i]["position"]


def edit_metadata(rows, **_):
    i = later(rows)
    replace_in(rows[i], "metadata", '"schema_version":1', '"schema_version":1,"trace":"forged"')
    return rows[i]["position"]


def header_contiguity(rows, header, **_):
    header["contiguous_positions"] = not header["contiguous_positions"]


def header_head(rows, header, **_):
    header["log_head"] += 5
    header["tree_size"] += 5


def header_checkpoint(rows, header, **_):
    size = header["tree_size"]
    header["checkpoint"] = header["checkpoint"].replace(f"\n{size}\n", f"\n{size + 5}\n", 1)


def header_tenant(rows, header, **_):
    header["tenant"] = "globex"


def cut_tail(rows, **_):
    last = events_of(rows)[-1]
    position = rows[last]["position"]
    del rows[last]
    if rows and rows[-1].get("context") == "after":
        del rows[-1]
    return position


def drop_event(rows, **_):
    """Drops an event that has later events in its stream: the next of them (or the file's
    edges) is where the gap shows."""
    i = middle(rows)
    dropped = rows.pop(i)
    same_stream = [row["position"] for row in rows if row["stream"] == dropped["stream"]]
    return [dropped["position"], rows[i]["position"]] + same_stream


def add_event(rows, **_):
    i = middle(rows)
    rows.insert(i + 1, dict(rows[i]))
    return rows[i]["position"]


def move_event(rows, **_):
    indexes = events_of(rows)
    a, b = indexes[1], indexes[2]
    rows[a], rows[b] = rows[b], rows[a]
    return [rows[a]["position"], rows[b]["position"]]


def drop_operation(rows, **_):
    """Drops every event of one operation (its intent too), as if it never happened."""
    stream = rows[middle(rows)]["stream"]
    dropped = [row["position"] for row in rows if row["stream"] == stream and row.get("context") is None]
    rows[:] = [row for row in rows if row["stream"] != stream]
    return dropped + [position + 1 for position in dropped]


def slip_in_foreign(rows, foreign, **_):
    """Another tenant's intent, with its real inclusion proof, put in position order."""
    at = next((i for i, row in enumerate(rows) if row.get("context") is None and row["position"] > foreign["position"]), len(rows))
    slipped = dict(foreign)
    slipped.pop("context", None)
    rows.insert(at, slipped)
    return foreign["position"]


def first_passed_off_as_before(rows, end, **_):
    """The slice's first event relabelled as the tenant's event just before it, and the real one
    folded into the frontier before that, so the tenant's tree still holds: only the edge's place
    inside the slice's `from` shows that the slice now leaves that event out."""
    b = next(i for i, row in enumerate(rows) if row.get("context") == "tenant_before")
    before = dict(rows.pop(b))
    for name in ("data", "metadata"):
        if isinstance(before.get(name), bytes):
            before[name + "_bytes"] = before.pop(name)
    leaf = verify_export.tenant_leaf_hash(before["position"], verify_export.Event(before).leaf())
    tree = end["tenant_tree"]
    left = [base64.b64decode(h) for h in tree["left"]]
    builder = verify_export.RootBuilder.from_frontier(tree["left_size"], left)
    builder.push(leaf)
    tree["left_size"] = builder.size
    tree["left"] = [base64.b64encode(h).decode() for _, h in builder.stack]
    first = events_of(rows)[0]
    rows[first] = dict(rows[first], context="tenant_before")
    return rows[first]["position"]


# What each case must be named as, per export: substrings of which one must be in a finding.
CASES = [
    ("data edited", edit_data, {"whole": ["EDITED", "REWRITTEN"], "slice": ["EDITED"], "tenant": ["EDITED"], "tenant_slice": ["EDITED"]}),
    ("rewritten with its link and id recomputed", rewrite_with_link_and_id,
     {"whole": ["REWRITTEN"], "slice": ["EDITED"], "tenant": ["EDITED"], "tenant_slice": ["EDITED"]}),
    ("time edited", edit_time, {"whole": ["TIME"], "slice": ["TIME"], "tenant": ["TIME"], "tenant_slice": ["TIME"]}),
    ("metadata edited", edit_metadata, {"whole": ["REWRITTEN"], "slice": ["EDITED"], "tenant": ["EDITED"], "tenant_slice": ["EDITED"]}),
    ("header: contiguity claimed falsely", header_contiguity, {"whole": ["HEADER"], "slice": ["HEADER"], "tenant": ["HEADER"], "tenant_slice": ["HEADER"]}),
    ("header: head and tree size raised", header_head, {"whole": ["HEADER"], "slice": ["HEADER"], "tenant": ["HEADER"], "tenant_slice": ["HEADER"]}),
    ("header: checkpoint edited", header_checkpoint, {"whole": ["HEADER"], "slice": ["HEADER"], "tenant": ["HEADER"], "tenant_slice": ["HEADER"]}),
    ("header: another tenant named", header_tenant, {"tenant": ["FOREIGN"], "tenant_slice": ["FOREIGN"]}),
    ("tail cut (closing line rewritten)", cut_tail,
     {"whole": ["TRUNCATED"], "slice": ["TRUNCATED"], "tenant": ["INCOMPLETE"], "tenant_slice": ["INCOMPLETE"]}),
    ("an operation dropped whole (closing line rewritten)", drop_operation,
     {"whole": ["REMOVED"], "tenant": ["INCOMPLETE"], "tenant_slice": ["INCOMPLETE"]}),
    ("an event dropped", drop_event,
     {"whole": ["REMOVED"], "slice": ["REMOVED"], "tenant": ["REMOVED"], "tenant_slice": ["REMOVED", "INCOMPLETE"]}),
    ("an event added", add_event,
     {"whole": ["INSERTED"], "slice": ["INSERTED"], "tenant": ["INSERTED"], "tenant_slice": ["INSERTED"]}),
    ("an event moved", move_event, {"whole": ["MOVED"], "slice": ["MOVED"], "tenant": ["MOVED"], "tenant_slice": ["MOVED"]}),
    ("another tenant's event slipped in", slip_in_foreign, {"tenant": ["FOREIGN"], "tenant_slice": ["FOREIGN"]}),
    ("the slice's first event passed off as the tenant's event before it", first_passed_off_as_before,
     {"tenant_slice": ["given as just before the slice, lies inside"]}),
]


def main(argv):
    key = verify_export.VerifierKey(argv[1])
    kinds = ["whole", "slice", "tenant", "tenant_slice"]
    exports = []
    for group in range(2, len(argv), 5):
        whole, slice_, tenant, tenant_slice, source = argv[group : group + 5]
        _, _, source_rows, _, _ = load(source)
        foreign = next(row for row in source_rows if row["version"] == 0 and '"tenant":"globex"' in data_text(row))
        exports += [(whole, foreign), (slice_, foreign), (tenant, foreign), (tenant_slice, foreign)]
    failures, checked = [], 0
    for index, (path, foreign) in enumerate(exports):
        kind = kinds[index % 4]
        fmt, header, rows, schema, end = load(path)
        intact = verify(fmt, header, rows, schema, key, end)
        if intact:
            failures.append(f"{fmt} {kind}: the intact export has findings: {[str(f) for f in intact]}")
            continue
        for name, tamper, expected in CASES:
            if kind not in expected:
                continue
            h, r, e = json.loads(json.dumps(header)), [dict(row) for row in rows], json.loads(json.dumps(end))
            position = tamper(r, header=h, foreign=foreign, end=e)
            findings = [str(f) for f in verify(fmt, h, r, schema, key, e)]
            checked += 1
            named = any(word in f for f in findings for word in expected[kind])
            positions = position if isinstance(position, list) else [position]
            placed = position is None or any(f"position {p}," in f or f"position {p})" in f for p in positions for f in findings) or any(
                "the file's end" in f for f in findings
            )
            if not (named and placed):
                failures.append(f"{fmt} {kind}: {name} (position {position}) not named as {expected[kind]}: {findings}")
            else:
                print(f"{fmt:7} {kind:12} {name}: {findings[0]}")
    for failure in failures:
        print("MISSED", failure)
    print(f"{checked} tamperings checked, {len(failures)} missed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
