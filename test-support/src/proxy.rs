//! A TCP proxy a test puts between two processes to break the link between
//! them on command: a black hole (connections accepted, bytes swallowed,
//! nothing ever answered: the link that hangs instead of failing), resets,
//! added delay, in both directions or one, and requests delivered twice.
//!
//! A fault applies to connections already open as well as new ones: every
//! chunk read is judged by the fault in force when it arrives, so a
//! keep-alive connection opened before the fault hangs with the rest.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the proxy does to the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Carries everything at once.
    Pass,
    /// Accepts connections and reads every byte, but forwards nothing in
    /// the faulty direction: the peer waits until its own timeout.
    BlackHole(Direction),
    /// Closes every connection, open or new, as soon as it carries a byte.
    Reset,
    /// Holds every chunk this long before forwarding it.
    Delay(Duration),
    /// Delivers every request twice: on its connection, and again on a
    /// twin connection to the server whose answers are thrown away (as a
    /// proxy that retries, or a duplicated stream): the server acts on
    /// both, the client hears one answer.
    Duplicate,
}

/// Which way a fault applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to server and back.
    Both,
    /// Only requests (client to server): the server never hears them.
    Requests,
    /// Only answers (server to client): the server acts, the client never
    /// learns of it.
    Answers,
}

impl Direction {
    fn includes(self, towards_server: bool) -> bool {
        match self {
            Self::Both => true,
            Self::Requests => towards_server,
            Self::Answers => !towards_server,
        }
    }
}

/// A proxy listening on loopback, forwarding to one upstream address.
/// Stops when dropped.
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    fault: Arc<Mutex<Fault>>,
    duplicated: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// A proxy to `upstream`, passing everything until told otherwise.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let fault = Arc::new(Mutex::new(Fault::Pass));
        let duplicated = Arc::new(AtomicU64::new(0));
        let (shared, copies) = (fault.clone(), duplicated.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (fault, copies) = (shared.clone(), copies.clone());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pump(
                            client_read,
                            server_write,
                            fault.clone(),
                            Some((upstream, copies))
                        ),
                        pump(server_read, client_write, fault, None),
                    );
                });
            }
        });
        Self {
            addr,
            fault,
            duplicated,
            accept,
        }
    }

    /// `http://` and the proxy's address.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Chunks of requests delivered a second time by [`Fault::Duplicate`].
    pub fn duplicated(&self) -> u64 {
        self.duplicated.load(Ordering::Relaxed)
    }

    /// Puts `fault` in force, for open connections and new ones.
    pub fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap() = fault;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Carries one direction of a connection, judging every chunk by the fault
/// in force when it arrives. Towards the server, `upstream` is the server,
/// for the twin connection of [`Fault::Duplicate`], and its count of copies.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    fault: Arc<Mutex<Fault>>,
    upstream: Option<(SocketAddr, Arc<AtomicU64>)>,
) {
    let towards_server = upstream.is_some();
    let mut twin: Option<OwnedWriteHalf> = None;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let now = *fault.lock().unwrap();
        match now {
            Fault::Pass => {}
            Fault::BlackHole(direction) if direction.includes(towards_server) => continue,
            Fault::BlackHole(_) => {}
            Fault::Reset => break,
            Fault::Delay(by) => tokio::time::sleep(by).await,
            Fault::Duplicate => {
                if let Some((server, copies)) = &upstream {
                    if twin.is_none() {
                        twin = open_twin(*server).await;
                    }
                    if let Some(copy) = twin.as_mut() {
                        match copy.write_all(&buf[..n]).await {
                            Ok(()) => _ = copies.fetch_add(1, Ordering::Relaxed),
                            Err(_) => twin = None,
                        }
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// A second connection to `server` whose answers are read and thrown away.
async fn open_twin(server: SocketAddr) -> Option<OwnedWriteHalf> {
    let stream = TcpStream::connect(server).await.ok()?;
    let _ = stream.set_nodelay(true);
    let (mut answers, requests) = stream.into_split();
    tokio::spawn(async move {
        let mut sink = vec![0u8; 16 * 1024];
        while matches!(answers.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    Some(requests)
}
