//! The connection between a region agent and the coordinator, in user
//! space: a TCP forwarder on loopback that can make the link long or
//! break it on command.
//!
//! There is no `netem` on the machines this runs on, so distance is a
//! [`Link`] that holds every chunk for half the region's round trip in
//! each direction before passing it on. Each chunk is stamped when it is
//! read and written when its time comes, so a connection keeps its order
//! and its throughput: a second request on the same connection is not
//! delayed behind the first, as on a real long link. Every call between
//! the agent and the coordinator goes through it, the held-open watch
//! calls included, because the agent's `--coordinator-url` is the link's.
//!
//! A test breaks the same link with a [`Fault`]: a black hole (connections
//! accepted, bytes swallowed, nothing ever answered: the link that hangs
//! instead of failing), resets, added delay, in both directions or one,
//! and requests delivered twice. A fault applies to connections already
//! open as well as new ones: every chunk read is judged by the fault in
//! force when it arrives, so a keep-alive connection opened before the
//! fault hangs with the rest.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Largest round trip a link may add, ms.
pub const RTT_MS_MAX: u64 = 10_000;
/// Most bytes read from one side in one chunk.
pub const CHUNK_BYTES_MAX: usize = 64 * 1024;
/// Most chunks of one direction of a connection on their way at once:
/// a reader this far ahead of its writer waits, as a full TCP window does.
pub const CHUNKS_IN_FLIGHT_MAX: usize = 1_024;

/// Round trips between each region and the coordinator, ms, by region
/// name; a region not named talks over plain loopback.
pub type Distances = BTreeMap<String, u64>;

/// Parses `eu=20,us=80,ap=230`.
pub fn parse_distances(text: &str) -> Result<Distances, String> {
    let mut distances = Distances::new();
    for pair in text.split(',').filter(|p| !p.trim().is_empty()) {
        let (name, ms) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?}: expected REGION=MS"))?;
        let ms: u64 = ms.trim().parse().map_err(|e| format!("{pair:?}: {e}"))?;
        if ms > RTT_MS_MAX {
            return Err(format!("{pair:?}: at most {RTT_MS_MAX} ms"));
        }
        if distances.insert(name.trim().to_owned(), ms).is_some() {
            return Err(format!("{name:?} named twice"));
        }
    }
    Ok(distances)
}

/// What a link does to the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Carries everything at once.
    Pass,
    /// Accepts connections and reads every byte, but forwards nothing in
    /// the faulty direction: the peer waits until its own timeout.
    BlackHole(Direction),
    /// Closes every connection, open or new, as soon as it carries a byte.
    Reset,
    /// Carries every chunk this long after it was read, in each direction
    /// (half a round trip).
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

/// A link listening on loopback, forwarding to one upstream address.
/// Stops when dropped.
#[derive(Debug)]
pub struct Link {
    /// Where clients connect.
    pub addr: SocketAddr,
    fault: Arc<Mutex<Fault>>,
    duplicated: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl Link {
    /// A link to `upstream` adding `rtt` to every round trip (none: it
    /// passes everything at once) until told otherwise.
    pub async fn start(upstream: SocketAddr, rtt: Duration) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding a link")?;
        let addr = listener.local_addr()?;
        let first = if rtt.is_zero() {
            Fault::Pass
        } else {
            Fault::Delay(rtt / 2)
        };
        let fault = Arc::new(Mutex::new(first));
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
                        carry(
                            client_read,
                            server_write,
                            fault.clone(),
                            Some((upstream, copies))
                        ),
                        carry(server_read, client_write, fault, None),
                    );
                });
            }
        });
        Ok(Self {
            addr,
            fault,
            duplicated,
            accept,
        })
    }

    /// `http://` and the link's address.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Chunks of requests delivered a second time by [`Fault::Duplicate`].
    pub fn duplicated(&self) -> u64 {
        self.duplicated.load(Ordering::Relaxed)
    }

    /// Puts `fault` in force, for open connections and new ones.
    pub fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap_or_else(|e| e.into_inner()) = fault;
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One direction of a connection: chunks are read as they come, judged
/// by the fault in force when each arrives, and written when their time
/// comes, in order. A closed end (or a reset) closes the other once the
/// chunks before it are delivered. Towards the server, `upstream` is the
/// server, for the twin connection of [`Fault::Duplicate`], and its count
/// of copies.
async fn carry(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    fault: Arc<Mutex<Fault>>,
    upstream: Option<(SocketAddr, Arc<AtomicU64>)>,
) {
    let towards_server = upstream.is_some();
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(CHUNKS_IN_FLIGHT_MAX);
    let reader = async move {
        let mut twin: Option<OwnedWriteHalf> = None;
        let mut buf = vec![0u8; CHUNK_BYTES_MAX];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let now = *fault.lock().unwrap_or_else(|e| e.into_inner());
            let mut due = Instant::now();
            match now {
                Fault::Pass => {}
                Fault::BlackHole(direction) if direction.includes(towards_server) => continue,
                Fault::BlackHole(_) => {}
                Fault::Reset => break,
                Fault::Delay(by) => due += by,
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
            if tx.send((due, buf[..n].to_vec())).await.is_err() {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

/// A second connection to `server` whose answers are read and thrown away.
async fn open_twin(server: SocketAddr) -> Option<OwnedWriteHalf> {
    let stream = TcpStream::connect(server).await.ok()?;
    let _ = stream.set_nodelay(true);
    let (mut answers, requests) = stream.into_split();
    tokio::spawn(async move {
        let mut sink = vec![0u8; CHUNK_BYTES_MAX];
        while matches!(answers.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    Some(requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: distances parse as REGION=MS pairs and bad ones are refused.
    #[test]
    fn parses_distances() {
        let d = parse_distances("eu=20,us=80, ap=230").unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(d["ap"], 230);
        assert!(parse_distances("eu").is_err());
        assert!(parse_distances("eu=x").is_err());
        assert!(parse_distances("eu=1,eu=2").is_err());
        assert!(parse_distances("eu=99999").is_err());
        assert!(parse_distances("").unwrap().is_empty());
    }

    /// An echo server on loopback for one connection.
    async fn echo() -> SocketAddr {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.unwrap();
            let mut buf = vec![0u8; 1024];
            loop {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                s.write_all(&buf[..n]).await.unwrap();
            }
        });
        upstream
    }

    /// Goal: a link delivers every byte in order, and two requests sent
    /// back to back on one connection both arrive one delay later, not
    /// one after the other (the delay is latency, not a throughput cap).
    #[tokio::test]
    async fn carries_in_order_with_latency_not_serialisation() {
        let link = Link::start(echo().await, Duration::from_millis(200))
            .await
            .unwrap();
        let mut c = TcpStream::connect(link.addr).await.unwrap();
        let sent = std::time::Instant::now();
        for i in 0..5u8 {
            c.write_all(&[i]).await.unwrap();
        }
        let mut got = Vec::new();
        while got.len() < 5 {
            let mut buf = [0u8; 16];
            let n = c.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        let took = sent.elapsed();
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(took < Duration::from_millis(5 * 200), "{took:?}");
    }

    /// Goal: a black hole on the answers swallows them on a connection
    /// opened before it, and the same connection carries again once the
    /// link passes; a reset then closes it.
    #[tokio::test]
    async fn faults_apply_to_open_connections() {
        let link = Link::start(echo().await, Duration::ZERO).await.unwrap();
        let mut c = TcpStream::connect(link.addr).await.unwrap();
        let mut buf = [0u8; 16];
        c.write_all(b"a").await.unwrap();
        assert_eq!(c.read(&mut buf).await.unwrap(), 1);

        link.set(Fault::BlackHole(Direction::Answers));
        c.write_all(b"b").await.unwrap();
        let swallowed = tokio::time::timeout(Duration::from_millis(200), c.read(&mut buf)).await;
        assert!(swallowed.is_err(), "the answer was swallowed");

        link.set(Fault::Pass);
        c.write_all(b"c").await.unwrap();
        assert_eq!(c.read(&mut buf).await.unwrap(), 1);
        assert_eq!(buf[0], b'c');

        link.set(Fault::Reset);
        c.write_all(b"d").await.unwrap();
        assert_eq!(c.read(&mut buf).await.unwrap(), 0, "closed by the reset");
    }
}
