//! A throwaway PostgreSQL server a test owns: its own data directory and
//! port, so the test can restart it under load without touching the
//! machine's server. Run as root, its commands run as the `postgres` user
//! (PostgreSQL refuses to run as root).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::process::free_port;
use crate::tools::{required, skip_without, REQUIRE_POSTGRES};

/// A PostgreSQL server in a temporary directory, stopped and removed on
/// drop.
pub struct PgServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl PgServer {
    /// Initialises and starts a new server with trust authentication for
    /// user `postgres` on loopback; `None` if PostgreSQL's server binaries
    /// are not installed (see [`PgServer::start_or_skip`]).
    pub fn start() -> Option<Self> {
        let server = Self::with_dir(server_binaries()?);
        server.run(
            "initdb",
            &[
                "-D",
                &server.data(),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
            ],
        );
        server.pg_ctl(&["start"]);
        Some(server)
    }

    /// A server not yet initialised: a new directory (owned by `postgres`
    /// when run as root) and a free port.
    fn with_dir(bin: PathBuf) -> Self {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "escrow-pg-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            let owner = Command::new("chown")
                .args(["postgres:postgres", &dir.display().to_string()])
                .status()
                .unwrap();
            assert!(owner.success(), "chown of the data directory failed");
        }
        Self {
            bin,
            dir,
            port: free_port(),
        }
    }

    /// As [`PgServer::start`], for a test that skips `what` without the
    /// binaries ([`crate::tools::skip_without`]); it is PostgreSQL, so
    /// `ESCROW_REQUIRE_POSTGRES` fails the test then too.
    #[track_caller]
    pub fn start_or_skip(what: &str) -> Option<Self> {
        let server = Self::start();
        if server.is_none() {
            let tool = "PostgreSQL's server binaries (apt-get install postgresql, or set PG_BIN)";
            assert!(
                !required(REQUIRE_POSTGRES),
                "{REQUIRE_POSTGRES} is set and {what} needs {tool}, missing here"
            );
            skip_without(tool, what);
        }
        server
    }

    /// Starts a streaming standby of `primary` (a base backup of it that
    /// follows its write-ahead log), on a port of its own.
    pub fn start_standby_of(primary: &PgServer) -> Self {
        let server = Self::with_dir(primary.bin.clone());
        server.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port.to_string(),
                "-U",
                "postgres",
                "-D",
                &server.data(),
                "-R",
                "-X",
                "stream",
                "--checkpoint=fast",
            ],
        );
        server.pg_ctl(&["start"]);
        server
    }

    /// Makes every commit on this server wait until a standby has it
    /// (`synchronous_standby_names = '*'`), as a region's HA setup does.
    pub fn require_synchronous_standby(&self) {
        self.run(
            "psql",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-c",
                "ALTER SYSTEM SET synchronous_standby_names = '*'",
                "-c",
                "SELECT pg_reload_conf()",
            ],
        );
    }

    /// Kills the server's postmaster with SIGKILL, as a machine that dies
    /// would: no shutdown, no checkpoint; its backends exit on their own.
    pub fn kill_postmaster(&self) {
        let pid_file = self.dir.join("data").join("postmaster.pid");
        let pids = std::fs::read_to_string(&pid_file).unwrap();
        let pid = pids.lines().next().unwrap().trim().to_owned();
        let killed = Command::new("kill").args(["-9", &pid]).status().unwrap();
        assert!(killed.success(), "kill -9 {pid} failed");
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`): a standby
    /// stopped so stops confirming its primary's commits.
    pub fn stop_immediate(&self) {
        self.pg_ctl(&["stop", "-m", "immediate"]);
    }

    /// Starts the server again after [`PgServer::stop_immediate`].
    pub fn start_again(&self) {
        self.pg_ctl(&["start"]);
    }

    /// Promotes this standby to a primary and waits until it is one.
    pub fn promote(&self) {
        self.pg_ctl(&["promote"]);
    }

    /// The port the server listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT`, the server without a database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.port)
    }

    /// Restarts the server with a fast shutdown: every connection is cut,
    /// transactions in flight roll back, committed ones stay.
    pub fn restart_fast(&self) {
        self.pg_ctl(&["restart", "-m", "fast"]);
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn pg_ctl(&self, action: &[&str]) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("server.log").display().to_string();
        let data = self.data();
        let mut args = vec!["-D", &data, "-w", "-l", &log, "-o", &options];
        args.extend_from_slice(action);
        self.run("pg_ctl", &args);
    }

    fn run(&self, program: &str, args: &[&str]) {
        let program = self.bin.join(program);
        let mut cmd = if is_root() {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(&program);
            cmd
        } else {
            Command::new(&program)
        };
        let out = cmd.args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{} {args:?} failed: {}{}",
            program.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let program = self.bin.join("pg_ctl");
        let data = self.data();
        let args = ["-D", data.as_str(), "-m", "immediate", "stop"];
        let _ = if is_root() {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&program)
                .args(args)
                .output()
        } else {
            Command::new(&program).args(args).output()
        };
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The directory of `initdb` and `pg_ctl`: `PG_BIN` if set, else the
/// newest `/usr/lib/postgresql/*/bin` (Debian's layout).
fn server_binaries() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_ctl").exists())
        .collect();
    found.sort_by_key(|p| version_of(p));
    found.pop()
}

fn version_of(bin: &Path) -> u32 {
    bin.parent()
        .and_then(|p| p.file_name())
        .and_then(|v| v.to_str())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn is_root() -> bool {
    // The effective uid, as `id -u` prints it.
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
