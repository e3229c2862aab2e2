"""An OAuth2 authorization server for the gateway's tests: the client-credentials grant only
(RFC 6749 §4.4), the client's id and secret in the form body or in HTTP Basic. Each token it
grants is written to TOKENS_FILE as `token expiry` (seconds since the epoch), where the
upstream (`upstream.py` with OPLEDGER_TOKENS_FILE) reads the tokens it accepts.

Usage: python token_server.py PORT TOKENS_FILE CLIENT_ID CLIENT_SECRET EXPIRES_IN_S
"""

import base64
import json
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, TOKENS_FILE, CLIENT_ID, CLIENT_SECRET = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
EXPIRES_IN_S = int(sys.argv[5])
granted = 0


class Token(BaseHTTPRequestHandler):
    def do_POST(self):
        global granted
        length = int(self.headers.get("Content-Length", "0"))
        form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
        client_id, client_secret = form.get("client_id"), form.get("client_secret")
        basic = self.headers.get("Authorization", "")
        if basic.startswith("Basic "):
            user, _, password = base64.b64decode(basic[6:]).decode().partition(":")
            client_id, client_secret = urllib.parse.unquote(user), urllib.parse.unquote(password)
        if form.get("grant_type") != "client_credentials":
            return self.answer(400, {"error": "unsupported_grant_type"})
        if (client_id, client_secret) != (CLIENT_ID, CLIENT_SECRET):
            return self.answer(401, {"error": "invalid_client", "error_description": "unknown client or wrong secret"})
        granted += 1
        token = f"upstream-token-{granted}-{time.time_ns()}"
        with open(TOKENS_FILE, "a") as tokens:
            tokens.write(f"{token} {time.time() + EXPIRES_IN_S}\n")
        self.answer(200, {"access_token": token, "token_type": "Bearer", "expires_in": EXPIRES_IN_S})

    def answer(self, status, body):
        text = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *_):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Token).serve_forever()
