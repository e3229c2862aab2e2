//! PgBouncer in transaction mode between the store and the server is refused at start with the
//! reason: as it comes (it refuses the startup options that carry the session's settings), and
//! with `ignore_startup_parameters = options` (it would drop them silently). PgBouncer comes
//! from Debian's package, installed like PostgreSQL when it is missing.

use std::net::{Ipv4Addr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use opledger_store::PostgresStore;

use crate::postgres_server::{server, PASSWORD, USER};

/// A PgBouncer in transaction mode in front of the test cluster, stopped when dropped.
struct Bouncer {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pgbouncer() -> &'static str {
    const BIN: &str = "/usr/sbin/pgbouncer";
    crate::postgres_server::apt::install(&["pgbouncer"], BIN, || {
        std::path::Path::new(BIN).exists()
    })
    .unwrap_or_else(|error| panic!("the pooler tests need PgBouncer: {error}"));
    BIN
}

fn bouncer(extra: &str) -> Bouncer {
    let bin = pgbouncer();
    let dir = tempfile::tempdir().expect("a directory");
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    std::fs::write(
        dir.path().join("users.txt"),
        format!("\"{USER}\" \"{PASSWORD}\"\n"),
    )
    .expect("the user list");
    let config = dir.path().join("pgbouncer.ini");
    std::fs::write(
        &config,
        format!(
            "[databases]\n* = host=127.0.0.1 port={}\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\nauth_type = scram-sha-256\nauth_file = {}\npool_mode = transaction\n{extra}\n",
            server().port,
            dir.path().join("users.txt").display()
        ),
    )
    .expect("the configuration");
    // PgBouncer refuses to run as root, like PostgreSQL.
    let _ = Command::new("chmod").arg("755").arg(dir.path()).status();
    let child = Command::new("runuser")
        .args(["-u", "postgres", "--", bin])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start pgbouncer");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
        assert!(Instant::now() < deadline, "pgbouncer did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    Bouncer {
        port,
        child,
        _dir: dir,
    }
}

async fn refusal_through(bouncer: &Bouncer) -> String {
    let database = server().database();
    let url = format!(
        "postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{database}",
        bouncer.port
    );
    match PostgresStore::connect(&url).await {
        Ok(_) => panic!("the store started behind a transaction-mode pooler"),
        Err(error) => error.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_in_transaction_mode_is_refused_at_start_saying_why() {
    let bouncer = bouncer("");
    let refused = refusal_through(&bouncer).await;
    assert!(
        refused.contains("pooler") && refused.contains("transaction-mode pooling is not supported"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_that_drops_the_startup_options_is_refused_naming_the_setting_lost() {
    let bouncer = bouncer("ignore_startup_parameters = options");
    let refused = refusal_through(&bouncer).await;
    assert!(
        refused.contains("statement_timeout") && refused.contains("ignore_startup_parameters"),
        "{refused}"
    );
}
