//! The crowd of one sale: every buyer arrives at its time, asks its
//! region's agent for a hold, and retries as a browser would.
//!
//! Each buyer has one request key and one user id for its whole life, so
//! a retry after a 503 is the same request again (the contract makes that
//! safe). A 503 is retried after `Retry-After` (or the buyer's own wait)
//! until the buyer's patience runs out; HELD or SOLD_OUT ends it. At most
//! `in_flight` requests per region are on the wire at once, over keep-alive
//! connections pooled per agent (a waiting buyer holds no connection), so
//! a crowd of 200,000 needs no more sockets than requests in flight. The
//! bound is per region because a region's buyers are other people on
//! other machines: requests waiting in one region (buyers parked while
//! units move) must not hold back another region's arrivals, which would
//! read to the coordinator as that region's demand ending.
//!
//! A buyer whose arrival says so pays for its hold: after its delay it
//! confirms it (`POST .../confirm`, retried like a reserve). The crowd's
//! answers so far, and how long its holds took, can be watched
//! through a [`Progress`]; every reserve and its answer, as they come,
//! through a [`Witness`].

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use hdrhistogram::Histogram;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::client::{Answer, Bearer, Conn};
use crate::outcome::{Outcome, Tally};
use crate::sampler::Origin;
use crate::shape::{Arrival, Patience};

/// Most requests in flight `--in-flight` accepts.
pub const IN_FLIGHT_MAX: usize = 10_000;

/// Where and how the crowd buys.
#[derive(Clone)]
pub struct Crowd {
    /// One agent per region, in the sale's region order.
    pub agents: Vec<SocketAddr>,
    /// Most requests in flight at once, per region.
    pub in_flight: usize,
    /// Makes the run's request keys unique.
    pub run_id: String,
    /// The buyers' API key.
    pub tenant_key: String,
    /// The SKU they buy.
    pub sku: String,
    /// Where the crowd's answers are counted as they come, if anyone watches.
    pub progress: Option<Arc<Progress>>,
    /// Who is told of every reserve and its answer, if anyone.
    pub witness: Option<Arc<dyn Witness>>,
    /// With one name per region, each buyer's id starts with its region's
    /// (`eu:u...`): under a global per-user limit, its home.
    pub home_prefixes: Option<Vec<String>>,
}

/// Told of every reserve a buyer sends, as its answer comes: a test's
/// history of requests, to check afterwards.
pub trait Witness: Send + Sync {
    /// One more reserve, answered (or not) just now.
    fn reserve(&self, reserve: &Reserve<'_>);
}

/// One reserve a buyer sent, and what came back.
#[derive(Debug, Clone, Copy)]
pub struct Reserve<'a> {
    /// Index of the region whose agent it was sent to.
    pub region: usize,
    /// Its request key.
    pub key: &'a str,
    /// When it left.
    pub sent: Instant,
    /// When its answer came, or its connection failed.
    pub answered: Instant,
    /// The answer; `None`: the connection failed.
    pub answer: Option<&'a Answer>,
}

/// Longest hold wait [`RegionProgress`] tells apart, µs; a longer one
/// counts as this (a buyer retries for about a minute at most).
pub const HOLD_WAIT_US_MAX: u64 = 300_000_000;
/// Significant digits of [`RegionProgress::hold_wait_us`]: within 1%, in a
/// histogram of a few thousand counters that recording never grows.
const HOLD_WAIT_DIGITS: u8 = 2;

/// One region's buyers so far.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionProgress {
    /// Buyers that arrived.
    pub arrived: u64,
    /// Buyers whose story ended.
    pub ended: u64,
    /// Every answer to a reserve.
    pub answers: Tally,
    /// Units held, by the answers.
    pub held_units: u64,
    /// Units paid for (holds confirmed).
    pub paid_units: u64,
    /// The region's round trip to the coordinator, ms (0: loopback).
    pub rtt_ms: u64,
    /// Wait of each buyer that got a hold, from its first send to its
    /// HELD, µs (within 1%).
    pub hold_wait_us: Histogram<u32>,
    /// Of those, holds answered faster than `rtt_ms` (counted exactly):
    /// none of them can have waited for the coordinator.
    pub holds_under_rtt: u64,
}

impl RegionProgress {
    /// Nothing yet, in a region `rtt_ms` from the coordinator.
    pub fn new(rtt_ms: u64) -> Self {
        Self {
            arrived: 0,
            ended: 0,
            answers: Tally::default(),
            held_units: 0,
            paid_units: 0,
            rtt_ms,
            // The bounds are constants that hdrhistogram accepts (low 1,
            // high far above 2 x low, 2 digits), so this cannot fail.
            hold_wait_us: Histogram::new_with_bounds(1, HOLD_WAIT_US_MAX, HOLD_WAIT_DIGITS)
                .expect("valid hold wait bounds"),
            holds_under_rtt: 0,
        }
    }

    /// Buyers that got a hold.
    pub fn holds(&self) -> u64 {
        self.hold_wait_us.len()
    }

    /// The hold wait at quantile `q` (0.5: the median), µs; `None`
    /// without holds.
    pub fn hold_wait_at_us(&self, q: f64) -> Option<u64> {
        (self.holds() > 0).then(|| self.hold_wait_us.value_at_quantile(q))
    }

    /// Share of the holds answered faster than the round trip; `None` on
    /// loopback (every answer is) or without holds.
    pub fn under_rtt_share(&self) -> Option<f64> {
        let holds = self.holds();
        (self.rtt_ms > 0 && holds > 0).then(|| self.holds_under_rtt as f64 / holds as f64)
    }

    /// One more hold, `wait_us` after the buyer's first send.
    fn record_hold(&mut self, wait_us: i64) {
        let wait_us = u64::try_from(wait_us).unwrap_or(0);
        self.hold_wait_us.saturating_record(wait_us);
        if wait_us < self.rtt_ms.saturating_mul(1_000) {
            self.holds_under_rtt += 1;
        }
    }
}

/// The crowd's answers so far, per region in the sale's order.
#[derive(Debug, Default)]
pub struct Progress {
    regions: Mutex<Vec<RegionProgress>>,
}

impl Progress {
    /// Nothing yet, in one region per entry of `rtt_ms`: its round trip
    /// to the coordinator, ms (0: loopback), in the sale's order.
    pub fn new(rtt_ms: &[u64]) -> Self {
        Self {
            regions: Mutex::new(rtt_ms.iter().map(|&ms| RegionProgress::new(ms)).collect()),
        }
    }

    /// The counts now.
    pub fn snapshot(&self) -> Vec<RegionProgress> {
        self.regions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn update(&self, region: u8, change: impl FnOnce(&mut RegionProgress)) {
        let mut regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = regions.get_mut(usize::from(region)) {
            change(r);
        }
    }
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
    /// When the last answer to its reserve came.
    pub ended_us: i64,
    /// When its last answer of any kind came (its confirm's, if it paid).
    pub last_answer_us: i64,
    /// How it ended.
    pub end: End,
    /// Every answer it got to its reserve.
    pub answers: Tally,
    /// The last answer to its confirm, if it paid for a hold.
    pub paid: Option<Outcome>,
}

/// Idle keep-alive connections to one agent.
struct Pool {
    addr: SocketAddr,
    idle: Mutex<Vec<Conn>>,
    /// The region's requests on the wire at once.
    in_flight: Semaphore,
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
    ///
    /// An idle connection that fails was most likely closed by the agent
    /// (a restart), and so were the others it kept: they are dropped and
    /// the request goes again on a new connection, as a browser's would
    /// (every buyer request is idempotent by its key).
    async fn post(&self, path: &str, bearer: &Bearer, body: Option<Bytes>) -> Option<Answer> {
        if let Some(mut conn) = self.take() {
            match conn
                .exchange(hyper::Method::POST, path, bearer, body.clone())
                .await
            {
                Ok(answer) => {
                    self.give_back(conn);
                    return Some(answer);
                }
                Err(error) => {
                    tracing::debug!(%error, "kept-alive connection failed; idle ones dropped");
                    self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
                }
            }
        }
        let mut conn = Conn::connect(self.addr).await.ok()?;
        match conn.exchange(hyper::Method::POST, path, bearer, body).await {
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
    bearer: Bearer,
    origin: Origin,
    run_id: String,
    sku: String,
    progress: Option<Arc<Progress>>,
    witness: Option<Arc<dyn Witness>>,
    home_prefixes: Option<Vec<String>>,
}

impl Shared {
    fn progress(&self, region: u8, change: impl FnOnce(&mut RegionProgress)) {
        if let Some(progress) = &self.progress {
            progress.update(region, change);
        }
    }
}

/// Runs the crowd of `arrivals` (in arrival order, each with the
/// `patience` it names) from `origin` (the sale's start) until every
/// buyer's story has ended; one log per buyer, in arrival order. Dropping
/// the future stops every buyer.
pub async fn run(
    crowd: Crowd,
    arrivals: &[Arrival],
    patience: &[Patience],
    origin: Origin,
) -> anyhow::Result<Vec<BuyerLog>> {
    anyhow::ensure!(
        (1..=IN_FLIGHT_MAX).contains(&crowd.in_flight),
        "--in-flight must be 1..={IN_FLIGHT_MAX}"
    );
    let shared = Arc::new(Shared {
        pools: crowd
            .agents
            .iter()
            .map(|&addr| Pool {
                addr,
                idle: Mutex::new(Vec::new()),
                in_flight: Semaphore::new(crowd.in_flight),
            })
            .collect(),
        bearer: Bearer::new(&crowd.tenant_key)?,
        origin,
        run_id: crowd.run_id,
        sku: crowd.sku,
        progress: crowd.progress,
        witness: crowd.witness,
        home_prefixes: crowd.home_prefixes,
    });
    let mut tasks = JoinSet::new();
    for (index, &arrival) in arrivals.iter().enumerate() {
        anyhow::ensure!(
            usize::from(arrival.region) < shared.pools.len(),
            "arrival in a region without an agent"
        );
        let patience = *patience
            .get(usize::from(arrival.patience))
            .context("arrival with an unknown patience")?;
        let at = origin.instant(arrival.at.as_micros() as u64);
        if at > std::time::Instant::now() {
            tokio::time::sleep_until(at.into()).await;
        }
        let shared = shared.clone();
        tasks.spawn(async move { (index, buyer(shared, index, arrival, patience).await) });
    }
    let mut logs: Vec<Option<BuyerLog>> = vec![None; arrivals.len()];
    while let Some(done) = tasks.join_next().await {
        let (index, log) = done.context("buyer task panicked")?;
        logs[index] = Some(log);
    }
    logs.into_iter()
        .map(|log| log.context("every buyer's task ended with its log"))
        .collect()
}

/// The request key of buyer `index` of the crowd `run_id`.
pub fn request_key(run_id: &str, index: usize) -> String {
    format!("{run_id}-{index}")
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
    let key = request_key(&shared.run_id, index);
    let home = match &shared.home_prefixes {
        Some(names) => format!("{}:", names[usize::from(arrival.region)]),
        None => String::new(),
    };
    let body = Bytes::from(format!(
        r#"{{"request_key":"{key}","user_id":"{home}u{key}","sku":"{}","qty":{}}}"#,
        shared.sku, arrival.qty
    ));
    let pool = &shared.pools[usize::from(arrival.region)];
    shared.progress(arrival.region, |p| p.arrived += 1);
    let mut answers = Tally::default();
    let mut first_sent_us = None;
    let mut retries = 0u32;
    let (end, ended_us) = loop {
        let permit = pool.in_flight.acquire().await;
        let sent = Instant::now();
        let first = *first_sent_us.get_or_insert(shared.origin.us(sent));
        let answer = pool
            .post("/v1/reservations", &shared.bearer, Some(body.clone()))
            .await;
        drop(permit);
        let answered = Instant::now();
        if let Some(witness) = &shared.witness {
            witness.reserve(&Reserve {
                region: usize::from(arrival.region),
                key: &key,
                sent,
                answered,
                answer: answer.as_ref(),
            });
        }
        let now_us = shared.origin.us(answered);
        let (outcome, retry_after) = match &answer {
            Some(a) => (Outcome::of_reserve(a.status, &a.body), a.retry_after),
            None => (Outcome::Transport, None),
        };
        answers.add(outcome);
        shared.progress(arrival.region, |p| p.answers.add(outcome));
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
        let wait = wait_before_retry(patience, retry_after);
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
    shared.progress(arrival.region, |p| {
        p.ended += 1;
        if end == End::Held {
            p.held_units += u64::from(arrival.qty);
            p.record_hold(ended_us - first_sent_us.unwrap_or(ended_us));
        }
    });
    let paid = match (end, arrival.pay_after) {
        (End::Held, Some(after)) => {
            tokio::time::sleep(after).await;
            let paid = pay(&shared, pool, &key, patience).await;
            if paid == Outcome::Confirmed {
                shared.progress(arrival.region, |p| p.paid_units += u64::from(arrival.qty));
            }
            Some(paid)
        }
        _ => None,
    };
    let last_answer_us = if paid.is_some() {
        shared.origin.now_us()
    } else {
        ended_us
    };
    BuyerLog {
        region: arrival.region,
        qty: arrival.qty,
        arrived_us: i64::try_from(arrival.at.as_micros()).unwrap_or(i64::MAX),
        first_sent_us: first_sent_us.unwrap_or(ended_us),
        ended_us,
        last_answer_us,
        end,
        answers,
        paid,
    }
}

/// How long a buyer of `patience` waits before it sends again, after an
/// answer that asked for `retry_after` (if it did).
fn wait_before_retry(patience: Patience, retry_after: Option<Duration>) -> Duration {
    if patience.fixed_wait {
        patience.wait
    } else {
        retry_after.unwrap_or(patience.wait)
    }
}

/// Confirms the hold of request `key`, retrying a 503 (or a lost answer)
/// as a reserve is retried, for at most the buyer's retrying time; the
/// last answer.
async fn pay(shared: &Shared, pool: &Pool, key: &str, patience: Patience) -> Outcome {
    let path = format!("/v1/reservations/{key}/confirm");
    let first = shared.origin.now_us();
    loop {
        let permit = pool.in_flight.acquire().await;
        let answer = pool.post(&path, &shared.bearer, None).await;
        drop(permit);
        let (outcome, retry_after) = match &answer {
            Some(a) => (Outcome::of_action(true, a.status, &a.body), a.retry_after),
            None => (Outcome::Transport, None),
        };
        if !matches!(
            outcome,
            Outcome::Paused
                | Outcome::QueueFull
                | Outcome::WaitTimeout
                | Outcome::ServerError
                | Outcome::Transport
        ) {
            return outcome;
        }
        let wait = wait_before_retry(patience, retry_after);
        let retrying_for_us = shared.origin.now_us() - first;
        if Duration::from_micros(u64::try_from(retrying_for_us).unwrap_or(0)) + wait
            > patience.retrying_max
        {
            return outcome;
        }
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a region's progress counts every hold, exactly how many beat
    /// its round trip (none on loopback, where the share is not asked), and
    /// gives the waits' quantiles within the histogram's 1%.
    #[test]
    fn hold_waits_against_the_round_trip() {
        let progress = Progress::new(&[0, 80]);
        for wait_ms in [1, 2, 3, 79, 80, 200, 400] {
            for region in 0..2 {
                progress.update(region, |p| p.record_hold(wait_ms * 1_000));
            }
        }
        let [loopback, far] = <[RegionProgress; 2]>::try_from(progress.snapshot()).unwrap();
        assert_eq!((loopback.holds(), far.holds()), (7, 7));
        assert_eq!(
            (loopback.holds_under_rtt, loopback.under_rtt_share()),
            (0, None)
        );
        assert_eq!(far.holds_under_rtt, 4);
        assert_eq!(far.under_rtt_share(), Some(4.0 / 7.0));
        let p50 = far.hold_wait_at_us(0.5).unwrap();
        assert!((79_000..=79_000 * 101 / 100).contains(&p50), "{p50}");
        let p99 = far.hold_wait_at_us(0.99).unwrap();
        assert!((400_000..=400_000 * 101 / 100).contains(&p99), "{p99}");
        assert_eq!(RegionProgress::new(20).hold_wait_at_us(0.5), None);
    }

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
