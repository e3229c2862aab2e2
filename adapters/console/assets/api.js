// The console's one way to the JSON API: the same routes every client uses, with the bearer
// token from this tab's sessionStorage (never a cookie, never a URL). Every failure becomes an
// ApiError carrying the API's own code and message, so a page can show what went wrong and what
// to do.

const TOKEN_KEY = "opledger.token";
/// The longest a console request waits for an answer before it says so, in milliseconds.
const REQUEST_TIMEOUT_MS = 15000;
/// The most characters of one Server-Sent Event the reader keeps before it gives up on the
/// stream (an outcome event is a few hundred; the server bounds what it sends).
const MAX_EVENT_CHARS = 65536;
/// The pause before the feed reconnects after it ended or failed, in milliseconds.
const RECONNECT_PAUSE_MS = 2000;

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }

  /// What the person should do next, for the codes a console user can meet.
  get advice() {
    switch (this.code) {
      case "unauthorized":
        return "Sign in again with a token this server knows.";
      case "forbidden":
        return "This token is not allowed to do that; use a token with that scope.";
      case "not_found":
        return "Check the id; an operation of a tenant outside this token's scope looks missing too.";
      case "claimed":
        return "Another operator is working this case. Ask them, or wait until their claim ends (it ends by itself).";
      case "stale":
        return "The operation changed since you loaded it. Reload the evidence and decide again.";
      case "network":
        return "Check that the server is running and reachable, then try again.";
      case "timeout":
        return "The server did not answer in time; try again.";
      default:
        return this.status >= 500
          ? "The server could not do it now; try again in a moment."
          : "Correct the input and try again.";
    }
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
}

export function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/// Whether `error` is the listing's answer to a token that sees several tenants and named none.
export function needsTenant(error) {
  return error instanceof ApiError && error.code === "invalid_input" && /name one with \?tenant=/.test(error.message);
}

/// Calls `method path` with an optional JSON body; resolves with the parsed answer or throws an
/// ApiError. `token` overrides the stored one (sign-in checks a token before storing it).
export async function call(method, path, body, tokenOverride) {
  const headers = { Authorization: `Bearer ${tokenOverride ?? token() ?? ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), REQUEST_TIMEOUT_MS);
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: abort.signal,
      credentials: "omit",
      cache: "no-store",
    });
  } catch (error) {
    throw abort.signal.aborted
      ? new ApiError(0, "timeout", `${method} ${path} got no answer within ${REQUEST_TIMEOUT_MS / 1000} s.`)
      : new ApiError(0, "network", `The server could not be reached (${error.message}).`);
  } finally {
    clearTimeout(timer);
  }
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (response.status === 401 && tokenOverride === undefined) {
    // The stored token stopped working (the server's configuration changed): the shell goes
    // back to sign-in rather than leaving every page showing the same error.
    window.dispatchEvent(new CustomEvent("opledger:unauthorized", { detail: json?.error?.message }));
  }
  if (!response.ok) {
    const error = json?.error;
    throw new ApiError(
      response.status,
      error?.code ?? `http_${response.status}`,
      error?.message ?? `${method} ${path} answered ${response.status}.`,
    );
  }
  return json;
}

export const get = (path) => call("GET", path);
export const post = (path, body) => call("POST", path, body);

/// Follows `/v1/events` (Server-Sent Events) with the bearer header, which EventSource cannot
/// send: a fetch whose body is read as a stream. `onEvent({id, event, data})` for each event;
/// `onState("live" | "reconnecting" | error)` as the connection changes. Reconnects after a
/// pause with Last-Event-ID, so nothing is missed or repeated. Returns a function that stops it.
export function follow(onEvent, onState) {
  let stopped = false;
  let lastId = null;
  let controller = null;

  async function once() {
    controller = new AbortController();
    const headers = { Authorization: `Bearer ${token() ?? ""}`, Accept: "text/event-stream" };
    if (lastId === null) {
      // Start at the log's head: the feed is for what happens from now on (pages load the
      // present state from the listings), and replaying the whole history would be a storm.
      const health = await call("GET", "/healthz");
      lastId = health?.log_head ?? 0;
    }
    headers["Last-Event-ID"] = String(lastId);
    const path = "/v1/events";
    const response = await fetch(path, { headers, signal: controller.signal, credentials: "omit" });
    if (!response.ok) {
      const body = await response.json().catch(() => null);
      throw new ApiError(response.status, body?.error?.code ?? "http", body?.error?.message ?? `the event feed answered ${response.status}`);
    }
    onState("live");
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      if (buffer.length > MAX_EVENT_CHARS) throw new Error("an event larger than the console reads");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const parsed = parseBlock(block);
        if (parsed) {
          lastId = parsed.id;
          onEvent(parsed);
        }
      }
    }
  }

  (async () => {
    while (!stopped) {
      try {
        await once();
        if (!stopped) onState("reconnecting");
      } catch (error) {
        if (stopped) return;
        onState(error);
        if (error instanceof ApiError && error.status < 500) return;
      }
      await new Promise((resolve) => setTimeout(resolve, RECONNECT_PAUSE_MS));
    }
  })();
  return () => {
    stopped = true;
    controller?.abort();
  };
}

function parseBlock(block) {
  let id = null;
  let event = null;
  let data = null;
  for (const line of block.split("\n")) {
    if (line.startsWith("id:")) id = Number(line.slice(3).trim());
    else if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) {
      try {
        data = JSON.parse(line.slice(5).trim());
      } catch {
        data = null;
      }
    }
  }
  return id !== null && event && data ? { id, event, data } : null;
}
