"""The verifier's own tests, on a real export (an `opledger demo` ledger exported by
`opledger export`, in fixtures/) and on copies of it tampered with in each way an event can be:
its data edited, two events swapped, one removed, one inserted, the end cut off. Each tampered
copy must be refused with a line naming the event tampered with. Standard library only:
`python3 -m unittest discover -s clients/verify-export/tests`."""

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
