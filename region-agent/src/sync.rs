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
//! Reports are deltas between full syncs; which SKUs a sync reports and
//! whether it is full is escrow-core's [`Reports`] decision.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use escrow_core::protocol::{
    merge_transfers, SkuDirective, SkuReport, SyncRequest, SyncResponse, TransferMsg, WatchRequest,
};
use escrow_core::{Reports, RoundTrip, Sku, SkuSettings, Tenant};
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
        state.clone(),
        link.clone(),
        state.fence().epoch().0,
        stop.clone(),
    ));
    tokio::spawn(crate::borrows::relay(state.clone(), stop.clone()));
    let mut seq = 0u64;
    let mut round_trip = RoundTrip::default();
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
            .map(|(tenant, sku, ledger)| {
                let view = state.registry().get(tenant, sku).map(|h| h.view);
                SkuReport::of(
                    tenant.clone(),
                    sku.clone(),
                    *ledger,
                    view.as_ref().map_or(0, |v| v.units_set_aside()),
                    view.as_ref().map_or(0.0, |v| v.sale_rate_per_s()),
                )
            })
            .collect();
        let (skus, full) = reports.to_send(all, &snapshot.pending_returns);
        let req = SyncRequest {
            limits: state.borrows().to_send(&snapshot),
            epoch: state.fence().epoch().0,
            seq,
            rtt_ms: round_trip.estimate_ms(),
            skus,
            acks: snapshot.unconfirmed_grants,
            returns: snapshot.pending_returns,
            full,
        };
        let started = Instant::now();
        match link.client.sync(&req).await {
            Ok(resp) => {
                reports.answered(&req);
                state.borrows().sent(&req.limits);
                round_trip.record(started.elapsed().as_millis() as u64);
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
                reports.failed();
                link.set_down(true);
                tracing::debug!(%error, "sync failed");
            }
        }
        metrics::counter!("escrow_syncs_total").increment(1);
    }
}

/// Holds a watch call open at the coordinator and hands its news for
/// this region (a recall above all) to the SKU owners at once, so units
/// move in one hop rather than after a sync interval. A coordinator that cannot be
/// reached is retried after a sync interval; the periodic sync goes on
/// regardless.
async fn watch_notices(
    state: AppState,
    link: Arc<CoordinatorLink>,
    epoch: i64,
    mut stop: watch::Receiver<bool>,
) {
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
                    if !resp.limits.is_empty() {
                        if let Err(error) = state.borrows().apply(&state, resp.limits).await {
                            tracing::warn!(%error, "applying borrows and loans failed");
                        }
                    }
                    if resp.notice != seen {
                        seen = resp.notice;
                        // The owners ask for a sync once they have acted
                        // on the news (a return or a grant committed): a
                        // sync sent now would leave before the return it
                        // should carry, which then waits a round trip for
                        // the next. News without directives is fetched.
                        if resp.skus.is_empty() {
                            link.request_sync();
                        }
                        hand_to_owners(&state, resp.skus, resp.grants).await;
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
    hand_to_owners(state, resp.skus, resp.grants).await;
    if let Err(error) = state.borrows().apply(state, resp.limits).await {
        tracing::warn!(%error, "applying borrows and loans failed");
    }
    if let Err(error) = state.store().confirm_grants(&resp.confirmed).await {
        tracing::warn!(%error, "recording confirmed grants failed");
    }
    if let Err(error) = state.store().forget_returns(&resp.applied_returns).await {
        tracing::warn!(%error, "forgetting applied returns failed");
    }
}

/// Gives each SKU's owner its directive and the grants pending to it, from
/// a sync's answer or a watch's; a SKU the agent does not have yet is
/// created from its directive.
async fn hand_to_owners(state: &AppState, directives: Vec<SkuDirective>, all: Vec<TransferMsg>) {
    let mut grants: HashMap<(Tenant, Sku), Vec<TransferMsg>> = HashMap::new();
    for grant in all {
        grants
            .entry((grant.tenant.clone(), grant.sku.clone()))
            .or_default()
            .push(grant);
    }
    for directive in directives {
        let (tenant, sku) = (&directive.tenant, &directive.sku);
        let handle = match state.registry().get(tenant, sku) {
            Some(handle) => handle,
            None => {
                let settings = SkuSettings::parse(
                    Some(i64::from(directive.max_per_user)),
                    Some(directive.hold_ttl_ms as i64),
                )
                .unwrap_or_default()
                .with_scope(directive.user_limit_scope);
                match state.registry().create(tenant, sku, settings, 0).await {
                    Ok(Some(handle)) => handle,
                    Ok(None) => match state.registry().get(tenant, sku) {
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
        handle
            .view
            .set_limit_regions(directive.limit_regions.clone());
        // Its own channel: a full buyer queue never holds a directive back.
        // Grants an earlier word carried that the owner has not read yet
        // stay with the newer directive (a watch's and a sync's answers can
        // both arrive between two of its batches).
        handle.control.send_modify(|control| {
            let mut grants = control.take().map(|c| c.grants).unwrap_or_default();
            merge_transfers(&mut grants, for_sku);
            *control = Some(Control { directive, grants });
        });
    }
}
