//! What a run measured: counters, latency histograms and time series.
//!
//! The [`Recorder`] collects during the run; [`Metrics`] is the result,
//! plain data that compares equal between two runs of the same seed (the
//! reproducibility test compares every field). Latencies are kept in
//! HdrHistograms (microseconds, 3 significant digits) and summarised as
//! p50/p99/p999 plus a percentile curve for plots.
//!
//! Two latencies of a hold are kept apart. The HELD answer latency is one
//! request's, from its send to its answer; a buyer who was told PAUSED and
//! retried counts only the last request. The hold wait is the buyer's, from
//! the first send of its reserve request to the HELD, across every retry:
//! what `bench tail` measures on the real binaries. A hold whose wait is
//! shorter than the region's round trip to the coordinator was decided
//! without asking it ("under rtt"). Under a global per-user limit, a hold
//! whose user is at home elsewhere first borrowed its place from there: its
//! wait includes that relay, and it is counted as a hold that paid a borrow.

use escrow_core::UserLimitScope;
use hdrhistogram::Histogram;

use crate::agent::Answer;

/// Largest latency recorded, µs (an hour).
pub const LATENCY_MAX_US: u64 = 3_600_000_000;

/// Quantiles of the percentile curves in reports: 0 .. 99.99 %, denser in the tail.
pub fn curve_quantiles() -> Vec<f64> {
    (0..=32)
        .map(|k| 1.0 - 10f64.powf(-f64::from(k) / 8.0))
        .collect()
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).expect("constant bounds are valid")
}

/// Percentiles of one latency distribution, µs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LatencySummary {
    /// Values recorded.
    pub count: u64,
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest.
    pub max_us: u64,
}

impl LatencySummary {
    fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            count: h.len(),
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        }
    }
}

fn curve(h: &Histogram<u64>) -> Vec<(f64, u64)> {
    if h.is_empty() {
        return Vec::new();
    }
    curve_quantiles()
        .into_iter()
        .map(|q| (q, h.value_at_quantile(q)))
        .chain(std::iter::once((1.0, h.max())))
        .collect()
}

/// One region's share of the results.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionMetrics {
    /// Region name.
    pub name: String,
    /// Buyers that arrived here (bots included).
    pub buyers: u64,
    /// Reserve requests sent here (first attempts and retries).
    pub attempts: u64,
    /// HELD answers.
    pub holds: u64,
    /// SOLD_OUT answers.
    pub sold_out_answers: u64,
    /// SOLD_OUT answers while a unit was free somewhere.
    pub false_sold_outs: u64,
    /// PAUSED answers.
    pub paused_answers: u64,
    /// Refused before the queue or while the agent was down (queue full, wait timeout, connection refused).
    pub rejected_answers: u64,
    /// The region's round trip to the coordinator (the scenario's `rtt_ms`).
    pub rtt_ms: f64,
    /// Latency of HELD answers, each from its own request's send.
    pub held_latency: LatencySummary,
    /// Hold wait: from a buyer's first reserve request to its HELD, across retries.
    pub hold_wait: LatencySummary,
    /// Holds whose wait was shorter than `rtt_ms`: decided without a round trip.
    pub holds_under_rtt: u64,
    /// Holds on a place borrowed from the user's home region (a global
    /// per-user limit): their wait includes the borrow.
    pub borrowed_holds: u64,
    /// Latency of every answer.
    pub answer_latency: LatencySummary,
    /// Percentile curve of HELD latency: (quantile, µs).
    pub held_latency_curve: Vec<(f64, u64)>,
}

impl RegionMetrics {
    /// Share of holds decided without a round trip (`None` without holds).
    pub fn holds_under_rtt_share(&self) -> Option<f64> {
        share(self.holds_under_rtt, self.hold_wait.count)
    }

    /// Share of holds that paid a borrow (`None` without holds).
    pub fn borrowed_holds_share(&self) -> Option<f64> {
        share(self.borrowed_holds, self.hold_wait.count)
    }
}

fn share(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

/// Values sampled over the run, at times spaced evenly on a log scale from sale start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Sample times, ms since sale start.
    pub t_ms: Vec<f64>,
    /// Available units per region (outer index: region).
    pub available: Vec<Vec<u64>>,
    /// Units in the coordinator's pool.
    pub pool: Vec<u64>,
    /// Units in transfers not yet applied by their receiver.
    pub in_transit: Vec<u64>,
    /// Units held or sold.
    pub taken: Vec<u64>,
    /// False sold-outs so far.
    pub false_sold_outs: Vec<u64>,
}

/// Everything one run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Metrics {
    /// Scenario name.
    pub scenario: String,
    /// Policy name.
    pub policy: String,
    /// Seed.
    pub seed: u64,
    /// Units on sale.
    pub total_units: u64,
    /// Buyers that arrived (bots included).
    pub buyers: u64,
    /// Reserve requests (first attempts and retries).
    pub attempts: u64,
    /// Units SOLD at the end.
    pub sold_units: u64,
    /// Units still HELD at the end (0 once every hold resolved).
    pub held_units_at_end: u64,
    /// Units held or sold beyond the total, at the worst moment. Must be 0.
    pub oversold_units: u64,
    /// SOLD_OUT answers given while some unit was available in some region, in the pool or in transit.
    pub false_sold_outs: u64,
    /// SOLD_OUT answers.
    pub sold_out_answers: u64,
    /// PAUSED answers (the units' owner could not be asked, or had none to give yet).
    pub paused_answers: u64,
    /// Queue full, wait timeout and connection refused.
    pub rejected_answers: u64,
    /// Buyers that got a hold.
    pub buyers_served: u64,
    /// Buyers that left without a hold (told SOLD_OUT, or out of retries).
    pub buyers_turned_away: u64,
    /// Units those buyers asked for.
    pub units_turned_away: u64,
    /// Buyers that left without a hold (SOLD_OUT, or out of retries on a
    /// 503) at a moment when some unit was free in a region, in the pool or
    /// in transit: what a policy that answers PAUSED instead of SOLD_OUT
    /// cannot hide.
    pub turned_away_while_free: u64,
    /// HELD answers given to a buyer who arrived after some buyer had
    /// already been turned away: later buyers served before earlier ones.
    pub order_inversions: u64,
    /// Units unsold at the end although buyers were turned away: min(unsold, units turned away).
    pub stranded_units: u64,
    /// When no unit was free anywhere for the first time, ms after sale start.
    pub sell_out_ms: Option<f64>,
    /// When the last HELD answer was given, ms after sale start.
    pub last_hold_ms: Option<f64>,
    /// When the SKU switched to central mode, ms after sale start (before the sale: negative).
    pub central_at_ms: Option<f64>,
    /// Units returned to available by expiry.
    pub expired_units: u64,
    /// Holds released by buyers.
    pub released_holds: u64,
    /// Confirms refused because the hold had expired.
    pub confirms_refused: u64,
    /// Sync calls agents made.
    pub sync_requests: u64,
    /// Take calls agents made.
    pub take_requests: u64,
    /// Messages between agents and the coordinator, both directions, duplicates included.
    pub coordinator_messages: u64,
    /// Messages lost.
    pub messages_lost: u64,
    /// Extra copies delivered.
    pub messages_duplicated: u64,
    /// Coordinator messages per unit sold.
    pub messages_per_sale: f64,
    /// Take calls per unit sold.
    pub takes_per_sale: f64,
    /// Whether a user's one reservation counted per region or across all.
    pub user_limit_scope: UserLimitScope,
    /// Holds on a place borrowed from the user's home region, all regions.
    pub borrowed_holds: u64,
    /// Borrows the homes lent.
    pub borrows_lent: u64,
    /// Borrows the homes refused (the user held, had bought or had lent
    /// their place already).
    pub borrows_refused: u64,
    /// Borrows their buyer stopped waiting for (PAUSED).
    pub borrows_unanswered: u64,
    /// Borrows the coordinator had not settled at the end: asked and not
    /// answered, or given back and not yet home.
    pub borrows_unsettled: u64,
    /// Latency of HELD answers, each from its own request's send, all regions.
    pub held_latency: LatencySummary,
    /// Hold wait (first reserve request to HELD, across retries), all regions.
    pub hold_wait: LatencySummary,
    /// Holds whose wait was shorter than their region's round trip, all regions.
    pub holds_under_rtt: u64,
    /// Latency of every answer, all regions.
    pub answer_latency: LatencySummary,
    /// Percentile curve of HELD latency, all regions: (quantile, µs).
    pub held_latency_curve: Vec<(f64, u64)>,
    /// Per region.
    pub regions: Vec<RegionMetrics>,
    /// Over time.
    pub series: Series,
    /// Simulated time covered, ms after sale start.
    pub end_ms: f64,
    /// Events processed.
    pub events: u64,
    /// SKUs on sale: more than one in a shop, whose figures above are
    /// summed over its SKUs (the series are its first SKU's).
    pub skus: u32,
    /// The carts of a shop, if the scenario has them.
    pub carts: Option<CartMetrics>,
}

/// What a shop's carts did: each cart held all or nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct CartMetrics {
    /// Buyers that came to check out a cart.
    pub buyers: u64,
    /// Carts held.
    pub held: u64,
    /// Items (SKUs) in the carts held.
    pub items_held: u64,
    /// Carts confirmed (every item sold).
    pub sold: u64,
    /// Carts released by their buyers.
    pub released: u64,
    /// Carts that expired.
    pub expired: u64,
    /// Buyers that left without a cart (an item sold out, or out of retries).
    pub turned_away: u64,
    /// Holds of a cart refused because an item was sold out, naming it.
    pub sold_out_answers: u64,
    /// Carts whose items were all set aside, written in one commit each
    /// (many carts to a commit).
    pub commits: u64,
    /// When the last cart was held, ms after sale start.
    pub last_hold_ms: Option<f64>,
    /// Hold wait of the carts held (first request to HELD), all regions.
    pub hold_wait: LatencySummary,
    /// Carts held faster than their region's round trip, all regions.
    pub holds_under_rtt: u64,
    /// Per region: the carts' answers and hold waits.
    pub regions: Vec<RegionMetrics>,
}

impl CartMetrics {
    /// Items held per second of the sale: `items_held` over the time to
    /// the last cart held (`None` before one).
    pub fn items_per_s(&self) -> Option<f64> {
        self.last_hold_ms
            .filter(|ms| *ms > 0.0)
            .map(|ms| self.items_held as f64 / (ms / 1_000.0))
    }
}

impl Metrics {
    /// Adds the figures of another SKU of the same shop that are not in
    /// its recorder (those were absorbed with [`Recorder::absorb`]):
    /// units, buyers, outcomes, the agents' and network's work; the
    /// sell-out and the last hold are the latest of the two.
    pub fn add_sku(&mut self, other: &Metrics) {
        self.total_units += other.total_units;
        self.buyers += other.buyers;
        self.sold_units += other.sold_units;
        self.held_units_at_end += other.held_units_at_end;
        self.oversold_units += other.oversold_units;
        self.buyers_served += other.buyers_served;
        self.buyers_turned_away += other.buyers_turned_away;
        self.units_turned_away += other.units_turned_away;
        self.turned_away_while_free += other.turned_away_while_free;
        self.order_inversions += other.order_inversions;
        self.stranded_units += other.stranded_units;
        let later = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.sell_out_ms = later(self.sell_out_ms, other.sell_out_ms);
        self.last_hold_ms = later(self.last_hold_ms, other.last_hold_ms);
        self.expired_units += other.expired_units;
        self.released_holds += other.released_holds;
        self.confirms_refused += other.confirms_refused;
        self.sync_requests += other.sync_requests;
        self.take_requests += other.take_requests;
        self.coordinator_messages += other.coordinator_messages;
        self.messages_lost += other.messages_lost;
        self.messages_duplicated += other.messages_duplicated;
        self.borrows_lent += other.borrows_lent;
        self.borrows_refused += other.borrows_refused;
        self.borrows_unanswered += other.borrows_unanswered;
        self.borrows_unsettled += other.borrows_unsettled;
        self.end_ms = self.end_ms.max(other.end_ms);
        self.events += other.events;
        self.skus += other.skus;
        let per_sale = |n: u64| match self.sold_units {
            0 => 0.0,
            sold => n as f64 / sold as f64,
        };
        self.messages_per_sale = per_sale(self.coordinator_messages);
        self.takes_per_sale = per_sale(self.take_requests);
    }

    /// Share of holds, all regions, decided without a round trip (`None` without holds).
    pub fn holds_under_rtt_share(&self) -> Option<f64> {
        share(self.holds_under_rtt, self.hold_wait.count)
    }

    /// Share of holds, all regions, that paid a borrow (`None` without holds).
    pub fn borrowed_holds_share(&self) -> Option<f64> {
        share(self.borrowed_holds, self.hold_wait.count)
    }

    /// Whether the SKU was in central mode before the sale started (the
    /// `central` policy creates it so); `central_at_ms` is then the moment
    /// the world began, not a switch.
    pub fn central_from_start(&self) -> bool {
        self.central_at_ms.is_some_and(|t| t <= 0.0)
    }
}

#[derive(Debug, Clone, Default)]
struct RegionCounts {
    buyers: u64,
    attempts: u64,
    holds: u64,
    sold_out_answers: u64,
    false_sold_outs: u64,
    paused_answers: u64,
    rejected_answers: u64,
    holds_under_rtt: u64,
    borrowed_holds: u64,
}

/// Collects measurements during a run.
#[derive(Debug)]
pub struct Recorder {
    names: Vec<String>,
    rtt_ms: Vec<f64>,
    counts: Vec<RegionCounts>,
    held_latency: Vec<Histogram<u64>>,
    hold_wait: Vec<Histogram<u64>>,
    answer_latency: Vec<Histogram<u64>>,
    held_all: Histogram<u64>,
    hold_wait_all: Histogram<u64>,
    answer_all: Histogram<u64>,
    /// Samples so far.
    pub series: Series,
    /// False sold-outs so far.
    pub false_sold_outs: u64,
}

impl Recorder {
    /// A recorder for regions given as (name, round trip to the coordinator in ms).
    pub fn new(regions: Vec<(String, f64)>) -> Self {
        let n = regions.len();
        let (names, rtt_ms) = regions.into_iter().unzip();
        Self {
            counts: vec![RegionCounts::default(); n],
            held_latency: (0..n).map(|_| histogram()).collect(),
            hold_wait: (0..n).map(|_| histogram()).collect(),
            answer_latency: (0..n).map(|_| histogram()).collect(),
            held_all: histogram(),
            hold_wait_all: histogram(),
            answer_all: histogram(),
            rtt_ms,
            series: Series {
                available: vec![Vec::new(); n],
                ..Series::default()
            },
            names,
            false_sold_outs: 0,
        }
    }

    /// A buyer arrived in region `r`.
    pub fn arrival(&mut self, r: usize) {
        self.counts[r].buyers += 1;
    }

    /// A reserve request was sent in region `r`.
    pub fn attempt(&mut self, r: usize) {
        self.counts[r].attempts += 1;
    }

    /// A buyer in region `r` got `answer` after `latency_us`.
    pub fn answer(&mut self, r: usize, answer: Answer, latency_us: u64) {
        let c = &mut self.counts[r];
        match answer {
            Answer::Held => {
                c.holds += 1;
                self.held_latency[r].saturating_record(latency_us.max(1));
                self.held_all.saturating_record(latency_us.max(1));
            }
            Answer::SoldOut => c.sold_out_answers += 1,
            Answer::Paused => c.paused_answers += 1,
            Answer::QueueFull | Answer::WaitTimeout | Answer::Unreachable => {
                c.rejected_answers += 1
            }
            Answer::Replay | Answer::UserLimit | Answer::KeyReused => {}
        }
        if answer != Answer::Unreachable {
            self.answer_latency[r].saturating_record(latency_us.max(1));
            self.answer_all.saturating_record(latency_us.max(1));
        }
    }

    /// A buyer in region `r` got its hold `wait_us` after its first reserve
    /// request (the same HELD that [`Recorder::answer`] counts per request).
    pub fn hold_wait(&mut self, r: usize, wait_us: u64) {
        self.hold_wait[r].saturating_record(wait_us.max(1));
        self.hold_wait_all.saturating_record(wait_us.max(1));
        // Strictly faster: a hold that needed a take waited at least one round trip.
        if (wait_us as f64) < self.rtt_ms[r] * 1_000.0 {
            self.counts[r].holds_under_rtt += 1;
        }
    }

    /// The hold a buyer in region `r` just got is on a borrowed place.
    pub fn borrowed_hold(&mut self, r: usize) {
        self.counts[r].borrowed_holds += 1;
    }

    /// A SOLD_OUT answer in region `r` was false.
    pub fn false_sold_out(&mut self, r: usize) {
        self.counts[r].false_sold_outs += 1;
        self.false_sold_outs += 1;
    }

    /// Totals over regions: (attempts, holds, sold-out, paused, rejected).
    pub fn totals(&self) -> (u64, u64, u64, u64, u64) {
        self.counts.iter().fold((0, 0, 0, 0, 0), |t, c| {
            (
                t.0 + c.attempts,
                t.1 + c.holds,
                t.2 + c.sold_out_answers,
                t.3 + c.paused_answers,
                t.4 + c.rejected_answers,
            )
        })
    }

    /// Per-region results.
    pub fn regions(&self) -> Vec<RegionMetrics> {
        self.names
            .iter()
            .enumerate()
            .map(|(r, name)| {
                let c = &self.counts[r];
                RegionMetrics {
                    name: name.clone(),
                    buyers: c.buyers,
                    attempts: c.attempts,
                    holds: c.holds,
                    sold_out_answers: c.sold_out_answers,
                    false_sold_outs: c.false_sold_outs,
                    paused_answers: c.paused_answers,
                    rejected_answers: c.rejected_answers,
                    rtt_ms: self.rtt_ms[r],
                    held_latency: LatencySummary::of(&self.held_latency[r]),
                    hold_wait: LatencySummary::of(&self.hold_wait[r]),
                    holds_under_rtt: c.holds_under_rtt,
                    borrowed_holds: c.borrowed_holds,
                    answer_latency: LatencySummary::of(&self.answer_latency[r]),
                    held_latency_curve: curve(&self.held_latency[r]),
                }
            })
            .collect()
    }

    /// Latency of HELD answers and of every answer, over all regions.
    pub fn overall_latency(&self) -> (LatencySummary, LatencySummary) {
        (
            LatencySummary::of(&self.held_all),
            LatencySummary::of(&self.answer_all),
        )
    }

    /// Hold wait over all regions, and how many holds were under their region's round trip.
    pub fn overall_hold_wait(&self) -> (LatencySummary, u64) {
        (
            LatencySummary::of(&self.hold_wait_all),
            self.counts.iter().map(|c| c.holds_under_rtt).sum(),
        )
    }

    /// Holds on a borrowed place, over all regions.
    pub fn borrowed_holds(&self) -> u64 {
        self.counts.iter().map(|c| c.borrowed_holds).sum()
    }

    /// Percentile curve of HELD latency over all regions.
    pub fn held_curve(&self) -> Vec<(f64, u64)> {
        curve(&self.held_all)
    }

    /// Adds what `other` recorded, over the same regions (another SKU of
    /// the same shop): counts and histograms.
    pub fn absorb(&mut self, other: &Recorder) {
        for (c, o) in self.counts.iter_mut().zip(&other.counts) {
            c.buyers += o.buyers;
            c.attempts += o.attempts;
            c.holds += o.holds;
            c.sold_out_answers += o.sold_out_answers;
            c.false_sold_outs += o.false_sold_outs;
            c.paused_answers += o.paused_answers;
            c.rejected_answers += o.rejected_answers;
            c.holds_under_rtt += o.holds_under_rtt;
            c.borrowed_holds += o.borrowed_holds;
        }
        let pairs = [
            (&mut self.held_latency, &other.held_latency),
            (&mut self.hold_wait, &other.hold_wait),
            (&mut self.answer_latency, &other.answer_latency),
        ];
        for (mine, theirs) in pairs {
            for (h, o) in mine.iter_mut().zip(theirs) {
                h.add(o).expect("histograms of the same bounds add");
            }
        }
        for (h, o) in [
            (&mut self.held_all, &other.held_all),
            (&mut self.hold_wait_all, &other.hold_wait_all),
            (&mut self.answer_all, &other.answer_all),
        ] {
            h.add(o).expect("histograms of the same bounds add");
        }
        self.false_sold_outs += other.false_sold_outs;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: answers land in the right counters and percentiles come out of the histogram.
    #[test]
    fn answers_are_counted_and_summarised() {
        let mut r = Recorder::new(vec![("eu".into(), 1.0)]);
        for us in 1..=1000 {
            r.answer(0, Answer::Held, us);
        }
        r.answer(0, Answer::SoldOut, 5);
        r.answer(0, Answer::Unreachable, 5);
        let m = &r.regions()[0];
        assert_eq!(
            (m.holds, m.sold_out_answers, m.rejected_answers),
            (1000, 1, 1)
        );
        assert_eq!(m.held_latency.count, 1000);
        assert!((495..=505).contains(&m.held_latency.p50_us));
        assert_eq!(m.answer_latency.count, 1001);
        assert_eq!(r.totals().1, 1000);
    }

    /// Goal: a hold counts as under rtt only when its wait, first request to
    /// HELD, is strictly shorter than its own region's round trip.
    #[test]
    fn holds_under_rtt_are_counted_per_region() {
        let mut r = Recorder::new(vec![("eu".into(), 50.0), ("ap".into(), 230.0)]);
        for wait_us in [3_000, 49_999, 50_000, 1_051_000] {
            r.hold_wait(0, wait_us);
        }
        for wait_us in [60_000, 229_000, 231_000] {
            r.hold_wait(1, wait_us);
        }
        let m = r.regions();
        assert_eq!((m[0].hold_wait.count, m[0].holds_under_rtt), (4, 2));
        assert_eq!((m[1].hold_wait.count, m[1].holds_under_rtt), (3, 2));
        assert_eq!(m[0].holds_under_rtt_share(), Some(0.5));
        assert_eq!(r.overall_hold_wait().1, 4);
        assert_eq!(r.overall_hold_wait().0.count, 7);
    }
}
