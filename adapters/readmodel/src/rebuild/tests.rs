//! The rebuild's own parts, tested alone: the window, the request filter, the writer and the
//! id-index entries. The rebuild as a whole is compared with the runner in `tests/`.

use chrono::{DateTime, Duration, TimeZone, Utc};
use opledger_domain::args::ArgsHash;
use opledger_domain::event::IntentRecorded;
use opledger_domain::ids::{AccountId, ActionName, ProviderId, TenantId};
use opledger_projections::duplicates::{
    self, SimilarIntent, SimilarIntentQuery, POSSIBLE_DUPLICATE_WINDOW_S,
};
use opledger_projections::id_index::IdIndexChange;
use rusqlite::Connection;

use super::fold::{id_entry_key, id_entry_position, Rebuilder};
use super::window::{IntentWindow, RequestDigest, RequestFilter, WindowAnswer};
use super::writer::{write_channel, Message, Write, Writer};
use super::*;
use crate::apply::{self, QueryBounds};
use crate::{schema, sql};

/// Distinct, evenly spread stand-ins for SHA-256 digests (splitmix64 of a counter, twice),
/// the same on every run.
fn digests(from: u64, count: u64) -> impl Iterator<Item = RequestDigest> {
    let mix = |mut value: u64| {
        value = value.wrapping_add(0x9e37_79b9_7f4a_7c15);
        value = (value ^ (value >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        value = (value ^ (value >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        value ^ (value >> 31)
    };
    (from..from + count)
        .map(move |n| RequestDigest(u128::from(mix(2 * n)) << 64 | u128::from(mix(2 * n + 1))))
}

#[test]
fn the_request_filter_full_of_a_ten_million_event_logs_requests_almost_never_says_maybe() {
    // A 10M-event log of three events per operation lets the window go of ~3.3 million
    // requests; each false "maybe" after that makes a rebuild build every index mid-way.
    // With six probes the filter said it ~7 times in a million (three times in a real 10M
    // rebuild); with twelve, ~8 times in a hundred million.
    let mut filter = RequestFilter::new();
    for key in digests(0, 3_300_000) {
        filter.insert(key);
    }
    assert!(digests(0, 1_000).all(|key| filter.may_contain(key)));
    let maybes = digests(1 << 40, 1_000_000)
        .filter(|key| filter.may_contain(*key))
        .count();
    assert!(maybes <= 1, "{maybes} false maybes in a million lookups");
}

/// 09:00 UTC on the given day.
fn at_nine(year: i32, month: u32, day: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(year, month, day, 9, 0, 0)
        .single()
        .expect("valid")
}

fn query(operation: u128, at: DateTime<Utc>) -> SimilarIntentQuery {
    let window = Duration::seconds(POSSIBLE_DUPLICATE_WINDOW_S);
    SimilarIntentQuery {
        operation_id: OperationId::from_uuid(uuid::Uuid::from_u128(operation)),
        tenant: TenantId::new("t").expect("valid"),
        provider: ProviderId::new("p").expect("valid"),
        account: AccountId::new("a").expect("valid"),
        action: ActionName::new("create").expect("valid"),
        args_hash: ArgsHash::parse(&format!("sha256:{}", "a".repeat(64))).expect("valid"),
        from: at - window,
        to: at + window,
        limit: duplicates::MAX_SIMILAR_INTENTS_CHECKED,
    }
}

fn intent(operation: u128, at: DateTime<Utc>) -> SimilarIntent {
    SimilarIntent {
        operation_id: OperationId::from_uuid(uuid::Uuid::from_u128(operation)),
        source_id: None,
        recorded_at: at,
    }
}

#[test]
fn the_window_answers_newest_first_without_the_asker_and_refuses_below_its_floor() {
    let base = at_nine(2026, 11, 30);
    let mut window = IntentWindow::new(MAX_WINDOW_INTENTS);
    for n in 1..=3 {
        window.insert(
            RequestDigest::of(&query(n, base)),
            intent(n, base + Duration::seconds(n as i64)),
        );
    }
    let WindowAnswer::Found(found) = window.find(
        RequestDigest::of(&query(2, base)),
        QueryBounds::of(&query(2, base)),
    ) else {
        panic!("nothing let go of yet");
    };
    let ids: Vec<_> = found.iter().map(|i| i.operation_id).collect();
    assert_eq!(
        ids,
        vec![
            OperationId::from_uuid(uuid::Uuid::from_u128(3)),
            OperationId::from_uuid(uuid::Uuid::from_u128(1)),
        ]
    );
    // Letting go of nothing (all are newer than the floor) keeps answering.
    window.raise_floor(base);
    assert!(matches!(
        window.find(
            RequestDigest::of(&query(9, base)),
            QueryBounds::of(&query(9, base))
        ),
        WindowAnswer::Found(_)
    ));
    // Letting go of the first two sends an overlapping query to the file.
    window.raise_floor(base + Duration::seconds(3));
    assert!(matches!(
        window.find(
            RequestDigest::of(&query(9, base)),
            QueryBounds::of(&query(9, base))
        ),
        WindowAnswer::AskTheFile
    ));
    let later = base + Duration::seconds(POSSIBLE_DUPLICATE_WINDOW_S + 3);
    assert!(matches!(
        window.find(
            RequestDigest::of(&query(9, later)),
            QueryBounds::of(&query(9, later))
        ),
        WindowAnswer::Found(_)
    ));
}

#[test]
fn a_request_digest_tells_requests_apart_by_their_names_and_where_the_names_split() {
    let at = at_nine(2026, 12, 4);
    let asked = query(7, at);
    // Who asks and when is not the request.
    assert_eq!(
        RequestDigest::of(&asked),
        RequestDigest::of(&query(8, at + Duration::seconds(5)))
    );
    let mut other_action = asked.clone();
    other_action.action = ActionName::new("update").expect("valid");
    assert_ne!(RequestDigest::of(&asked), RequestDigest::of(&other_action));
    // The same bytes split differently between two names are another request.
    let split = |tenant: &str, provider: &str| {
        let mut split = asked.clone();
        split.tenant = TenantId::new(tenant).expect("valid");
        split.provider = ProviderId::new(provider).expect("valid");
        RequestDigest::of(&split)
    };
    assert_ne!(split("ab", "c"), split("a", "bc"));
}

#[test]
fn an_intent_is_keyed_and_bounded_as_its_query_and_its_row_hash_is_the_one_made_from_the_row() {
    use opledger_domain::args::ArgsSnapshot;
    use opledger_domain::ids::{CredentialFingerprint, IdempotencyKey};
    let at = at_nine(2026, 12, 4);
    let args = ArgsSnapshot::parse(r#"{"title": "Call the client"}"#).expect("valid");
    let operation_id = OperationId::from_uuid(uuid::Uuid::from_u128(7));
    let intent = IntentRecorded {
        operation_id,
        tenant: TenantId::new("tenant").expect("valid"),
        owner: None,
        provider: ProviderId::new("crm").expect("valid"),
        account: AccountId::new("acct").expect("valid"),
        credential_fingerprint: CredentialFingerprint::new("fp").expect("valid"),
        action: ActionName::new("create_task").expect("valid"),
        args_hash: args.hash(),
        args,
        idempotency_key: IdempotencyKey::new("opk_1").expect("valid"),
        source_id: None,
        requires_approval: false,
        executor: Default::default(),
        at,
    };
    let event = OperationEvent::IntentRecorded(intent.clone());
    let query = duplicates::similar_intent_query(operation_id, &event).expect("an intent");
    assert_eq!(RequestDigest::of_intent(&intent), RequestDigest::of(&query));
    assert_eq!(
        QueryBounds::of_intent(operation_id, &intent),
        QueryBounds::of(&query)
    );
    let from_row = sql::request_hash([
        intent.tenant.as_str(),
        intent.provider.as_str(),
        intent.account.as_str(),
        intent.action.as_str(),
        intent.args_hash.as_str(),
    ]);
    assert_eq!(RequestDigest::of_intent(&intent).row_hash(), from_row);
    // Another request, another hash: the hash is not a constant.
    let mut other = intent;
    other.action = ActionName::new("update_task").expect("valid");
    assert_ne!(RequestDigest::of_intent(&other).row_hash(), from_row);
}

#[test]
fn a_writer_that_fails_answers_the_folds_question_with_an_error_instead_of_a_hang() {
    let dir = tempfile::tempdir().expect("temp dir");
    let temporary = dir.path().join("read.db.rebuild");
    let (mut writes, from_fold) = write_channel();
    let file = temporary.clone();
    let writer = std::thread::spawn(move || {
        Writer::create_file(&file)?;
        Writer::open(&file)?.write_all(from_fold)
    });
    // Creating the indexes twice fails the writer; the question waits behind it.
    writes.push(Write::CreateIndexes).expect("queued");
    writes.push(Write::CreateIndexes).expect("queued");
    let answer = writes.ask(|reply| Write::LoadState {
        operation_id: OperationId::from_uuid(uuid::Uuid::from_u128(1)),
        reply,
    });
    assert!(
        matches!(answer, Err(ReadModelError::Worker { .. })),
        "the fold learns that its writer stopped: {answer:?}"
    );
    drop(writes);
    let written = writer.join().expect("the writer does not panic");
    assert!(
        matches!(written, Err(ReadModelError::Sqlite { .. })),
        "the writer reports its own error: {written:?}"
    );
}

/// Every row of the id-index tables and the gauges, in key order.
fn id_tables(connection: &Connection) -> Vec<String> {
    let mut rows = Vec::new();
    for table in ["attempts", "sources", "external_ids", "gauges"] {
        let mut statement = connection
            .prepare(&format!("SELECT * FROM {table}"))
            .expect("select a table");
        let columns = statement.column_count();
        let mut found = statement
            .query_map([], |row| {
                (0..columns)
                    .map(|column| row.get::<_, rusqlite::types::Value>(column))
                    .collect::<Result<Vec<_>, _>>()
            })
            .expect("read a table")
            .map(|row| format!("{table}: {:?}", row.expect("read a row")))
            .collect::<Vec<_>>();
        found.sort();
        rows.extend(found);
    }
    rows
}

#[test]
fn id_entries_appended_then_merged_leave_the_rows_and_gauge_the_runners_upserts_leave() {
    use opledger_domain::ids::{AttemptId, ExternalObjectId, SourceId, WorkerId};
    use opledger_projections::id_index::ExternalIdRole::{Confirmed, Duplicate, Reported};
    let operation = |n: u128| OperationId::from_uuid(uuid::Uuid::from_u128(n));
    let at = at_nine(2026, 12, 3);
    let mut position = 0;
    let mut next = || {
        position += 1;
        GlobalPosition::new(position)
    };
    let named = |object: &str, by: u128, role, position| IdIndexChange::ExternalId {
        provider: ProviderId::new("crm").expect("valid"),
        account: AccountId::new("a").expect("valid"),
        external_id: ExternalObjectId::new(object).expect("valid"),
        operation_id: operation(by),
        role,
        position,
    };
    // In log order: one operation naming an object weakly, then strongly, then weakly again;
    // another naming it strongly first; an object three operations share; one named once.
    let entries = vec![
        named("task-1", 1, Reported, next()),
        IdIndexChange::Attempt {
            attempt_id: AttemptId::from_uuid(uuid::Uuid::from_u128(9)),
            operation_id: operation(1),
            number: 1,
            worker: WorkerId::new("w").expect("valid"),
            started_at: at,
            position: next(),
        },
        named("task-1", 1, Confirmed, next()),
        named("task-2", 2, Confirmed, next()),
        named("task-1", 1, Duplicate, next()),
        named("task-2", 2, Reported, next()),
        named("task-3", 3, Confirmed, next()),
        named("task-5", 7, Reported, next()),
        named("task-3", 4, Duplicate, next()),
        named("task-3", 5, Reported, next()),
        named("task-3", 4, Confirmed, next()),
        named("task-4", 1, Duplicate, next()),
        named("task-4", 6, Reported, next()),
        named("task-5", 7, Confirmed, next()),
        IdIndexChange::Source {
            tenant: TenantId::new("t").expect("valid"),
            source_id: SourceId::new("call-1").expect("valid"),
            operation_id: operation(1),
            position: next(),
        },
    ];
    let dir = tempfile::tempdir().expect("temp dir");
    let fresh = |name: &str| {
        let path = dir.path().join(name);
        Writer::create_file(&path).expect("a new file");
        schema::create_for_rebuild(&path, REBUILD_PAGE_SIZE, 1024).expect("a fresh file")
    };
    let upserted = fresh("upserted.db");
    for entry in &entries {
        apply::write_id_entry(&upserted, entry).expect("the runner's upsert");
    }
    let sorted = |flush: &[IdIndexChange]| {
        let mut flush = flush.to_vec();
        flush.sort_unstable_by(|left, right| {
            id_entry_key(left)
                .cmp(&id_entry_key(right))
                .then_with(|| id_entry_position(left).cmp(&id_entry_position(right)))
        });
        flush
    };
    let expected = id_tables(&upserted);
    assert!(
        expected.contains(&"gauges: [Text(\"shared_external_ids\"), Integer(2)]".to_string()),
        "two objects are shared: {expected:#?}"
    );
    // One flush, appended into the empty tables.
    let appended = fresh("appended.db");
    apply::write_sorted_id_entries(&appended, &sorted(&entries), apply::IdTables::Empty)
        .expect("appended");
    apply::write_shared_external_ids(&appended).expect("counted");
    assert_eq!(id_tables(&appended), expected);
    // Two flushes: the second names objects of the first again (task-3 by other
    // operations, task-5 by the same one, stronger) and is merged into filled tables.
    let (first, second) = entries.split_at(8);
    let merged = fresh("merged.db");
    apply::write_sorted_id_entries(&merged, &sorted(first), apply::IdTables::Empty)
        .expect("appended");
    apply::write_sorted_id_entries(&merged, &sorted(second), apply::IdTables::Filled)
        .expect("merged");
    apply::write_shared_external_ids(&merged).expect("counted");
    assert_eq!(id_tables(&merged), expected);
}

#[test]
fn a_flush_is_handed_over_in_ranges_that_never_part_one_objects_entries() {
    use opledger_domain::ids::{ExternalObjectId, WorkerId};
    use opledger_projections::id_index::ExternalIdRole::{Confirmed, Duplicate, Reported};
    let operation = |n: u128| OperationId::from_uuid(uuid::Uuid::from_u128(n));
    let named = |object: &str, by: u128, role, position| IdIndexChange::ExternalId {
        provider: ProviderId::new("crm").expect("valid"),
        account: AccountId::new("a").expect("valid"),
        external_id: ExternalObjectId::new(object).expect("valid"),
        operation_id: operation(by),
        role,
        position: GlobalPosition::new(position),
    };
    let attempt = |n: u128| IdIndexChange::Attempt {
        attempt_id: opledger_domain::ids::AttemptId::from_uuid(uuid::Uuid::from_u128(n)),
        operation_id: operation(n),
        number: 1,
        worker: WorkerId::new("w").expect("valid"),
        started_at: at_nine(2026, 12, 4),
        position: GlobalPosition::new(100 + n as u64),
    };
    let (writes, feed) = write_channel();
    let limits = RebuildLimits {
        id_entries_per_drip: 1,
        ..RebuildLimits::default()
    };
    let mut rebuilder = Rebuilder::new(writes, limits);
    // In key order, as a flush sorts them: two attempts, then one object named three times
    // by two operations, then another object.
    rebuilder.id_index.extend([
        attempt(1),
        attempt(2),
        named("task-1", 1, Reported, 1),
        named("task-1", 1, Confirmed, 2),
        named("task-1", 2, Duplicate, 3),
        named("task-2", 3, Confirmed, 4),
    ]);
    rebuilder.write_id_index(false).expect("sorted and kept");
    for _ in 0..4 {
        rebuilder.drip_id_index(false).expect("handed over");
    }
    assert!(
        rebuilder.draining.is_none(),
        "the whole flush was handed over"
    );
    rebuilder.writes.flush().expect("sent");
    let Ok(Message::Writes(handed)) = feed.messages.try_recv() else {
        panic!("the ranges were sent");
    };
    let ranges: Vec<_> = handed
        .iter()
        .map(|write| match write {
            Write::IdIndex { range, append, .. } => (range.clone(), *append),
            _ => panic!("only id-index ranges"),
        })
        .collect();
    assert_eq!(
        ranges,
        vec![(0..1, true), (1..2, true), (2..5, true), (5..6, true)],
        "one range per entry, except the object three entries name, in one range"
    );
}

#[test]
fn a_window_full_of_intents_recorded_at_one_time_lets_them_all_go_and_asks_the_file() {
    let at = at_nine(2026, 11, 30);
    let mut window = IntentWindow::new(2);
    for n in 1..=5 {
        window.insert(RequestDigest::of(&query(n, at)), intent(n, at));
        assert!(window.entries <= 2, "the window keeps within its limit");
    }
    assert!(matches!(
        window.find(
            RequestDigest::of(&query(9, at)),
            QueryBounds::of(&query(9, at))
        ),
        WindowAnswer::AskTheFile
    ));
}
