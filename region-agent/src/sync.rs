//! The agent's side of the protocol: one sync with the coordinator every
//! `sync_interval_ms`.
//!
//! Each sync reads counters, credited grants and debited returns in one
//! database snapshot and sends them together, so the coordinator can apply
//! each SKU's acks, returns and report in one transaction. The answer's
//! directives and grants go to the SKU owners (grants are credited by the
//! owner, once per id); confirmed acks and applied returns are then
//! forgotten. A lost answer is harmless: the next sync carries everything
//! again.
//!
//! Reports are deltas: a sync reports the SKUs whose counters changed since
//! the last report the coordinator answered, and the SKUs it returns units
//! of. The first sync, the one after a failed sync (whose report may or may
//! not have been applied) and every `FULL_SYNC_EVERY`-th are full: every
//! SKU, and every directive back. So a SKU left out is one whose last
//! answered report is still the coordinator's view of it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use escrow_core::protocol::{
    SkuReport, SyncRequest, SyncResponse, TransferMsg, WatchRequest, FULL_SYNC_EVERY,
};
use escrow_core::{Sku, SkuSettings, Tenant};
use tokio::sync::watch;

use crate::coordinator_client::{ClientError, CoordinatorLink};
use crate::owner::Control;
use crate::state::AppState;

/// Longest the coordinator holds a watch call open; shorter than the
/// agent's client timeout, so a held call is never mistaken for a dead link.
pub const WATCH_WAIT_MS: u64 = 1_000;

/// Runs syncs until `stop` turns true or this process is fenced: every
/// `sync_interval_ms`, and at once when an owner or the coordinator's
/// notice asks for one.
pub async fn run(state: AppState, link: Arc<CoordinatorLink>, mut stop: watch::Receiver<bool>) {
    // The link starts down and the gauge moves only on a change: without
    // this, an agent that never reaches the coordinator would export nothing.
    metrics::gauge!("escrow_coordinator_down").set(if link.is_down() { 1.0 } else { 0.0 });
    let interval = Duration::from_millis(link.sync_interval_ms);
    tokio::spawn(watch_notices(
        link.clone(),
        state.fence().epoch().0,
        stop.clone(),
    ));
    let mut seq = 0u64;
    let mut rtt_ms = 0u64;
    let mut reports = Reports::default();
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = link.sync_requested() => {}
            _ = stop.changed() => break,
        }
        if *stop.borrow() || state.fence().is_fenced() {
            break;
        }
        seq += 1;
        let snapshot = match state.store().sync_snapshot().await {
            Ok(snapshot) => snapshot,
            Err(error) => {
                tracing::warn!(%error, "sync snapshot failed");
                continue;
            }
        };
        let all = snapshot
            .skus
            .iter()
            .map(|(tenant, sku, ledger)| SkuReport {
                tenant: tenant.to_string(),
                sku: sku.to_string(),
                available: ledger.available,
                held: ledger.held,
                sold: ledger.sold,
                sale_rate_per_s: state
                    .registry()
                    .get(tenant, sku)
                    .map_or(0.0, |h| h.view.sale_rate_per_s()),
            })
            .collect();
        let (skus, full) = reports.to_send(all, &snapshot.pending_returns);
        let req = SyncRequest {
            epoch: state.fence().epoch().0,
            seq,
            rtt_ms,
            skus,
            acks: snapshot.unconfirmed_grants,
            returns: snapshot.pending_returns,
            full,
        };
        let started = Instant::now();
        let answer = link.client.sync(&req).await;
        reports.answered(&req, answer.is_ok());
        match answer {
            Ok(resp) => {
                rtt_ms = started.elapsed().as_millis() as u64;
                link.set_down(false);
                apply(&state, resp).await;
            }
            Err(ClientError::Refused { status: 409, body }) if body.contains("FENCED") => {
                // A newer process of this region syncs with the coordinator:
                // this one must not sell or take any more.
                state.fence().set_fenced();
                break;
            }
            Err(error) => {
                link.set_down(true);
                tracing::debug!(%error, "sync failed");
            }
        }
        metrics::counter!("escrow_syncs_total").increment(1);
    }
}

/// What the coordinator has of this agent's reports: per SKU, the last
/// report it answered; and when the next sync must be full.
#[derive(Debug, Default)]
struct Reports {
    answered: HashMap<(String, String), SkuReport>,
    /// Syncs since the last full one answered; `None`: the next is full.
    since_full: Option<u64>,
}

impl Reports {
    /// The reports to send out of `all` (every SKU's), and whether the
    /// sync is full.
    fn to_send(&self, all: Vec<SkuReport>, returns: &[TransferMsg]) -> (Vec<SkuReport>, bool) {
        let full = self.since_full.is_none_or(|n| n + 1 >= FULL_SYNC_EVERY);
        if full {
            return (all, true);
        }
        let delta = all
            .into_iter()
            .filter(|r| {
                let key = (r.tenant.clone(), r.sku.clone());
                self.answered
                    .get(&key)
                    .is_none_or(|sent| r.differs_from(sent))
                    || returns
                        .iter()
                        .any(|t| (&t.tenant, &t.sku) == (&r.tenant, &r.sku))
            })
            .collect();
        (delta, false)
    }

    /// After `req` was answered (`ok`) or failed: an answered report is the
    /// coordinator's view; after a failure nobody knows which reports
    /// count, so the next sync is full.
    fn answered(&mut self, req: &SyncRequest, ok: bool) {
        if !ok {
            self.since_full = None;
            return;
        }
        if req.full {
            self.answered.clear();
        }
        for report in &req.skus {
            self.answered
                .insert((report.tenant.clone(), report.sku.clone()), report.clone());
        }
        self.since_full = Some(if req.full {
            0
        } else {
            self.since_full.map_or(0, |n| n + 1)
        });
    }
}

/// Holds a watch call open at the coordinator and asks for a sync as soon
/// as it has news for this region (a recall above all), so units move in
/// one hop rather than after a sync interval. A coordinator that cannot be
/// reached is retried after a sync interval; the periodic sync goes on
/// regardless.
async fn watch_notices(link: Arc<CoordinatorLink>, epoch: i64, mut stop: watch::Receiver<bool>) {
    let pause = Duration::from_millis(link.sync_interval_ms);
    let mut seen = 0;
    loop {
        let req = WatchRequest {
            epoch,
            seen,
            wait_ms: WATCH_WAIT_MS,
        };
        tokio::select! {
            answer = link.client.watch(&req) => match answer {
                Ok(resp) => {
                    if resp.notice != seen {
                        seen = resp.notice;
                        link.request_sync();
                    }
                }
                Err(error) => {
                    tracing::debug!(%error, "watch failed");
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        _ = stop.changed() => break,
                    }
                }
            },
            _ = stop.changed() => break,
        }
        if *stop.borrow() {
            break;
        }
    }
}

async fn apply(state: &AppState, resp: SyncResponse) {
    let mut grants: HashMap<(String, String), Vec<TransferMsg>> = HashMap::new();
    for grant in resp.grants {
        grants
            .entry((grant.tenant.clone(), grant.sku.clone()))
            .or_default()
            .push(grant);
    }
    for directive in resp.skus {
        let (Ok(tenant), Ok(sku)) = (Tenant::parse(&directive.tenant), Sku::parse(&directive.sku))
        else {
            tracing::warn!(tenant = %directive.tenant, sku = %directive.sku, "directive with a bad id ignored");
            continue;
        };
        let handle = match state.registry().get(&tenant, &sku) {
            Some(handle) => handle,
            None => {
                let settings = SkuSettings::parse(
                    Some(i64::from(directive.max_per_user)),
                    Some(directive.hold_ttl_ms as i64),
                )
                .unwrap_or_default();
                match state.registry().create(&tenant, &sku, settings, 0).await {
                    Ok(Some(handle)) => handle,
                    Ok(None) => match state.registry().get(&tenant, &sku) {
                        Some(handle) => handle,
                        None => continue,
                    },
                    Err(error) => {
                        tracing::warn!(%error, "creating a SKU from a directive failed");
                        continue;
                    }
                }
            }
        };
        let for_sku = grants
            .remove(&(directive.tenant.clone(), directive.sku.clone()))
            .unwrap_or_default();
        // Its own channel: a full buyer queue never holds a directive back.
        handle.control.send_replace(Some(Control {
            directive,
            grants: for_sku,
        }));
    }
    if let Err(error) = state.store().confirm_grants(&resp.confirmed).await {
        tracing::warn!(%error, "recording confirmed grants failed");
    }
    if let Err(error) = state.store().forget_returns(&resp.applied_returns).await {
        tracing::warn!(%error, "forgetting applied returns failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(sku: &str, available: u64) -> SkuReport {
        SkuReport {
            tenant: "t".into(),
            sku: sku.into(),
            available,
            held: 0,
            sold: 0,
            sale_rate_per_s: 0.0,
        }
    }

    fn request(skus: Vec<SkuReport>, full: bool) -> SyncRequest {
        SyncRequest {
            epoch: 1,
            seq: 1,
            rtt_ms: 0,
            skus,
            acks: Vec::new(),
            returns: Vec::new(),
            full,
        }
    }

    /// Goal: the first sync is full; then only changed SKUs and SKUs with a
    /// return are sent; a failed sync makes the next one full, and so does
    /// every `FULL_SYNC_EVERY`-th.
    #[test]
    fn reports_are_deltas_between_full_syncs() {
        let mut reports = Reports::default();
        let all = || vec![report("a", 1), report("b", 2)];
        let (skus, full) = reports.to_send(all(), &[]);
        assert!(full);
        reports.answered(&request(skus, full), true);

        let (skus, full) = reports.to_send(vec![report("a", 1), report("b", 3)], &[]);
        assert_eq!((skus.len(), full), (1, false), "only b changed");
        reports.answered(&request(skus, full), true);
        let ret = TransferMsg {
            id: "r-1".into(),
            tenant: "t".into(),
            sku: "a".into(),
            units: 1,
        };
        let (skus, _) = reports.to_send(vec![report("a", 1), report("b", 3)], &[ret]);
        assert_eq!(skus, vec![report("a", 1)], "a has a return");

        let req = request(Vec::new(), false);
        reports.answered(&req, false);
        assert!(reports.to_send(all(), &[]).1, "after a failure: full");
        reports.answered(&request(all(), true), true);
        for _ in 1..FULL_SYNC_EVERY {
            let (skus, full) = reports.to_send(all(), &[]);
            assert_eq!((skus.len(), full), (0, false));
            reports.answered(&request(skus, full), true);
        }
        assert!(
            reports.to_send(all(), &[]).1,
            "every FULL_SYNC_EVERY-th: full"
        );
    }
}
