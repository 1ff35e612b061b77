//! Distance between a region agent and the coordinator, in user space.
//!
//! There is no `netem` on the machines this runs on, so a [`Link`] is a TCP
//! forwarder that holds every chunk for half the region's round trip in
//! each direction before passing it on. Each chunk is stamped when it is
//! read and written when its time comes, so a connection keeps its order
//! and its throughput: a second request on the same connection is not
//! delayed behind the first, as on a real long link. Every call between
//! the agent and the coordinator goes through it, the held-open watch
//! calls included, because the agent's `--coordinator-url` is the link's.

use std::collections::BTreeMap;
use std::net::SocketAddr;
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

/// A delaying forwarder on loopback to one upstream address; stops when dropped.
#[derive(Debug)]
pub struct Link {
    /// Where the agent connects.
    pub addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl Link {
    /// A link to `upstream` adding `rtt` to every round trip.
    pub async fn start(upstream: SocketAddr, rtt: Duration) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding a delay link")?;
        let addr = listener.local_addr()?;
        let one_way = rtt / 2;
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        carry(client_read, server_write, one_way),
                        carry(server_read, client_write, one_way),
                    );
                });
            }
        });
        Ok(Self { addr, accept })
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One direction of a connection: chunks are read as they come and
/// written `one_way` after they were read, in order. A closed end closes
/// the other once the chunks before it are delivered.
async fn carry(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, one_way: Duration) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + one_way, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
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

    /// Goal: a link delivers every byte in order, and two requests sent
    /// back to back on one connection both arrive one delay later, not
    /// one after the other (the delay is latency, not a throughput cap).
    #[tokio::test]
    async fn carries_in_order_with_latency_not_serialisation() {
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
        let link = Link::start(upstream, Duration::from_millis(200))
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
}
