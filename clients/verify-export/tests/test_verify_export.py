"""The verifier's own tests, on a real export (an `opledger demo` ledger exported by
`opledger export`, in fixtures/) and on copies of it tampered with in each way an event can be:
its data edited, two events swapped, one removed, one inserted, the end cut off. Each tampered
copy must be refused with a line naming the event tampered with. Standard library only:
`python3 -m unittest discover -s clients/verify-export/tests`."""

import base64
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import verify_export  # noqa: E402

FIXTURE = os.path.join(HERE, "fixtures", "demo-export.ndjson")


def lines():
    with open(FIXTURE, encoding="utf-8") as file:
        return file.read().splitlines()


def events(all_lines):
    """(index, parsed) of each event line."""
    return [
        (index, json.loads(line))
        for index, line in enumerate(all_lines)
        if index > 0 and "end" not in json.loads(line)
    ]


def verify(all_lines):
    findings, _ = verify_export.verify_lines(all_lines)
    return [str(finding) for finding in findings]


def later_event_of_a_stream(all_lines):
    """An event that is neither first in the file nor first of its stream."""
    for index, event in events(all_lines):
        if event["version"] >= 2 and index > 1:
            return index, event
    raise AssertionError("the fixture has a stream with three events")


class AnIntactExport(unittest.TestCase):
    def test_verifies_with_no_finding(self):
        findings, summary = verify_export.verify_lines(lines())
        self.assertEqual([str(f) for f in findings], [])
        self.assertEqual(summary["events"], len(lines()) - 2)

    def test_verifies_from_the_command_line_with_exit_status_0(self):
        run = subprocess.run(
            [sys.executable, os.path.join(os.path.dirname(HERE), "verify_export.py"), FIXTURE],
            capture_output=True,
            text=True,
        )
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("OK:", run.stdout)


class ATamperedExport(unittest.TestCase):
    def assert_named(self, findings, event, kind):
        named = [
            f for f in findings
            if f"position {event['position']}" in f or f"{event['stream']} v{event['version']}" in f
        ]
        self.assertTrue(named, f"no finding names position {event['position']}: {findings}")
        self.assertTrue(any(kind in f for f in findings), f"no {kind} finding: {findings}")

    def test_with_an_edited_event_names_it(self):
        all_lines = lines()
        index, event = later_event_of_a_stream(all_lines)
        event["data"] = event["data"].replace('"at":"2', '"at":"1', 1)
        self.assertNotEqual(json.dumps(event), all_lines[index])
        all_lines[index] = json.dumps(event)
        findings = verify(all_lines)
        self.assert_named(findings, event, "EDITED")
        # Its chain link and, since the edit moved the time in its data, its time: both about
        # this event; none about the events after it.
        self.assertTrue(
            all(f"position {event['position']}," in f for f in findings),
            f"one edit is named on its event, not a cascade: {findings}",
        )

    def test_with_two_events_swapped_names_the_one_out_of_order(self):
        all_lines = lines()
        index, event = later_event_of_a_stream(all_lines)
        all_lines[index - 1], all_lines[index] = all_lines[index], all_lines[index - 1]
        findings = verify(all_lines)
        moved = json.loads(all_lines[index])
        self.assert_named(findings, moved, "MOVED")
        self.assertFalse(any("EDITED" in f for f in findings), "the swapped events are intact")

    def test_with_an_event_removed_names_what_is_missing(self):
        all_lines = lines()
        index, event = later_event_of_a_stream(all_lines)
        del all_lines[index]
        findings = verify(all_lines)
        self.assertTrue(
            any(f"position(s) {event['position']} missing" in f for f in findings), findings
        )
        self.assertTrue(
            any(f"version {event['version']} of its stream missing" in f for f in findings), findings
        )
        self.assertFalse(any("EDITED" in f for f in findings), "the events left are intact")

    def test_with_an_event_inserted_names_it(self):
        all_lines = lines()
        index, event = later_event_of_a_stream(all_lines)
        forged = dict(event)
        forged["data"] = event["data"].replace('"at":"2', '"at":"1', 1)
        all_lines.insert(index + 1, json.dumps(forged))
        findings = verify(all_lines)
        self.assert_named(findings, forged, "MOVED OR INSERTED")

    def test_cut_short_says_so(self):
        all_lines = lines()[:-3]
        findings = verify(all_lines)
        self.assertTrue(any("TRUNCATED" in f for f in findings), findings)

    def test_with_its_last_event_removed_and_the_closing_line_kept_is_refused(self):
        all_lines = lines()
        del all_lines[-2]
        findings = verify(all_lines)
        self.assertTrue(any("closing line counts" in f for f in findings), findings)


class AFileThatIsNoExport(unittest.TestCase):
    def test_is_refused_with_exit_status_2_and_a_reason(self):
        with tempfile.NamedTemporaryFile("w", suffix=".ndjson", delete=False) as file:
            file.write('{"hello": 1}\n')
        try:
            run = subprocess.run(
                [sys.executable, os.path.join(os.path.dirname(HERE), "verify_export.py"), file.name],
                capture_output=True,
                text=True,
            )
        finally:
            os.unlink(file.name)
        self.assertEqual(run.returncode, 2)
        self.assertIn("not an export header", run.stderr)


if __name__ == "__main__":
    unittest.main()


def ed25519_sign(seed, message):
    """RFC 8032 §5.1.6 signing, for making keys and signatures in these tests only."""
    P, L, G = verify_export._P, verify_export._L, verify_export._G
    digest = hashlib.sha512(seed).digest()
    scalar = int.from_bytes(digest[:32], "little") & ((1 << 254) - 8) | (1 << 254)

    def encode(point):
        x, y, z, _ = point
        zi = pow(z, P - 2, P)
        x, y = x * zi % P, y * zi % P
        return (y | ((x & 1) << 255)).to_bytes(32, "little")

    public = encode(verify_export._multiply(scalar, G))
    r = int.from_bytes(hashlib.sha512(digest[32:] + message).digest(), "little") % L
    big_r = encode(verify_export._multiply(r, G))
    k = int.from_bytes(hashlib.sha512(big_r + public + message).digest(), "little") % L
    return public, big_r + ((r + k * scalar) % L).to_bytes(32, "little")


def key_text(name, algorithm, public):
    raw = bytes([algorithm]) + public
    key_id = hashlib.sha256(name.encode() + b"\n" + raw).digest()[:4]
    return f"{name}+{key_id.hex()}+{base64.b64encode(raw).decode()}", key_id


class ACheckpoint(unittest.TestCase):
    """Signed and cosigned checkpoints, made here with the standard library only."""

    def setUp(self):
        self.text = "example.com/log\n7\n" + base64.b64encode(bytes(32)).decode() + "\n"
        public, signature = ed25519_sign(b"\x01" * 32, self.text.encode())
        self.key, key_id = key_text("example.com/log", 1, public)
        self.note = f"{self.text}\n\u2014 example.com/log {base64.b64encode(key_id + signature).decode()}\n"
        time = 1_700_000_000
        message = f"cosignature/v1\ntime {time}\n".encode() + self.text.encode()
        public, signature = ed25519_sign(b"\x02" * 32, message)
        self.witness, witness_id = key_text("witness.example.org", 4, public)
        raw = witness_id + time.to_bytes(8, "big") + signature
        self.cosigned = self.note + f"\u2014 witness.example.org {base64.b64encode(raw).decode()}\n"

    def test_opens_with_its_key_and_its_witnesses_cosignature(self):
        key = verify_export.VerifierKey(self.key)
        witness = verify_export.VerifierKey(self.witness, algorithm=4)
        opened = verify_export.open_checkpoint(self.cosigned, key, [witness])
        self.assertEqual((opened.size, opened.signed_by), (7, "example.com/log"))

    def test_is_refused_without_the_named_witnesses_cosignature_or_with_a_forged_one(self):
        key = verify_export.VerifierKey(self.key)
        witness = verify_export.VerifierKey(self.witness, algorithm=4)
        with self.assertRaisesRegex(verify_export.Unreadable, "not cosigned by the witness"):
            verify_export.open_checkpoint(self.note, key, [witness])
        line = self.cosigned.rstrip("\n").rsplit("\n", 1)[1]
        raw = bytearray(base64.b64decode(line.rsplit(" ", 1)[1]))
        raw[11] ^= 1  # the cosigned time
        forged = self.cosigned.replace(line.rsplit(" ", 1)[1], base64.b64encode(bytes(raw)).decode())
        with self.assertRaisesRegex(verify_export.Unreadable, "does not hold"):
            verify_export.open_checkpoint(forged, key, [witness])

    def test_with_a_changed_size_is_not_signed_by_its_key(self):
        key = verify_export.VerifierKey(self.key)
        with self.assertRaisesRegex(verify_export.Unreadable, "not signed by the verifier key"):
            verify_export.open_checkpoint(self.note.replace("\n7\n", "\n8\n"), key)
