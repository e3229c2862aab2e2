//! The `opledger` command: the ledger's door for people and scripts.
//!
//! This file parses the command line and hands over; each subcommand lives in its own module.
//! Errors from below are reported once, here, as a message that says what to do, and a non-zero
//! exit status. Nothing here panics on user input.

mod bench;
mod cli;
mod connectors;
mod demo;
mod export;
mod export_parquet;
mod intent;
mod ledger_file;
mod log;
mod mcp;
mod migrate;
mod ops;
mod read_models;
mod replay;
mod review;
mod serve;
mod sim;
mod stand;
mod subjects;
mod tail;
mod trace;
mod verify;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command, OpsCommand, ReviewCommand};

/// The allocator. The server allocates and frees many small buffers per request (headers, JSON,
/// futures); glibc's malloc took ~10 % of `bench http`'s CPU, and mimalloc (a small C library,
/// built by `cc`) does the same work for less. Measured with `bench http`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The exit status of a process stopped by a closed pipe (128 + SIGPIPE), as shells expect.
const BROKEN_PIPE_EXIT: i32 = 141;

fn main() -> ExitCode {
    exit_quietly_on_broken_pipe();
    owner_only_files();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return argument_error(&error),
    };
    let json = cli.command.json();
    // The demo prints its own story; its expected warnings (lost responses) would clutter it.
    // `connectors test` says each account's failure in its own line; the token client's warning
    // would say it a second time.
    let quiet = matches!(
        cli.command,
        Command::Demo(_)
            | Command::Sim(_)
            | Command::Connectors(cli::ConnectorsArgs {
                command: cli::ConnectorsCommand::Test(_),
                ..
            })
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Inside the runtime: the gRPC exporter's channel is built on it.
    let telemetry = {
        let _entered = runtime.enter();
        match init_logging(&cli, quiet) {
            Ok(telemetry) => telemetry,
            Err(message) => {
                eprintln!("error: {message}");
                return ExitCode::from(2);
            }
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Demo(args) => demo::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Record(args) => intent::record(args).await,
            Command::Approve(args) => intent::approve(args).await,
            Command::Deny(args) => intent::deny(args).await,
            Command::Status(args) => ops::show(args).await,
            Command::Ops(args) => match args.command {
                OpsCommand::List(args) => ops::list(args).await,
                OpsCommand::Show(args) => ops::show(args).await,
            },
            Command::Trace(args) => trace::run(args).await,
            Command::Review(args) => match args.command {
                ReviewCommand::List(args) => review::list(args).await,
                ReviewCommand::Show(args) => review::show(args).await,
                ReviewCommand::Resolve(args) => review::resolve(args).await,
            },
            Command::Tail(args) => tail::run(args).await,
            Command::Replay(args) => replay::run(args).await,
            Command::Serve(args) => serve::run(args).await,
            Command::Mcp(args) => mcp::run(args).await,
            Command::Stand(args) => stand::run(args).await,
            Command::Sim(args) => sim::run(args).await,
            Command::Connectors(args) => connectors::run(args).await,
            Command::Verify(args) => verify::run(args).await,
            Command::Keys(args) => match args.command {
                cli::KeysCommand::Generate(args) => log::generate_keys(args),
            },
            Command::Checkpoint(args) => log::checkpoint(args).await,
            Command::Prove(args) => log::prove(args).await,
            Command::Witness(args) => log::witness(args).await,
            Command::Export(args) => export::run(args).await,
            Command::Migrate(args) => migrate::run(args).await,
            Command::Subjects(args) => match args.command {
                cli::SubjectsCommand::List(args) => subjects::list(args).await,
                cli::SubjectsCommand::Show(args) => subjects::show(args).await,
                cli::SubjectsCommand::Erase(args) => subjects::erase(args).await,
                cli::SubjectsCommand::RotateKek(args) => subjects::rotate(args).await,
            },
        }
    });
    // The spans still queued go out before the process ends (bounded by the export timeout).
    telemetry.shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            // Asked for JSON, a script reads stdout: the error is there too, as an object, unless
            // the command's own JSON report already said it.
            if json && !error.reported_on_stdout() {
                println!("{}", cli::error_json(&error));
            }
            error.exit_code()
        }
    }
}

/// A command line clap cannot parse: its own message and exit status (2), and, when `--json` was
/// asked for, the same error as a JSON object on stdout. Help and version go out as clap prints
/// them.
fn argument_error(error: &clap::Error) -> ExitCode {
    let asked_json = std::env::args_os().any(|arg| arg == "--json");
    if asked_json && error.use_stderr() {
        let rendered = error.render().to_string();
        // The message is the paragraph before clap's usage lines.
        let message = rendered
            .lines()
            .take_while(|line| !line.trim().is_empty())
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ");
        let message = message.trim_start_matches("error: ");
        let _ = error.print();
        println!(
            "{}",
            serde_json::json!({"error": {"code": "invalid_input", "message": message}})
        );
        return ExitCode::from(2);
    }
    error.exit()
}

/// `opledger ops list | head -1` closes the pipe early. Rust ignores SIGPIPE, so the next
/// `println!` panics with a backtrace; a command-line tool should instead stop quietly, as one
/// killed by SIGPIPE would. Everything already done stands: output is printed after the ledger
/// recorded what the command did. (Restoring SIGPIPE itself would need unsafe code, which the
/// workspace forbids.)
fn exit_quietly_on_broken_pipe() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(BROKEN_PIPE_EXIT);
        }
        default_hook(info);
    }));
}

/// Logging and, when configured, trace export: the `[telemetry]` section of the command's
/// configuration file, then the standard `OTEL_*` environment variables (which alone turn export
/// on for the embedded default). A bad setting stops the command before it does anything.
fn init_logging(cli: &Cli, quiet: bool) -> Result<opledger_telemetry::Telemetry, String> {
    let default = match cli.verbose {
        0 if quiet => "error",
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    // `RUST_LOG`, read once: unset or empty leaves `-v` in charge (an empty one used to silence
    // even `-v`), and one that does not parse stops the command, saying what is wrong (it used to
    // be quietly replaced by the default, so a typo looked like logging that does not work).
    let directives = std::env::var(tracing_subscriber::EnvFilter::DEFAULT_ENV)
        .ok()
        .filter(|directives| !directives.trim().is_empty());
    if let Some(directives) = &directives {
        tracing_subscriber::EnvFilter::try_new(directives).map_err(|error| {
            format!(
                "RUST_LOG=`{directives}` is not a log filter ({error}); write directives such as \
                 `info` or `opledger=debug,hyper=warn`, or unset RUST_LOG and use -v"
            )
        })?;
    }
    let filter = || tracing_subscriber::EnvFilter::new(directives.as_deref().unwrap_or(default));
    let env = |name: &str| std::env::var(name).ok();
    // An unreadable file is reported by the command's own loader, with its advice.
    let text = cli.command.config_path().and_then(|path| {
        let small = std::fs::metadata(path)
            .is_ok_and(|file| file.len() <= opledger_http_api::config::MAX_CONFIG_BYTES);
        std::fs::read_to_string(path)
            .ok()
            .filter(|_| small)
            .map(|text| (path, text))
    });
    let mut settings = match &text {
        Some((path, text)) => {
            opledger_telemetry::config::from_file(&path.display().to_string(), text, &env)
        }
        None => opledger_telemetry::config::from_env(&env),
    }
    .map_err(|error| error.to_string())?;
    if let (Command::Serve(_), Some(export)) = (&cli.command, settings.export.as_mut()) {
        export.instance_id = Some(serve::instance_id(
            text.as_ref().map(|(_, text)| text.as_str()),
        ));
    }
    if let Some(format) = cli.log_format.as_deref() {
        settings.log_format =
            opledger_telemetry::LogFormat::parse(format).expect("clap allows text and json only");
    }
    opledger_telemetry::install(&settings, filter).map_err(|error| error.to_string())
}

/// Every file this process creates is readable and writable by its owner only: the ledger and
/// its WAL, the read models, the webhook journal and the token file hold every tenant's
/// arguments or a secret, and an export holds the same. The umask does it for all of them at
/// once, SQLite's own side files included, as PostgreSQL does for its data directory; a file
/// that already exists keeps its mode.
fn owner_only_files() {
    #[cfg(unix)]
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
}
