//! A private PostgreSQL cluster for the tests of one test binary: started on first use, in a
//! temporary directory, on a free loopback port, and gone when the binary exits.
//!
//! - PostgreSQL comes from Debian: when no `initdb` is found (in `/usr/lib/postgresql/*/bin` or
//!   on `PATH`), `apt-get update` and `apt-get install -y postgresql` run once, so a fresh CI
//!   machine runs these tests instead of skipping them.
//! - PostgreSQL refuses to run as root, so as root the cluster runs as the `postgres` user the
//!   Debian package creates, and the directory is handed to it.
//! - One cluster per test binary (a `OnceLock`); each test takes its own database
//!   ([`Server::database`]), so tests run in parallel without seeing each other's data.
//! - Nothing outlives the binary: a watchdog shell started beside the server waits for the test
//!   process to end (however it ends, SIGKILL included), then stops the server with an
//!   immediate shutdown and removes the directory. A `Drop` of a static never runs, and a
//!   parent-death signal fires when the *thread* that started the server ends, which in a test
//!   harness is the first test's thread.
//!
//! `fsync = off` on this cluster only: the tests check what the store does, not the disk, and
//! a two-core machine shared by several builds would spend most of the suite's time in fsync.
//! The store itself always runs with `synchronous_commit = on`.

#![allow(dead_code)] // Each test binary uses a part.

pub mod proxy;

#[path = "../apt/mod.rs"]
pub mod apt;

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The superuser's password on the private cluster.
pub const PASSWORD: &str = "opledger-test-password";
/// The superuser.
pub const USER: &str = "postgres";
/// Longest the cluster may take to accept connections, on a loaded machine.
const START_LIMIT: Duration = Duration::from_secs(60);
/// Ports tried before giving up (another process may take a free port between look and bind).
const PORT_ATTEMPTS: usize = 5;

/// The running cluster.
pub struct Server {
    pub port: u16,
    tls: bool,
    dir: PathBuf,
    bin: PathBuf,
    as_postgres: bool,
    /// Settings given to the server at start, `name=value` each.
    settings: Vec<String>,
}

static SERVER: OnceLock<Server> = OnceLock::new();

/// The binary's cluster, started on first call.
pub fn server() -> &'static Server {
    SERVER.get_or_init(|| {
        start(false).unwrap_or_else(|error| panic!("cannot start the test PostgreSQL: {error}"))
    })
}

static TLS_SERVER: OnceLock<Server> = OnceLock::new();

/// A second cluster with `ssl = on` and a self-signed certificate for `localhost` made at start
/// (the `openssl` CLI), as a fresh Debian cluster has: trusted by no root on this machine. Its
/// own cluster, so the proxies of the other tests keep seeing plain protocol messages.
pub fn tls_server() -> &'static Server {
    TLS_SERVER.get_or_init(|| {
        start(true)
            .unwrap_or_else(|error| panic!("cannot start the test PostgreSQL with TLS: {error}"))
    })
}

impl Server {
    /// A URL for `database` with the password in it.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{database}",
            self.port
        )
    }

    /// A URL for `database` without a password (for `PGPASSWORD` and refusal tests).
    pub fn url_without_password(&self, database: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{database}", self.port)
    }

    /// A fresh, empty database; returns its name.
    pub fn database(&self) -> String {
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        self.sql("postgres", &format!("CREATE DATABASE {name}"));
        name
    }

    /// Runs SQL in `database` through psql, failing the test when it fails; returns its output.
    pub fn sql(&self, database: &str, sql: &str) -> String {
        self.try_sql(database, sql)
            .unwrap_or_else(|error| panic!("psql `{sql}` failed: {error}"))
    }

    /// Runs SQL in `database` through psql; its output, or psql's error.
    pub fn try_sql(&self, database: &str, sql: &str) -> Result<String, String> {
        let output = self
            .command("psql")
            .args([
                "-X",
                "-q",
                "-t",
                "-A",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
            ])
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                USER,
                "-d",
                database,
                "-c",
                sql,
            ])
            .env("PGPASSWORD", PASSWORD)
            .output()
            .map_err(|error| format!("run psql: {error}"))?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// Runs SQL that needs `database` to have no session (a rename, a copy by template): ends
    /// every session on it and tries again until the server takes it.
    pub fn sql_alone(&self, database: &str, sql: &str) {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            self.sql(
                "postgres",
                &format!(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{database}' AND pid <> pg_backend_pid()"
                ),
            );
            match self.try_sql("postgres", sql) {
                Ok(_) => return,
                Err(error) if Instant::now() < deadline => {
                    let _ = error;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(error) => panic!("psql `{sql}` failed: {error}"),
            }
        }
    }

    /// A command from the server's binaries, run as the `postgres` user when we are root.
    fn command(&self, program: &str) -> Command {
        command(&self.bin, program, self.as_postgres)
    }

    /// `database` dumped with pg_dump (its custom format), as an operator keeps a backup.
    pub fn dump(&self, database: &str) -> Vec<u8> {
        let output = self
            .command("pg_dump")
            .args([
                "-Fc",
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                USER,
                database,
            ])
            .env("PGPASSWORD", PASSWORD)
            .output()
            .expect("run pg_dump");
        assert!(
            output.status.success(),
            "pg_dump: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output.stdout
    }

    /// `database` dumped with pg_dump as plain SQL text (every row's values as they are stored,
    /// nothing compressed), for a search of its bytes.
    pub fn dump_plain(&self, database: &str) -> Vec<u8> {
        let output = self
            .command("pg_dump")
            .args(["-Fp", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", USER, database])
            .env("PGPASSWORD", PASSWORD)
            .output()
            .expect("run pg_dump");
        assert!(
            output.status.success(),
            "pg_dump: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output.stdout
    }

    /// The cluster's data directory (the tests run as root, so they can read it).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The directory of `database`'s own files (its tables and indexes) in the data directory,
    /// after a `CHECKPOINT` has written every changed page there.
    pub fn database_files(&self, database: &str) -> PathBuf {
        self.sql(database, "CHECKPOINT");
        let oid = self.sql(
            database,
            "SELECT oid FROM pg_database WHERE datname = current_database()",
        );
        self.data_dir().join("base").join(oid)
    }

    /// Replaces `database` by the state a [`Self::dump`] kept: the database is dropped (its
    /// sessions ended), made again and the dump restored into it with pg_restore.
    pub fn restore(&self, database: &str, dump: &[u8]) {
        use std::io::Write;
        self.sql_alone(database, &format!("DROP DATABASE {database}"));
        self.sql("postgres", &format!("CREATE DATABASE {database}"));
        let mut child = self
            .command("pg_restore")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                USER,
                "-d",
                database,
            ])
            .env("PGPASSWORD", PASSWORD)
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run pg_restore");
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(dump)
            .expect("the dump goes to pg_restore");
        let output = child.wait_with_output().expect("pg_restore ends");
        assert!(
            output.status.success(),
            "pg_restore: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

fn command(bin: &Path, program: &str, as_postgres: bool) -> Command {
    let program = bin.join(program);
    if as_postgres {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn start(tls: bool) -> Result<Server, String> {
    start_with(tls, Vec::new())
}

/// A cluster of the test's own, not shared with the binary's other tests (one a test may stop,
/// promote or start again), started with these settings (`name=value` each). Stopped and removed
/// when the binary ends, as the shared one is.
pub fn own_cluster(settings: &[&str]) -> Server {
    start_with(
        false,
        settings
            .iter()
            .map(|setting| (*setting).to_owned())
            .collect(),
    )
    .unwrap_or_else(|error| panic!("cannot start a PostgreSQL cluster: {error}"))
}

impl Server {
    /// A streaming standby of this cluster, made as an operator makes one (`pg_basebackup -R`),
    /// connecting to it as `application_name` (the name `synchronous_standby_names` lists).
    pub fn standby(&self, application_name: &str) -> Server {
        let dir = temp_dir().unwrap_or_else(|error| panic!("{error}"));
        let connection = format!(
            "host=127.0.0.1 port={} user={USER} application_name={application_name}",
            self.port
        );
        run(self
            .command("pg_basebackup")
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-R", "-X", "stream", "-c", "fast", "-d", &connection])
            .env("PGPASSWORD", PASSWORD))
        .unwrap_or_else(|error| panic!("pg_basebackup: {error}"));
        watch_over(&dir).unwrap_or_else(|error| panic!("{error}"));
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let standby = Server {
                port: free_port().unwrap_or_else(|error| panic!("{error}")),
                tls: false,
                dir: dir.clone(),
                bin: self.bin.clone(),
                as_postgres: self.as_postgres,
                settings: Vec::new(),
            };
            match launch(&standby) {
                Ok(()) => return standby,
                Err(error) => last = error,
            }
        }
        panic!("cannot start the standby: {last}")
    }

    /// Stops the cluster as a crash does (`pg_ctl stop -m immediate`: no checkpoint, every
    /// session cut).
    pub fn crash(&self) {
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["stop", "-m", "immediate", "-w"]))
        .unwrap_or_else(|error| panic!("pg_ctl stop: {error}"));
    }

    /// Promotes a standby to primary and waits until it accepts writes.
    pub fn promote(&self) {
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["promote", "-w"]))
        .unwrap_or_else(|error| panic!("pg_ctl promote: {error}"));
    }

    /// Starts a stopped cluster again on its port, as it was (a crashed primary comes back as a
    /// primary).
    pub fn start_again(&self) {
        launch(self).unwrap_or_else(|error| panic!("cannot start the cluster again: {error}"));
    }
}

/// A fresh directory for a cluster, owned by the user the server runs as.
fn temp_dir() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!(
        "opledger-pg-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).map_err(|error| format!("create {}: {error}", dir.display()))?;
    if is_root() {
        run(Command::new("chown").args(["-R", "postgres:"]).arg(&dir))?;
        run(Command::new("chmod").arg("700").arg(&dir))?;
    }
    Ok(dir)
}

fn start_with(tls: bool, settings: Vec<String>) -> Result<Server, String> {
    let bin = match find_bin() {
        Some(bin) => bin,
        None => {
            install()?;
            find_bin()
                .ok_or("`apt-get install postgresql` left no initdb in /usr/lib/postgresql/*/bin")?
        }
    };
    let as_postgres = is_root();
    let dir = std::env::temp_dir().join(format!(
        "opledger-pg-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).map_err(|error| format!("create {}: {error}", dir.display()))?;
    std::fs::write(dir.join("password"), PASSWORD).map_err(|error| error.to_string())?;
    if as_postgres {
        run(Command::new("chown").args(["-R", "postgres:"]).arg(&dir))?;
    }
    run(command(&bin, "initdb", as_postgres)
        .arg("-D")
        .arg(dir.join("data"))
        .args([
            "-U",
            USER,
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--no-sync",
        ])
        .arg(format!("--pwfile={}", dir.join("password").display())))?;
    if tls {
        certificate(&dir, as_postgres)?;
    }
    watch_over(&dir)?;
    let mut last = String::new();
    for _ in 0..PORT_ATTEMPTS {
        let port = free_port()?;
        let server = Server {
            port,
            tls,
            dir: dir.clone(),
            bin: bin.clone(),
            as_postgres,
            settings: settings.clone(),
        };
        match launch(&server) {
            Ok(()) => return Ok(server),
            Err(error) => last = error,
        }
    }
    Err(last)
}

/// A self-signed certificate for `localhost` and its key in `dir`, the key readable by the
/// server's user alone (PostgreSQL refuses a key others can read).
fn certificate(dir: &Path, as_postgres: bool) -> Result<(), String> {
    let (certificate, key) = (dir.join("server.crt"), dir.join("server.key"));
    run(Command::new("openssl")
        .args([
            "req", "-new", "-x509", "-days", "2", "-nodes", "-newkey", "rsa:2048",
        ])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&certificate))?;
    if as_postgres {
        run(Command::new("chown")
            .args(["postgres:"])
            .arg(&certificate)
            .arg(&key))?;
    }
    run(Command::new("chmod").arg("600").arg(&key))
}

/// Starts the server on `server.port` and waits until it accepts connections.
fn launch(server: &Server) -> Result<(), String> {
    let log = std::fs::File::create(server.dir.join("server.log")).map_err(|e| e.to_string())?;
    let mut child = server
        .command("postgres")
        .arg("-D")
        .arg(server.dir.join("data"))
        .args(["-p", &server.port.to_string()])
        .args(["-c", "listen_addresses=127.0.0.1"])
        .arg("-c")
        .arg(format!("unix_socket_directories={}", server.dir.display()))
        .args([
            "-c",
            "fsync=off",
            "-c",
            "max_connections=300",
            "-c",
            "shared_buffers=32MB",
        ])
        .args(match server.tls {
            true => vec![
                "-c".to_owned(),
                "ssl=on".to_owned(),
                "-c".to_owned(),
                format!("ssl_cert_file={}", server.dir.join("server.crt").display()),
                "-c".to_owned(),
                format!("ssl_key_file={}", server.dir.join("server.key").display()),
            ],
            false => Vec::new(),
        })
        .args(
            server
                .settings
                .iter()
                .flat_map(|setting| ["-c", setting.as_str()]),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|error| format!("spawn postgres: {error}"))?;
    let deadline = Instant::now() + START_LIMIT;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(server.dir.join("server.log")).unwrap_or_default();
            return Err(format!("postgres exited with {status}: {log}"));
        }
        let ready = server
            .command("pg_isready")
            .args(["-q", "-h", "127.0.0.1", "-p", &server.port.to_string()])
            .status()
            .map_err(|error| format!("run pg_isready: {error}"))?;
        if ready.success() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    Err(format!(
        "postgres did not accept connections within {START_LIMIT:?}"
    ))
}

/// Starts the shell that stops the server and removes `dir` once this process has ended.
fn watch_over(dir: &Path) -> Result<(), String> {
    let script = format!(
        "trap '' INT TERM HUP; \
         while kill -0 {pid} 2>/dev/null; do sleep 0.2; done; \
         if [ -f '{dir}/data/postmaster.pid' ]; then \
           pg=$(head -1 '{dir}/data/postmaster.pid'); kill -QUIT \"$pg\" 2>/dev/null; \
           while kill -0 \"$pg\" 2>/dev/null; do sleep 0.1; done; \
         fi; \
         rm -rf '{dir}'",
        pid = std::process::id(),
        dir = dir.display()
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(drop)
        .map_err(|error| format!("start the watchdog: {error}"))
}

/// The newest `/usr/lib/postgresql/*/bin` holding initdb, else the directory of one on PATH.
fn find_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .find(|dir| dir.join("initdb").is_file() && dir.join("pg_isready").is_file())
    })
}

fn install() -> Result<(), String> {
    apt::install(&["postgresql"], "PostgreSQL's initdb", || {
        find_bin().is_some()
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|error| format!("find a free port: {error}"))
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("run {command:?}: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// A psql session running `sql` in the background, killed when dropped.
pub struct Background(std::process::Child);

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Server {
    /// Starts psql running `sql` in `database` without waiting for it.
    pub fn spawn_sql(&self, database: &str, sql: &str) -> Background {
        let child = self
            .command("psql")
            .args([
                "-X",
                "-q",
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                USER,
                "-d",
                database,
                "-c",
                sql,
            ])
            .env("PGPASSWORD", PASSWORD)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start psql");
        Background(child)
    }
}
