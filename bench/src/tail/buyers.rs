//! The crowd of one sale: every buyer arrives at its time, asks its
//! region's agent for a hold, and retries as a browser would.
//!
//! Each buyer has one request key and one user id for its whole life, so
//! a retry after a 503 is the same request again (the contract makes that
//! safe). A 503 is retried after `Retry-After` (or the buyer's own wait)
//! until the buyer's patience runs out; HELD or SOLD_OUT ends it. At most
//! `in_flight` requests are on the wire at once, over keep-alive
//! connections pooled per agent (a waiting buyer holds no connection), so
//! a crowd of 200,000 needs no more sockets than requests in flight.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use tokio::sync::Semaphore;

use super::sampler::Origin;
use super::shape::{Arrival, Patience, Sale};
use super::SKU;
use crate::client::{Answer, Bearer, Conn};
use crate::outcome::{Outcome, Tally};
use crate::TENANT_KEY;

/// Most requests in flight `--in-flight` accepts.
pub const IN_FLIGHT_MAX: usize = 10_000;

/// Where and how the crowd buys.
#[derive(Debug, Clone)]
pub struct Crowd {
    /// One agent per region, in the sale's region order.
    pub agents: Vec<SocketAddr>,
    /// Most requests in flight at once.
    pub in_flight: usize,
    /// Makes the run's request keys unique.
    pub run_id: String,
}

/// How a buyer's story ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// HELD (or a REPLAY of its own hold).
    Held,
    /// SOLD_OUT, and no more retries.
    SoldOut,
    /// Out of patience on 503s (or broken connections).
    GaveUp,
    /// An answer no buyer should get here (4xx other than SOLD_OUT).
    Refused(Outcome),
}

/// One buyer's story.
#[derive(Debug, Clone)]
pub struct BuyerLog {
    /// Index of its region.
    pub region: u8,
    /// Units it asked for.
    pub qty: u32,
    /// When it arrived (its time in the sale), microseconds after the start.
    pub arrived_us: i64,
    /// When its first request left (it may wait for an in-flight slot).
    pub first_sent_us: i64,
    /// When its last answer came.
    pub ended_us: i64,
    /// How it ended.
    pub end: End,
    /// Every answer it got.
    pub answers: Tally,
}

/// Idle keep-alive connections to one agent.
struct Pool {
    addr: SocketAddr,
    idle: Mutex<Vec<Conn>>,
}

impl Pool {
    fn take(&self) -> Option<Conn> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn give_back(&self, conn: Conn) {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(conn);
    }

    /// Posts on an idle connection (or a new one); `None` without an answer.
    async fn post(&self, path: &str, bearer: &Bearer, body: Bytes) -> Option<Answer> {
        let mut conn = match self.take() {
            Some(conn) => conn,
            None => Conn::connect(self.addr).await.ok()?,
        };
        match conn
            .exchange(hyper::Method::POST, path, bearer, Some(body))
            .await
        {
            Ok(answer) => {
                self.give_back(conn);
                Some(answer)
            }
            Err(error) => {
                tracing::debug!(%error, "reserve failed; connection dropped");
                None
            }
        }
    }
}

struct Shared {
    pools: Vec<Pool>,
    in_flight: Semaphore,
    bearer: Bearer,
    origin: Origin,
    run_id: String,
}

/// Runs the sale's crowd from `origin` (the sale's start) until every
/// buyer's story has ended; one log per buyer, in arrival order.
pub async fn run(crowd: Crowd, sale: &Sale, origin: Origin) -> anyhow::Result<Vec<BuyerLog>> {
    anyhow::ensure!(
        (1..=IN_FLIGHT_MAX).contains(&crowd.in_flight),
        "--in-flight must be 1..={IN_FLIGHT_MAX}"
    );
    anyhow::ensure!(
        crowd.agents.len() == sale.regions.len(),
        "one agent per region"
    );
    let shared = Arc::new(Shared {
        pools: crowd
            .agents
            .iter()
            .map(|&addr| Pool {
                addr,
                idle: Mutex::new(Vec::new()),
            })
            .collect(),
        in_flight: Semaphore::new(crowd.in_flight),
        bearer: Bearer::new(TENANT_KEY)?,
        origin,
        run_id: crowd.run_id,
    });
    let mut tasks = Vec::with_capacity(sale.arrivals.len());
    for (index, &arrival) in sale.arrivals.iter().enumerate() {
        anyhow::ensure!(
            usize::from(arrival.region) < sale.regions.len(),
            "arrival in an unknown region"
        );
        let patience = *sale
            .patience
            .get(usize::from(arrival.patience))
            .context("arrival with an unknown patience")?;
        let at = origin.instant(arrival.at.as_micros() as u64);
        if at > std::time::Instant::now() {
            tokio::time::sleep_until(at.into()).await;
        }
        let shared = shared.clone();
        tasks.push(tokio::spawn(buyer(shared, index, arrival, patience)));
    }
    let mut logs = Vec::with_capacity(tasks.len());
    for task in tasks {
        logs.push(task.await.context("buyer task panicked")?);
    }
    Ok(logs)
}

/// Whether a REPLAY's reservation is a hold (the buyer's own, from an
/// earlier attempt whose answer was lost).
fn replays_a_hold(body: &[u8]) -> bool {
    let needle = br#""status":"HELD""#;
    body.windows(needle.len()).any(|w| w == needle)
}

async fn buyer(
    shared: Arc<Shared>,
    index: usize,
    arrival: Arrival,
    patience: Patience,
) -> BuyerLog {
    let key = format!("{}-{index}", shared.run_id);
    let body = Bytes::from(format!(
        r#"{{"request_key":"{key}","user_id":"u{key}","sku":"{SKU}","qty":{}}}"#,
        arrival.qty
    ));
    let pool = &shared.pools[usize::from(arrival.region)];
    let mut answers = Tally::default();
    let mut first_sent_us = None;
    let mut retries = 0u32;
    let (end, ended_us) = loop {
        let permit = shared.in_flight.acquire().await;
        let sent_us = shared.origin.now_us();
        let first = *first_sent_us.get_or_insert(sent_us);
        let answer = pool
            .post("/v1/reservations", &shared.bearer, body.clone())
            .await;
        drop(permit);
        let now_us = shared.origin.now_us();
        let (outcome, retry_after) = match &answer {
            Some(a) => (Outcome::of_reserve(a.status, &a.body), a.retry_after),
            None => (Outcome::Transport, None),
        };
        answers.add(outcome);
        let retry = match outcome {
            Outcome::Held => break (End::Held, now_us),
            Outcome::Replay if answer.as_ref().is_some_and(|a| replays_a_hold(&a.body)) => {
                break (End::Held, now_us)
            }
            Outcome::SoldOut if !patience.retry_sold_out => break (End::SoldOut, now_us),
            Outcome::SoldOut
            | Outcome::Paused
            | Outcome::QueueFull
            | Outcome::WaitTimeout
            | Outcome::ServerError
            | Outcome::Transport => outcome,
            other => break (End::Refused(other), now_us),
        };
        let wait = if patience.fixed_wait {
            patience.wait
        } else {
            retry_after.unwrap_or(patience.wait)
        };
        let retry_at_us =
            now_us.saturating_add(i64::try_from(wait.as_micros()).unwrap_or(i64::MAX));
        let retrying_for = Duration::from_micros(u64::try_from(retry_at_us - first).unwrap_or(0));
        if patience.retries_max.is_some_and(|m| retries >= m)
            || retrying_for > patience.retrying_max
        {
            let end = if retry == Outcome::SoldOut {
                End::SoldOut
            } else {
                End::GaveUp
            };
            break (end, now_us);
        }
        retries += 1;
        tokio::time::sleep(wait).await;
    };
    BuyerLog {
        region: arrival.region,
        qty: arrival.qty,
        arrived_us: i64::try_from(arrival.at.as_micros()).unwrap_or(i64::MAX),
        first_sent_us: first_sent_us.unwrap_or(ended_us),
        ended_us,
        end,
        answers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: only a replayed reservation that is still HELD counts as the buyer's hold.
    #[test]
    fn replay_of_a_hold_is_a_hold() {
        assert!(replays_a_hold(
            br#"{"outcome":"REPLAY","reservation":{"status":"HELD"}}"#
        ));
        assert!(!replays_a_hold(
            br#"{"outcome":"REPLAY","reservation":{"status":"EXPIRED"}}"#
        ));
    }
}
