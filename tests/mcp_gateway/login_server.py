"""An MCP server that acts for a person's account, for the gateway's login tests: the official
Python SDK (FastMCP) serves both the authorization server and the protected resource. What the
SDK does, nobody here wrote: its routes for authorization server metadata (RFC 8414), protected
resource metadata (RFC 9728), dynamic client registration (RFC 7591), /authorize (a PKCE S256
challenge required), /token (the code_verifier checked against it, the refresh grant), and the
bearer check on /mcp answering 401 with `WWW-Authenticate: Bearer ... resource_metadata=...`.
What is written here is only the provider's storage (clients, codes, tokens in memory), which the
SDK leaves to each server, and a person who approves every request at once.

Every token granted is appended to ISSUED_FILE as `kind token` (kind: access or refresh), so a
test knows the values to look for in the ledger and the logs. Access tokens live EXPIRES_IN_S
seconds; refresh tokens are rotated on use, the old one refused after. Test controls:
POST /test/expire-access (every access token refused from now on), POST /test/revoke (every token
refused), GET /test/state (records and counts), GET /test/clients (the last registered client).

Usage: python login_server.py PORT ISSUED_FILE EXPIRES_IN_S
"""

import json
import secrets
import sys
import time

from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.fastmcp import FastMCP
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from starlette.requests import Request
from starlette.responses import JSONResponse

PORT, ISSUED_FILE, EXPIRES_IN_S = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
BASE = f"http://127.0.0.1:{PORT}"
SCOPE = "records"


class Provider:
    """The SDK's OAuthAuthorizationServerProvider, kept in memory."""

    def __init__(self):
        self.clients = {}
        self.codes = {}
        self.access = {}
        self.refresh = {}
        self.counts = {"registered": 0, "codes_exchanged": 0, "refreshed": 0}

    def issue(self, client_id, scopes, resource):
        access = "acc-" + secrets.token_urlsafe(24)
        refresh = "ref-" + secrets.token_urlsafe(24)
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes,
            expires_at=int(time.time()) + EXPIRES_IN_S, resource=resource,
        )
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource)
        with open(ISSUED_FILE, "a") as issued:
            issued.write(f"access {access}\nrefresh {refresh}\n")
        return OAuthToken(
            access_token=access, token_type="Bearer", expires_in=EXPIRES_IN_S,
            refresh_token=refresh, scope=" ".join(scopes),
        )

    async def get_client(self, client_id):
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull):
        self.counts["registered"] += 1
        self.clients[client_info.client_id] = client_info
        self.last_client_id = client_info.client_id

    async def authorize(self, client, params: AuthorizationParams):
        # The person approves at once: the code goes straight back to the client's redirect.
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code, scopes=params.scopes or [SCOPE], expires_at=time.time() + 300,
            client_id=client.client_id, code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client, authorization_code):
        return self.codes.get(authorization_code)

    async def exchange_authorization_code(self, client, authorization_code):
        del self.codes[authorization_code.code]
        self.counts["codes_exchanged"] += 1
        return self.issue(client.client_id, authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(self, client, refresh_token):
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(self, client, refresh_token, scopes):
        del self.refresh[refresh_token.token]
        self.counts["refreshed"] += 1
        return self.issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token):
        found = self.access.get(token)
        if found is None or (found.expires_at and found.expires_at < time.time()):
            return None
        return found

    async def revoke_token(self, token):
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)


provider = Provider()
server = FastMCP(
    "records",
    host="127.0.0.1",
    port=PORT,
    log_level="WARNING",
    auth_server_provider=provider,
    auth=AuthSettings(
        issuer_url=BASE,
        resource_server_url=f"{BASE}/mcp",
        required_scopes=[SCOPE],
        validate_token_resource=True,
        client_registration_options=ClientRegistrationOptions(
            enabled=True, valid_scopes=[SCOPE], default_scopes=[SCOPE]
        ),
        revocation_options=RevocationOptions(enabled=True),
    ),
)
records = []


@server.tool()
def create_record(title: str, label: str) -> str:
    """Create a record, or answer the one that already carries this label."""
    existing = [record for record in records if record["label"] == label]
    if existing:
        return json.dumps({"id": existing[0]["id"], "created": False})
    record = {"id": str(731 + len(records)), "title": title, "label": label}
    records.append(record)
    return json.dumps({"id": record["id"], "created": True})


@server.tool()
def find_records(label: str) -> str:
    """The records that carry this label."""
    return json.dumps([record for record in records if record["label"] == label])


@server.custom_route("/test/expire-access", methods=["POST"])
async def expire_access(_: Request):
    provider.access.clear()
    return JSONResponse({"ok": True})


@server.custom_route("/test/revoke", methods=["POST"])
async def revoke(_: Request):
    provider.access.clear()
    provider.refresh.clear()
    return JSONResponse({"ok": True})


@server.custom_route("/test/clients", methods=["GET"])
async def clients(_: Request):
    return JSONResponse({"client_id": getattr(provider, "last_client_id", None)})


@server.custom_route("/test/state", methods=["GET"])
async def state(_: Request):
    return JSONResponse({"records": records, **provider.counts})


if __name__ == "__main__":
    server.run(transport="streamable-http")
