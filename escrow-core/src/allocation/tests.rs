//! The allocation rules on hand-built SKUs, and a proptest that drives
//! random sequences of syncs, takes and admin changes under any policy.

use std::collections::HashSet;

use proptest::prelude::*;

use super::*;
use crate::policy::{
    CentralOnly, Policy, ProportionalShare, RefillOnLowWater, StaticSplit, TailMerge,
};
use crate::protocol::{SkuReport, SyncRequest, TakeRequest};

fn tid(raw: &str) -> TransferId {
    TransferId::parse(raw).unwrap()
}

/// A take asking for `units` under `id`: a transfer's fields and no more.
fn take_req(id: &str, units: u64) -> TakeRequest {
    let TransferMsg {
        id,
        tenant,
        sku,
        units,
    } = ret(id, units);
    TakeRequest {
        id,
        tenant,
        sku,
        units,
        prefetch: 0,
        received: 0,
        returned: 0,
    }
}

fn ids() -> impl FnMut() -> TransferId {
    let mut next = 0u64;
    move || {
        next += 1;
        tid(&format!("g-{next}"))
    }
}

fn new_sku(total: u64, weights: &[u32], policy: &dyn Policy) -> Allocation {
    Allocation::create(
        Tenant::parse("t").unwrap(),
        Sku::parse("s").unwrap(),
        total,
        SkuSettings::default(),
        weights,
        policy,
        &mut ids(),
    )
    .0
}

fn sync_req(
    seq: u64,
    acks: Vec<TransferId>,
    returns: Vec<TransferMsg>,
    available: u64,
) -> SyncRequest {
    SyncRequest {
        limits: Default::default(),
        epoch: 1,
        seq,
        rtt_ms: 50,
        skus: vec![SkuReport {
            tenant: Tenant::parse("t").unwrap(),
            sku: Sku::parse("s").unwrap(),
            available,
            held: 0,
            sold: 0,
            sale_rate_per_s: 1.0,
            set_aside: 0,
        }],
        acks,
        returns,
        full: true,
    }
}

fn ret(id: &str, units: u64) -> TransferMsg {
    TransferMsg {
        id: tid(id),
        tenant: Tenant::parse("t").unwrap(),
        sku: Sku::parse("s").unwrap(),
        units,
    }
}

/// Region 0's sync under the static split: admitted, then applied to
/// the one SKU; the new standing, if any, beside the SKU's result.
fn sync_static(
    sku: &mut Allocation,
    session: Option<AgentSession>,
    req: &SyncRequest,
    applied: &HashSet<TransferId>,
    now_ms: u64,
) -> Result<(Option<AgentSession>, SkuSynced), AllocationError> {
    check_sync(req)?;
    let admitted = admit(session, req)?;
    let synced = sku.sync(0, req, applied, now_ms, &StaticSplit, &mut ids())?;
    Ok((admitted, synced))
}

/// Goal: a grant, its ack and a return keep the total; a repeated ack or
/// return changes nothing; a return beyond the lease and an older epoch
/// are refused without a trace.
#[test]
fn transfers_apply_once_and_refusals_change_nothing() {
    let mut sku = new_sku(10, &[1, 1], &StaticSplit);
    assert_eq!((sku.pool, sku.in_transit()), (0, 10));
    let grant = sku.pending_grants(0)[0].clone();
    let req = sync_req(1, vec![grant.id.clone()], vec![ret("r-1", 2)], 3);
    let none = HashSet::new();
    let (session, out) = sync_static(&mut sku, None, &req, &none, 7).unwrap();
    assert_eq!(sku.regions[0].leased, 3);
    assert_eq!(sku.pool, 2);
    assert_eq!(out.applied, vec![ret("r-1", 2)]);
    assert!(out.grants.iter().all(|g| g.id != grant.id));
    assert_eq!(sku.regions[0].reported_at_ms, Some(7));
    assert_eq!(sku.regions[0].reported_by, (1, 1));
    assert!(session.is_some());

    let applied: HashSet<TransferId> = [tid("r-1")].into();
    let after = sku.clone();
    let (again, _) = sync_static(&mut sku, session, &req, &applied, 8).unwrap();
    assert_eq!(sku, after, "a replayed sync moves nothing");
    assert_eq!(again, None, "an old request leaves the standing as it was");

    let mut older = sync_req(0, vec![], vec![], 9);
    older.skus[0].held = 1;
    sync_static(&mut sku, session, &older, &applied, 8).unwrap();
    assert_eq!(sku, after, "an older report never replaces a newer one");
    let delta = SyncRequest {
        skus: Vec::new(),
        ..sync_req(2, vec![], vec![], 0)
    };
    sync_static(&mut sku, session, &delta, &applied, 9).unwrap();
    assert_eq!(
        sku, after,
        "a request without this SKU's report keeps the last one"
    );
    assert!(!sku.sync_changes(0, &delta), "nothing to apply");
    assert!(
        !sku.sync_changes(0, &sync_req(3, vec![], vec![], 3)),
        "the same report"
    );
    assert!(
        sku.sync_changes(0, &sync_req(3, vec![], vec![], 2)),
        "a new report"
    );
    assert!(
        !sku.sync_changes(0, &sync_req(0, vec![], vec![], 2)),
        "an older report"
    );
    assert!(sku.sync_changes(0, &sync_req(3, vec![], vec![ret("r-9", 1)], 3)));
    let pending = sku.pending_grants(1)[0].id.clone();
    assert!(
        !sku.sync_changes(1, &delta),
        "a grant in transit, not acked"
    );
    let acked = sync_req(3, vec![pending], vec![], 3);
    assert!(sku.sync_changes(1, &acked), "an ack of a grant in transit");

    let too_much = sync_req(2, vec![], vec![ret("r-2", 4)], 1);
    assert!(matches!(
        sync_static(&mut sku, session, &too_much, &applied, 9),
        Err(AllocationError::Invalid(_))
    ));
    let mut old = sync_req(3, vec![], vec![], 0);
    old.epoch = 0;
    assert_eq!(
        sync_static(&mut sku, session, &old, &applied, 9).map(|_| ()),
        Err(AllocationError::StaleEpoch)
    );
    assert_eq!(sku, after);
    assert!(sku.set_total(7).is_err());
    sku.set_total(8).unwrap();
    assert_eq!((sku.total, sku.pool), (8, 0));
}

/// Goal: a take grants from the pool, a repeat gets the same grant, a
/// paused SKU grants nothing, and sold_out_everywhere is said only when nothing is
/// free anywhere.
#[test]
fn takes_grant_from_the_pool_once() {
    let mut a = new_sku(3, &[1, 1], &CentralOnly);
    assert_eq!(a.mode, Mode::Central);
    let take = |a: &mut Allocation, region, id: &str, units, history| {
        a.take(
            region,
            &take_req(id, units),
            history,
            &CentralOnly,
            &mut ids(),
        )
    };
    let out = take(&mut a, 0, "t-1", 2, TakeHistory::Unused).unwrap();
    assert_eq!(
        (out.granted, out.response.sold_out_everywhere, a.pool),
        (2, false, 1)
    );
    let again = take(&mut a, 0, "t-1", 2, TakeHistory::GrantedHere(2)).unwrap();
    let units = again.response.grant.map(|g| g.units);
    assert_eq!((again.granted, units), (0, Some(2)));
    assert!(take(&mut a, 0, "t-1", 2, TakeHistory::UsedElsewhere).is_err());
    a.paused = true;
    let paused = take(&mut a, 1, "t-2", 1, TakeHistory::Unused).unwrap();
    assert!(paused.response.paused && paused.response.grant.is_none());
    a.paused = false;
    let short = take(&mut a, 1, "t-3", 2, TakeHistory::Unused).unwrap();
    assert_eq!(short.granted, 1);
    let why = "2 units are still in transit to region 0";
    assert!(!short.response.sold_out_everywhere, "{why}");
}

fn policy(i: u8) -> Box<dyn Policy> {
    match i % 5 {
        0 => Box::new(StaticSplit),
        1 => Box::new(RefillOnLowWater::default()),
        2 => Box::new(ProportionalShare::default()),
        3 => Box::new(TailMerge::default()),
        _ => Box::new(CentralOnly),
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A region syncs: acks the grants picked by `acks` (a bit mask over
    /// its pending grants), returns `returns` units under a new or the
    /// last id, reports `available`, with a new or a repeated seq.
    Sync {
        region: u8,
        acks: u8,
        returns: u8,
        repeat_return: bool,
        available: u8,
        rate: u8,
        new_seq: bool,
    },
    /// A region takes `units`, under a new or the last take id.
    Take {
        region: u8,
        units: u8,
        repeat: bool,
    },
    AddStock(u8),
    SetTotal(u16),
    Pause(bool),
    Retire(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..4u8, any::<u8>(), 0..8u8, any::<bool>(), 0..30u8, 0..50u8, any::<bool>()).prop_map(
            |(region, acks, returns, repeat_return, available, rate, new_seq)| Op::Sync {
                region, acks, returns, repeat_return, available, rate, new_seq
            }
        ),
        3 => (0..4u8, 1..6u8, any::<bool>()).prop_map(|(region, units, repeat)| Op::Take { region, units, repeat }),
        1 => (0..20u8).prop_map(Op::AddStock),
        1 => (0..300u16).prop_map(Op::SetTotal),
        1 => any::<bool>().prop_map(Op::Pause),
        1 => (0..4u8).prop_map(Op::Retire),
    ]
}

proptest! {
    /// Goal: under any sequence of syncs (acks, returns, reports, repeats),
    /// takes (new and repeated) and admin changes, with any policy, the
    /// SKU's books stay balanced (asserted inside every move), units
    /// appear only by adding stock, a repeated transfer moves nothing, a
    /// refused input changes nothing, and sold_out_everywhere is said only when
    /// nothing is free anywhere.
    #[test]
    fn random_sequences_keep_the_books(
        total in 0..200u64,
        weights in proptest::collection::vec(0..4u32, 1..5),
        which in any::<u8>(),
        ops in proptest::collection::vec(op(), 1..150),
    ) {
        let policy = policy(which);
        let mut next_id = ids();
        let (mut a, moves) = Allocation::create(
            Tenant::parse("t").unwrap(), Sku::parse("s").unwrap(), total,
            SkuSettings::default(), &weights, policy.as_ref(), &mut next_id,
        );
        prop_assert!(a.is_balanced());
        prop_assert_eq!(moves.granted_units(), a.in_transit());
        let regions = weights.len();
        let mut sessions: Vec<Option<AgentSession>> = vec![None; regions];
        let mut seqs = vec![0u64; regions];
        let mut applied: Vec<HashSet<TransferId>> = vec![HashSet::new(); regions];
        let mut last_return: Vec<Option<TransferMsg>> = vec![None; regions];
        let mut takes: Vec<(usize, TransferId, u64)> = Vec::new();
        let mut returns = 0u64;
        for op in ops {
            let before = a.clone();
            let sets_total = matches!(op, Op::AddStock(_) | Op::SetTotal(_));
            match op {
                Op::Sync { region, acks, returns: units, repeat_return, available, rate, new_seq } => {
                    let r = usize::from(region) % regions;
                    let ack_ids: Vec<TransferId> = a.regions[r].grants.keys().enumerate()
                        .filter(|(i, _)| acks & (1 << (i % 8)) != 0)
                        .map(|(_, id)| id.clone())
                        .collect();
                    let acked: u64 = ack_ids.iter().map(|id| a.regions[r].grants[id]).sum();
                    let mut rets = Vec::new();
                    if repeat_return {
                        rets.extend(last_return[r].clone());
                    } else if units > 0 {
                        returns += 1;
                        rets.push(ret(&format!("r-{returns}"), u64::from(units)));
                    }
                    if new_seq { seqs[r] += 1; }
                    let mut req = sync_req(seqs[r], ack_ids.clone(), rets.clone(), u64::from(available));
                    req.skus[0].sale_rate_per_s = f64::from(rate);
                    let new_units: u64 = rets.iter().filter(|t| !applied[r].contains(&t.id)).map(|t| t.units).sum();
                    let out = admit(sessions[r], &req)
                        .and_then(|admitted| Ok((admitted, a.sync(r, &req, &applied[r], 1_000, policy.as_ref(), &mut next_id)?)));
                    match out {
                        Ok((admitted, out)) => {
                            prop_assert!(new_units <= before.regions[r].leased + acked);
                            prop_assert_eq!(a.regions[r].returned, before.regions[r].returned + new_units);
                            prop_assert_eq!(out.applied.iter().map(|t| t.units).sum::<u64>(), new_units);
                            for id in &ack_ids {
                                prop_assert!(!a.regions[r].grants.contains_key(id));
                            }
                            prop_assert_eq!(&out.grants, &a.pending_grants(r));
                            prop_assert_eq!(out.directive.sold_out_everywhere, a.is_sold_out_everywhere());
                            prop_assert!(a.regions[r].reported_by >= before.regions[r].reported_by);
                            if let Some(s) = admitted { sessions[r] = Some(s); }
                            for t in &rets { applied[r].insert(t.id.clone()); }
                            if let Some(t) = rets.last() { last_return[r] = Some(t.clone()); }
                        }
                        Err(_) => {
                            prop_assert!(new_units > before.regions[r].leased + acked);
                            prop_assert_eq!(&a, &before);
                        }
                    }
                }
                Op::Take { region, units, repeat } => {
                    let r = usize::from(region) % regions;
                    let (id, history) = match takes.last() {
                        Some((owner, id, granted)) if repeat => (
                            id.clone(),
                            if *owner == r { TakeHistory::GrantedHere(*granted) } else { TakeHistory::UsedElsewhere },
                        ),
                        _ => (tid(&format!("t-{}", takes.len())), TakeHistory::Unused),
                    };
                    let req = take_req(id.as_str(), u64::from(units));
                    match a.take(r, &req, history, policy.as_ref(), &mut next_id) {
                        Ok(out) => {
                            prop_assert!(out.granted <= before.pool.min(u64::from(units)));
                            if out.response.sold_out_everywhere {
                                prop_assert_eq!(a.pool, 0);
                                // Every other region has nothing; the asker speaks for itself.
                                prop_assert!(before.regions.iter().enumerate().all(|(i, x)| i == r || (x.in_transit() == 0 && x.report.available == 0)));
                            }
                            if let TakeHistory::GrantedHere(units) = history {
                                prop_assert_eq!(out.response.grant.map(|g| g.units), Some(units));
                                prop_assert_eq!(&a, &before);
                            } else if out.granted > 0 {
                                takes.push((r, id, out.granted));
                            }
                        }
                        Err(_) => {
                            prop_assert_eq!(history, TakeHistory::UsedElsewhere);
                            prop_assert_eq!(&a, &before);
                        }
                    }
                }
                Op::AddStock(n) => {
                    a.add_stock(u64::from(n));
                    prop_assert_eq!(a.total, before.total + u64::from(n));
                }
                Op::SetTotal(n) => match a.set_total(u64::from(n)) {
                    Ok(()) => prop_assert_eq!(a.total, u64::from(n)),
                    Err(_) => {
                        prop_assert!(before.total - u64::from(n) > before.pool);
                        prop_assert_eq!(&a, &before);
                    }
                },
                Op::Pause(paused) => a.paused = paused,
                Op::Retire(region) => {
                    let mut w: Vec<u32> = a.regions.iter().map(|x| x.weight).collect();
                    w[usize::from(region) % regions] = 0;
                    a.set_weights(&w);
                    a.rebalance(policy.as_ref(), &mut next_id);
                }
            }
            prop_assert!(a.is_balanced());
            prop_assert!(a.regions.iter().zip(&before.regions).all(|(x, y)| x.returned >= y.returned));
            if !sets_total {
                prop_assert_eq!(a.total, before.total, "units appear only as added stock");
            }
        }
    }
}
