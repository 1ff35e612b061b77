//! From the buyers' logs and the coordinator's samples to the numbers of
//! one table row.
//!
//! **Free when turned away.** A buyer is turned away when its story ends
//! without a hold (SOLD_OUT, or out of patience on 503s) at time `t`. Units
//! were free then if the coordinator's view says so, read from the first
//! sample taken after `t` in which every region had reported after
//! `t + REPORT_LAG_MARGIN_US` and the view had no drift. During a run no hold
//! is released and none expires (the TTL is an hour), so units held or sold
//! only grow: a view built from reports made after `t` counts at most the
//! units that were free at `t`, never more. The count is therefore never
//! inflated by a stale report; where no such sample exists the final view
//! (after every region settled) decides, by the same argument.
//!
//! **Order inversion.** A HELD given to a buyer whose first request left
//! after some buyer was already turned away while units were free: the
//! later buyer got what the earlier one was refused.

use crate::crowd::{BuyerLog, End};
use crate::metrics::Counters;
use crate::outcome::{Outcome, Tally};
use crate::sampler::{SkuView, REPORT_LAG_MARGIN_US};

/// Shares of the units whose time to be held the table shows.
pub const HELD_SHARES: [f64; 4] = [0.5, 0.9, 0.99, 1.0];

/// What the run knows besides the buyers' logs.
#[derive(Debug, Clone)]
pub struct Totals {
    /// Units on sale.
    pub units: u64,
    /// Region names, in the sale's order.
    pub regions: Vec<String>,
    /// The coordinator's view once the regions settled.
    pub final_view: SkuView,
    /// The audit's `drift_total`.
    pub drift_total: i64,
    /// Counters over the sale.
    pub counters: Counters,
    /// Each region's round trip to the coordinator, ms, in the sale's order.
    pub rtt_ms: Vec<u64>,
}

/// What one region's buyers saw.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionStats {
    /// The region's name.
    pub name: String,
    /// Its round trip to the coordinator, ms (0: loopback).
    pub rtt_ms: u64,
    /// Buyers who got a hold.
    pub holds: u64,
    /// Wait of those buyers from their first send to their HELD, µs: p50,
    /// p99, p99.9 (0 without holds).
    pub hold_wait_us: [i64; 3],
    /// Holds answered faster than the region's round trip: none of them
    /// can have waited for the coordinator.
    pub holds_under_rtt: u64,
    /// Buyers whose story ended SOLD_OUT.
    pub sold_outs: u64,
    /// Wait of those buyers from their first send to their SOLD_OUT, µs:
    /// p50, p99 (0 without any). A buyer kept waiting for units another
    /// region holds and then told SOLD_OUT is not in the holds' figures,
    /// and a sold-out answer should be the cheapest one.
    pub sold_out_wait_us: [i64; 2],
    /// Every answer the region's buyers got.
    pub answers: Tally,
}

impl RegionStats {
    /// Share of the holds answered faster than the round trip; `None` on
    /// loopback (every answer is) or without holds.
    pub fn under_rtt_share(&self) -> Option<f64> {
        (self.rtt_ms > 0 && self.holds > 0).then(|| self.holds_under_rtt as f64 / self.holds as f64)
    }
}

/// The value at quantile `q` of sorted `values` (nearest rank), 0 if empty.
fn quantile(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Per region: holds, their waits, how many beat the round trip, the
/// sold-out answers' waits, answers.
fn per_region(logs: &[BuyerLog], totals: &Totals) -> Vec<RegionStats> {
    totals
        .regions
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let rtt_ms = totals.rtt_ms.get(i).copied().unwrap_or(0);
            let mine = logs.iter().filter(|l| usize::from(l.region) == i);
            let mut answers = Tally::default();
            let (mut waits, mut sold_out_waits) = (Vec::new(), Vec::new());
            for log in mine {
                answers.merge(&log.answers);
                match log.end {
                    End::Held => waits.push(log.ended_us - log.first_sent_us),
                    End::SoldOut => sold_out_waits.push(log.ended_us - log.first_sent_us),
                    End::GaveUp | End::Refused(_) => {}
                }
            }
            waits.sort_unstable();
            sold_out_waits.sort_unstable();
            let rtt_us = i64::try_from(rtt_ms)
                .unwrap_or(i64::MAX)
                .saturating_mul(1_000);
            RegionStats {
                name: name.clone(),
                rtt_ms,
                holds: waits.len() as u64,
                hold_wait_us: [0.5, 0.99, 0.999].map(|q| quantile(&waits, q)),
                holds_under_rtt: waits.iter().filter(|w| **w < rtt_us).count() as u64,
                sold_outs: sold_out_waits.len() as u64,
                sold_out_wait_us: [0.5, 0.99].map(|q| quantile(&sold_out_waits, q)),
                answers,
            }
        })
        .collect()
}

/// One row's numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct TailStats {
    /// Units on sale.
    pub units: u64,
    /// Buyers in all.
    pub buyers: u64,
    /// Every answer the buyers got.
    pub answers: Tally,
    /// Time from the sale's start to each share of [`HELD_SHARES`] of the
    /// units held, microseconds; `None` if never reached.
    pub held_after_us: [Option<i64>; 4],
    /// Units held, by the buyers' answers.
    pub held_units: u64,
    /// Units held per region, in the sale's order.
    pub held_per_region: Vec<(String, u64)>,
    /// Buyers whose story ended SOLD_OUT.
    pub sold_out_buyers: u64,
    /// Buyers who gave up on 503s.
    pub gave_up: u64,
    /// Buyers who got an answer no buyer should get (4xx other than SOLD_OUT).
    pub refused: u64,
    /// Buyers turned away (SOLD_OUT or gave up) while units were free.
    pub turned_away_free: u64,
    /// Of those, buyers told SOLD_OUT (a false sold-out).
    pub false_sold_outs: u64,
    /// HELDs given to buyers who came after one was turned away while units were free.
    pub inversions: u64,
    /// Share of held units that did not come from a take (a coordinator
    /// round trip while the buyer waited); `None` without the counter.
    pub local_holds: Option<f64>,
    /// Counters over the sale.
    pub counters: Counters,
    /// What each region's buyers saw, in the sale's order.
    pub regions: Vec<RegionStats>,
    /// Units free after the sale (stranded), by the final view.
    pub final_free: i64,
    /// Units held or sold after the sale, by the final view.
    pub final_committed: i64,
    /// Units held or sold beyond the total, by answers or by the view.
    pub oversold: i64,
    /// The audit's `drift_total` after the sale.
    pub drift_total: i64,
}

impl TailStats {
    /// Requests sent.
    pub fn requests(&self) -> u64 {
        self.answers.total()
    }

    /// 503 REJECTED_QUEUE_FULL and REJECTED_WAIT_TIMEOUT answers.
    pub fn rejected(&self) -> u64 {
        self.answers[Outcome::QueueFull] + self.answers[Outcome::WaitTimeout]
    }

    /// Answers that are neither decisions nor the contract's 503s
    /// (transport errors, other 5xx, unexpected statuses).
    pub fn errors(&self) -> u64 {
        self.answers[Outcome::Transport]
            + self.answers[Outcome::ServerError]
            + self.answers[Outcome::Unexpected]
    }

    /// Every unit is held once or still free, the answers agree with the
    /// coordinator, nothing is oversold and the audit shows no drift.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.oversold != 0 {
            problems.push(format!("oversold {} units", self.oversold));
        }
        if self.drift_total != 0 {
            problems.push(format!("audit drift_total {}", self.drift_total));
        }
        if self.held_units as i64 != self.final_committed {
            problems.push(format!(
                "buyers were told HELD for {} units, the coordinator counts {} held or sold",
                self.held_units, self.final_committed
            ));
        }
        if self.held_units as i64 + self.final_free != self.units as i64 {
            problems.push(format!(
                "{} units held + {} free != {} total",
                self.held_units, self.final_free, self.units
            ));
        }
        if self.refused != 0 {
            problems.push(format!("{} buyers got an unexpected refusal", self.refused));
        }
        problems
    }
}

/// Whether units were free at `t_us`, by the first sample from `*next` on
/// that describes every region after `t_us` (see the module doc). Turn-away
/// times must be asked in increasing order: the sample that answers one
/// time is never earlier than the one that answered an earlier time.
fn free_at(samples: &[SkuView], next: &mut usize, t_us: i64, final_view: &SkuView) -> bool {
    let after = t_us.saturating_add(REPORT_LAG_MARGIN_US);
    while let Some(s) = samples.get(*next) {
        if s.at_us >= t_us && s.drift == 0 && s.reports_from_us.is_some_and(|r| r >= after) {
            return s.free() > 0;
        }
        *next += 1;
    }
    final_view.free() > 0
}

/// The row's numbers; `samples` oldest first.
pub fn analyse(logs: &[BuyerLog], samples: &[SkuView], totals: &Totals) -> TailStats {
    let mut answers = Tally::default();
    let mut held_per_region = vec![0u64; totals.regions.len()];
    let mut holds: Vec<(i64, u64)> = Vec::new();
    // When each turned-away buyer's story ended, and whether with SOLD_OUT.
    let mut turned_away: Vec<(i64, bool)> = Vec::new();
    let (mut sold_out_buyers, mut gave_up, mut refused) = (0, 0, 0);
    for log in logs {
        answers.merge(&log.answers);
        match log.end {
            End::Held => {
                holds.push((log.ended_us, u64::from(log.qty)));
                if let Some(n) = held_per_region.get_mut(usize::from(log.region)) {
                    *n += u64::from(log.qty);
                }
            }
            End::SoldOut => {
                sold_out_buyers += 1;
                turned_away.push((log.ended_us, true));
            }
            End::GaveUp => {
                gave_up += 1;
                turned_away.push((log.ended_us, false));
            }
            End::Refused(_) => refused += 1,
        }
    }
    holds.sort_unstable();
    let mut held_after_us = [None; 4];
    let mut cumulative = 0u64;
    let mut share = 0;
    for &(at, qty) in &holds {
        cumulative += qty;
        while share < HELD_SHARES.len()
            && cumulative as f64 >= (HELD_SHARES[share] * totals.units as f64).ceil()
        {
            held_after_us[share] = Some(at);
            share += 1;
        }
    }
    let held_units = cumulative;

    turned_away.sort_unstable();
    let mut next = 0;
    let mut first_free_turn_away = None;
    let (mut turned_away_free, mut false_sold_outs) = (0, 0);
    for &(t, sold_out) in &turned_away {
        if free_at(samples, &mut next, t, &totals.final_view) {
            turned_away_free += 1;
            false_sold_outs += u64::from(sold_out);
            first_free_turn_away.get_or_insert(t);
        }
    }
    let inversions = first_free_turn_away.map_or(0, |t| {
        logs.iter()
            .filter(|l| l.end == End::Held && l.first_sent_us > t)
            .count() as u64
    });

    // Holds decided in a batch that did not ask the coordinator, as the
    // agents count them: a unit that arrived by a take (with its prefetch)
    // and sold in a later batch was decided locally.
    let counted = totals.counters.local_path_holds + totals.counters.take_path_holds;
    let local_holds = (counted > 0.0).then(|| totals.counters.local_path_holds / counted);
    let final_committed = totals.final_view.committed();
    let units = totals.units as i64;
    let oversold = (final_committed - units)
        .max(held_units as i64 - units)
        .max(0);
    TailStats {
        units: totals.units,
        buyers: logs.len() as u64,
        answers,
        held_after_us,
        held_units,
        held_per_region: totals
            .regions
            .iter()
            .cloned()
            .zip(held_per_region)
            .collect(),
        sold_out_buyers,
        gave_up,
        refused,
        turned_away_free,
        false_sold_outs,
        inversions,
        local_holds,
        counters: totals.counters,
        regions: per_region(logs, totals),
        final_free: totals.final_view.free(),
        final_committed,
        oversold,
        drift_total: totals.drift_total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::RegionView;

    fn view(at_us: i64, reports_us: i64, available: i64, held: i64) -> SkuView {
        SkuView {
            at_us,
            total: 10,
            pool: 0,
            in_transit: 0,
            drift: 0,
            mode: "ESCROW".into(),
            regions: vec![RegionView {
                name: "eu".into(),
                available,
                held,
                sold: 0,
                rate_per_s: 0.0,
                last_report_us: Some(reports_us),
            }],
            reports_from_us: Some(reports_us),
        }
    }

    fn log(end: End, first_sent_us: i64, ended_us: i64) -> BuyerLog {
        let mut answers = Tally::default();
        answers.add(match end {
            End::Held => Outcome::Held,
            End::SoldOut => Outcome::SoldOut,
            _ => Outcome::Paused,
        });
        BuyerLog {
            region: 0,
            qty: 1,
            arrived_us: first_sent_us,
            first_sent_us,
            ended_us,
            last_answer_us: ended_us,
            end,
            answers,
            paid: None,
        }
    }

    fn totals(final_view: SkuView) -> Totals {
        Totals {
            units: 10,
            regions: vec!["eu".into()],
            final_view,
            drift_total: 0,
            counters: Counters {
                take_granted_units: Some(5.0),
                take_path_holds: 5.0,
                local_path_holds: 5.0,
                ..Counters::default()
            },
            rtt_ms: vec![50],
        }
    }

    /// Goal: a turn-away counts as "while free" only by a view built from
    /// reports made after it; a stale sample that still shows units is not
    /// evidence. A later buyer's HELD after such a turn-away is an inversion.
    #[test]
    fn turned_away_while_free_uses_reports_after_the_answer() {
        let samples = vec![
            // Stale at 1.0 s: its report is from 0.5 s.
            view(1_000_000, 500_000, 3, 7),
            // Reported after 1.0 s + margin: 1 unit still free.
            view(1_300_000, 1_200_000, 1, 9),
            // Reported after 2.0 s + margin: nothing free.
            view(2_300_000, 2_200_000, 0, 10),
        ];
        let final_view = view(3_000_000, 2_900_000, 0, 10);
        let mut logs: Vec<BuyerLog> = (0..9).map(|i| log(End::Held, i, 100 + i)).collect();
        logs.push(log(End::SoldOut, 900_000, 1_000_000)); // free by the 1.3 s sample
        logs.push(log(End::Held, 1_100_000, 1_150_000)); // came later, got a hold (50 ms)
        logs.push(log(End::SoldOut, 1_900_000, 2_000_000)); // nothing free after
        let stats = analyse(&logs, &samples, &totals(final_view));
        assert_eq!(stats.held_units, 10);
        assert_eq!(stats.turned_away_free, 1);
        assert_eq!(stats.false_sold_outs, 1);
        assert_eq!(stats.inversions, 1);
        assert_eq!(stats.sold_out_buyers, 2);
        assert_eq!(stats.held_after_us[0], Some(104));
        assert_eq!(stats.held_after_us[3], Some(1_150_000));
        assert_eq!(stats.local_holds, Some(0.5));
        assert!(stats.problems().is_empty(), "{:?}", stats.problems());
        // Holds waited 100 µs (nine) and 50 ms (one), against a 50 ms round trip.
        let eu = &stats.regions[0];
        assert_eq!(eu.holds, 10);
        assert_eq!(eu.holds_under_rtt, 9);
        assert_eq!(eu.hold_wait_us, [100, 50_000, 50_000]);
        assert_eq!(eu.under_rtt_share(), Some(0.9));
        // SOLD_OUT after 100 ms, both.
        assert_eq!(eu.sold_outs, 2);
        assert_eq!(eu.sold_out_wait_us, [100_000, 100_000]);
        assert_eq!(eu.answers[Outcome::Held], 10);
        assert_eq!(eu.answers[Outcome::SoldOut], 2);
    }

    /// Goal: units stranded at the end make every turn-away "while free",
    /// the 100% time is never reached, and the counts still add up.
    #[test]
    fn stranded_units_count_against_every_turn_away() {
        let final_view = view(5_000_000, 4_900_000, 2, 8);
        let mut logs: Vec<BuyerLog> = (0..8).map(|i| log(End::Held, i, 10 + i)).collect();
        logs.push(log(End::GaveUp, 0, 3_000_000));
        logs.push(log(End::SoldOut, 0, 4_000_000));
        let stats = analyse(&logs, &[], &totals(final_view));
        assert_eq!(stats.turned_away_free, 2);
        assert_eq!(stats.false_sold_outs, 1);
        assert_eq!(stats.gave_up, 1);
        assert_eq!(stats.held_after_us[3], None);
        assert_eq!(stats.final_free, 2);
        assert!(stats.problems().is_empty(), "{:?}", stats.problems());
    }
}
