//! The checks of the event-store port, each generic over the store it runs against.
//!
//! Every check gets a fresh, empty store. Checks never sleep to let something happen: they wait
//! for the store's own answers, with [`within`] only as a guard against a hang.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use opledger_domain::ids::{GlobalPosition, StreamVersion};
use opledger_domain::store::{
    AppendOutcome, EventData, ExpectedVersion, LogStart, StoreError, StreamName, Subscription,
    MAX_EVENTS_PER_APPEND, MAX_EVENT_BYTES, MAX_READ_BATCH,
};
use tokio::sync::Barrier;

use crate::support::*;

const RACERS: usize = 32;

/// `RACERS` tasks append one event each to `name` at `expected`, released together by a
/// barrier. Returns each racer's event and answer.
async fn race<S: TestStore>(
    store: &S,
    name: &StreamName,
    expected: ExpectedVersion,
    first_id: u128,
) -> Vec<(EventData, Result<AppendOutcome, StoreError>)> {
    let barrier = Arc::new(Barrier::new(RACERS));
    let racers: Vec<_> = (0..RACERS)
        .map(|racer| {
            let (store, name, barrier) = (store.clone(), name.clone(), Arc::clone(&barrier));
            let event = event(first_id + racer as u128);
            tokio::spawn(async move {
                barrier.wait().await;
                let answer = store.append(&name, expected, vec![event.clone()]).await;
                (event, answer)
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(RACERS);
    for racer in racers {
        answers.push(
            within("a racer is answered", racer)
                .await
                .expect("racer task"),
        );
    }
    answers
}

/// Asserts exactly one racer won, every other got a conflict naming the winner's version, and
/// the stream holds the winner's event after `before` events.
async fn assert_one_winner<S: TestStore>(
    store: &S,
    name: &StreamName,
    expected: ExpectedVersion,
    before: usize,
    answers: Vec<(EventData, Result<AppendOutcome, StoreError>)>,
) {
    let (winners, losers): (Vec<_>, Vec<_>) =
        answers.into_iter().partition(|(_, answer)| answer.is_ok());
    assert_eq!(
        winners.len(),
        1,
        "exactly one racer wins; winners: {winners:?}"
    );
    let (winning_event, winning_answer) = &winners[0];
    let won = winning_answer.clone().expect("the winner's outcome");
    assert_eq!(won.next_expected, expected.first_new_version());
    for (_, answer) in &losers {
        assert_eq!(
            answer,
            &Err(StoreError::VersionConflict {
                stream: name.clone(),
                expected,
                actual: Some(won.next_expected)
            }),
            "every loser learns the winner's version"
        );
    }
    let stored = read_whole_stream(store, name).await;
    assert_eq!(
        stored.len(),
        before + 1,
        "only the winner's event was added"
    );
    assert_eq!(stored[before].event_id, winning_event.event_id);
    assert_eq!(stored[before].position, won.position);
}

pub async fn thirty_two_racing_appends_have_exactly_one_winner<S: TestStore>(store: S) {
    let name = stream("race");
    let created = store
        .append(&name, ExpectedVersion::NoStream, vec![event(1)])
        .await
        .expect("create the stream");
    let expected = ExpectedVersion::Exact(created.next_expected);
    let answers = race(&store, &name, expected, 100).await;
    assert_one_winner(&store, &name, expected, 1, answers).await;
}

pub async fn thirty_two_racing_creations_of_one_stream_have_exactly_one_winner<S: TestStore>(
    store: S,
) {
    let name = stream("race-to-create");
    let answers = race(&store, &name, ExpectedVersion::NoStream, 100).await;
    assert_one_winner(&store, &name, ExpectedVersion::NoStream, 0, answers).await;
}

pub async fn appending_no_stream_to_an_existing_stream_conflicts_with_its_last_version<
    S: TestStore,
>(
    store: S,
) {
    let name = stream("existing");
    let created = store
        .append(&name, ExpectedVersion::NoStream, events(1, 2))
        .await
        .expect("create");
    let refused = store
        .append(&name, ExpectedVersion::NoStream, vec![event(10)])
        .await;
    assert_eq!(
        refused,
        Err(StoreError::VersionConflict {
            stream: name.clone(),
            expected: ExpectedVersion::NoStream,
            actual: Some(created.next_expected),
        })
    );
    assert_eq!(
        ids(&read_whole_stream(&store, &name).await),
        [event_id(1), event_id(2)]
    );
}

pub async fn appending_an_exact_version_to_a_missing_stream_conflicts_with_no_stream<
    S: TestStore,
>(
    store: S,
) {
    let name = stream("missing");
    let expected = ExpectedVersion::Exact(StreamVersion::FIRST);
    let refused = store.append(&name, expected, vec![event(1)]).await;
    assert_eq!(
        refused,
        Err(StoreError::VersionConflict {
            stream: name.clone(),
            expected,
            actual: None
        })
    );
    assert!(read_whole_stream(&store, &name).await.is_empty());
    assert_eq!(store.head_position().await, Ok(None));
}

pub async fn appending_behind_or_ahead_of_the_stream_conflicts_with_its_last_version<
    S: TestStore,
>(
    store: S,
) {
    let name = stream("moving");
    store
        .append(&name, ExpectedVersion::NoStream, events(1, 3))
        .await
        .expect("create at version 2");
    let actual = Some(StreamVersion::new(2));
    for wanted in [1, 3, u64::MAX] {
        let expected = ExpectedVersion::Exact(StreamVersion::new(wanted));
        let refused = store
            .append(&name, expected, vec![event(10 + u128::from(wanted % 1000))])
            .await;
        assert_eq!(
            refused,
            Err(StoreError::VersionConflict {
                stream: name.clone(),
                expected,
                actual
            })
        );
    }
    assert_eq!(read_whole_stream(&store, &name).await.len(), 3);
}

pub async fn re_appending_the_same_event_ids_returns_the_first_outcome_and_writes_nothing<
    S: TestStore,
>(
    store: S,
) {
    let name = stream("retried");
    let first = store
        .append(&name, ExpectedVersion::NoStream, events(1, 2))
        .await
        .expect("first append");
    store
        .append(&stream("other"), ExpectedVersion::NoStream, vec![event(50)])
        .await
        .expect("move the log on");
    let second = store
        .append(
            &name,
            ExpectedVersion::Exact(first.next_expected),
            vec![event(3)],
        )
        .await
        .expect("second append");
    let head = store.head_position().await.expect("head");

    // A retry of an older append gets that append's outcome, not the stream's newest one.
    assert_eq!(
        store
            .append(&name, ExpectedVersion::NoStream, events(1, 2))
            .await,
        Ok(first)
    );
    assert_eq!(
        store
            .append(
                &name,
                ExpectedVersion::Exact(first.next_expected),
                vec![event(3)]
            )
            .await,
        Ok(second)
    );
    // The retry of the newest append is the common case: the stream is at the expected version
    // plus the append's events.
    assert_eq!(
        store
            .append(
                &name,
                ExpectedVersion::Exact(first.next_expected),
                vec![event(3)]
            )
            .await,
        Ok(second)
    );

    assert_eq!(
        ids(&read_whole_stream(&store, &name).await),
        [event_id(1), event_id(2), event_id(3)]
    );
    let log = read_whole_log(&store).await;
    assert_eq!(log.len(), 4, "no second copy in the log: {log:?}");
    assert_eq!(
        store.head_position().await.expect("head"),
        head,
        "retries move nothing"
    );
}

pub async fn re_appending_at_the_same_version_with_other_ids_conflicts<S: TestStore>(store: S) {
    let name = stream("retried-differently");
    let first = store
        .append(&name, ExpectedVersion::NoStream, events(1, 2))
        .await
        .expect("first append");
    let conflict = Err(StoreError::VersionConflict {
        stream: name.clone(),
        expected: ExpectedVersion::NoStream,
        actual: Some(first.next_expected),
    });
    let other_ids = events(10, 2);
    let swapped = vec![event(2), event(1)];
    let more = events(1, 3);
    for attempt in [other_ids, swapped, more] {
        assert_eq!(
            store
                .append(&name, ExpectedVersion::NoStream, attempt)
                .await,
            conflict
        );
    }
    assert_eq!(
        ids(&read_whole_stream(&store, &name).await),
        [event_id(1), event_id(2)]
    );
    assert_eq!(read_whole_log(&store).await.len(), 2);
}

pub async fn an_event_id_stored_elsewhere_is_refused_and_nothing_is_written<S: TestStore>(
    store: S,
) {
    let first = stream("first");
    let created = store
        .append(&first, ExpectedVersion::NoStream, vec![event(1)])
        .await
        .expect("create");

    let second = stream("second");
    let refused = store
        .append(&second, ExpectedVersion::NoStream, vec![event(2), event(1)])
        .await;
    assert!(
        matches!(refused, Err(StoreError::InvalidAppend { .. })),
        "another stream: {refused:?}"
    );
    let refused = store
        .append(
            &first,
            ExpectedVersion::Exact(created.next_expected),
            vec![event(1)],
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::InvalidAppend { .. })),
        "a later version: {refused:?}"
    );

    assert!(read_whole_stream(&store, &second).await.is_empty());
    assert_eq!(ids(&read_whole_log(&store).await), [event_id(1)]);
}

pub async fn positions_strictly_increase_in_commit_order_across_sixteen_concurrent_writers<
    S: TestStore,
>(
    store: S,
) {
    const WRITERS: u128 = 16;
    const APPENDS: u128 = 50;
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let store = store.clone();
            tokio::spawn(async move {
                let name = stream(&format!("writer-{writer}"));
                let mut expected = ExpectedVersion::NoStream;
                let mut outcomes = Vec::new();
                for append in 0..APPENDS {
                    // One to three events per append, so appends of several events interleave too.
                    let count = (append % 3 + 1) as usize;
                    let first_id = (writer << 64) | (append << 8);
                    let outcome = store
                        .append(&name, expected, events(first_id, count))
                        .await
                        .expect("append");
                    expected = ExpectedVersion::Exact(outcome.next_expected);
                    outcomes.push(outcome);
                }
                (name, outcomes)
            })
        })
        .collect();
    let mut acknowledged = Vec::new();
    for writer in writers {
        let (name, outcomes) = within("a writer finishes", writer)
            .await
            .expect("writer task");
        assert!(
            outcomes
                .windows(2)
                .all(|pair| pair[0].position < pair[1].position),
            "{name}: {outcomes:?}"
        );
        acknowledged.extend(outcomes.into_iter().map(|outcome| (name.clone(), outcome)));
    }

    let log = read_whole_log(&store).await;
    assert_strictly_increasing(&log);
    let mut by_stream: BTreeMap<&StreamName, Vec<u64>> = BTreeMap::new();
    for event in &log {
        by_stream
            .entry(&event.stream)
            .or_default()
            .push(event.version.value());
    }
    assert_eq!(by_stream.len(), WRITERS as usize);
    for (name, versions) in &by_stream {
        let expected: Vec<u64> = (0..versions.len() as u64).collect();
        assert_eq!(
            versions, &expected,
            "the versions of {name} are contiguous from 0 in log order"
        );
    }
    let stored: HashSet<(&StreamName, StreamVersion, GlobalPosition)> = log
        .iter()
        .map(|event| (&event.stream, event.version, event.position))
        .collect();
    for (name, outcome) in &acknowledged {
        assert!(
            stored.contains(&(name, outcome.next_expected, outcome.position)),
            "{name} {outcome:?} is in the log"
        );
    }
}

pub async fn a_subscription_started_while_writers_run_delivers_every_event_once_in_order<
    S: TestStore,
>(
    store: S,
) {
    const WRITERS: u128 = 8;
    const APPENDS: u128 = 25;
    let before = stream("before");
    for n in 0..20_u64 {
        let expected = ExpectedVersion::from_last(n.checked_sub(1).map(StreamVersion::new));
        store
            .append(&before, expected, vec![event(u128::from(n))])
            .await
            .expect("append before subscribing");
    }
    let per_writer: usize = (0..APPENDS).map(|append| (append % 2 + 1) as usize).sum();
    let writers: Vec<_> = (1..=WRITERS)
        .map(|writer| {
            let store = store.clone();
            tokio::spawn(async move {
                let name = stream(&format!("live-{writer}"));
                let mut expected = ExpectedVersion::NoStream;
                for append in 0..APPENDS {
                    let count = (append % 2 + 1) as usize;
                    let outcome = store
                        .append(
                            &name,
                            expected,
                            events((writer << 64) | (append << 8), count),
                        )
                        .await
                        .expect("append");
                    expected = ExpectedVersion::Exact(outcome.next_expected);
                }
            })
        })
        .collect();
    let mut subscription = store
        .subscribe_all(LogStart::Beginning)
        .await
        .expect("subscribe");

    // Deliver while the writers run, until every event they write has arrived.
    let total = 20 + WRITERS as usize * per_writer;
    let mut delivered = Vec::with_capacity(total);
    while delivered.len() < total {
        delivered.push(
            within("the next event", subscription.next())
                .await
                .expect("next"),
        );
    }
    for writer in writers {
        within("a writer finishes", writer)
            .await
            .expect("writer task");
    }
    assert_eq!(
        delivered,
        read_whole_log(&store).await,
        "every event once, in position order"
    );

    // Nothing is pending or repeated: the next delivery is the next commit.
    let marker = store
        .append(
            &stream("marker"),
            ExpectedVersion::NoStream,
            vec![event(u128::MAX)],
        )
        .await
        .expect("append");
    let next = within("the marker", subscription.next())
        .await
        .expect("next");
    assert_eq!(
        (next.event_id, next.position),
        (event_id(u128::MAX), marker.position)
    );
}

pub async fn a_subscription_after_a_position_starts_strictly_after_it<S: TestStore>(store: S) {
    let name = stream("numbered");
    let mut outcomes = Vec::new();
    for n in 0..10 {
        let expected = ExpectedVersion::from_last(
            outcomes
                .last()
                .map(|outcome: &AppendOutcome| outcome.next_expected),
        );
        outcomes.push(
            store
                .append(&name, expected, vec![event(n)])
                .await
                .expect("append"),
        );
    }
    let log = read_whole_log(&store).await;

    let mut subscription = store
        .subscribe_all(LogStart::After(outcomes[3].position))
        .await
        .expect("subscribe");
    for expected in &log[4..] {
        assert_eq!(
            &within("next", subscription.next()).await.expect("next"),
            expected
        );
    }

    let at_head = store
        .head_position()
        .await
        .expect("head")
        .expect("the log has events");
    let mut from_head = store
        .subscribe_all(LogStart::After(at_head))
        .await
        .expect("subscribe at the head");
    let later = store
        .append(
            &name,
            ExpectedVersion::Exact(outcomes[9].next_expected),
            vec![event(10)],
        )
        .await
        .expect("append");
    let next = within("the event after the head", from_head.next())
        .await
        .expect("next");
    assert_eq!(
        (next.event_id, next.position),
        (event_id(10), later.position)
    );
    let next = within(
        "the same event, on the first subscription",
        subscription.next(),
    )
    .await
    .expect("next");
    assert_eq!(next.position, later.position);
}

pub async fn a_caught_up_subscription_wakes_for_the_next_commit<S: TestStore>(store: S) {
    let mut subscription = store
        .subscribe_all(LogStart::Beginning)
        .await
        .expect("subscribe to an empty log");
    let waiting = tokio::spawn(async move {
        let first = subscription.next().await;
        let second = subscription.next().await;
        (first, second)
    });
    let name = stream("woken");
    let first = store
        .append(&name, ExpectedVersion::NoStream, vec![event(1)])
        .await
        .expect("append");
    let second = store
        .append(
            &name,
            ExpectedVersion::Exact(first.next_expected),
            vec![event(2)],
        )
        .await
        .expect("append");
    let (got_first, got_second) = within("the waiting subscriber", waiting)
        .await
        .expect("subscriber task");
    assert_eq!(got_first.expect("first").position, first.position);
    assert_eq!(got_second.expect("second").position, second.position);
}

pub async fn reading_a_stream_from_a_middle_version_pages_by_max_count<S: TestStore>(store: S) {
    let name = stream("paged");
    let created = store
        .append(&name, ExpectedVersion::NoStream, events(0, 4))
        .await
        .expect("append");
    store
        .append(
            &stream("between"),
            ExpectedVersion::NoStream,
            vec![event(100)],
        )
        .await
        .expect("append elsewhere");
    store
        .append(
            &name,
            ExpectedVersion::Exact(created.next_expected),
            events(4, 6),
        )
        .await
        .expect("append");

    let read =
        |from: u64, max_count: usize| store.read_stream(&name, StreamVersion::new(from), max_count);
    assert_eq!(versions(&read(4, 3).await.expect("read")), [4, 5, 6]);
    assert_eq!(versions(&read(7, 100).await.expect("read")), [7, 8, 9]);
    assert_eq!(
        versions(&read(2, 4).await.expect("read")),
        [2, 3, 4, 5],
        "a page may span appends"
    );
    assert!(read(10, 5).await.expect("read").is_empty(), "past the end");
    assert!(
        read(0, 0).await.expect("read").is_empty(),
        "no room asked for"
    );
    assert!(
        read(u64::MAX, 5).await.expect("read").is_empty(),
        "far past the end"
    );
    let whole = read(0, 100).await.expect("read");
    assert_eq!(ids(&whole), (0..10).map(event_id).collect::<Vec<_>>());
    assert!(whole.iter().all(|event| event.stream == name));
}

pub async fn a_missing_stream_reads_as_empty<S: TestStore>(store: S) {
    store
        .append(
            &stream("present"),
            ExpectedVersion::NoStream,
            vec![event(1)],
        )
        .await
        .expect("append");
    assert_eq!(
        store
            .read_stream(&stream("absent"), StreamVersion::FIRST, 10)
            .await,
        Ok(Vec::new())
    );
    assert_eq!(
        store
            .read_stream(&stream("presen"), StreamVersion::FIRST, 10)
            .await,
        Ok(Vec::new())
    );
}

pub async fn reading_the_log_pages_with_log_start_after<S: TestStore>(store: S) {
    assert_eq!(
        store.read_all(LogStart::Beginning, 10).await,
        Ok(Vec::new()),
        "an empty log"
    );
    for (n, name) in ["a", "b", "c", "a", "b", "c", "a", "b", "c", "a"]
        .into_iter()
        .enumerate()
    {
        let name = stream(name);
        let last = store
            .read_stream(&name, StreamVersion::FIRST, 100)
            .await
            .expect("read")
            .last()
            .map(|e| e.version);
        store
            .append(
                &name,
                ExpectedVersion::from_last(last),
                vec![event(n as u128)],
            )
            .await
            .expect("append");
    }
    let whole = store
        .read_all(LogStart::Beginning, 100)
        .await
        .expect("read");
    assert_eq!(ids(&whole), (0..10).map(event_id).collect::<Vec<_>>());
    assert_strictly_increasing(&whole);

    let mut paged = Vec::new();
    let mut start = LogStart::Beginning;
    loop {
        let page = store.read_all(start, 3).await.expect("read a page");
        assert!(page.len() <= 3);
        let Some(last) = page.last() else { break };
        start = LogStart::After(last.position);
        paged.extend(page);
    }
    assert_eq!(paged, whole);
    let after_fourth = store
        .read_all(LogStart::After(whole[3].position), 2)
        .await
        .expect("read");
    assert_eq!(after_fourth, whole[4..6]);
    assert!(store
        .read_all(LogStart::Beginning, 0)
        .await
        .expect("read")
        .is_empty());
    let beyond = LogStart::After(GlobalPosition::new(u64::MAX));
    assert!(store.read_all(beyond, 10).await.expect("read").is_empty());
}

pub async fn reads_return_at_most_the_maximum_read_batch<S: TestStore>(store: S) {
    let name = stream("long");
    let mut expected = ExpectedVersion::NoStream;
    let mut written = 0;
    while written <= MAX_READ_BATCH {
        let outcome = store
            .append(
                &name,
                expected,
                events(written as u128, MAX_EVENTS_PER_APPEND),
            )
            .await
            .expect("append");
        expected = ExpectedVersion::Exact(outcome.next_expected);
        written += MAX_EVENTS_PER_APPEND;
    }
    assert_eq!(
        store
            .read_all(LogStart::Beginning, usize::MAX)
            .await
            .expect("read")
            .len(),
        MAX_READ_BATCH
    );
    assert_eq!(
        store
            .read_stream(&name, StreamVersion::FIRST, usize::MAX)
            .await
            .expect("read")
            .len(),
        MAX_READ_BATCH
    );
    assert_eq!(read_whole_log(&store).await.len(), written);
}

/// Asserts a refused append left the store empty.
async fn assert_nothing_written<S: TestStore>(store: &S, name: &StreamName) {
    assert_eq!(store.head_position().await, Ok(None));
    assert!(read_whole_stream(store, name).await.is_empty());
    assert!(read_whole_log(store).await.is_empty());
}

pub async fn an_empty_append_is_refused_and_writes_nothing<S: TestStore>(store: S) {
    let name = stream("empty");
    let refused = store
        .append(&name, ExpectedVersion::NoStream, Vec::new())
        .await;
    assert!(
        matches!(refused, Err(StoreError::InvalidAppend { .. })),
        "{refused:?}"
    );
    assert_nothing_written(&store, &name).await;
}

pub async fn an_oversized_event_is_refused_and_writes_nothing<S: TestStore>(store: S) {
    let name = stream("oversized");
    let mut oversized = event(2);
    oversized.data = vec![b' '; MAX_EVENT_BYTES + 1 - oversized.metadata.len()];
    let refused = store
        .append(&name, ExpectedVersion::NoStream, vec![event(1), oversized])
        .await;
    assert!(
        matches!(refused, Err(StoreError::InvalidAppend { .. })),
        "{refused:?}"
    );
    assert_nothing_written(&store, &name).await;
}

pub async fn an_append_over_the_event_count_limit_is_refused_and_writes_nothing<S: TestStore>(
    store: S,
) {
    let name = stream("too-many");
    let refused = store
        .append(
            &name,
            ExpectedVersion::NoStream,
            events(0, MAX_EVENTS_PER_APPEND + 1),
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::InvalidAppend { .. })),
        "{refused:?}"
    );
    assert_nothing_written(&store, &name).await;
}

pub async fn recorded_events_carry_exactly_the_appended_type_data_and_metadata<S: TestStore>(
    store: S,
) {
    let name = stream("payloads");
    let appended = vec![
        EventData {
            event_id: event_id(1),
            event_type: "IntentRecorded".into(),
            data: br#"{"action":"create_task","args":{"title":"caf\u00e9"}}"#.to_vec(),
            metadata: br#"{"schema":1}"#.to_vec(),
        },
        EventData {
            event_id: event_id(2),
            event_type: "Binary".into(),
            data: vec![0, 255, 10, 0],
            metadata: Vec::new(),
        },
        EventData {
            event_id: event_id(3),
            event_type: "Empty".into(),
            data: Vec::new(),
            metadata: vec![7],
        },
    ];
    let outcome = store
        .append(&name, ExpectedVersion::NoStream, appended.clone())
        .await
        .expect("append");
    let stored = read_whole_stream(&store, &name).await;
    assert_eq!(stored.len(), appended.len());
    for ((stored, appended), version) in stored.iter().zip(&appended).zip(0..) {
        assert_eq!(stored.stream, name);
        assert_eq!(stored.version, StreamVersion::new(version));
        assert_eq!(stored.event_id, appended.event_id);
        assert_eq!(stored.event_type, appended.event_type);
        assert_eq!(stored.data, appended.data);
        assert_eq!(stored.metadata, appended.metadata);
    }
    assert_eq!(
        stored.last().map(|event| (event.version, event.position)),
        Some((outcome.next_expected, outcome.position))
    );
    assert_eq!(read_whole_log(&store).await, stored);
}

pub async fn the_head_position_is_none_for_an_empty_log_then_the_newest_position<S: TestStore>(
    store: S,
) {
    assert_eq!(store.head_position().await, Ok(None));
    let first = store
        .append(&stream("a"), ExpectedVersion::NoStream, events(1, 2))
        .await
        .expect("append");
    assert_eq!(store.head_position().await, Ok(Some(first.position)));
    let second = store
        .append(&stream("b"), ExpectedVersion::NoStream, vec![event(3)])
        .await
        .expect("append");
    assert!(second.position > first.position);
    assert_eq!(store.head_position().await, Ok(Some(second.position)));
    store
        .append(&stream("a"), ExpectedVersion::NoStream, events(1, 2))
        .await
        .expect("a retry");
    assert_eq!(
        store.head_position().await,
        Ok(Some(second.position)),
        "a retry writes nothing"
    );
}
