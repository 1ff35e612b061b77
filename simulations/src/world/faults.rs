//! Faults in the world: partitions, a coordinator outage or freeze, agent crashes,
//! started and ended on a schedule or when a share of the stock is taken.

use super::*;

impl World {
    pub(super) fn fault(&mut self, index: usize, start: bool) {
        let f = &mut self.faults[index];
        if start {
            if f.active || f.done {
                return;
            }
            f.active = true;
            let end = self.now_us + (f.cfg.duration_s * 1e6) as u64;
            let (kind, region) = (f.cfg.kind, f.region);
            self.queue.push(
                end,
                Event::Fault {
                    index,
                    start: false,
                },
            );
            match (kind, region) {
                (FaultKind::Partition, Some(r)) => self.network.partitions[r] += 1,
                (FaultKind::CoordinatorDown, _) => self.network.coordinator_down += 1,
                (FaultKind::CoordinatorFrozen, _) => self.network.coordinator_frozen += 1,
                (FaultKind::AgentCrash, Some(r)) => {
                    self.agent_down[r] += 1;
                    if self.agent_down[r] == 1 {
                        self.agents[r].crash(self.now_us, &mut self.effects);
                        self.apply_effects();
                    }
                }
                _ => {}
            }
        } else {
            if !f.active {
                return;
            }
            f.active = false;
            f.done = true;
            let (kind, region) = (f.cfg.kind, f.region);
            match (kind, region) {
                (FaultKind::Partition, Some(r)) => {
                    self.network.partitions[r] = self.network.partitions[r].saturating_sub(1)
                }
                (FaultKind::CoordinatorDown, _) => {
                    self.network.coordinator_down = self.network.coordinator_down.saturating_sub(1)
                }
                (FaultKind::CoordinatorFrozen, _) => {
                    self.network.coordinator_frozen =
                        self.network.coordinator_frozen.saturating_sub(1);
                    self.thaw();
                }
                (FaultKind::AgentCrash, Some(r)) => {
                    self.agent_down[r] -= 1;
                    if self.agent_down[r] == 0 {
                        self.agents[r].restart(self.now_us, &mut self.effects);
                        self.apply_effects();
                    }
                }
                _ => {}
            }
        }
    }

    /// Ends every fault and switches message faults off: the liveness phase.
    pub fn heal(&mut self) {
        for i in 0..self.faults.len() {
            if self.faults[i].active {
                self.fault(i, false);
            }
            self.faults[i].done = true;
        }
        self.sold_triggers = false;
        self.network.heal();
        self.thaw();
        self.census = self.compute_census();
    }

    pub(super) fn after_event(&mut self) {
        if self.sold_triggers && self.scenario.sku.total > 0 {
            let taken =
                (self.census.held + self.census.sold) as f64 / self.scenario.sku.total as f64;
            for i in 0..self.faults.len() {
                let f = &self.faults[i];
                if !f.active && !f.done && f.cfg.start_sold.is_some_and(|s| taken >= s) {
                    self.fault(i, true);
                } else if f.active && f.cfg.end_sold.is_some_and(|s| taken >= s) {
                    self.fault(i, false);
                }
            }
            self.sold_triggers = self.faults.iter().any(|f| !f.done);
        }
        if self.sell_out_us.is_none()
            && self.now_us >= self.sale_start_us
            && self.census.free() == 0
        {
            self.sell_out_us = Some(self.now_us);
        }
    }

    /// Once the coordinator runs again, it serves what reached it while it
    /// was frozen, now, in the order it came.
    fn thaw(&mut self) {
        if self.network.coordinator_frozen > 0 {
            return;
        }
        for env in std::mem::take(&mut self.frozen_inbox) {
            self.queue.push(self.now_us, Event::Deliver(Box::new(env)));
        }
    }
}
