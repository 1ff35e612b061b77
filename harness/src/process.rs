//! Servers under test, each its own child process.
//!
//! The coordinator, the agents and bench's baselines run as separate
//! processes with their own tokio runtimes, exactly as in production, so
//! no server shares a scheduler or an allocator with the load generator
//! or the test driving it. A child that is not stopped explicitly is
//! killed when its handle drops.
//!
//! A child either shares our terminal (its logs on our stderr, a Ctrl-C
//! reaches it too) or is detached from it (its logs in a file, its own
//! process group): a parent that draws on the terminal, or that stops its
//! children in order on Ctrl-C, detaches them.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hyper::Method;
use tokio::process::{Child, Command};

use crate::client::{self, Bearer};

/// Longest a server may take from spawn to ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often readiness is asked while waiting for it.
pub const READY_POLL_INTERVAL: Duration = Duration::from_millis(50);
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

/// Environment variables set for a child, besides `RUST_LOG` (and
/// `NO_COLOR` when it is detached).
pub type Env = Vec<(String, OsString)>;

/// How to start one server: everything [`ServerProcess::restart`] needs
/// to start it again the same way.
#[derive(Debug, Clone)]
pub struct Launch {
    /// What it is, for messages.
    pub name: String,
    /// The binary.
    pub program: PathBuf,
    /// Its flags; they make it listen on `addr`.
    pub args: Vec<String>,
    /// Its own environment variables.
    pub env: Env,
    /// Where it listens.
    pub addr: SocketAddr,
    /// How it relates to our terminal.
    pub terminal: Terminal,
}

/// A running server.
#[derive(Debug)]
pub struct ServerProcess {
    /// What it is, for messages.
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
    launch: Launch,
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
        Self::launch(Launch {
            name: name.to_owned(),
            program: program.to_owned(),
            args: args.to_vec(),
            env: Env::new(),
            addr,
            terminal: terminal.clone(),
        })
        .await
    }

    /// Starts a server as `launch` says and waits until `GET /readyz`
    /// answers 200; a detached child that exits before that is reported
    /// with the end of its log.
    pub async fn launch(launch: Launch) -> anyhow::Result<Self> {
        let child = spawn_child(&launch)?;
        let mut server = Self {
            name: launch.name.clone(),
            addr: launch.addr,
            launch,
            child,
        };
        if let Err(error) = server.wait_ready().await {
            return Err(match &server.launch.terminal {
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
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("{} exited before it was ready: {status}", self.name);
            }
            if is_ready(self.addr).await {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{} was not ready within {READY_TIMEOUT:?}", self.name);
            }
            tokio::time::sleep(READY_POLL_INTERVAL).await;
        }
    }

    /// The child's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// How the child ended, if it has: read from the kernel's entry of the
    /// process nobody has waited for yet (Linux's `/proc/PID/stat`: state
    /// `Z`, and its exit code), so a test that holds the server by shared
    /// reference can tell a server that died, and how, from one that does
    /// not answer. `None` while it runs.
    pub fn ended(&self) -> Option<String> {
        let Some(pid) = self.child.id() else {
            return Some("was waited for already".into());
        };
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => end_in_stat(&stat),
            Err(_) => Some("left no process entry".into()),
        }
    }

    /// Sends `signal` as `kill` spells it (`-STOP`, `-CONT`, `-TERM`).
    pub async fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self
            .child
            .id()
            .with_context(|| format!("{} has exited", self.name))?;
        // `kill` is POSIX; this crate forbids the unsafe a direct libc call needs.
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .await
            .context("running kill")?;
        anyhow::ensure!(status.success(), "kill {signal} {} failed", self.name);
        Ok(())
    }

    /// Stops it as [`ServerProcess::stop`] does, then starts it again the
    /// same way (same flags, address and database) and waits until it is
    /// ready; an error if it did not drain in time and had to be killed.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        let drained = self.terminate().await?;
        anyhow::ensure!(
            drained,
            "{} did not drain within {STOP_TIMEOUT:?}; it was killed",
            self.name
        );
        let restarted = Box::pin(Self::launch(self.launch.clone())).await?;
        *self = restarted;
        Ok(())
    }

    /// SIGTERM (a graceful drain), then SIGKILL if it takes too long.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if !self.terminate().await? {
            tracing::warn!(name = %self.name, "server did not drain in time; killed it");
        }
        Ok(())
    }

    /// SIGTERM, then SIGKILL after [`STOP_TIMEOUT`]; whether it exited by
    /// itself.
    async fn terminate(&mut self) -> anyhow::Result<bool> {
        if self.child.id().is_some() {
            if let Err(error) = self.signal("-TERM").await {
                tracing::warn!(name = %self.name, %error, "SIGTERM failed");
            }
        }
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(status) => {
                let status: ExitStatus = status?;
                if !status.success() {
                    tracing::warn!(name = %self.name, %status, "server exited unsuccessfully");
                }
                Ok(true)
            }
            Err(_) => {
                self.child.kill().await?;
                Ok(false)
            }
        }
    }
}

/// Whether the server at `addr` answers `GET /readyz` with 200 now.
pub async fn is_ready(addr: SocketAddr) -> bool {
    let Ok(probe) = Bearer::new("probe") else {
        return false;
    };
    matches!(
        client::once(addr, Method::GET, "/readyz", &probe, None).await,
        Ok((status, _)) if status.is_success()
    )
}

/// How a process ended, from its `/proc/PID/stat` line: `None` unless it
/// is a zombie (state `Z`), whose 52nd field is its exit status as
/// waitpid(2) reports it.
fn end_in_stat(stat: &str) -> Option<String> {
    // Fields after the command's closing parenthesis, from the state (3rd) on.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    if fields.first() != Some(&"Z") {
        return None;
    }
    let code: i32 = fields.get(52 - 3)?.parse().ok()?;
    Some(match code & 0x7f {
        0 => format!("exited with status {}", code >> 8),
        signal => format!("was killed by signal {signal}"),
    })
}

/// Spawns the child `launch` describes, without waiting for it.
fn spawn_child(launch: &Launch) -> anyhow::Result<Child> {
    let mut command = Command::new(&launch.program);
    command
        .args(&launch.args)
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let default_level = match &launch.terminal {
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
    command
        .spawn()
        .with_context(|| format!("starting {}", launch.program.display()))
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

/// Where the service binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The directory they are in.
    pub dir: PathBuf,
    /// `region-agent`.
    pub agent: PathBuf,
    /// `coordinator`.
    pub coordinator: PathBuf,
    /// `escrowctl` (never started here; the demo names it for the reader).
    pub escrowctl: PathBuf,
}

/// The packages a cluster runs.
pub const CLUSTER_PACKAGES: [&str; 2] = ["coordinator", "region-agent"];

impl Binaries {
    /// The binaries next to the running executable (the same target
    /// directory and profile; a test's executable sits one level lower,
    /// in `deps/`), or in `dir` if given.
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
            coordinator: dir.join("coordinator"),
            escrowctl: dir.join("escrowctl"),
            dir,
        })
    }

    /// Builds the workspace's binaries with cargo in the profile this
    /// binary was built with (a no-op when they are up to date), so
    /// `cargo run -p bench` alone never benchmarks a stale server. The
    /// whole workspace, as `scripts/test` builds it: a build of a few
    /// packages resolves the dependencies' features differently and
    /// compiles sqlx and the services a second time.
    pub async fn build() -> anyhow::Result<()> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("harness/ sits in the workspace")?;
        let mut command = Command::new(cargo);
        command
            .current_dir(workspace)
            .args(["build", "--workspace", "--bins"]);
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

    /// Fails unless the coordinator and the agent exist.
    pub fn check_cluster(&self) -> anyhow::Result<()> {
        Self::check(&[&self.coordinator, &self.agent], &CLUSTER_PACKAGES)
    }

    /// Fails unless every one of `paths` exists, naming the `packages`
    /// that build them.
    pub fn check(paths: &[&Path], packages: &[&str]) -> anyhow::Result<()> {
        let profile = if cfg!(debug_assertions) {
            ""
        } else {
            "--release "
        };
        for path in paths {
            anyhow::ensure!(
                path.is_file(),
                "{} not found; build with `cargo build {profile}-p {}`",
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
        let dir = std::env::temp_dir().join(format!("harness-log-excerpt-{}", std::process::id()));
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

    /// Goal: a child that died and was not waited for is read as such from
    /// the kernel's entry, with the signal that killed it or its exit
    /// status; a running one as running.
    #[test]
    fn reads_how_an_unwaited_child_ended() {
        let stat = |child: &std::process::Child| {
            std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap()
        };
        let until_ended = |child: &std::process::Child| {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(end) = end_in_stat(&stat(child)) {
                    return end;
                }
                assert!(Instant::now() < deadline, "the child never ended");
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        let mut running = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert_eq!(end_in_stat(&stat(&running)), None);
        running.kill().unwrap();
        assert_eq!(until_ended(&running), "was killed by signal 9");
        running.wait().unwrap();
        let mut failing = std::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .spawn()
            .unwrap();
        assert_eq!(until_ended(&failing), "exited with status 3");
        failing.wait().unwrap();
    }
}
