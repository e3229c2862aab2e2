//! Numbers in arguments, property-tested from JSON *text*: whatever a caller writes is either
//! refused with a clear reason, or recorded as the very number written, and then the snapshot,
//! its hash, the stored event read back, the fold and the body that is sent all agree exactly.
//! (See `opledger_domain::args`, "Numbers".)

use std::collections::BTreeMap;

use chrono::{TimeZone, Utc};
use opledger_domain::args::{ArgsHash, ArgsSnapshot};
use opledger_domain::codec;
use opledger_domain::event::{IntentRecorded, OperationEvent};
use opledger_domain::ids::{
    AccountId, ActionName, CredentialFingerprint, GlobalPosition, IdempotencyKey, OperationId,
    ProviderId, StreamVersion, TenantId,
};
use opledger_domain::state::fold;
use opledger_domain::store::{RecordedEvent, StreamName};
use proptest::prelude::*;
use serde_json::Value;

/// Numbers that have broken JSON implementations: the issue's float, the ends of the double
/// range, subnormals, the edges of 2^53 and of 64 bits, zeros, and spellings of one value.
const ADVERSARIAL: &[&str] = &[
    "3.402823466e+38",
    "3.4028234659999998e+38",
    "1.7976931348623157e308",
    "-1.7976931348623157E+308",
    "1.7976931348623158e308",
    "2.2250738585072014e-308",
    "2.225073858507201e-308",
    "5e-324",
    "4.9e-324",
    "2.4703282292062328e-324",
    "1e-400",
    "1e400",
    "9007199254740992",
    "9007199254740993",
    "-9007199254740993",
    "9007199254740993.0",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "-9223372036854775809",
    "123456789012345678901234567890",
    "0.1000000000000000000001",
    "12345678901234567.89",
    "0",
    "-0",
    "0.0",
    "-0.0",
    "0e0",
    "-0E-0",
    "1",
    "1.0",
    "1.00",
    "1e5",
    "1E+5",
    "1e+05",
    "100000",
    "100000.0",
    "0.1",
    "0.30000000000000004",
];

/// A JSON value as generated: numbers are kept as the text that will be written.
#[derive(Clone, Debug)]
enum Json {
    Number(String),
    Text(String),
    Bool(bool),
    Null,
    Array(Vec<Json>),
    Object(BTreeMap<String, Json>),
}

fn number_text() -> impl Strategy<Value = String> {
    let written_double = (any::<f64>(), 0..4_u8)
        .prop_filter("JSON has no infinities or NaN", |(x, _)| x.is_finite())
        .prop_map(|(x, style)| match style {
            0 => format!("{x:?}"),
            1 => format!("{x:e}"),
            2 => format!("{x:E}"),
            // Display writes every digit and no exponent: 1e300 becomes a 301-digit integer.
            _ => format!("{x}"),
        });
    let decimal = (
        any::<bool>(),
        "[0-9]{1,22}",
        proptest::option::of("[0-9]{1,22}"),
        proptest::option::of(("[eE]", "[+-]?", 0..420_u32)),
    )
        .prop_map(|(negative, integer, fraction, exponent)| {
            let integer = integer.trim_start_matches('0');
            let mut text = String::from(if negative { "-" } else { "" });
            text.push_str(if integer.is_empty() { "0" } else { integer });
            if let Some(fraction) = fraction {
                text.push('.');
                text.push_str(&fraction);
            }
            if let Some((e, sign, power)) = exponent {
                text.push_str(&format!("{e}{sign}{power}"));
            }
            text
        });
    prop_oneof![
        3 => proptest::sample::select(ADVERSARIAL).prop_map(str::to_owned),
        2 => written_double,
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        2 => decimal,
    ]
}

fn json() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        6 => number_text().prop_map(Json::Number),
        1 => "[a-z0-9 .eE+-]{0,8}".prop_map(Json::Text),
        1 => any::<bool>().prop_map(Json::Bool),
        1 => Just(Json::Null),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Json::Array),
            proptest::collection::btree_map("[a-z0-9]{1,4}", inner, 0..6).prop_map(Json::Object),
        ]
    })
}

fn arguments() -> impl Strategy<Value = BTreeMap<String, Json>> {
    proptest::collection::btree_map("[a-z0-9]{1,4}", json(), 1..8)
}

fn write(value: &Json, out: &mut String) {
    match value {
        Json::Number(text) => out.push_str(text),
        Json::Text(text) => out.push_str(&Value::String(text.clone()).to_string()),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Null => out.push_str("null"),
        Json::Array(items) => {
            out.push_str("[ ");
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push_str(" ,\n");
                }
                write(item, out);
            }
            out.push(']');
        }
        Json::Object(map) => write_object(map, out),
    }
}

fn write_object(map: &BTreeMap<String, Json>, out: &mut String) {
    // Reverse order and loose whitespace: nothing about the spelling of the document may matter.
    out.push('{');
    for (index, (key, value)) in map.iter().rev().enumerate() {
        if index > 0 {
            out.push_str(", ");
        }
        out.push_str(&format!("\"{key}\" :\t"));
        write(value, out);
    }
    out.push('}');
}

/// Checks, independently of serde_json, that each number was read as the number written: a
/// fraction or exponent as the correctly rounded double (Rust's parser), an integer exactly.
#[track_caller]
fn assert_read_as_written(written: &Json, read: &Value) {
    match (written, read) {
        (Json::Number(text), Value::Number(number)) => {
            if text.contains(['.', 'e', 'E']) || text == "-0" {
                let expected: f64 = text.parse().expect("a JSON number is a Rust float");
                let got = number.as_f64().filter(|_| number.is_f64());
                assert_eq!(
                    got.map(f64::to_bits),
                    Some(expected.to_bits()),
                    "{text} read as {number}"
                );
            } else {
                let expected: i128 = text.parse().expect("a recorded integer fits in i128");
                let got = number
                    .as_i64()
                    .map(i128::from)
                    .or(number.as_u64().map(i128::from));
                assert_eq!(got, Some(expected), "{text} read as {number}");
            }
        }
        (Json::Array(items), Value::Array(values)) => {
            assert_eq!(items.len(), values.len());
            for (item, value) in items.iter().zip(values) {
                assert_read_as_written(item, value);
            }
        }
        (Json::Object(map), Value::Object(values)) => {
            assert_eq!(map.len(), values.len());
            for (key, item) in map {
                assert_read_as_written(item, &values[key]);
            }
        }
        (Json::Text(_), Value::String(_)) | (Json::Bool(_), Value::Bool(_)) => {}
        (Json::Null, Value::Null) => {}
        (written, read) => panic!("{written:?} read as {read}"),
    }
}

fn intent(args: ArgsSnapshot) -> IntentRecorded {
    IntentRecorded {
        operation_id: OperationId::from_uuid(uuid::Uuid::from_u128(12)),
        tenant: TenantId::new("acme").expect("valid"),
        owner: None,
        provider: ProviderId::new("crm").expect("valid"),
        account: AccountId::new("acct-1").expect("valid"),
        credential_fingerprint: CredentialFingerprint::new("fp-1").expect("valid"),
        action: ActionName::new("create_task").expect("valid"),
        args_hash: args.hash(),
        args,
        idempotency_key: IdempotencyKey::new("opk_numbers").expect("valid"),
        source_id: None,
        requires_approval: false,
        executor: Default::default(),
        at: Utc
            .with_ymd_and_hms(2026, 11, 30, 9, 0, 0)
            .single()
            .expect("a valid date"),
    }
}

/// The stored event read back: encoded, its bytes taken as a store returns them, decoded.
fn stored_and_read_back(intent: &IntentRecorded) -> IntentRecorded {
    let event = OperationEvent::IntentRecorded(intent.clone());
    let (data, _) = codec::encode(intent.operation_id, StreamVersion::FIRST, &event, None);
    // The stores keep the data as JSON text; read it back through text, as they do.
    let text = String::from_utf8(data.data).expect("event data is UTF-8 JSON");
    let recorded = RecordedEvent {
        stream: StreamName::for_operation(intent.operation_id),
        version: StreamVersion::FIRST,
        position: GlobalPosition::new(0),
        event_id: data.event_id,
        event_type: data.event_type,
        data: text.into_bytes(),
        metadata: data.metadata,
    };
    match codec::decode(&recorded).expect("an event this build wrote decodes") {
        OperationEvent::IntentRecorded(read) => read,
        other => panic!("decoded {other:?}"),
    }
}

/// Everything after the record agrees with the record.
#[track_caller]
fn assert_everything_agrees(args: &ArgsSnapshot) {
    let hash = args.hash();
    let canonical = args.canonical_json();

    let reparsed = ArgsSnapshot::parse(&canonical).expect("the canonical form is accepted");
    assert_eq!(
        reparsed.canonical_json(),
        canonical,
        "canonical form re-read"
    );
    assert_eq!(reparsed.hash(), hash);

    let recorded = intent(args.clone());
    let read = stored_and_read_back(&recorded);
    assert_eq!(
        read.args.canonical_json(),
        canonical,
        "stored event read back"
    );
    assert_eq!(read.args.hash(), hash);
    assert_eq!(read.args_hash, hash);
    assert_eq!(read.args, *args);

    let folded = fold([&OperationEvent::IntentRecorded(read)]);
    let folded = folded.intent.expect("the fold holds the intent");
    assert_eq!(
        folded.args.hash(),
        folded.args_hash,
        "fold: the hash still fits"
    );

    // What a provider adapter sends: the map serialised by serde_json, read by the provider.
    let sent = serde_json::to_vec(&Value::Object(folded.args.as_map().clone())).expect("JSON");
    let received: Value = serde_json::from_slice(&sent).expect("the sent body is JSON");
    let received = ArgsSnapshot::new(received).expect("the sent body is an object");
    assert_eq!(
        received.hash(),
        hash,
        "what is sent hashes to the recorded hash"
    );
    let hash_text = ArgsHash::parse(hash.as_str()).expect("well formed");
    assert_eq!(hash_text, hash);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn written_arguments_are_refused_or_recorded_as_written_and_agree_everywhere(
        written in arguments(),
    ) {
        let mut text = String::new();
        write_object(&written, &mut text);
        match ArgsSnapshot::parse(&text) {
            Ok(args) => {
                assert_read_as_written(&Json::Object(written), &Value::Object(args.as_map().clone()));
                assert_everything_agrees(&args);
            }
            Err(error) => {
                prop_assert!(error.field.starts_with("args"), "{error}");
                prop_assert!(
                    error.message.contains("as a string") || error.message.contains("not valid JSON"),
                    "a refusal says what to send: {error}"
                );
            }
        }
    }

    #[test]
    fn every_double_written_the_shortest_way_and_every_64_bit_integer_is_accepted_exactly(
        x in any::<f64>().prop_filter("finite", |x| x.is_finite()),
        signed in any::<i64>(),
        unsigned in any::<u64>(),
    ) {
        for spelling in [format!("{x:?}"), format!("{x:e}"), format!("{x:E}")] {
            let text = format!(r#"{{"x": {spelling}}}"#);
            let args = ArgsSnapshot::parse(&text)
                .unwrap_or_else(|error| panic!("{spelling} refused: {error}"));
            let read = args.as_map()["x"].as_f64().expect("a double");
            prop_assert_eq!(read.to_bits(), x.to_bits(), "{}", spelling);
            assert_everything_agrees(&args);
        }
        let text = format!(r#"{{"i": {signed}, "u": {unsigned}}}"#);
        let args = ArgsSnapshot::parse(&text).expect("64-bit integers are accepted");
        prop_assert_eq!(args.as_map()["i"].as_i64(), Some(signed));
        prop_assert_eq!(args.as_map()["u"].as_u64(), Some(unsigned));
        assert_everything_agrees(&args);
    }
}

#[test]
fn the_issues_float_is_recorded_stored_and_sent_as_written() {
    let args = ArgsSnapshot::parse(r#"{"x": 3.402823466e+38}"#).expect("accepted");
    assert_eq!(args.canonical_json(), r#"{"x":3.402823466e+38}"#);
    assert_everything_agrees(&args);
}
