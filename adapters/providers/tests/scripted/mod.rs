//! A scripted HTTP API on 127.0.0.1 for the connector tests: it answers whatever the test
//! queued next (500 "no answer scripted" when nothing is) and records every request it received,
//! so a test asserts both what went over the wire and what came of the answer.

// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde_json::Value;

/// Largest request body the emulator reads, in bytes.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// One scripted answer.
#[derive(Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

pub fn answer(status: u16, body: Value) -> Answer {
    Answer {
        status,
        headers: vec![("content-type", "application/json".to_owned())],
        body: if body.is_null() {
            String::new()
        } else {
            body.to_string()
        },
    }
}

impl Answer {
    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }
}

/// One request as the emulator received it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    /// Path and query.
    pub target: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    pub fn form(&self) -> Vec<(String, String)> {
        form_urlencoded::parse(&self.body).into_owned().collect()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

#[derive(Clone, Default)]
struct Script {
    answers: Arc<Mutex<VecDeque<Answer>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn handle(State(script): State<Script>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map(|bytes| bytes.to_vec())
        .unwrap_or_default();
    script.seen.lock().expect("not poisoned").push(Seen {
        method: parts.method.to_string(),
        target: parts
            .uri
            .path_and_query()
            .map_or_else(String::new, |target| target.as_str().to_owned()),
        headers: parts.headers,
        body,
    });
    let next = script.answers.lock().expect("not poisoned").pop_front();
    let Some(answer) = next else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no answer scripted").into_response();
    };
    let mut response = Response::builder().status(answer.status);
    for (name, value) in &answer.headers {
        response = response.header(*name, value);
    }
    response
        .body(Body::from(answer.body))
        .expect("a scripted answer is a valid response")
}

pub struct Emulator {
    pub base_url: String,
    script: Script,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Emulator {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let address: SocketAddr = listener.local_addr().expect("an address");
        let script = Script::default();
        let router = Router::new().fallback(handle).with_state(script.clone());
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let service = TowerToHyperService::new(router.clone());
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            base_url: format!("http://{address}"),
            script,
            server,
        }
    }

    pub fn next(&self, answer: Answer) {
        self.script
            .answers
            .lock()
            .expect("not poisoned")
            .push_back(answer);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.script.seen.lock().expect("not poisoned").clone()
    }
}
