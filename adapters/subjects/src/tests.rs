use super::*;
use opledger_domain::personal::{open_args, seal_args, Personal, PersonalFields};
use table::{KeyTable, Row, Write};

fn kek(byte: u8) -> Kek {
    Kek::parse(&format!("{byte:02x}").repeat(32), "test").unwrap()
}

fn op(n: u128) -> OperationId {
    OperationId::from_uuid(uuid::Uuid::from_u128(n))
}

fn record(subjects: &Subjects, operation: OperationId, email: &str) -> ArgsSnapshot {
    let args = ArgsSnapshot::new(serde_json::json!({"email": email, "title": "call"})).unwrap();
    let personal = Personal {
        subject: email.into(),
        fields: PersonalFields::Declared(vec!["/email".into()]),
    };
    let sealed = seal_args(
        subjects,
        &TenantId::new("acme").unwrap(),
        operation,
        &personal,
        &args,
    )
    .unwrap()
    .args;
    // What the ledger awaits before it appends.
    subjects.flush().unwrap();
    sealed
}

#[test]
fn an_erased_subjects_values_never_open_again_and_the_key_file_keeps_no_trace_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db.keys");
    let subjects = Subjects::open(Some(&path), kek(1)).unwrap();
    let email = "quiet-otter-lamp@example.com";
    let stored = record(&subjects, op(1), email);
    assert!(!stored.canonical_json().contains(email));
    let opened = open_args(Some(&subjects), op(1), &stored).unwrap();
    assert_eq!(opened.as_map()["email"], email);
    let listed = subjects.list().unwrap();
    assert_eq!(listed[0].subject.as_deref(), Some(email));
    assert_eq!(listed[0].operations, vec![op(1)]);

    let erased = subjects.erase(email, None, "operator:dpo").unwrap();
    assert_eq!(erased[0].operations, vec![op(1)]);
    assert_eq!(erased[0].already_erased_at, None);
    let after = open_args(Some(&subjects), op(1), &stored).unwrap();
    assert_eq!(after.as_map()["email"], "[erased]");
    // Twice: answered with the first erasure, nothing changed.
    assert!(subjects.erase(email, None, "operator:dpo").unwrap()[0]
        .already_erased_at
        .is_some());
    // A new record under the erased name is refused, not given a fresh key.
    let again = seal_args(
        &subjects,
        &TenantId::new("acme").unwrap(),
        op(2),
        &Personal {
            subject: email.into(),
            fields: PersonalFields::All,
        },
        &ArgsSnapshot::new(serde_json::json!({"a": 1})).unwrap(),
    );
    assert_eq!(again.unwrap_err(), PersonalDataError::Erased);
    assert_eq!(subjects.list().unwrap()[0].subject, None);
    drop(subjects);
    for file in std::fs::read_dir(dir.path()).unwrap() {
        let bytes = std::fs::read(file.unwrap().path()).unwrap();
        assert!(!bytes.windows(email.len()).any(|w| w == email.as_bytes()));
    }
}

#[test]
fn an_unknown_subject_is_refused_and_a_wrong_kek_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    let subjects = Subjects::open(Some(&path), kek(1)).unwrap();
    assert!(matches!(
        subjects.erase("nobody", None, "op"),
        Err(SubjectsError::Unknown { .. })
    ));
    record(&subjects, op(1), "a@example.com");
    drop(subjects);
    let refused = Subjects::open(Some(&path), kek(2)).unwrap_err().to_string();
    assert!(
        refused.contains(&kek(2).id()) && refused.contains(&kek(1).id()),
        "{refused}"
    );
    assert!(refused.contains("rotate-kek"), "{refused}");
}

#[test]
fn a_rotated_kek_opens_every_value_and_the_old_one_no_longer_opens_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    let subjects = Subjects::open(Some(&path), kek(1)).unwrap();
    let stored = record(&subjects, op(1), "b@example.com");
    assert_eq!(subjects.rotate_kek(kek(3)).unwrap(), 1);
    drop(subjects);
    assert!(Subjects::open(Some(&path), kek(1)).is_err());
    let rotated = Subjects::open(Some(&path), kek(3)).unwrap();
    let opened = open_args(Some(&rotated), op(1), &stored).unwrap();
    assert_eq!(opened.as_map()["email"], "b@example.com");
}

#[test]
fn an_erasure_by_another_process_is_seen_by_a_running_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    let mut server = Subjects::open(Some(&path), kek(1)).unwrap();
    // Asked at every use, so the test needs no clock.
    server.others_every = std::time::Duration::ZERO;
    let stored = record(&server, op(1), "c@example.com");
    assert!(!opledger_domain::personal::is_erased(
        open_args(Some(&server), op(1), &stored).unwrap().as_map()
    ));
    let command_line = Subjects::open(Some(&path), kek(1)).unwrap();
    command_line
        .erase("c@example.com", Some("acme"), "op")
        .unwrap();
    let after = open_args(Some(&server), op(1), &stored).unwrap();
    assert_eq!(
        after.as_map()["email"],
        "[erased]",
        "the server's cached key was dropped"
    );
}

/// A key table that counts what is asked of it, can be made to fail its writes, and can run
/// something right after a read returned (to put an erasure between a read and its use) or
/// right before a key is destroyed (to put a read between an erasure's start and its end).
struct Watched {
    inner: Box<dyn KeyTable>,
    log: Arc<Mutex<Log>>,
}

#[derive(Default)]
struct Log {
    reads: usize,
    commits: usize,
    fail_writes: bool,
    after_read: Option<Box<dyn FnOnce() + Send>>,
    before_destroy: Option<Box<dyn FnOnce() + Send>>,
}

impl Watched {
    fn read<T>(&mut self, read: impl FnOnce(&mut dyn KeyTable) -> T) -> T {
        let value = read(&mut *self.inner);
        let hook = {
            let mut log = self.log.lock().unwrap();
            log.reads += 1;
            log.after_read.take()
        };
        if let Some(hook) = hook {
            hook();
        }
        value
    }
}

impl KeyTable for Watched {
    fn meta(&mut self, name: &str) -> Result<Option<Vec<u8>>, SubjectsError> {
        self.inner.meta(name)
    }
    fn set_meta(&mut self, values: &[(&str, Vec<u8>)]) -> Result<(), SubjectsError> {
        self.inner.set_meta(values)
    }
    fn row_by_tag(&mut self, tag: &[u8]) -> Result<Option<Row>, SubjectsError> {
        self.read(|table| table.row_by_tag(tag))
    }
    fn row_by_key(&mut self, key_id: &str) -> Result<Option<Row>, SubjectsError> {
        self.read(|table| table.row_by_key(key_id))
    }
    fn rows(&mut self) -> Result<Vec<Row>, SubjectsError> {
        self.inner.rows()
    }
    fn operations_of(&mut self, key_id: &str) -> Result<Vec<String>, SubjectsError> {
        self.inner.operations_of(key_id)
    }
    fn write(&mut self, writes: &[Write]) -> Result<Vec<String>, SubjectsError> {
        let mut log = self.log.lock().unwrap();
        if log.fail_writes {
            return Err(SubjectsError::table("write", "the disk is full"));
        }
        log.commits += 1;
        drop(log);
        self.inner.write(writes)
    }
    fn destroy(&mut self, key_id: &str, at: &str, by: &str) -> Result<i64, SubjectsError> {
        let hook = self.log.lock().unwrap().before_destroy.take();
        if let Some(hook) = hook {
            hook();
        }
        self.inner.destroy(key_id, at, by)
    }
    fn rewrap(
        &mut self,
        keys: &[(String, Vec<u8>)],
        meta: &[(&str, Vec<u8>)],
    ) -> Result<i64, SubjectsError> {
        self.inner.rewrap(keys, meta)
    }
    fn generation(&mut self) -> Result<i64, SubjectsError> {
        self.inner.generation()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

fn watched_in_memory() -> (Subjects, Arc<Mutex<Log>>) {
    let log = Arc::new(Mutex::new(Log::default()));
    let table = Watched {
        inner: Box::new(store::SqliteTable::open(None).unwrap()),
        log: Arc::clone(&log),
    };
    (
        Subjects::with_tables(Box::new(table), None, kek(1)).unwrap(),
        log,
    )
}

fn seal_for(subjects: &Subjects, operation: OperationId, subject: &str) -> ArgsSnapshot {
    seal_args(
        subjects,
        &TenantId::new("acme").unwrap(),
        operation,
        &Personal {
            subject: subject.into(),
            fields: PersonalFields::All,
        },
        &ArgsSnapshot::new(serde_json::json!({"email": subject, "title": "call"})).unwrap(),
    )
    .unwrap()
    .args
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(future)
}

#[test]
fn new_keys_and_links_of_many_seals_share_one_commit_and_a_known_subject_reads_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    let log = Arc::new(Mutex::new(Log::default()));
    let watched = || -> Box<dyn KeyTable> {
        Box::new(Watched {
            inner: Box::new(store::SqliteTable::open(Some(&path)).unwrap()),
            log: Arc::clone(&log),
        })
    };
    let subjects = Subjects::with_tables(watched(), Some(watched()), kek(1)).unwrap();
    // The writer thread may take the first seals on its own; holding the table keeps them
    // queued, as they are while a commit is running.
    let held = lock(subjects.writer.table());
    let mut stored = Vec::new();
    for n in 0..50 {
        stored.push(seal_for(
            &subjects,
            op(n),
            &format!("person{n}@example.com"),
        ));
    }
    assert_eq!(
        log.lock().unwrap().commits,
        0,
        "a seal never waits for a commit"
    );
    drop(held);
    subjects.flush().unwrap();
    assert!(
        log.lock().unwrap().commits <= 1,
        "fifty new keys and their links in one commit"
    );
    let reads = log.lock().unwrap().reads;
    for n in 0..50 {
        seal_for(&subjects, op(100 + n), &format!("person{n}@example.com"));
        let opened = open_args(Some(&subjects), op(n), &stored[n as usize]).unwrap();
        assert_eq!(opened.as_map()["email"], format!("person{n}@example.com"));
    }
    assert_eq!(
        log.lock().unwrap().reads,
        reads,
        "known subjects' keys come from memory"
    );
    subjects.flush().unwrap();
    let seventh = subjects
        .list()
        .unwrap()
        .into_iter()
        .find(|summary| summary.subject.as_deref() == Some("person7@example.com"))
        .unwrap();
    assert_eq!(seventh.operations, vec![op(7), op(107)]);
}

#[test]
fn a_value_sealed_under_a_key_whose_write_failed_is_never_reported_durable() {
    let (subjects, log) = watched_in_memory();
    let tenant = TenantId::new("acme").unwrap();
    log.lock().unwrap().fail_writes = true;
    let first = seal_for(&subjects, op(1), "dana@example.com");
    let token = opledger_domain::personal::first_token_in(&first);
    let refused = block_on(subjects.key_durable(&tenant, "dana@example.com", token.as_deref()));
    // Refused: because the write failed, or because a later seal of the same record already
    // made the subject a new key (then the values' key is not the stored one).
    assert!(
        matches!(
            refused,
            Err(PersonalDataError::KeyStore(_) | PersonalDataError::KeyReplaced)
        ),
        "{refused:?}"
    );
    assert!(block_on(subjects.all_durable()).is_err());

    log.lock().unwrap().fail_writes = false;
    let second = seal_for(&subjects, op(2), "dana@example.com");
    let token2 = opledger_domain::personal::first_token_in(&second);
    assert_ne!(
        token.as_deref().and_then(token_parts).map(|t| t.0),
        token2.as_deref().and_then(token_parts).map(|t| t.0),
        "a new key, not the one never stored"
    );
    block_on(subjects.key_durable(&tenant, "dana@example.com", token2.as_deref())).unwrap();
    assert!(
        block_on(subjects.key_durable(&tenant, "dana@example.com", token.as_deref())).is_err(),
        "the first values' key is still not the stored one"
    );
    assert!(!opledger_domain::personal::is_erased(
        open_args(Some(&subjects), op(2), &second).unwrap().as_map()
    ));
}

/// Which of a reopened key store's two tables a test watches.
enum WatchedTable {
    Reader,
    Writer,
}

/// A key store at `path` holding eve's key, and what one operation's values about her were
/// sealed as; then the store opened again as a fresh process would (nothing in memory), with
/// its `watched` table logged, and that log.
fn eves_key_reopened_watching(
    path: &std::path::Path,
    watched: WatchedTable,
) -> (ArgsSnapshot, Arc<Subjects>, Arc<Mutex<Log>>) {
    let stored = {
        let subjects = Subjects::open(Some(path), kek(1)).unwrap();
        record(&subjects, op(1), "eve@example.com")
    };
    let log = Arc::new(Mutex::new(Log::default()));
    let table = || -> Box<dyn KeyTable> { Box::new(store::SqliteTable::open(Some(path)).unwrap()) };
    let watch: Box<dyn KeyTable> = Box::new(Watched {
        inner: table(),
        log: Arc::clone(&log),
    });
    let (writer, reader) = match watched {
        WatchedTable::Reader => (table(), watch),
        WatchedTable::Writer => (watch, table()),
    };
    let subjects = Arc::new(Subjects::with_tables(writer, Some(reader), kek(1)).unwrap());
    (stored, subjects, log)
}

#[test]
fn an_erasure_between_a_key_read_and_its_use_leaves_the_key_unused() {
    let dir = tempfile::tempdir().unwrap();
    // Opening reads the key from the table, and the erasure runs right after that read
    // returned the live key.
    let (stored, subjects, log) =
        eves_key_reopened_watching(&dir.path().join("keys"), WatchedTable::Reader);
    let eraser = Arc::downgrade(&subjects);
    log.lock().unwrap().after_read = Some(Box::new(move || {
        let subjects = eraser.upgrade().unwrap();
        std::thread::spawn(move || subjects.erase("eve@example.com", None, "op").unwrap())
            .join()
            .unwrap();
    }));
    let opened = open_args(Some(&*subjects), op(1), &stored).unwrap();
    assert_eq!(opened.as_map()["email"], "[erased]", "{opened:?}");
    assert!(log.lock().unwrap().after_read.is_none(), "the erasure ran");
}

#[test]
fn a_key_read_while_an_erasure_runs_is_not_used_after_it() {
    let dir = tempfile::tempdir().unwrap();
    // The erasure, after it forgot the key and before the table destroys it, lets an opening
    // read the key, still live, from the table.
    let (stored, subjects, log) =
        eves_key_reopened_watching(&dir.path().join("keys"), WatchedTable::Writer);
    let reader = Arc::downgrade(&subjects);
    let during = stored.clone();
    let opened_during = Arc::new(Mutex::new(None));
    let seen = Arc::clone(&opened_during);
    log.lock().unwrap().before_destroy = Some(Box::new(move || {
        let subjects = reader.upgrade().unwrap();
        let opened = std::thread::spawn(move || open_args(Some(&*subjects), op(1), &during))
            .join()
            .unwrap();
        *seen.lock().unwrap() = opened;
    }));
    subjects.erase("eve@example.com", None, "op").unwrap();
    assert!(
        opened_during.lock().unwrap().is_some(),
        "the opening ran while the erasure did"
    );
    let after = open_args(Some(&*subjects), op(1), &stored).unwrap();
    assert_eq!(after.as_map()["email"], "[erased]", "{after:?}");
}

fn key_write(key_id: &str, tag: u8) -> Write {
    Write::Key {
        key_id: key_id.into(),
        tag: vec![tag],
        tenant: "acme".into(),
        wrapped_key: vec![1],
        sealed_name: vec![2],
        at: "2026-01-01T00:00:00.000Z".into(),
    }
}

fn link_write(key_id: &str, operation: u128, at: &str) -> Write {
    Write::Link {
        key_id: key_id.into(),
        operation_id: op(operation).to_string(),
        at: at.into(),
    }
}

fn runs_in(path: &std::path::Path) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("SELECT count(*) FROM subject_link_runs", [], |row| {
            row.get(0)
        })
        .unwrap()
}

#[test]
fn links_kept_as_one_run_per_commit_are_folded_before_they_are_read_and_when_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db.keys");
    let first = "0000000000000000000000000000000a";
    let second = "0000000000000000000000000000000b";
    let mut table = store::SqliteTable::open(Some(&path)).unwrap();
    table
        .write(&[key_write(first, 1), key_write(second, 2)])
        .unwrap();
    table
        .write(&[
            link_write(first, 3, "2026-01-02T00:00:00.000Z"),
            link_write(second, 1, "2026-01-02T00:00:00.000Z"),
            link_write(first, 1, "2026-01-02T00:00:00.000Z"),
        ])
        .unwrap();
    // A link written twice, and one to a key this table does not hold (another process made
    // that subject's key first).
    table
        .write(&[
            link_write(first, 3, "2026-01-03T00:00:00.000Z"),
            link_write(
                "0000000000000000000000000000000c",
                9,
                "2026-01-03T00:00:00.000Z",
            ),
        ])
        .unwrap();
    assert_eq!(runs_in(&path), 2, "one row per commit of links");

    let operations = table.operations_of(first).unwrap();
    assert_eq!(operations, vec![op(1).to_string(), op(3).to_string()]);
    assert_eq!(
        table.operations_of(second).unwrap(),
        vec![op(1).to_string()]
    );
    assert_eq!(runs_in(&path), 0, "folded when read");
    let rows = table.rows().unwrap();
    assert_eq!(rows[0].last_recorded_at, "2026-01-03T00:00:00.000Z");
    assert_eq!(rows[1].last_recorded_at, "2026-01-02T00:00:00.000Z");

    // Links a process left in runs when it stopped are folded when the file is opened again.
    table
        .write(&[link_write(second, 7, "2026-01-04T00:00:00.000Z")])
        .unwrap();
    drop(table);
    assert_eq!(runs_in(&path), 1);
    let mut reopened = store::SqliteTable::open(Some(&path)).unwrap();
    assert_eq!(runs_in(&path), 0);
    assert_eq!(
        reopened.operations_of(second).unwrap(),
        vec![op(1).to_string(), op(7).to_string()]
    );
}

#[test]
fn the_writer_folds_its_runs_once_enough_links_wait() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db.keys");
    let key = "0000000000000000000000000000000a";
    let mut table = store::SqliteTable::open(Some(&path)).unwrap();
    table.write(&[key_write(key, 1)]).unwrap();
    let per_commit = 4_096;
    let commits = store::FOLD_AFTER_LINKS / per_commit;
    for commit in 0..commits {
        let links: Vec<Write> = (0..per_commit)
            .map(|n| {
                let operation = (commit * per_commit + n) as u128;
                link_write(key, operation, "2026-01-02T00:00:00.000Z")
            })
            .collect();
        table.write(&links).unwrap();
        let expected = if commit + 1 == commits {
            0
        } else {
            commit as i64 + 1
        };
        assert_eq!(runs_in(&path), expected, "after commit {commit}");
    }
    assert_eq!(
        table.operations_of(key).unwrap().len(),
        store::FOLD_AFTER_LINKS
    );
}

#[test]
fn a_link_that_is_not_two_uuids_is_refused_and_nothing_of_its_commit_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db.keys");
    let mut table = store::SqliteTable::open(Some(&path)).unwrap();
    let refused = table.write(&[
        key_write("0000000000000000000000000000000a", 1),
        Write::Link {
            key_id: "not-a-key".into(),
            operation_id: op(1).to_string(),
            at: "2026-01-02T00:00:00.000Z".into(),
        },
    ]);
    assert!(matches!(refused, Err(SubjectsError::Corrupt { .. })));
    assert!(table.rows().unwrap().is_empty());
}
