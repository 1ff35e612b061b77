//! The simulated network between region agents and the coordinator.
//!
//! Every message is one of escrow-core's protocol messages in an envelope
//! that says which region it concerns, which call it belongs to and which
//! incarnation (epoch) of the agent sent it. Each link has its own latency
//! and jitter; faults lose, duplicate and hold back messages (so later
//! messages overtake them), and fault windows cut a region off (messages
//! vanish, calls time out) or take the coordinator process down (its host
//! refuses connections, calls fail after one round trip). Buyers reach their
//! own region's agent without crossing this network.

use escrow_core::protocol::{
    LimitsDown, LimitsUp, SyncRequest, SyncResponse, TakeRequest, TakeResponse, WatchResponse,
};

use crate::rng::Rng;
use crate::scenario::Scenario;

/// A protocol message.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// Agent -> coordinator report.
    Sync(SyncRequest),
    /// Coordinator -> agent answer to a report.
    SyncReply(SyncResponse),
    /// Agent -> coordinator request for units.
    Take(TakeRequest),
    /// Coordinator -> agent answer to a take.
    TakeReply(TakeResponse),
    /// Agent -> coordinator borrows and loans, sent at once rather than
    /// with the next sync (the agent's limits call).
    Limits(LimitsUp),
    /// Coordinator -> agent answer to a limits call.
    LimitsReply(LimitsDown),
    /// The coordinator's host refused the connection (the process is down).
    Refused,
    /// Coordinator -> agent: the answer to its held-open watch call, sent
    /// when the coordinator has news for the region, with that news's
    /// directive and pending grants (and borrows and loans it relays):
    /// apply them and sync now.
    Notice(WatchResponse),
}

impl Payload {
    /// Whether the message travels towards the coordinator.
    pub fn to_coordinator(&self) -> bool {
        matches!(
            self,
            Payload::Sync(_) | Payload::Take(_) | Payload::Limits(_)
        )
    }
}

/// A message in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// The region at the other end from the coordinator.
    pub region: usize,
    /// The agent's call number this message belongs to (request and its answer share it).
    pub call: u64,
    /// The agent incarnation that made the call.
    pub epoch: u32,
    /// The message.
    pub payload: Payload,
}

/// Counters of what the network did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Messages handed to the network.
    pub sent: u64,
    /// Messages dropped (loss, partition, outage).
    pub lost: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
}

/// Links and their faults.
#[derive(Debug, Clone)]
pub struct Network {
    one_way_us: Vec<u64>,
    jitter_us: Vec<u64>,
    loss: f64,
    duplicate: f64,
    reorder: f64,
    reorder_us: u64,
    rng: Rng,
    /// Whether random message faults apply (off in a swarm's liveness phase).
    pub faults_on: bool,
    /// Active partitions per region (windows may overlap).
    pub partitions: Vec<u32>,
    /// Active coordinator outages.
    pub coordinator_down: u32,
    /// Active coordinator freezes.
    pub coordinator_frozen: u32,
    /// What happened so far.
    pub stats: NetStats,
}

impl Network {
    /// The network of `scenario`, drawing from `rng`.
    pub fn new(scenario: &Scenario, rng: Rng) -> Self {
        let n = &scenario.network;
        Self {
            one_way_us: scenario
                .regions
                .iter()
                .map(|r| (r.rtt_ms * 500.0) as u64)
                .collect(),
            jitter_us: scenario
                .regions
                .iter()
                .map(|r| (r.jitter_ms * 1000.0) as u64)
                .collect(),
            loss: n.loss,
            duplicate: n.duplicate,
            reorder: n.reorder,
            reorder_us: (n.reorder_ms * 1000.0) as u64,
            rng,
            faults_on: true,
            partitions: vec![0; scenario.regions.len()],
            coordinator_down: 0,
            coordinator_frozen: 0,
            stats: NetStats::default(),
        }
    }

    /// Whether region `r` and the coordinator's host can exchange messages
    /// now (when the coordinator process is down its host refuses them).
    pub fn link_up(&self, r: usize) -> bool {
        self.partitions[r] == 0
    }

    fn delay(&mut self, r: usize) -> u64 {
        let mut d = self.one_way_us[r].max(1);
        if self.jitter_us[r] > 0 {
            d += self.rng.below(self.jitter_us[r]);
        }
        if self.faults_on && self.reorder_us > 0 && self.rng.chance(self.reorder) {
            d += self.rng.below(self.reorder_us);
        }
        d
    }

    /// Delivery delays of one message on region `r`'s link: none (lost), one, or two (duplicated).
    pub fn deliveries(&mut self, r: usize) -> [Option<u64>; 2] {
        self.stats.sent += 1;
        if !self.link_up(r) || (self.faults_on && self.rng.chance(self.loss)) {
            self.stats.lost += 1;
            return [None, None];
        }
        let first = Some(self.delay(r));
        let second = if self.faults_on && self.rng.chance(self.duplicate) {
            self.stats.duplicated += 1;
            Some(self.delay(r))
        } else {
            None
        };
        [first, second]
    }

    /// Records a message dropped on arrival (the link went down while it travelled).
    pub fn drop_on_arrival(&mut self) {
        self.stats.lost += 1;
    }

    /// Removes every fault: no loss, partitions or outage.
    pub fn heal(&mut self) {
        self.faults_on = false;
        self.partitions.iter_mut().for_each(|p| *p = 0);
        self.coordinator_down = 0;
        self.coordinator_frozen = 0;
    }
}
