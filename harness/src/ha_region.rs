//! One region's highly available database, as `scripts/ha-region` starts
//! it: a pg_auto_failover monitor and three PostgreSQL nodes (a primary,
//! two standbys, every commit confirmed by one of them) on loopback ports.
//! Stopped (the script's SIGTERM path) and its directory removed on drop.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use sqlx::{Connection, PgConnection};

use crate::process::free_addr;

/// Longest the formation may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(240);

/// A running formation.
pub struct Formation {
    script: Child,
    dir: PathBuf,
    base: u16,
    url: String,
}

impl Formation {
    /// Whether `pg_autoctl` (Debian: `postgresql-15-auto-failover`,
    /// `pg-auto-failover-cli`) is installed.
    pub fn installed() -> bool {
        Command::new("pg_autoctl")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts a formation on fresh ports and a fresh directory, with an
    /// empty database `agent`; with `disks`, each node on a disk of its
    /// own (`--disks`: root only). The script's output goes to our stderr.
    pub fn start(disks: bool) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "escrow-ha-{}-{}",
            std::process::id(),
            free_addr()?.port()
        ));
        let base = four_free_ports()?;
        let mut args = vec![
            "--dir".to_owned(),
            dir.display().to_string(),
            "--port".to_owned(),
            base.to_string(),
        ];
        if disks {
            args.push("--disks".to_owned());
        }
        let mut child = Command::new(script())
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting scripts/ha-region")?;
        let stdout = child.stdout.take().context("the script's stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("{line}");
                if let Some(url) = line.strip_prefix("ha-region: ready: ") {
                    let _ = tx.send(url.to_owned());
                }
            }
        });
        let formation = |url| Self {
            script: child,
            dir,
            base,
            url,
        };
        match rx.recv_timeout(START_TIMEOUT) {
            Ok(url) => Ok(formation(url)),
            Err(e) => {
                // Dropped: the script stops, and the directory is removed.
                drop(formation(String::new()));
                anyhow::bail!(
                    "scripts/ha-region did not print its URL ({e}: it stopped, or took over {START_TIMEOUT:?}); its output is above"
                )
            }
        }
    }

    /// The multi-host URL of the formation's database `agent`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The directory of the nodes' data, logs and process groups.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data nodes' ports.
    pub fn node_ports(&self) -> [u16; 3] {
        [self.base + 1, self.base + 2, self.base + 3]
    }

    /// The node (1..=3) that is the primary now, by asking each node: out
    /// of recovery and taking writes (a promoted standby is out of recovery
    /// a moment before its sessions stop being read-only).
    pub async fn primary(&self) -> Option<usize> {
        for n in 1..=3 {
            if self.takes_writes(n).await {
                return Some(n);
            }
        }
        None
    }

    /// Whether node `n` (1..=3) answers, out of recovery and with
    /// sessions that are not read-only.
    async fn takes_writes(&self, n: usize) -> bool {
        let writes = "SELECT NOT pg_is_in_recovery() \
                      AND NOT current_setting('transaction_read_only')::bool";
        self.ask(n, writes).await == Some(true)
    }

    /// Waits until a node other than `old` is the primary (asked every
    /// 100 ms); fails once `within` has passed.
    pub async fn promotion(&self, old: usize, within: Duration) -> anyhow::Result<()> {
        let asked = async {
            while self.primary().await.is_none_or(|p| p == old) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(within, asked).await.map_err(|_| {
            anyhow::anyhow!("no node but node{old} became the primary within {within:?}")
        })
    }

    /// Whether node `n` (1..=3) is a standby now; `None` if it does not
    /// answer within a second.
    pub async fn in_recovery(&self, n: usize) -> Option<bool> {
        self.ask(n, "SELECT pg_is_in_recovery()").await
    }

    /// Node `n`'s answer to `query` (one boolean); `None` if it does not
    /// answer within a second.
    async fn ask(&self, n: usize, query: &str) -> Option<bool> {
        let port = self.node_ports()[n - 1];
        let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        let ask = async {
            let mut conn = PgConnection::connect(&url).await.ok()?;
            sqlx::query_scalar(query).fetch_one(&mut conn).await.ok()
        };
        tokio::time::timeout(Duration::from_secs(1), ask)
            .await
            .ok()
            .flatten()
    }

    /// Node `n`'s process group (its keeper and PostgreSQL's postmaster),
    /// as `DIR/nodeN.pid` says.
    pub fn node_group(&self, n: usize) -> anyhow::Result<u32> {
        let file = self.dir.join(format!("node{n}.pid"));
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        text.trim()
            .parse()
            .with_context(|| format!("{}: not a process group id", file.display()))
    }

    /// Sends `signal` (as `kill` spells it: `-KILL`) to node `n`'s process
    /// group. `-KILL` is its machine dying: no shutdown, no checkpoint.
    pub fn signal_node(&self, n: usize, signal: &str) -> anyhow::Result<()> {
        let group = self.node_group(n)?;
        let sent = Command::new("kill")
            .args([signal, "--", &format!("-{group}")])
            .status()
            .context("running kill")?;
        anyhow::ensure!(
            sent.success(),
            "kill {signal} of node{n}'s process group failed"
        );
        Ok(())
    }

    /// Runs `scripts/ha-region --dir DIR ACTION n` (`--restart`,
    /// `--replace`, `--fail-disk`) on node `n` and waits for it.
    pub fn on_node(&self, action: &str, n: usize) -> anyhow::Result<()> {
        let done = Command::new(script())
            .args(["--dir", &self.dir.display().to_string(), action])
            .arg(n.to_string())
            .status()
            .context("running scripts/ha-region")?;
        anyhow::ensure!(done.success(), "scripts/ha-region {action} {n} failed");
        Ok(())
    }
}

impl Drop for Formation {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.script.id().to_string()])
            .status();
        let _ = self.script.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port that is free with the three above it (the monitor's and the
/// nodes'), below the kernel's ephemeral range: a port the kernel may hand
/// to any outgoing connection (the tests make thousands) can be taken
/// between our check and the node's start half a minute later, and the
/// node then never listens (a standby "failed to connect" to its primary).
fn four_free_ports() -> anyhow::Result<u16> {
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let (low, high) = (10_000u16, ephemeral_from.saturating_sub(4));
    anyhow::ensure!(
        low < high,
        "no ports below the ephemeral range from {ephemeral_from}"
    );
    // Start where this process and this moment say, so that formations of
    // parallel test binaries do not all try the same ports first.
    let seed = std::process::id()
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .subsec_nanos();
    let span = u32::from(high - low);
    (0..span)
        .map(|i| low + ((seed.wrapping_add(i.wrapping_mul(4))) % span) as u16)
        .find(|&base| (0..4).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()))
        .context("no four free ports below the ephemeral range")
}

/// `scripts/ha-region`.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ha-region")
}
