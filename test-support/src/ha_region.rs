//! One region's highly available database ([`harness::ha_region`]) and
//! the faults a test makes its nodes suffer: each node runs in a process
//! group of its own, on a disk of its own, so one node's machine can die,
//! freeze or lose its disk.

use std::process::{Command, Stdio};
use std::time::Duration;

use harness::ha_region::Formation;
use sqlx::{Connection, PgConnection};

use crate::tools::skip_without;

/// What the test needs of the machine.
pub const TOOL: &str = "pg_auto_failover (apt-get install postgresql-15-auto-failover \
                        pg-auto-failover-cli), PostgreSQL's server binaries, and root \
                        (each node's disk is a loop-mounted ext4 image)";

/// How a test makes a node's machine fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineFault {
    /// Every process of the node killed with -9 ([`HaRegion::kill_node`]).
    Dies,
    /// Every process of the node stopped ([`HaRegion::freeze_node`]).
    Freezes,
    /// The node's disk fails ([`HaRegion::fail_disk`]).
    DiskFails,
}

/// A running formation.
pub struct HaRegion(Formation);

impl HaRegion {
    /// Starts the formation with an empty database `agent`, each node on
    /// a disk of its own (`scripts/ha-region --disks`); `None` (after
    /// [`skip_without`]) where pg_auto_failover is not installed or the
    /// test does not run as root.
    #[track_caller]
    pub fn start_or_skip(what: &str) -> Option<Self> {
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
        if !(Formation::installed() && root) {
            skip_without(TOOL, what);
            return None;
        }
        // pg_auto_failover's formation now and then fails to come up on a
        // loaded machine (a node never reported as secondary), more often
        // when two come up at once: the tests of one binary start theirs
        // one after the other, and a failed start is tried once more on
        // fresh ports and a fresh directory.
        static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one_at_a_time = STARTING.lock().unwrap_or_else(|e| e.into_inner());
        let formation = Formation::start(true).or_else(|why| {
            eprintln!("scripts/ha-region failed ({why:#}); trying once more");
            Formation::start(true)
        });
        Some(Self(formation.unwrap_or_else(|why| panic!("{why:#}"))))
    }

    /// The multi-host URL of the formation's database `agent`.
    pub fn url(&self) -> &str {
        self.0.url()
    }

    /// The multi-host URL of a new, empty database `name` of the
    /// formation, created on its primary.
    pub async fn fresh_database(&self, name: &str) -> String {
        let primary = self.primary().await.expect("the formation has a primary");
        let port = self.node_ports()[primary - 1];
        let mut admin =
            PgConnection::connect(&format!("postgres://postgres@127.0.0.1:{port}/postgres"))
                .await
                .expect("the primary answers");
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await
            .expect("the database is created");
        self.url().replacen("/agent?", &format!("/{name}?"), 1)
    }

    /// The data nodes' ports.
    pub fn node_ports(&self) -> [u16; 3] {
        self.0.node_ports()
    }

    /// The node (1..=3) that is the primary now ([`Formation::primary`]).
    pub async fn primary(&self) -> Option<usize> {
        self.0.primary().await
    }

    /// Whether node `n` (1..=3) is a standby now; `None` if it does not
    /// answer within a second.
    pub async fn in_recovery(&self, n: usize) -> Option<bool> {
        self.0.in_recovery(n).await
    }

    /// The primary's machine fails as `fault` says; waits (up to 90 s)
    /// until the monitor has promoted another node. Answers the failed
    /// node and how long after its failure another node was primary.
    pub async fn fail_primary(&self, fault: MachineFault) -> (usize, Duration) {
        let old = self.primary().await.expect("the formation has a primary");
        let at = std::time::Instant::now();
        self.fail_node(old, fault);
        self.0
            .promotion(old, Duration::from_secs(90))
            .await
            .unwrap_or_else(|why| panic!("{why:#}"));
        (old, at.elapsed())
    }

    /// Node `n`'s machine fails as `fault` says.
    pub fn fail_node(&self, n: usize, fault: MachineFault) {
        match fault {
            MachineFault::Dies => self.kill_node(n),
            MachineFault::Freezes => self.freeze_node(n),
            MachineFault::DiskFails => self.fail_disk(n),
        }
    }

    /// Node `n`, failed by `fault`, comes back (started again, thawed,
    /// or, after its disk failed, replaced by a new node on a fresh disk);
    /// waits (up to 120 s) until it has rejoined as a standby.
    pub async fn mend_node(&self, n: usize, fault: MachineFault) {
        match fault {
            MachineFault::Dies => self.restart_node(n),
            MachineFault::Freezes => self.thaw_node(n),
            MachineFault::DiskFails => self.replace_node(n),
        }
        crate::eventually(
            "the old primary rejoins as a standby",
            Duration::from_secs(120),
            async || self.in_recovery(n).await == Some(true),
        )
        .await;
    }

    /// Node `n`'s machine comes back: its keeper starts again on its old
    /// data (`scripts/ha-region --restart`); the monitor decides its role.
    pub fn restart_node(&self, n: usize) {
        self.on_node("--restart", n);
    }

    /// Node `n`'s disk fails (`scripts/ha-region --fail-disk`): the kernel
    /// records an ext4 error and remounts it read-only, so every write
    /// PostgreSQL makes on it fails from then on.
    pub fn fail_disk(&self, n: usize) {
        self.on_node("--fail-disk", n);
    }

    /// Node `n` is replaced as the runbook says (`scripts/ha-region
    /// --replace`): dropped from the formation, and a new node on a fresh
    /// disk clones the primary; returns once it is a standby.
    pub fn replace_node(&self, n: usize) {
        self.on_node("--replace", n);
    }

    /// Runs `scripts/ha-region --dir DIR ACTION n`.
    fn on_node(&self, action: &str, n: usize) {
        self.0
            .on_node(action, n)
            .unwrap_or_else(|why| panic!("{why:#}"));
    }

    /// Node `n`'s machine dies: its keeper and its PostgreSQL, the whole
    /// process group, are killed with SIGKILL. No shutdown, no checkpoint.
    pub fn kill_node(&self, n: usize) {
        self.signal_node(n, "-KILL");
    }

    /// Node `n`'s machine freezes: every process of the node (its keeper,
    /// its postmaster and the postmaster's children, which PostgreSQL puts
    /// in sessions of their own) is stopped with SIGSTOP, parents first.
    /// Its sockets stay open and the kernel still accepts connections for
    /// it, but nothing answers.
    pub fn freeze_node(&self, n: usize) {
        self.signal_node(n, "-STOP");
        signal(&self.node_processes(n), "-STOP");
    }

    /// Node `n`'s frozen machine runs again (SIGCONT to every process).
    pub fn thaw_node(&self, n: usize) {
        self.signal_node(n, "-CONT");
        signal(&self.node_processes(n), "-CONT");
    }

    fn signal_node(&self, n: usize, signal: &str) {
        self.0
            .signal_node(n, signal)
            .unwrap_or_else(|why| panic!("{why:#}"));
    }

    /// Node `n`'s process group and every descendant of its members, each
    /// listed after its parent.
    fn node_processes(&self, n: usize) -> Vec<u32> {
        let group = self.0.node_group(n).unwrap_or_else(|why| panic!("{why:#}"));
        let ps = Command::new("ps")
            .args(["-eo", "pid=,ppid=,pgid="])
            .output()
            .expect("ps runs");
        let table: Vec<[u32; 3]> = String::from_utf8_lossy(&ps.stdout)
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace().map(|f| f.parse().ok());
                Some([fields.next()??, fields.next()??, fields.next()??])
            })
            .collect();
        let mut pids: Vec<u32> = table
            .iter()
            .filter(|[_, _, pgid]| *pgid == group)
            .map(|[pid, _, _]| *pid)
            .collect();
        let mut i = 0;
        while i < pids.len() {
            let parent = pids[i];
            for [pid, ppid, _] in &table {
                if *ppid == parent && !pids.contains(pid) {
                    pids.push(*pid);
                }
            }
            i += 1;
        }
        pids
    }
}

/// Sends `signal` (as `kill` spells it) to every process of `pids` that
/// still exists (a backend may have exited since it was listed).
fn signal(pids: &[u32], signal: &str) {
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let _ = Command::new("kill")
        .arg(signal)
        .args(&pids)
        .stderr(Stdio::null())
        .status()
        .expect("kill runs");
}
