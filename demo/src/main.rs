//! `demo`: parses the flags and runs the demo (see the library's doc).
//! `scripts/demo` builds it and the services, then runs it.

use std::process::ExitCode;

use clap::Parser;
use demo::config::Config;

/// Exit status on an error (bad flags exit 2 through clap as well).
const EXIT_ERROR: u8 = 2;

fn main() -> ExitCode {
    let config = Config::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("demo: building the runtime: {error}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    match runtime.block_on(demo::run(config)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("demo: {error:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}
