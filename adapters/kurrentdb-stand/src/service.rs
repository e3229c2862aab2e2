//! The gRPC methods of the stand: `Streams.Append`, `Streams.Read` (stream reads, `$all` reads
//! and `$all` subscriptions with stream-name or event-type prefix filters and checkpoints) and
//! `ServerFeatures.GetSupportedMethods`. Anything else answers `UNIMPLEMENTED`, which the client
//! treats as a feature the server lacks.
//!
//! Handlers never hold the log's lock across an await, and every response stream is bounded.

// `tonic::Status` is large, and it is the error type every gRPC handler has to return.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::ProstCodec;
use tonic::server::{ClientStreamingService, Grpc, ServerStreamingService, UnaryService};
use tonic::{Request, Response, Status, Streaming};

use super::log::{AppendResult, Expected, Proposed, Record};
use super::wire::{self, append_req, append_resp, read_req, read_resp};
use super::{AppendFault, Connection, Shared};

const APPEND_PATH: &str = "/event_store.client.streams.Streams/Append";
const READ_PATH: &str = "/event_store.client.streams.Streams/Read";
const FEATURES_PATH: &str =
    "/event_store.client.server_features.ServerFeatures/GetSupportedMethods";

/// The version the stand claims; the client only reads it to pick features.
pub const STAND_SERVER_VERSION: &str = "24.10.0";
/// Most events one append may carry; the client's limit is far above opledger's 64.
const MAX_APPEND_EVENTS: usize = 4_096;
/// Messages a read may have in flight before the reader waits for the client.
const READ_BUFFER_MESSAGES: usize = 64;
/// Records a subscription copies out of the log per lock.
const SUBSCRIPTION_CHUNK_RECORDS: usize = 256;
/// Records a filtered subscription considers between checkpoints, before the client's multiplier
/// (the server's default search window).
const CHECKPOINT_WINDOW_RECORDS: u64 = 32;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Routes one HTTP/2 request to its method.
pub(super) async fn route<B>(
    shared: Arc<Shared>,
    connection: Arc<Connection>,
    request: http::Request<B>,
) -> Result<http::Response<tonic::body::Body>, Infallible>
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    let response = match request.uri().path() {
        APPEND_PATH => {
            Grpc::new(ProstCodec::<wire::AppendResp, wire::AppendReq>::default())
                .client_streaming(AppendMethod { shared, connection }, request)
                .await
        }
        READ_PATH => {
            Grpc::new(ProstCodec::<wire::ReadResp, wire::ReadReq>::default())
                .server_streaming(ReadMethod { shared, connection }, request)
                .await
        }
        FEATURES_PATH => {
            Grpc::new(ProstCodec::<wire::SupportedMethods, wire::Empty>::default())
                .unary(FeaturesMethod, request)
                .await
        }
        other => {
            Status::unimplemented(format!("the KurrentDB stand does not serve {other}")).into_http()
        }
    };
    Ok(response)
}

struct FeaturesMethod;

impl UnaryService<wire::Empty> for FeaturesMethod {
    type Response = wire::SupportedMethods;
    type Future = BoxFuture<Result<Response<wire::SupportedMethods>, Status>>;

    fn call(&mut self, _request: Request<wire::Empty>) -> Self::Future {
        let method = |name: &str| wire::SupportedMethod {
            method_name: name.into(),
            service_name: "event_store.client.streams.streams".into(),
            features: Vec::new(),
        };
        let methods = wire::SupportedMethods {
            // No `batchappend`: the client then never tries it, and the stand need not serve it.
            methods: vec![method("read"), method("append")],
            event_store_server_version: STAND_SERVER_VERSION.into(),
        };
        Box::pin(async move { Ok(Response::new(methods)) })
    }
}

struct AppendMethod {
    shared: Arc<Shared>,
    connection: Arc<Connection>,
}

impl ClientStreamingService<wire::AppendReq> for AppendMethod {
    type Response = wire::AppendResp;
    type Future = BoxFuture<Result<Response<wire::AppendResp>, Status>>;

    fn call(&mut self, request: Request<Streaming<wire::AppendReq>>) -> Self::Future {
        let (shared, connection) = (Arc::clone(&self.shared), Arc::clone(&self.connection));
        Box::pin(async move { append(shared, connection, request.into_inner()).await })
    }
}

async fn append(
    shared: Arc<Shared>,
    connection: Arc<Connection>,
    mut messages: Streaming<wire::AppendReq>,
) -> Result<Response<wire::AppendResp>, Status> {
    let Some(wire::AppendReq {
        content: Some(append_req::Content::Options(options)),
    }) = messages.message().await?
    else {
        return Err(Status::invalid_argument(
            "an append starts with its options",
        ));
    };
    let stream = stream_name(options.stream_identifier.as_ref())?;
    let expected = match options.expected_stream_revision {
        Some(append_req::ExpectedStreamRevision::Revision(revision)) => {
            Expected::Revision(revision)
        }
        Some(append_req::ExpectedStreamRevision::NoStream(_)) => Expected::NoStream,
        Some(append_req::ExpectedStreamRevision::Any(_)) => Expected::Any,
        Some(append_req::ExpectedStreamRevision::StreamExists(_)) => Expected::StreamExists,
        None => {
            return Err(Status::invalid_argument(
                "an append states its expected revision",
            ))
        }
    };
    let mut events = Vec::new();
    while let Some(message) = messages.message().await? {
        let Some(append_req::Content::ProposedMessage(proposed)) = message.content else {
            return Err(Status::invalid_argument(
                "only events follow an append's options",
            ));
        };
        if events.len() == MAX_APPEND_EVENTS {
            return Err(Status::invalid_argument("too many events in one append"));
        }
        events.push(to_proposed(proposed)?);
    }
    if events.is_empty() {
        return Err(Status::invalid_argument(
            "the stand refuses an append without events",
        ));
    }

    let fault = shared.take_append_fault();
    if fault == Some(AppendFault::UnavailableBeforeCommit) {
        return Err(Status::unavailable(
            "injected: the node is unavailable; nothing was written",
        ));
    }
    let result = shared.log().append(&stream, expected, events);
    if matches!(result, AppendResult::WrongExpectedVersion { .. }) {
        shared
            .version_conflicts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    match fault {
        Some(AppendFault::DropConnectionAfterCommit) => {
            // The append is durable; the client must never hear so. Closing the connection
            // aborts this handler with it, so the wait below never finishes.
            connection.drop_now();
            std::future::pending::<()>().await;
        }
        Some(AppendFault::DelayAfterCommit { delay_ms }) => {
            tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
        }
        Some(AppendFault::UnavailableBeforeCommit) | None => {}
    }
    Ok(Response::new(append_response(result, expected)))
}

fn to_proposed(message: append_req::ProposedMessage) -> Result<Proposed, Status> {
    let id = message
        .id
        .as_ref()
        .and_then(wire::Uuid::to_uuid)
        .ok_or_else(|| Status::invalid_argument("every proposed event carries an id"))?;
    let mut metadata = message.metadata;
    let event_type = metadata
        .remove("type")
        .filter(|kind| !kind.is_empty())
        .ok_or_else(|| Status::invalid_argument("every proposed event carries a type"))?;
    let content_type = metadata
        .remove("content-type")
        .unwrap_or_else(|| "application/octet-stream".into());
    Ok(Proposed {
        id,
        event_type,
        content_type,
        data: message.data,
        custom_metadata: message.custom_metadata,
    })
}

fn append_response(result: AppendResult, expected: Expected) -> wire::AppendResp {
    use append_resp::success::{CurrentRevisionOption, PositionOption};
    use append_resp::wrong::{CurrentRevisionOption as Current, ExpectedRevisionOption as Wanted};
    let result = match result {
        // Like the server's write completion: the commit part names the last record and the
        // prepare part the transaction's first, so for several events neither is "the position
        // of the last event" as such.
        AppendResult::Written {
            last_revision,
            first_position,
            last_position,
        } => append_resp::Result::Success(append_resp::Success {
            current_revision_option: Some(CurrentRevisionOption::CurrentRevision(last_revision)),
            position_option: Some(PositionOption::Position(append_resp::Position {
                commit_position: last_position,
                prepare_position: first_position,
            })),
        }),
        // An idempotent write reports no position.
        AppendResult::Idempotent { last_revision } => {
            append_resp::Result::Success(append_resp::Success {
                current_revision_option: Some(CurrentRevisionOption::CurrentRevision(
                    last_revision,
                )),
                position_option: Some(PositionOption::NoPosition(wire::Empty {})),
            })
        }
        AppendResult::WrongExpectedVersion { current } => {
            append_resp::Result::WrongExpectedVersion(append_resp::WrongExpectedVersion {
                current_revision_option: Some(current.map_or(
                    Current::CurrentNoStream(wire::Empty {}),
                    Current::CurrentRevision,
                )),
                expected_revision_option: Some(match expected {
                    Expected::Revision(revision) => Wanted::ExpectedRevision(revision),
                    Expected::NoStream => Wanted::ExpectedNoStream(wire::Empty {}),
                    Expected::Any => Wanted::ExpectedAny(wire::Empty {}),
                    Expected::StreamExists => Wanted::ExpectedStreamExists(wire::Empty {}),
                }),
            })
        }
    };
    wire::AppendResp {
        result: Some(result),
    }
}

struct ReadMethod {
    shared: Arc<Shared>,
    connection: Arc<Connection>,
}

impl ServerStreamingService<wire::ReadReq> for ReadMethod {
    type Response = wire::ReadResp;
    type ResponseStream = ReceiverStream<Result<wire::ReadResp, Status>>;
    type Future = BoxFuture<Result<Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, request: Request<wire::ReadReq>) -> Self::Future {
        let (shared, connection) = (Arc::clone(&self.shared), Arc::clone(&self.connection));
        Box::pin(async move {
            let read = Read::parse(request.into_inner())?;
            let (sender, receiver) = mpsc::channel(READ_BUFFER_MESSAGES);
            // The task ends when the client goes away (the channel closes) or the connection is
            // dropped, so a subscription never outlives its connection.
            tokio::spawn(async move {
                tokio::select! {
                    () = read.serve(&shared, &sender) => {}
                    () = connection.dropped() => {}
                    () = sender.closed() => {}
                }
            });
            Ok(Response::new(ReceiverStream::new(receiver)))
        })
    }
}

/// A parsed read request.
enum Read {
    Stream {
        stream: String,
        from: StreamFrom,
        backwards: bool,
        count: usize,
    },
    All {
        from: AllFrom,
        backwards: bool,
        count: usize,
        filter: Option<Filter>,
    },
    SubscribeAll {
        from: AllFrom,
        filter: Option<Filter>,
    },
}

#[derive(Clone, Copy)]
enum StreamFrom {
    Revision(u64),
    Start,
    End,
}

#[derive(Clone, Copy)]
enum AllFrom {
    Position(u64),
    Start,
    End,
}

/// A prefix filter on stream names or event types, with its checkpoint interval.
struct Filter {
    on_stream_name: bool,
    prefixes: Vec<String>,
    checkpoint_interval: u64,
}

impl Filter {
    fn admits(&self, record: &Record) -> bool {
        let subject = if self.on_stream_name {
            &record.stream
        } else {
            &record.event_type
        };
        self.prefixes
            .iter()
            .any(|prefix| subject.starts_with(prefix))
    }
}

impl Read {
    fn parse(request: wire::ReadReq) -> Result<Self, Status> {
        let options = request
            .options
            .ok_or_else(|| Status::invalid_argument("a read carries options"))?;
        let backwards = options.read_direction == read_req::BACKWARDS;
        let filter = match options.filter_option {
            Some(read_req::FilterOption::Filter(filter)) => Some(parse_filter(filter)?),
            Some(read_req::FilterOption::NoFilter(_)) | None => None,
        };
        let subscription = match options.count_option {
            Some(read_req::CountOption::Subscription(_)) => None,
            Some(read_req::CountOption::Count(count)) => {
                Some(usize::try_from(count).unwrap_or(usize::MAX))
            }
            None => {
                return Err(Status::invalid_argument(
                    "a read states a count or a subscription",
                ))
            }
        };
        match options.stream_option {
            Some(read_req::StreamOption::Stream(stream_options)) => {
                let stream = stream_name(stream_options.stream_identifier.as_ref())?;
                let from = match stream_options.revision_option {
                    Some(read_req::RevisionOption::Revision(revision)) => {
                        StreamFrom::Revision(revision)
                    }
                    Some(read_req::RevisionOption::Start(_)) => StreamFrom::Start,
                    Some(read_req::RevisionOption::End(_)) => StreamFrom::End,
                    None => return Err(Status::invalid_argument("a stream read states where")),
                };
                let Some(count) = subscription else {
                    return Err(Status::unimplemented(
                        "the stand serves subscriptions to $all only",
                    ));
                };
                Ok(Self::Stream {
                    stream,
                    from,
                    backwards,
                    count,
                })
            }
            Some(read_req::StreamOption::All(all_options)) => {
                let from = match all_options.all_option {
                    Some(read_req::AllOption::Position(position)) => {
                        AllFrom::Position(position.commit_position)
                    }
                    Some(read_req::AllOption::Start(_)) => AllFrom::Start,
                    Some(read_req::AllOption::End(_)) => AllFrom::End,
                    None => return Err(Status::invalid_argument("an $all read states where")),
                };
                Ok(match subscription {
                    Some(count) => Self::All {
                        from,
                        backwards,
                        count,
                        filter,
                    },
                    None if backwards => {
                        return Err(Status::invalid_argument("subscriptions go forwards"))
                    }
                    None => Self::SubscribeAll { from, filter },
                })
            }
            None => Err(Status::invalid_argument("a read names a stream or $all")),
        }
    }

    async fn serve(self, shared: &Shared, sender: &mpsc::Sender<Result<wire::ReadResp, Status>>) {
        match self {
            Self::Stream {
                stream,
                from,
                backwards,
                count,
            } => {
                send_all(
                    sender,
                    stream_messages(shared, stream, from, backwards, count),
                )
                .await
            }
            Self::All {
                from,
                backwards,
                count,
                filter,
            } => {
                let messages = all_messages(shared, from, backwards, count, filter.as_ref());
                send_all(sender, messages).await;
            }
            Self::SubscribeAll { from, filter } => {
                subscribe_all(shared, sender, from, filter).await
            }
        }
    }
}

/// The messages answering a read of one stream: up to `count` of its events from `from`, or
/// that it does not exist. The log is locked only while they are gathered, never while sending.
fn stream_messages(
    shared: &Shared,
    stream: String,
    from: StreamFrom,
    backwards: bool,
    count: usize,
) -> Vec<read_resp::Content> {
    let log = shared.log();
    if !log.has_stream(&stream) {
        return vec![read_resp::Content::StreamNotFound(
            read_resp::StreamNotFound {
                stream_identifier: Some(wire::StreamIdentifier {
                    stream_name: stream.into_bytes(),
                }),
            },
        )];
    }
    let records = match (backwards, from) {
        (false, StreamFrom::Revision(revision)) => {
            log.read_stream_forward(&stream, revision, count)
        }
        (false, StreamFrom::Start) => log.read_stream_forward(&stream, 0, count),
        (false, StreamFrom::End) => Vec::new(),
        (true, StreamFrom::Revision(revision)) => {
            log.read_stream_backward(&stream, Some(revision), count)
        }
        (true, StreamFrom::End) => log.read_stream_backward(&stream, None, count),
        (true, StreamFrom::Start) => log.read_stream_backward(&stream, Some(0), count),
    };
    records.iter().map(event_message).collect()
}

/// The messages answering a read of `$all`: up to `count` events the filter admits, from
/// `from` in the direction asked. The log is locked only while they are gathered.
fn all_messages(
    shared: &Shared,
    from: AllFrom,
    backwards: bool,
    count: usize,
    filter: Option<&Filter>,
) -> Vec<read_resp::Content> {
    let log = shared.log();
    let admitted = |record: &&Record| filter.is_none_or(|f| f.admits(record));
    if backwards {
        // Backward reads take post-positions: everything before `from`.
        let end = match from {
            AllFrom::Position(position) => log.index_at_or_after(position),
            AllFrom::End => log.len(),
            AllFrom::Start => 0,
        };
        (0..end)
            .rev()
            .filter_map(|index| log.record(index))
            .filter(admitted)
            .take(count)
            .map(event_message)
            .collect()
    } else {
        // Forward reads are inclusive of the position named.
        let start = match from {
            AllFrom::Position(position) => log.index_at_or_after(position),
            AllFrom::Start => 0,
            AllFrom::End => log.len(),
        };
        (start..log.len())
            .filter_map(|index| log.record(index))
            .filter(admitted)
            .take(count)
            .map(event_message)
            .collect()
    }
}

fn parse_filter(filter: read_req::FilterOptions) -> Result<Filter, Status> {
    let (on_stream_name, expression) = match filter.filter {
        Some(read_req::Filter::StreamIdentifier(expression)) => (true, expression),
        Some(read_req::Filter::EventType(expression)) => (false, expression),
        None => return Err(Status::invalid_argument("a filter names what it filters")),
    };
    if !expression.regex.is_empty() || expression.prefix.is_empty() {
        return Err(Status::unimplemented("the stand filters by prefixes only"));
    }
    let window = match filter.window {
        Some(read_req::Window::Max(max)) if max > 0 => u64::from(max),
        _ => CHECKPOINT_WINDOW_RECORDS,
    };
    Ok(Filter {
        on_stream_name,
        prefixes: expression.prefix,
        checkpoint_interval: window * u64::from(filter.checkpoint_interval_multiplier.max(1)),
    })
}

/// Catch-up, then live: every record after `from` once, in log order; checkpoints every
/// interval of considered records (and when caught up) for a filtered subscription.
async fn subscribe_all(
    shared: &Shared,
    sender: &mpsc::Sender<Result<wire::ReadResp, Status>>,
    from: AllFrom,
    filter: Option<Filter>,
) {
    let mut committed = shared.log().watch();
    let mut next = {
        let log = shared.log();
        match from {
            // Subscriptions are exclusive of the position they start from.
            AllFrom::Position(position) => log.index_after(position),
            AllFrom::Start => 0,
            AllFrom::End => log.len(),
        }
    };
    let confirmation = read_resp::Content::Confirmation(read_resp::SubscriptionConfirmation {
        subscription_id: uuid::Uuid::new_v4().to_string(),
    });
    if !send(sender, confirmation).await {
        return;
    }
    let mut considered: u64 = 0;
    let mut caught_up = false;
    loop {
        let chunk: Vec<Record> = {
            let log = shared.log();
            (next..log.len().min(next + SUBSCRIPTION_CHUNK_RECORDS))
                .filter_map(|index| log.record(index).cloned())
                .collect()
        };
        if chunk.is_empty() {
            if !caught_up {
                caught_up = true;
                if !send(sender, read_resp::Content::CaughtUp(read_resp::CaughtUp {})).await {
                    return;
                }
            }
            if committed.changed().await.is_err() {
                return;
            }
            continue;
        }
        next += chunk.len();
        for record in &chunk {
            considered += 1;
            let admitted = filter.as_ref().is_none_or(|filter| filter.admits(record));
            if admitted && !send(sender, event_message(record)).await {
                return;
            }
            if let Some(filter) = &filter {
                if considered.is_multiple_of(filter.checkpoint_interval) {
                    let checkpoint = read_resp::Content::Checkpoint(read_resp::Checkpoint {
                        commit_position: record.position,
                        prepare_position: record.position,
                    });
                    if !send(sender, checkpoint).await {
                        return;
                    }
                }
            }
        }
    }
}

fn event_message(record: &Record) -> read_resp::Content {
    let metadata = HashMap::from([
        ("type".to_owned(), record.event_type.clone()),
        ("content-type".to_owned(), record.content_type.clone()),
        ("created".to_owned(), record.created_ticks.to_string()),
    ]);
    read_resp::Content::Event(read_resp::ReadEvent {
        event: Some(read_resp::RecordedEvent {
            id: Some(wire::Uuid::string(record.id)),
            stream_identifier: Some(wire::StreamIdentifier {
                stream_name: record.stream.clone().into_bytes(),
            }),
            stream_revision: record.revision,
            prepare_position: record.position,
            commit_position: record.position,
            metadata,
            custom_metadata: record.custom_metadata.clone(),
            data: record.data.clone(),
        }),
        link: None,
        position: Some(read_resp::EventPosition::CommitPosition(record.position)),
    })
}

async fn send_all(
    sender: &mpsc::Sender<Result<wire::ReadResp, Status>>,
    messages: Vec<read_resp::Content>,
) {
    for message in messages {
        if !send(sender, message).await {
            return;
        }
    }
}

/// Sends one message; `false` when the client has gone.
async fn send(
    sender: &mpsc::Sender<Result<wire::ReadResp, Status>>,
    content: read_resp::Content,
) -> bool {
    sender
        .send(Ok(wire::ReadResp {
            content: Some(content),
        }))
        .await
        .is_ok()
}

fn stream_name(identifier: Option<&wire::StreamIdentifier>) -> Result<String, Status> {
    let identifier =
        identifier.ok_or_else(|| Status::invalid_argument("the request names no stream"))?;
    String::from_utf8(identifier.stream_name.clone())
        .ok()
        .filter(|name| !name.is_empty())
        .ok_or_else(|| Status::invalid_argument("a stream name is non-empty UTF-8"))
}
