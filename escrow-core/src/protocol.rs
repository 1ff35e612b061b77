//! Messages between a region agent and the coordinator.
//!
//! The agent always initiates (it may sit behind NAT): it sends a
//! [`SyncRequest`] on a schedule and a [`TakeRequest`] when a buyer needs
//! units it does not have; directives come back in the responses.
//!
//! Quota moves only as transfers with an id. The sender debits and records
//! the transfer in its outbox in one transaction; the receiver credits it
//! and records the id in one transaction, so a duplicate is recognised and
//! ignored; the sender learns of delivery from the receiver and only then
//! forgets the transfer. Grants flow coordinator -> agent (in
//! `SyncResponse::grants`, acknowledged in the next `SyncRequest::acks`),
//! returns agent -> coordinator (in `SyncRequest::returns`, confirmed in
//! `SyncResponse::applied_returns`).
//!
//! A sync request carries the agent's counters, the grants it applied and
//! the returns it debited, all read in one database snapshot; the
//! coordinator applies each SKU's acks, returns and report together, in
//! one short transaction per SKU. So the coordinator's ledger plus the
//! latest report of each SKU always add up to the total, however late,
//! duplicated or reordered the messages are.
//!
//! Reports are deltas: a request carries the SKUs whose counters changed
//! since the last report the coordinator answered ([`SkuReport::differs_from`]),
//! and every SKU when it is `full` (at the agent's start, after a failed
//! sync, and every [`FULL_SYNC_EVERY`] syncs), as [`crate::reports`]
//! decides. A SKU that did not change costs the coordinator nothing.

use serde::{Deserialize, Serialize};

use crate::ids::{RegionName, Sku, Tenant, TransferId, UserId};
use crate::ledger::Ledger;
use crate::policy::Mode;
use crate::user_limit::UserLimitScope;

/// An agent sends a full sync (every SKU reported, every directive
/// answered) at least once in this many syncs, so a view the coordinator
/// lost (a restart, a rate that drifted within [`RATE_CHANGE_MIN_PER_S`])
/// is refreshed within a bounded time: 20 s at the default 200 ms interval.
pub const FULL_SYNC_EVERY: u64 = 100;

/// A sale rate that moved by less than this (units per second), and by
/// less than a tenth of itself, is not a change worth a report.
pub const RATE_CHANGE_MIN_PER_S: f64 = 0.05;

/// A unit movement between the pool and a region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TransferMsg {
    /// Unique id chosen by the sender; the receiver applies each id once.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub id: TransferId,
    /// The SKU's tenant.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "acme"))]
    pub tenant: Tenant,
    /// The SKU.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "drop"))]
    pub sku: Sku,
    /// Units moved, at least 1.
    pub units: u64,
}

/// Adds `more` to `kept`, each transfer id once: a grant may arrive in a
/// watch's answer and again in a sync's before it is credited.
pub fn merge_transfers(kept: &mut Vec<TransferMsg>, more: impl IntoIterator<Item = TransferMsg>) {
    for t in more {
        if !kept.iter().any(|k| k.id == t.id) {
            kept.push(t);
        }
    }
}

/// One SKU's counters at one region, as of the request's snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SkuReport {
    /// The SKU's tenant.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "acme"))]
    pub tenant: Tenant,
    /// The SKU.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "drop"))]
    pub sku: Sku,
    /// Units that may be held now.
    pub available: u64,
    /// Units held.
    pub held: u64,
    /// Units sold.
    pub sold: u64,
    /// Units per second recently held (demand the region met).
    pub sale_rate_per_s: f64,
    /// Of `held`, units set aside for carts whose commit has not ended:
    /// they may come back. While any region has some, the SKU is not sold
    /// out everywhere. 0 from agents that do not send it.
    #[serde(default)]
    pub set_aside: u64,
}

impl SkuReport {
    /// The report of a SKU whose stored counters are `stored` while its
    /// owner has `set_aside` units set aside for carts not yet written:
    /// those count as held, not available, and are named as set aside.
    /// They are not free (no return may give them away, and a coordinator
    /// that counted them free would keep other regions' buyers waiting
    /// for units that are not coming), but not gone either (a cart that
    /// cannot be held lets them go), so nobody may be told sold out while
    /// they are out. The sum the audit adds up is the stored one.
    pub fn of(
        tenant: Tenant,
        sku: Sku,
        stored: Ledger,
        set_aside: u64,
        sale_rate_per_s: f64,
    ) -> Self {
        let aside = set_aside.min(stored.available);
        Self {
            tenant,
            sku,
            available: stored.available - aside,
            held: stored.held + aside,
            sold: stored.sold,
            sale_rate_per_s,
            set_aside: aside,
        }
    }

    /// Whether this report tells the coordinator something `sent` (the last
    /// report of the same SKU it answered) did not: other counters, or a
    /// sale rate that moved by more than a tenth and more than
    /// [`RATE_CHANGE_MIN_PER_S`]. A rate decays between sales, so an exact
    /// comparison would report every SKU at every sync.
    pub fn differs_from(&self, sent: &SkuReport) -> bool {
        let (now, then) = (self.sale_rate_per_s, sent.sale_rate_per_s);
        let moved = (now - then).abs();
        let counters = |r: &SkuReport| (r.available, r.held, r.sold, r.set_aside);
        counters(self) != counters(sent)
            || (moved > RATE_CHANGE_MIN_PER_S && moved > 0.1 * now.max(then))
    }
}

fn full_by_default() -> bool {
    true
}

/// Agent -> coordinator, on a schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SyncRequest {
    /// The agent's fencing epoch in its own database.
    pub epoch: i64,
    /// Increases with every request of this epoch; orders reports.
    pub seq: u64,
    /// The agent's last measured round trip to the coordinator, ms.
    pub rtt_ms: u64,
    /// Counters of the SKUs that changed since the last report the
    /// coordinator answered, and of every SKU with a return here; of every
    /// SKU the agent has when `full`.
    pub skus: Vec<SkuReport>,
    /// Ids of grants the agent applied and has not seen confirmed.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub acks: Vec<TransferId>,
    /// Returns the agent debited and has not seen applied.
    pub returns: Vec<TransferMsg>,
    /// Borrowed and lent places under a global per-user limit.
    #[serde(default, skip_serializing_if = "LimitsUp::is_empty")]
    pub limits: LimitsUp,
    /// `skus` lists every SKU, and the answer carries a directive for every
    /// SKU of the region. Absent means true: an agent that does not say
    /// sends every SKU.
    #[serde(default = "full_by_default")]
    pub full: bool,
}

/// The coordinator's instructions for one SKU at one region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SkuDirective {
    /// The SKU's tenant.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "acme"))]
    pub tenant: Tenant,
    /// The SKU.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "drop"))]
    pub sku: Sku,
    /// Escrow or central.
    pub mode: Mode,
    /// Stop selling.
    pub paused: bool,
    /// Units per reservation at most.
    pub max_per_user: u32,
    /// Default hold duration.
    pub hold_ttl_ms: u64,
    /// Give back available units until this region's cumulative returned
    /// units reach this number. Cumulative, so a repeated directive never
    /// makes the region give back twice.
    pub return_until: u64,
    /// Nothing is free anywhere: answer SOLD_OUT without asking.
    #[serde(alias = "sold_out")]
    pub sold_out_everywhere: bool,
    /// Whether the per-user limit counts each region or all of them.
    #[serde(default)]
    pub user_limit_scope: UserLimitScope,
    /// Under a `global` scope, every region of the SKU, sorted: what a
    /// user's home region is chosen among ([`crate::user_limit::home_region`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub limit_regions: Vec<RegionName>,
}

/// Coordinator -> agent, the answer to a [`SyncRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SyncResponse {
    /// Every grant to this region not yet acknowledged.
    pub grants: Vec<TransferMsg>,
    /// Acks the coordinator has recorded (the agent may forget them).
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub confirmed: Vec<TransferId>,
    /// Returns the coordinator has applied (the agent may forget them).
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub applied_returns: Vec<TransferId>,
    /// One directive per SKU this region takes part in, for a `full`
    /// request; otherwise one per SKU the request reported or returned
    /// units of, per SKU with a grant listed here, and per SKU whose
    /// directive changed since this region's last sync.
    pub skus: Vec<SkuDirective>,
    /// Answers to the region's borrows, and loans asked of it as a home.
    #[serde(default, skip_serializing_if = "LimitsDown::is_empty")]
    pub limits: LimitsDown,
}

/// A user's place under a SKU's global per-user limit, borrowed from the
/// user's home region by the region where the user buys
/// ([`crate::user_limit`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Borrow {
    /// Chosen by the borrowing region, never reused: the home lends under
    /// it at most once.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub id: TransferId,
    /// The SKU's tenant.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "acme"))]
    pub tenant: Tenant,
    /// The SKU.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "drop"))]
    pub sku: Sku,
    /// The buyer.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub user_id: UserId,
    /// The user's home region, which lends the place.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "us"))]
    pub home: RegionName,
}

/// Whether a home region lent the place a borrow asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LendAnswer {
    /// The borrow's id.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub id: TransferId,
    /// Lent (the user held nothing there), or refused (the user holds or
    /// has lent their place already).
    pub lent: bool,
}

/// Agent -> coordinator, in a sync: the agent's borrows and its loans.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LimitsUp {
    /// As a borrower: places asked for and not yet answered or used.
    #[serde(default)]
    pub asks: Vec<Borrow>,
    /// As a borrower: places to give back (the hold ended unsold, or was
    /// never made), until the coordinator says they are back.
    #[serde(default)]
    pub returns: Vec<Borrow>,
    /// As a home: decisions on loans the coordinator asked for, each
    /// durable in the agent's database before it is sent.
    #[serde(default)]
    pub answers: Vec<LendAnswer>,
    /// As a home: loans the coordinator asked back that are back.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub returned: Vec<TransferId>,
}

impl LimitsUp {
    /// Whether there is nothing to say.
    pub fn is_empty(&self) -> bool {
        self.asks.is_empty()
            && self.returns.is_empty()
            && self.answers.is_empty()
            && self.returned.is_empty()
    }

    /// Adds `up` to what the next call carries; a later answer to a loan
    /// replaces an earlier one of the same id.
    pub fn gather(&mut self, up: LimitsUp) {
        self.asks.extend(up.asks);
        self.returns.extend(up.returns);
        self.answers
            .retain(|a| !up.answers.iter().any(|b| b.id == a.id));
        self.answers.extend(up.answers);
        self.returned.extend(up.returned);
    }
}

/// Coordinator -> agent, in a sync's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LimitsDown {
    /// As a borrower: the home's answers to the request's asks that have one.
    #[serde(default)]
    pub answers: Vec<LendAnswer>,
    /// As a borrower: the request's returns that are complete (the home
    /// took its place back, or never lent it); the agent may forget them.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub returned: Vec<TransferId>,
    /// As a home: loans to decide (every one still undecided).
    #[serde(default)]
    pub lend_asks: Vec<Borrow>,
    /// As a home: loans to take back (every one not yet confirmed back).
    #[serde(default)]
    pub lend_returns: Vec<Borrow>,
}

impl LimitsDown {
    /// Whether there is nothing to say.
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
            && self.returned.is_empty()
            && self.lend_asks.is_empty()
            && self.lend_returns.is_empty()
    }
}

/// Agent -> coordinator, held open: "wake me when you have something for me".
///
/// The coordinator answers at once if its notice number for the region is
/// past `seen`, else when it next has news for the region (a recall, a
/// grant, a mode change), else after `wait_ms`; the agent then syncs at
/// once instead of at its next interval. So a recall reaches a region in
/// one network hop, not a sync interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WatchRequest {
    /// The agent's fencing epoch in its own database.
    pub epoch: i64,
    /// The last notice number the agent saw (0 at start).
    pub seen: u64,
    /// Longest the coordinator may hold the request, ms.
    pub wait_ms: u64,
}

/// Coordinator -> agent, the answer to a [`WatchRequest`].
///
/// With news it carries what the region's next sync would answer for the
/// SKUs concerned: their directives and the grants pending to the region.
/// The agent applies them at once, as it applies a sync's answer (grants
/// are credited once per id, `return_until` is cumulative), so a grant
/// reaches a far region in half a round trip and a recall's units start
/// back after half a round trip, instead of after a further sync. The
/// agent still syncs at once: that sync acknowledges the grants, delivers
/// the returns and corrects anything this answer read before it changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WatchResponse {
    /// The region's current notice number; past `seen` means: sync now.
    pub notice: u64,
    /// Grants pending to the region, for the SKUs in `skus`.
    #[serde(default)]
    pub grants: Vec<TransferMsg>,
    /// Directives of the SKUs with news for the region (none when the
    /// coordinator leaves everything to the sync).
    #[serde(default)]
    pub skus: Vec<SkuDirective>,
    /// Loans asked of the region and answers to its borrows since its last
    /// watch answer, ahead of the sync that answers them all again.
    #[serde(default, skip_serializing_if = "LimitsDown::is_empty")]
    pub limits: LimitsDown,
}

/// Agent -> coordinator: units a buyer needs now that the region lacks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TakeRequest {
    /// Idempotency id; becomes the grant's id, so a retry gets the same grant.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub id: TransferId,
    /// The SKU's tenant.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "acme"))]
    pub tenant: Tenant,
    /// The SKU.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "drop"))]
    pub sku: Sku,
    /// Units its waiting buyers need, at least 1.
    pub units: u64,
    /// Units wanted beyond `units` for the region's next buyers; the
    /// coordinator grants them only up to the region's share by demand.
    #[serde(default)]
    pub prefetch: u64,
    /// Units the region has credited from grants, cumulative, as of the
    /// take (its ledger's `received`); 0 from an agent that does not say.
    #[serde(default)]
    pub received: u64,
    /// Units the region has given back, cumulative, as of the take.
    #[serde(default)]
    pub returned: u64,
}

/// Coordinator -> agent, the answer to a [`TakeRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TakeResponse {
    /// The grant made (possibly fewer units than asked), if any.
    pub grant: Option<TransferMsg>,
    /// No unit is free anywhere: the units not granted are sold out.
    #[serde(alias = "exhausted")]
    pub sold_out_everywhere: bool,
    /// The SKU is paused at the coordinator.
    pub paused: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(available: u64, sale_rate_per_s: f64) -> SkuReport {
        SkuReport {
            tenant: Tenant::parse("t").unwrap(),
            sku: Sku::parse("s").unwrap(),
            available,
            held: 0,
            sold: 0,
            sale_rate_per_s,
            set_aside: 0,
        }
    }

    /// Goal: a report differs from the last one sent when a counter moved
    /// or the rate moved by more than a tenth and more than the floor, and
    /// only then.
    #[test]
    fn a_report_differs_on_counters_or_a_real_rate_change() {
        assert!(report(3, 1.0).differs_from(&report(2, 1.0)));
        assert!(!report(3, 1.05).differs_from(&report(3, 1.0)));
        assert!(report(3, 1.2).differs_from(&report(3, 1.0)));
        assert!(!report(3, 0.04).differs_from(&report(3, 0.0)));
        assert!(report(3, 0.0).differs_from(&report(3, 0.5)));
    }

    /// Goal: units set aside for carts are reported held, never more than
    /// are stored available, and the report adds up to the stored counters.
    #[test]
    fn units_set_aside_are_reported_held() {
        let stored = Ledger {
            available: 5,
            held: 2,
            sold: 3,
            received: 10,
            returned: 0,
        };
        let of = |aside| {
            SkuReport::of(
                report(0, 0.0).tenant,
                report(0, 0.0).sku,
                stored,
                aside,
                1.5,
            )
        };
        let r = of(2);
        assert_eq!(
            (r.available, r.held, r.sold, r.sale_rate_per_s),
            (3, 4, 3, 1.5)
        );
        let r = of(9);
        assert_eq!((r.available, r.held), (0, 7));
        assert_eq!((of(0).available, of(0).held), (5, 2));
    }

    /// Goal: a sync request from an agent that does not send `full` is
    /// read as a full one, as such agents report every SKU.
    #[test]
    fn a_request_without_full_is_full() {
        let json = r#"{"epoch":1,"seq":1,"rtt_ms":0,"skus":[],"acks":[],"returns":[]}"#;
        let req: SyncRequest = serde_json::from_str(json).unwrap();
        assert!(req.full);
    }

    /// Goal: an id that breaks the identifier rules is refused when the
    /// message is read, so no code further in sees it.
    #[test]
    fn a_message_with_a_bad_id_is_refused_at_the_boundary() {
        let good = r#"{"id":"g-1","tenant":"acme","sku":"drop","units":1}"#;
        let t: TransferMsg = serde_json::from_str(good).unwrap();
        assert_eq!((t.id.as_str(), t.tenant.as_str()), ("g-1", "acme"));
        for bad in [
            r#"{"id":"","tenant":"acme","sku":"drop","units":1}"#,
            r#"{"id":"g-1","tenant":"ac me","sku":"drop","units":1}"#,
            r#"{"id":"g-1","tenant":"acme","sku":"dr/op","units":1}"#,
        ] {
            assert!(serde_json::from_str::<TransferMsg>(bad).is_err(), "{bad}");
        }
    }

    /// Goal: "sold out everywhere" has one name on the wire; a coordinator
    /// of the previous release, which sends `exhausted` and `sold_out`, is
    /// still understood.
    #[test]
    fn sold_out_everywhere_is_read_under_its_old_names() {
        let old = r#"{"grant":null,"exhausted":true,"paused":false}"#;
        assert!(
            serde_json::from_str::<TakeResponse>(old)
                .unwrap()
                .sold_out_everywhere
        );
        let new = serde_json::to_value(TakeResponse {
            grant: None,
            sold_out_everywhere: true,
            paused: false,
        })
        .unwrap();
        assert_eq!(new["sold_out_everywhere"], true);
        let old = r#"{"tenant":"t","sku":"s","mode":"ESCROW","paused":false,"max_per_user":1,
                      "hold_ttl_ms":1000,"return_until":0,"sold_out":true}"#;
        assert!(
            serde_json::from_str::<SkuDirective>(old)
                .unwrap()
                .sold_out_everywhere
        );
    }
}
