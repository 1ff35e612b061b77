//! Servers under test, each its own child process.
//!
//! The agent, the naive baseline and the ceiling run as separate processes
//! with their own tokio runtimes, exactly as in production, so no server
//! shares a scheduler or an allocator with the load generator. A child
//! that is not stopped explicitly is killed when its handle drops.
//!
//! A child either shares our terminal (its logs on our stderr, a Ctrl-C
//! reaches it too) or is detached from it (its logs in a file, its own
//! process group): a parent that draws on the terminal, or that stops its
//! children in order on Ctrl-C, detaches them.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hyper::Method;
use tokio::process::{Child, Command};

use crate::client::{self, Bearer};

/// Longest a server may take from spawn to ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a server may take to drain after SIGTERM before it is killed.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Most bytes of a detached child's log quoted when it exits before it is ready.
pub const LOG_EXCERPT_BYTES: usize = 2_048;
/// Most bytes read from the end of that log to find the excerpt.
pub const LOG_READ_BYTES: u64 = 65_536;

/// How a child relates to our terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Terminal {
    /// Shares it: logs to our stderr at `warn` (unless `RUST_LOG` says
    /// otherwise), and a Ctrl-C in the terminal reaches it too.
    Shared,
    /// Detached from it: logs to this file (appended, without colours) at
    /// `info` (unless `RUST_LOG` says otherwise), in a process group of its
    /// own, so a Ctrl-C reaches only us and we stop it.
    Detached {
        /// The log file.
        log: PathBuf,
    },
}

/// A loopback address with a port free right now.
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?)
}

/// A running server.
#[derive(Debug)]
pub struct ServerProcess {
    /// What it is, for messages.
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
    child: Child,
}

impl ServerProcess {
    /// Spawns `program args` sharing our terminal and waits until
    /// `GET /readyz` answers 200.
    pub async fn start(
        name: &str,
        program: &Path,
        args: &[String],
        addr: SocketAddr,
    ) -> anyhow::Result<Self> {
        Self::spawn(name, program, args, addr, &Terminal::Shared).await
    }

    /// Spawns `program args` as `terminal` says and waits until
    /// `GET /readyz` answers 200; a detached child that exits before that
    /// is reported with the end of its log.
    pub async fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        addr: SocketAddr,
        terminal: &Terminal,
    ) -> anyhow::Result<Self> {
        let mut command = Command::new(program);
        command.args(args).stdin(Stdio::null()).kill_on_drop(true);
        let default_level = match terminal {
            Terminal::Shared => {
                command.stdout(Stdio::from(std::io::stderr()));
                "warn"
            }
            Terminal::Detached { log } => {
                let file = File::options()
                    .create(true)
                    .append(true)
                    .open(log)
                    .with_context(|| format!("opening {}", log.display()))?;
                // A log file is read with a pager or grep: no colour codes.
                command
                    .stdout(Stdio::from(file.try_clone()?))
                    .stderr(Stdio::from(file))
                    .env("NO_COLOR", "1")
                    .process_group(0);
                "info"
            }
        };
        command.env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| default_level.into()),
        );
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        let mut server = Self {
            name: name.to_owned(),
            addr,
            child,
        };
        if let Err(error) = server.wait_ready().await {
            return Err(match terminal {
                Terminal::Shared => error,
                Terminal::Detached { log } => {
                    anyhow::anyhow!("{error:#}; {} says:\n{}", log.display(), log_excerpt(log))
                }
            });
        }
        Ok(server)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let probe = Bearer::new("probe")?;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("{} exited before it was ready: {status}", self.name);
            }
            if let Ok((status, _)) =
                client::once(self.addr, Method::GET, "/readyz", &probe, None).await
            {
                if status.is_success() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("{} was not ready within {READY_TIMEOUT:?}", self.name);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The child's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGTERM (a graceful drain), then SIGKILL if it takes too long.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            // `kill` is POSIX; this crate forbids the unsafe a direct libc call needs.
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    tracing::warn!(name = %self.name, %status, "server exited unsuccessfully");
                }
            }
            Err(_) => {
                tracing::warn!(name = %self.name, "server did not drain in time; killing it");
                self.child.kill().await?;
            }
        }
        Ok(())
    }
}

/// What a dead child's log says about why: from the last line that starts
/// with `Error: ` (how both services' `main` reports a failure) up to its
/// backtrace, if any; else the log's last lines. At most [`LOG_EXCERPT_BYTES`].
fn log_excerpt(path: &Path) -> String {
    let read = || -> std::io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(LOG_READ_BYTES)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    let text = match read() {
        // A line break in front, so the first line is a line like the others.
        Ok(text) => format!("\n{text}"),
        Err(e) => return format!("(unreadable: {e})"),
    };
    let excerpt = match text.rfind("\nError: ") {
        Some(start) => {
            let error = &text[start + 1..];
            error.split("\nStack backtrace:").next().unwrap_or(error)
        }
        None => {
            let from = text.len().saturating_sub(LOG_EXCERPT_BYTES);
            let from = (from..text.len())
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(text.len());
            &text[from..]
        }
    };
    let mut end = excerpt.len().min(LOG_EXCERPT_BYTES);
    while !excerpt.is_char_boundary(end) {
        end -= 1;
    }
    excerpt[..end].trim().to_owned()
}

/// Where the benchmark finds its server binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `region-agent`.
    pub agent: PathBuf,
    /// `bench-server`.
    pub server: PathBuf,
    /// `coordinator` (`compare` starts one for its coordinated rows, `tail` one per policy).
    pub coordinator: PathBuf,
    /// `escrowctl` (never started here; the demo names it for the reader).
    pub escrowctl: PathBuf,
}

/// The packages `bench` (all but `tail`) runs.
pub const HOT_PATH_PACKAGES: [&str; 3] = ["region-agent", "coordinator", "bench"];
/// The packages `bench tail` runs.
pub const CLUSTER_PACKAGES: [&str; 2] = ["coordinator", "region-agent"];

impl Binaries {
    /// The binaries next to the running `bench` executable (the same
    /// target directory and profile; a test's executable sits one level
    /// lower, in `deps/`), or in `dir` if given.
    pub fn locate(dir: Option<&Path>) -> anyhow::Result<Self> {
        let dir = match dir {
            Some(dir) => dir.to_owned(),
            None => {
                let exe = std::env::current_exe()?;
                let dir = exe.parent().context("the executable has a directory")?;
                if dir.ends_with("deps") {
                    dir.parent().context("deps/ sits in a profile directory")?
                } else {
                    dir
                }
                .to_owned()
            }
        };
        Ok(Self {
            agent: dir.join("region-agent"),
            server: dir.join("bench-server"),
            coordinator: dir.join("coordinator"),
            escrowctl: dir.join("escrowctl"),
        })
    }

    /// Builds the binaries of `packages` with cargo in the profile this
    /// binary was built with (a no-op when they are up to date), so
    /// `cargo run -p bench` alone never benchmarks a stale server.
    pub async fn build(packages: &[&str]) -> anyhow::Result<()> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("bench/ sits in the workspace")?;
        let mut command = Command::new(cargo);
        command.current_dir(workspace).arg("build");
        for package in packages {
            command.args(["-p", package]);
        }
        command.arg("--bins");
        if !cfg!(debug_assertions) {
            command.arg("--release");
        }
        let status = command
            .stdout(Stdio::from(std::io::stderr()))
            .status()
            .await
            .context("running cargo build")?;
        anyhow::ensure!(status.success(), "cargo build failed: {status}");
        Ok(())
    }

    /// Fails unless the agent and the baseline server exist.
    pub fn check(&self) -> anyhow::Result<()> {
        Self::check_paths(
            &[&self.agent, &self.server, &self.coordinator],
            &HOT_PATH_PACKAGES,
        )
    }

    /// Fails unless the coordinator and the agent exist.
    pub fn check_cluster(&self) -> anyhow::Result<()> {
        Self::check_paths(&[&self.coordinator, &self.agent], &CLUSTER_PACKAGES)
    }

    fn check_paths(paths: &[&Path], packages: &[&str]) -> anyhow::Result<()> {
        for path in paths {
            anyhow::ensure!(
                path.is_file(),
                "{} not found; build with `cargo build --release -p {}`",
                path.display(),
                packages.join(" -p ")
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a dead child's log is quoted by its error without the
    /// backtrace, or by its last lines when it has no error line.
    #[test]
    fn quotes_the_error_of_a_log() {
        let dir = std::env::temp_dir().join(format!("bench-log-excerpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("child.log");
        std::fs::write(
            &log,
            "INFO started\nError: connecting to the database\n\nCaused by:\n    no such file\n\nStack backtrace:\n   0: main\n",
        )
        .unwrap();
        assert_eq!(
            log_excerpt(&log),
            "Error: connecting to the database\n\nCaused by:\n    no such file"
        );
        std::fs::write(&log, "Error: at once\n").unwrap();
        assert_eq!(log_excerpt(&log), "Error: at once");
        std::fs::write(&log, "INFO one\nINFO two\n").unwrap();
        assert_eq!(log_excerpt(&log), "INFO one\nINFO two");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
