"""A stdio relay between the gateway and a real MCP server that kills the server with SIGKILL
around one tools/call, as a crash would: before the call reaches it (`kill_before TOOL`), or after
the server answered it and before the answer is passed on (`kill_after TOOL`). The fault is read
from the file named by OPLEDGER_FAULT_FILE and consumed by the call it fires on; each firing is
appended to that file's `.fired` neighbour, so a test can tell it happened.

Usage: python relay.py SERVER [ARGS...]   (MCP over stdio is one JSON message per line)
"""

import json
import os
import signal
import subprocess
import sys
import threading

FAULT_FILE = os.environ["OPLEDGER_FAULT_FILE"]


def take_fault(tool):
    """The armed fault for `tool`, consumed; None when none is armed for it."""
    try:
        with open(FAULT_FILE) as armed:
            kind, _, name = armed.read().strip().partition(" ")
    except FileNotFoundError:
        return None
    if name != tool:
        return None
    os.remove(FAULT_FILE)
    return kind


def fired(what):
    with open(FAULT_FILE + ".fired", "a") as log:
        log.write(what + "\n")


def kill(child, what):
    # Noted first: once the server is gone, the thread passing its answers on ends this process.
    fired(what)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    os._exit(0)


def main():
    child = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    kill_after = {}
    lock = threading.Lock()

    def answers():
        for line in child.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                message = None
            if isinstance(message, dict) and "id" in message and "method" not in message:
                with lock:
                    tool = kill_after.pop(message["id"], None)
                if tool is not None:
                    kill(child, "kill_after " + tool)
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
        os._exit(0)

    threading.Thread(target=answers, daemon=True).start()
    for line in sys.stdin.buffer:
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if isinstance(message, dict) and message.get("method") == "tools/call":
            tool = message.get("params", {}).get("name")
            fault = take_fault(tool)
            if fault == "kill_before":
                kill(child, "kill_before " + tool)
            if fault == "kill_after":
                with lock:
                    kill_after[message["id"]] = tool
        child.stdin.write(line)
        child.stdin.flush()
    child.stdin.close()
    child.wait()


if __name__ == "__main__":
    main()
