//! Slow and many clients, with real sockets against a real server: half a
//! header is closed at `header_read_timeout_ms`, an idle keep-alive connection at
//! `idle_timeout_ms`, a flood from one address is answered 429 at its own limit while other
//! addresses (`/healthz`) are still served, and at `max_connections` the next connection is
//! answered 503 until the flood ends. Linux routes all of 127.0.0.0/8 to loopback, so binding a
//! client socket to 127.0.0.2 makes it another client address.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

use crate::support::{Harness, Server};

/// The header read timeout the tests configure, short so they stay quick.
const HEADER_READ_TIMEOUT_MS: u64 = 300;
/// How much later than its timeout a close may come on a loaded machine and still pass.
const SLACK: Duration = Duration::from_millis(2_000);
const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: opledger\r\n\r\n";

fn address(server: &Server) -> SocketAddr {
    server
        .base
        .trim_start_matches("http://")
        .parse()
        .expect("the server's address")
}

/// A connection to `server` from the loopback address `from`.
async fn connect_from(from: Ipv4Addr, server: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("a socket");
    socket
        .bind(SocketAddr::from((from, 0)))
        .expect("bound to a loopback address");
    socket.connect(server).await.expect("connected")
}

/// Reads until the server closes the connection, within `within`; the bytes it sent, and when it
/// closed. A reset counts as a close (the server dropped the connection).
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (Vec<u8>, Instant) {
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Err(_) => panic!(
                "the connection was still open after {within:?}; received {:?}",
                String::from_utf8_lossy(&received)
            ),
            Ok(Ok(0) | Err(_)) => return (received, Instant::now()),
            Ok(Ok(read)) => received.extend_from_slice(&chunk[..read]),
        }
    }
}

/// Reads one whole answer (its head and `content-length` bytes of body), or what arrived before
/// the server closed the connection.
async fn read_answer(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .expect("an answer or a close in time")
            .unwrap_or(0);
        received.extend_from_slice(&chunk[..read]);
        let text = String::from_utf8_lossy(&received).into_owned();
        if read == 0 || whole_answer(&text) {
            return text;
        }
    }
}

fn whole_answer(text: &str) -> bool {
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())
            .flatten()
    });
    length.is_some_and(|length| body.len() >= length)
}

async fn healthz_status(server: &Server) -> Result<StatusCode, reqwest::Error> {
    // A fresh client each time, so no pooled connection hides a refused new one.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    Ok(client
        .get(format!("{}/healthz", server.base))
        .send()
        .await?
        .status())
}

#[tokio::test]
async fn half_a_header_is_closed_within_the_header_read_timeout_even_when_it_drips() {
    let harness = Harness::new(&format!(
        "header_read_timeout_ms = {HEADER_READ_TIMEOUT_MS}\nidle_timeout_ms = 5000"
    ))
    .await;
    let server = harness.serve();
    let at = address(&server);
    let timeout = Duration::from_millis(HEADER_READ_TIMEOUT_MS);

    // Half a header, then nothing.
    let mut half = connect_from(Ipv4Addr::LOCALHOST, at).await;
    let sent = Instant::now();
    half.write_all(b"GET /healthz HTTP/1.1\r\nhost: op")
        .await
        .expect("written");
    let (received, closed) = read_until_closed(&mut half, timeout + SLACK).await;
    assert!(received.is_empty(), "{received:?}");
    assert!(closed - sent >= timeout - Duration::from_millis(50));

    // Nothing at all: a fresh connection gets no idle allowance.
    let mut silent = connect_from(Ipv4Addr::LOCALHOST, at).await;
    read_until_closed(&mut silent, timeout + SLACK).await;

    // One byte every 50 ms keeps the socket busy but never finishes the headers.
    let mut drip = connect_from(Ipv4Addr::LOCALHOST, at).await;
    let started = Instant::now();
    let closed = loop {
        if drip.write_all(b"x").await.is_err() {
            break Instant::now();
        }
        assert!(
            started.elapsed() < timeout + SLACK,
            "a dripping header was still open after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(closed - started >= timeout - Duration::from_millis(50));

    // A whole request on time is answered as before, and /metrics counted the three closes.
    assert_eq!(
        healthz_status(&server).await.expect("answered"),
        StatusCode::OK
    );
    assert_eq!(
        metric(&server, "opledger_http_header_read_timeouts_total").await,
        3
    );
}

#[tokio::test]
async fn an_idle_keep_alive_connection_waits_past_the_header_timeout_and_is_closed_at_the_idle_timeout(
) {
    let idle = Duration::from_millis(1_500);
    let harness = Harness::new(&format!(
        "header_read_timeout_ms = {HEADER_READ_TIMEOUT_MS}\nidle_timeout_ms = {}",
        idle.as_millis()
    ))
    .await;
    let server = harness.serve();
    let mut stream = connect_from(Ipv4Addr::LOCALHOST, address(&server)).await;
    stream.write_all(HEALTHZ).await.expect("written");
    assert!(read_answer(&mut stream).await.starts_with("HTTP/1.1 200"));

    // Idle for twice the header timeout, then the next request on the same connection.
    tokio::time::sleep(Duration::from_millis(2 * HEADER_READ_TIMEOUT_MS)).await;
    stream.write_all(HEALTHZ).await.expect("written");
    assert!(read_answer(&mut stream).await.starts_with("HTTP/1.1 200"));
    let answered = Instant::now();

    let (received, closed) = read_until_closed(&mut stream, idle + SLACK).await;
    assert!(received.is_empty(), "{received:?}");
    assert!(
        closed - answered >= idle - Duration::from_millis(50),
        "closed after {:?}, before the idle timeout",
        closed - answered
    );
}

#[tokio::test]
async fn a_flood_from_one_address_is_answered_429_at_its_limit_while_another_address_gets_healthz()
{
    let harness = Harness::new("max_connections = 20\nmax_connections_per_address = 5").await;
    let server = harness.serve();
    let at = address(&server);
    let flooder = Ipv4Addr::new(127, 0, 0, 2);

    // Five connections hold the flooder's places: half a header each, well inside the 10 s
    // default header timeout.
    let mut flood = Vec::new();
    for _ in 0..5 {
        let mut stream = connect_from(flooder, at).await;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .expect("written");
        flood.push(stream);
    }
    let mut sixth = connect_from(flooder, at).await;
    let (refused, _) = read_until_closed(&mut sixth, SLACK).await;
    let refused = String::from_utf8_lossy(&refused);
    assert!(refused.starts_with("HTTP/1.1 429 "), "{refused}");
    assert!(refused.contains("retry-after: 1"), "{refused}");
    assert!(
        refused.contains(r#""code":"too_many_connections_from_address""#),
        "{refused}"
    );

    // Everyone else is still served, the flood's own connections still held.
    assert_eq!(
        healthz_status(&server).await.expect("answered"),
        StatusCode::OK
    );
    let mut other = connect_from(Ipv4Addr::new(127, 0, 0, 3), at).await;
    other.write_all(HEALTHZ).await.expect("written");
    assert!(read_answer(&mut other).await.starts_with("HTTP/1.1 200"));

    // Operators see the refusal, and the flood's five connections (plus this request's) open.
    let refused = r#"opledger_http_connections_refused_total{limit="max_connections_per_address"}"#;
    assert_eq!(metric(&server, refused).await, 1);
    assert!(metric(&server, "opledger_http_connections_open").await >= 6);

    // Once the flood closes, its address is served again.
    drop(flood);
    eventually_served_from(flooder, at).await;
}

#[tokio::test]
async fn at_max_connections_the_next_is_answered_503_and_served_again_when_the_flood_ends() {
    let harness = Harness::new("max_connections = 6\nmax_connections_per_address = 3").await;
    let server = harness.serve();
    let at = address(&server);
    let mut flood = Vec::new();
    for flooder in [Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3)] {
        for _ in 0..3 {
            flood.push(connect_from(flooder, at).await);
        }
    }
    // Answered, not dropped: a client that sent its request reads the refusal whole.
    let client = reqwest::Client::new();
    let refused = client
        .get(format!("{}/healthz", server.base))
        .send()
        .await
        .expect("an answer, not a reset");
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: serde_json::Value =
        serde_json::from_str(&refused.text().await.expect("a body")).expect("JSON");
    assert_eq!(body["error"]["code"], "too_many_connections", "{body}");

    drop(flood);
    eventually_served_from(Ipv4Addr::LOCALHOST, at).await;
}

/// The value of the series `name` (with its labels) on `/metrics`.
async fn metric(server: &Server, name: &str) -> u64 {
    let page = reqwest::get(format!("{}/metrics", server.base))
        .await
        .expect("the server answers")
        .text()
        .await
        .expect("a page");
    page.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} on /metrics:\n{page}"))
        .parse()
        .expect("a count")
}

/// Waits (bounded) until a fresh connection from `from` gets `/healthz` 200: the server gives a
/// place back once it has seen the client's close.
async fn eventually_served_from(from: Ipv4Addr, at: SocketAddr) {
    let started = Instant::now();
    loop {
        let mut stream = connect_from(from, at).await;
        stream.write_all(HEALTHZ).await.expect("written");
        let answer = read_answer(&mut stream).await;
        if answer.starts_with("HTTP/1.1 200") {
            return;
        }
        assert!(
            started.elapsed() < SLACK * 5,
            "still refused after the flood closed: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sigterm_cuts_a_connection_still_sending_its_headers_instead_of_waiting_out_its_deadline() {
    // The default header read timeout (10 s) and shutdown grace (35 s).
    let harness = Harness::new("").await;
    let server = harness.serve();
    let mut half = connect_from(Ipv4Addr::LOCALHOST, address(&server)).await;
    half.write_all(b"GET /healthz HTTP/1.1\r\nhost: op")
        .await
        .expect("written");
    // Accepted: open are this one and the connection asking.
    let started = Instant::now();
    while metric(&server, "opledger_http_connections_open").await < 2 {
        assert!(
            started.elapsed() < SLACK,
            "the half header was never accepted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let started = Instant::now();
    let (code, printed) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .expect("terminated");
    let took = started.elapsed();
    assert_eq!(code, Some(0), "{printed:?}");
    assert!(
        took < Duration::from_secs(5),
        "the server took {took:?} to stop with half a header open"
    );
    let (received, _) = read_until_closed(&mut half, SLACK).await;
    assert!(received.is_empty(), "{received:?}");
}
