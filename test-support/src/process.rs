//! Services run as child processes, and what the kernel shows of their
//! sockets: tests that kill or signal a real binary wait on these
//! conditions rather than on a guessed sleep.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};

use harness::process::{free_addr, is_ready, Binaries, READY_TIMEOUT};

use crate::api::{Api, ACME_KEY, ADMIN};
use crate::poll::eventually;

/// A workspace binary built next to the running test
/// (`cargo build --workspace --bins`).
pub fn binary(name: &str) -> PathBuf {
    let path = Binaries::locate(None).unwrap().dir.join(name);
    assert!(
        path.exists(),
        "{} missing: run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}

/// The command line of a service `program` with the flags every service
/// takes: listening on loopback `port`, storing in `database_url`, admin
/// token [`ADMIN`]. The caller adds the service's own flags.
pub fn service(program: impl AsRef<OsStr>, port: u16, database_url: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--database-url", database_url])
        .args(["--admin-token", ADMIN]);
    cmd
}

/// A standalone region agent `eu` (the binary `agent_exe`) on
/// `database_url`, once ready selling tenant acme's SKU `drop` of 100,000
/// units: the start of the database failover tests.
pub async fn selling_agent(agent_exe: &str, database_url: &str) -> (Proc, Api) {
    let port = free_port();
    let agent = Proc::spawn(service(agent_exe, port, database_url).args([
        "--region",
        "eu",
        "--tenant-key",
        &format!("acme={ACME_KEY}"),
    ]));
    let api = Api::new(&format!("http://127.0.0.1:{port}"));
    wait_ready(&api.url).await;
    let (status, body) = api
        .put_sku("acme", "drop", serde_json::json!({"total": 100_000}))
        .await;
    assert!(status.is_success(), "{status}: {body}");
    (agent, api)
}

/// A loopback port free right now.
pub fn free_port() -> u16 {
    free_addr().unwrap().port()
}

/// Waits until the service at `url` (`http://host:port`) answers
/// `/readyz` with 200.
pub async fn wait_ready(url: &str) {
    let addr: SocketAddr = url
        .strip_prefix("http://")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("{url} is not http://host:port"));
    eventually("/readyz", READY_TIMEOUT, async || is_ready(addr).await).await;
}

/// A child process, killed on drop. It logs warnings and errors to the
/// test's stderr (unless `RUST_LOG` says otherwise) and nothing to stdout.
pub struct Proc(pub Child);

impl Proc {
    /// Spawns `cmd`.
    pub fn spawn(cmd: &mut Command) -> Self {
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        Self(
            cmd.stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap(),
        )
    }

    /// Sends `signal` (as `kill` spells it: `-TERM`, `-KILL`).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} failed");
    }

    /// Its exit status if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.0.try_wait().unwrap()
    }

    /// Kills it with SIGKILL and reaps it.
    pub fn kill9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One IPv4 TCP socket as `/proc/net/tcp` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Socket {
    /// Its own port.
    pub local_port: u16,
    /// The peer's port.
    pub remote_port: u16,
    /// The kernel's state number (1 established, 8 close-wait, 10 listen).
    pub state: u8,
    /// Bytes written and not yet acknowledged by the peer.
    pub tx_queue: u64,
    /// Bytes received and not yet read by the owning process.
    pub rx_queue: u64,
}

/// `ESTABLISHED` in [`Socket::state`].
pub const ESTABLISHED: u8 = 1;
/// `CLOSE_WAIT` in [`Socket::state`]: the peer closed, the owner has not.
pub const CLOSE_WAIT: u8 = 8;

/// Every IPv4 TCP socket of this network namespace (every process's).
pub fn sockets() -> Vec<Socket> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port =
        |address: &str| u16::from_str_radix(address.rsplit(':').next().unwrap(), 16).unwrap();
    table
        .lines()
        .skip(1)
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (tx, rx) = fields[4].split_once(':').unwrap();
            Socket {
                local_port: port(fields[1]),
                remote_port: port(fields[2]),
                state: u8::from_str_radix(fields[3], 16).unwrap(),
                tx_queue: u64::from_str_radix(tx, 16).unwrap(),
                rx_queue: u64::from_str_radix(rx, 16).unwrap(),
            }
        })
        .collect()
}

/// Whether the server on `server_port` has read every byte sent to it on
/// the connections from `client_ports`: each client socket's bytes were
/// acknowledged and each server socket has nothing left unread.
pub fn all_read(server_port: u16, client_ports: &[u16]) -> bool {
    let all = sockets();
    client_ports.iter().all(|&client| {
        let sent = all
            .iter()
            .any(|s| s.local_port == client && s.remote_port == server_port && s.tx_queue == 0);
        let read = all.iter().any(|s| {
            s.local_port == server_port
                && s.remote_port == client
                && s.state == ESTABLISHED
                && s.rx_queue == 0
        });
        sent && read
    })
}

/// Whether the server on `server_port` has closed its end of the
/// connection from `client_port` (after the client closed its own).
pub fn server_closed(server_port: u16, client_port: u16) -> bool {
    !sockets().iter().any(|s| {
        s.local_port == server_port
            && s.remote_port == client_port
            && matches!(s.state, ESTABLISHED | CLOSE_WAIT)
    })
}
