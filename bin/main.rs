//! The `opledger` command: the ledger's door for people and scripts.
//!
//! This file parses the command line and hands over; each subcommand lives in its own module.
//! Errors from below are reported once, here, as a message that says what to do, and a non-zero
//! exit status. Nothing here panics on user input.

mod bench;
mod bench_http;
mod cli;
mod demo;
mod intent;
mod ops;
mod read_models;
mod replay;
mod review;
mod serve;
mod stand;
mod tail;
mod trace;
mod verify;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command, OpsCommand, ReviewCommand};

/// The allocator. The server allocates and frees many small buffers per request (headers, JSON,
/// futures); glibc's malloc took ~10 % of `bench http`'s CPU, and mimalloc (a small C library,
/// built by `cc`) does the same work for less. See the README's benchmark notes.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The exit status of a process stopped by a closed pipe (128 + SIGPIPE), as shells expect.
const BROKEN_PIPE_EXIT: i32 = 141;

fn main() -> ExitCode {
    exit_quietly_on_broken_pipe();
    let cli = Cli::parse();
    // The demo prints its own story; its expected warnings (lost responses) would clutter it.
    let quiet = matches!(cli.command, Command::Demo(_));
    init_logging(cli.verbose, quiet);
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
            Command::Stand(args) => stand::run(args).await,
            Command::Verify(args) => verify::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            error.exit_code()
        }
    }
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

fn init_logging(verbose: u8, quiet: bool) {
    let default = match verbose {
        0 if quiet => "error",
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
