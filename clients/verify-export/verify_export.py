#!/usr/bin/env python3
"""Checks an ``opledger export`` file without opledger, and a kept checkpoint against a later one.

An export is checked against the signed checkpoint it was cut at (its header carries it; give the
log's verifier key with ``--verifier-key`` so its signature is checked, not taken on trust):

- a whole-log export: every event's leaf is recomputed from the bytes in the file and the RFC 6962
  root over them must be the checkpoint's root, so nothing was removed, added, moved or rewritten;
- a slice or one tenant's export: every event carries an inclusion proof in the checkpoint's tree,
  checked against its recomputed leaf; the slice's ends are proved by the events just outside
  them (context lines), a tenant's operations by the intents that open them (which name the
  tenant), so another tenant's event slipped in is named;
- a whole tenant's export, when its checkpoint signs the tenants' map (the extension line
  ``opledger-tenants <size> <root>``): the tenant's tree is recomputed from its events and must be
  the one the map holds (the closing record gives its index and inclusion proof in the map), so an
  operation left out whole, or events cut off its end, are named too.

Besides: every event's link in its stream's hash chain and its event id are recomputed; its
``time`` must be the event id's own 48-bit time and the time in its data; positions and stream
versions must run without gaps or steps back; the header's claims (head, range, tenant,
contiguity) are checked against the events, never trusted; the closing count must match.
An erasure's `subject-<key id>` stream derives its event ids as an operation's do, with the
key id's 16 bytes in place of the operation's.

With ``--kept CHECKPOINT`` (a checkpoint kept earlier, outside opledger) the export's checkpoint
must extend it: a whole export proves it by the root of its first leaves, any other with
``--consistency-proof FILE`` (the JSON of ``GET /v1/log/proof/consistency?from=M&to=N``). Without
an export, ``--kept OLD --checkpoint NEW --consistency-proof FILE`` checks two checkpoints alone.

Prints one line per problem, naming the event (file line or Parquet row, global position, stream
and version), and exits 1 if there is any; 0 and a summary when everything holds; 2 when a file
cannot be read as an export or checkpoint. Memory is bounded: the file is read line by line (a
Parquet file batch by batch, one row group at a time), the tree by O(log n) hashes, and at most
``MAX_REMEMBERED_STREAMS`` streams' last links.

Only Python's standard library (Ed25519 and all), plus pyarrow for a Parquet export. The formats
are specified in opledger's book (docs/src/auditors/transparency-log.md and export.md):

    leaf            = "opledger-leaf-v1" || 0x00 || u64be(position) || u16be(len) stream
                      || u64be(version) || event id (16 bytes) || u16be(len) type
                      || u32be(len) data || u32be(len) metadata
    leaf hash       = SHA-256(0x00 || leaf); node = SHA-256(0x01 || left || right)
    tenant leaf     = "opledger-tenant-leaf-v1" || 0x00 || u64be(position) || leaf hash
    tenant head     = "opledger-tenant-head-v1" || 0x00 || u16be(len) tenant || u64be(size) || root
    link(v)         = SHA-256("opledger-chain-v1" || 0x00 || link(v-1) || u64be(v) || type || 0x00 || data),
                      link(-1) = 32 zero bytes
    event id (v8)   = millis(48 bits) || SHA-256("opledger event id v8" || 0x00 || u64be(millis)
                      || operation uuid || u64be(v) || SHA-256(type || 0x00 || data))[0..10],
                      with the UUID version (8) and variant (0b10) bits set
    event id (v5)   = UUIDv5(6f706c65-6467-4572-8000-000000000001,
                             operation uuid || u64be(v) || SHA-256(type || 0x00 || data))
"""

import argparse
import base64
import calendar
import datetime
import hashlib
import json
import re
import sys
import uuid

CHAIN_TAG = b"opledger-chain-v1\x00"
LEAF_TAG = b"opledger-leaf-v1\x00"
TENANT_LEAF_TAG = b"opledger-tenant-leaf-v1\x00"
TENANT_HEAD_TAG = b"opledger-tenant-head-v1\x00"
TENANTS_EXTENSION = "opledger-tenants"
EVENT_ID_TAG = b"opledger event id v8\x00"
NAMESPACE = uuid.UUID("6f706c65-6467-4572-8000-000000000001")
ZERO_LINK = bytes(32)
FORMAT_VERSIONS = (1, 2)
OPERATION_PREFIX = "operation-"
# An erasure's stream (SubjectErased) is named by the destroyed key's id, a UUID that stands in
# for the operation's in the event id.
SUBJECT_PREFIX = "subject-"
# Streams whose last link is remembered (about 180 bytes each: ~47 MB at the limit, measured). A
# stream forgotten and met again is checked against the link the file names before it; in a
# whole export the root still covers it, in a slice each event's inclusion proof does.
MAX_REMEMBERED_STREAMS = 262_144
# Streams whose tenant a tenant export's check remembers: twice the exporter's 65,536
# (bin/export.rs, MAX_REMEMBERED_STREAMS), so any stream it forgot had its intent named again.
TENANT_STREAMS = 131_072
# Most hashes a proof may hold (2 x 64 covers any tree of up to 2^64 leaves).
MAX_PROOF_HASHES = 128
# Rows read from a Parquet file at a time.
PARQUET_BATCH_ROWS = 1024
# Bytes read from a Parquet file at a time (pages stream through it).
PARQUET_BUFFER_BYTES = 65_536


class Unreadable(Exception):
    """The file is not an export (or checkpoint) this verifier knows."""


# --- Ed25519 verification (RFC 8032 §5.1.7): the standard library has none. Slow (a few ms a
# signature) and not constant-time, which a verifier of public data does not need.

_P = 2**255 - 19
_L = 2**252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)


def _recover_x(y, sign):
    xx = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    x = pow(xx, (_P + 3) // 8, _P)
    if (x * x - xx) % _P != 0:
        x = x * _SQRT_M1 % _P
    if (x * x - xx) % _P != 0 or (x == 0 and sign):
        return None
    return _P - x if x & 1 != sign else x


def _add(p, q):
    x1, y1, z1, t1 = p
    x2, y2, z2, t2 = q
    a = (y1 - x1) * (y2 - x2) % _P
    b = (y1 + x1) * (y2 + x2) % _P
    c = 2 * t1 * t2 * _D % _P
    d = 2 * z1 * z2 % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _multiply(scalar, point):
    result = (0, 1, 1, 0)
    while scalar:
        if scalar & 1:
            result = _add(result, point)
        point = _add(point, point)
        scalar >>= 1
    return result


def _decode_point(raw):
    y = int.from_bytes(raw, "little")
    sign, y = y >> 255, y & ((1 << 255) - 1)
    if y >= _P:
        return None
    x = _recover_x(y, sign)
    return None if x is None else (x, y, 1, x * y % _P)


_GY = 4 * pow(5, _P - 2, _P) % _P
_G = (_recover_x(_GY, 0), _GY, 1, _recover_x(_GY, 0) * _GY % _P)


def ed25519_verify(public, message, signature):
    """Whether ``signature`` is ``public``'s Ed25519 signature of ``message``."""
    if len(public) != 32 or len(signature) != 64:
        return False
    a, r = _decode_point(public), _decode_point(signature[:32])
    s = int.from_bytes(signature[32:], "little")
    if a is None or r is None or s >= _L:
        return False
    k = int.from_bytes(hashlib.sha512(signature[:32] + public + message).digest(), "little") % _L
    left, right = _multiply(s, _G), _add(r, _multiply(k, a))
    return (left[0] * right[2] - right[0] * left[2]) % _P == 0 and (
        left[1] * right[2] - right[1] * left[2]
    ) % _P == 0


# --- C2SP signed-note and tlog-checkpoint


class VerifierKey:
    """A signed-note Ed25519 verifier key: ``<name>+<key id, 8 hex>+<base64(0x01 || public key)>``,
    or with ``algorithm=4`` a witness's C2SP tlog-cosignature/v1 key (``0x04 || public key``)."""

    def __init__(self, text, algorithm=1):
        try:
            name, key_id, encoded = text.strip().split("+", 2)
            raw = base64.b64decode(encoded, validate=True)
        except ValueError as error:
            raise Unreadable(f"the verifier key is not `<name>+<id>+<base64>` ({error})") from error
        if len(raw) != 33 or raw[0] != algorithm:
            raise Unreadable(f"the key is not an Ed25519 key of algorithm byte 0x0{algorithm} and 32 bytes")
        computed = hashlib.sha256(name.encode() + b"\n" + raw).digest()[:4]
        if computed.hex() != key_id.lower():
            raise Unreadable(f"the verifier key's id {key_id} is not the one of its name and key")
        self.name, self.key_id, self.public = name, computed, raw[1:]


class Checkpoint:
    """A tlog-checkpoint: origin, tree size and root hash, the tenants' map it signs (a Tree, or
    None), and whether its signature was checked."""

    def __init__(self, origin, size, root, signed_by, cosigners, tenants=None):
        self.origin, self.size, self.root = origin, size, root
        self.signed_by, self.cosigners = signed_by, cosigners
        self.tenants = tenants


class Tree:
    """A tree head: size and root."""

    def __init__(self, size, root):
        self.size, self.root = size, root


def parse_tenants_line(lines):
    """The tenants' map head named by a checkpoint's extension lines, or None."""
    for line in lines:
        words = line.split(" ")
        if words[0] != TENANTS_EXTENSION:
            continue
        if len(words) != 3 or not re.fullmatch(r"0|[1-9][0-9]{0,19}", words[1]):
            raise Unreadable(f"the line {line!r} is not `{TENANTS_EXTENSION} <size> <base64 root>`")
        try:
            root = base64.b64decode(words[2], validate=True)
        except ValueError as error:
            raise Unreadable(f"the tenants' map root {words[2]!r} is not base64") from error
        if len(root) != 32:
            raise Unreadable("the tenants' map root is not 32 bytes")
        return Tree(int(words[1]), root)
    return None


def open_checkpoint(note, key, witnesses=()):
    """Parses a signed checkpoint; with ``key``, its signature by that key must hold, and each of
    ``witnesses`` (tlog-cosignature/v1 keys) must have cosigned it."""
    if "\n\n" not in note:
        raise Unreadable("a checkpoint is its text, a blank line, then signature lines")
    text, signatures = note.split("\n\n", 1)
    text += "\n"
    lines = text.split("\n")
    if len(lines) < 4:
        raise Unreadable("a checkpoint's text has three lines: origin, tree size, root hash")
    origin, size_text, root_text = lines[0], lines[1], lines[2]
    if not re.fullmatch(r"0|[1-9][0-9]{0,19}", size_text):
        raise Unreadable(f"the checkpoint's size {size_text!r} is not a decimal number")
    try:
        root = base64.b64decode(root_text, validate=True)
    except ValueError as error:
        raise Unreadable(f"the checkpoint's root hash {root_text!r} is not base64") from error
    if len(root) != 32:
        raise Unreadable("the checkpoint's root hash is not 32 bytes")
    signed_by, cosigners, cosigned = None, [], set()
    for line in signatures.split("\n"):
        if not line:
            continue
        match = re.fullmatch(r"\u2014 (\S+) ([A-Za-z0-9+/=]+)", line)
        if not match:
            raise Unreadable(f"a signature line is not `\u2014 <name> <base64>`: {line!r}")
        name, raw = match.group(1), base64.b64decode(match.group(2))
        if key is not None and name == key.name and raw[:4] == key.key_id:
            if len(raw) == 68 and ed25519_verify(key.public, text.encode(), raw[4:]):
                signed_by = name
            continue
        for witness in witnesses:
            if name == witness.name and raw[:4] == witness.key_id and len(raw) == 76:
                # cosignature/v1: an 8-byte time, then Ed25519 over the time lines and the text.
                time = int.from_bytes(raw[4:12], "big")
                message = f"cosignature/v1\ntime {time}\n".encode() + text.encode()
                if not ed25519_verify(witness.public, message, raw[12:]):
                    raise Unreadable(f"the cosignature of witness `{name}` does not hold")
                cosigned.add(name)
        if name != origin:
            cosigners.append(name)
    if key is not None:
        if signed_by is None:
            raise Unreadable(f"the checkpoint is not signed by the verifier key `{key.name}`")
        if origin != key.name:
            raise Unreadable(f"the checkpoint is of the log `{origin}`, not `{key.name}`")
    for witness in witnesses:
        if witness.name not in cosigned:
            raise Unreadable(f"the checkpoint is not cosigned by the witness `{witness.name}`")
    tenants = parse_tenants_line(lines[3:-1])
    return Checkpoint(origin, int(size_text), root, signed_by, cosigners, tenants)


# --- RFC 6962 / RFC 9162 Merkle tree


def node(left, right):
    return hashlib.sha256(b"\x01" + left + right).digest()


def leaf_hash(position, stream, version, event_id, event_type, data, metadata):
    """The RFC 6962 leaf hash of an event, from the book's leaf encoding."""
    stream_bytes = stream.encode("utf-8")
    digest = hashlib.sha256(b"\x00" + LEAF_TAG)
    digest.update(position.to_bytes(8, "big"))
    digest.update(len(stream_bytes).to_bytes(2, "big") + stream_bytes)
    digest.update(version.to_bytes(8, "big"))
    digest.update(event_id.bytes)
    digest.update(len(event_type).to_bytes(2, "big") + event_type)
    digest.update(len(data).to_bytes(4, "big") + data)
    digest.update(len(metadata).to_bytes(4, "big") + metadata)
    return digest.digest()


def tenant_leaf_hash(position, leaf):
    """The leaf hash, in its tenant's tree, of the event at ``position`` with log leaf hash ``leaf``."""
    return hashlib.sha256(b"\x00" + TENANT_LEAF_TAG + position.to_bytes(8, "big") + leaf).digest()


def tenant_head_hash(tenant, size, root):
    """The leaf hash, in the tenants' map, of a tenant's tree head."""
    name = tenant.encode("utf-8")
    return hashlib.sha256(
        b"\x00" + TENANT_HEAD_TAG + len(name).to_bytes(2, "big") + name + size.to_bytes(8, "big") + root
    ).digest()


class RootBuilder:
    """The root of a growing tree, from O(log n) subtree hashes (each a perfect subtree)."""

    def __init__(self):
        self.size = 0
        self.stack = []  # (height, hash), heights strictly decreasing

    def push(self, leaf):
        height, value = 0, leaf
        while self.stack and self.stack[-1][0] == height:
            value = node(self.stack.pop()[1], value)
            height += 1
        self.stack.append((height, value))
        self.size += 1

    @classmethod
    def from_frontier(cls, size, hashes):
        """A tree of ``size`` leaves given by its frontier (one root per bit set in the size,
        largest first), or None when the hashes do not fit the size."""
        heights = [bit for bit in range(63, -1, -1) if size >> bit & 1]
        if len(heights) != len(hashes):
            return None
        builder = cls()
        builder.stack = list(zip(heights, hashes))
        builder.size = size
        return builder

    def push_subtree(self, height, value):
        """Appends a perfect subtree of ``2^height`` leaves, aligned where the tree ends."""
        grown = height
        while self.stack and self.stack[-1][0] == grown:
            value = node(self.stack.pop()[1], value)
            grown += 1
        self.stack.append((grown, value))
        self.size += 1 << height

    def root(self):
        if not self.stack:
            return hashlib.sha256(b"").digest()
        value = self.stack[-1][1]
        for _, left in reversed(self.stack[:-1]):
            value = node(left, value)
        return value


def range_heights(begin, end):
    """The heights of the subtrees of the compact range of leaves ``begin..end``, left to right:
    from each index, the largest aligned subtree that fits."""
    heights, at = [], begin
    while at < end:
        height = 63 if at == 0 else (at & -at).bit_length() - 1
        while (1 << height) > end - at:
            height -= 1
        heights.append(height)
        at += 1 << height
    return heights


def root_from_inclusion(index, size, leaf, proof):
    """The root an inclusion proof leads to (RFC 9162 §2.1.3.2), or None if it cannot hold."""
    if index >= size or len(proof) > MAX_PROOF_HASHES:
        return None
    fn, sn, value = index, size - 1, leaf
    for sibling in proof:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            value = node(sibling, value)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            value = node(value, sibling)
        fn, sn = fn >> 1, sn >> 1
    return value if sn == 0 else None


def consistent(old, new, proof):
    """Whether ``proof`` shows the tree ``new`` extends ``old`` (RFC 9162 §2.1.4.2)."""
    if old.size > new.size or len(proof) > MAX_PROOF_HASHES:
        return False
    if old.size == new.size:
        return not proof and old.root == new.root
    if old.size == 0:
        return not proof
    if not proof:
        return False
    if old.size & (old.size - 1) == 0:
        proof = [old.root] + list(proof)
    fn, sn = old.size - 1, new.size - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    first = second = proof[0]
    for sibling in proof[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            first, second = node(sibling, first), node(sibling, second)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            second = node(second, sibling)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and first == old.root and second == new.root


def parse_hashes(value, what):
    """Proof hashes: a list of base64 strings (NDJSON, JSON answers) or 32-byte runs (Parquet)."""
    if isinstance(value, (bytes, bytearray)):
        if len(value) % 32:
            raise ValueError(f"{what} is not a run of 32-byte hashes")
        return [bytes(value[i : i + 32]) for i in range(0, len(value), 32)]
    if not isinstance(value, list):
        raise ValueError(f"{what} is not a list of hashes")
    hashes = [base64.b64decode(text, validate=True) for text in value]
    if any(len(h) != 32 for h in hashes):
        raise ValueError(f"{what} holds a hash that is not 32 bytes")
    return hashes


# --- the chain and event ids


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
            EVENT_ID_TAG + millis.to_bytes(8, "big") + operation.bytes + version.to_bytes(8, "big") + content
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


_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")


def millis_of(value):
    """Unix milliseconds of an RFC 3339 time (truncated, as opledger's ids are), or None."""
    if isinstance(value, datetime.datetime):
        epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
        return (value - epoch) // datetime.timedelta(milliseconds=1)
    if not isinstance(value, str):
        return None
    match = _TIME.fullmatch(value)
    if not match:
        return None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    seconds = calendar.timegm((int(year), int(month), int(day), int(hour), int(minute), int(second)))
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return seconds * 1000 + int(((fraction or "") + "000")[:3])


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
    """A remembered stream's last version and link, unpacked from its compact form."""

    __slots__ = ("version", "link")

    def __init__(self, packed):
        self.version = int.from_bytes(packed[:8], "big")
        self.link = packed[8:] or None

    @staticmethod
    def pack(version, stored_link):
        """One bytes object (8-byte version, then the 32-byte link if any): ~75 bytes a stream
        instead of ~150 for an object holding an int and a bytes."""
        return version.to_bytes(8, "big") + (stored_link or b"")


class StreamMemory:
    """At most ``limit`` streams' packed states, the least recently met forgotten first, in two
    generations of plain dicts: a stream met is moved to the young one; when the young one is
    half the limit it becomes the old one and the old one is forgotten. (An OrderedDict kept
    exact recency at ~65 bytes more a stream: 17 MB at the limit, measured.)"""

    def __init__(self, limit):
        self.young, self.old = {}, {}
        self.half = max(1, limit // 2)
        self.forgot = False

    def get(self, key):
        value = self.young.get(key)
        if value is None:
            value = self.old.pop(key, None)
            if value is not None:
                self.put(key, value)
        return value

    def put(self, key, value):
        self.young[key] = value
        if len(self.young) >= self.half:
            self.forgot = self.forgot or bool(self.old)
            self.old, self.young = self.young, {}


def stream_key(stream):
    """The key a stream is remembered under: an operation's (or subject's) canonical name as its
    UUID's 16 bytes (49 bytes in memory instead of ~95), any other name as itself. Only the
    canonical lowercase spelling is shortened, so two names never share a key."""
    for prefix in (OPERATION_PREFIX, SUBJECT_PREFIX):
        if stream.startswith(prefix) and len(stream) == len(prefix) + 36:
            named = stream[len(prefix):]
            try:
                parsed = uuid.UUID(named)
            except ValueError:
                return stream
            if str(parsed) == named:
                return (prefix == SUBJECT_PREFIX).to_bytes(1, "big") + parsed.bytes
    return stream


def json_object(raw):
    """The JSON object in ``raw``, or an empty one (a verifier judges bytes it cannot read)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Event:
    """One event line or row, its fields parsed."""

    def __init__(self, record):
        self.position = int(record["position"])
        self.stream = str(record["stream"])
        self.version = int(record["version"])
        self.event_type = str(record["type"]).encode("utf-8")
        self.data = stored_bytes(record, "data")
        self.metadata = stored_bytes(record, "metadata")
        self.link = parse_link(record.get("chain"))
        self.previous_given = parse_link(record.get("previous_chain"))
        self.event_id = str(record["event_id"])
        self.time = record.get("time")
        self.context = record.get("context")
        proof = record.get("inclusion_proof")
        self.proof = None if proof is None else parse_hashes(proof, "inclusion_proof")
        self._leaf = None
        if self.position < 1 or self.version < 0:
            raise ValueError("positions start at 1 and versions at 0")

    def leaf(self):
        if self._leaf is None:
            self._leaf = leaf_hash(
                self.position, self.stream, self.version, uuid.UUID(self.event_id),
                self.event_type, self.data, self.metadata,
            )
        return self._leaf

    def data_json(self):
        return json_object(self.data)

    def metadata_json(self):
        return json_object(self.metadata)


class Verifier:
    """Checks the events of an export, whichever its format, as they stream past."""

    def __init__(self, header, key=None, kept=None, consistency_proof=None, witnesses=(), closing=None):
        self.witnesses = witnesses
        self.findings = []
        self.header = header
        self.tenant = header.get("tenant")
        self.from_bound = header.get("from")
        self.to_bound = header.get("to")
        self.from_beginning = self.from_bound is None
        self.streams = StreamMemory(MAX_REMEMBERED_STREAMS)
        self.stream_count = 0
        # Each stream's tenant in a tenant export, bounded: the exporter names an operation's
        # intent again (a context line) once it has met 65,536 other streams, and this always
        # remembers the TENANT_STREAMS / 2 met last.
        self.tenants = StreamMemory(TENANT_STREAMS)
        self.last_position = None
        self.first = None
        self.last = None
        self.before = None
        self.after = None
        self.events = 0
        self.kept = kept
        self.kept_root_checked = False
        self.tenant_complete = False
        self.checkpoint = None
        self.proof = header.get("proof")
        self.root = RootBuilder()
        # A whole tenant's export: the tenant's tree, recomputed from its events.
        whole_tenant = self.tenant is not None and self.from_bound is None and self.to_bound is None
        self.tenant_tree = RootBuilder() if whole_tenant else None
        # A slice of a tenant: its tree folded from the frontier of the leaves before its edge,
        # which the closing record (read first: the file's last line, or Parquet's footer) gives.
        self.tenant_slice = self.tenant is not None and not whole_tenant
        self.tenant_edges = {}
        self.tenant_left_size = 0
        self.tenant_right_count = 0
        if self.tenant_slice:
            given = (closing or {}).get("tenant_tree") if isinstance(closing, dict) else None
            try:
                left = parse_hashes(given["left"], "left")
                self.tenant_left_size = int(given["left_size"])
                self.tenant_tree = RootBuilder.from_frontier(self.tenant_left_size, left)
            except (KeyError, TypeError, ValueError):
                self.tenant_tree = None
        self.check_header(key, consistency_proof)

    def found(self, number, record, kind, detail):
        self.findings.append(Finding(number, record if isinstance(record, dict) else {}, kind, detail))

    # -- the header's claims

    def check_header(self, key, consistency_proof):
        header = self.header
        whole = self.tenant is None and self.from_bound is None and self.to_bound is None
        if bool(header.get("contiguous_positions")) != (self.tenant is None):
            self.found(1, {}, "header", f"contiguous_positions is {header.get('contiguous_positions')} in "
                       f"{'a tenant' if self.tenant else 'an all-tenant'} export; it is judged by the events, not by the claim")
        note = header.get("checkpoint")
        if header["opledger_export"] < 2 or note is None:
            self.proof = None
            if key is not None or self.kept is not None:
                self.found(1, {}, "unproven", "the export carries no checkpoint: nothing ties its events to a signed tree head")
            return
        try:
            self.checkpoint = open_checkpoint(note, key, self.witnesses)
        except Unreadable as error:
            self.found(1, {}, "header", f"its checkpoint is refused: {error}")
            self.proof = None
            return
        size = self.checkpoint.size
        if header.get("tree_size") != size or header.get("log_head") != size:
            self.found(1, {}, "header", f"it claims tree_size {header.get('tree_size')} and log_head "
                       f"{header.get('log_head')}; its checkpoint is of {size} events")
        wanted = "root" if whole else "inclusion"
        if self.proof != wanted:
            self.found(1, {}, "header", f"proof is {self.proof!r}; "
                       f"{'a whole-log' if whole else 'a slice or tenant'} export is proved by {wanted!r}")
            self.proof = wanted
        if self.kept is not None:
            self.check_kept(consistency_proof)

    def check_kept(self, consistency_proof):
        kept, latest = self.kept, self.checkpoint
        if kept.size > latest.size:
            self.found(1, {}, "rolled back", f"the kept checkpoint covers {kept.size} events, the export's only {latest.size}: the log shrank")
        elif self.proof == "root":
            pass  # proved by the root of the first kept.size leaves, as they stream past
        elif consistency_proof is None:
            self.found(1, {}, "unproven", "a slice cannot show it extends the kept checkpoint without --consistency-proof")
        elif not consistent(kept, latest, consistency_proof):
            self.found(1, {}, "rolled back", f"the export's checkpoint of {latest.size} events does not extend the kept one of {kept.size}")
        else:
            self.kept_root_checked = True

    # -- each event

    def check(self, number, record):
        try:
            event = Event(record)
        except (KeyError, TypeError, ValueError) as error:
            self.found(number, record, "malformed", f"missing or bad field ({error})")
            return
        found = lambda kind, detail: self.found(number, record, kind, detail)  # noqa: E731
        self.check_proof(event, found)
        self.check_time(event, found)
        self.check_tenant(event, found)
        if event.context is None:
            self.events += 1
            self.check_order_and_chain(number, record, event, found)
        else:
            self.check_context(event, found)

    def check_proof(self, event, found):
        if self.proof is None:
            return
        size = self.checkpoint.size
        if event.position > size:
            found("inserted", f"position {event.position} is past the checkpoint's {size} events")
            return
        if self.proof == "root" and event.context is None:
            if event.position != self.root.size + 1:
                return  # named by the order check; the root will not match either
            self.root.push(event.leaf())
            if self.kept is not None and self.root.size == self.kept.size:
                if self.root.root() != self.kept.root:
                    found("rewritten", f"the first {self.kept.size} events do not make the kept checkpoint's root: "
                          "history it covered was changed since")
                self.kept_root_checked = True
            return
        if event.proof is None:
            found("unproven", "it carries no inclusion proof")
        elif root_from_inclusion(event.position - 1, size, event.leaf(), event.proof) != self.checkpoint.root:
            found("edited", f"it is not the event at position {event.position} in the checkpoint's tree "
                  "(its inclusion proof does not lead to the checkpoint's root)")

    def check_time(self, event, found):
        if event.time is None:
            return
        millis = millis_of(event.time)
        if millis is None:
            found("time", f"its time {event.time!r} is not an RFC 3339 time")
            return
        try:
            given = uuid.UUID(event.event_id)
        except ValueError:
            return
        if given.version == 8 and int.from_bytes(given.bytes[:6], "big") != millis:
            found("time", f"its time {event.time} is not its event id's time "
                  f"({int.from_bytes(given.bytes[:6], 'big')} ms)")
        recorded = millis_of(event.data_json().get("at"))
        if recorded is not None and recorded != millis:
            found("time", f"its time {event.time} is not the time recorded in its data")

    def check_tenant(self, event, found):
        if self.tenant is None:
            return
        if event.version == 0:
            tenant = event.data_json().get("tenant")
            # The export's own tenant is kept as True: one shared object, not a name per stream.
            self.tenants.put(stream_key(event.stream), True if tenant == self.tenant else tenant)
        else:
            tenant = self.tenants.get(stream_key(event.stream))
            tenant = self.tenant if tenant is True else tenant
            if tenant is None and event.context is None:
                found("unproven", "nothing in the export shows its operation's tenant (its intent is not in the file)")
                return
        if tenant != self.tenant and event.context in (None, "intent"):
            found("foreign", f"its operation is of tenant {tenant!r}, not {self.tenant!r}")
        elif event.context in (None, "tenant_before", "tenant_after") and self.tenant_tree is not None:
            self.tenant_tree.push(tenant_leaf_hash(event.position, event.leaf()))

    def check_context(self, event, found):
        if self.proof != "inclusion" or event.proof is None:
            found("unproven", f"a {event.context!r} context line without an inclusion proof proves nothing")
        if event.context == "before":
            if self.before is not None or self.first is not None:
                found("moved or inserted", "a 'before' context line must come first, once")
            self.before = event
        elif event.context == "after":
            if self.after is not None:
                found("moved or inserted", "a second 'after' context line")
            self.after = event
        elif event.context in ("tenant_before", "tenant_after"):
            edge = event.context[len("tenant_"):]
            if not self.tenant_slice or edge in self.tenant_edges:
                found("moved or inserted", f"a {event.context!r} context line outside a tenant's slice, or a second one")
            elif edge == "before" and (self.first is not None or "after" in self.tenant_edges):
                found("moved or inserted", "the 'tenant_before' context line must come before the slice's events")
            self.tenant_edges[edge] = event
        elif event.context != "intent":
            found("malformed", f"unknown context {event.context!r}")

    def check_order_and_chain(self, number, record, event, found):
        if self.after is not None or "after" in self.tenant_edges:
            found("moved or inserted", "an event after the 'after' context line")
        position, stream, version = event.position, event.stream, event.version
        last_position = self.last_position
        if last_position is not None and position <= last_position:
            found("moved or inserted", f"position {position} does not follow {last_position}")
        elif self.tenant is None and last_position is not None and position > last_position + 1:
            missing = f"{last_position + 1}" if position == last_position + 2 else f"{last_position + 1}–{position - 1}"
            found("removed", f"position(s) {missing} missing before this event")
        if self.first is None:
            self.first = event
        if last_position is None or position > last_position:
            self.last = event
        key = stream_key(stream)
        packed = self.streams.get(key)
        seen = None if packed is None else StreamState(packed)
        if seen is not None:
            previous = seen.link
            if version <= seen.version:
                found("moved or inserted", f"version {version} after version {seen.version} of its stream")
                previous = event.previous_given
            elif version > seen.version + 1:
                found("removed", f"{versions(seen.version + 1, version - 1)} of its stream missing before it")
                previous = event.previous_given
            elif event.previous_given != seen.link:
                found("edited", f"its previous_chain is not the link of its stream's version {seen.version} "
                      "before it in the file (one of the two was rewritten)")
        elif version == 0:
            previous = None
        else:
            if self.from_beginning and not self.streams.forgot:
                found("removed", f"the stream's {versions(0, version - 1)} missing before it")
            previous = event.previous_given
        problems = []
        if event.link is None:
            problems.append("it carries no chain link")
        elif link(previous, version, event.event_type, event.data) != event.link:
            problems.append("its content does not hash to its chain link")
        if not event_id_matches(event.event_id, stream, version, event.event_type, event.data):
            problems.append("its event id does not belong to this content at this version")
        stored = event.metadata_json().get("chain")
        if event.link is not None and stored is not None and stored != event.link.hex():
            problems.append("its chain column is not the link stored in its metadata")
        if problems:
            found("edited", "; ".join(problems))
        if seen is None:
            self.stream_count += 1
        if seen is None or version > seen.version:
            self.streams.put(key, StreamState.pack(version, event.link))
        self.last_position = position if last_position is None else max(position, last_position)

    # -- the end

    def finish(self, end):
        self.check_end(end)
        if self.checkpoint is None:
            return
        size = self.checkpoint.size
        if self.proof == "root":
            if self.root.size != size:
                self.found(0, {}, "truncated" if self.root.size < size else "inserted",
                           f"the export holds leaves 1–{self.root.size} in order; its checkpoint covers {size}")
            elif self.root.root() != self.checkpoint.root:
                self.found(0, {}, "rewritten", "its events do not make the checkpoint's root: an event was changed, "
                           "added, removed or moved")
            if self.kept is not None and not self.kept_root_checked and self.kept.size <= size:
                self.found(0, {}, "unproven", f"the export does not reach the kept checkpoint's {self.kept.size} events")
        elif self.tenant is None:
            self.check_edges(size)
        else:
            self.check_tenant_range()
            self.check_tenant_complete(end)

    def check_tenant_complete(self, end):
        """A whole tenant's export: its events make the tenant's tree that the checkpoint's
        tenants' map holds, so none of the tenant's events up to the checkpoint is missing."""
        map_head = self.checkpoint.tenants
        if map_head is None:
            return  # a checkpoint that signs no tenants' map: not claimed
        closing = end[1] if end is not None and isinstance(end[1], dict) else {}
        given = closing.get("tenant_tree")
        tree = self.tenant_tree
        try:
            if tree is None:
                raise ValueError("no frontier of the tenant's leaves before the slice")
            index = int(given["map_index"])
            proof = parse_hashes(given["map_proof"], "map_proof")
            right = parse_hashes(given["right"], "right") if self.tenant_slice else None
            size = int(given["size"]) if self.tenant_slice else None
        except (KeyError, TypeError, ValueError) as error:
            self.found(0, {}, "unproven", f"the closing record carries no proof of the tenant's tree in the "
                       f"checkpoint's tenants' map ({error}): nothing shows no event of the tenant was left out")
            return
        if self.tenant_slice and not self.close_tenant_slice(tree, size, right):
            return
        leaf = tenant_head_hash(self.tenant, tree.size, tree.root())
        if root_from_inclusion(index, map_head.size, leaf, proof) != map_head.root:
            self.found(0, {}, "incomplete", f"the tenant's {tree.size} event(s) in the file do not make the tree "
                       f"the checkpoint signs for tenant {self.tenant!r}: an operation or events of it were left out, "
                       "cut off its end, or added")
        else:
            self.tenant_complete = True

    def close_tenant_slice(self, tree, size, right):
        """Folds the compact range of the tenant's leaves after the slice's edge into ``tree``, for
        a tree of ``size`` leaves (the closing record's claim, which the map's leaf then holds);
        whether that fits and the slice's edges hold. Names what does not as INCOMPLETE."""
        self.tenant_right_count = len(right)
        heights = range_heights(tree.size, size)
        if len(heights) != len(right):
            self.found(0, {}, "incomplete", f"the tenant's {tree.size} leaves up to the slice's end and the "
                       f"{len(right)} subtrees after it do not make a tree of {size} leaves: events of the "
                       "slice were left out, cut off its end, or added")
            return False
        for height, value in zip(heights, right):
            tree.push_subtree(height, value)
        return self.tenant_slice_edges_hold()

    def tenant_slice_edges_hold(self):
        """A slice of a tenant: the tenant's events just outside it lie outside its bounds, so
        every event of the tenant inside them is one of the slice's (the tree shows none between
        the edges is missing). Names what does not hold as INCOMPLETE."""
        problems = []
        before, after = self.tenant_edges.get("before"), self.tenant_edges.get("after")
        for edge, bound, name in ((before, self.from_bound, "from"), (after, self.to_bound, "to")):
            if edge is None or bound is None:
                continue
            if isinstance(bound, int):
                inside = edge.position >= bound if name == "from" else edge.position <= bound
            else:
                millis = millis_of(edge.time)
                inside = millis is None or (millis >= millis_of(bound) if name == "from" else millis <= millis_of(bound))
            if inside:
                problems.append(f"the tenant's event at position {edge.position}, given as just {'before' if name == 'from' else 'after'} "
                                f"the slice, lies inside `{name}` {bound}")
        if before is None and self.tenant_left_size > 0:
            problems.append("nothing shows the tenant's events before the slice lie before `from` "
                            "(no 'tenant_before' context line)")
        if after is None and self.tenant_right_count > 0:
            problems.append("nothing shows the tenant's events after the slice lie after `to` "
                            "(no 'tenant_after' context line)")
        for problem in problems:
            self.found(0, {}, "incomplete", problem)
        return not problems

    def check_edges(self, size):
        """A slice of every tenant: its ends are where its header says, and nothing beside them
        was left out (the events just outside, with their proofs, show it)."""
        first, last = self.first, self.last
        if first is None:
            self.found(0, {}, "unproven", "an empty slice proves nothing about its range")
            return
        start = self.from_bound
        if start is None and first.position != 1:
            self.found(0, {}, "removed", f"it claims to start at the log's beginning but starts at position {first.position}")
        elif isinstance(start, int) and first.position != start:
            self.found(0, {}, "removed", f"it claims to start at position {start} but starts at {first.position}")
        elif isinstance(start, str):
            bound = millis_of(start)
            if bound is None or millis_of(first.time) is None or millis_of(first.time) < bound:
                self.found(0, {}, "header", f"its first event's time {first.time} is not at or after `from` {start}")
            elif first.position > 1 and not (
                self.before is not None and self.before.position == first.position - 1
                and millis_of(self.before.time) is not None and millis_of(self.before.time) < bound
            ):
                self.found(0, {}, "removed", f"nothing proves the event before position {first.position} lies before `from` {start}")
        end = self.to_bound
        if end is None and last.position != size:
            self.found(0, {}, "truncated", f"it claims to reach its checkpoint's {size} events but ends at position {last.position}")
        elif isinstance(end, int) and last.position != min(end, size):
            self.found(0, {}, "truncated", f"it claims to end at position {min(end, size)} but ends at {last.position}")
        elif isinstance(end, str):
            bound = millis_of(end)
            if bound is None or millis_of(last.time) is None or millis_of(last.time) > bound:
                self.found(0, {}, "header", f"its last event's time {last.time} is not at or before `to` {end}")
            elif last.position < size and not (
                self.after is not None and self.after.position == last.position + 1
                and millis_of(self.after.time) is not None and millis_of(self.after.time) > bound
            ):
                self.found(0, {}, "truncated", f"nothing proves the event after position {last.position} lies after `to` {end}")

    def check_tenant_range(self):
        """A tenant's export: each event lies inside the range its header names."""
        for bound, name in ((self.from_bound, "from"), (self.to_bound, "to")):
            edge = self.first if name == "from" else self.last
            if bound is None or edge is None:
                continue
            if isinstance(bound, int):
                outside = edge.position < bound if name == "from" else edge.position > bound
            else:
                millis = millis_of(edge.time)
                outside = millis is None or (millis < millis_of(bound) if name == "from" else millis > millis_of(bound))
            if outside:
                self.found(0, {}, "header", f"position {edge.position} lies outside `{name}` {bound}")

    def check_end(self, end):
        if end is None:
            self.found(0, {}, "truncated", "the file has no closing line: events may be missing at its end")
            return
        number, closing = end
        if not isinstance(closing, dict):
            self.found(number, {}, "malformed", "the closing line is not an object")
            return
        if closing.get("events") != self.events:
            self.found(number, {}, "removed or inserted", f"the closing line counts {closing.get('events')} events, the file holds {self.events}")
        if closing.get("last_position") != self.last_position:
            self.found(number, {}, "removed or inserted", f"the closing line ends at position {closing.get('last_position')}, the file at {self.last_position}")

    def summary(self):
        summary = {"events": self.events, "streams": self.stream_count, "findings": len(self.findings)}
        if self.checkpoint is not None:
            summary["tree_size"] = self.checkpoint.size
            summary["signed_by"] = self.checkpoint.signed_by
            summary["proof"] = self.proof
            if self.tenant is not None:
                summary["tenant_complete"] = self.tenant_complete
                summary["tenant_slice"] = self.tenant_slice
        return summary


def versions(first, last):
    return f"version {first}" if first == last else f"versions {first}–{last}"


def check_header(header):
    if not isinstance(header, dict) or "opledger_export" not in header:
        raise Unreadable("the first line is not an export header (no opledger_export)")
    if header["opledger_export"] not in FORMAT_VERSIONS:
        raise Unreadable(f"export format {header['opledger_export']} is not one this verifier knows {FORMAT_VERSIONS}")
    if header.get("chain") != "opledger-chain-v1":
        raise Unreadable(f"chain {header.get('chain')!r} is not one this verifier knows")
    if header["opledger_export"] >= 2 and header.get("leaf") != "opledger-leaf-v1":
        raise Unreadable(f"leaf {header.get('leaf')!r} is not one this verifier knows")


def closing_of(lines):
    """The closing record of an export given as a list of lines (its last `end` line), or None."""
    for line in reversed(lines):
        if '"end"' in line:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                return None
            return record.get("end") if isinstance(record, dict) else None
    return None


def read_closing(path):
    """The closing record of an NDJSON export file, read from its end (a tenant slice's check
    needs it before the events)."""
    with open(path, "rb") as file:
        size = file.seek(0, 2)
        file.seek(max(0, size - PARQUET_BUFFER_BYTES))
        tail = file.read().decode("utf-8", errors="replace").splitlines()
    return closing_of(tail[1:] if size > PARQUET_BUFFER_BYTES else tail)


def verify_lines(lines, key=None, kept=None, consistency_proof=None, witnesses=(), closing=None):
    """Checks an NDJSON export given as an iterable of lines; returns (findings, summary). A
    tenant slice's check needs the closing record first: given, or taken from a list of lines."""
    if closing is None and isinstance(lines, list):
        closing = closing_of(lines)
    iterator = iter(enumerate(lines, start=1))
    try:
        _, first = next(iterator)
        header = json.loads(first)
    except (StopIteration, json.JSONDecodeError) as error:
        raise Unreadable(f"the first line is not an export header ({error})") from error
    check_header(header)
    verifier = Verifier(header, key, kept, consistency_proof, witnesses, closing)
    end = None
    for number, line in iterator:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            verifier.found(number, {}, "malformed", f"not JSON ({error})")
            continue
        if end is not None:
            verifier.found(number, record, "inserted", "a line after the closing line")
            continue
        if isinstance(record, dict) and "end" in record:
            end = (number, record["end"])
            continue
        verifier.check(number, record)
    verifier.finish(end)
    return verifier.findings, verifier.summary()


def verify_parquet(path, key=None, kept=None, consistency_proof=None, witnesses=()):
    """Checks a Parquet export (needs pyarrow) batch by batch; returns (findings, summary)."""
    try:
        import pyarrow
        import pyarrow.parquet as pq
    except ImportError as error:
        raise Unreadable("reading Parquet needs pyarrow (pip install pyarrow)") from error
    # The system allocator hands freed batches back; pyarrow's default pool kept them (measured on
    # a 100k-event export: 110 MB peak instead of 175 MB). And no pre-buffering: with it, reading
    # the batches of a 900k-event export alone peaked at 353 MB, without it at 131 MB.
    pyarrow.set_memory_pool(pyarrow.system_memory_pool())
    try:
        # Pages streamed through a small buffer instead of whole column chunks read at once, and
        # columns decoded one after another: reading a 1M-event export alone peaked at 128 MB
        # with threads and whole chunks, 103 MB without (measured with /usr/bin/time -v).
        file = pq.ParquetFile(path, pre_buffer=False, buffer_size=PARQUET_BUFFER_BYTES)
        metadata = file.schema_arrow.metadata or {}
    except Exception as error:  # pyarrow raises several kinds for a damaged or cut file
        raise Unreadable(f"not a readable Parquet file ({error})") from error
    try:
        header = json.loads(metadata[b"opledger_export.header"])
    except (KeyError, ValueError) as error:
        raise Unreadable("the Parquet file has no opledger_export.header metadata") from error
    check_header(header)
    end = metadata.get(b"opledger_export.end")
    closing = (0, json.loads(end)) if end is not None else None
    verifier = Verifier(header, key, kept, consistency_proof, witnesses, closing[1] if closing else None)
    number = 0
    try:
        for batch in file.iter_batches(batch_size=PARQUET_BATCH_ROWS, use_threads=False):
            for row in batch.to_pylist():
                number += 1
                for name in ("data", "metadata"):
                    value = row.pop(name, None)
                    if isinstance(value, (bytes, bytearray)):
                        row[name + "_bytes"] = bytes(value)
                verifier.check(number, row)
    except OSError as error:
        raise Unreadable(f"not a readable Parquet file ({error})") from error
    verifier.finish(closing)
    for finding in verifier.findings:
        finding.unit = "row"
    return verifier.findings, verifier.summary()


def is_parquet(path):
    """Whether the file starts with Parquet's magic bytes."""
    with open(path, "rb") as file:
        return file.read(4) == b"PAR1"


def read_checkpoint(path, key, witnesses=()):
    with open(path, encoding="utf-8") as file:
        return open_checkpoint(file.read(), key, witnesses)


def read_consistency_proof(path):
    with open(path, encoding="utf-8") as file:
        answer = json.load(file)
    try:
        return parse_hashes(answer["consistency_proof"], "consistency_proof")
    except (KeyError, TypeError, ValueError) as error:
        raise Unreadable(f"{path} is not a consistency proof answer ({error})") from error


def parse_leaf(leaf):
    """The fields of a leaf (the book's leaf encoding), or None if it is not one."""
    try:
        if not leaf.startswith(LEAF_TAG):
            return None
        at = len(LEAF_TAG)

        def take(size):
            nonlocal at
            value = leaf[at : at + size]
            if len(value) != size:
                raise ValueError("short")
            at += size
            return value

        position = int.from_bytes(take(8), "big")
        stream = take(int.from_bytes(take(2), "big")).decode("utf-8")
        version = int.from_bytes(take(8), "big")
        event_id = uuid.UUID(bytes=take(16))
        event_type = take(int.from_bytes(take(2), "big"))
        data = take(int.from_bytes(take(4), "big"))
        metadata = take(int.from_bytes(take(4), "big"))
        if at != len(leaf):
            return None
        return position, stream, version, event_id, event_type, data, metadata
    except (ValueError, UnicodeDecodeError):
        return None


def verify_answer(answer, key, kept, consistency_proof, witnesses=()):
    """Checks an answer of ``GET /v1/operations/{id}?as_of=…&proof=true``: every event folded
    into it is proved against the signed checkpoint, and they are its operation's versions 0, 1,
    2… up to the moment, each with its link and id. Returns (problems, lines to print)."""
    problems, lines = [], []
    proof = answer.get("proof") or {}
    checkpoint = open_checkpoint(proof.get("checkpoint") or "", key, witnesses)
    operation, moment = answer.get("operation_id"), answer.get("as_of_position")
    if proof.get("tree_size") != checkpoint.size:
        problems.append(f"the proof's tree_size {proof.get('tree_size')} is not its checkpoint's {checkpoint.size}")
    previous = None
    for version, event in enumerate(proof.get("events") or []):
        leaf = base64.b64decode(event.get("leaf", ""))
        fields = parse_leaf(leaf)
        where = f"version {version}, position {event.get('position')}"
        if fields is None:
            problems.append(f"{where}: its leaf is not an opledger leaf")
            continue
        position, stream, leaf_version, event_id, event_type, data, metadata = fields
        hash_ = hashlib.sha256(b"\x00" + leaf).digest()
        proof_hashes = parse_hashes(event.get("inclusion_proof"), "inclusion_proof")
        if root_from_inclusion(position - 1, checkpoint.size, hash_, proof_hashes) != checkpoint.root:
            problems.append(f"{where}: its leaf is not in the checkpoint's tree at position {position}")
        if (position, leaf_version, stream) != (event.get("position"), version, f"{OPERATION_PREFIX}{operation}"):
            problems.append(f"{where}: its leaf is of {stream} v{leaf_version} at position {position}")
        if moment is not None and position > moment:
            problems.append(f"{where}: it lies after the moment the answer is as of (position {moment})")
        stored = json_object(metadata).get("chain")
        if stored is None or link(previous, leaf_version, event_type, data).hex() != stored:
            problems.append(f"{where}: its content does not hash to its chain link")
        try:
            previous = bytes.fromhex(stored) if isinstance(stored, str) and len(stored) == 64 else None
        except ValueError:  # not hex: named above, as a link its content does not hash to
            previous = None
        if not event_id_matches(str(event_id), stream, leaf_version, event_type, data):
            problems.append(f"{where}: its event id does not belong to its content")
        lines.append(f"  v{leaf_version} position {position} {event_type.decode()} at {json_object(data).get('at')}")
    if not proof.get("events"):
        problems.append("the answer proves no event")
    if kept is not None:
        if kept.size > checkpoint.size:
            problems.append(f"the kept checkpoint covers {kept.size} events, the answer's only {checkpoint.size}: the log shrank")
        elif not consistent(kept, checkpoint, consistency_proof or []):
            problems.append(f"the answer's checkpoint of {checkpoint.size} events does not extend the kept one of {kept.size} (give --consistency-proof)")
    head = (f"operation {operation} as of position {moment}, state {answer.get('state')}: "
            f"{len(lines)} event(s) proved against the checkpoint of {checkpoint.size} events")
    return problems, [head] + lines


def arguments(argv):
    parser = argparse.ArgumentParser(
        prog=argv[0], description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("export", nargs="?", help="the export (NDJSON or Parquet)")
    parser.add_argument("--verifier-key", help="the log's verifier key (`opledger keys generate` prints it)")
    parser.add_argument("--kept", help="a checkpoint kept earlier, which the export's (or --checkpoint) must extend")
    parser.add_argument("--checkpoint", help="with no export: the later checkpoint to hold --kept against")
    parser.add_argument("--consistency-proof", help="the JSON of GET /v1/log/proof/consistency?from=M&to=N")
    parser.add_argument("--witness-key", action="append", default=[],
                        help="a witness's tlog-cosignature/v1 key whose cosignature the checked checkpoint must carry (repeatable)")
    parser.add_argument("--answer", help="instead of an export: an answer of GET /v1/operations/{id}?as_of=…&proof=true")
    parsed = parser.parse_args(argv[1:])
    if parsed.export is None and parsed.answer is None and (parsed.checkpoint is None or parsed.kept is None):
        parser.error("give an export, an --answer, or --kept and --checkpoint (with --consistency-proof)")
    return parsed


def verify_checkpoints(args, key):
    kept = read_checkpoint(args.kept, key)
    later = read_checkpoint(args.checkpoint, key, args.witnesses)
    proof = read_consistency_proof(args.consistency_proof) if args.consistency_proof else []
    if kept.origin != later.origin:
        print(f"ROLLED BACK: the checkpoints are of two logs, {kept.origin} and {later.origin}")
        return 1
    if not consistent(kept, later, proof):
        print(f"ROLLED BACK: the checkpoint of {later.size} events does not extend the kept one of {kept.size}")
        return 1
    signed = f"signed by {key.name}" if key else "signatures NOT checked (give --verifier-key)"
    print(f"OK: the checkpoint of {later.size} events extends the kept one of {kept.size}; {signed}")
    return 0


def main(argv):
    args = arguments(argv)
    try:
        key = VerifierKey(args.verifier_key) if args.verifier_key else None
        args.witnesses = [VerifierKey(text, algorithm=4) for text in args.witness_key]
        if args.answer is not None:
            with open(args.answer, encoding="utf-8") as file:
                answer = json.load(file)
            kept = read_checkpoint(args.kept, key) if args.kept else None
            proof = read_consistency_proof(args.consistency_proof) if args.consistency_proof else None
            problems, lines = verify_answer(answer, key, kept, proof, args.witnesses)
            for problem in problems:
                print(f"NOT PROVED: {problem}")
            if problems:
                return 1
            signed = f"signed by {key.name}" if key else "its signature NOT checked (give --verifier-key)"
            print(f"OK: {lines[0]}, {signed}" + (f"; it extends the kept checkpoint of {kept.size} events" if kept else ""))
            print("\n".join(lines[1:]))
            return 0
        if args.export is None:
            return verify_checkpoints(args, key)
        kept = read_checkpoint(args.kept, key) if args.kept else None
        proof = read_consistency_proof(args.consistency_proof) if args.consistency_proof else None
        if is_parquet(args.export):
            findings, summary = verify_parquet(args.export, key, kept, proof, args.witnesses)
        else:
            closing = read_closing(args.export)
            with open(args.export, encoding="utf-8") as file:
                findings, summary = verify_lines(file, key, kept, proof, args.witnesses, closing)
    except (OSError, UnicodeDecodeError, ValueError, Unreadable) as error:
        print(f"error: cannot verify: {error}", file=sys.stderr)
        return 2
    for finding in findings:
        print(finding)
    if findings:
        print(f"{len(findings)} problem(s) in {summary['events']} event(s) of {summary['streams']} stream(s)")
        return 1
    line = f"OK: {summary['events']} event(s) of {summary['streams']} stream(s); every link and id recomputed"
    if "tree_size" in summary:
        how = "the leaves make its root" if summary["proof"] == "root" else "every event's inclusion proof holds"
        line += f"; against the checkpoint of {summary['tree_size']} events, {how}"
        if summary.get("tenant_complete") and summary.get("tenant_slice"):
            line += ("; the slice's events and the tenant's events just outside it make the tenant's tree the "
                     "checkpoint signs (none of the tenant's events between them left out)")
        elif summary.get("tenant_complete"):
            line += "; the tenant's events make the tenant's tree the checkpoint signs (none left out)"
        elif "tenant_complete" in summary:
            line += ("; each event is checked, but that none of the tenant's events was left out is NOT proved "
                     "(its checkpoint signs no tenants' map)")
        line += f"; signed by {summary['signed_by']}" if summary["signed_by"] else "; its signature NOT checked (give --verifier-key)"
        if kept is not None:
            line += f"; it extends the kept checkpoint of {kept.size} events"
    else:
        line += "; no checkpoint: the events are not proved against a signed tree head"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
