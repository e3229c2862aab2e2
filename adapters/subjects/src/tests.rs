use super::*;
use opledger_domain::personal::{open_args, seal_args, Personal, PersonalFields};

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
    seal_args(
        subjects,
        &TenantId::new("acme").unwrap(),
        operation,
        &personal,
        &args,
    )
    .unwrap()
    .args
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
    let server = Subjects::open(Some(&path), kek(1)).unwrap();
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
