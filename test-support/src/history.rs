//! Every reserve a test's buyers send, with when it left and when (and
//! how) it was answered, and the checks run over that history afterwards,
//! as Jepsen's checkers do over theirs:
//!
//! - every request was answered within a bound (nothing hangs);
//! - every key answered HELD exists afterwards, HELD or SOLD (an
//!   acknowledged hold is never lost);
//! - no unit was held twice: the keys held are at most the total, and
//!   exactly the units the services say are held or sold;
//! - no buyer was told SOLD_OUT while a unit was still to be had: no
//!   request sent later than a SOLD_OUT answer plus the staleness bound was
//!   answered HELD.
//!
//! A failure names every violation and the test's schedule, so the run can
//! be read and repeated.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::crowd::{Reserve, Witness};
use reqwest::StatusCode;
use serde_json::Value;

use crate::api::Api;
use crate::poll::eventually;

/// One reserve request and its answer.
#[derive(Debug, Clone)]
pub struct Op {
    /// The region asked.
    pub region: String,
    /// The request key.
    pub key: String,
    /// When it was sent, from the history's start.
    pub sent: Duration,
    /// When it was answered; `None` if the transport failed.
    pub answered: Duration,
    /// The answer's status; `None` if the transport failed (timeout,
    /// connection closed).
    pub status: Option<StatusCode>,
    /// The answer's `outcome`.
    pub outcome: String,
}

impl Op {
    fn is_held(&self) -> bool {
        self.status == Some(StatusCode::CREATED)
    }

    fn is_sold_out(&self) -> bool {
        self.outcome == "SOLD_OUT"
    }
}

/// What the buyers did, in the order their answers came.
pub struct History {
    start: Instant,
    ops: Mutex<Vec<Op>>,
}

impl Default for History {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            ops: Mutex::new(Vec::new()),
        }
    }
}

/// What the checks compare the history with.
#[derive(Debug, Clone)]
pub struct Expect {
    /// Units on sale.
    pub total: u64,
    /// Units the services say are held or sold at the end.
    pub held_or_sold: u64,
    /// Longest a request may wait for its answer.
    pub answer_within: Duration,
    /// How long a SOLD_OUT may be out of date: a request sent this long
    /// after a SOLD_OUT answer must not be answered HELD.
    pub staleness: Duration,
    /// The test's fault schedule, printed with any violation.
    pub schedule: String,
    /// Windows in which a region's process was down or frozen: a request
    /// to it sent then may go unanswered or answer late (nothing can
    /// answer for a stopped process).
    pub down: Vec<(String, Range<Duration>)>,
}

impl History {
    /// An empty history starting now.
    pub fn new() -> Self {
        Self::default()
    }

    /// Time since the history started.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Reserves `n` keys `{prefix}-{i}` of `sku` at `region`'s agent, one
    /// buyer after another, each key its own user; records every answer.
    pub async fn reserve_many(&self, api: &Api, region: &str, prefix: &str, n: usize, sku: &str) {
        for i in 0..n {
            let key = format!("{prefix}-{i}");
            self.reserve(api, region, &key, &key, sku).await;
        }
    }

    /// Sends one reserve for `key` to `region`'s agent and records it.
    pub async fn reserve(
        &self,
        api: &Api,
        region: &str,
        key: &str,
        user: &str,
        sku: &str,
    ) -> Option<(StatusCode, Value)> {
        let sent = Instant::now();
        let answer = api.try_reserve(key, user, sku).await.ok();
        let answered = Instant::now();
        let heard = answer.as_ref().map(|(status, body)| (*status, body));
        self.record(region, key, sent, answered, heard);
        answer
    }

    /// Records one reserve for `key` to `region`'s agent, sent at `sent`
    /// and answered at `answered` with a status and a JSON body (`None`:
    /// the transport failed).
    pub fn record(
        &self,
        region: &str,
        key: &str,
        sent: Instant,
        answered: Instant,
        answer: Option<(StatusCode, &Value)>,
    ) {
        let outcome = answer
            .and_then(|(_, body)| body["outcome"].as_str())
            .unwrap_or("")
            .to_owned();
        self.ops.lock().unwrap().push(Op {
            region: region.to_owned(),
            key: key.to_owned(),
            sent: sent.saturating_duration_since(self.start),
            answered: answered.saturating_duration_since(self.start),
            status: answer.map(|(status, _)| status),
            outcome,
        });
    }

    /// A witness for a crowd whose regions are `regions` (by index, in
    /// the crowd's order): it records every reserve the crowd sends here.
    pub fn witness(self: &Arc<Self>, regions: &[&str]) -> Arc<dyn Witness> {
        Arc::new(Recorder {
            history: self.clone(),
            regions: regions.iter().map(|r| (*r).to_owned()).collect(),
        })
    }

    /// Every request so far.
    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }

    /// What the buyers heard, for the test's output: answers by outcome
    /// (`-` for no answer) and the slowest answer, per region, in `window`.
    pub fn summary(&self, window: Range<Duration>) -> String {
        let mut by_region: BTreeMap<String, (BTreeMap<String, usize>, Duration)> = BTreeMap::new();
        for op in self
            .ops()
            .into_iter()
            .filter(|op| window.contains(&op.sent))
        {
            let entry = by_region.entry(op.region.clone()).or_default();
            let outcome = match (op.status, op.outcome.as_str()) {
                (None, _) => "-".to_owned(),
                (Some(status), "") => status.as_u16().to_string(),
                (Some(_), outcome) => outcome.to_owned(),
            };
            *entry.0.entry(outcome).or_default() += 1;
            entry.1 = entry.1.max(op.answered - op.sent);
        }
        by_region
            .iter()
            .map(|(region, (outcomes, slowest))| {
                let counts: Vec<String> =
                    outcomes.iter().map(|(o, n)| format!("{o} {n}")).collect();
                format!("{region}: {}; slowest {slowest:.2?}", counts.join(", "))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Keys answered HELD, with the region that held them.
    pub fn held_keys(&self) -> BTreeMap<String, String> {
        self.ops()
            .into_iter()
            .filter(Op::is_held)
            .map(|op| (op.key, op.region))
            .collect()
    }

    /// After a fault is over: waits (up to `within`) until `api` holds a
    /// new probe key of `sku` again, then [`History::retry_refused`].
    pub async fn recover(&self, api: &Api, sku: &str, within: Duration) {
        eventually("the agent sells again", within, async || {
            api.reserve("probe", "probe", sku).await.0 == StatusCode::CREATED
        })
        .await;
        self.retry_refused(api, sku).await;
    }

    /// Retries every request not answered 201, with its own key, until
    /// its answer is final, which must be a success (a 503 is always safe
    /// to retry): what a browser whose buyer waits does.
    pub async fn retry_refused(&self, api: &Api, sku: &str) {
        let refused: Vec<String> = self
            .ops()
            .into_iter()
            .filter(|op| op.status != Some(StatusCode::CREATED))
            .map(|op| op.key)
            .collect();
        for key in &refused {
            let answer = api.reserve_until_final(key, key, sku).await;
            assert!(answer.status.is_success(), "{key}: {answer:?}");
        }
    }

    /// Each held key's status as `api` (the one region that held them all)
    /// reads it now; fails if any is not there.
    pub async fn read_back(&self, api: &Api) -> BTreeMap<String, String> {
        let mut stored = BTreeMap::new();
        for key in self.held_keys().into_keys() {
            let (status, body) = api.get(&key).await;
            assert_eq!(status, StatusCode::OK, "{key}: {body}");
            let read = body["status"].as_str().unwrap_or_default().to_owned();
            stored.insert(key, read);
        }
        stored
    }

    /// The end of a fault test on one region (`api`) selling one SKU of
    /// 100,000 units: every held key read back, no drift, `held` units
    /// held, then every [`History::check`] with answers due within
    /// `answer_within` (but those of requests in flight during one of the
    /// `down` windows, from the history's start) and SOLD_OUT at most 1 s
    /// stale.
    pub async fn check_one_region(
        &self,
        api: &Api,
        held: u64,
        answer_within: Duration,
        down: Vec<std::ops::Range<Duration>>,
        schedule: &str,
    ) {
        let stored = self.read_back(api).await;
        let regions: BTreeSet<String> = self.ops().into_iter().map(|op| op.region).collect();
        let audit = api.assert_no_drift().await;
        assert_eq!(audit["skus"][0]["held"].as_u64(), Some(held), "{audit}");
        let expect = Expect {
            total: 100_000,
            held_or_sold: self.held_keys().len() as u64,
            answer_within,
            staleness: Duration::from_secs(1),
            schedule: schedule.to_owned(),
            down: down
                .iter()
                .flat_map(|w| regions.iter().map(|r| (r.clone(), w.clone())))
                .collect(),
        };
        self.check(&expect, &stored);
    }

    /// Runs every check, given each held key's status afterwards
    /// (`final_status`, from the region that held it); panics with every
    /// violation and the schedule if any fails.
    pub fn check(&self, expect: &Expect, final_status: &BTreeMap<String, String>) {
        let ops = self.ops();
        let mut violations = Vec::new();
        for op in &ops {
            let waited = op.answered - op.sent;
            let excused = expect.down.iter().any(|(region, window)| {
                *region == op.region && op.sent < window.end && op.answered >= window.start
            });
            if !excused && (op.status.is_none() || waited > expect.answer_within) {
                violations.push(format!(
                    "{} in {} sent at {:?}: {} after {waited:?}",
                    op.key,
                    op.region,
                    op.sent,
                    op.status
                        .map_or("no answer".to_owned(), |s| format!("answered {s}")),
                ));
            }
        }
        let held = self.held_keys();
        for (key, region) in &held {
            match final_status.get(key).map(String::as_str) {
                Some("HELD" | "SOLD") => {}
                other => violations.push(format!(
                    "{key} was answered HELD by {region} but is now {other:?}"
                )),
            }
        }
        let held_count = held.len() as u64;
        if held_count > expect.total {
            violations.push(format!(
                "{held_count} keys held, more than the {} units",
                expect.total
            ));
        }
        if held_count != expect.held_or_sold {
            violations.push(format!(
                "{held_count} keys answered HELD, but the services hold or sold {}",
                expect.held_or_sold
            ));
        }
        if let Some(first) = ops
            .iter()
            .filter(|op| op.is_sold_out())
            .min_by_key(|op| op.answered)
        {
            let late = ops
                .iter()
                .filter(|op| op.is_held() && op.sent > first.answered + expect.staleness);
            for op in late {
                violations.push(format!(
                    "{} in {} sent at {:?} was answered HELD after {} in {} heard SOLD_OUT at {:?}",
                    op.key, op.region, op.sent, first.key, first.region, first.answered
                ));
            }
        }
        assert!(
            violations.is_empty(),
            "{} violations in a history of {} requests under {}:\n{}",
            violations.len(),
            ops.len(),
            expect.schedule,
            violations.join("\n")
        );
    }
}

/// Records a crowd's reserves in a [`History`].
struct Recorder {
    history: Arc<History>,
    regions: Vec<String>,
}

impl Witness for Recorder {
    fn reserve(&self, reserve: &Reserve<'_>) {
        let answer = reserve.answer;
        let body = answer.map(|a| serde_json::from_slice(&a.body).unwrap_or(Value::Null));
        let heard = answer.zip(body.as_ref()).map(|(a, body)| (a.status, body));
        let region = &self.regions[reserve.region];
        let (sent, answered) = (reserve.sent, reserve.answered);
        self.history
            .record(region, reserve.key, sent, answered, heard);
    }
}
