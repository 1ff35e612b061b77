//! The owner without I/O: a harness moves its reads, takes and commits by
//! hand to an in-memory database ([`Book`]) and a stub coordinator, as
//! quinn-proto's tests move packets between two endpoints.

use std::collections::{BTreeMap, HashMap, HashSet};

use proptest::prelude::*;

use super::*;
use crate::admission::Deadline;
use crate::batch::{Batch, BatchOutcome};
use crate::book::Book;
use crate::ids::{Qty, UserId};
use crate::policy::CENTRAL_RETURN_GRACE_MS;
use crate::protocol::{SkuDirective, TakeRequest, TakeResponse};
use crate::reservation::Status;

const START_MS: u64 = 1_000_000;

/// One owner, its database and a coordinator holding `pool` units.
struct Harness {
    owner: SkuOwner,
    book: Book,
    applied_grants: HashSet<TransferId>,
    /// Grants the coordinator debited and the region has not credited.
    in_transit: BTreeMap<TransferId, u64>,
    pool: u64,
    total: u64,
    now_ms: u64,
    next_ticket: Ticket,
    answers: HashMap<Ticket, Reply>,
    asked: HashSet<Ticket>,
    /// Units each reserve ticket asked for.
    wanted: HashMap<Ticket, u64>,
    /// The key each reserve ticket asked with.
    keys: HashMap<Ticket, RequestKey>,
    /// So many commits fail next, each [`RELOAD_RETRY_MS`] after the one
    /// before (nothing written).
    commits_failing: u32,
    /// The next commit happens, but its answer is lost (the connection
    /// broke): the owner hears it failed.
    lose_next_answer: bool,
    /// So many reloads fail next (the database cannot be read), each
    /// [`RELOAD_RETRY_MS`] after the one before.
    reloads_failing: u32,
    reachable: bool,
}

impl Harness {
    fn new(local: u64, pool: u64) -> Self {
        let settings = SkuSettings::parse(Some(2), Some(5_000)).unwrap();
        let mut book = Book::new(Sku::parse("sku").unwrap(), settings);
        book.ledger.receive(local);
        let owner = SkuOwner::new(
            OwnerConfig {
                max_in_flight: 8,
                parked_max: 64,
                coordinated: true,
                transfer_id_prefix: "test".into(),
            },
            Self::record(&book),
            START_MS,
        );
        Self {
            owner,
            book,
            applied_grants: HashSet::new(),
            in_transit: BTreeMap::new(),
            pool,
            total: local + pool,
            now_ms: START_MS,
            next_ticket: 0,
            answers: HashMap::new(),
            asked: HashSet::new(),
            wanted: HashMap::new(),
            keys: HashMap::new(),
            commits_failing: 0,
            lose_next_answer: false,
            reloads_failing: 0,
            reachable: true,
        }
    }

    /// No unit here or in the pool, one in transit elsewhere: not sold
    /// out, so buyers wait for units.
    fn with_a_unit_elsewhere() -> Self {
        let mut h = Self::new(0, 0);
        h.in_transit
            .insert(TransferId::parse("elsewhere").unwrap(), 1);
        h.total += 1;
        h
    }

    fn record(book: &Book) -> SkuRecord {
        let units = |s: Status| -> u64 {
            book.reservations()
                .filter(|r| r.status == s)
                .map(|r| r.qty.units())
                .sum()
        };
        SkuRecord {
            tenant: Tenant::parse("t").unwrap(),
            sku: book.sku.clone(),
            ledger: book.ledger,
            settings: book.settings,
            paused: book.paused,
            mode: Mode::Escrow,
            rows_held: units(Status::Held),
            rows_sold: units(Status::Sold),
            holds: book
                .reservations()
                .filter(|r| r.status == Status::Held)
                .cloned()
                .collect(),
        }
    }

    fn ticket(&mut self) -> Ticket {
        self.next_ticket += 1;
        self.asked.insert(self.next_ticket);
        self.next_ticket
    }

    fn reserve(&mut self, key: u8, user: u8, qty: u32) -> Command {
        let ticket = self.ticket();
        self.wanted.insert(ticket, qty.into());
        let request_key = RequestKey::parse(&format!("k{key}")).unwrap();
        self.keys.insert(ticket, request_key.clone());
        Command::Reserve {
            ticket,
            request: ReserveRequest {
                borrow: None,
                request_key,
                user_id: UserId::parse(&format!("u{user}")).unwrap(),
                qty: Qty::parse(qty.into(), 2).unwrap(),
                ttl: None,
            },
            deadline: Deadline::after(self.now_ms, 10_000),
            known: false,
        }
    }

    fn act(&mut self, key: u8, action: Action) -> Command {
        Command::Act {
            ticket: self.ticket(),
            key: RequestKey::parse(&format!("k{key}")).unwrap(),
            action,
            deadline: Deadline::after(self.now_ms, 10_000),
        }
    }

    /// Starts a batch and carries out its I/O until the owner is idle.
    fn batch(&mut self, commands: Vec<Command>) {
        self.owner.handle_commands(self.now_ms, commands);
        self.drive();
    }

    fn drive(&mut self) {
        while let Some(io) = self.owner.poll_io() {
            match io {
                Io::Read(keys) => {
                    let rows = keys.iter().filter_map(|k| self.book.get(k)).cloned();
                    self.owner.handle_read(Some(rows.collect()));
                }
                Io::Take(req) => {
                    if !self.reachable {
                        self.owner.handle_take_answer(None);
                        continue;
                    }
                    let granted = req.units.min(self.pool);
                    self.pool -= granted;
                    let grant = (granted > 0).then(|| TransferMsg {
                        id: req.id.clone(),
                        units: granted,
                        ..req.clone().into_transfer()
                    });
                    if let Some(g) = &grant {
                        self.in_transit.insert(g.id.clone(), g.units);
                    }
                    let sold_out_everywhere =
                        granted < req.units && self.pool == 0 && self.elsewhere() == 0;
                    self.owner.handle_take_answer(Some(TakeResponse {
                        grant,
                        sold_out_everywhere,
                        paused: false,
                    }));
                }
                Io::Commit(batch) => {
                    if std::mem::take(&mut self.lose_next_answer) {
                        self.write(&batch);
                        self.owner
                            .handle_commit_result(batch, Err(CommitError::Unknown));
                        continue;
                    }
                    if self.commits_failing > 0 {
                        self.commits_failing -= 1;
                        self.now_ms += RELOAD_RETRY_MS;
                        self.owner
                            .handle_commit_result(batch, Err(CommitError::Failed));
                        continue;
                    }
                    let outcome = self.write(&batch);
                    self.owner.handle_commit_result(batch, Ok(outcome));
                }
                Io::Reload if self.reloads_failing > 0 => {
                    self.reloads_failing -= 1;
                    self.now_ms += RELOAD_RETRY_MS;
                    self.owner.handle_reload(self.now_ms, None);
                }
                Io::Reload => self
                    .owner
                    .handle_reload(self.now_ms, Some(Self::record(&self.book))),
            }
        }
        while let Some((ticket, reply)) = self.owner.poll_reply() {
            assert!(
                self.asked.contains(&ticket),
                "an answer to a ticket never given"
            );
            assert!(
                self.answers.insert(ticket, reply).is_none(),
                "ticket {ticket} answered twice"
            );
        }
    }

    /// Units free outside this region: only grants in transit here.
    fn elsewhere(&self) -> u64 {
        self.in_transit.values().sum()
    }

    /// The store's side of a commit, in its order.
    fn write(&mut self, batch: &Batch) -> BatchOutcome {
        let mut applied = Vec::new();
        for g in &batch.grants {
            if self.applied_grants.insert(g.id.clone()) {
                self.book.ledger.receive(g.units);
                self.in_transit.remove(&g.id);
                applied.push(g.id.clone());
            }
        }
        let mut outcome = self
            .book
            .commit(batch)
            .expect("the book takes every owner batch");
        for r in &batch.returns {
            self.book.ledger.return_units(r.units).unwrap();
            self.pool += r.units;
        }
        outcome.applied_grants = applied;
        outcome
    }

    /// Grants the coordinator keeps offering until the region credits them.
    fn redeliver(&mut self, return_until: u64) {
        let grants = self
            .in_transit
            .iter()
            .map(|(id, units)| TransferMsg {
                id: id.clone(),
                tenant: Tenant::parse("t").unwrap(),
                sku: Sku::parse("sku").unwrap(),
                units: *units,
            })
            .collect();
        self.owner
            .handle_directive(&directive(Mode::Escrow, return_until), grants);
    }

    fn check(&self) -> Result<(), TestCaseError> {
        prop_assert!(self.owner.is_idle());
        if !self.owner.is_halted() {
            prop_assert_eq!(
                self.owner.ledger(),
                self.book.ledger,
                "memory equals the database"
            );
        }
        prop_assert_eq!(
            self.pool + self.elsewhere() + self.book.ledger.quota(),
            self.total,
            "no unit created or lost"
        );
        Ok(())
    }
}

/// The coordinator's directive for the test SKU: `mode` and `return_until`,
/// the harness's settings, not paused, not sold out.
fn directive(mode: Mode, return_until: u64) -> SkuDirective {
    SkuDirective {
        user_limit_scope: Default::default(),
        limit_regions: Vec::new(),
        tenant: Tenant::parse("t").unwrap(),
        sku: Sku::parse("sku").unwrap(),
        mode,
        paused: false,
        max_per_user: 2,
        hold_ttl_ms: 5_000,
        return_until,
        sold_out_everywhere: false,
    }
}

impl TakeRequest {
    fn into_transfer(self) -> TransferMsg {
        TransferMsg {
            id: self.id,
            tenant: self.tenant,
            sku: self.sku,
            units: self.units,
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Reserve {
        key: u8,
        user: u8,
        qty: u32,
    },
    Confirm(u8),
    Release(u8),
    Extend(u8),
    /// Run a batch with everything queued.
    Batch,
    Advance(u16),
    Directive(u8),
    FailNextCommit,
    LoseNextAnswer,
    Unreachable(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..24u8, 0..10u8, 1..=2u32).prop_map(|(key, user, qty)| Op::Reserve { key, user, qty }),
        2 => (0..24u8).prop_map(Op::Confirm),
        2 => (0..24u8).prop_map(Op::Release),
        1 => (0..24u8).prop_map(Op::Extend),
        4 => Just(Op::Batch),
        2 => (0..3_000u16).prop_map(Op::Advance),
        1 => (0..6u8).prop_map(Op::Directive),
        1 => Just(Op::FailNextCommit),
        1 => Just(Op::LoseNextAnswer),
        1 => any::<bool>().prop_map(Op::Unreachable),
    ]
}

proptest! {
    /// Goal: under any mix of buyers, actions, take answers, failed commits,
    /// directives and clock moves, the owner answers every ticket exactly
    /// once, its memory equals the database after every batch, no unit is
    /// created or lost between region, pool and transit, SOLD_OUT is
    /// answered only when no unit is free anywhere and never to a key that
    /// holds a unit, and every row's buyers hear of it (HELD, REPLAY, or
    /// PAUSED while its commit's outcome is unknown).
    #[test]
    fn random_sequences_keep_memory_equal_to_the_database(
        ops in proptest::collection::vec(op(), 1..120),
        local in 0..6u64,
        pool in 0..6u64,
    ) {
        let mut h = Harness::new(local, pool);
        let mut queued = Vec::new();
        let mut returned = 0;
        for op in ops {
            match op {
                Op::Reserve { key, user, qty } => { let c = h.reserve(key, user, qty); queued.push(c); }
                Op::Confirm(k) => { let c = h.act(k, Action::Confirm); queued.push(c); }
                Op::Release(k) => { let c = h.act(k, Action::Release); queued.push(c); }
                Op::Extend(k) => { let c = h.act(k, Action::Extend(None)); queued.push(c); }
                Op::Batch => {
                    let room = h.owner.batch_room();
                    let rest = queued.split_off(room.min(queued.len()));
                    let now = std::mem::replace(&mut queued, rest);
                    let before = h.answers.clone();
                    h.batch(now);
                    for (t, reply) in &h.answers {
                        if before.contains_key(t) { continue; }
                        if let Reply::Reserve(ReserveReply::SoldOut) = reply {
                            let free = h.pool + h.elsewhere() + h.book.ledger.available;
                            prop_assert!(free < h.wanted[t], "SOLD_OUT while {} units are free", free);
                            // The driver's key memory answers final keys; a live hold is the owner's.
                            let key = &h.keys[t];
                            let live = h.book.get(key).is_some_and(|r| r.status == Status::Held);
                            prop_assert!(!live, "SOLD_OUT to {:?}, which holds a unit", key);
                        }
                    }
                }
                Op::Advance(ms) => {
                    h.now_ms += u64::from(ms);
                    h.owner.handle_timeout(h.now_ms);
                    h.drive();
                }
                Op::Directive(n) => {
                    returned += u64::from(n % 3);
                    h.redeliver(returned);
                }
                Op::FailNextCommit => h.commits_failing += 1,
                Op::LoseNextAnswer => h.lose_next_answer = true,
                Op::Unreachable(down) => h.reachable = !down,
            }
            h.check()?;
        }
        h.batch(std::mem::take(&mut queued));
        h.owner.handle_close();
        h.drive();
        h.check()?;
        prop_assert_eq!(h.answers.len(), h.asked.len(), "every ticket answered");
        // Every row's buyers heard the truth: HELD, REPLAY on a retry, or
        // (the commit's outcome not known by their deadline) PAUSED.
        let truth: HashSet<&RequestKey> = h.answers.iter().filter_map(|(t, r)| match r {
            Reply::Reserve(ReserveReply::Held(r) | ReserveReply::Replay(r)) => Some(&r.request_key),
            Reply::Reserve(ReserveReply::Paused(PauseReason::Storage)) => h.keys.get(t),
            _ => None,
        }).collect();
        for row in h.book.reservations() {
            prop_assert!(truth.contains(&row.request_key), "{:?}'s buyers were not told of its row", row.request_key);
        }
        for reply in h.answers.values() {
            if let Reply::Reserve(ReserveReply::Held(r)) = reply {
                prop_assert!(h.book.get(&r.request_key).is_some(), "HELD {:?} without its row", r.request_key);
            }
        }
    }
}

/// Goal: a commit that happened but whose answer was lost (the owner
/// hears it failed) is settled from the rows: its buyers hear HELD, once,
/// and memory equals the database. A commit that really failed is decided
/// again, and only a second failure is answered PAUSED (`storage`).
#[test]
fn a_commit_of_unknown_outcome_is_settled_from_the_rows() {
    let mut h = Harness::new(4, 0);
    h.lose_next_answer = true;
    let first = vec![h.reserve(1, 1, 1), h.reserve(2, 2, 2)];
    h.batch(first);
    for ticket in [1, 2] {
        assert!(
            matches!(h.answers[&ticket], Reply::Reserve(ReserveReply::Held(_))),
            "ticket {ticket}: {:?}",
            h.answers[&ticket]
        );
    }
    assert_eq!(h.book.reservations().count(), 2);
    h.check().unwrap();

    h.commits_failing = 1;
    let second = vec![h.reserve(3, 3, 1)];
    h.batch(second);
    assert!(matches!(
        h.answers[&3],
        Reply::Reserve(ReserveReply::Held(_))
    ));
    assert_eq!(h.book.reservations().count(), 3);
    h.check().unwrap();
}

/// Goal: a commit of unknown outcome is settled, not guessed, while the
/// database cannot be read or written (a failover in progress): reads and
/// commits are tried again until they work, then the buyer hears HELD,
/// once, from the row its lost commit wrote.
#[test]
fn a_commit_of_unknown_outcome_is_settled_through_a_failover() {
    let mut h = Harness::new(4, 0);
    h.lose_next_answer = true;
    h.reloads_failing = 20;
    h.commits_failing = 3;
    let first = vec![h.reserve(1, 1, 1)];
    h.batch(first);
    assert_eq!((h.reloads_failing, h.commits_failing), (0, 0));
    assert!(
        matches!(h.answers[&1], Reply::Reserve(ReserveReply::Held(_))),
        "{:?}",
        h.answers[&1]
    );
    assert_eq!(h.book.reservations().count(), 1);
    h.check().unwrap();
}

/// Goal: a row found after a commit of unknown outcome is not answered
/// HELD until a commit after the read is durable (read from a primary, it
/// may not be on the standby that will be promoted): with every commit
/// failing, its buyer hears PAUSED (`storage`), not HELD.
#[test]
fn a_found_row_is_answered_only_after_a_durable_commit() {
    let mut h = Harness::new(4, 0);
    h.lose_next_answer = true;
    h.commits_failing = u32::MAX;
    let first = vec![h.reserve(1, 1, 1)];
    h.batch(first);
    assert_eq!(
        h.answers[&1],
        Reply::Reserve(ReserveReply::Paused(PauseReason::Storage))
    );
    assert_eq!(h.book.reservations().count(), 1);
    // Once the database commits again, memory follows it and no unit is lost.
    h.commits_failing = 0;
    h.batch(Vec::new());
    h.check().unwrap();
}

/// Goal: a commit of unknown outcome that cannot be settled by its
/// buyer's deadline (10 s here) is answered PAUSED (`storage`) then, never
/// HELD from a guess, and not later either; the buyer's retry with the
/// same key gets its row once the database answers.
#[test]
fn an_unsettled_commit_is_answered_paused_at_its_buyers_deadline() {
    let mut h = Harness::new(4, 0);
    h.lose_next_answer = true;
    h.reloads_failing = 100;
    let first = vec![h.reserve(1, 1, 1)];
    let started = h.now_ms;
    h.batch(first);
    assert_eq!(
        h.answers[&1],
        Reply::Reserve(ReserveReply::Paused(PauseReason::Storage))
    );
    let waited = h.now_ms - started;
    assert!(
        (10_000..10_000 + 2 * RELOAD_RETRY_MS).contains(&waited),
        "answered after {waited} ms"
    );
    h.reloads_failing = 0;
    let again = vec![h.reserve(1, 1, 1)];
    h.batch(again);
    // Its 5 s hold expired meanwhile: the key's row answers.
    match &h.answers[&2] {
        Reply::Reserve(ReserveReply::Replay(r)) => assert_eq!(r.status, Status::Expired),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.book.reservations().count(), 1);
    h.check().unwrap();
}

/// Goal: extend then confirm of one hold in one batch both succeed, in
/// the order decided, and the database ends SOLD with the units sold.
#[test]
fn extend_then_confirm_in_one_batch_apply_in_order() {
    let mut h = Harness::new(1, 0);
    let c = h.reserve(1, 1, 1);
    h.batch(vec![c]);
    let extend = h.act(1, Action::Extend(None));
    let confirm = h.act(1, Action::Confirm);
    let (te, tc) = (h.next_ticket - 1, h.next_ticket);
    h.batch(vec![extend, confirm]);
    assert!(matches!(h.answers[&te], Reply::Act(ActReply::Accepted(_))));
    match &h.answers[&tc] {
        Reply::Act(ActReply::Accepted(r)) => assert_eq!(r.status, Status::Sold),
        other => panic!("confirm answered {other:?}"),
    }
    assert_eq!(h.book.ledger.sold, 1);
    assert_eq!(h.owner.ledger(), h.book.ledger);
}

/// Goal: a directive delivered while a batch waits on its take is applied
/// with that batch: the recall is debited and the mode persisted.
#[test]
fn directive_during_a_take_applies_with_the_batch() {
    let mut h = Harness::new(2, 5);
    let first: Vec<Command> = (10..12).map(|k| h.reserve(k, k, 1)).collect();
    h.batch(first);
    let many: Vec<Command> = (2..5).map(|k| h.reserve(k, k, 1)).collect();
    h.owner.handle_commands(h.now_ms, many);
    let Some(Io::Take(_)) = h.owner.poll_io() else {
        panic!("three buyers and no unit left: the batch asks the coordinator");
    };
    h.owner
        .handle_directive(&directive(Mode::Central, 0), Vec::new());
    h.owner.handle_take_answer(None);
    let Some(Io::Commit(batch)) = h.owner.poll_io() else {
        panic!("the batch commits");
    };
    assert!(batch.changes.contains(&StockChange::Mode(Mode::Central)));
    assert_eq!(h.owner.mode(), Mode::Central);
}

/// Goal: a batch whose buyers partly fit commits those holds without
/// waiting for the coordinator; the rest wait, and the next batch, right
/// after the commit, asks for their units.
#[test]
fn buyers_that_fit_do_not_wait_for_a_take() {
    let mut h = Harness::new(2, 5);
    let buyers: Vec<Command> = (1..5).map(|k| h.reserve(k, k, 1)).collect();
    let tickets: Vec<u64> = (h.next_ticket - 3..=h.next_ticket).collect();
    h.owner.handle_commands(h.now_ms, buyers);
    let Some(Io::Commit(batch)) = h.owner.poll_io() else {
        panic!("what fits commits first");
    };
    assert_eq!(batch.holds.len(), 2);
    let outcome = h.write(&batch);
    h.owner.handle_commit_result(batch, Ok(outcome));
    while let Some((ticket, reply)) = h.owner.poll_reply() {
        h.answers.insert(ticket, reply);
    }
    let held = tickets
        .iter()
        .filter(|t| {
            matches!(
                h.answers.get(t),
                Some(Reply::Reserve(ReserveReply::Held(_)))
            )
        })
        .count();
    assert_eq!(held, 2);
    assert_eq!(h.owner.parked(), 2);
    assert!(
        h.owner.poll_timeout() <= h.now_ms,
        "the waiting buyers ask at once"
    );
    h.owner.handle_timeout(h.now_ms);
    let Some(Io::Take(take)) = h.owner.poll_io() else {
        panic!("the next batch asks the coordinator for the two that did not fit");
    };
    assert_eq!(take.units, 2);
    assert_eq!(h.owner.ledger().available, 0);
    assert_eq!(h.owner.ledger().held, 2);
}

/// Goal: units granted by a directive and not yet credited serve the
/// region's buyers before any take: the batch that finds them credits
/// them without asking the coordinator (a round trip that, across an
/// ocean, cost its buyers a quarter of a second), and the next batch holds
/// from them at once. A copy of a grant the owner already credited (the
/// coordinator resends a grant until it reads the ack) is no reason to
/// wait: the next buyer short of units asks at once.
#[test]
fn a_grant_waiting_to_be_credited_serves_buyers_before_any_take() {
    let mut h = Harness::new(0, 5);
    h.pool -= 3;
    h.in_transit
        .insert(TransferId::parse("grant-1").unwrap(), 3);
    h.redeliver(0);
    let buyers: Vec<Command> = (1..3).map(|k| h.reserve(k, k, 1)).collect();
    h.owner.handle_commands(h.now_ms, buyers);
    let Some(Io::Commit(batch)) = h.owner.poll_io() else {
        panic!("the grant is credited before any take");
    };
    assert_eq!((batch.grants.len(), batch.holds.len()), (1, 0));
    let outcome = h.write(&batch);
    h.owner.handle_commit_result(batch, Ok(outcome));
    assert!(h.owner.has_overflow(), "the buyers go again at once");
    h.batch(Vec::new());
    assert_eq!(h.owner.ledger().held, 2);
    assert_eq!(h.pool, 2, "no take was made");

    let last = h.reserve(3, 3, 1);
    h.batch(vec![last]);
    assert_eq!(h.owner.ledger().available, 0);
    let copy = TransferMsg {
        id: TransferId::parse("grant-1").unwrap(),
        tenant: Tenant::parse("t").unwrap(),
        sku: Sku::parse("sku").unwrap(),
        units: 3,
    };
    h.owner
        .handle_directive(&directive(Mode::Escrow, 0), vec![copy]);
    let next = h.reserve(4, 4, 1);
    h.owner.handle_commands(h.now_ms, vec![next]);
    let Some(Io::Take(take)) = h.owner.poll_io() else {
        panic!("a copy of a credited grant does not hold the take back");
    };
    assert_eq!(take.units, 1);
    h.owner.handle_take_answer(None);
    h.drive();
    h.check().unwrap();
}

/// Goal: a region reports no demand until its spell of demand is
/// [`RATE_REPORT_AFTER_MS`] old (its first units say little of its rate),
/// and then asks for a sync at once to report its figure.
#[test]
fn a_first_figure_waits_for_the_spell_to_be_worth_reporting() {
    let mut h = Harness::new(100, 0);
    let first = h.reserve(1, 1, 1);
    h.batch(vec![first]);
    assert_eq!(h.owner.sale_rate_per_s(), 0.0, "one unit is no figure");
    assert!(!h.owner.take_sync_due());
    h.now_ms += RATE_REPORT_AFTER_MS;
    let second = h.reserve(2, 2, 1);
    h.batch(vec![second]);
    assert!(h.owner.sale_rate_per_s() > 0.0);
    assert!(h.owner.take_sync_due(), "the first figure is sent at once");
    assert!(!h.owner.take_sync_due(), "and asked for once");
}

/// Goal: when a region's requests stop, the owner wakes at the moment its
/// demand reads as stopped and asks for a sync at once, so the units kept
/// for its buyers can move to buyers elsewhere; once, not at every tick.
#[test]
fn a_spell_of_demand_that_ends_is_reported_at_once() {
    let mut h = Harness::new(1_000, 0);
    for key in 0..50u8 {
        let request = h.reserve(key, key, 1);
        h.batch(vec![request]);
        h.now_ms += 2;
    }
    assert!(h.owner.sale_rate_per_s() > 100.0);
    assert!(h.owner.take_sync_due(), "the first figure");
    let stops_ms = h.now_ms - 2 + crate::rate::IDLE_MIN_MS as u64;
    while h.owner.poll_timeout() < stops_ms {
        h.now_ms = h.owner.poll_timeout();
        h.owner.handle_timeout(h.now_ms);
        h.drive();
        assert!(!h.owner.take_sync_due(), "not before demand stops");
    }
    assert_eq!(
        h.owner.poll_timeout(),
        stops_ms,
        "it wakes when demand stops"
    );
    h.now_ms = stops_ms;
    h.owner.handle_timeout(h.now_ms);
    h.drive();
    assert!(h.owner.take_sync_due(), "demand that stopped is news");
    assert!(h.owner.sale_rate_per_s() <= 1_000.0 / crate::rate::IDLE_MIN_MS);
    h.now_ms = h.owner.poll_timeout();
    h.owner.handle_timeout(h.now_ms);
    h.drive();
    assert!(!h.owner.take_sync_due(), "and is told once");
    h.check().unwrap();
}

/// Goal: a take that brought every unit it asked for lets the very next
/// batch take again (central mode takes once per batch); one that fell
/// short makes the next batch wait [`TAKE_RETRY_MS`] before asking again.
#[test]
fn only_a_take_that_fell_short_makes_the_next_one_wait() {
    let mut h = Harness::new(0, 1);
    let first = h.reserve(1, 1, 1);
    let first_ticket = h.next_ticket;
    h.batch(vec![first]);
    assert!(matches!(
        h.answers.get(&first_ticket),
        Some(Reply::Reserve(ReserveReply::Held(_)))
    ));

    h.pool = 1;
    h.total += 1;
    h.now_ms += 1;
    let second = h.reserve(2, 2, 1);
    let second_ticket = h.next_ticket;
    h.batch(vec![second]);
    assert!(
        matches!(
            h.answers.get(&second_ticket),
            Some(Reply::Reserve(ReserveReply::Held(_)))
        ),
        "the next batch took at once: {:?}",
        h.answers.get(&second_ticket)
    );

    // Two units wanted, one free in the pool and one in transit elsewhere:
    // the take falls short and the buyer left over waits.
    h.pool = 1;
    h.in_transit
        .insert(TransferId::parse("elsewhere").unwrap(), 1);
    h.total += 2;
    h.now_ms += 1;
    let (third, fourth) = (h.reserve(3, 3, 1), h.reserve(4, 4, 1));
    let fourth_ticket = h.next_ticket;
    h.batch(vec![third, fourth]);
    assert!(!h.answers.contains_key(&fourth_ticket), "parked");
    h.now_ms += 1;
    h.owner.handle_timeout(h.now_ms);
    assert_eq!(
        h.owner.poll_io(),
        None,
        "no take within TAKE_RETRY_MS of one that fell short, and nothing to write"
    );
    h.check().unwrap();
}

/// Goal: in central mode a region gives the leftover quota the
/// coordinator recalls back at its first batch without buyers, but keeps
/// units a release freed for its own buyers until
/// `CENTRAL_RETURN_GRACE_MS` has passed, even when they are recalled.
#[test]
fn central_mode_returns_leftovers_at_once_and_freed_units_after_the_grace() {
    let mut h = Harness::new(5, 0);
    let hold = h.reserve(1, 1, 1);
    h.batch(vec![hold]);
    h.owner
        .handle_directive(&directive(Mode::Central, 4), Vec::new());
    h.now_ms += 1;
    h.owner.handle_timeout(h.now_ms);
    h.drive();
    assert_eq!(
        h.owner.ledger().available,
        0,
        "the 4 left over are in the pool"
    );
    assert_eq!(h.pool, 4);

    h.now_ms += 1;
    let release = h.act(1, Action::Release);
    h.batch(vec![release]);
    assert_eq!(h.owner.ledger().available, 1);
    h.owner
        .handle_directive(&directive(Mode::Central, 5), Vec::new());
    h.now_ms += CENTRAL_RETURN_GRACE_MS - 1;
    h.owner.handle_timeout(h.now_ms);
    h.drive();
    assert_eq!(
        h.owner.ledger().available,
        1,
        "a freed unit waits out the grace"
    );
    h.now_ms += 1;
    h.owner.handle_timeout(h.now_ms);
    h.drive();
    assert_eq!(h.owner.ledger().available, 0);
    assert_eq!(h.pool, 5);
    h.check().unwrap();
}

/// Goal: a take cut short by its buyers' deadline (`handle_take_late`)
/// tells nobody PAUSED: the buyer keeps waiting, parked, and only once its
/// own deadline has passed is it answered REJECTED_WAIT_TIMEOUT, with
/// nothing written; a take that failed (`handle_take_answer(None)`)
/// answers PAUSED at once.
#[test]
fn a_late_take_keeps_its_buyers_waiting_until_their_deadline() {
    let mut h = Harness::new(0, 5);
    let late = h.reserve(1, 1, 1);
    let late_ticket = h.next_ticket;
    h.owner.handle_commands(h.now_ms, vec![late]);
    let Some(Io::Take(_)) = h.owner.poll_io() else {
        panic!("a buyer without local units asks the coordinator");
    };
    h.owner.handle_take_late();
    assert!(h.owner.poll_io().is_none(), "nothing to write");
    assert!(h.owner.poll_reply().is_none(), "nobody is answered yet");
    assert_eq!(h.owner.parked(), 1);

    h.now_ms += 10_001;
    h.owner.handle_timeout(h.now_ms);
    let (ticket, reply) = h.owner.poll_reply().expect("the deadline answers");
    assert_eq!(ticket, late_ticket);
    assert!(matches!(reply, Reply::Reserve(ReserveReply::WaitTimeout)));
    assert_eq!(h.owner.parked(), 0);

    let failed = h.reserve(2, 2, 1);
    let failed_ticket = h.next_ticket;
    h.owner.handle_commands(h.now_ms, vec![failed]);
    let Some(Io::Take(_)) = h.owner.poll_io() else {
        panic!("the second buyer asks too");
    };
    h.owner.handle_take_answer(None);
    let (ticket, reply) = h.owner.poll_reply().expect("a failed take answers");
    assert_eq!(ticket, failed_ticket);
    assert_eq!(
        reply,
        Reply::Reserve(ReserveReply::Paused(PauseReason::CoordinatorUnreachable))
    );
    assert_eq!(h.owner.ledger(), h.book.ledger);
    assert_eq!(h.book.ledger.held, 0);
}

/// Goal: a buyer turned away because the SKU's list of waiting buyers is
/// full is told REJECTED_QUEUE_FULL, not REJECTED_WAIT_TIMEOUT: it never
/// waited. Nothing of it is written, and those parked keep waiting.
#[test]
fn a_full_parked_list_answers_queue_full() {
    let mut h = Harness::with_a_unit_elsewhere();
    let parked_max = 64;
    let buyers = parked_max + 8;
    let mut tickets = Vec::new();
    for first in (0..buyers).step_by(8) {
        let commands: Vec<Command> = (first..first + 8)
            .map(|k| {
                let k = u8::try_from(k).unwrap();
                let command = h.reserve(k, k, 1);
                tickets.push(h.next_ticket);
                command
            })
            .collect();
        h.batch(commands);
        h.now_ms += 1;
    }
    assert_eq!(h.owner.parked(), parked_max);
    let full: Vec<&Reply> = tickets.iter().filter_map(|t| h.answers.get(t)).collect();
    assert_eq!(full.len(), buyers - parked_max, "{full:?}");
    for reply in full {
        assert_eq!(reply, &Reply::Reserve(ReserveReply::QueueFull));
    }
    assert_eq!(h.book.ledger.held, 0);
    assert_eq!(h.owner.ledger(), h.book.ledger);
    h.check().unwrap();
}

/// Goal: a buyer's retry with the key of its request still waiting for
/// units from elsewhere waits with it, parked, instead of being carried
/// to the next batch as overflow: overflow starts the next batch at once,
/// and the first copy, parked first again, sent the retry back each time
/// (the owner ran empty batches back to back, a core's worth, until the
/// units arrived). When they arrive, the first copy is held and the retry
/// hears REPLAY.
#[test]
fn a_retry_of_a_waiting_key_waits_with_it() {
    let mut h = Harness::with_a_unit_elsewhere();
    let first = h.reserve(1, 1, 1);
    h.batch(vec![first]);
    assert_eq!(h.owner.parked(), 1);
    let retry = h.reserve(1, 1, 1);
    h.batch(vec![retry]);
    assert!(
        !h.owner.has_overflow(),
        "the retry does not start batch after batch"
    );
    assert_eq!(h.owner.parked(), 2, "the retry waits with its first copy");
    assert!(h.answers.is_empty());
    // The unit arrives: the first copy holds it, the retry replays it.
    h.pool += 1;
    h.total += 1;
    h.now_ms += TAKE_RETRY_MS;
    h.owner.handle_timeout(h.now_ms);
    h.drive();
    h.owner.handle_timeout(h.now_ms);
    h.drive();
    assert!(
        matches!(h.answers[&1], Reply::Reserve(ReserveReply::Held(_))),
        "{:?}",
        h.answers[&1]
    );
    assert!(
        matches!(h.answers[&2], Reply::Reserve(ReserveReply::Replay(_))),
        "{:?}",
        h.answers.get(&2)
    );
    h.check().unwrap();
}

/// Goal: a cart's item is set aside in memory without a write, so the
/// owner sells no unit twice; dropped, its units are free again; held
/// (the cart wrote it), it is the cart's to expire, never the sweep's.
#[test]
fn units_set_aside_for_a_cart_are_not_sold_twice() {
    let mut h = Harness::new(3, 0);
    let item = RequestKey::cart_item(
        &RequestKey::parse("cart").unwrap(),
        &Sku::parse("sku").unwrap(),
    );
    let set_aside = |h: &mut Harness| {
        let ticket = h.ticket();
        let command = Command::SetAside {
            ticket,
            request: ReserveRequest {
                borrow: None,
                request_key: item.clone(),
                user_id: UserId::parse("u9").unwrap(),
                qty: Qty::parse(2, 2).unwrap(),
                ttl: None,
            },
            deadline: Deadline::after(h.now_ms, 10_000),
        };
        h.batch(vec![command]);
        ticket
    };
    let ticket = set_aside(&mut h);
    let Some(Reply::Reserve(ReserveReply::Held(hold))) = h.answers.get(&ticket).cloned() else {
        panic!("set aside: {:?}", h.answers.get(&ticket));
    };
    assert_eq!(h.book.ledger.available, 3, "nothing written");
    assert_eq!(h.owner.ledger().available, 1);
    let two = h.reserve(1, 1, 2);
    h.batch(vec![two]);
    assert_eq!(
        h.answers[&2],
        Reply::Reserve(ReserveReply::SoldOut),
        "the units set aside are not sold again"
    );
    h.owner.handle_cart_end(&item, CartEnd::Dropped);
    assert_eq!(h.owner.ledger(), h.book.ledger, "dropped: free again");

    set_aside(&mut h);
    let mut cart = Batch::new(
        Tenant::parse("t").unwrap(),
        Sku::parse("sku").unwrap(),
        h.now_ms,
    );
    cart.holds.push(NewHold {
        borrow: None,
        request_key: item.clone(),
        user_id: hold.user_id.clone(),
        qty: hold.qty,
        expires_at_ms: hold.expires_at_ms,
    });
    h.write(&cart);
    h.owner.handle_cart_end(&item, CartEnd::Held);
    assert_eq!(h.owner.ledger(), h.book.ledger, "held: the cart's hold");
    h.now_ms += 10_000;
    h.owner.handle_timeout(h.now_ms);
    h.drive();
    assert_eq!(
        h.book.get(&item).map(|r| r.status),
        Some(Status::Held),
        "the sweep leaves a cart's item to its cart"
    );
    h.owner.handle_cart_end(
        &item,
        CartEnd::Moved(crate::reservation::Transition::Expire),
    );
    assert_eq!(h.owner.ledger().available, 3, "expired with its cart");
}
