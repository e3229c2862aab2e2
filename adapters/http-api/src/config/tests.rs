//! The configuration's checks, each refusal with its file, line, field and advice.

use std::collections::BTreeSet;

use opledger_domain::ids::TenantId;

use super::*;

const TOKEN: &str = "0123456789abcdef0123";

fn env(name: &str) -> Option<String> {
    match name {
        "ACME_TOKEN" => Some(TOKEN.into()),
        "OPS_TOKEN" => Some("ops-0123456789abcdef".into()),
        "CRM_TOKEN" => Some("crm-secret".into()),
        _ => None,
    }
}

fn check(text: &str) -> Result<ServeConfig, ConfigError> {
    parse("serve.toml", text, &env)
}

const GOOD: &str = r#"
listen = "127.0.0.1:9090"
store = "sqlite:///tmp/ledger.db"

[engine]
lease_ms = 20000
workers = 8

[[tenants]]
id = "acme"
token_env = "ACME_TOKEN"

[[operators]]
id = "oncall"
token_env = "OPS_TOKEN"
tenants = ["acme"]

[[connectors]]
id = "crm"
preset = "crm-stand-keyed"
base_url = "http://127.0.0.1:8787"

[[connectors.accounts]]
id = "acct-1"
tenants = ["acme"]
token_env = "CRM_TOKEN"
"#;

#[test]
fn connection_limits_out_of_range_are_refused_at_their_line_with_what_to_do() {
    let cases = [
        ("max_connections = 0", "limits.max_connections", "use 1 to"),
        (
            "max_connections = 10\nmax_connections_per_address = 20",
            "limits.max_connections_per_address",
            "use 1 to 10 (at most max_connections",
        ),
        (
            "max_connections_per_address = 5000",
            "limits.max_connections_per_address",
            "use 1 to 4096",
        ),
        (
            "header_read_timeout_ms = 50",
            "limits.header_read_timeout_ms",
            "use 100 to",
        ),
        (
            "header_read_timeout_ms = 1000\nidle_timeout_ms = 500",
            "limits.idle_timeout_ms",
            "use 1000 to 3600000 (no shorter than header_read_timeout_ms)",
        ),
    ];
    for (section, field, says) in cases {
        let text = format!("{GOOD}\n[limits]\n{section}\n");
        let error = check(&text).expect_err(section);
        let wrong_line = section.lines().last().expect("a line");
        let line = text
            .lines()
            .position(|l| l == wrong_line)
            .expect("in the text")
            + 1;
        assert_eq!(error.field, field, "{section}: {error}");
        assert_eq!(error.line, Some(line), "{section}: {error}");
        assert!(error.message.contains(says), "{section}: {error}");
    }
    let text = format!(
        "{GOOD}\n[limits]\nheader_read_timeout_ms = 300\nidle_timeout_ms = 1000\nmax_connections = 20\nmax_connections_per_address = 5\n"
    );
    let limits = check(&text).expect("valid").limits;
    assert_eq!(
        (
            limits.header_read_timeout_ms,
            limits.idle_timeout_ms,
            limits.max_connections,
            limits.max_connections_per_address
        ),
        (300, 1_000, 20, 5)
    );
}

#[test]
fn a_complete_file_is_read_with_its_tokens_and_providers() {
    let config = check(GOOD).expect("valid");
    assert_eq!(config.listen.port(), 9090);
    assert_eq!(
        config.store,
        StoreUrl::Sqlite(PathBuf::from("/tmp/ledger.db"))
    );
    assert_eq!(config.policy.lease_ms, 20_000);
    assert_eq!(config.workers, 8);
    assert_eq!(
        config.tokens.get(TOKEN),
        Some(&Principal::Tenant(TenantId::new("acme").expect("id")))
    );
    assert!(matches!(
        config.tokens.get("ops-0123456789abcdef"),
        Some(Principal::Operator { tenants: Some(t), .. }) if t.len() == 1
    ));
    assert_eq!(config.providers.len(), 1);
}

#[test]
fn errors_name_the_field_and_the_line() {
    let cases: [(&str, &str, &str, usize); 8] = [
        ("workers = 8", "workers = 0", "engine.workers", 7),
        (
            "token_env = \"ACME_TOKEN\"",
            "token_env = \"MISSING\"",
            "tenants[0].token_env",
            11,
        ),
        (
            "preset = \"crm-stand-keyed\"",
            "preset = \"soap\"",
            "connectors[0].preset",
            20,
        ),
        (
            "tenants = [\"acme\"]\ntoken_env = \"CRM_TOKEN\"",
            "tenants = [\"globex\"]\ntoken_env = \"CRM_TOKEN\"",
            "connectors[0].accounts[0].tenants[0]",
            25,
        ),
        (
            "token_env = \"CRM_TOKEN\"",
            "token_env = \"NO_SUCH_VARIABLE\"",
            "connectors[0].accounts[0].token_env",
            26,
        ),
        (
            "tenants = [\"acme\"]",
            "tenants = [\"other\"]",
            "operators[0].tenants[0]",
            16,
        ),
        (
            "listen = \"127.0.0.1:9090\"",
            "listen = \"localhost\"",
            "listen",
            2,
        ),
        (
            "store = \"sqlite:///tmp/ledger.db\"",
            "store = \"postgres://x\"",
            "store",
            3,
        ),
    ];
    for (from, to, field, line) in cases {
        let text = GOOD.replace(from, to);
        let error = check(&text).expect_err(to);
        assert_eq!(error.field, field, "{to}: {error}");
        assert_eq!(error.line, Some(line), "{to}: {error}");
        assert!(error
            .to_string()
            .starts_with(&format!("serve.toml:{line}: ")));
    }
}

#[test]
fn every_engine_value_the_engine_would_refuse_is_refused_at_start_with_its_line() {
    use opledger_domain::command::{MAX_LEASE_MS, MIN_LEASE_MS};
    use opledger_domain::contract::{MAX_ATTEMPTS_LIMIT, MAX_RECONCILIATIONS_LIMIT, MAX_TOTAL_MS};
    use opledger_domain::engine::MAX_BACKOFF_MS;
    // The default lease line is taken out, so `workers = 8` is line 6 and each key line 8.
    let cases = [
        ("lease_ms", "lease_ms = 900000".to_owned()),
        ("lease_ms", format!("lease_ms = {}", MAX_LEASE_MS + 1)),
        ("lease_ms", format!("lease_ms = {}", MIN_LEASE_MS - 1)),
        ("max_attempts", "max_attempts = 0".to_owned()),
        (
            "max_attempts",
            format!("max_attempts = {}", MAX_ATTEMPTS_LIMIT + 1),
        ),
        ("max_total_ms", "max_total_ms = 0".to_owned()),
        (
            "max_total_ms",
            format!("max_total_ms = {}", MAX_TOTAL_MS + 1),
        ),
        ("max_reconciliations", "max_reconciliations = 0".to_owned()),
        (
            "max_reconciliations",
            format!("max_reconciliations = {}", MAX_RECONCILIATIONS_LIMIT + 1),
        ),
        ("backoff_base_ms", "backoff_base_ms = 0".to_owned()),
        (
            "backoff_max_ms",
            format!("backoff_max_ms = {}", MAX_BACKOFF_MS + 1),
        ),
    ];
    for (field, line) in cases {
        let text = GOOD
            .replace("lease_ms = 20000\n", "")
            .replace("workers = 8", &format!("workers = 8\n\n{line}"));
        let error = check(&text).expect_err(&line);
        assert_eq!(error.field, format!("engine.{field}"), "{line}: {error}");
        assert_eq!(error.line, Some(8), "{line}: {error}");
        assert!(error.to_string().starts_with("serve.toml:8: "), "{error}");
    }
    // The largest lease the engine takes is taken: the file and the engine agree on the edge.
    let text = GOOD.replace("lease_ms = 20000", &format!("lease_ms = {MAX_LEASE_MS}"));
    assert_eq!(check(&text).expect("valid").policy.lease_ms, MAX_LEASE_MS);
}

#[test]
fn a_connector_account_without_tenants_or_credentials_is_refused_at_its_line() {
    let no_tenants = GOOD.replace("tenants = [\"acme\"]\ntoken_env", "token_env");
    let error = check(&no_tenants).expect_err("no tenants");
    assert_eq!(error.field, "connectors[0].accounts[0].tenants");
    assert_eq!(error.line, Some(24), "{error}");
    let no_credentials = GOOD.replace("token_env = \"CRM_TOKEN\"\n", "");
    let error = check(&no_credentials).expect_err("no credentials");
    assert_eq!(error.field, "connectors[0].accounts[0]");
    assert!(error.message.contains("token_env"), "{error}");
}

#[test]
fn an_oauth2_account_names_its_client_and_a_bad_one_is_refused_at_its_line() {
    let oauth = GOOD
        .replace("preset = \"crm-stand-keyed\"", "preset = \"salesforce-oauth2\"")
        .replace(
            "token_env = \"CRM_TOKEN\"",
            "client_id_env = \"CRM_TOKEN\"\nclient_secret_env = \"CRM_TOKEN\"\nrefresh_token_env = \"CRM_TOKEN\"",
        );
    let config = check(&oauth).expect("valid");
    let (_, _, fingerprint) = config.providers[0]
        .account_owners()
        .next()
        .expect("an account");
    assert!(fingerprint.as_str().starts_with("sha256:"));
    let no_secret = oauth.replace("client_secret_env = \"CRM_TOKEN\"\n", "");
    let error = check(&no_secret).expect_err("no secret");
    assert_eq!(error.field, "connectors[0].accounts[0].client_secret_env");
    assert_eq!(error.line, Some(26), "{error}");
    let mixed = oauth.replace("client_id_env", "token_env = \"CRM_TOKEN\"\nclient_id_env");
    let error = check(&mixed).expect_err("a token beside the client");
    assert!(
        error.message.contains("OAuth2 client and a token"),
        "{error}"
    );
    // A static connector refuses an OAuth2 client, naming what its auth takes.
    let static_auth = oauth.replace("salesforce-oauth2", "salesforce");
    let error = check(&static_auth).expect_err("bearer auth");
    assert!(error.message.contains("bearer auth"), "{error}");
}

#[test]
fn a_connector_names_exactly_one_document() {
    let two = GOOD.replace(
        "preset = \"crm-stand-keyed\"",
        "preset = \"crm-stand-keyed\"\nfile = \"crm.toml\"",
    );
    let error = check(&two).expect_err("two documents");
    assert_eq!(error.field, "connectors[0]");
    assert!(error.message.contains("exactly one"), "{error}");
    let missing_file = GOOD.replace(
        "preset = \"crm-stand-keyed\"",
        "file = \"no-such-connector.toml\"",
    );
    let error = check(&missing_file).expect_err("no file");
    assert_eq!(error.field, "connectors[0].file");
    assert_eq!(error.line, Some(20));
}

#[test]
fn an_inline_connector_is_read_and_its_errors_point_at_this_files_lines() {
    let inline = GOOD.replace(
        "preset = \"crm-stand-keyed\"",
        &format!(
            "inline = '''\n{}'''",
            opledger_providers::presets::preset("crm-stand-labelled")
                .expect("a preset")
                .1
        ),
    );
    let config = check(&inline).expect("an inline connector is valid");
    assert_eq!(config.providers.len(), 1);
    assert_eq!(config.providers[0].id().as_str(), "crm");
    // The same document with an unknown method, on a known line of this file.
    let broken = inline.replacen("method = \"PUT\"", "method = \"BREW\"", 1);
    let wanted = broken
        .lines()
        .position(|line| line.contains("\"BREW\""))
        .expect("the line")
        + 1;
    let error = check(&broken).expect_err("a bad method");
    assert_eq!(error.file, "serve.toml");
    assert_eq!(error.line, Some(wanted), "{error}");
    assert!(error.field.starts_with("connectors[0].inline."), "{error}");
}

#[test]
fn a_connector_file_is_read_relative_to_the_configuration_and_its_errors_name_it() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let connector = dir.path().join("crm.toml");
    let text = opledger_providers::presets::preset("crm-stand-plain")
        .expect("a preset")
        .1
        .replace("lag_ms = 2000", "lag_ms = -1");
    std::fs::write(&connector, &text).expect("written");
    let config_path = dir.path().join("serve.toml");
    let serve = GOOD.replace("preset = \"crm-stand-keyed\"", "file = \"crm.toml\"");
    let error = parse(&config_path.display().to_string(), &serve, &env).expect_err("lag");
    assert_eq!(error.file, connector.display().to_string(), "{error}");
    let wanted = text
        .lines()
        .position(|line| line.contains("lag_ms = -1"))
        .expect("the line")
        + 1;
    assert_eq!(error.line, Some(wanted), "{error}");
    assert!(error.field.contains("lag_ms"), "{error}");
}

#[test]
fn unknown_fields_and_bad_types_are_syntax_errors_with_a_line() {
    let error = check(&GOOD.replace("workers = 8", "workerz = 8")).expect_err("unknown");
    assert_eq!(error.line, Some(7));
    assert!(error.message.contains("workerz"), "{error}");
    let error = check(&GOOD.replace("workers = 8", "workers = \"eight\"")).expect_err("type");
    assert_eq!(error.line, Some(7), "{error}");
}

#[test]
fn short_or_shared_tokens_are_refused() {
    let short = GOOD.replace("token_env = \"ACME_TOKEN\"", "token = \"short\"");
    assert_eq!(check(&short).expect_err("short").field, "tenants[0].token");
    let shared = GOOD.replace("token_env = \"OPS_TOKEN\"", "token_env = \"ACME_TOKEN\"");
    assert_eq!(check(&shared).expect_err("shared").field, "token");
}

#[test]
fn the_example_in_the_repository_is_a_valid_configuration() {
    let text = include_str!("../../../../opledger.example.toml");
    let env = |name: &str| match name {
        "ACME_API_TOKEN" => Some("acme-0123456789abcdef".to_owned()),
        "OPS_TOKEN" => Some("ops-0123456789abcdef".to_owned()),
        "APPROVER_TOKEN" => Some("approver-0123456789abcdef".to_owned()),
        "METRICS_TOKEN" => Some("metrics-0123456789abcdef".to_owned()),
        "HUBSPOT_ACCT1_TOKEN" => Some("hubspot-secret".to_owned()),
        "BILLING_WEBHOOK_SECRET" => Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()),
        _ => None,
    };
    let config = parse("opledger.example.toml", text, &env).expect("the example is valid");
    assert_eq!(config.tokens.len(), 3);
    assert!(config.tokens.values().any(
        |principal| matches!(principal, Principal::Approver { name, .. } if name == "finance-lead")
    ));
    assert_eq!(config.providers.len(), 1);
    assert_eq!(config.webhooks.len(), 1);
    assert_eq!(
        config.metrics_token.as_deref(),
        Some("metrics-0123456789abcdef")
    );
    let error = parse("opledger.example.toml", text, &|_| None).expect_err("no env");
    assert_eq!(error.field, "tenants[0].token_env");
}

fn with_store_table(table: &str) -> String {
    GOOD.replace("store = \"sqlite:///tmp/ledger.db\"\n", "") + "\n[store]\n" + table
}

#[test]
fn a_store_table_sets_a_postgres_stores_pool_and_timeouts() {
    let config = check(&with_store_table(
        "url = \"postgres://ledger@db:5432/opledger\"\npool_size = 16\nround_trip_timeout_ms = 8000\n",
    ))
    .expect("valid");
    assert!(matches!(config.store, StoreUrl::Postgres(_)));
    assert_eq!(config.store_limits.pool_size, Some(16));
    assert_eq!(config.store_limits.round_trip_timeout_ms, Some(8000));
    assert_eq!(config.store_limits.statement_timeout_ms, None);
}

#[test]
fn a_store_limit_out_of_bounds_unknown_or_on_another_store_is_refused_naming_it() {
    let postgres = "url = \"postgres://ledger@db:5432/opledger\"\n";
    for (table, expected) in [
        (
            format!("{postgres}pool_size = 0"),
            "pool_size is 0; it must be 1 to 64",
        ),
        (
            format!("{postgres}round_trip_timeout_ms = 1000"),
            "round_trip_timeout_ms is 1000 and statement_timeout_ms 5000",
        ),
        (
            format!("{postgres}connect_timeout_ms = 0"),
            "connect_timeout_ms and pool_wait_ms must be above 0",
        ),
        (
            format!("{postgres}pool_sise = 3"),
            "unknown field `pool_sise`",
        ),
        (
            "url = \"sqlite:///tmp/ledger.db\"\npool_size = 4".to_owned(),
            "only a PostgreSQL store has",
        ),
    ] {
        let error = check(&with_store_table(&table))
            .expect_err(&table)
            .to_string();
        assert!(
            error.contains(expected) && error.contains("store"),
            "{table}: {error}"
        );
    }
}

/// The keys the file's shape accepts in the section `path` (empty: the top level), as
/// serde's refusal of an unknown key lists them; `None` when the section takes any key (a
/// map of names) or is read elsewhere. `arrays`: the sections written `[[…]]`.
fn keys_accepted_in(path: &[&str], arrays: &BTreeSet<String>) -> Option<Vec<String>> {
    let mut text = String::new();
    for depth in 1..=path.len() {
        let section = path[..depth].join(".");
        if arrays.contains(&section) {
            text.push_str(&format!("[[{section}]]\n"));
        } else {
            text.push_str(&format!("[{section}]\n"));
        }
    }
    text.push_str("no_such_key_anywhere = 1\n");
    let refusal = toml::from_str::<File>(&text).err()?.to_string();
    let listed = refusal.split("expected").nth(1)?;
    Some(
        listed
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect(),
    )
}

#[test]
fn every_key_the_parser_accepts_is_named_in_the_example_the_reference_shows() {
    let example = include_str!("../../../../opledger.example.toml");
    let words: BTreeSet<&str> = example
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .collect();
    // Every section the example shows, written or commented out (`# [mcp]`).
    let mut sections: BTreeSet<String> = BTreeSet::new();
    let mut arrays: BTreeSet<String> = BTreeSet::new();
    for line in example.lines() {
        let line = line.trim_start_matches(['#', ' ']);
        if let Some(name) = line
            .strip_prefix("[[")
            .and_then(|rest| rest.split("]]").next())
        {
            arrays.insert(name.to_owned());
            sections.insert(name.to_owned());
        } else if let Some(name) = line
            .strip_prefix('[')
            .and_then(|rest| rest.split(']').next())
        {
            if !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.')
            {
                sections.insert(name.to_owned());
            }
        }
    }
    let mut checked = Vec::new();
    let mut missing = Vec::new();
    for section in std::iter::once(String::new()).chain(sections) {
        let path: Vec<&str> = section.split('.').filter(|part| !part.is_empty()).collect();
        let Some(keys) = keys_accepted_in(&path, &arrays) else {
            continue;
        };
        for key in keys {
            if !words.contains(key.as_str()) {
                missing.push(format!("[{section}] {key}"));
            }
        }
        checked.push(section);
    }
    for expected in [
        "",
        "engine",
        "limits",
        "tenants",
        "connectors",
        "webhooks",
        "metrics",
    ] {
        assert!(
            checked.iter().any(|section| section == expected),
            "the keys of section `{expected}` were read from the parser: {checked:?}"
        );
    }
    assert!(
        missing.is_empty(),
        "keys the parser accepts that opledger.example.toml (the configuration reference) never names: {missing:?}"
    );
}

#[test]
fn store_urls_are_sqlite_paths_kurrentdb_connection_strings_or_postgres_urls() {
    assert_eq!(
        parse_store("sqlite://ledger.db"),
        Ok(StoreUrl::Sqlite(PathBuf::from("ledger.db")))
    );
    assert!(matches!(
        parse_store("esdb://localhost:2113?tls=false"),
        Ok(StoreUrl::KurrentDb(_))
    ));
    assert_eq!(
        parse_store("postgres://ledger@db:5432/opledger"),
        Ok(StoreUrl::Postgres(
            "postgres://ledger@db:5432/opledger".into()
        ))
    );
    let no_database = parse_store("postgres://ledger:pw@db:5432").expect_err("no database");
    assert!(no_database.contains("names no database"), "{no_database}");
    assert!(!no_database.contains("pw"), "{no_database}");
    assert!(parse_store("sqlite://").is_err());
    assert!(parse_store("/var/ledger.db").is_err());
}

#[test]
fn an_upstream_with_a_login_needs_the_key_it_is_sealed_under_and_is_kept_beside_the_ledger() {
    let upstream = "\n[[connectors]]\ninline = '''\nid = \"notes\"\ndescription = \"notes\"\ntransport = \"mcp\"\n\n[upstream]\nurl = \"https://mcp.example.com/mcp\"\n\n[upstream.login]\n\n[[accounts]]\nid = \"main\"\ntenants = [\"acme\"]\n\n[[actions]]\nname = \"add\"\ndescription = \"add a note\"\ntool = \"add\"\ninput = { type = \"object\" }\nresult = { id = \"{{label}}\" }\ndedup = { kind = \"naturally_idempotent\" }\nlookup = { kind = \"none\" }\n'''\n";
    let text = format!(
        "listen = \"127.0.0.1:9090\"\nstore = \"sqlite:///var/lib/opledger/ledger.db\"\n\n[[tenants]]\nid = \"acme\"\ntoken_env = \"ACME_TOKEN\"\n{upstream}"
    );
    let refused = check(&text).expect_err("no key-encryption key");
    assert_eq!(refused.field, "connectors[0]", "{refused}");
    assert!(
        refused.message.contains("OPLEDGER_KEK") && refused.message.contains("[upstream.login]"),
        "{refused}"
    );
    let with_key = |name: &str| match name {
        "OPLEDGER_KEK" => Some("11".repeat(32)),
        other => env(other),
    };
    let config = parse("serve.toml", &text, &with_key).expect("the key is configured");
    assert_eq!(
        config.upstreams[0].login_file(),
        Some(std::path::PathBuf::from(
            "/var/lib/opledger/opledger-mcp-login-notes.sealed"
        ))
    );
}
